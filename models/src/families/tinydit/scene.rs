//! The built-in image models' language: vocabulary, prompt parsing into a scene (background
//! and objects), tokenisation, sampling and rendering of scenes. Mirrors
//! `models/tinydit/shapes.py` (the 32x32 models: one or two objects on a flat background) and
//! `models/tinyflux/scenes.py` (TinyFLUX-L and -XL at 64 and 128 pixels: one to four objects
//! of varied size, on a flat, striped or gradient background); keep them in step. Every prompt
//! of the 32x32 language is one of the larger.

use std::fmt;

/// Image side in pixels of the 32x32 models (TinyDiT, TinyFLUX).
pub const IMAGE: usize = 32;
/// Background textures, by their prompt word ("flat" is never written: "on a red background").
pub const TEXTURES: [&str; 3] = ["flat", "striped", "gradient"];
/// Most objects in a scene of the larger language.
pub const MAX_OBJECTS: usize = 4;
/// Object radius as a fraction of the canvas side in the larger language (a circle covers
/// 2.3% of the canvas at the first, 10.2% at the second).
pub const RADIUS: (f32, f32) = (0.085, 0.18);
/// A texture's second tone: the colour moved this far towards mid-grey.
pub const SHADE: f32 = 0.35;
/// Stripes: vertical, this many periods across the canvas.
pub const STRIPES: usize = 8;

/// Colour names and their RGB values in [0, 1].
pub const COLOURS: [(&str, [f32; 3]); 8] = [
    ("red", [0.90, 0.10, 0.10]),
    ("green", [0.10, 0.75, 0.20]),
    ("blue", [0.15, 0.25, 0.95]),
    ("yellow", [0.95, 0.90, 0.10]),
    ("purple", [0.60, 0.15, 0.80]),
    ("orange", [1.00, 0.55, 0.05]),
    ("white", [0.97, 0.97, 0.97]),
    ("black", [0.05, 0.05, 0.05]),
];
/// Shape names.
pub const SHAPES: [&str; 4] = ["circle", "square", "triangle", "cross"];
/// Position phrases and their (row, column) in the 3x3 grid.
pub const POSITIONS: [(&str, (usize, usize)); 9] = [
    ("top left", (0, 0)),
    ("top", (0, 1)),
    ("top right", (0, 2)),
    ("left", (1, 0)),
    ("center", (1, 1)),
    ("right", (1, 2)),
    ("bottom left", (2, 0)),
    ("bottom", (2, 1)),
    ("bottom right", (2, 2)),
];

/// One object of a scene.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Index into [`COLOURS`].
    pub colour: usize,
    /// Index into [`SHAPES`].
    pub shape: usize,
    /// Index into [`POSITIONS`].
    pub position: usize,
}

/// What a prompt asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scene {
    /// Background colour, index into [`COLOURS`].
    pub background: usize,
    /// Background texture, index into [`TEXTURES`] (0: flat).
    pub texture: usize,
    /// Objects, in prompt order.
    pub objects: Vec<Object>,
}

/// Why a prompt was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptError {
    /// Words outside the vocabulary.
    UnknownWords {
        /// The unknown words.
        words: Vec<String>,
        /// The vocabulary.
        vocabulary: Vec<String>,
    },
    /// Too many words for the model.
    TooLong {
        /// Words given.
        words: usize,
        /// Most allowed.
        max: usize,
    },
    /// Known words in an order the model was not trained on.
    Grammar(String),
    /// No words at all (empty, or only spaces and punctuation).
    Empty,
}

impl fmt::Display for PromptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWords { words, vocabulary } => write!(
                f,
                "unknown word{} {}; the built-in model knows: {}",
                if words.len() == 1 { "" } else { "s" },
                words.iter().map(|w| format!("{w:?}")).collect::<Vec<_>>().join(", "),
                vocabulary.join(" ")
            ),
            Self::TooLong { words, max } => write!(f, "prompt has {words} words; the built-in model reads at most {max}"),
            Self::Grammar(s) => write!(
                f,
                "{s}; write prompts like \"a red circle top left and a blue square bottom on a white background\""
            ),
            Self::Empty => write!(
                f,
                "the prompt has no words; the built-in models draw (or sound) what their prompt names"
            ),
        }
    }
}

impl std::error::Error for PromptError {}

pub(crate) fn colour(w: &str) -> Option<usize> {
    COLOURS.iter().position(|c| c.0 == w)
}

