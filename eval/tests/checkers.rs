//! The Rust checkers (image, video, sound) agree with the Python ones (the evaluations' ground truth) on every
//! sample of `models/checkers/golden.safetensors` (`models/checkers/golden.py`): training
//! renders with the data's jitter, half of them drawn from a changed scene.

use std::collections::HashMap;
use std::path::PathBuf;

use flashdiff_eval::{image, sound, video};
use flashdiff_models::families::tinydit::{clips, scene, sounds};
use flashdiff_models::io::weights::Weights;

fn golden() -> Weights {
    golden_file("golden.safetensors")
}

fn golden_file(name: &str) -> Weights {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/checkers")
        .join(name);
    Weights::open(&p).unwrap()
}

fn meta<T: serde::de::DeserializeOwned>(w: &Weights, key: &str) -> T {
    serde_json::from_str(w.meta(key).unwrap()).unwrap()
}

/// A verdict's named parts.
type Parts = Vec<(&'static str, bool)>;

/// Every sample of `key` (`n` values each) checked by `check` (the verdict's named parts)
/// against the Python verdicts; both verdicts must occur.
fn agrees(key: &str, n: usize, check: &dyn Fn(&str, &[f32]) -> Parts) {
    agrees_in(&golden(), key, n, check)
}

/// [`agrees`] over the samples of another golden file.
fn agrees_in(w: &Weights, key: &str, n: usize, check: &dyn Fn(&str, &[f32]) -> Parts) {
    let prompts: Vec<String> = meta(w, &format!("{key}_prompts"));
    let want: Vec<HashMap<String, bool>> = meta(w, &format!("{key}_verdicts"));
    let (shape, data) = w.get_any(key).unwrap();
    assert_eq!(shape.iter().skip(1).product::<usize>(), n);
    let mut wrong = 0;
    for (i, p) in prompts.iter().enumerate() {
        let got = check(p, &data[i * n..(i + 1) * n]);
        for (k, g) in &got {
            assert_eq!(*g, want[i][*k], "sample {i} {p:?}: {k}");
        }
        wrong += usize::from(!got.iter().any(|(k, g)| *k == "all" && *g));
    }
    assert!(
        wrong > 0 && wrong < prompts.len(),
        "both verdicts must occur"
    );
}

#[test]
fn the_image_checker_agrees_with_shapes_py() {
    agrees("image", 32 * 32 * 3, &|p, img| {
        let v = image::check(img, &scene::parse(p).unwrap());
        vec![
            ("background", v.background),
            ("present", v.present),
            ("shape", v.shape),
            ("all", v.all()),
        ]
    });
}

#[test]
fn the_larger_scenes_checker_agrees_with_scenes_py() {
    let w = golden_file("scenes_golden.safetensors");
    for side in [64, 128] {
        agrees_in(&w, &format!("image{side}"), side * side * 3, &|p, img| {
            let v = image::check(img, &scene::parse(p).unwrap());
            vec![
                ("background", v.background),
                ("present", v.present),
                ("shape", v.shape),
                ("all", v.all()),
            ]
        });
    }
}

#[test]
fn the_video_checker_agrees_with_clips_py() {
    agrees("video", 8 * 32 * 32 * 3, &|p, clip| {
        let v = video::check(clip, &clips::parse(p).unwrap());
        vec![
            ("background", v.background),
            ("present", v.present),
            ("place", v.place),
            ("shape", v.shape),
            ("motion", v.motion),
            ("all", v.all()),
        ]
    });
}

#[test]
fn the_sound_checker_agrees_with_sounds_py() {
    agrees("audio", sounds::FRAMES * sounds::HOP, &|p, wave| {
        let v = sound::check(wave, &sounds::parse(p).unwrap());
        vec![
            ("count", v.count),
            ("kinds", v.kinds),
            ("pitches", v.pitches),
            ("all", v.all()),
        ]
    });
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// The checkers and prompt parsers take anything (a model can output NaN or infinity; a
    /// prompt is any text) and answer without panicking: a valid beep with one sample
    /// replaced, a clip with one value replaced, any sequence of the languages' words.
    #[test]
    fn checkers_and_parsers_take_any_input(
        words in proptest::collection::vec(
            proptest::sample::select(vec![
                "a", "then", "high", "low", "beep", "hum", "red", "circle", "top", "left",
                "moving", "right", "still", "and", "on", "blue", "background", "x", "",
            ]),
            0..14,
        ),
        value in proptest::prelude::any::<f32>(),
        at in 0usize..16384,
    ) {
        let prompt = words.join(" ");
        let _ = clips::parse(&prompt);
        let _ = sounds::parse(&prompt);
        let e = sounds::parse("a high beep").unwrap();
        let mut wave = sounds::render(&[(e[0], 10, 30)]);
        wave[at] = value;
        let _ = sound::check(&wave, &e);
        let c = clips::parse("a red circle top left still on a blue background").unwrap();
        let mut clip = clips::render(&c);
        clip[at] = value;
        let _ = video::check(&clip, &c);
    }
}
