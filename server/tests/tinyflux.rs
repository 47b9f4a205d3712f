//! The TinyFLUX family run by FlashDiff's FLUX code (full computation, nothing skipped)
//! against the same models run by diffusers' unmodified `FluxTransformer2DModel` and the
//! training code's Euler sampler: each model folder's `golden.safetensors`, written by
//! `models/tinyflux/golden.py` from the shipped weights, holds for each prompt the engine's
//! noise for its seed and diffusers' image from it.

use flashdiff_eval::metrics::psnr;
use flashdiff_runtime::engine::{noise, Engine, Mode, RequestConfig};
use flashdiff_runtime::models::io::weights::Weights;
use flashdiff_runtime::models::pipelines::registry::{ModelSpec, TINYFLUX_FAMILY};
use flashdiff_runtime::models::Device;

fn golden(model: &str) -> Weights {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../models/{model}/golden.safetensors"));
    Weights::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn meta(g: &Weights, key: &str) -> serde_json::Value {
    serde_json::from_str(g.meta(key).unwrap()).unwrap()
}

#[test]
fn every_tinyflux_gives_diffusers_image_from_the_same_noise() {
    for model in TINYFLUX_FAMILY {
        matches_diffusers(model);
    }
}

fn matches_diffusers(model: &str) {
    let g = golden(model);
    let prompts: Vec<String> = serde_json::from_value(meta(&g, "prompts")).unwrap();
    let seeds: Vec<u64> = serde_json::from_value(meta(&g, "seeds")).unwrap();
    let steps: u32 = serde_json::from_value(meta(&g, "steps")).unwrap();
    assert!(!prompts.is_empty() && prompts.len() == seeds.len());
    let spec = ModelSpec::builtin(model).expect("built in");
    let mut engine = Engine::builder(&spec)
        .workers(1)
        .device(&Device::Cpu)
        .build()
        .unwrap();
    for (i, (prompt, &seed)) in prompts.iter().zip(&seeds).enumerate() {
        let (_, want_noise) = g.get_any(&format!("noise.{i}")).unwrap();
        let ours = noise(seed, want_noise.len());
        let worst = ours
            .iter()
            .zip(want_noise)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-6,
            "{model} prompt {i}: the golden's noise is not the engine's ({worst})"
        );
        let cfg = RequestConfig {
            steps,
            seed,
            mode: Mode::Full,
            ..Default::default()
        };
        let out = engine.generate(prompt, cfg, &mut |_| {}).unwrap();
        assert_eq!(
            out.report.computed, out.report.patch_steps,
            "full mode skipped"
        );
        let (shape, want) = g.get_any(&format!("image.{i}")).unwrap();
        assert_eq!(
            shape,
            [out.sample.height, out.sample.width, 3],
            "{model} prompt {i}: image size"
        );
        let db = psnr(&out.sample.rgb, want);
        assert!(
            db >= 60.0,
            "{model} prompt {i} {prompt:?}: PSNR {db:.2} dB against diffusers"
        );
        eprintln!("{model} prompt {i}: {db:.2} dB against diffusers");
    }
}

#[test]
fn work_counts_the_text_stream_of_every_computed_step() {
    let spec = ModelSpec::builtin("tinyflux").expect("tinyflux is built in");
    let mut engine = Engine::builder(&spec)
        .workers(1)
        .device(&Device::Cpu)
        .build()
        .unwrap();
    let text = engine.model().fixed_rows() as f64;
    assert_eq!(text, 16.0, "TinyFLUX's prompts are 16 text tokens");
    let cfg = RequestConfig {
        steps: 20,
        warmup: 4,
        patches: Some(8),
        epsilon: 0.3,
        seed: 5,
        mode: Mode::PerPatch,
        ..Default::default()
    };
    let o = engine
        .generate(
            "a red circle top left on a blue background",
            cfg,
            &mut |_| {},
        )
        .unwrap();
    let r = &o.report;
    let tokens = engine.model().dims().grid.tokens() as f64;
    let stepped = r.active_per_step.iter().filter(|&&a| a > 0).count() as f64;
    assert!(
        r.computed < r.patch_steps && stepped > 0.0,
        "per-patch skipped nothing or everything: {:?}",
        r.active_per_step
    );
    let done = 4.0 * (tokens + text) + r.computed_tokens as f64 + stepped * text;
    let want = 1.0 - done / (20.0 * (tokens + text));
    assert!(
        (r.work_skipped - want).abs() < 1e-12,
        "{} vs {want}",
        r.work_skipped
    );
    let latent_only = 1.0 - (4.0 * tokens + r.computed_tokens as f64) / (20.0 * tokens);
    assert!(
        r.work_skipped != latent_only,
        "the text stream was not counted"
    );
}
