"""Larger scenes for TinyFLUX-L (64x64 pixels, 256 tokens) and TinyFLUX-XL (128x128, 1024).

The built-in prompt language of ../tinydit/shapes.py, extended as little as the larger canvases
need: one to four objects (each in its own cell of the 3x3 grid, its size drawn so that it
covers about 2-10% of the canvas), on a flat background as before or on a striped or gradient
one ("on a blue striped background", "on a white gradient background"). Every prompt of the
32x32 models is a prompt of these. The second tone of a textured background is the colour's
shade (halfway to mid-grey by SHADE), which the checker still reads as the background colour.

The Rust side re-implements the vocabulary, the parser, the shade and the checker
(models/src/families/tinydit/scene.rs); keep the two in step.
"""
import numpy as np

import shapes

COLOURS, COLOUR_NAMES, SHAPES = shapes.COLOURS, shapes.COLOUR_NAMES, shapes.SHAPES
POSITIONS, POSITION_NAMES = shapes.POSITIONS, shapes.POSITION_NAMES
TEXTURES = ["flat", "striped", "gradient"]
# The 32x32 vocabulary unchanged (word ids keep their meaning), two texture words after it.
VOCAB = shapes.VOCAB + ["striped", "gradient"]
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
# Four objects of five words, three "and"s, "on a <colour> <texture> background": 28 words.
MAX_TOKENS = 32
MAX_OBJECTS = 4
# Object radius as a fraction of the canvas side (a circle of radius 0.085 covers 2.3% of the
# canvas, of 0.18 10.2%; the largest just spills out of its cell, a third of the side).
RADIUS = (0.085, 0.18)
# A texture's second tone: the colour moved this far towards mid-grey.
SHADE = 0.35
# Stripes: vertical, this many periods across the canvas.
STRIPES = 8


def shade(colour):
    c = np.asarray(COLOURS[colour], np.float32)
    return c + SHADE * (0.5 - c)


def prompt_text(bg, objects, texture="flat"):
    parts = [f"a {c} {s} {p}" for (c, s, p) in objects]
    tex = "" if texture == "flat" else f" {texture}"
    return " and ".join(parts) + f" on a {bg}{tex} background"


def tokenize(text):
    return shapes.tokenize(text, VOCAB, MAX_TOKENS)


def sample_scene(rng):
    bg = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    texture = TEXTURES[rng.integers(len(TEXTURES))]
    n = 1 + int(rng.integers(MAX_OBJECTS))
    cells = rng.choice(len(POSITION_NAMES), size=n, replace=False)
    objects = []
    for cell in cells:
        colour = bg
        while colour == bg:
            colour = COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
        shape = SHAPES[rng.integers(len(SHAPES))]
        objects.append((colour, shape, POSITION_NAMES[cell]))
    return bg, texture, objects


def shape_mask(shape, cx, cy, r, image):
    """Boolean image x image mask of one shape centred at (cx, cy) with radius r, in pixels:
    shapes.shape_mask on a canvas of any side."""
    ys, xs = np.mgrid[0:image, 0:image].astype(np.float32) + 0.5
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


def background(bg, texture, image):
    """The background alone, (image, image, 3) in [0, 1]."""
    c, s = np.asarray(COLOURS[bg], np.float32), shade(bg)
    xs = (np.arange(image, dtype=np.float32) + 0.5) / image
    if texture == "flat":
        w = np.zeros((image, image), np.float32)
    elif texture == "striped":
        w = np.broadcast_to((np.floor(xs * 2 * STRIPES) % 2)[None, :], (image, image))
    elif texture == "gradient":
        w = np.broadcast_to(xs[:, None], (image, image))  # top: the colour, bottom: its shade
    else:
        raise ValueError(texture)
    return (c[None, None] * (1 - w[..., None]) + s[None, None] * w[..., None]).astype(np.float32)


def render(bg, texture, objects, rng, image, radius=RADIUS):
    """The scene on image x image pixels, (image, image, 3) in [0, 1]; object radii drawn
    from `radius` (fractions of the side)."""
    img = background(bg, texture, image)
    cell = image / 3.0
    for colour, shape, pos in objects:
        row, col = POSITIONS[pos]
        jitter = image / 32.0
        cx = (col + 0.5) * cell + rng.uniform(-jitter, jitter)
        cy = (row + 0.5) * cell + rng.uniform(-jitter, jitter)
        r = rng.uniform(*radius) * image
        img[shape_mask(shape, cx, cy, r, image)] = COLOURS[colour]
    return img


def batch(rng, n, image):
    """n scenes: images in [-1, 1] as (n, 3, image, image), token ids (n, 32), scenes."""
    imgs, ids, scenes = [], [], []
    for _ in range(n):
        bg, texture, objects = sample_scene(rng)
        imgs.append(render(bg, texture, objects, rng, image))
        ids.append(tokenize(prompt_text(bg, objects, texture)))
        scenes.append((bg, texture, objects))
    x = np.stack(imgs).transpose(0, 3, 1, 2) * 2.0 - 1.0
    return x.astype(np.float32), np.array(ids, np.int64), scenes


