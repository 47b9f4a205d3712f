#!/usr/bin/env python3
"""Third-party caches on TinyFLUX under the engine's verdict protocol: diffusers' own hooks
(FirstBlockCache, MagCache, FasterCache, TaylorSeerCache), cache-dit's DBCache with its
TaylorSeer calibrator and, where the flashdiff package imports, FlashDiff's adapter inside
diffusers, judged against the engine's rows of `flashdiff bench --study curve --model tinyflux`.

TinyFLUX (models/tinyflux) is diffusers' unmodified FluxTransformer2DModel (2 double-stream
and 4 single-stream blocks, 64 image and 16 text tokens). Every method here runs the curve
study's prompts, seeds and steps, the engine's noise for each seed (`engine_noise`) and the
same Euler sampler as the engine; its reference is full computation in diffusers from the same
noise.

The protocol (studies/src/protocol.rs, here studies/protocol_py.py):
- each method has 32 candidate settings over its own published knobs (see `methods`), run on
  the study's validation prompts;
- per target work level (0.2, 0.25, 0.33, 0.5) its setting is the candidate with the highest
  mean validation PSNR among those whose mean validation work is at or under the target
  (ties: less work, then the first);
- each chosen setting runs once on the study's test prompts;
- the engine's "regional" and "whole-step" rows (A) are paired with each method here (B) on
  the same test prompts: mean per-prompt PSNR difference with a 95% bootstrap interval
  (10,000 resamples from the study's bootstrap seed), worst-prompt difference, verdict.

Work: the model FLOPs a sample ran (every matmul and attention torch dispatched inside the
transformer, counted with torch's FLOP formulas; the text encoder, which every method runs
once, is left out) over full computation's; the engine's rows count the model FLOPs the engine ran by its own count of
the same layers (see the report's note). Quality: PSNR against full computation (images in
[0, 1], capped at 99 dB), SSIM, and the shapes checker's per-part verdict (background,
objects present, shapes) compared with full computation's.

    flashdiff bench --study curve --model tinyflux --validation V --prompts T --out-dir CURVE
    python3 studies/diffusers_caches.py --engine CURVE --out OUT

Needs torch and diffusers; cache-dit (`pip install cache-dit`) and the flashdiff package (as
installed, or as built into target/py) are optional: a method whose package does not import
is listed as not run, with why. `--max-candidates N` (development only) runs N of each
method's 32 candidates, and the report says so.

Writes OUT/diffusers_caches.json and OUT/diffusers_caches.md; OUT/partial.json keeps every
sample's result as it comes, so a run that stops resumes where it was (same CURVE and OUT).
Progress goes to stderr.
"""

import argparse
import contextlib
import io
import json
import logging
import math
import os
import sys
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "models", "tinyflux"))
sys.path.insert(0, os.path.join(HERE, "..", "models", "tinydit"))
import protocol_py as P  # noqa: E402
from flops_py import Flops  # noqa: E402
import shapes  # noqa: E402
from flux_model import FluxConfig, TinyFlux, engine_noise, load_folder  # noqa: E402

import diffusers  # noqa: E402

logging.getLogger("diffusers").setLevel(logging.ERROR)
T0 = time.time()


