//! The image checker of the built-in image models: does an image show the scene its prompt
//! describes (background colour; each object's colour at its place; its shape)? At 32x32
//! pixels held to `models/tinydit/shapes.py`'s `check`, at 64 and 128 (TinyFLUX-L and -XL) to
//! `models/tinyflux/scenes.py`'s, each by a golden test.

use flashdiff_models::families::tinydit::scene::{
    shape_mask_on, Scene, COLOURS, IMAGE, POSITIONS, RADIUS,
};

/// The pixel box (y0, y1, x0, x1) of a position's cell on a `side`-pixel canvas.
fn cell_box(side: usize, position: usize) -> (usize, usize, usize, usize) {
    let cell = side as f32 / 3.0;
    let (row, col) = POSITIONS[position].1;
    let r = |v: f32| v.round() as usize;
    (
        r(row as f32 * cell),
        r((row + 1) as f32 * cell),
        r(col as f32 * cell),
        r((col + 1) as f32 * cell),
    )
}

/// How a canvas of one side is judged: the template radii, the fewest pixels an object needs,
/// and whether templates are clipped to the object's cell as its mask is.
struct Rules {
    side: usize,
    radii: Vec<f32>,
    min_pixels: usize,
    clip: bool,
}

impl Rules {
    fn for_side(side: usize) -> Self {
        if side == IMAGE {
            // shapes.py: the 32x32 data's radii 3.6-4.6 px.
            return Self {
                side,
                radii: vec![3.4, 3.9, 4.4, 4.9],
                min_pixels: 12,
                clip: false,
            };
        }
        // scenes.py: radii 5% apart from 0.9x the smallest drawn to 1.05x the largest; present
        // from 0.8% of the canvas (half the smallest object).
        let (lo, hi) = (
            RADIUS.0 as f64 * 0.9 * side as f64,
            RADIUS.1 as f64 * 1.05 * side as f64,
        );
        let n = ((hi / lo).ln() / 1.05f64.ln()).ceil() as i32;
        Self {
            side,
            radii: (0..=n).map(|i| (lo * 1.05f64.powi(i)) as f32).collect(),
            min_pixels: (0.008 * (side * side) as f64).round() as usize,
            clip: true,
        }
    }
}

/// Best-matching shape (index into [`flashdiff_models::families::tinydit::scene::SHAPES`], among `shapes`) of a
/// 32x32 mask: template IoU at each of `radii` around the mask's centroid; `None` under
/// `min_pixels` pixels.
pub fn classify_among(
    mask: &[bool],
    shapes: &[usize],
    radii: &[f32],
    min_pixels: usize,
) -> Option<usize> {
    classify_on(IMAGE, mask, shapes, radii, min_pixels, None)
}

/// [`classify_among`] on a `side`-pixel canvas, the templates clipped to `clip` when given.
fn classify_on(
    side: usize,
    mask: &[bool],
    shapes: &[usize],
    radii: &[f32],
    min_pixels: usize,
    clip: Option<&[bool]>,
) -> Option<usize> {
    let count = mask.iter().filter(|&&m| m).count();
    if count < min_pixels {
        return None;
    }
    let (mut sx, mut sy) = (0.0f64, 0.0f64);
    for (i, _) in mask.iter().enumerate().filter(|(_, &m)| m) {
        sx += (i % side) as f64;
        sy += (i / side) as f64;
    }
    let (cx, cy) = (
        (sx / count as f64 + 0.5) as f32,
        (sy / count as f64 + 0.5) as f32,
    );
    let mut best = (None, -1.0f32);
    for &shape in shapes {
        for &r in radii {
            // A triangle's centroid lies 0.2 r below the centre used to draw it.
            let offsets: &[f32] = if shape == 2 { &[-0.2, -0.1] } else { &[0.0] };
            for &oy in offsets {
                let mut t = shape_mask_on(side, shape, cx, cy + oy * r, r);
                if let Some(c) = clip {
                    t.iter_mut().zip(c).for_each(|(t, c)| *t &= *c);
                }
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

/// The side of a square RGB image of `len` values, if it is one the checker judges (32 or
/// more pixels, divisible by 3 no matter: cells round to whole pixels).
pub fn square_side(len: usize) -> Option<usize> {
    if len % 3 != 0 {
        return None;
    }
    let side = ((len / 3) as f64).sqrt().round() as usize;
    (side >= IMAGE && side * side * 3 == len).then_some(side)
}

/// Checks a square RGB image (`side x side x 3`, values in [0, 1], row-major) against a
/// scene; `None` when the image is not square or smaller than 32x32. The background's
/// texture is not judged: both its tones read as its colour.
pub fn check_sized(rgb: &[f32], scene: &Scene) -> Option<Verdict> {
    let side = square_side(rgb.len())?;
    let rules = Rules::for_side(side);
    let labels = colour_labels(rgb);
    let mut outside = vec![true; side * side];
    for o in &scene.objects {
        let (y0, y1, x0, x1) = cell_box(side, o.position);
        for y in y0..y1 {
            outside[y * side + x0..y * side + x1].fill(false);
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
        let (y0, y1, x0, x1) = cell_box(side, o.position);
        let mut cell = vec![false; side * side];
        for y in y0..y1 {
            cell[y * side + x0..y * side + x1].fill(true);
        }
        let m: Vec<bool> = cell
            .iter()
            .zip(&labels)
            .map(|(&c, &l)| c && l == o.colour)
            .collect();
        let here = m.iter().filter(|&&b| b).count() >= rules.min_pixels;
        present &= here;
        shape &= here
            && classify_on(
                rules.side,
                &m,
                &[0, 1, 2, 3],
                &rules.radii,
                rules.min_pixels,
                rules.clip.then_some(&cell[..]),
            ) == Some(o.shape);
    }
    Some(Verdict {
        background: bg == scene.background,
        present,
        shape,
    })
}

/// Checks a 32x32 (or larger square) RGB image against a scene, as [`check_sized`].
///
/// # Panics
/// When the image is not square or smaller than 32x32 pixels.
pub fn check(rgb: &[f32], scene: &Scene) -> Verdict {
    check_sized(rgb, scene).unwrap_or_else(|| {
        panic!(
            "check: {} values are not a square RGB image of 32x32 pixels or more",
            rgb.len()
        )
    })
}
