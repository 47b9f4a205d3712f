"""Procedural text-to-video data for the built-in video model, and its ground-truth checker.

A clip is 8 frames of 32x32 RGB: a background colour and one or two shapes, each in its own
named colour, starting at a named cell of a 3x3 grid and either moving 2 pixels a frame in a
named direction or staying still. The prompt says exactly that, e.g.
"a red circle top left moving right and a blue square bottom still on a white background".
The Rust runtime re-implements vocabulary, prompt parsing and the checker; keep them in step.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tinydit"))
# Colours, shape drawing and palette lookup are the image model's (shapes.py).
from shapes import COLOURS, nearest_colour, shape_mask  # noqa: E402
import shapes  # noqa: E402

FRAMES = 8
IMAGE = 32
MAX_TOKENS = 20
SPEED = 2.0  # pixels per frame

COLOUR_NAMES = list(COLOURS)
SHAPES = ["circle", "square", "triangle"]
POSITIONS = {
    "top left": (0, 0), "top": (0, 1), "top right": (0, 2),
    "left": (1, 0), "center": (1, 1), "right": (1, 2),
    "bottom left": (2, 0), "bottom": (2, 1), "bottom right": (2, 2),
}
POSITION_NAMES = list(POSITIONS)
# Direction of motion: (dx, dy) per frame in units of SPEED; "still" does not move.
MOTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}
MOTION_NAMES = list(MOTIONS)
FUNCTION_WORDS = ["a", "and", "on", "moving"]
VOCAB = (["<pad>"] + FUNCTION_WORDS + ["background", "still"] + COLOUR_NAMES + SHAPES
         + ["top", "bottom", "left", "right", "center", "up", "down"])
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
CELL = IMAGE / 3.0


def motion_phrase(motion):
    return "still" if motion == "still" else f"moving {motion}"


def prompt_text(bg, objects):
    parts = [f"a {c} {s} {p} {motion_phrase(m)}" for (c, s, p, m) in objects]
    return " and ".join(parts) + f" on a {bg} background"


def tokenize(text):
    return shapes.tokenize(text, VOCAB, MAX_TOKENS)


def allowed_motions(pos):
    """Motions that keep a shape starting in `pos` inside the frame for the whole clip."""
    row, col = POSITIONS[pos]
    out = ["still"]
    if col <= 1:
        out.append("right")
    if col >= 1:
        out.append("left")
    if row <= 1:
        out.append("down")
    if row >= 1:
        out.append("up")
    return out


def sample_scene(rng):
    """(background, [(colour, shape, start place, motion)]): one or two objects, every colour
    distinct (background included), start cells distinct."""
    colours = rng.permutation(len(COLOUR_NAMES))
    bg = COLOUR_NAMES[colours[0]]
    n = 1 + int(rng.random() < 0.35)
    cells = rng.choice(len(POSITION_NAMES), size=n, replace=False)
    objects = []
    for i, cell in enumerate(cells):
        pos = POSITION_NAMES[cell]
        ms = allowed_motions(pos)
        # Still in a fifth of objects, the other directions equally often.
        motion = "still" if rng.random() < 0.2 else ms[1 + int(rng.integers(len(ms) - 1))]
        objects.append((COLOUR_NAMES[colours[1 + i]], SHAPES[rng.integers(len(SHAPES))], pos,
                        motion))
    return bg, objects


def start_centre(pos):
    row, col = POSITIONS[pos]
    return (col + 0.5) * CELL, (row + 0.5) * CELL


def render(bg, objects, rng):
    """(FRAMES, 32, 32, 3) in [0, 1]."""
    clip = np.empty((FRAMES, IMAGE, IMAGE, 3), np.float32)
    clip[:] = COLOURS[bg]
    for colour, shape, pos, motion in objects:
        cx, cy = start_centre(pos)
        cx += rng.uniform(-1.0, 1.0)
        cy += rng.uniform(-1.0, 1.0)
        r = rng.uniform(4.6, 5.6)
        dx, dy = MOTIONS[motion]
        for f in range(FRAMES):
            m = shape_mask(shape, cx + f * SPEED * dx, cy + f * SPEED * dy, r)
            clip[f][m] = COLOURS[colour]
    return clip


def batch(rng, n):
    """n scenes: clips in [-1, 1] as (n, 3, FRAMES, 32, 32), token ids (n, MAX_TOKENS), scenes."""
    clips, ids, scenes = [], [], []
    for _ in range(n):
        bg, objects = sample_scene(rng)
        clips.append(render(bg, objects, rng))
        ids.append(tokenize(prompt_text(bg, objects)))
        scenes.append((bg, objects))
    x = np.stack(clips).transpose(0, 4, 1, 2, 3) * 2.0 - 1.0
    return x.astype(np.float32), np.array(ids, np.int64), scenes


def classify_shape(mask):
    """Best-matching shape name for a boolean 32x32 mask, or None if too small."""
    return shapes.classify_shape(mask, SHAPES, (4.4, 5.1, 5.8), 20)


def observed_motion(centres):
    """Direction name from per-frame centroids ((x, y) or None): the dominant axis of the
    displacement from the first to the last frame, "still" if it is under 4 pixels, None if
    the object is missing in the first or last frame or moves diagonally."""
    if centres[0] is None or centres[-1] is None:
        return None
    dx, dy = centres[-1][0] - centres[0][0], centres[-1][1] - centres[0][1]
    if max(abs(dx), abs(dy)) < 4.0:
        return "still"
    if abs(dx) >= 2.0 * abs(dy):
        return "right" if dx > 0 else "left"
    if abs(dy) >= 2.0 * abs(dx):
        return "down" if dy > 0 else "up"
    return None


def check(clip, bg, objects):
    """Ground-truth verdict for a clip in [-1, 1], shape (3, F, 32, 32) or (F, 32, 32, 3).

    background: the most common colour of the clip is the prompt's background; for each object
    (its colour is unique in the scene): present in frame 0 with its centroid inside its start
    cell (one pixel of slack), of its shape (template match in frame 0), and moving in its
    direction (centroid displacement over the clip)."""
    if clip.shape[0] == 3:
        clip = clip.transpose(1, 2, 3, 0)
    labels = nearest_colour((clip + 1.0) / 2.0)
    counts = np.bincount(labels.reshape(-1), minlength=len(COLOUR_NAMES))
    bg_ok = COLOUR_NAMES[counts.argmax()] == bg
    res = {"background": bg_ok, "present": True, "place": True, "shape": True, "motion": True}
    for colour, shape, pos, motion in objects:
        masks = labels == COLOUR_NAMES.index(colour)
        centres = []
        for f in range(FRAMES):
            ys, xs = np.nonzero(masks[f])
            centres.append((xs.mean() + 0.5, ys.mean() + 0.5) if len(xs) >= 20 else None)
        if centres[0] is None:
            res["present"] = res["place"] = res["shape"] = res["motion"] = False
            continue
        row, col = POSITIONS[pos]
        x, y = centres[0]
        if not (col * CELL - 1 <= x <= (col + 1) * CELL + 1
                and row * CELL - 1 <= y <= (row + 1) * CELL + 1):
            res["place"] = False
        if classify_shape(masks[0]) != shape:
            res["shape"] = False
        if observed_motion(centres) != motion:
            res["motion"] = False
    res["all"] = all(res[k] for k in ("background", "present", "place", "shape", "motion"))
    return res