def say(msg):
    print(f"[{time.time() - T0:7.0f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- optional packages

def import_flashdiff():
    """The flashdiff package (for its adapter inside diffusers), or None and why not. Tried as
    installed, then as built into target/py (a venv that cannot see this one's torch)."""
    try:
        import flashdiff
        import flashdiff.diffusers  # noqa: F401
        return flashdiff, None
    except ImportError as e:
        why = str(e)
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = os.path.normpath(os.path.join(HERE, "..", "target", "py", "lib", v, "site-packages"))
    if os.path.isdir(os.path.join(site, "flashdiff")):
        sys.path.append(site)
        try:
            import flashdiff
            import flashdiff.diffusers  # noqa: F401
            return flashdiff, None
        except ImportError as e:
            why = f"{site}: {e}"
    return None, why


def import_cache_dit():
    """cache-dit (its console log silenced: it writes to stdout), or None and why not."""
    os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")
    try:
        import cache_dit
        return cache_dit, None
    except Exception as e:  # noqa: BLE001 (an import can fail in many ways)
        return None, f"{type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- model and sampling

class Clock:
    """What a diffusers scheduler shows the caches: a new `timesteps` per call and the index
    of the step being computed."""

    def __init__(self):
        self.timesteps = None
        self.step_index = None


def load(path):
    """TinyFLUX's EMA weights from a training checkpoint (`ckpt.pt`) or from a model folder
    written by models/tinyflux/export.py (`models/tinyflux`)."""
    if os.path.isdir(path):
        return load_folder(path)
    ck = torch.load(path, weights_only=False, map_location="cpu")
    model = TinyFlux(FluxConfig(**ck["config"]))
    model.load_state_dict(ck["ema"])
    return model.eval(), ck.get("step")


@torch.no_grad()
def sample(model, clock, case, steps, transformer=None, exact=False):
    """One sample of `case` (its text states and noise): 50-step Euler as the engine samples,
    the transformer's (`transformer`, else the model's) FLOPs counted. Returns the (3, 32, 32)
    image in about [-1, 1], its FLOPs and its wall time (ms, counting included); with `exact`,
    also FlopCounterMode's count of the same run."""
    t_model = transformer if transformer is not None else model.transformer
    states, pooled = case["states"], case["pooled"]
    clock.timesteps = torch.linspace(1.0, 0.0, steps + 1)[:-1].clone()
    clock.step_index = None
    x = case["noise"].clone()
    h = 1.0 / steps
    t0 = time.perf_counter()
    fc = FlopCounterMode(display=False) if exact else contextlib.nullcontext()
    with fc, Flops() as fl:
        for n in range(steps):
            clock.step_index = n if n > 0 else None
            t = torch.full((x.shape[0],), 1.0 - n * h)
            with t_model.cache_context("cond"):
                v = t_model(hidden_states=x, encoder_hidden_states=states, pooled_projections=pooled,
                            timestep=t, img_ids=model.img_ids, txt_ids=model.txt_ids, return_dict=False)[0]
            x = x - h * v
    ms = 1000 * (time.perf_counter() - t0)
    img = model.unpatchify(x)[0].numpy()
    if exact:
        return img, int(fl.total), ms, int(fc.get_total_flops())
    return img, int(fl.total), ms


def check_flops(model, clock, case, steps, flops):
    """Full computation's FLOPs by FlopCounterMode itself must equal `Flops`'s count."""
    exact = sample(model, clock, case, steps, exact=True)[3]
    if exact != flops:
        raise SystemExit(f"FLOP count {flops} differs from FlopCounterMode's {exact}")


def block_share(model, case):
    """The share of one full forward's FLOPs spent inside the transformer blocks (what the
    engine's row count measures); the rest is embeddings, the final norm and projection."""
    t = model.transformer
    inside = {"on": False, "flops": 0}
    blocks = list(t.transformer_blocks) + list(t.single_transformer_blocks)
    hooks = []
    for b in blocks:
        hooks.append(b.register_forward_pre_hook(lambda *_: inside.update(on=True)))
        hooks.append(b.register_forward_hook(lambda *_: inside.update(on=False)))

    class Split(Flops):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = self.total
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if inside["on"]:
                inside["flops"] += self.total - before
            return out

    try:
        with torch.no_grad(), Split() as fl:
            t(hidden_states=case["noise"], encoder_hidden_states=case["states"],
              pooled_projections=case["pooled"], timestep=torch.ones(1), img_ids=model.img_ids,
              txt_ids=model.txt_ids, return_dict=False)
    finally:
        for h in hooks:
            h.remove()
    return inside["flops"] / fl.total


def rgb01(img):
    """A (3, H, W) sample in about [-1, 1] as the (H, W, 3) image in [0, 1] it decodes to."""
    return np.ascontiguousarray(np.clip((img.transpose(1, 2, 0) + 1) / 2, 0, 1), dtype=np.float32)


def parse_prompt(text):
    """The scene a built-in prompt describes (shapes.prompt_text's inverse): (bg, objects)."""
    head, bg = text.rsplit(" on a ", 1)
    objects = []
    for part in head.split(" and "):
        w = part.split()
        objects.append((w[1], w[2], " ".join(w[3:])))
    return bg.split()[0], objects


def verdict_parts(img, case):
    """The checker's per-part verdict, as the engine's study compares it."""
    v = shapes.check(img, case["bg"], case["objects"])
    return [bool(v["background"]), bool(v["present"]), bool(v["shape"])]


# ----------------------------------------------------------------------------- the methods

def grid(*axes):
    """Every combination of the axes, the first axis varying slowest."""
    out = [()]
    for ax in axes:
        out = [o + (v,) for o in out for v in ax]
    return out


def methods(fresh, clock, ctx):
    """Each Python method: name, what it is, its knobs, its own transformer (`fresh()`: loaded
    anew, so it computes bit for bit what the reference's does) and its 32 candidates, each a
    (label, enable, disable) of functions on it. Every candidate is enabled afresh for each
    sample and disabled after it, so no state crosses prompts; each method hooks its own
    transformer, so none crosses methods (cache-dit patches the FLUX blocks it adapts, which
    breaks diffusers' FirstBlockCache on the same modules after it)."""
    steps, warmup, patches = ctx["steps"], ctx["warmup"], ctx["patches"]
    out = []

    def hook(cfg, t):
        return (lambda: t.enable_cache(cfg), t.disable_cache)

    # FirstBlockCache: one knob, its threshold (the first block's residual change, relative,
    # under which the other blocks are skipped); no warm-up, no skip cap. 32 thresholds,
    # evenly spaced in log from 0.04 (work about 0.7) to 3 (every step after the first cached).
    ths = [float(f"{v:.3g}") for v in np.geomspace(0.04, 3.0, 32)]
    t_fbc = fresh()
    out.append(dict(transformer=t_fbc,
        name="first-block-cache",
        what="diffusers' FirstBlockCache (ParaAttention's first-block cache): the first block runs every step; when its "
             "residual changed less than the threshold (relative mean absolute difference) since the last computed "
             "step, the other blocks are skipped and their last residual reused; knob: threshold",
        knobs="threshold: 32 values from 0.04 to 3, log-spaced",
        candidates=[(f"threshold {th}", *hook(diffusers.FirstBlockCacheConfig(threshold=th), t_fbc)) for th in ths]))

    # MagCache: threshold on the accumulated error its calibrated magnitude ratios predict,
    # max_skip_steps (K) and retention_ratio (steps never skipped). The retention is the
    # engine's warm-up (5 of 50 steps, 0.1), as every method here gets; threshold x K = 8 x 4.
    mag = ctx["mag_ratios"]
    t_mag = fresh()
    out.append(dict(transformer=t_mag,
        name="mag-cache",
        what="diffusers' MagCache: a step is skipped (its residual reused) while the error accumulated from the "
             "calibrated magnitude ratios stays under the threshold and fewer than K steps were skipped; ratios "
             "calibrated on the validation prompts (its calibrate mode, averaged); knobs threshold, K",
        knobs=f"threshold {{0.04 .. 1.5}} (8) x max_skip_steps {{2, 4, 8, 16}}; retention_ratio {warmup / steps:g} "
              f"(the engine's warm-up)",
        candidates=[(f"threshold {th} K {k}",
                     *hook(diffusers.MagCacheConfig(threshold=th, max_skip_steps=k, retention_ratio=warmup / steps,
                                                    num_inference_steps=steps, mag_ratios=mag), t_mag))
                    for th, k in grid([0.04, 0.05, 0.06, 0.08, 0.12, 0.2, 0.4, 1.5], [2, 4, 8, 16])]))

    # FasterCache (guidance-distilled: no unconditional branch to skip): attention outputs are
    # computed every N steps inside a timestep range and extrapolated between (weight w).
    # Knobs N x range x w = 8 x 2 x 2. Its schedule is fixed (work is the same on every
    # prompt and falls with N and a wider range), so its cheapest candidate (N 12, from step
    # 5) bounds its work from below.
    def fc_cfg(n, hi, w):
        return diffusers.FasterCacheConfig(
            spatial_attention_block_skip_range=n, spatial_attention_timestep_skip_range=(-1, hi),
            current_timestep_callback=lambda: int(1000 * float(clock.timesteps[clock.step_index or 0])),
            attention_weight_callback=lambda _: w, is_guidance_distilled=True, tensor_format="BFCHW")

    fc = grid([2, 3, 4, 5, 6, 8, 10, 12], [901, 681], [0.5, 1.0])
    t_fc = fresh()
    out.append(dict(transformer=t_fc,
        name="faster-cache",
        what="diffusers' FasterCache: every block's attention output is computed every N steps inside the timestep "
             "range and extrapolated from its last two between them (weight w); the feed-forwards always run; knobs "
             "N, range, w",
        knobs="N {2, 3, 4, 5, 6, 8, 10, 12} x timestep range (-1, 901) (after the engine's 5-step warm-up) or "
              "(-1, 681) (its default) x weight {0.5 (its default), 1}",
        fixed_schedule=True, cheapest=fc.index((12, 901, 0.5)),
        candidates=[(f"N {n} range {hi} w {w:g}", *hook(fc_cfg(n, hi, w), t_fc)) for n, hi, w in fc]))

    # TaylorSeerCache in its lite mode: diffusers' docstring gives `use_lite_mode` as the
    # predefined pattern (blocks skipped, `proj_out` forecast by a Taylor series), the mode
    # that skips whole steps; its default hooks only the attention modules, which leaves the
    # feed-forwards running (work 0.77 at interval 4, above every target). Knobs: the
    # interval between full computations, the Taylor order and the first cached step (3, its
    # default, or 5, the engine's warm-up) = 8 x 2 x 2.
    ts = grid([2, 3, 4, 5, 6, 8, 10, 12], [1, 2], [3, warmup])
    t_ts = fresh()
    out.append(dict(transformer=t_ts,
        name="taylorseer-lite",
        what="diffusers' TaylorSeerCache, lite mode: a full step every `cache_interval` steps after the first "
             "`disable_cache_before_step`; between them the blocks are skipped and the output projection forecast "
             "by a Taylor series of order `max_order` (factors in float32); knobs interval, order, start",
        knobs=f"cache_interval {{2, 3, 4, 5, 6, 8, 10, 12}} x max_order {{1, 2}} x disable_cache_before_step "
              f"{{3, {warmup}}}",
        candidates=[(f"interval {n} order {o} from {s}",
                     *hook(diffusers.TaylorSeerCacheConfig(cache_interval=n, max_order=o, disable_cache_before_step=s,
                                                           taylor_factors_dtype=torch.float32, use_lite_mode=True), t_ts))
                    for n, o, s in ts]))

    # cache-dit's DBCache with its TaylorSeer calibrator, as its FLUX recipe. TinyFLUX has 6
    # blocks (2 double, 4 single, which cache-dit's FLUX adapter chains into one list), so
    # F1B0: the first block alone measures the change (F8, its default, is more blocks than
    # the model has) and no tail block is recomputed (B0, its default; any Bn recomputes a
    # sixth of the model every cached step). Warm-up: the engine's 5 steps. Knobs threshold x
    # max_continuous_cached_steps x taylorseer_order = 4 x 4 x 2, the engine's dbcache values.
    cd = ctx["cache_dit"]
    if cd is not None:
        t_cd = fresh()

        def dbc(th, k, o):
            def on():
                cd.enable_cache(t_cd, cache_config=cd.DBCacheConfig(
                    Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=th, max_warmup_steps=warmup,
                    max_continuous_cached_steps=k, num_inference_steps=steps),
                    calibrator_config=cd.TaylorSeerCalibratorConfig(taylorseer_order=o))
            return on, lambda: cd.disable_cache(t_cd)

        out.append(dict(transformer=t_cd,
            name="cache-dit-dbcache",
            what=f"cache-dit {ctx['cache_dit_version']} DBCache F1B0 with its TaylorSeer calibrator: the first block "
                 "runs every step; when its residual's relative L1 change since the last computed step is under the "
                 "threshold (and fewer than K steps in a row were cached) the other blocks' residual is forecast; "
                 "knobs threshold, K, order",
            knobs=f"residual_diff_threshold {{0.05, 0.1, 0.2, 0.4}} x max_continuous_cached_steps {{2, 4, 8, 16}} x "
                  f"taylorseer_order {{1, 2}}; Fn 1, Bn 0, max_warmup_steps {warmup}",
            candidates=[(f"threshold {th} K {k} order {o}", *dbc(th, k, o))
                        for o, k, th in grid([1, 2], [2, 4, 8, 16], [0.05, 0.1, 0.2, 0.4])]))

    # FlashDiff's adapter inside diffusers, the engine's regional grid: epsilon x K x order.
    fd = ctx["flashdiff"]
    if fd is not None and ctx["adapter"]:
        t_fd = fresh()

        def adapter(e, k, o):
            def on():
                fd.diffusers.enable(t_fd, epsilon=e, patches=patches, max_skip=k, warmup=warmup,
                                    reuse="extrapolate" if o == 1 else "extrapolate2", scheduler=clock)
                fd.diffusers.set_salient(t_fd, ctx["salient"][None])
            return on, lambda: fd.diffusers.disable(t_fd)

        out.append(dict(transformer=t_fd,
            name="flashdiff-adapter",
            what="FlashDiff's adapter inside diffusers (flashdiff.diffusers), the engine's whole-step budget rule on "
                 "the same transformer: a step runs once one saliency patch's accumulated change reaches epsilon (or K "
                 "steps were skipped), otherwise velocities are forecast; knobs epsilon, K, order",
            knobs=f"epsilon {{0.05, 0.1, 0.2, 0.4}} x K {{2, 4, 8, 16}} x order {{1, 2}}; {patches} patches, "
                  f"warm-up {warmup}",
            candidates=[(f"ε {e} K {k} order {o}", *adapter(e, k, o))
                        for o, k, e in grid([1, 2], [2, 4, 8, 16], [0.05, 0.1, 0.2, 0.4])]))
    for m in out:
        assert len(m["candidates"]) == P.MAX_CANDIDATES, (m["name"], len(m["candidates"]))
    return out


def spread(n, k):
    """`k` of `n` indices, evenly spread (all of them when k >= n)."""
    if k >= n:
        return list(range(n))
    return sorted({int(round(i * (n - 1) / max(k - 1, 1))) for i in range(k)})


# ----------------------------------------------------------------------------- resumable results

class Partial:
    """OUT/partial.json: every sample's result by phase, method, setting and seed."""

    def __init__(self, path, meta):
        self.path, self.meta = path, meta
        self.doc = dict(meta=meta, results={})
        if os.path.exists(path):
            doc = json.load(open(path))
            if doc.get("meta") != meta:
                raise SystemExit(f"{path} was written for another study or model ({doc.get('meta')}); "
                                 "remove it or choose another --out")
            self.doc = doc
            say(f"resuming from {path}: {sum(len(v) for v in doc['results'].values())} samples done")

    def key(self, phase, method, label):
        return f"{phase}|{method}|{label}"

    def get(self, phase, method, label, seed):
        return self.doc["results"].get(self.key(phase, method, label), {}).get(str(seed))

    def put(self, phase, method, label, seed, rec):
        self.doc["results"].setdefault(self.key(phase, method, label), {})[str(seed)] = rec

    def save(self):
        tmp = self.path + ".tmp"
        json.dump(self.doc, open(tmp, "w"))
        os.replace(tmp, self.path)


# ----------------------------------------------------------------------------- main

def finite(x):
    return None if x is None or not math.isfinite(x) else x


def row_of(method, label, val, recs):
    """A method's row at a target: the chosen setting's validation means and test results,
    the fields of the engine study's rows."""
    db = [r["db"] for r in recs]
    work = [r["work"] for r in recs]
    right = [r["db"] for r in recs if r["full_right"]]
    return dict(method=method, setting=label, validation_work=val[0], validation_db=val[1],
                work=P.mean(work), max_work=max(work), db=P.mean(db), worst_db=min(db),
                worst_db_full_right=finite(min(right) if right else math.inf),
                ssim=P.mean([r["ssim"] for r in recs]),
                agreement=sum(r["agree"] for r in recs) / len(recs),
                wall_ms=P.mean([r["ms"] for r in recs]), per_prompt_db=db, per_prompt_work=work)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True, help="the output folder of `flashdiff bench --study curve --model "
                    "tinyflux`: its validation and test prompts, seeds and steps are used, its rows judged against")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", default=os.path.join(HERE, "..", "models", "tinyflux"),
                    help="TinyFLUX weights: the model folder (default models/tinyflux) or a training checkpoint")
    ap.add_argument("--methods", help="comma-separated names of the Python methods to run (default: every one "
                    "that can run here)")
    ap.add_argument("--no-adapter", action="store_true", help="leave out FlashDiff's adapter inside diffusers")
    ap.add_argument("--max-candidates", type=int, default=P.MAX_CANDIDATES,
                    help="development only: this many of each method's 32 candidates (evenly spread); the "
                         "report then says it is not the protocol's count")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--rejudge", metavar="REPORT_JSON",
                    help="run nothing in Python: take the Python methods' candidates, choices and test rows "
                         "from an earlier run's diffusers_caches.json on the same prompts, seeds, steps and "
                         "weights, and judge them against --engine's rows (after the engine's rows changed)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)

    doc = json.load(open(os.path.join(a.engine, "curve.json")))
    cfg = doc.get("config", {})
    if "targets" not in doc or "prompts" not in doc or cfg.get("model") != "tinyflux":
        raise SystemExit(f"{a.engine}/curve.json is not a protocol curve study of tinyflux: rerun "
                         "`flashdiff bench --study curve --model tinyflux` with this build")
    targets = [t["target"] for t in doc["targets"]]
    if [round(x, 6) for x in targets] != [round(x, 6) for x in P.TARGETS]:
        raise SystemExit(f"the study's targets {targets} are not the protocol's {list(P.TARGETS)} for TinyFLUX")
    steps, warmup, patches = cfg["steps"], cfg["warmup"], cfg["patches"]
    if a.rejudge:
        return rejudge(a, doc)

    flashdiff, fd_why = import_flashdiff()
    cache_dit, cd_why = import_cache_dit()
    model, ckpt_step = load(a.ckpt)
    clock = Clock()
    t = model.transformer

    @torch.no_grad()
    def case_of(seed, text):
        bg, objects = parse_prompt(text)
        ids = torch.tensor([shapes.tokenize(text)])
        states, pooled = model.text(ids)
        n = model.cfg.grid ** 2 * model.cfg.patch_dim
        noise = torch.from_numpy(engine_noise(seed, n)).reshape(1, model.cfg.grid ** 2, model.cfg.patch_dim)
        words = text.split()
        salient = np.zeros(model.cfg.max_tokens, bool)
        if flashdiff is not None:
            salient[: len(words)] = flashdiff.salient_mask(words)
        return dict(seed=seed, text=text, bg=bg, objects=objects, states=states, pooled=pooled, noise=noise,
                    salient=salient)

    val_cases = [case_of(s, p) for s, p in doc["prompts"]["validation"]]
    test_cases = [case_of(s, p) for s, p in doc["prompts"]["test"]]
    meta = dict(curve=dict(validation_seeds=cfg["validation_seeds"], test_seeds=cfg["test_seeds"], steps=steps,
                           warmup=warmup, patches=patches),
                ckpt=os.path.abspath(a.ckpt), ckpt_step=ckpt_step)
    part = Partial(os.path.join(a.out, "partial.json"), meta)

    # Full computation: every prompt's reference (its FLOPs, image and checker verdict).
    full = {}
    for phase, cases in [("validation", val_cases), ("test", test_cases)]:
        for i, c in enumerate(cases):
            say(f"full computation, {phase} prompt {i + 1}/{len(cases)} (seed {c['seed']})")
            img, fl, ms = sample(model, clock, c, steps)
            parts = verdict_parts(img, c)
            full[c["seed"]] = dict(img=img, flops=fl, ms=ms, parts=parts, right=all(parts))
    first = val_cases[0]
    check_flops(model, clock, first, steps, full[first["seed"]]["flops"])
    share = block_share(model, first)
    if flashdiff is not None:  # the numpy metrics are flashdiff-eval's
        x, y = rgb01(full[first["seed"]]["img"]), rgb01(full[test_cases[0]["seed"]]["img"])
        assert abs(P.psnr(x, y) - flashdiff.psnr(x, y)) < 1e-6 and abs(P.ssim(x, y) - flashdiff.ssim(x, y)) < 1e-9

    # MagCache's ratios for this model: its calibration mode on the validation prompts, averaged.
    mag = part.doc.get("mag_ratios")
    if mag is None:
        runs = []
        for i, c in enumerate(val_cases):
            say(f"MagCache calibration, validation prompt {i + 1}/{len(val_cases)}")
            t.enable_cache(diffusers.MagCacheConfig(calibrate=True, num_inference_steps=steps))
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    sample(model, clock, c, steps)
            finally:
                t.disable_cache()
            line = [ln for ln in buf.getvalue().splitlines() if ln.startswith("[")]
            if not line:
                raise SystemExit("MagCache calibration printed no ratios")
            runs.append(json.loads(line[-1]))
        mag = [float(np.mean(col)) for col in zip(*runs)]
        part.doc["mag_ratios"] = mag
        part.save()

    ctx = dict(steps=steps, warmup=warmup, patches=patches, mag_ratios=mag, cache_dit=cache_dit,
               cache_dit_version=getattr(cache_dit, "__version__", None), flashdiff=flashdiff,
               adapter=not a.no_adapter, salient=None)
    ms_all = methods(lambda: load(a.ckpt)[0].transformer, clock, ctx)
    if a.methods:
        want = a.methods.split(",")
        bad = [m for m in want if m not in [x["name"] for x in ms_all]]
        if bad:
            raise SystemExit(f"{bad}: the methods that can run here are {[x['name'] for x in ms_all]}")
        ms_all = [m for m in ms_all if m["name"] in want]
    absent = []
    if cache_dit is None:
        absent.append(("cache-dit-dbcache", f"cache-dit does not import: {cd_why}"))
    if flashdiff is None:
        absent.append(("flashdiff-adapter", f"the flashdiff package does not import: {fd_why}"))
    elif a.no_adapter:
        absent.append(("flashdiff-adapter", "left out (--no-adapter)"))
    count = min(a.max_candidates, P.MAX_CANDIDATES)

    def run(phase, m, label, on, off, c):
        """One sample of candidate `label` on case `c` (cached in partial.json)."""
        rec = part.get(phase, m["name"], label, c["seed"])
        if rec is not None:
            return rec
        ctx["salient"] = c["salient"]
        on()
        try:
            # A method's first sample is counted by FlopCounterMode too: where its hooks run an
            # op `Flops` does not count (one FlopCounterMode decomposes), the method is counted
            # by FlopCounterMode from then on.
            img, fl, ms, *exact = sample(model, clock, c, steps, m["transformer"],
                                         exact=m.get("counter", "unchecked") != "flops")
        finally:
            off()
        if exact:
            if m.get("counter", "unchecked") == "unchecked":
                m["counter"] = "flops" if exact[0] == fl else "FlopCounterMode"
                if exact[0] != fl:
                    say(f"warning: {m['name']}: FlopCounterMode counts {exact[0]} FLOPs, the lean counter {fl}; "
                        "counting this method with FlopCounterMode")
            fl = exact[0]
        ref = full[c["seed"]]
        x, y = rgb01(img), rgb01(ref["img"])
        rec = dict(work=fl / ref["flops"], db=min(99.0, P.psnr(x, y)), ssim=P.ssim(x, y),
                   agree=verdict_parts(img, c) == ref["parts"], full_right=ref["right"], ms=ms)
        part.put(phase, m["name"], label, c["seed"], rec)
        return rec

    def reference_intact(m):
        """Full computation on a method's copy, after its hooks came off, must be what it was."""
        img, _, _ = sample(model, clock, first, steps, m["transformer"])
        if not np.array_equal(img, full[first["seed"]]["img"]):
            raise SystemExit("full computation changed after a method was disabled: its hooks left state behind")

    # Validation: each method's candidates on every validation prompt.
    results = []
    for m in ms_all:
        n_all = len(m["candidates"])
        idx = spread(n_all, count)
        cands = []
        skip = None
        if m.get("fixed_schedule"):
            label, on, off = m["candidates"][m["cheapest"]]
            say(f"{m['name']}: its cheapest setting ({label}) on validation prompt 1, to see which targets it reaches")
            w = run("validation", m, label, on, off, val_cases[0])["work"]
            part.save()
            if w > max(P.TARGETS):
                skip = (f"its schedule is fixed and its cheapest setting ({label}) does work {w:.3f} on every prompt, "
                        f"above every target: its other settings were not run")
        for j, i in enumerate(idx):
            label, on, off = m["candidates"][i]
            if skip:
                cands.append(dict(setting=label, validation_work=None, validation_db=None))
                continue
            recs = []
            for k, c in enumerate(val_cases):
                done = " (done before)" if part.get("validation", m["name"], label, c["seed"]) else ""
                say(f"{m['name']} candidate {j + 1}/{len(idx)} ({label}), validation prompt {k + 1}/{len(val_cases)}"
                    f"{done}")
                recs.append(run("validation", m, label, on, off, c))
            part.save()
            cands.append(dict(setting=label, validation_work=P.mean([r["work"] for r in recs]),
                              validation_db=P.mean([r["db"] for r in recs])))
            say(f"{m['name']} {label}: validation work {cands[-1]['validation_work']:.3f}, "
                f"PSNR {cands[-1]['validation_db']:.2f} dB")
        reference_intact(m)
        results.append(dict(name=m["name"], what=m["what"], knobs=m["knobs"], candidates=cands, skipped=skip,
                            _idx=idx, _m=m))

    # Choice per target, then the chosen settings once on the test prompts.
    by_target = []
    for target in P.TARGETS:
        rows = []
        for r in results:
            cand = [(c["validation_work"] if c["validation_work"] is not None else math.nan,
                     c["validation_db"] if c["validation_db"] is not None else math.nan) for c in r["candidates"]]
            pick = P.choose(cand, target)
            if pick is None:
                rows.append(dict(method=r["name"], setting=None))
                continue
            label, on, off = r["_m"]["candidates"][r["_idx"][pick]]
            recs = []
            for k, c in enumerate(test_cases):
                done = " (done before)" if part.get("test", r["name"], label, c["seed"]) else ""
                say(f"target {target}: {r['name']} ({label}), test prompt {k + 1}/{len(test_cases)}{done}")
                recs.append(run("test", r["_m"], label, on, off, c))
            part.save()
            rows.append(row_of(r["name"], label, cand[pick], recs))
        by_target.append((target, rows))

    config = dict(model="tinyflux", ckpt=os.path.abspath(a.ckpt), ckpt_step=ckpt_step, engine=os.path.abspath(a.engine),
                  steps=steps, warmup=warmup, patches=patches, validation_seeds=cfg["validation_seeds"],
                  test_seeds=cfg["test_seeds"], targets=list(P.TARGETS), candidates_per_method=count,
                  protocol_candidates=P.MAX_CANDIDATES, bootstrap_seed=cfg["bootstrap_seed"],
                  resamples=P.RESAMPLES, bootstrap_rng="numpy PCG64 (the engine: ChaCha8)",
                  work="transformer FLOPs / full computation's", block_flop_share=share, torch=torch.__version__,
                  diffusers=diffusers.__version__, cache_dit=ctx["cache_dit_version"], threads=a.threads)
    finish(a, doc, config, absent=[dict(method=n, why=w) for n, w in absent],
           methods=[{k: v for k, v in r.items() if not k.startswith("_")} for r in results],
           mag=mag, by_target=by_target,
           full=dict(checker_right=sum(full[c["seed"]]["right"] for c in test_cases), prompts=len(test_cases),
                     wall_ms=P.mean([full[c["seed"]]["ms"] for c in test_cases])))


