"""The engine's forward against diffusers on PyTorch: same weights, same inputs, same threads,
same machine, in one run.

    python3 studies/speed_study.py [--threads 2] [--reps 5] [--rounds 3]
                                 [--cases tinyflux,flux-1024,flux-4096]
                                 [--out target/speed] [--binary PATH] [--keep DIR]

Cases:
  tinyflux     the built-in TinyFLUX (models/tinyflux), 64 image tokens, 16 text tokens;
  tinyflux-l   the built-in TinyFLUX-L (models/tinyflux-l), 256 image tokens;
  flux-1024    FLUX.1's block structure and head width (128, RoPE 16/56/56, 512 text tokens,
  flux-4096    guidance embedding) at width 768 (6 heads), one double and two single blocks,
               random weights, at 1024 and 4096 image tokens (the shape of
               `cargo bench -p flashdiff-models --bench flux`).
  sd3-1024     SD3's MMDiT block structure (`SD3Transformer2DModel`: 2x2 patches of 16 latent
  sd3-4096     channels, heads of 64, 4096-wide T5 context, 2048-wide pooled vector, 333 text
               tokens as SD3's 77 CLIP + 256 T5) at width 768 (12 heads), three joint blocks,
               random weights, at 1024 and 4096 image tokens (64x64 and 128x128 latents).
  wan-1024     Wan's block structure (`WanTransformer3DModel`: 1x2x2 patches of 16 latent
  wan-4096     channels, heads of 128, RMS Q/K norms across heads, cross-attention to 512
               T5 tokens of 4096) at width 768 (6 heads), three blocks, random weights, on 4
               latent frames of 32x32 and 64x64 (1024 and 4096 video tokens).

For each case the transformer is diffusers' `FluxTransformer2DModel`; its folder is what the
engine loads (`models/examples/forward_speed.rs`, built in release). Both sides compute the
whole forward from the same text states, pooled vector, time and guidance: PyTorch's call, and
the engine's context + step conditioning + forward. The two alternate, `--rounds` times each
(a machine shared with other tenants drifts between minutes); each round times `--reps` runs
after a warm-up. Reported: the median of the rounds' medians, the ratio engine / PyTorch, the engine's subset forwards (25/50/75% of
the image rows against the full forward's cached K/V and text) as a multiple of their share of
the full forward, and the parity of the two velocities in dB (peak = max |PyTorch velocity|).
Writes OUT/speed.json and OUT/speed.md.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLUX_SHAPED = dict(patch_size=1, in_channels=64, out_channels=64, num_layers=1,
                   num_single_layers=2, attention_head_dim=128, num_attention_heads=6,
                   joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                   axes_dims_rope=(16, 56, 56))


def built_in(folder):
    """A built-in model's transformer folder, its RoPE axes and text length."""
    path = os.path.join(ROOT, "models", folder, "transformer")
    model = FluxTransformer2DModel.from_pretrained(path, torch_dtype=torch.float32)
    return model, path, list(model.config.axes_dims_rope)


def drawn(make, seed, keep=lambda name, p: False):
    """The model `make()` builds with every weight drawn (diffusers zero-initialises some):
    matrices at 1/sqrt(fan-in), norm scales near 1, the rest small; `keep(name, p)` names
    the parameters left as built (convolution kernels, fixed position tables)."""
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if keep(name, p):
                continue
            if p.dim() == 2:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def random_model(seed):
    """The FLUX-shaped model with every weight drawn."""
    return drawn(lambda: FluxTransformer2DModel(**FLUX_SHAPED), seed)


SD3_SHAPED = dict(sample_size=64, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=64,
                  num_attention_heads=12, joint_attention_dim=4096, caption_projection_dim=768,
                  pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=96)


def random_sd3(seed):
    """The SD3-shaped model with every weight drawn but its patch convolution and position
    table."""
    from diffusers import SD3Transformer2DModel

    return drawn(lambda: SD3Transformer2DModel(**SD3_SHAPED), seed,
                 keep=lambda name, p: p.dim() == 4 or "pos_embed.pos_embed" in name)


