//! The Rust checkers agree with the Python ones (the evaluations' ground truth) on every
//! sample of `models/checkers/golden.safetensors` (`models/checkers/golden.py`): training
//! renders with the data's jitter, half of them drawn from a changed scene.

use std::collections::HashMap;
use std::path::PathBuf;

use flashdiff_models::{clips, sounds, Weights};

fn golden() -> Weights {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("checkers/golden.safetensors");
    Weights::open(&p).unwrap()
}

fn meta<T: serde::de::DeserializeOwned>(w: &Weights, key: &str) -> T {
    serde_json::from_str(w.meta(key).unwrap()).unwrap()
}

#[test]
fn the_video_checker_agrees_with_clips_py() {
    let w = golden();
    let prompts: Vec<String> = meta(&w, "video_prompts");
    let want: Vec<HashMap<String, bool>> = meta(&w, "video_verdicts");
    let (shape, data) = w.get_any("video").unwrap();
    assert_eq!(&shape[1..], [8, 32, 32, 3]);
    let n = 8 * 32 * 32 * 3;
    let mut wrong = 0;
    for (i, p) in prompts.iter().enumerate() {
        let clip = clips::parse(p).unwrap();
        let v = clips::check(&data[i * n..(i + 1) * n], &clip);
        let got = [
            ("background", v.background),
            ("present", v.present),
            ("place", v.place),
            ("shape", v.shape),
            ("motion", v.motion),
            ("all", v.all()),
        ];
        for (k, g) in got {
            assert_eq!(g, want[i][k], "sample {i} {p:?}: {k}");
        }
        wrong += usize::from(!v.all());
    }
    assert!(
        wrong > 0 && wrong < prompts.len(),
        "both verdicts must occur"
    );
}

#[test]
fn the_sound_checker_agrees_with_sounds_py() {
    let w = golden();
    let prompts: Vec<String> = meta(&w, "audio_prompts");
    let want: Vec<HashMap<String, bool>> = meta(&w, "audio_verdicts");
    let (shape, data) = w.get_any("audio").unwrap();
    let n = sounds::FRAMES * sounds::HOP;
    assert_eq!(&shape[1..], [n]);
    let mut wrong = 0;
    for (i, p) in prompts.iter().enumerate() {
        let events = sounds::parse(p).unwrap();
        let v = sounds::check(&data[i * n..(i + 1) * n], &events);
        let got = [
            ("count", v.count),
            ("kinds", v.kinds),
            ("pitches", v.pitches),
            ("all", v.all()),
        ];
        for (k, g) in got {
            assert_eq!(g, want[i][k], "sample {i} {p:?}: {k}");
        }
        wrong += usize::from(!v.all());
    }
    assert!(
        wrong > 0 && wrong < prompts.len(),
        "both verdicts must occur"
    );
}

/// The audio model decodes as `sounds.decode` does (additive synthesis with the constants
/// the weights file ships), and its grid is one row of 64 time frames.
#[test]
fn the_sound_decoder_matches_sounds_py() {
    use flashdiff_models::{Denoiser, Kind, TinyDit};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let m = TinyDit::load(
        &root.join("tinyaudio/tinyaudio.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(m.kind(), Kind::Audio);
    let g = m.dims().grid;
    assert_eq!(
        (g.frames, g.height, g.width, m.dims().channels),
        (1, 1, 64, 32)
    );
    let golden = Weights::open(&root.join("checkers/decode_golden.safetensors")).unwrap();
    let latent = golden.get("latent", &[64, 32]).unwrap();
    let want = golden.get("wave", &[64 * 256]).unwrap();
    let s = m.decode(latent).unwrap();
    assert_eq!((s.sample_rate, s.frames, s.rgb.len()), (8000, 0, 0));
    assert_eq!(s.audio.len(), want.len());
    let worst = s
        .audio
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "largest sample difference {worst}");
    // The silent start stays silent.
    assert!(s.audio[..9 * 256].iter().all(|&v| v == 0.0));
}
