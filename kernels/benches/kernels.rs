//! GEMM efficiency: the linear layer at the built-in model's shapes and at 512^3, reported as
//! FLOP/s (criterion's elements/s = FLOP/s) to compare with the machine's measured peak.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flashdiff_kernels::{attention_f32, linear_f32, AttnStats};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear_f32");
    for (rows, inp, out) in [
        (64usize, 128usize, 384usize),
        (64, 128, 512),
        (64, 512, 128),
        (16, 128, 384),
        (512, 512, 512),
    ] {
        let x = vec![0.5f32; rows * inp];
        let w = vec![0.25f32; out * inp];
        let b = vec![0.1f32; out];
        let mut y = vec![0.0f32; rows * out];
        g.throughput(Throughput::Elements((2 * rows * inp * out) as u64));
        g.bench_function(
            BenchmarkId::from_parameter(format!("{rows}x{inp}->{out}")),
            |bch| bch.iter(|| linear_f32(black_box(&x), rows, inp, &w, Some(&b), out, &mut y)),
        );
    }
    g.finish();
    let mut g = c.benchmark_group("attention_f32");
    for nq in [16usize, 64] {
        let (nk, d, heads) = (64usize, 128usize, 4usize);
        let q = vec![0.1f32; nq * d];
        let k = vec![0.2f32; nk * d];
        let v = vec![0.3f32; nk * d];
        let mut o = vec![0.0f32; nq * d];
        g.throughput(Throughput::Elements((4 * nq * nk * d) as u64));
        g.bench_function(
            BenchmarkId::from_parameter(format!("{nq}q_x_{nk}k_d{d}_h{heads}")),
            |b| {
                b.iter(|| {
                    attention_f32(
                        black_box(&q),
                        nq,
                        &k,
                        &v,
                        nk,
                        d,
                        heads,
                        &mut o,
                        &mut AttnStats::default(),
                    )
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
