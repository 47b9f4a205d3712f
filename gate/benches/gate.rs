//! One gate decision plus its observations for R = 64 patches (target: under 2 us).
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use flashdiff_gate::{Gate, GateConfig};

fn bench(c: &mut Criterion) {
    for r in [16usize, 64] {
        let mut gate = Gate::new(r, GateConfig::default()).unwrap();
        let mut active = vec![false; r];
        let mut step = 0u32;
        c.bench_function(&format!("gate_decide_observe/R={r}"), |b| {
            b.iter(|| {
                gate.decide(black_box(&mut active)).unwrap();
                step = step.wrapping_add(1);
                for p in 0..r {
                    if active[p] {
                        let v = ((p as u32 * 2654435761u32) ^ step) % 1000;
                        gate.observe(p, v as f32 * 1e-3).unwrap();
                    }
                }
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
