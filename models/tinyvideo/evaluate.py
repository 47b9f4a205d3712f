"""Quality of the built-in video model, for its model card: full computation, 50 Euler steps,
on prompts from a held-out seed (training uses seed 1; this uses 2026).

    python3 models/tinyvideo/evaluate.py --weights models/tinyvideo/tinyvideo.safetensors --n 256

Reports the checker's verdicts (clips.check: background, present, start place, shape,
motion, all correct) and the cross-attention localisation: for each object, the mean
attention per latent token from its colour and shape words on the tokens the object covers
(in any frame) over the mean elsewhere, averaged over objects, the saliency layers and
heads, over the 5 warm-up steps (what the partitioner sees) and at the last step.
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tinydit"))
import clips  # noqa: E402
from evaluate import (arguments, localisation, report, sample_shift,  # noqa: E402
                      sample_with_attention)
from export import load_weights  # noqa: E402
from shapes import nearest_colour  # noqa: E402


def object_tokens(clip01, colour, grid=4, patch=8):
    """Latent tokens (frame-major) holding at least 4 pixels of the object's colour."""
    labels = nearest_colour(clip01)  # F x 32 x 32
    m = labels == clips.COLOUR_NAMES.index(colour)
    f = m.shape[0]
    return (m.reshape(f, grid, patch, grid, patch).sum((2, 4)) >= 4).reshape(-1)


@torch.no_grad()
def main():
    args = arguments(__doc__)
    model, meta = load_weights(args.weights)
    layers = json.loads(meta["saliency_layers"])
    rng = np.random.default_rng(args.seed)
    scenes = [clips.sample_scene(rng) for _ in range(args.n)]
    ids = torch.tensor([clips.tokenize(clips.prompt_text(*s)) for s in scenes])
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n, model.cfg.tokens, model.cfg.patch_dim, generator=gen)
    shift = sample_shift(meta)
    x, warm, last, elapsed = sample_with_attention(model, x, ids, args.steps, args.warmup,
                                                   layers, shift=shift)
    vids = model.unpatchify(x).clamp(-1, 1).numpy()  # n x 3 x F x 32 x 32
    verdicts = [clips.check(vids[i], *scenes[i]) for i in range(args.n)]
    ratios = {"warmup": [], "last": []}
    for i, (bg, objects) in enumerate(scenes):
        words = clips.prompt_text(bg, objects).split()
        clip01 = (vids[i].transpose(1, 2, 3, 0) + 1.0) / 2.0
        for colour, shape, _, _ in objects:
            inside = object_tokens(clip01, colour)
            if inside.sum() == 0 or inside.all():
                continue
            cols = [j for j in range(len(words) - 1)
                    if words[j] == colour and words[j + 1] == shape]
            if not cols:
                continue
            cols = [cols[0], cols[0] + 1]
            localisation(ratios, warm[i], last[i], cols, inside)
    keys = ("background", "present", "place", "shape", "motion", "all")
    report(args, {f"{k}_correct": float(np.mean([v[k] for v in verdicts])) for k in keys},
           ratios, "objects_measured", layers, elapsed,
           extra={"train_step": int(meta.get("train_step", -1)), "sample_shift": shift})


if __name__ == "__main__":
    main()