/// Lower-cased words of a prompt, punctuation trimmed.
pub fn words(prompt: &str) -> Vec<String> {
    prompt
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Token ids of a prompt, padded with 0 to `max_tokens`, against the model's vocabulary.
pub fn tokenize(
    prompt: &str,
    vocab: &[String],
    max_tokens: usize,
) -> Result<Vec<u32>, PromptError> {
    let ws = words(prompt);
    if ws.is_empty() {
        return Err(PromptError::Empty);
    }
    let unknown: Vec<String> = ws
        .iter()
        .filter(|w| !vocab[1..].contains(w))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(PromptError::UnknownWords {
            words: unknown,
            vocabulary: vocab[1..].to_vec(),
        });
    }
    if ws.len() > max_tokens {
        return Err(PromptError::TooLong {
            words: ws.len(),
            max: max_tokens,
        });
    }
    let mut ids: Vec<u32> = ws
        .iter()
        .map(|w| vocab.iter().position(|v| v == w).unwrap_or(0) as u32)
        .collect();
    ids.resize(max_tokens, 0);
    Ok(ids)
}

/// Parses "a C S P [and a C S P]... on a C [striped|gradient] background" into a scene.
pub fn parse(prompt: &str) -> Result<Scene, PromptError> {
    let ws = words(prompt);
    let g = |s: &str| PromptError::Grammar(s.to_string());
    let (background, texture, on) = split_textured_background(&ws)?;
    let mut objects = Vec::new();
    for part in ws[..on].split(|w| w == "and") {
        if part.len() < 4 || part[0] != "a" {
            return Err(g("each object reads \"a <colour> <shape> <position>\""));
        }
        let c = colour(&part[1]).ok_or_else(|| g("an object needs a colour"))?;
        let s = SHAPES
            .iter()
            .position(|s| *s == part[2])
            .ok_or_else(|| g("an object needs a shape"))?;
        let phrase = part[3..].join(" ");
        let p = POSITIONS
            .iter()
            .position(|p| p.0 == phrase)
            .ok_or_else(|| g("unknown position"))?;
        if objects.iter().any(|o: &Object| o.position == p) {
            return Err(g("two objects in the same place"));
        }
        objects.push(Object {
            colour: c,
            shape: s,
            position: p,
        });
    }
    if objects.is_empty() {
        return Err(g("the prompt names no object"));
    }
    Ok(Scene {
        background,
        texture,
        objects,
    })
}

/// The background colour and texture of words ending "on a <colour> [striped|gradient]
/// background", and where that tail starts.
fn split_textured_background(ws: &[String]) -> Result<(usize, usize, usize), PromptError> {
    let at = ws.len().saturating_sub(2);
    match ws
        .get(at)
        .and_then(|w| TEXTURES[1..].iter().position(|t| t == w))
    {
        Some(t) => {
            let mut flat = ws.to_vec();
            flat.remove(at);
            let (background, on) = split_background(&flat).map_err(|_| {
                PromptError::Grammar(
                    "the prompt must end with \"on a <colour> [striped|gradient] background\""
                        .into(),
                )
            })?;
            Ok((background, t + 1, on))
        }
        None => split_background(ws).map(|(b, on)| (b, 0, on)),
    }
}

/// The background colour of words ending "on a <colour> background", and where that tail
/// starts.
pub(crate) fn split_background(ws: &[String]) -> Result<(usize, usize), PromptError> {
    let g = |s: &str| PromptError::Grammar(s.to_string());
    let on = ws
        .iter()
        .rposition(|w| w == "on")
        .ok_or_else(|| g("no \"on a <colour> background\" at the end"))?;
    let tail = &ws[on..];
    if tail.len() != 4 || tail[1] != "a" || tail[3] != "background" {
        return Err(g("the prompt must end with \"on a <colour> background\""));
    }
    let background = colour(&tail[2]).ok_or_else(|| g("the background must be a colour"))?;
    Ok((background, on))
}

/// Whether a word should drive the saliency map: a content word that names an object
/// (colour, shape, position), not a function word and not "background" (the context region).
pub fn is_salient(word: &str) -> bool {
    !flashdiff_partitioner::is_function_word(word) && word != "background"
}