def rejudge(a, doc):
    """The Python rows of an earlier run, judged against the engine's rows of `doc`."""
    prev = json.load(open(a.rejudge))
    cfg, pc = doc["config"], prev["config"]
    for k in ["validation_seeds", "test_seeds", "steps", "warmup", "patches"]:
        if list(np.atleast_1d(cfg[k])) != list(np.atleast_1d(pc[k])):
            raise SystemExit(f"{a.rejudge} ran {k} {pc[k]}, the engine's study {cfg[k]}: not the same prompts")
    step = load(a.ckpt)[1]
    if step != pc["ckpt_step"]:
        raise SystemExit(f"{a.rejudge} ran the weights of training step {pc['ckpt_step']}, --ckpt is at {step}")
    say(f"rejudging the Python rows of {a.rejudge} against {a.engine}")
    config = dict(pc, engine=os.path.abspath(a.engine), rejudged_from=os.path.abspath(a.rejudge))
    finish(a, doc, config, absent=prev["absent"], methods=prev["methods"], mag=prev["mag_ratios"],
           by_target=[(t_["target"], t_["rows"]) for t_ in prev["targets"]], full=prev["full"])


def finish(a, doc, config, absent, methods, mag, by_target, full):
    """Pairs the engine's rows with the Python rows, checks the engine's own pair, writes the
    report."""
    cfg = doc["config"]
    # Pairs: the engine's regional and whole-step (A) against each Python method (B).
    seed = cfg["bootstrap_seed"]
    test_seeds = [s for s, _ in doc["prompts"]["test"]]
    engine_rows = {t_["target"]: [r for r in t_["rows"]] for t_ in doc["targets"]}
    out_targets = []
    for target, rows in by_target:
        eng = [r for r in engine_rows[target]]
        pairs = []
        for ea in ["regional", "whole-step"]:
            ra = next((r for r in eng if r["method"] == ea and r.get("setting") is not None), None)
            for rb in rows:
                if ra is None or rb["setting"] is None:
                    continue
                if len(ra["per_prompt_db"]) != len(test_seeds):
                    raise SystemExit(f"the engine's {ea} row has {len(ra['per_prompt_db'])} test prompts, not "
                                     f"{len(test_seeds)}")
                p = P.compare(ra["per_prompt_db"], ra["per_prompt_work"], rb["per_prompt_db"], rb["per_prompt_work"],
                              seed)
                pairs.append(dict(a=f"engine {ea}", b=rb["method"], **p))
        out_targets.append(dict(target=target, rows=rows, engine_rows=eng, pairs=pairs))

    # The engine's own regional/whole-step pair, recomputed here: the same mean and worst
    # difference; the interval's ends from another generator.
    check = []
    for t_ in doc["targets"]:
        for p in t_["pairs"]:
            if {p["a"], p["b"]} == {"regional", "whole-step"}:
                ra = next(r for r in t_["rows"] if r["method"] == p["a"])
                rb = next(r for r in t_["rows"] if r["method"] == p["b"])
                q = P.compare(ra["per_prompt_db"], ra["per_prompt_work"], rb["per_prompt_db"], rb["per_prompt_work"],
                              seed)
                check.append(dict(target=t_["target"], engine=p, here=q))

    report = dict(config=config, absent=absent, methods=methods, mag_ratios=mag, targets=out_targets,
                  engine_pair_check=check, full=full)
    json.dump(report, open(os.path.join(a.out, "diffusers_caches.json"), "w"), indent=1)
    md = markdown(report, doc)
    open(os.path.join(a.out, "diffusers_caches.md"), "w").write(md)
    print(md)
    say(f"wrote {a.out}/diffusers_caches.json and diffusers_caches.md")


