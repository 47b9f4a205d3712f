//! The built-in audio model's decoder against the Python reference's.

use std::path::PathBuf;

use flashdiff_models::io::weights::Weights;

/// The audio model decodes as `sounds.decode` does (additive synthesis with the constants
/// the weights file ships), and its grid is one row of 64 time frames.
#[test]
fn the_sound_decoder_matches_sounds_py() {
    use flashdiff_models::{families::tinydit::TinyDit, Denoiser, Kind};
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