/// The 32x32 mask of shape `shape` (index into [`SHAPES`]) centred at `(cx, cy)` with radius
/// `r`, in pixels: what the renderer fills and the checkers match templates against.
pub fn shape_mask(shape: usize, cx: f32, cy: f32, r: f32) -> Vec<bool> {
    shape_mask_on(IMAGE, shape, cx, cy, r)
}

/// [`shape_mask`] on a canvas of `side` x `side` pixels.
pub fn shape_mask_on(side: usize, shape: usize, cx: f32, cy: f32, r: f32) -> Vec<bool> {
    let mut m = vec![false; side * side];
    for y in 0..side {
        for x in 0..side {
            let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
            let (dx, dy) = (px - cx, py - cy);
            m[y * side + x] = match shape {
                0 => dx * dx + dy * dy <= r * r,
                1 => dx.abs() <= 0.85 * r && dy.abs() <= 0.85 * r,
                2 => {
                    let top = cy - r;
                    py >= top && py <= cy + 0.8 * r && dx.abs() <= r * (py - top) / (1.8 * r)
                }
                _ => {
                    let arm = 0.35 * r;
                    (dx.abs() <= arm && dy.abs() <= r) || (dy.abs() <= arm && dx.abs() <= r)
                }
            };
        }
    }
    m
}

/// The prompt that describes a scene, in the training data's words.
pub fn prompt_text(scene: &Scene) -> String {
    let objects: Vec<String> = scene
        .objects
        .iter()
        .map(|o| {
            format!(
                "a {} {} {}",
                COLOURS[o.colour].0, SHAPES[o.shape], POSITIONS[o.position].0
            )
        })
        .collect();
    let texture = match scene.texture {
        0 => String::new(),
        t => format!("{} ", TEXTURES[t]),
    };
    format!(
        "{} on a {} {texture}background",
        objects.join(" and "),
        COLOURS[scene.background].0
    )
}

/// A texture's second tone of colour `c` (index into [`COLOURS`]).
pub fn shade(c: usize) -> [f32; 3] {
    COLOURS[c].1.map(|v| v + SHADE * (0.5 - v))
}

/// The background of a scene alone, `side x side x 3` RGB in [0, 1], row-major: flat in its
/// colour, or striped (vertical bands of the colour and its [`shade`]) or a gradient (the
/// colour at the top to its shade at the bottom).
pub fn background(scene: &Scene, side: usize) -> Vec<f32> {
    let (c, s) = (COLOURS[scene.background].1, shade(scene.background));
    let at = |i: usize| (i as f32 + 0.5) / side as f32;
    let mut img = Vec::with_capacity(side * side * 3);
    for y in 0..side {
        for x in 0..side {
            let w = match scene.texture {
                0 => 0.0,
                1 => ((at(x) * 2.0 * STRIPES as f32).floor() as usize % 2) as f32,
                _ => at(y),
            };
            img.extend((0..3).map(|k| c[k] * (1.0 - w) + s[k] * w));
        }
    }
    img
}

/// The samplers' random numbers (SplitMix64): the same seed gives the same prompts.
pub(crate) struct Draw(u64);

impl Draw {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed ^ 0xA076_1D64_78BD_642F)
    }

    /// A number in `0..n` (`n >= 1`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// A random scene like the 32x32 models' training data (1-2 objects on a flat background,
/// colours unlike the background, distinct cells), from a seed: held-out prompts.
pub fn sample(seed: u64) -> Scene {
    sample_with(seed, 2, false)
}

/// A random scene of the language a model of `side` pixels was trained on: [`sample`] at
/// 32, else 1-4 objects on a flat, striped or gradient background (`scenes.py`).
pub fn sample_sized(side: usize, seed: u64) -> Scene {
    sample_with(
        seed,
        if side == IMAGE { 2 } else { MAX_OBJECTS },
        side != IMAGE,
    )
}

fn sample_with(seed: u64, most: usize, textured: bool) -> Scene {
    let mut draw = Draw::new(seed);
    let mut next = |n: usize| draw.below(n);
    let background = next(COLOURS.len());
    let texture = if textured { next(TEXTURES.len()) } else { 0 };
    let count = 1 + next(most);
    let mut objects: Vec<Object> = Vec::new();
    while objects.len() < count {
        let position = next(POSITIONS.len());
        if objects.iter().any(|o| o.position == position) {
            continue;
        }
        let mut colour = next(COLOURS.len());
        while colour == background {
            colour = next(COLOURS.len());
        }
        objects.push(Object {
            colour,
            shape: next(SHAPES.len()),
            position,
        });
    }
    Scene {
        background,
        texture,
        objects,
    }
}

