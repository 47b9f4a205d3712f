//! The clip checker of the built-in video model: background, each object's presence, place,
//! shape and motion over the clip's frames. Held to `models/tinyvideo/clips.py`'s `check`.

use flashdiff_models::families::tinydit::clips::{Clip, FRAMES, MOTIONS, SHAPES};
use flashdiff_models::families::tinydit::scene::{COLOURS, IMAGE, POSITIONS};

use crate::image::{classify_among, colour_labels};

const CELL: f32 = IMAGE as f32 / 3.0;

/// The checker's verdict on one clip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClipVerdict {
    /// The clip's most common colour is the background.
    pub background: bool,
    /// Every object is in the first frame (at least 20 pixels of its colour).
    pub present: bool,
    /// Every object starts in its place (its first frame's centroid in its cell, one pixel
    /// of slack).
    pub place: bool,
    /// Every object has its shape in the first frame.
    pub shape: bool,
    /// Every object moves in its direction (or stays still) over the clip.
    pub motion: bool,
}

impl ClipVerdict {
    /// Everything right.
    pub fn all(&self) -> bool {
        self.background && self.present && self.place && self.shape && self.motion
    }
}

/// The direction of a track of per-frame centroids: the dominant axis of the displacement
/// from the first to the last frame, "still" under 4 pixels, `None` when the object is
/// missing at either end or moves diagonally. Index into [`MOTIONS`].
fn observed_motion(centres: &[Option<(f32, f32)>]) -> Option<usize> {
    let (Some(a), Some(b)) = (centres.first()?, centres.last()?) else {
        return None;
    };
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let name = if dx.abs().max(dy.abs()) < 4.0 {
        "still"
    } else if dx.abs() >= 2.0 * dy.abs() {
        if dx > 0.0 {
            "right"
        } else {
            "left"
        }
    } else if dy.abs() >= 2.0 * dx.abs() {
        if dy > 0.0 {
            "down"
        } else {
            "up"
        }
    } else {
        return None;
    };
    MOTIONS.iter().position(|m| m.0 == name)
}

/// Checks the frames of a clip (`FRAMES x IMAGE x IMAGE x 3`, RGB in [0, 1]) against a
/// prompt's clip; a clip of another shape fails every part.
pub fn check(rgb: &[f32], clip: &Clip) -> ClipVerdict {
    let px = IMAGE * IMAGE;
    if rgb.len() != FRAMES * px * 3 {
        return ClipVerdict {
            background: false,
            present: false,
            place: false,
            shape: false,
            motion: false,
        };
    }
    let labels = colour_labels(rgb);
    let mut counts = [0usize; COLOURS.len()];
    for &l in &labels {
        counts[l] += 1;
    }
    // The first of the most common (numpy's argmax).
    let bg = (0..COLOURS.len())
        .rev()
        .max_by_key(|&c| counts[c])
        .unwrap_or(0);
    let mut v = ClipVerdict {
        background: bg == clip.background,
        present: true,
        place: true,
        shape: true,
        motion: true,
    };
    for o in &clip.objects {
        let masks: Vec<Vec<bool>> = labels
            .chunks_exact(px)
            .map(|f| f.iter().map(|&l| l == o.colour).collect())
            .collect();
        let centres: Vec<Option<(f32, f32)>> = masks
            .iter()
            .map(|m| {
                let (mut n, mut sx, mut sy) = (0usize, 0.0f32, 0.0f32);
                for (i, _) in m.iter().enumerate().filter(|(_, &b)| b) {
                    n += 1;
                    sx += (i % IMAGE) as f32;
                    sy += (i / IMAGE) as f32;
                }
                (n >= 20).then(|| (sx / n as f32 + 0.5, sy / n as f32 + 0.5))
            })
            .collect();
        let Some((x, y)) = centres[0] else {
            v.present = false;
            v.place = false;
            v.shape = false;
            v.motion = false;
            continue;
        };
        let (row, col) = POSITIONS[o.position].1;
        let inside = |p: f32, cell: usize| {
            cell as f32 * CELL - 1.0 <= p && p <= (cell + 1) as f32 * CELL + 1.0
        };
        v.place &= inside(x, col) && inside(y, row);
        v.shape &= classify_among(&masks[0], &SHAPES, &[4.4, 5.1, 5.8], 20) == Some(o.shape);
        v.motion &= observed_motion(&centres) == Some(o.motion);
    }
    v
}
