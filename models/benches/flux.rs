//! FLUX-shaped token-subset forward at 1024 and 4096 image tokens: the cost of
//! 25 / 50 / 75 % active tokens against the full forward, in one run.
//!
//! FLUX.1's structure and head width (128, RoPE 16/56/56, 512 text tokens, cached text
//! K/V), at a width this CPU can time: 768 (6 heads), one double and two single blocks,
//! random weights. Proportional cost is `p x` the full forward's; the target is <= 1.15x.
//! Peak resident memory is printed at the end (`VmHWM`).
//!
//! `FLASHDIFF_BENCH_DEVICE=cuda` (a build with `--features cuda`) runs it on GPU 0 and
//! `FLASHDIFF_BENCH_DTYPE=bf16` multiplies the linear layers in bf16, as
//! `scripts/gpu-run.sh` does; the defaults are cpu and f32.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use flashdiff_models::families::flux::{Flux, FluxConfig, Rows};
use flashdiff_models::io::shards::var_builder_from;
use flashdiff_models::ModelError;

fn config() -> FluxConfig {
    FluxConfig {
        hidden: 768,
        heads: 6,
        depth: 1,
        depth_single: 2,
        ..FluxConfig::dev()
    }
}

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

/// The device and linear-layer dtype the environment asks for (see the file's head).
fn setup() -> (Device, DType, String) {
    let dev = match std::env::var("FLASHDIFF_BENCH_DEVICE").as_deref() {
        Ok("cuda") => match flashdiff_models::device(true) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("FLASHDIFF_BENCH_DEVICE=cuda: {e}");
                std::process::exit(1);
            }
        },
        Ok("cpu") | Err(_) => Device::Cpu,
        Ok(other) => panic!("FLASHDIFF_BENCH_DEVICE={other}: expected cpu or cuda"),
    };
    let dtype = match std::env::var("FLASHDIFF_BENCH_DTYPE").as_deref() {
        Ok("bf16") => DType::BF16,
        Ok("f32") | Err(_) => DType::F32,
        Ok(other) => panic!("FLASHDIFF_BENCH_DTYPE={other}: expected f32 or bf16"),
    };
    let tag = match (dev.is_cpu(), dtype) {
        (true, DType::F32) => String::new(),
        (cpu, d) => format!("_{}_{d:?}", if cpu { "cpu" } else { "cuda" }).to_lowercase(),
    };
    (dev, dtype, tag)
}

fn model(dev: &Device, dtype: DType) -> Flux {
    let counter = std::sync::atomic::AtomicU64::new(0);
    let get = |name: &str, shape: &[usize]| -> Result<Tensor, ModelError> {
        let id = 1 + counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n: usize = shape.iter().product();
        let fan_in = *shape.last().unwrap_or(&1) as f32;
        let scale = if shape.len() == 2 {
            fan_in.sqrt().recip()
        } else {
            0.1
        };
        let t = Tensor::from_vec(values(n, id, scale), shape, dev)?;
        // Linear layers' weights in the compute dtype, as `FluxCheckpoint::load_in` does.
        if shape.len() == 2 && name.ends_with(".weight") {
            Ok(t.to_dtype(dtype)?)
        } else {
            Ok(t)
        }
    };
    let vb = var_builder_from(get, dev);
    Flux::load(config(), &vb).expect("random FLUX-shaped weights")
}

fn subset(c: &mut Criterion) {
    let (dev, dtype, tag) = setup();
    let m = model(&dev, dtype);
    let cfg = m.config().clone();
    let nt = 512;
    let txt = Tensor::from_vec(
        values(nt * cfg.context_in_dim, 7, 1.0),
        (nt, cfg.context_in_dim),
        &dev,
    )
    .unwrap();
    let pooled = Tensor::from_vec(values(cfg.vec_in_dim, 8, 1.0), cfg.vec_in_dim, &dev).unwrap();
    let ctx = m.context(&txt, &pooled).unwrap();
    let cond = m.step_cond(&ctx, 0.5, 3.5).unwrap();
    for tokens in [1024usize, 4096] {
        let width = (tokens as f64).sqrt() as usize;
        let x = Tensor::from_vec(
            values(tokens * cfg.in_channels, 9, 1.0),
            (tokens, cfg.in_channels),
            &dev,
        )
        .unwrap();
        let all: Vec<u32> = (0..tokens as u32).collect();
        let rows = Rows {
            x: &x,
            ids: &all,
            width,
            tokens,
            cache: None,
            patches: None,
            saliency: false,
            text_cache: None,
        };
        let full = m.forward(rows, &ctx, &cond).unwrap();
        let (tk, tv) = full.text_kv.clone().unwrap();
        let mut g = c.benchmark_group(format!("flux_subset_{tokens}{tag}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(if tokens > 2048 { 40 } else { 10 }));
        for pct in [25usize, 50, 75, 100] {
            let n = tokens * pct / 100;
            // Every (100 / pct)-th token: active patches are spread over the image.
            let ids: Vec<u32> = (0..n).map(|i| (i * tokens / n) as u32).collect();
            let at = Tensor::new(ids.as_slice(), &dev).unwrap();
            let xs = x.index_select(&at, 0).unwrap();
            let rows = Rows {
                x: &xs,
                ids: &ids,
                width,
                tokens,
                cache: Some((&full.k, &full.v)),
                patches: None,
                saliency: false,
                text_cache: Some((&tk, &tv)),
            };
            g.bench_with_input(BenchmarkId::from_parameter(pct), &rows, |b, rows| {
                b.iter(|| {
                    let out = black_box(m.forward(*rows, &ctx, &cond).unwrap());
                    dev.synchronize().unwrap();
                    out
                })
            });
        }
        g.finish();
    }
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        if let Some(l) = s.lines().find(|l| l.starts_with("VmHWM")) {
            eprintln!(
                "flux_subset peak resident memory: {}",
                l.trim_start_matches("VmHWM:").trim()
            );
        }
    }
}

criterion_group!(benches, subset);
criterion_main!(benches);
