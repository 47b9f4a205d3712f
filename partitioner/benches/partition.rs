//! Partition latency: 64x64 and 128x128 saliency maps at R = 4, 8, 16 (target: < 200 us for
//! 128x128, R = 16), plus the uniform partitioner for reference.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use flashdiff_partitioner::{partition_saliency, partition_uniform, Grid};

/// Two Gaussian objects on a faintly textured background: the shape of a real warm-up map.
fn blob_map(n: u32) -> Vec<f32> {
    let mut s = Vec::with_capacity((n * n) as usize);
    let blobs = [(0.3f32, 0.35f32, 0.12f32, 1.0f32), (0.7, 0.65, 0.08, 0.7)];
    for y in 0..n {
        for x in 0..n {
            let (fx, fy) = (x as f32 / n as f32, y as f32 / n as f32);
            let mut v = 0.05 + 0.02 * ((x * 7 + y * 13) % 11) as f32 / 11.0;
            for (cx, cy, r, a) in blobs {
                let d2 = (fx - cx).powi(2) + (fy - cy).powi(2);
                v += a * (-d2 / (2.0 * r * r)).exp();
            }
            s.push(v);
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("partition_saliency");
    for n in [64u32, 128] {
        let grid = Grid::image(n, n).unwrap();
        let map = blob_map(n);
        for r in [4u32, 8, 16] {
            g.bench_with_input(BenchmarkId::new(format!("{n}x{n}"), r), &r, |b, &r| {
                b.iter(|| partition_saliency(grid, black_box(&map), r).unwrap())
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("partition_uniform");
    for n in [64u32, 128] {
        let grid = Grid::image(n, n).unwrap();
        g.bench_with_input(BenchmarkId::new(format!("{n}x{n}"), 16), &16, |b, &r| {
            b.iter(|| partition_uniform(grid, black_box(r)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
