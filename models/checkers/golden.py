"""Golden verdicts of the Python checkers (the evaluations' ground truth), for the Rust ports
to agree with: models/src/families/tinydit/scene.rs against models/tinydit/shapes.py, models/src/families/tinydit/clips.rs
against models/tinyvideo/clips.py, models/src/families/tinydit/sounds.rs against models/tinyaudio/sounds.py.

    python3 models/checkers/golden.py --out models/checkers/golden.safetensors \
        --decode-out models/checkers/decode_golden.safetensors

Samples are training-data renders (with the data's jitter), half of them drawn from a
changed scene (another background, motion, shape or place; other events, or two swapped)
and checked against the original prompt, so that both verdicts occur. Samples are stored as
f16 and the Python verdicts are taken on the f16-rounded values the Rust test reads.

--decode-out also writes sounds.decode of a fixed latent (tokens x bands, silent for its
first 10 frames), for the Rust additive synthesis (models/src/families/tinydit/) to match.
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
sys.path.insert(0, os.path.join(HERE, "..", "tinyvideo"))
sys.path.insert(0, os.path.join(HERE, "..", "tinyaudio"))
import clips  # noqa: E402
import shapes  # noqa: E402
import sounds  # noqa: E402


def changed_scene(rng, bg, objects):
    """The scene with one thing changed: background, or one object's motion, shape or place."""
    what = rng.integers(4)
    objects = [list(o) for o in objects]
    o = objects[rng.integers(len(objects))]
    if what == 0:
        bg = [c for c in clips.COLOUR_NAMES if c not in [bg] + [x[0] for x in objects]][0]
    elif what == 1:
        o[3] = [m for m in clips.allowed_motions(o[2]) if m != o[3]][0]
    elif what == 2:
        o[1] = [s for s in clips.SHAPES if s != o[1]][rng.integers(2)]
    else:
        taken = [x[2] for x in objects]
        free = [p for p in clips.POSITION_NAMES if p not in taken]
        o[2] = free[rng.integers(len(free))]
        if o[3] not in clips.allowed_motions(o[2]):
            o[3] = "still"
    return bg, [tuple(x) for x in objects]


def video(rng, n):
    xs, prompts, verdicts = [], [], []
    for i in range(n):
        bg, objects = clips.sample_scene(rng)
        drawn = changed_scene(rng, bg, objects) if i % 2 else (bg, objects)
        clip = clips.render(*drawn, rng).astype(np.float16).astype(np.float32)
        v = clips.check(clip * 2.0 - 1.0, bg, objects)
        xs.append(clip)
        prompts.append(clips.prompt_text(bg, objects))
        verdicts.append({k: bool(v[k]) for k in ("background", "present", "place", "shape",
                                                   "motion", "all")})
    return np.stack(xs), prompts, verdicts


def changed_image_scene(rng, bg, objects):
    """The scene with one thing changed: background, or one object's colour, shape or place."""
    what = rng.integers(4)
    objects = [list(o) for o in objects]
    o = objects[rng.integers(len(objects))]
    used = [bg] + [x[0] for x in objects]
    if what == 0:
        bg = [c for c in shapes.COLOUR_NAMES if c not in used][0]
    elif what == 1:
        o[0] = [c for c in shapes.COLOUR_NAMES if c not in used][rng.integers(2)]
    elif what == 2:
        o[1] = [s for s in shapes.SHAPES if s != o[1]][rng.integers(3)]
    else:
        taken = [x[2] for x in objects]
        free = [p for p in shapes.POSITION_NAMES if p not in taken]
        o[2] = free[rng.integers(len(free))]
    return bg, [tuple(x) for x in objects]


def image(rng, n):
    xs, prompts, verdicts = [], [], []
    for i in range(n):
        bg, objects = shapes.sample_scene(rng)
        drawn = changed_image_scene(rng, bg, objects) if i % 2 else (bg, objects)
        img = shapes.render(*drawn, rng).astype(np.float16).astype(np.float32)
        v = shapes.check(img * 2.0 - 1.0, bg, objects)
        xs.append(img)
        prompts.append(shapes.prompt_text(bg, objects))
        verdicts.append({k: bool(v[k]) for k in ("background", "present", "shape", "all")})
    return np.stack(xs), prompts, verdicts


def audio(rng, n):
    xs, prompts, verdicts = [], [], []
    for i in range(n):
        events = sounds.sample_events(rng)
        drawn = events
        if i % 2:
            if len(events) == 2 and rng.random() < 0.5:
                a, b = events
                drawn = [(b[0], b[1], a[2], a[3]), (a[0], a[1], b[2], b[3])]
            else:
                k, p, s, e = events[0]
                if rng.random() < 0.5:
                    k = [x for x in sounds.KINDS if x != k][rng.integers(3)]
                else:
                    p = [x for x in sounds.PITCH_NAMES if x != p][rng.integers(2)]
                drawn = [(k, p, s, e)] + list(events[1:])
        wave = sounds.decode(sounds.to_unit(sounds.render_latent(drawn, rng)))
        wave = wave.astype(np.float16).astype(np.float32)
        v = sounds.check(wave, events)
        xs.append(wave)
        prompts.append(sounds.prompt_text(events))
        verdicts.append({k: bool(v[k]) for k in ("count", "kinds", "pitches", "all")})
    return np.stack(xs), prompts, verdicts


def decode_golden(path):
    rng = np.random.default_rng(3)
    lat = np.clip(rng.normal(-0.6, 0.5, (sounds.BANDS, sounds.FRAMES)), -1, 1).astype(np.float32)
    lat[:, :10] = -1.0
    wave = sounds.decode(lat.astype(np.float64)).astype(np.float32)
    save_file({"latent": torch.from_numpy(lat.T.copy()), "wave": torch.from_numpy(wave)}, path,
              metadata={"what": "sounds.decode of latent (tokens x bands)"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--decode-out", default="")
    args = ap.parse_args()
    if args.decode_out:
        decode_golden(args.decode_out)
    rng = np.random.default_rng(args.seed)
    vx, vp, vv = video(rng, args.n)
    ax, ap_, av = audio(rng, args.n)
    # Drawn after the others, so that their samples stay those of the files already made.
    ix, ip, iv = image(rng, args.n)
    save_file(
        {"video": torch.from_numpy(vx).half(), "audio": torch.from_numpy(ax).half(),
         "image": torch.from_numpy(ix).half()},
        args.out,
        metadata={
            "video_prompts": json.dumps(vp),
            "video_verdicts": json.dumps(vv),
            "audio_prompts": json.dumps(ap_),
            "audio_verdicts": json.dumps(av),
            "image_prompts": json.dumps(ip),
            "image_verdicts": json.dumps(iv),
        },
    )
    for name, vs in (("image", iv), ("video", vv), ("audio", av)):
        print(f"{name}: {sum(v['all'] for v in vs)} of {len(vs)} all correct")


if __name__ == "__main__":
    main()
