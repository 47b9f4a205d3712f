//! The built-in model's step cost: a full forward (64 tokens) and token-subset forwards of 25,
//! 50 and 75% of the tokens with displaced K/V (target: cost within 1.2x of proportional).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::PathBuf;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use flashdiff_runtime::model::{StepStats, TinyDit};

fn bench(c: &mut Criterion) {
    flashdiff_kernels::flush_denormals_to_zero();
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tinydit/tinydit.safetensors");
    let m = TinyDit::load(&path).expect("built-in weights");
    let cfg = m.config().clone();
    let ids: Vec<u32> = (0..cfg.max_tokens as u32)
        .map(|i| i % cfg.vocab as u32)
        .collect();
    let text = m.encode_text(&ids);
    let cond = m.step_cond(&text, 0.5);
    let mut cache = m.new_cache();
    let all: Vec<u32> = (0..cfg.tokens() as u32).collect();
    let x: Vec<f32> = (0..cfg.tokens() * cfg.patch_dim())
        .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
        .collect();
    let warm = m.forward(
        &x,
        &all,
        &cond,
        &text,
        cache.view(),
        &mut StepStats::default(),
    );
    cache.update(&all, &warm);
    let mut g = c.benchmark_group("tinydit_forward");
    for pct in [25usize, 50, 75, 100] {
        let n = cfg.tokens() * pct / 100;
        // A contiguous block of rows, as a patch of a uniform layout would be.
        let active: Vec<u32> = (0..n as u32).collect();
        let xa = x[..n * cfg.patch_dim()].to_vec();
        g.bench_function(
            BenchmarkId::from_parameter(format!("{pct}pct_{n}tokens")),
            |b| {
                b.iter(|| {
                    m.forward(
                        black_box(&xa),
                        &active,
                        &cond,
                        &text,
                        cache.view(),
                        &mut StepStats::default(),
                    )
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
