//! Times the online-softmax attention kernel on one shape: the median of 7 runs.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p flashdiff-kernels --example attn_speed -- \
//!     QUERIES KEYS HEADS HEAD_DIM
//! ```
//!
//! PyTorch's `scaled_dot_product_attention` on the same shape is the comparison
//! (`docs/benchmarks.md`, the speed section).

use std::time::Instant;

fn main() {
    let args: Result<Vec<usize>, _> = std::env::args().skip(1).map(|a| a.parse()).collect();
    let (nq, nk, heads, dh) = match args.as_deref() {
        Ok(&[a, b, c, d]) if a > 0 && b > 0 && c > 0 && d > 0 => (a, b, c, d),
        _ => {
            eprintln!("usage: attn_speed QUERIES KEYS HEADS HEAD_DIM (positive integers)");
            std::process::exit(2);
        }
    };
    let d = heads * dh;
    // Deterministic values in [-2, 2) from a scrambled counter.
    let values = |n: usize, seed: u64| -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let x = (i + 1)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(seed)
                    >> 40;
                (x % 4000) as f32 / 1000.0 - 2.0
            })
            .collect()
    };
    let (q, k, v) = (values(nq * d, 1), values(nk * d, 2), values(nk * d, 3));
    let mut out = vec![0.0f32; nq * d];
    let mut times = Vec::new();
    for _ in 0..7 {
        let s = Instant::now();
        flashdiff_kernels::flash_attention_f32(&q, nq, &k, &v, nk, d, heads, &mut out);
        times.push(s.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let ms = times[times.len() / 2];
    let flops = 4.0 * (nq * nk * d) as f64;
    println!(
        "flash attention {nq} x {nk}, {heads} heads of {dh}: {ms:.1} ms ({:.1} GFLOP/s)",
        flops / ms / 1e6
    );
}