WAN_SHAPED = dict(patch_size=(1, 2, 2), num_attention_heads=6, attention_head_dim=128, in_channels=16,
                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=3072, num_layers=3, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN_FRAMES = 4


def random_wan(seed):
    """The Wan-shaped model with every weight drawn but its patch convolution."""
    from diffusers import WanTransformer3DModel

    return drawn(lambda: WanTransformer3DModel(**WAN_SHAPED), seed, keep=lambda name, p: p.dim() == 5)


def video_tokens(latent):
    """(C, F, H, W) -> (F * H/2 * W/2, 2 * 2 * C): the engine's Wan tokens, (frame, row,
    column, channel) order."""
    c, f, h, w = latent.shape
    x = latent.reshape(c, f, 1, h // 2, 2, w // 2, 2)
    return x.permute(1, 3, 5, 2, 4, 6, 0).reshape(f * (h // 2) * (w // 2), 4 * c).contiguous()


def patch_tokens(latent, p=2):
    """(C, H, W) -> (H/p * W/p, p * p * C): the engine's MMDiT tokens, (row, column,
    channel) inside each patch."""
    c, h, w = latent.shape
    x = latent.reshape(c, h // p, p, w // p, p)
    return x.permute(1, 3, 2, 4, 0).reshape((h // p) * (w // p), p * p * c).contiguous()


def cases(names, tmp):
    for name in names:
        if name in ("tinyflux", "tinyflux-l"):
            model, path, axes = built_in(name)
            tokens = {"tinyflux": 64, "tinyflux-l": 256}[name]
            yield name, model, path, axes, tokens, 16
        elif name.startswith("flux-"):
            tokens = int(name.split("-")[1])
            model = random_model(1)
            path = os.path.join(tmp, name)
            model.save_pretrained(path, safe_serialization=True)
            yield name, model, path, list(FLUX_SHAPED["axes_dims_rope"]), tokens, 512
        elif name in ("sd3-1024", "sd3-4096"):
            tokens = int(name.split("-")[1])
            model = random_sd3(2)
            path = os.path.join(tmp, name)
            model.save_pretrained(path, safe_serialization=True)
            yield name, model, path, None, tokens, 333
        elif name in ("wan-1024", "wan-4096"):
            tokens = int(name.split("-")[1])
            model = random_wan(3)
            path = os.path.join(tmp, name)
            model.save_pretrained(path, safe_serialization=True)
            yield name, model, path, "wan", tokens, 512
        else:
            raise SystemExit(f"unknown case {name}: tinyflux, tinyflux-l, flux-1024, flux-4096, sd3-1024, "
                             "sd3-4096, wan-1024, wan-4096")


def median(xs):
    return sorted(xs)[len(xs) // 2]


def is_sd3(model):
    return type(model).__name__ == "SD3Transformer2DModel"


def is_wan(model):
    return type(model).__name__ == "WanTransformer3DModel"


def timed(model, kw, reps):
    """PyTorch's output of `model(**kw)` and the median of `reps` more runs, in ms."""
    out = model(**kw)[0][0]
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        model(**kw)
        times.append((time.perf_counter() - s) * 1e3)
    return median(times), out


@torch.inference_mode()
def torch_time(model, inputs, reps):
    if is_wan(model):
        ms, out = timed(model, dict(hidden_states=inputs["latent"][None], encoder_hidden_states=inputs["txt"][None],
                                    timestep=inputs["t"], return_dict=False), reps)
        return ms, video_tokens(out)
    if is_sd3(model):
        ms, out = timed(model, dict(hidden_states=inputs["latent"][None], encoder_hidden_states=inputs["txt"][None],
                                    pooled_projections=inputs["pooled"][None], timestep=inputs["t"] * 1000,
                                    return_dict=False), reps)
        return ms, patch_tokens(out)
    grid = int(round(math.sqrt(inputs["x"].shape[0])))
    r = torch.arange(grid, dtype=torch.float32).repeat_interleave(grid)
    c = torch.arange(grid, dtype=torch.float32).repeat(grid)
    img_ids = torch.stack([torch.zeros_like(r), r, c], 1)
    txt_ids = torch.zeros(inputs["txt"].shape[0], 3)
    kw = dict(hidden_states=inputs["x"][None], encoder_hidden_states=inputs["txt"][None],
              pooled_projections=inputs["pooled"][None], timestep=inputs["t"],
              img_ids=img_ids, txt_ids=txt_ids, return_dict=False)
    if model.config.guidance_embeds:
        kw["guidance"] = inputs["g"]
    return timed(model, kw, reps)


def engine_binary(given):
    if given:
        return given
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "flashdiff-models",
                    "--example", "forward_speed"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "examples", "forward_speed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="tinyflux,flux-1024,flux-4096")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "speed"))
    ap.add_argument("--binary", help="a built forward_speed example (default: build it)")
    ap.add_argument("--keep", help="write the weights and inputs here and keep them (for a "
                    "profiler run of the example); default: a temporary folder")
    a = ap.parse_args()
    if a.threads < 1 or a.reps < 1 or a.rounds < 1:
        raise SystemExit("--threads, --reps and --rounds must be at least 1")
    torch.set_num_threads(a.threads)
    binary = engine_binary(a.binary)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        for name, model, path, axes, tokens, nt in cases(a.cases.split(","), tmp):
            model.eval()
            g = torch.Generator().manual_seed(tokens)
            cfg = model.config
            inputs = {
                "x": torch.randn(tokens, cfg.in_channels, generator=g),
                "txt": torch.randn(nt, cfg.get("joint_attention_dim") or cfg.text_dim, generator=g),
                "pooled": torch.randn(cfg.get("pooled_projection_dim") or 1, generator=g),
                "t": torch.tensor([0.7]),
                "g": torch.tensor([3.5]),
            }
            if is_wan(model):  # video latent frames, the engine's tokens of them, t in 0-1000
                side = 2 * int(round(math.sqrt(tokens // WAN_FRAMES)))
                latent = torch.randn(cfg.in_channels, WAN_FRAMES, side, side, generator=g)
                inputs["x"], inputs["latent"] = video_tokens(latent), latent
                inputs["t"] = torch.tensor([700.0])
            if is_sd3(model):  # a latent, and the engine's tokens of it
                side = 2 * int(round(math.sqrt(tokens)))
                latent = torch.randn(cfg.in_channels, side, side, generator=g)
                inputs["x"], inputs["latent"] = patch_tokens(latent), latent
            inp = os.path.join(tmp, f"{name}-inputs.safetensors")
            vel = os.path.join(tmp, f"{name}-velocity.safetensors")
            save_file(inputs, inp)
            env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
            runs, torch_runs = [], []
            for r in range(a.rounds):
                print(f"[{name}] round {r + 1}/{a.rounds}: engine, PyTorch", file=sys.stderr,
                      flush=True)
                if axes == "wan":
                    shape = ["--family", "wan", "--frames", str(WAN_FRAMES)]
                else:
                    shape = ["--family", "mmdit"] if axes is None else ["--axes", ",".join(map(str, axes))]
                res = subprocess.run([binary, "--weights", path, "--inputs", inp, *shape, "--reps", str(a.reps),
                                      "--out", vel],
                                     env=env, check=True, capture_output=True, text=True)
                runs.append(json.loads(res.stdout))
                ms, ref = torch_time(model, inputs, a.reps)
                torch_runs.append(ms)
            eng = {"full_ms": median([e["full_ms"] for e in runs]),
                   "subset_ms": {k: median([e["subset_ms"][k] for e in runs])
                                 for k in runs[0]["subset_ms"]}}
            torch_ms = median(torch_runs)
            mine = load_file(vel)["velocity"]
            mse = float(((mine - ref) ** 2).mean())
            peak = float(ref.abs().max())
            db = float("inf") if mse == 0 else 10 * math.log10(peak * peak / mse)
            row = dict(case=name, tokens=tokens, text_tokens=nt, threads=a.threads,
                       reps=a.reps, rounds=a.rounds, engine_ms=eng["full_ms"], torch_ms=torch_ms,
                       engine_rounds=[e["full_ms"] for e in runs], torch_rounds=torch_runs,
                       ratio=eng["full_ms"] / torch_ms, parity_db=db,
                       subset_ms=eng["subset_ms"],
                       subset_share={k: v / eng["full_ms"] / (int(k) / 100)
                                     for k, v in eng["subset_ms"].items()})
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    meta = dict(commit=commit, threads=a.threads, reps=a.reps, rounds=a.rounds,
                torch=torch.__version__,
                cpu=os.cpu_count())
    with open(os.path.join(a.out, "speed.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    lines = [f"Commit {commit}, {a.threads} threads, median of {a.rounds} alternating rounds of "
             f"{a.reps} runs each, PyTorch {torch.__version__}.",
             "",
             "| case | image / text tokens | engine ms | PyTorch ms | engine / PyTorch "
             "| subset 25 / 50 / 75% (x share) | parity dB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        sub = " / ".join(f"{r['subset_share'][k]:.2f}" for k in ("25", "50", "75"))
        lines.append(f"| {r['case']} | {r['tokens']} / {r['text_tokens']} | {r['engine_ms']:.1f} "
                     f"| {r['torch_ms']:.1f} | {r['ratio']:.2f} | {sub} | {r['parity_db']:.1f} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "speed.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