/// Renders a scene with shapes at their cell centres (radius 4.1 px): a reference image for
/// tests of the checker.
pub fn render(scene: &Scene) -> Vec<f32> {
    render_sized(scene, IMAGE, 4.1 / IMAGE as f32)
}

/// Renders a scene on `side x side` pixels with shapes at their cell centres, of radius
/// `radius` times the side.
pub fn render_sized(scene: &Scene, side: usize, radius: f32) -> Vec<f32> {
    let mut img = background(scene, side);
    let cell = side as f32 / 3.0;
    for o in &scene.objects {
        let (row, col) = POSITIONS[o.position].1;
        let m = shape_mask_on(
            side,
            o.shape,
            (col as f32 + 0.5) * cell,
            (row as f32 + 0.5) * cell,
            radius * side as f32,
        );
        for (i, &inside) in m.iter().enumerate() {
            if inside {
                img[i * 3..i * 3 + 3].copy_from_slice(&COLOURS[o.colour].1);
            }
        }
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_scenes_round_trip_through_their_prompts() {
        for seed in 0..200 {
            let s = sample(seed);
            assert_eq!(parse(&prompt_text(&s)).unwrap(), s, "seed {seed}");
            assert!(s.objects.iter().all(|o| o.colour != s.background));
        }
        assert_ne!(sample(1), sample(2));
    }

    #[test]
    fn larger_scenes_round_trip_and_keep_the_small_language() {
        let (mut textures, mut most) = ([0; 3], 0);
        for seed in 0..300 {
            let s = sample_sized(64, seed);
            assert_eq!(parse(&prompt_text(&s)).unwrap(), s, "seed {seed}");
            textures[s.texture] += 1;
            most = most.max(s.objects.len());
            assert!(words(&prompt_text(&s)).len() <= 28);
        }
        assert!(
            textures.iter().all(|&n| n > 50) && most == MAX_OBJECTS,
            "{textures:?}"
        );
        // The 32x32 models' prompts are unchanged: flat, at most two objects, same draws.
        for seed in 0..50 {
            assert_eq!(sample_sized(IMAGE, seed), sample(seed));
            assert_eq!(sample(seed).texture, 0);
            assert!(!prompt_text(&sample(seed)).contains("striped"));
        }
        let s = parse("a red circle top on a blue striped background").unwrap();
        assert_eq!((s.background, TEXTURES[s.texture]), (2, "striped"));
        let s = parse("a red circle top on a blue gradient background").unwrap();
        assert_eq!(TEXTURES[s.texture], "gradient");
        for bad in [
            "a red circle top on a striped background",
            "a red circle top on a blue flat background",
            "a red circle top on a blue striped gradient background",
        ] {
            assert!(matches!(parse(bad), Err(PromptError::Grammar(_))), "{bad}");
        }
        // A striped background's two tones, and a gradient's ends, as scenes.py draws them.
        let s = parse("a red circle top on a blue striped background").unwrap();
        let bg = background(&s, 64);
        assert_eq!(&bg[0..3], &COLOURS[2].1);
        assert_eq!(&bg[4 * 3..4 * 3 + 3], &shade(2));
        let s = parse("a red circle top on a white gradient background").unwrap();
        let bg = background(&s, 64);
        assert!(bg[0] > bg[63 * 64 * 3] + 0.1);
    }

    #[test]
    fn bad_prompts_say_what_is_wrong() {
        let vocab: Vec<String> = ["<pad>", "a", "red", "circle"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let e = tokenize("a red dragon", &vocab, 16)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"dragon\"") && e.contains("a red circle"),
            "{e}"
        );
        assert!(matches!(
            tokenize("a a a a", &vocab, 3),
            Err(PromptError::TooLong { words: 4, max: 3 })
        ));
        assert_eq!(tokenize("a red", &vocab, 4).unwrap(), vec![1, 2, 0, 0]);
        for bad in [
            "a red circle",
            "on a red background",
            "a red circle middle on a white background",
            "a red circle top and a blue cross top on a white background",
        ] {
            assert!(matches!(parse(bad), Err(PromptError::Grammar(_))), "{bad}");
        }
        assert!(
            !is_salient("a")
                && !is_salient("background")
                && is_salient("red")
                && is_salient("left")
        );
    }
}