def fmt(x, f="{:.2f}"):
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f.format(x)


def markdown(rep, doc):
    c = rep["config"]
    v, t = c["validation_seeds"], c["test_seeds"]
    md = ["# Third-party caches on TinyFLUX under the verdict protocol", ""]
    if c["candidates_per_method"] < c["protocol_candidates"]:
        md += [f"**Development run: {c['candidates_per_method']} candidate settings per method (--max-candidates), "
               f"not the protocol's {c['protocol_candidates']}. Its choices and verdicts are not the protocol's.**", ""]
    if c.get("rejudged_from"):
        md += [f"The Python methods' rows (candidates, choices, test samples) are those of {c['rejudged_from']}, on "
               "the same prompts, seeds, steps and weights, judged here against the engine's rows of the study "
               "named below (`--rejudge`).", ""]
    md += [f"TinyFLUX (training step {c['ckpt_step']}), the engine's curve study in {c['engine']}: {c['steps']} Euler "
           f"steps, the engine's noise per seed; settings chosen on validation seeds {v[0]}..{v[1]}, judged on test "
           f"seeds {t[0]}..{t[1]} ({t[1] - t[0]} prompts; full computation passes the checker on "
           f"{rep['full']['checker_right']}); {c['candidates_per_method']} candidate settings per Python method, "
           f"{doc['config']['candidates_per_method']} per engine method. PSNR against each side's own full "
           "computation from the same noise (capped at 99 dB).", "",
           f"Work: the model FLOPs a sample ran over full computation's, on both sides. The Python rows count the "
           f"transformer's (torch's FLOP formulas for every matmul and attention dispatched); the engine's rows "
           f"its own count of the same layers (held to torch's count of a full TinyFLUX step within 0.5%): every "
           f"computed token's row and its attention over all keys, the text rows of every computed step, every "
           f"step's conditioning, and the signal a method reads each step. The blocks hold "
           f"{100 * c['block_flop_share']:.1f}% of a full forward's FLOPs (measured here).", "",
           "Verdicts (A = the engine's method, B = the Python method, on the same test prompts): the mean per-prompt "
           f"PSNR difference A - B with its 95% percentile bootstrap interval ({c['resamples']} resamples, seed "
           f"{c['bootstrap_seed']}; numpy's generator, where the engine draws with ChaCha8, so interval ends can differ "
           "from the engine's by resampling noise), and the worst-prompt difference; \"ahead\" when the interval "
           f"lies above +{P.MARGIN_DB} dB and the worst prompt is higher, \"behind\" symmetrically, else \"level\"; "
           f"\"not matched\" when the mean work differs by more than {P.WORK_MATCH} and the cheaper one is not "
           "ahead.", "", "| method | what it is | candidate settings |", "| --- | --- | --- |"]
    for m in rep["methods"]:
        md.append(f"| {m['name']} | {m['what']} | {m['knobs']} |")
    for m in doc["methods"]:
        md.append(f"| engine {m['name']} | {m['what']} | the engine's |")
    for a in rep["absent"]:
        md.append(f"| {a['method']} | not run: {a['why']} | |")
    for m in rep["methods"]:
        if m["skipped"]:
            md += ["", f"{m['name']}: {m['skipped']}."]
    for tg in rep["targets"]:
        md += ["", f"## Work {tg['target']}", "",
               "| method | setting (validation work, mean dB) | work mean / max | PSNR mean dB | PSNR worst dB | worst where "
               "full passes the checker | SSIM | agreement |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in [dict(r, method=f"engine {r['method']}") for r in tg["engine_rows"]] + tg["rows"]:
            if r.get("setting") is None:
                md.append(f"| {r['method']} | no candidate this cheap | | | | | | |")
                continue
            md.append(f"| {r['method']} | {r['setting']} ({r['validation_work']:.3f}, {r['validation_db']:.2f}) | "
                      f"{r['work']:.3f} / {r['max_work']:.3f} | {r['db']:.2f} | {r['worst_db']:.2f} | "
                      f"{fmt(r.get('worst_db_full_right'))} | {r['ssim']:.4f} | {100 * r['agreement']:.0f}% |")
        if tg["pairs"]:
            md += ["", "| A | B | A - B mean dB [95% interval] | worst-prompt difference dB | verdict |",
                   "| --- | --- | --- | --- | --- |"]
            for p in tg["pairs"]:
                md.append(f"| {p['a']} | {p['b']} | {p['mean']:+.2f} [{p['lo']:+.2f}, {p['hi']:+.2f}] | "
                          f"{p['worst']:+.2f} | {p['verdict']} |")
    if rep["engine_pair_check"]:
        md += ["", "The engine's regional against whole-step, from its per-prompt lists, as the engine judged it and as "
               "this script does (a check of the Python protocol):", "",
               "| work | engine: mean [interval], worst, verdict | here |", "| --- | --- | --- |"]
        for ck in rep["engine_pair_check"]:
            e, h = ck["engine"], ck["here"]
            md.append(f"| {ck['target']} | {e['mean']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}], {e['worst']:+.3f}, "
                      f"{e['verdict']} | {h['mean']:+.3f} [{h['lo']:+.3f}, {h['hi']:+.3f}], {h['worst']:+.3f}, "
                      f"{h['verdict']} |")
    md += ["", "Candidates on the validation prompts (work, mean PSNR dB):", ""]
    for m in rep["methods"]:
        cells = [f"{x['setting']}: {fmt(x['validation_work'], '{:.3f}')}, {fmt(x['validation_db'])}"
                 for x in m["candidates"]]
        md.append(f"- {m['name']}: " + "; ".join(cells))
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
