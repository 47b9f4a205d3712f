"""Quality of the built-in model, for the model card: full computation, 50 Euler steps, on
prompts from a held-out seed (training uses seed 1; this uses 2026).

    python3 models/tinydit/evaluate.py --weights models/tinydit/tinydit.safetensors --n 256

Reports the checker's verdicts (background, shapes present, all correct) and the
cross-attention localisation: for each object, the mean attention per latent token from its
colour and shape words inside the object over the mean outside, averaged over samples, the
saliency layers and heads, recorded over the 5 warm-up steps (what the partitioner sees) and
at the last step.
"""
import argparse
import json
import time

import numpy as np
import torch

import shapes
from golden import load_model


def object_tokens(img, colour, pos, grid=8, patch=4):
    """Latent tokens holding at least 4 pixels of the object's colour inside its cell."""
    labels = shapes.nearest_colour((img.transpose(1, 2, 0) + 1.0) / 2.0)
    y0, y1, x0, x1 = shapes._cell_box(pos)
    m = np.zeros((32, 32), bool)
    m[y0:y1, x0:x1] = labels[y0:y1, x0:x1] == shapes.COLOUR_NAMES.index(colour)
    counts = m.reshape(grid, patch, grid, patch).sum((1, 3)).reshape(-1)
    return counts >= 4


def step_times(steps, shift=1.0):
    """The times of steps 0..steps (1 = noise, 0 = data): uniform, or with the weights'
    sampling shift s, u -> s u / (1 + (s - 1) u) (the Rust runtime's `Schedule::Shift`)."""
    u = [1.0 - n / steps for n in range(steps + 1)]
    return [shift * v / (1.0 + (shift - 1.0) * v) for v in u]


def sample_shift(meta):
    """The sampling schedule's shift in a weights file's metadata ("sample_shift"; a file
    without it samples at uniform times, shift 1)."""
    return json.loads(meta.get("sample_shift", "1.0"))


@torch.no_grad()
def sample_with_attention(model, x, ids, steps, warmup, layers, batch=64, shift=1.0):
    """Euler sampling of noise `x` (n x tokens x values) for prompts `ids`, in batches, at the
    times `step_times(steps, shift)`; returns the final latents, the cross-attention (n x
    tokens x words, averaged over heads and the saliency `layers`) averaged over the `warmup`
    first steps and at the last step, and the seconds it took."""
    times = step_times(steps, shift)
    outs, warms, lasts = [], [], []
    t0 = time.time()
    for b in range(0, x.shape[0], batch):
        xb, ib = x[b:b + batch].clone(), ids[b:b + batch]
        warm = torch.zeros(xb.shape[0], xb.shape[1], ib.shape[1])
        last = None
        for n in range(steps):
            t = torch.full((xb.shape[0],), times[n])
            probs = []
            v = model(xb, t, ib, probs=probs)
            cross = torch.stack([probs[l][1].mean(1) for l in layers]).mean(0)
            if n < warmup:
                warm += cross / warmup
            last = cross
            xb = xb - (times[n] - times[n + 1]) * v
        outs.append(xb)
        warms.append(warm)
        lasts.append(last)
    return torch.cat(outs), torch.cat(warms), torch.cat(lasts), time.time() - t0


@torch.no_grad()
def main():
    args = arguments(__doc__)
    model = load_model(args.weights)
    from safetensors import safe_open
    with safe_open(args.weights, "pt") as f:
        layers = json.loads(f.metadata()["saliency_layers"])
        shift = sample_shift(f.metadata())
    rng = np.random.default_rng(args.seed)
    scenes = [shapes.sample_scene(rng) for _ in range(args.n)]
    ids = torch.tensor([shapes.tokenize(shapes.prompt_text(*s)) for s in scenes])
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n, 64, model.cfg.patch_dim, generator=gen)
    x, warm, last, elapsed = sample_with_attention(model, x, ids, args.steps, args.warmup,
                                                   layers, shift=shift)
    imgs = model.unpatchify(x).clamp(-1, 1).numpy()
    report(args, *judge(imgs, scenes, warm, last), "objects_measured", layers, elapsed)


def judge(imgs, scenes, warm, last):
    """The checker's rates over images `imgs` of `scenes`, and the localisation ratios of
    each object's colour and shape words (token attention `warm` and `last`, n x tokens x
    words)."""
    verdicts = [shapes.check(imgs[i], *scenes[i]) for i in range(len(scenes))]
    ratios = {"warmup": [], "last": []}
    for i, (bg, objects) in enumerate(scenes):
        words = shapes.prompt_text(bg, objects).split()
        for colour, shape, pos in objects:
            inside = object_tokens(imgs[i], colour, pos)
            if inside.sum() == 0 or inside.all():
                continue
            # Word positions of this object's colour and shape (first match after its "a").
            for j in range(len(words) - 1):
                if words[j] == colour and words[j + 1] == shape:
                    localisation(ratios, warm[i], last[i], [j, j + 1], inside)
                    break
    return {
        "all_correct": float(np.mean([v["all"] for v in verdicts])),
        "background_correct": float(np.mean([v["background"] for v in verdicts])),
        "shapes_present": float(np.mean([v["present"] for v in verdicts])),
        "shapes_correct": float(np.mean([v["shape"] for v in verdicts])),
    }, ratios


def arguments(doc):
    """The evaluations' command line."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    return args


def localisation(ratios, warm, last, cols, inside):
    """Adds one target's attention ratio (word columns `cols`, tokens `inside` against the
    rest) over the warm-up and at the last step."""
    for key, a in (("warmup", warm), ("last", last)):
        m = a[:, cols].mean(1).numpy()
        ratios[key].append(m[inside].mean() / max(m[~inside].mean(), 1e-12))


def report(args, verdicts, ratios, measured, layers, elapsed, extra=None):
    """Prints (and with --json writes) the evaluation."""
    out = {
        "samples": args.n,
        "steps": args.steps,
        **(extra or {}),
        **verdicts,
        "attn_ratio_warmup": float(np.mean(ratios["warmup"])) if ratios["warmup"] else None,
        "attn_ratio_last": float(np.mean(ratios["last"])) if ratios["last"] else None,
        measured: len(ratios["warmup"]),
        "saliency_layers": layers,
        "sampling_seconds": round(elapsed, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
