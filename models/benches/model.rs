//! The built-in model's step cost on candle: a full forward (64 tokens) and token-subset
//! forwards of 25, 50 and 75% of the tokens with cached K/V (target: cost within 1.2x of
//! proportional), plus the attention op alone at 1024 and 4096 tokens.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::PathBuf;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use flashdiff_kernels::ops::{attention, AttnWants};
use flashdiff_models::families::tinydit::TinyDit;
use flashdiff_models::{Denoiser, Device, KvCache, Patches, StepInput, Tensor};

fn model_step(c: &mut Criterion) {
    flashdiff_kernels::flush_denormals_to_zero();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tinydit/tinydit.safetensors");
    let m = TinyDit::load(&path, &Device::Cpu).expect("built-in weights");
    let cfg = m.config().clone();
    let ids: Vec<u32> = (0..cfg.max_tokens as u32)
        .map(|i| i % cfg.vocab as u32)
        .collect();
    let context = m.encode_ids(&ids).unwrap();
    let context = Tensor::from_slice(&context, context.len(), &Device::Cpu).unwrap();
    let cond = m.step_cond(&context, 0.5).unwrap();
    let step = StepInput {
        context: &context,
        cond: &cond,
    };
    let (tokens, pd) = (cfg.tokens(), cfg.patch_dim());
    let x: Vec<f32> = (0..tokens * pd)
        .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
        .collect();
    let xt = Tensor::from_slice(&x, (tokens, pd), &Device::Cpu).unwrap();
    let warm = m.full_forward(&xt, step, false).unwrap();
    let cache = KvCache {
        k: &warm.k,
        v: &warm.v,
    };
    let of = vec![0u32; tokens];
    let patches = Patches {
        of_token: &of,
        patches: 1,
    };
    let mut g = c.benchmark_group("tinydit_forward");
    for pct in [25usize, 50, 75, 100] {
        let n = tokens * pct / 100;
        // A contiguous block of rows, as a patch of a uniform layout would be.
        let active: Vec<u32> = (0..n as u32).collect();
        let xa = xt.narrow(0, 0, n).unwrap().contiguous().unwrap();
        g.bench_function(
            BenchmarkId::from_parameter(format!("{pct}pct_{n}tokens")),
            |b| {
                b.iter(|| {
                    m.subset_forward(black_box(&xa), &active, step, Some(cache), patches)
                        .unwrap()
                })
            },
        );
    }
    g.finish();
}

fn attention_op(c: &mut Criterion) {
    let mut g = c.benchmark_group("attention_op");
    g.sample_size(10);
    for n in [1024usize, 4096] {
        let d = 128;
        let q = Tensor::randn(0f32, 1.0, (n, d), &Device::Cpu).unwrap();
        let k = Tensor::randn(0f32, 1.0, (n, d), &Device::Cpu).unwrap();
        let v = Tensor::randn(0f32, 1.0, (n, d), &Device::Cpu).unwrap();
        let groups: Vec<u32> = (0..n as u32).map(|i| i % 16).collect();
        let wants = AttnWants {
            probs: false,
            key_groups: Some((&groups, 16)),
        };
        g.bench_function(
            BenchmarkId::from_parameter(format!("{n}tokens_4heads")),
            |b| b.iter(|| attention(black_box(&q), &k, &v, 4, wants).unwrap()),
        );
    }
    g.finish();
}

criterion_group!(benches, model_step, attention_op);
criterion_main!(benches);
