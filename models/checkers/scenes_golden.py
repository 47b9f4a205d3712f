"""Golden verdicts of the larger scenes' Python checker (models/tinyflux/scenes.py), for the
Rust port (eval/src/image.rs at 64 and 128 pixels) to agree with.

    python3 models/checkers/scenes_golden.py --out models/checkers/scenes_golden.safetensors

Samples are training-data renders at 64x64 and 128x128 (with the data's jitter, sizes and
textures; every third at the largest sizes, which the checker clips to their cells), half of them drawn from a changed scene (another background, or one object's
colour, shape or place) and checked against the original prompt, so that both verdicts occur.
Stored as f16; the Python verdicts are taken on the f16-rounded values the Rust test reads.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tinydit"))
sys.path.insert(0, os.path.join(HERE, "..", "tinyflux"))
import scenes  # noqa: E402


def changed(rng, bg, objects):
    """The scene with one thing changed: background, or one object's colour, shape or place."""
    what = rng.integers(4)
    objects = [list(o) for o in objects]
    o = objects[rng.integers(len(objects))]
    used = [bg] + [x[0] for x in objects]
    free_colours = [c for c in scenes.COLOUR_NAMES if c not in used]
    if what == 0:
        bg = free_colours[0]
    elif what == 1:
        o[0] = free_colours[rng.integers(len(free_colours))]
    elif what == 2:
        o[1] = [s for s in scenes.SHAPES if s != o[1]][rng.integers(3)]
    else:
        taken = [x[2] for x in objects]
        free = [p for p in scenes.POSITION_NAMES if p not in taken]
        o[2] = free[rng.integers(len(free))]
    return bg, [tuple(x) for x in objects]


def clipping_matters(img, bg, texture, objects):
    """Whether the verdict changes when the shape templates are not clipped to the cell."""
    side = img.shape[0]
    labels = scenes.shapes.nearest_colour(img)
    for colour, shape, pos in objects:
        y0, y1, x0, x1 = scenes._cell_box(pos, side)
        box = np.zeros((side, side), bool)
        box[y0:y1, x0:x1] = True
        m = box & (labels == scenes.COLOUR_NAMES.index(colour))
        if scenes.classify_shape(m, side, box) != scenes.classify_shape(m, side):
            return True
    return False


def images(rng, n, side, clipped=0):
    """n samples, then `clipped` more of the largest sizes where the cell clipping of the
    checker's templates decides the verdict."""
    xs, prompts, verdicts = [], [], []
    i = 0
    while len(xs) < n + clipped:
        bg, texture, objects = scenes.sample_scene(rng)
        bg2, objects2 = changed(rng, bg, objects) if i % 2 else (bg, objects)
        # Every third sample at the largest sizes, which spill out of their cells.
        radius = (0.17, scenes.RADIUS[1]) if i % 3 == 2 else scenes.RADIUS
        img = scenes.render(bg2, texture, objects2, rng, side, radius)
        img = img.astype(np.float16).astype(np.float32)
        i += 1
        if len(xs) >= n and (i % 3 != 0 or not clipping_matters(img, bg, texture, objects)):
            continue
        v = scenes.check(img * 2.0 - 1.0, bg, texture, objects)
        xs.append(img)
        prompts.append(scenes.prompt_text(bg, objects, texture))
        verdicts.append({k: bool(v[k]) for k in ("background", "present", "shape", "all")})
    return np.stack(xs), prompts, verdicts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    tensors, meta = {}, {}
    for side, n, clipped in ((64, 32, 4), (128, 12, 2)):
        x, p, v = images(rng, n, side, clipped)
        tensors[f"image{side}"] = torch.from_numpy(x).half()
        meta[f"image{side}_prompts"] = json.dumps(p)
        meta[f"image{side}_verdicts"] = json.dumps(v)
        print(f"{side}: {sum(x['all'] for x in v)} of {len(v)} all correct")
    save_file(tensors, args.out, metadata=meta)


if __name__ == "__main__":
    main()
