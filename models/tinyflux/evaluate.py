"""Quality of a TinyFLUX model, for its model card: full computation, 50 uniform Euler steps,
on prompts from a held-out seed (training uses seed 1; this uses 2026), as TinyDiT's
evaluation (../tinydit/evaluate.py) measures it. A 32x32 model draws TinyDiT's scenes
(`shapes.py`); a larger one the larger scenes it was trained on (`scenes.py`).

    python3 models/tinyflux/evaluate.py --weights models/tinyflux --n 256 --json models/tinyflux/eval.json
    python3 models/tinyflux/evaluate.py --weights models/tinyflux-l --n 256 --json models/tinyflux-l/eval.json

The checker's verdicts (background, shapes present, all correct), and the localisation of
the joint attention's image-to-text rows, the rows FlashDiff's saliency reads: for each
object, the mean attention per image token from its colour and shape words inside the object
over the mean outside, averaged over samples, heads and the double-stream blocks, over the 5
warm-up steps and at the last step. The attention is read by wrapping diffusers' own
attention dispatch while the double-stream blocks run; the model is unchanged.
"""
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
import evaluate as base  # noqa: E402  (TinyDiT's evaluation: object tokens, ratios, report)
import scenes  # noqa: E402
import shapes  # noqa: E402
from diffusers.models.transformers import transformer_flux  # noqa: E402
from flux_model import load_folder  # noqa: E402


class JointAttention:
    """Records softmax(q k^T / sqrt(d)) of image queries over text keys (averaged over heads)
    for every attention call made while `on` is set."""

    def __init__(self, text_tokens):
        self.nt, self.on, self.maps = text_tokens, False, []
        self.inner = transformer_flux.dispatch_attention_fn

    def __call__(self, query, key, value, **kw):
        if self.on:
            # (batch, sequence, heads, head_dim), text tokens first.
            q, k = query.transpose(1, 2), key.transpose(1, 2)
            p = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
            self.maps.append(p[:, :, self.nt:, :self.nt].mean(1))
        return self.inner(query, key, value, **kw)


def object_tokens(img, colour, pos, image, patch):
    """Image tokens holding at least a quarter of their pixels in the object's colour inside
    its cell (TinyDiT's rule, at any canvas side)."""
    labels = shapes.nearest_colour((img.transpose(1, 2, 0) + 1.0) / 2.0)
    y0, y1, x0, x1 = scenes._cell_box(pos, image)
    m = np.zeros((image, image), bool)
    m[y0:y1, x0:x1] = labels[y0:y1, x0:x1] == shapes.COLOUR_NAMES.index(colour)
    grid = image // patch
    counts = m.reshape(grid, patch, grid, patch).sum((1, 3)).reshape(-1)
    return counts >= patch * patch // 4


def judge_scenes(imgs, drawn, warm, last, cfg):
    """`base.judge` for the larger scenes: the checker's rates, and the localisation ratios of
    each object's colour and shape words."""
    verdicts = [scenes.check(imgs[i], *drawn[i]) for i in range(len(drawn))]
    ratios = {"warmup": [], "last": []}
    for i, (bg, texture, objects) in enumerate(drawn):
        words = scenes.prompt_text(bg, objects, texture).split()
        for colour, shape, pos in objects:
            inside = object_tokens(imgs[i], colour, pos, cfg.image, cfg.patch)
            if inside.sum() == 0 or inside.all():
                continue
            for j in range(len(words) - 1):
                if words[j] == colour and words[j + 1] == shape:
                    base.localisation(ratios, warm[i], last[i], [j, j + 1], inside)
                    break
    rate = lambda k: float(np.mean([v[k] for v in verdicts]))  # noqa: E731
    return {"all_correct": rate("all"), "background_correct": rate("background"),
            "shapes_present": rate("present"), "shapes_correct": rate("shape")}, ratios


@torch.no_grad()
def main():
    args = base.arguments(__doc__)
    model, step = load_folder(args.weights)
    cfg = model.cfg
    rec = JointAttention(cfg.max_tokens)
    transformer_flux.dispatch_attention_fn = rec
    for block in model.transformer.transformer_blocks:
        block.register_forward_pre_hook(lambda *_: setattr(rec, "on", True))
        block.register_forward_hook(lambda *_: setattr(rec, "on", False))
    rng = np.random.default_rng(args.seed)
    larger = cfg.image > 32
    if larger:
        drawn = [scenes.sample_scene(rng) for _ in range(args.n)]
        ids = torch.tensor([scenes.tokenize(scenes.prompt_text(bg, o, t)) for bg, t, o in drawn])
    else:
        drawn = [shapes.sample_scene(rng) for _ in range(args.n)]
        ids = torch.tensor([shapes.tokenize(shapes.prompt_text(*s)) for s in drawn])
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n, cfg.grid * cfg.grid, cfg.patch_dim, generator=gen)
    times = base.step_times(args.steps)
    outs, warms, lasts = [], [], []
    t0 = time.time()
    for b in range(0, args.n, 64):
        xb, ib = x[b:b + 64].clone(), ids[b:b + 64]
        warm = torch.zeros(xb.shape[0], xb.shape[1], ib.shape[1])
        for n in range(args.steps):
            rec.maps = []
            v = model(xb, torch.full((xb.shape[0],), times[n]), ib)
            cross = torch.stack(rec.maps).mean(0)
            if n < args.warmup:
                warm += cross / args.warmup
            last = cross
            xb = xb - (times[n] - times[n + 1]) * v
        outs.append(xb)
        warms.append(warm)
        lasts.append(last)
    elapsed = time.time() - t0
    x, warm, last = torch.cat(outs), torch.cat(warms), torch.cat(lasts)
    imgs = model.unpatchify(x).clamp(-1, 1).numpy()
    judged = judge_scenes(imgs, drawn, warm, last, cfg) if larger else base.judge(imgs, drawn, warm, last)
    base.report(args, *judged, "objects_measured", list(range(cfg.double)), elapsed,
                {"train_step": step, "image": cfg.image})


if __name__ == "__main__":
    main()
