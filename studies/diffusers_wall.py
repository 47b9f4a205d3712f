#!/usr/bin/env python3
"""Wall time of a diffusers denoising loop with FlashDiff's adapter, against the plain loop,
diffusers' FirstBlockCache and TaylorSeerCache and cache-dit (DBCache + TaylorSeer), at
matched FLOPs.

    python3 studies/diffusers_wall.py [--cases tinyflux,flux-1024] [--steps 28] [--reps 3]
                                    [--target 0.5] [--threads 2] [--device cpu] [--out DIR]

Cases: `tinyflux` (models/tinyflux, trained, 64 image and 16 text tokens) and `flux-1024`
(studies/speed_study.py's FLUX-shaped transformer with random weights: FLUX.1's block structure
and head width, 3 blocks of width 768, 1024 image and 512 text tokens, about a second a step
on two CPU threads). Each loop is what a pipeline runs: the scheduler's `set_timesteps`, then
one transformer call and one `scheduler.step` per step (FlowMatchEulerDiscreteScheduler).

For each method its candidate settings first run once under a FLOP counter (torch's own
formulas for every matmul and attention, `flop_registry`); the candidate whose FLOPs fraction
is nearest `--target` is then timed `--reps` times, alternating with the plain loop, and the
median of each is reported: the loop's seconds, the speed-up over plain, and that speed-up
over the FLOPs ratio (1.0: time falls exactly as FLOPs do). The adapter's overhead on a
computed step is its loop at epsilon 0 (every step computed, its signal and bookkeeping
still run) over the plain loop. Bars (docs/python.md): overhead <= 3%, speed-up >= 0.9 of
the FLOPs ratio.

Writes OUT/diffusers_wall.json and OUT/diffusers_wall.md (default docs/wall); progress on
stderr. cache-dit is optional (a row says why it did not run).
"""

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import speed_study  # noqa: E402
from flops_py import Flops  # noqa: E402

import diffusers  # noqa: E402

logging.getLogger("diffusers").setLevel(logging.ERROR)


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def case_inputs(name, tokens, text, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        _, model, _, _, _, _ = next(speed_study.cases([name], tmp))
    model = model.to(device).eval()
    side = int(round(tokens ** 0.5))
    r = torch.arange(side, dtype=torch.float32).repeat_interleave(side)
    c = torch.arange(side, dtype=torch.float32).repeat(side)
    cfg = model.config
    kw = dict(
        encoder_hidden_states=torch.randn(1, text, cfg.joint_attention_dim, generator=g).to(device),
        pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g).to(device),
        img_ids=torch.stack([torch.zeros_like(r), r, c], 1).to(device),
        txt_ids=torch.zeros(text, 3).to(device))
    if cfg.guidance_embeds:
        kw["guidance"] = torch.full((1,), 3.5, device=device)
    noise = torch.randn(1, tokens, cfg.in_channels, generator=g).to(device)
    return model, kw, noise


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def loop(model, sched, kw, noise, steps, device, count=False):
    """One denoising loop; returns (seconds, FLOPs or None)."""
    fl = Flops() if count else None
    x = noise.clone()
    sync(device)
    t0 = time.perf_counter()
    with fl if fl is not None else contextlib.nullcontext():
        sched.set_timesteps(steps)
        for t in sched.timesteps:
            with model.cache_context("cond"):
                v = model(hidden_states=x, timestep=(t / 1000).expand(1).to(x.dtype), return_dict=False, **kw)[0]
            x = sched.step(v, t, x).prev_sample
    sync(device)
    return time.perf_counter() - t0, (fl.total if fl is not None else None)


def methods(model, sched, warmup, steps, cache_dit):
    """Each method: name and its candidates, each (label, enable, disable)."""
    import flashdiff.diffusers as fdd

    def hook(cfg):
        return (lambda: model.enable_cache(cfg), model.disable_cache)

    def adapter(e, k):
        return (lambda: fdd.enable(model, epsilon=e, max_skip=k, warmup=warmup, scheduler=sched),
                lambda: fdd.disable(model))

    # Thresholds from "almost every step" to "almost none" on both cases (a random-weight
    # model's signal moves far more per step than a trained one's).
    out = [("flashdiff-adapter", [(f"ε {e} K {k}", *adapter(e, k)) for e, k in
                                  [(0.1, 4), (0.2, 4), (0.3, 4), (0.4, 4), (0.6, 4), (1.0, 4)]]),
           ("first-block-cache", [(f"threshold {th}", *hook(diffusers.FirstBlockCacheConfig(threshold=th)))
                                  for th in (0.1, 0.2, 0.4, 0.8, 1.6, 3.2)]),
           ("taylorseer-lite", [(f"interval {n} order 2", *hook(diffusers.TaylorSeerCacheConfig(
               cache_interval=n, max_order=2, disable_cache_before_step=warmup, taylor_factors_dtype=torch.float32,
               use_lite_mode=True))) for n in (2, 3, 4)])]
    if cache_dit is not None:
        def dbc(th, k):
            def on():
                cache_dit.enable_cache(model, cache_config=cache_dit.DBCacheConfig(
                    Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=th, max_warmup_steps=warmup,
                    max_continuous_cached_steps=k, num_inference_steps=steps),
                    calibrator_config=cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=2))
            return on, lambda: cache_dit.disable_cache(model)

        out.append(("cache-dit-dbcache", [(f"threshold {th} K {k}", *dbc(th, k))
                                          for th, k in [(0.1, 4), (0.2, 4), (0.4, 4), (0.8, 4), (1.6, 4)]]))
    return out


