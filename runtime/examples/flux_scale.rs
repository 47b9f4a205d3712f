//! FLUX at 4096 image tokens through the engine: where the time of a request goes, and the
//! control plane's share of it. Random weights of FLUX.1's structure and head
//! width at width 768 (one double and two single blocks; the full model does not fit in
//! this machine's memory in f32), 512 text tokens from a stand-in encoder, a 64 x 64 token
//! grid (a 1024 x 1024 image), 6 steps of which 2 warm-up, R = 16.
//!
//!     cargo run --release -p flashdiff-runtime --example flux_scale

use std::sync::Arc;

use flashdiff_runtime::engine::{Engine, RequestConfig};
use flashdiff_runtime::models::families::flux::{
    EncodedPrompt, Flux, FluxConfig, FluxDenoiser, PromptEncoder,
};
use flashdiff_runtime::models::io::shards::var_builder_from;
use flashdiff_runtime::models::{Denoiser, Device, ModelError, Tensor};

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Pieces "▁word" padded with `<pad>`; states and pooled vector from the word positions.
#[derive(Debug)]
struct StandIn;

impl PromptEncoder for StandIn {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let mut pieces: Vec<String> = prompt.split_whitespace().map(|w| format!("▁{w}")).collect();
        pieces.resize(self.tokens(), "<pad>".into());
        Ok(EncodedPrompt {
            pieces,
            states: Tensor::from_vec(values(512 * 4096, 3, 1.0), (512, 4096), &Device::Cpu)?,
            pooled: Tensor::from_vec(values(768, 4, 1.0), 768, &Device::Cpu)?,
        })
    }

    fn tokens(&self) -> usize {
        512
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = FluxConfig {
        hidden: 768,
        heads: 6,
        depth: 1,
        depth_single: 2,
        ..FluxConfig::dev()
    };
    let counter = std::sync::atomic::AtomicU64::new(0);
    let get = |_: &str, shape: &[usize]| -> Result<Tensor, ModelError> {
        let id = 1 + counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n: usize = shape.iter().product();
        let scale = if shape.len() == 2 {
            (shape[1] as f32).sqrt().recip()
        } else {
            0.1
        };
        Ok(Tensor::from_vec(values(n, id, scale), shape, &Device::Cpu)?)
    };
    let flux = Flux::load(cfg, &var_builder_from(get, &Device::Cpu))?;
    let model: Arc<dyn Denoiser> = Arc::new(FluxDenoiser::new(
        flux,
        Box::new(StandIn),
        (64, 64),
        3.5,
        Device::Cpu,
    )?);
    let mut engine = Engine::builder_with(model).workers(1).build()?;
    let req = RequestConfig {
        steps: 6,
        warmup: 2,
        patches: Some(16),
        seed: 1,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let out = engine.generate(
        "a red fox in the snow next to a blue door",
        req,
        &mut |_| {},
    )?;
    let r = &out.report;
    let t = r.time;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let control = t.partition + t.gate + t.schedule;
    println!(
        "4096 image tokens, 6 steps (2 warm-up), R = {}: {:.1} s wall",
        r.patches,
        t0.elapsed().as_secs_f64()
    );
    println!(
        "time {:.0} ms: prompt+decode {:.1}, warm-up {:.0}, partition {:.2}, gate {:.2}, scheduler {:.2}, compute {:.0}, queue {:.1}",
        ms(r.latency), ms(t.io), ms(t.warmup), ms(t.partition), ms(t.gate), ms(t.schedule), ms(t.compute), ms(t.queue)
    );
    println!(
        "control plane (partition + gate + scheduler): {:.2} ms = {:.3}% of model time (target <= 0.5%)",
        ms(control),
        100.0 * control.as_secs_f64() / (t.warmup + t.compute).as_secs_f64().max(1e-9)
    );
    println!(
        "patch-steps computed {} of {}; work skipped {:.1}%",
        r.computed,
        r.patch_steps,
        100.0 * r.work_skipped
    );
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        if let Some(l) = s.lines().find(|l| l.starts_with("VmHWM")) {
            println!(
                "peak resident memory: {}",
                l.trim_start_matches("VmHWM:").trim()
            );
        }
    }
    Ok(())
}
