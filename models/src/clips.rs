//! The built-in video model's language and its ground-truth checker: prompts such as "a red
//! circle top left moving right and a blue square bottom still on a white background", and
//! a checker that reads the frames alone. Mirrors `models/tinyvideo/clips.py` (its checker
//! is the evaluation's); keep the two in step.

use crate::scene::{self, PromptError, COLOURS, IMAGE, POSITIONS};

/// Frames of a clip.
pub const FRAMES: usize = 8;
/// The shapes a clip may show (indices into [`scene::SHAPES`]): no cross.
pub const SHAPES: [usize; 3] = [0, 1, 2];
/// Motions and their (dx, dy) direction; objects move 2 pixels a frame.
pub const MOTIONS: [(&str, (i32, i32)); 5] = [
    ("left", (-1, 0)),
    ("right", (1, 0)),
    ("up", (0, -1)),
    ("down", (0, 1)),
    ("still", (0, 0)),
];
const CELL: f32 = IMAGE as f32 / 3.0;

/// One object of a clip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mover {
    /// Index into [`COLOURS`].
    pub colour: usize,
    /// Index into [`scene::SHAPES`] (one of [`SHAPES`]).
    pub shape: usize,
    /// Start place, index into [`POSITIONS`].
    pub position: usize,
    /// Index into [`MOTIONS`].
    pub motion: usize,
}

/// What a video prompt asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clip {
    /// Background colour, index into [`COLOURS`].
    pub background: usize,
    /// Objects, in prompt order.
    pub objects: Vec<Mover>,
}

/// Parses "a C S P (moving D | still) [and ...] on a C background".
pub fn parse(prompt: &str) -> Result<Clip, PromptError> {
    let ws = scene::words(prompt);
    let g = |s: &str| PromptError::Grammar(s.to_string());
    let (background, on) = scene::split_background(&ws)?;
    let mut objects: Vec<Mover> = Vec::new();
    for part in ws[..on].split(|w| w == "and") {
        let grammar = "each object reads \"a <colour> <shape> <place> moving <direction>\" or \
                       \"a <colour> <shape> <place> still\"";
        if part.len() < 5 || part[0] != "a" {
            return Err(g(grammar));
        }
        let (place, motion) = match part {
            [.., m] if m == "still" => (&part[3..part.len() - 1], "still"),
            [.., moving, d] if moving == "moving" && d != "still" => {
                (&part[3..part.len() - 2], d.as_str())
            }
            _ => return Err(g(grammar)),
        };
        let colour = scene::colour(&part[1]).ok_or_else(|| g("an object needs a colour"))?;
        let shape = SHAPES
            .iter()
            .copied()
            .find(|&s| scene::SHAPES[s] == part[2])
            .ok_or_else(|| g("an object is a circle, a square or a triangle"))?;
        let phrase = place.join(" ");
        let position = POSITIONS
            .iter()
            .position(|p| p.0 == phrase)
            .ok_or_else(|| g("unknown place"))?;
        let motion = MOTIONS
            .iter()
            .position(|m| m.0 == motion)
            .ok_or_else(|| g("a direction is left, right, up or down"))?;
        if objects.iter().any(|o| o.position == position) {
            return Err(g("two objects in the same place"));
        }
        objects.push(Mover {
            colour,
            shape,
            position,
            motion,
        });
    }
    if objects.is_empty() {
        return Err(g("the prompt names no object"));
    }
    Ok(Clip {
        background,
        objects,
    })
}

/// The prompt of a clip, in the training data's words.
pub fn prompt_text(clip: &Clip) -> String {
    let objects: Vec<String> = clip
        .objects
        .iter()
        .map(|o| {
            let motion = match MOTIONS[o.motion].0 {
                "still" => "still".to_string(),
                d => format!("moving {d}"),
            };
            format!(
                "a {} {} {} {motion}",
                COLOURS[o.colour].0,
                scene::SHAPES[o.shape],
                POSITIONS[o.position].0
            )
        })
        .collect();
    format!(
        "{} on a {} background",
        objects.join(" and "),
        COLOURS[clip.background].0
    )
}

/// Motions that keep an object starting at `position` inside the frame for the whole clip
/// (indices into [`MOTIONS`]).
pub fn allowed_motions(position: usize) -> Vec<usize> {
    let (row, col) = POSITIONS[position].1;
    (0..MOTIONS.len())
        .filter(|&m| match MOTIONS[m].0 {
            "right" => col <= 1,
            "left" => col >= 1,
            "down" => row <= 1,
            "up" => row >= 1,
            _ => true,
        })
        .collect()
}

