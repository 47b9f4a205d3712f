//! The built-in model's language: vocabulary, prompt parsing into a scene (background and
//! objects), tokenisation, and the ground-truth checker that reads an image and says whether
//! it shows the scene. Mirrors `models/tinydit/shapes.py`; keep the two in step.

use std::fmt;

/// Image side in pixels.
pub const IMAGE: usize = 32;
const CELL: f32 = IMAGE as f32 / 3.0;

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

/// Parses "a C S P [and a C S P]... on a C background" into a scene.
pub fn parse(prompt: &str) -> Result<Scene, PromptError> {
    let ws = words(prompt);
    let g = |s: &str| PromptError::Grammar(s.to_string());
    let (background, on) = split_background(&ws)?;
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
        objects,
    })
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

pub(crate) fn shape_mask(shape: usize, cx: f32, cy: f32, r: f32) -> Vec<bool> {
    let mut m = vec![false; IMAGE * IMAGE];
    for y in 0..IMAGE {
        for x in 0..IMAGE {
            let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
            let (dx, dy) = (px - cx, py - cy);
            m[y * IMAGE + x] = match shape {
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

/// Best-matching shape (index into [`SHAPES`], among `shapes`) of a 32x32 mask: template IoU
/// at each of `radii` around the mask's centroid; `None` under `min_pixels` pixels.
pub(crate) fn classify_among(
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
pub(crate) fn colour_labels(rgb: &[f32]) -> Vec<usize> {
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
    format!(
        "{} on a {} background",
        objects.join(" and "),
        COLOURS[scene.background].0
    )
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

/// A random scene like the training data's (1-2 objects, colours unlike the background,
/// distinct cells), from a seed: held-out prompts for evaluation.
pub fn sample(seed: u64) -> Scene {
    let mut draw = Draw::new(seed);
    let mut next = |n: usize| draw.below(n);
    let background = next(COLOURS.len());
    let count = 1 + next(2);
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
        objects,
    }
}

/// Renders a scene with shapes at their cell centres (radius 4.1 px): a reference image for
/// tests of the checker.
pub fn render(scene: &Scene) -> Vec<f32> {
    let mut img: Vec<f32> = (0..IMAGE * IMAGE)
        .flat_map(|_| COLOURS[scene.background].1)
        .collect();
    for o in &scene.objects {
        let (row, col) = POSITIONS[o.position].1;
        let m = shape_mask(
            o.shape,
            (col as f32 + 0.5) * CELL,
            (row as f32 + 0.5) * CELL,
            4.1,
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
    fn parses_and_checks_rendered_scenes() {
        let p = "A red circle top left and a blue square bottom right on a white background.";
        let s = parse(p).unwrap();
        assert_eq!(s.objects.len(), 2);
        assert_eq!(COLOURS[s.background].0, "white");
        let img = render(&s);
        assert!(check(&img, &s).all());
        // The same image against a different scene fails.
        let other =
            parse("a red triangle top left and a blue square bottom right on a white background")
                .unwrap();
        let v = check(&img, &other);
        assert!(v.background && v.present && !v.shape);
        let wrong_bg =
            parse("a red circle top left and a blue square bottom right on a black background")
                .unwrap();
        assert!(!check(&img, &wrong_bg).background);
        for shape in 0..4 {
            let s = Scene {
                background: 7,
                objects: vec![Object {
                    colour: 3,
                    shape,
                    position: 4,
                }],
            };
            assert!(check(&render(&s), &s).all(), "shape {}", SHAPES[shape]);
        }
    }

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
