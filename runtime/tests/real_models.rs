//! FLUX, SD3.5 and Wan2.1 (random weights of small configs with their structure: the
//! diffusers golden files) through the whole engine as `Denoiser`s: saliency partition, gate,
//! subset forwards over cached K/V, workers (the text encoders here are a test stand-in, and
//! the output is the latent preview, not a VAE image).

use std::path::PathBuf;
use std::sync::Arc;

use flashdiff_runtime::engine::{Engine, Mode, RequestConfig};
use flashdiff_runtime::models::families::flux::{
    EncodedPrompt, FluxCheckpoint, FluxDenoiser, PromptEncoder,
};
use flashdiff_runtime::models::io::shards::var_builder_from;
use flashdiff_runtime::models::{Denoiser, Device, ModelError, Tensor};

/// SentencePiece-like pieces ("▁word"), padded with `<pad>`; each piece's state and the
/// pooled vector are fixed pseudo-random functions of the text.
#[derive(Debug)]
struct HashText;

fn hash(s: &str, i: usize) -> f32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ i as u64;
    for b in s.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

impl PromptEncoder for HashText {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let mut pieces: Vec<String> = prompt.split_whitespace().map(|w| format!("▁{w}")).collect();
        if pieces.len() > self.tokens() {
            return Err(ModelError::Input("prompt too long".into()));
        }
        pieces.resize(self.tokens(), "<pad>".into());
        let states: Vec<f32> = pieces
            .iter()
            .flat_map(|p| (0..16).map(move |i| hash(p, i)))
            .collect();
        let pooled: Vec<f32> = (0..12).map(|i| hash(prompt, 100 + i)).collect();
        Ok(EncodedPrompt {
            states: Tensor::from_vec(states, (self.tokens(), 16), &Device::Cpu)?,
            pooled: Tensor::from_vec(pooled, 12, &Device::Cpu)?,
            pieces,
        })
    }

    fn tokens(&self) -> usize {
        10
    }
}

fn model() -> Arc<dyn Denoiser> {
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/reference/flux_golden.safetensors");
    let flux = FluxCheckpoint::open(&golden)
        .unwrap()
        .load(Some([4, 6, 6]), &Device::Cpu)
        .unwrap();
    Arc::new(FluxDenoiser::new(flux, Box::new(HashText), (6, 8), 3.5, Device::Cpu).unwrap())
}

/// Settings of the runs. Random weights move block 0's input by more than any change budget
/// each step, so the token-subset forwards are exercised through the paper's gate
/// (`Mode::PatchGate`), which skips on importance alone.
fn cfg(mode: Mode) -> RequestConfig {
    RequestConfig {
        steps: 12,
        warmup: 3,
        patches: Some(4),
        epsilon: 0.3,
        max_skip: 2,
        seed: 5,
        mode,
        monotasks: Some(2),
        ..Default::default()
    }
}

const PROMPT: &str = "a red dishwasher on the left of a blue table";

#[test]
fn flux_runs_through_the_engine_skips_and_is_deterministic() {
    let m = model();
    let c = m.condition(PROMPT).unwrap();
    assert_eq!(c.words.len(), 10);
    assert_eq!(c.salient.iter().filter(|&&s| s).count(), 5, "{:?}", c.words);
    let mut one = Engine::builder_with(m.clone()).workers(1).build().unwrap();
    let fd = one
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert!(
        fd.report.computed < fd.report.patch_steps,
        "FlashDiff skipped nothing on FLUX"
    );
    assert!(fd.report.work_skipped > 0.0);
    assert_eq!(
        (fd.sample.width, fd.sample.height),
        (16, 12),
        "latent preview: 2 px per token side"
    );
    let again = one
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert_eq!(again.latent, fd.latent, "same request, same latent");
    let mut two = Engine::builder_with(m.clone()).workers(2).build().unwrap();
    let w2 = two
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert_eq!(w2.latent, fd.latent, "two workers change nothing");
    // With no skipping and one forward per step, the patch-steps are full computation (the
    // subset forward over every token equals the full forward); with two forwards per step
    // each sees the other's tokens through last step's K/V, and the latent moves.
    let full = no_skip_is_full_computation(&mut one, cfg);
    let displaced = one
        .generate(PROMPT, cfg(Mode::NoSkip), &mut |_| {})
        .unwrap();
    assert_ne!(
        displaced.latent, full.latent,
        "two forwards a step displaced nothing"
    );
    assert!(fd.latent.iter().zip(&full.latent).any(|(a, b)| a != b));
}