/// A random clip like the training data's (one or two objects, every colour distinct, start
/// cells distinct, motions that stay in frame), from a seed: held-out prompts for the bench.
pub fn sample(seed: u64) -> Clip {
    let mut d = scene::Draw::new(seed);
    let background = d.below(COLOURS.len());
    let count = 1 + d.below(2);
    let mut objects: Vec<Mover> = Vec::new();
    while objects.len() < count {
        let position = d.below(POSITIONS.len());
        let colour = d.below(COLOURS.len());
        if colour == background
            || objects
                .iter()
                .any(|o| o.position == position || o.colour == colour)
        {
            continue;
        }
        let motions = allowed_motions(position);
        objects.push(Mover {
            colour,
            shape: SHAPES[d.below(SHAPES.len())],
            position,
            motion: motions[d.below(motions.len())],
        });
    }
    Clip {
        background,
        objects,
    }
}

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
    let labels = scene::colour_labels(rgb);
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
        v.shape &= scene::classify_among(&masks[0], &SHAPES, &[4.4, 5.1, 5.8], 20) == Some(o.shape);
        v.motion &= observed_motion(&centres) == Some(o.motion);
    }
    v
}

/// Draws a clip as the training data does, without the data's jitter: each object of radius
/// 5.1 centred in its start cell, moving 2 pixels a frame (for tests and examples).
pub fn render(clip: &Clip) -> Vec<f32> {
    let px = IMAGE * IMAGE;
    let mut out = Vec::with_capacity(FRAMES * px * 3);
    for f in 0..FRAMES {
        let mut frame: Vec<[f32; 3]> = vec![COLOURS[clip.background].1; px];
        for o in &clip.objects {
            let (row, col) = POSITIONS[o.position].1;
            let (dx, dy) = MOTIONS[o.motion].1;
            let cx = (col as f32 + 0.5) * CELL + f as f32 * 2.0 * dx as f32;
            let cy = (row as f32 + 0.5) * CELL + f as f32 * 2.0 * dy as f32;
            for (i, m) in scene::shape_mask(o.shape, cx, cy, 5.1).iter().enumerate() {
                if *m {
                    frame[i] = COLOURS[o.colour].1;
                }
            }
        }
        out.extend(frame.iter().flatten());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str =
        "a red circle top left moving right and a blue square bottom still on a white background";

    #[test]
    fn parses_the_training_grammar_and_refuses_the_rest() {
        let c = parse(PROMPT).unwrap();
        assert_eq!(COLOURS[c.background].0, "white");
        assert_eq!(c.objects.len(), 2);
        assert_eq!(MOTIONS[c.objects[0].motion].0, "right");
        assert_eq!(POSITIONS[c.objects[0].position].0, "top left");
        assert_eq!(MOTIONS[c.objects[1].motion].0, "still");
        for bad in [
            "a red circle top left on a white background",
            "a red cross top left still on a white background",
            "a red circle top left moving sideways on a white background",
            "a red circle top left moving still on a white background",
            "a red circle left still and a blue square left still on a white background",
            "a red circle top left still",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sampled_clips_round_trip_through_their_prompts() {
        let mut failed = 0;
        for seed in 0..200 {
            let c = sample(seed);
            assert_eq!(parse(&prompt_text(&c)).unwrap(), c, "seed {seed}");
            // Two objects may cross (as in the training data): one can hide the other.
            let ok = check(&render(&c), &c).all();
            assert!(
                ok || c.objects.len() == 2,
                "seed {seed}: {}",
                prompt_text(&c)
            );
            failed += usize::from(!ok);
        }
        assert!(failed <= 10, "{failed} of 200 rendered clips failed");
    }

    #[test]
    fn the_checker_accepts_a_rendered_clip_and_rejects_each_wrong_part() {
        let c = parse(PROMPT).unwrap();
        assert!(check(&render(&c), &c).all());
        let with = |f: &dyn Fn(&mut Clip)| {
            let mut w = c.clone();
            f(&mut w);
            check(&render(&w), &c)
        };
        assert!(!with(&|w| w.background = 0).background);
        assert!(!with(&|w| w.objects[0].motion = 0).motion);
        assert!(!with(&|w| w.objects[1].motion = 3).motion);
        assert!(!with(&|w| w.objects[0].shape = 2).shape);
        assert!(!with(&|w| w.objects[0].position = 2).place);
        assert!(!with(&|w| w.objects[1].colour = 4).present);
        assert!(!check(&[0.5; 10], &c).all());
    }
}