def run_case(name, args):
    tokens, text = {"tinyflux": (64, 16), "flux-1024": (1024, 512)}[name]
    model, kw, noise = case_inputs(name, tokens, text, args.device)
    sched = diffusers.FlowMatchEulerDiscreteScheduler()
    steps, warmup = args.steps, 5
    try:
        os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")
        import cache_dit
        cd_note = f"cache-dit {getattr(cache_dit, '__version__', '?')}"
    except Exception as e:  # noqa: BLE001 (an import can fail in many ways)
        cache_dit, cd_note = None, f"cache-dit not run: {type(e).__name__}: {e}"
    loop(model, sched, kw, noise, steps, args.device)  # warm the allocator and caches
    _, full = loop(model, sched, kw, noise, steps, args.device, count=True)
    say(f"{name}: full computation {full / 1e9:.2f} GFLOP")
    import flashdiff.diffusers as fdd

    rows = []

    def timed(on, off):
        plain, mine = [], []
        for _ in range(args.reps):
            plain.append(loop(model, sched, kw, noise, steps, args.device)[0])
            on()
            try:
                mine.append(loop(model, sched, kw, noise, steps, args.device)[0])
            finally:
                off()
        return statistics.median(plain), statistics.median(mine), plain, mine

    # overhead: every step computed
    p, m, ps, ms = timed(lambda: fdd.enable(model, epsilon=0.0, warmup=warmup, scheduler=sched),
                         lambda: fdd.disable(model))
    overhead = dict(plain_s=p, adapter_s=m, overhead=m / p - 1, plain_runs=ps, adapter_runs=ms)
    say(f"{name}: overhead at ε 0: {100 * (m / p - 1):+.2f}% ({m:.3f} / {p:.3f} s)")
    for mname, cands in methods(model, sched, warmup, steps, cache_dit):
        measured = []
        for label, on, off in cands:
            on()
            try:
                _, f = loop(model, sched, kw, noise, steps, args.device, count=True)
                extra = fdd.summary(model)["flops_fraction"] if mname == "flashdiff-adapter" else None
            finally:
                off()
            measured.append((abs(f / full - args.target), label, on, off, f / full, extra))
            say(f"{name}: {mname} {label}: FLOPs {f / full:.3f}")
        _, label, on, off, frac, own = min(measured, key=lambda r: r[0])
        p, m, ps, ms = timed(on, off)
        row = dict(method=mname, setting=label, flops_fraction=frac, plain_s=p, seconds=m, speedup=p / m,
                   efficiency=(p / m) * frac, plain_runs=ps, runs=ms,
                   candidates=[dict(setting=r[1], flops_fraction=r[4]) for r in measured])
        if own is not None:
            row["summary_flops_fraction"] = own
        rows.append(row)
        say(f"{name}: {mname} {label}: {m:.3f} s against {p:.3f}, speed-up {p / m:.2f}x at FLOPs {frac:.3f} "
            f"(efficiency {(p / m) * frac:.2f})")
    return dict(case=name, tokens=tokens, text=text, steps=steps, warmup=warmup, full_gflop=full / 1e9,
                threads=torch.get_num_threads(), device=args.device, cache_dit=cd_note, overhead=overhead, rows=rows)


def markdown(rep):
    md = ["# FlashDiff's diffusers adapter in wall time\n",
          f"Commit {rep['commit']}, {rep['date']}; `{rep['command']}`; torch {rep['torch']}, diffusers "
          f"{rep['diffusers']}; {rep['machine']}. Each method's setting is its candidate nearest the FLOPs target "
          f"{rep['target']}; seconds are the medians of {rep['reps']} loops alternating with the plain loop.\n"]
    for c in rep["cases"]:
        o = c["overhead"]
        md.append(f"## {c['case']}: {c['tokens']} image and {c['text']} text tokens, {c['steps']} steps, "
                  f"{c['threads']} threads on {c['device']}\n")
        md.append(f"Full computation {c['full_gflop']:.2f} GFLOP. The adapter at ε 0 (every step computed): "
                  f"{o['adapter_s']:.3f} s against the plain loop's {o['plain_s']:.3f} s, overhead "
                  f"**{100 * o['overhead']:+.2f}%** (bar 3%). {c['cache_dit']}.\n")
        md.append("| method | setting | FLOPs fraction | loop s | plain s | speed-up | speed-up / FLOPs ratio |")
        md.append("| --- | --- | --- | --- | --- | --- | --- |")
        for r in c["rows"]:
            md.append(f"| {r['method']} | {r['setting']} | {r['flops_fraction']:.3f} | {r['seconds']:.3f} | "
                      f"{r['plain_s']:.3f} | {r['speedup']:.2f}x | {r['efficiency']:.2f} |")
        md.append("")
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="tinyflux,flux-1024")
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "wall"))
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to PyTorch")
    torch.set_num_threads(args.threads)
    cases = [run_case(n, args) for n in args.cases.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip() or "unknown"
    machine = (torch.cuda.get_device_name(0) if args.device.startswith("cuda")
               else f"{os.cpu_count()} CPUs ({os.uname().machine})")
    rep = dict(commit=commit, date=time.strftime("%Y-%m-%d"), command=" ".join(["python3", "studies/diffusers_wall.py"]
               + sys.argv[1:]), torch=torch.__version__, diffusers=diffusers.__version__, machine=machine,
               target=args.target, reps=args.reps, cases=cases)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "diffusers_wall.json"), "w") as f:
        json.dump(rep, f, indent=1)
    with open(os.path.join(args.out, "diffusers_wall.md"), "w") as f:
        f.write(markdown(rep))
    print(markdown(rep))


if __name__ == "__main__":
    main()