def parse(text):
    """A prompt back to (bg, texture, objects), or ValueError saying what is wrong."""
    words = text.lower().split()
    if "on" not in words:
        raise ValueError('no "on a <colour> [striped|gradient] background" at the end')
    on = len(words) - 1 - words[::-1].index("on")
    tail = words[on:]
    if len(tail) == 4:
        texture = "flat"
    elif len(tail) == 5 and tail[3] in TEXTURES[1:]:
        texture = tail[3]
    else:
        raise ValueError('the prompt must end with "on a <colour> [striped|gradient] background"')
    if tail[1] != "a" or tail[-1] != "background" or tail[2] not in COLOURS:
        raise ValueError('the prompt must end with "on a <colour> [striped|gradient] background"')
    objects, seen = [], set()
    part = []
    for w in words[:on] + ["and"]:
        if w != "and":
            part.append(w)
            continue
        if len(part) < 4 or part[0] != "a" or part[1] not in COLOURS or part[2] not in SHAPES:
            raise ValueError('each object reads "a <colour> <shape> <position>"')
        pos = " ".join(part[3:])
        if pos not in POSITIONS or pos in seen:
            raise ValueError(f"bad or repeated position {pos!r}")
        seen.add(pos)
        objects.append((part[1], part[2], pos))
        part = []
    if not objects:
        raise ValueError("the prompt names no object")
    return tail[2], texture, objects


def _cell_box(pos, image):
    row, col = POSITIONS[pos]
    cell = image / 3.0
    y0, x0 = int(round(row * cell)), int(round(col * cell))
    y1, x1 = int(round((row + 1) * cell)), int(round((col + 1) * cell))
    return y0, y1, x0, x1


def min_pixels(image):
    """Fewest pixels of an object's colour in its cell for it to count as present: half the
    smallest object the data draws (a cross of radius 0.085, 1.7% of the canvas)."""
    return int(round(0.008 * image * image))


def template_radii(image):
    """The radii, in pixels, the checker tries: 5% apart from 0.9x the smallest the data draws
    to 1.05x the largest."""
    lo, hi = RADIUS[0] * 0.9 * image, RADIUS[1] * 1.05 * image
    n = int(np.ceil(np.log(hi / lo) / np.log(1.05)))
    return lo * 1.05 ** np.arange(n + 1)


def classify_shape(mask, image, cell=None):
    """Best-matching shape name for a boolean mask (template IoU over template_radii; the
    templates clipped to the boolean `cell`, the object's cell, as the mask is), or None if it
    has fewer than min_pixels pixels."""
    if mask.sum() < min_pixels(image):
        return None
    ys, xs = np.nonzero(mask)
    cx, cy = xs.mean() + 0.5, ys.mean() + 0.5
    best, best_iou = None, -1.0
    for shape in SHAPES:
        for r in template_radii(image):
            for oy in ((-0.2, -0.1) if shape == "triangle" else (0.0,)):
                t = shape_mask(shape, cx, cy + oy * r, r, image)
                if cell is not None:
                    t &= cell
                iou = (t & mask).sum() / max((t | mask).sum(), 1)
                if iou > best_iou:
                    best, best_iou = shape, iou
    return best


def check(img, bg, texture, objects):
    """Ground-truth verdict for an image in [-1, 1], shape (3, S, S) or (S, S, 3). The texture
    is not judged (both tones read as the background colour)."""
    if img.shape[0] == 3:
        img = img.transpose(1, 2, 0)
    image = img.shape[0]
    labels = shapes.nearest_colour((img + 1.0) / 2.0)
    outside = np.ones((image, image), bool)
    for _, _, pos in objects:
        y0, y1, x0, x1 = _cell_box(pos, image)
        outside[y0:y1, x0:x1] = False
    counts = np.bincount(labels[outside], minlength=len(COLOUR_NAMES))
    bg_ok = COLOUR_NAMES[counts.argmax()] == bg
    shapes_ok = []
    for colour, shape, pos in objects:
        y0, y1, x0, x1 = _cell_box(pos, image)
        box = np.zeros((image, image), bool)
        box[y0:y1, x0:x1] = True
        m = box & (labels == COLOUR_NAMES.index(colour))
        present = m.sum() >= min_pixels(image)
        shapes_ok.append((present, present and classify_shape(m, image, box) == shape))
    return {
        "background": bg_ok,
        "present": all(p for p, _ in shapes_ok),
        "shape": all(s for _, s in shapes_ok),
        "all": bg_ok and all(s for _, s in shapes_ok),
    }
