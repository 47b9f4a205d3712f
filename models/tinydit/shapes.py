"""Procedural text-to-image data for the built-in model, and its ground-truth checker.

An image is 32x32 RGB: a background colour and one or two shapes, each in a named colour at a
named cell of a 3x3 grid. The prompt describes exactly that, e.g.
"a red circle top left and a blue square bottom on a white background".
The Rust runtime re-implements vocabulary, prompt parsing, rendering and the checker
(runtime/src/shapes.rs); keep the two in step.
"""
import numpy as np

IMAGE = 32
MAX_TOKENS = 16

COLOURS = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.75, 0.20),
    "blue": (0.15, 0.25, 0.95),
    "yellow": (0.95, 0.90, 0.10),
    "purple": (0.60, 0.15, 0.80),
    "orange": (1.00, 0.55, 0.05),
    "white": (0.97, 0.97, 0.97),
    "black": (0.05, 0.05, 0.05),
}
COLOUR_NAMES = list(COLOURS)
SHAPES = ["circle", "square", "triangle", "cross"]
# Cell (row, col) of the 3x3 grid for each position phrase.
POSITIONS = {
    "top left": (0, 0), "top": (0, 1), "top right": (0, 2),
    "left": (1, 0), "center": (1, 1), "right": (1, 2),
    "bottom left": (2, 0), "bottom": (2, 1), "bottom right": (2, 2),
}
POSITION_NAMES = list(POSITIONS)
FUNCTION_WORDS = ["a", "and", "on"]
VOCAB = (["<pad>"] + FUNCTION_WORDS + ["background"] + COLOUR_NAMES + SHAPES
         + ["top", "bottom", "left", "right", "center"])
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
CELL = IMAGE / 3.0


def prompt_text(bg, objects):
    parts = [f"a {c} {s} {p}" for (c, s, p) in objects]
    return " and ".join(parts) + f" on a {bg} background"


def tokenize(text, vocab=None, max_tokens=None):
    """Word ids padded to `max_tokens` (this model's vocabulary and length by default)."""
    vocab = VOCAB if vocab is None else vocab
    max_tokens = MAX_TOKENS if max_tokens is None else max_tokens
    word_id = WORD_ID if vocab is VOCAB else {w: i for i, w in enumerate(vocab)}
    words = text.lower().split()
    unknown = [w for w in words if w not in word_id]
    if unknown:
        raise ValueError(f"unknown words {unknown}; vocabulary: {vocab[1:]}")
    if len(words) > max_tokens:
        raise ValueError(f"prompt has {len(words)} words, at most {max_tokens}")
    ids = [word_id[w] for w in words]
    return ids + [0] * (max_tokens - len(ids))


def sample_scene(rng):
    bg = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    n = 1 + int(rng.integers(2))
    cells = rng.choice(len(POSITION_NAMES), size=n, replace=False)
    objects = []
    for cell in cells:
        colour = bg
        while colour == bg:
            colour = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
        shape = SHAPES[rng.integers(len(SHAPES))]
        objects.append((colour, shape, POSITION_NAMES[cell]))
    return bg, objects


def shape_mask(shape, cx, cy, r):
    """Boolean 32x32 mask of one shape centred at (cx, cy) with radius r, in pixels."""
    ys, xs = np.mgrid[0:IMAGE, 0:IMAGE].astype(np.float32) + 0.5
    dx, dy = xs - cx, ys - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        h = 0.85 * r
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "triangle":
        top, base = cy - r, cy + 0.8 * r
        return (ys >= top) & (ys <= base) & (np.abs(dx) <= r * (ys - top) / (1.8 * r))
    if shape == "cross":
        arm = 0.35 * r
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= r)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= r))
    raise ValueError(shape)


def render(bg, objects, rng):
    img = np.empty((IMAGE, IMAGE, 3), np.float32)
    img[:] = COLOURS[bg]
    for colour, shape, pos in objects:
        row, col = POSITIONS[pos]
        cx = (col + 0.5) * CELL + rng.uniform(-1.0, 1.0)
        cy = (row + 0.5) * CELL + rng.uniform(-1.0, 1.0)
        r = rng.uniform(3.6, 4.6)
        img[shape_mask(shape, cx, cy, r)] = COLOURS[colour]
    return img


def batch(rng, n):
    """n scenes: images in [-1, 1] as (n, 3, 32, 32), token ids (n, 16), scenes."""
    imgs, ids, scenes = [], [], []
    for _ in range(n):
        bg, objects = sample_scene(rng)
        imgs.append(render(bg, objects, rng))
        ids.append(tokenize(prompt_text(bg, objects)))
        scenes.append((bg, objects))
    x = np.stack(imgs).transpose(0, 3, 1, 2) * 2.0 - 1.0
    return x.astype(np.float32), np.array(ids, np.int64), scenes


def _cell_box(pos):
    row, col = POSITIONS[pos]
    y0, x0 = int(round(row * CELL)), int(round(col * CELL))
    y1, x1 = int(round((row + 1) * CELL)), int(round((col + 1) * CELL))
    return y0, y1, x0, x1


def nearest_colour(img01):
    """Index of the nearest palette colour of every pixel of an (..., 3) array in [0, 1]."""
    pal = np.array([COLOURS[c] for c in COLOUR_NAMES], np.float32)
    d = ((img01[..., None, :] - pal) ** 2).sum(-1)
    return d.argmin(-1)


def classify_shape(mask, names=None, radii=(3.4, 3.9, 4.4, 4.9), min_pixels=12):
    """Best-matching shape name for a boolean 32x32 mask (template IoU over `names` at
    `radii`), or None if it has fewer than `min_pixels` pixels."""
    if mask.sum() < min_pixels:
        return None
    ys, xs = np.nonzero(mask)
    cx, cy = xs.mean() + 0.5, ys.mean() + 0.5
    best, best_iou = None, -1.0
    for shape in SHAPES if names is None else names:
        for r in radii:
            # A triangle's centroid lies 0.2 r below the centre used to draw it.
            for oy in ((-0.2, -0.1) if shape == "triangle" else (0.0,)):
                t = shape_mask(shape, cx, cy + oy * r, r)
                iou = (t & mask).sum() / max((t | mask).sum(), 1)
                if iou > best_iou:
                    best, best_iou = shape, iou
    return best


def check(img, bg, objects):
    """Ground-truth verdict for an image in [-1, 1], shape (3, 32, 32) or (32, 32, 3)."""
    if img.shape[0] == 3:
        img = img.transpose(1, 2, 0)
    labels = nearest_colour((img + 1.0) / 2.0)
    outside = np.ones((IMAGE, IMAGE), bool)
    for _, _, pos in objects:
        y0, y1, x0, x1 = _cell_box(pos)
        outside[y0:y1, x0:x1] = False
    counts = np.bincount(labels[outside], minlength=len(COLOUR_NAMES))
    bg_ok = COLOUR_NAMES[counts.argmax()] == bg
    shapes_ok = []
    for colour, shape, pos in objects:
        y0, y1, x0, x1 = _cell_box(pos)
        m = np.zeros((IMAGE, IMAGE), bool)
        m[y0:y1, x0:x1] = labels[y0:y1, x0:x1] == COLOUR_NAMES.index(colour)
        present = m.sum() >= 12
        shapes_ok.append((present, present and classify_shape(m) == shape))
    return {
        "background": bg_ok,
        "present": all(p for p, _ in shapes_ok),
        "shape": all(s for _, s in shapes_ok),
        "all": bg_ok and all(s for _, s in shapes_ok),
    }
