//! The image checker of the built-in image model: does a 32x32 image show the scene its
//! prompt describes (background colour; each object's colour at its place; its shape)?
//! Held to `models/tinydit/shapes.py`'s `check` by a golden test.

use flashdiff_models::scene::{shape_mask, Scene, COLOURS, IMAGE, POSITIONS};

const CELL: f32 = IMAGE as f32 / 3.0;

fn cell_box(position: usize) -> (usize, usize, usize, usize) {
    let (row, col) = POSITIONS[position].1;
    let r = |v: f32| v.round() as usize;
    (
        r(row as f32 * CELL),
        r((row + 1) as f32 * CELL),
        r(col as f32 * CELL),
        r((col + 1) as f32 * CELL),
    )
}

fn classify(mask: &[bool]) -> Option<usize> {
    classify_among(mask, &[0, 1, 2, 3], &[3.4, 3.9, 4.4, 4.9], 12)
}

/// Best-matching shape (index into [`flashdiff_models::scene::SHAPES`], among `shapes`) of a 32x32 mask: template IoU
/// at each of `radii` around the mask's centroid; `None` under `min_pixels` pixels.
pub fn classify_among(
    mask: &[bool],
    shapes: &[usize],
    radii: &[f32],
    min_pixels: usize,
) -> Option<usize> {
    let count = mask.iter().filter(|&&m| m).count();
    if count < min_pixels {
        return None;
    }
    let (mut sx, mut sy) = (0.0, 0.0);
    for (i, _) in mask.iter().enumerate().filter(|(_, &m)| m) {
        sx += (i % IMAGE) as f32;
        sy += (i / IMAGE) as f32;
    }
    let (cx, cy) = (sx / count as f32 + 0.5, sy / count as f32 + 0.5);
    let mut best = (None, -1.0f32);
    for &shape in shapes {
        for &r in radii {
            // A triangle's centroid lies 0.2 r below the centre used to draw it.
            let offsets: &[f32] = if shape == 2 { &[-0.2, -0.1] } else { &[0.0] };
            for &oy in offsets {
                let t = shape_mask(shape, cx, cy + oy * r, r);
                let inter = t.iter().zip(mask).filter(|(a, b)| **a && **b).count();
                let union = t.iter().zip(mask).filter(|(a, b)| **a || **b).count();
                let iou = inter as f32 / union.max(1) as f32;
                if iou > best.1 {
                    best = (Some(shape), iou);
                }
            }
        }
    }
    best.0
}

/// The checker's verdict on one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Background colour right.
    pub background: bool,
    /// Every object present in its colour at its place.
    pub present: bool,
    /// Every object also of the right shape.
    pub shape: bool,
}

impl Verdict {
    /// Everything right.
    pub fn all(&self) -> bool {
        self.background && self.shape
    }
}

/// The nearest palette colour ([`COLOURS`] index) of every pixel of RGB values in [0, 1].
pub fn colour_labels(rgb: &[f32]) -> Vec<usize> {
    rgb.chunks_exact(3)
        .map(|p| {
            let d = |c: &[f32; 3]| (0..3).map(|i| (p[i] - c[i]).powi(2)).sum::<f32>();
            (0..COLOURS.len())
                .min_by(|&a, &b| d(&COLOURS[a].1).total_cmp(&d(&COLOURS[b].1)))
                .unwrap_or(0)
        })
        .collect()
}

/// Checks an RGB image (`IMAGE x IMAGE x 3`, values in [0, 1], row-major) against a scene.
pub fn check(rgb: &[f32], scene: &Scene) -> Verdict {
    assert_eq!(rgb.len(), IMAGE * IMAGE * 3, "check: image must be 32x32x3");
    let labels = colour_labels(rgb);
    let mut outside = vec![true; IMAGE * IMAGE];
    for o in &scene.objects {
        let (y0, y1, x0, x1) = cell_box(o.position);
        for y in y0..y1 {
            for x in x0..x1 {
                outside[y * IMAGE + x] = false;
            }
        }
    }
    let mut counts = [0usize; COLOURS.len()];
    for (i, &l) in labels.iter().enumerate() {
        if outside[i] {
            counts[l] += 1;
        }
    }
    let bg = (0..COLOURS.len())
        .rev()
        .max_by_key(|&c| (counts[c], std::cmp::Reverse(c)))
        .unwrap_or(0);
    let (mut present, mut shape) = (true, true);
    for o in &scene.objects {
        let (y0, y1, x0, x1) = cell_box(o.position);
        let mut m = vec![false; IMAGE * IMAGE];
        for y in y0..y1 {
            for x in x0..x1 {
                m[y * IMAGE + x] = labels[y * IMAGE + x] == o.colour;
            }
        }
        let here = m.iter().filter(|&&b| b).count() >= 12;
        present &= here;
        shape &= here && classify(&m) == Some(o.shape);
    }
    Verdict {
        background: bg == scene.background,
        present,
        shape,
    }
}