#[test]
fn flux_denoiser_refuses_bad_inputs_with_reasons() {
    let m = model();
    let e = m.condition("").unwrap_err().to_string();
    assert!(e.contains("has no words"), "{e}");
    let e = m.condition(&"word ".repeat(11)).unwrap_err().to_string();
    assert!(e.contains("too long"), "{e}");
    let short = Tensor::zeros(7, flashdiff_runtime::models::DType::F32, &Device::Cpu).unwrap();
    let e = m.step_cond(&short, 0.5).unwrap_err().to_string();
    assert!(e.contains("context of 7 values"), "{e}");
    let e = m.decode(&[0.0; 5]).unwrap_err().to_string();
    assert!(e.contains("latent of 5 values"), "{e}");
    let flux = FluxCheckpoint::open(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/reference/flux_golden.safetensors"),
    )
    .unwrap()
    .load(Some([4, 6, 6]), &Device::Cpu)
    .unwrap();
    let e = FluxDenoiser::new(flux, Box::new(HashText), (0, 8), 3.5, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("non-empty token grid"), "{e}");
}

/// SD3.5 (diffusers' golden weights: RMS Q/K norms, a dual-attention block) through the
/// engine the same way.
#[test]
fn sd35_runs_through_the_engine_skips_and_is_deterministic() {
    use flashdiff_runtime::models::families::mmdit::{MmditCheckpoint, Sd3Denoiser};
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/reference/sd35_golden.safetensors");
    let mmdit = MmditCheckpoint::open(&golden)
        .unwrap()
        .load(None, &Device::Cpu)
        .unwrap();
    let m: Arc<dyn Denoiser> =
        Arc::new(Sd3Denoiser::new(mmdit, Box::new(HashText), (4, 6), 0.0, Device::Cpu).unwrap());
    assert_eq!(m.name(), "sd3.5");
    assert_eq!(m.dims().kv_layers, 4);
    let mut e = Engine::builder_with(m.clone()).workers(1).build().unwrap();
    let fd = e
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert!(
        fd.report.computed < fd.report.patch_steps,
        "nothing skipped on SD3.5"
    );
    assert_eq!((fd.sample.width, fd.sample.height), (12, 8));
    let again = e
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert_eq!(again.latent, fd.latent);
    let full = no_skip_is_full_computation(&mut e, cfg);
    // Whole-step caching watches the first block's input: it runs too.
    let tc = e
        .generate(PROMPT, cfg(Mode::TeaCache), &mut |_| {})
        .unwrap();
    assert_eq!(tc.latent.len(), full.latent.len());
    // With classifier-free guidance (two passes, two K/V caches side by side): skipping,
    // and with no skipping the subset forwards over both caches equal full computation.
    let mmdit = MmditCheckpoint::open(&golden)
        .unwrap()
        .load(None, &Device::Cpu)
        .unwrap();
    let guided: Arc<dyn Denoiser> = Arc::new(
        Sd3Denoiser::new(mmdit, Box::new(HashText), (4, 6), 0.0, Device::Cpu)
            .unwrap()
            .with_cfg(5.0)
            .unwrap(),
    );
    let mut e = Engine::builder_with(guided).workers(1).build().unwrap();
    let fd = e
        .generate(PROMPT, cfg(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert!(fd.report.computed < fd.report.patch_steps);
    let guided_full = no_skip_is_full_computation(&mut e, cfg);
    assert_ne!(guided_full.latent, full.latent, "guidance changed nothing");
}

/// Wan2.1 (diffusers' golden weights) on a 3-frame video grid through the engine: the
/// partition, gate and subset forwards work on 3-D grids of a real video architecture.
#[test]
fn wan_runs_through_the_engine_on_a_video_grid() {
    use flashdiff_runtime::models::families::wan::{Wan, WanConfig, WanDenoiser};
    use flashdiff_runtime::models::{io::weights::Weights, Kind};
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/reference/wan_golden.safetensors");
    let w = Weights::open(&golden).unwrap();
    let cfg = WanConfig {
        patch: [1, 2, 2],
        in_channels: 4,
        out_channels: 4,
        heads: 2,
        head_dim: 12,
        depth: 2,
        ffn_dim: 64,
        text_dim: 16,
        freq_dim: 32,
        cross_attn_norm: true,
    };
    let wan = Wan::load(
        cfg,
        &var_builder_from(
            |n: &str, s: &[usize]| Ok(w.tensor(n, s, &Device::Cpu)?),
            &Device::Cpu,
        ),
    )
    .unwrap();
    let m: Arc<dyn Denoiser> = Arc::new(
        WanDenoiser::new_video(wan, Box::new(HashText), (3, 2, 3), 0.0, Device::Cpu).unwrap(),
    );
    assert_eq!(m.kind(), Kind::Video);
    let mut e = Engine::builder_with(m.clone()).workers(1).build().unwrap();
    let fd = e
        .generate(PROMPT, cfg_for(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert!(
        fd.report.computed < fd.report.patch_steps,
        "nothing skipped on Wan"
    );
    assert_eq!(
        (fd.sample.frames, fd.sample.width, fd.sample.height),
        (3, 6, 4)
    );
    let again = e
        .generate(PROMPT, cfg_for(Mode::PatchGate), &mut |_| {})
        .unwrap();
    assert_eq!(again.latent, fd.latent);
    no_skip_is_full_computation(&mut e, cfg_for);
}

/// With no skipping and one forward a step, the engine's patch-steps are full computation
/// (the subset forward over every token equals the full forward) to 1e-4 of the latent's
/// scale. Returns full computation's output.
fn no_skip_is_full_computation(
    e: &mut Engine,
    cfg: fn(Mode) -> RequestConfig,
) -> flashdiff_runtime::engine::Output {
    let single = |mode| RequestConfig {
        monotasks: Some(1),
        ..cfg(mode)
    };
    let full = e.generate(PROMPT, single(Mode::Full), &mut |_| {}).unwrap();
    let ns = e
        .generate(PROMPT, single(Mode::NoSkip), &mut |_| {})
        .unwrap();
    let worst = full
        .latent
        .iter()
        .zip(&ns.latent)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let scale = full.latent.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        worst <= 1e-4 * scale.max(1.0),
        "no-skip differs from full by {worst} (scale {scale})"
    );
    full
}

/// 18 tokens: three patches.
fn cfg_for(mode: Mode) -> RequestConfig {
    RequestConfig {
        patches: Some(3),
        ..cfg(mode)
    }
}

/// The engine steps on the model's schedule: FLUX with SD3's shift 3 and full computation
/// equals Euler on the shifted times written out here, and differs from the uniform steps.
#[test]
fn the_engine_steps_on_the_models_schedule() {
    use flashdiff_runtime::models::families::joint::denoiser::Schedule;
    use flashdiff_runtime::models::StepInput;
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/reference/flux_golden.safetensors");
    let load = |s: Schedule| -> Arc<dyn Denoiser> {
        let flux = FluxCheckpoint::open(&golden)
            .unwrap()
            .load(Some([4, 6, 6]), &Device::Cpu)
            .unwrap();
        Arc::new(
            FluxDenoiser::new(flux, Box::new(HashText), (6, 8), 3.5, Device::Cpu)
                .unwrap()
                .with_schedule(s),
        )
    };
    let steps = 8;
    let full = |m: &Arc<dyn Denoiser>| {
        Engine::builder_with(m.clone())
            .workers(1)
            .build()
            .unwrap()
            .generate(
                PROMPT,
                RequestConfig {
                    mode: Mode::Full,
                    steps,
                    seed: 9,
                    ..Default::default()
                },
                &mut |_| {},
            )
            .unwrap()
            .latent
    };
    let shifted = load(Schedule::Shift(3.0));
    let got = full(&shifted);
    let c = shifted.condition(PROMPT).unwrap();
    let ctx = Tensor::from_slice(&c.context, c.context.len(), &Device::Cpu).unwrap();
    let dims = shifted.dims().clone();
    let mut x = flashdiff_runtime::engine::noise(9, dims.grid.tokens() * dims.channels);
    let t = |n: u32| {
        let u = 1.0 - n as f64 / steps as f64;
        (3.0 * u / (1.0 + 2.0 * u)) as f32
    };
    for n in 0..steps {
        let cond = shifted.step_cond(&ctx, t(n)).unwrap();
        let xt = Tensor::from_slice(&x, (dims.grid.tokens(), dims.channels), &Device::Cpu).unwrap();
        let v = shifted
            .full_forward(
                &xt,
                StepInput {
                    context: &ctx,
                    cond: &cond,
                },
                false,
            )
            .unwrap()
            .velocity
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (xi, vi) in x.iter_mut().zip(&v) {
            *xi -= (t(n) - t(n + 1)) * vi;
        }
    }
    let worst = got
        .iter()
        .zip(&x)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 1e-4,
        "the engine's latent differs from shifted Euler by {worst}"
    );
    let uniform = full(&load(Schedule::Uniform));
    let moved = uniform
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 1e-2, "the shift changed nothing ({moved})");
}

/// DBCache runs the first block alone, which the joint-attention models do not offer: the
/// request is refused up front with an error that names the mode and the model, and
/// nothing runs.
#[test]
fn dbcache_on_a_model_without_a_split_forward_is_refused() {
    let mut e = Engine::builder_with(model()).workers(1).build().unwrap();
    let err = e.validate(&cfg(Mode::DbCache)).unwrap_err().to_string();
    assert!(err.contains("dbcache") && err.contains("flux"), "{err}");
    let err = e
        .generate(PROMPT, cfg(Mode::DbCache), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("dbcache"), "{err}");
}
