//! The built-in video model's language and its ground-truth checker: prompts such as "a red
//! circle top left moving right and a blue square bottom still on a white background", and
//! a checker that reads the frames alone. Mirrors `models/tinyvideo/clips.py` (its checker
//! is the evaluation's); keep the two in step.

use crate::families::tinydit::scene::{self, PromptError, COLOURS, IMAGE, POSITIONS};

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
}
