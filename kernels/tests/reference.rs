//! Every slice kernel against a naive reference (the candle ops are tested against candle's
//! composed ops in `ops.rs`). Failures name the op, dtype and index.

use flashdiff_kernels::{
    attention_f32, gather_rows_f32, gelu_tanh_f32, layer_norm_f32, linear_f32, modulate_f32,
    scatter_rows_f32, silu_f32, AttnStats, GroupMass,
};
use proptest::prelude::*;

fn assert_close(op: &str, got: &[f32], want: &[f32], tol: f32) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{} f32: length", op);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        prop_assert!(
            err <= tol,
            "{} f32: index {}: got {} want {} (tolerance {})",
            op,
            i,
            g,
            w,
            tol
        );
    }
    Ok(())
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % 2001) as f32 - 1000.0) / 500.0
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn naive_attention(
    q: &[f32],
    nq: usize,
    k: &[f32],
    v: &[f32],
    nk: usize,
    d: usize,
    heads: usize,
) -> (Vec<f32>, Vec<f32>) {
    let dh = d / heads;
    let mut out = vec![0.0f32; nq * d];
    let mut probs = vec![0.0f32; nq * nk];
    for h in 0..heads {
        for i in 0..nq {
            let s: Vec<f64> = (0..nk)
                .map(|j| {
                    (0..dh)
                        .map(|c| q[i * d + h * dh + c] as f64 * k[j * d + h * dh + c] as f64)
                        .sum::<f64>()
                        / (dh as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..nk {
                probs[i * nk + j] += (e[j] / z / heads as f64) as f32;
                for c in 0..dh {
                    out[i * d + h * dh + c] += (e[j] / z * v[j * d + h * dh + c] as f64) as f32;
                }
            }
        }
    }
    (out, probs)
}

#[allow(clippy::too_many_arguments)]
fn check_kernels(
    rows: usize,
    in_dim: usize,
    out_dim: usize,
    nq: usize,
    nk: usize,
    heads: usize,
    dh: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    // linear
    let x = vals(rows * in_dim, seed);
    let w = vals(out_dim * in_dim, seed + 1);
    let bias = vals(out_dim, seed + 2);
    let mut y = vec![0.0; rows * out_dim];
    linear_f32(&x, rows, in_dim, &w, Some(&bias), out_dim, &mut y);
    let want: Vec<f32> = (0..rows * out_dim)
        .map(|i| {
            let (r, o) = (i / out_dim, i % out_dim);
            bias[o]
                + (0..in_dim)
                    .map(|c| x[r * in_dim + c] * w[o * in_dim + c])
                    .sum::<f32>()
        })
        .collect();
    assert_close(
        &format!("linear {rows}x{in_dim}->{out_dim}"),
        &y,
        &want,
        1e-4,
    )?;

    // attention with both statistics
    let d = heads * dh;
    let q = vals(nq * d, seed + 3);
    let k = vals(nk * d, seed + 4);
    let v = vals(nk * d, seed + 5);
    let mut out = vec![0.0; nq * d];
    let mut probs = vec![0.0; nq * nk];
    let groups = 3;
    let key_group: Vec<u32> = (0..nk as u32).map(|j| j % groups as u32).collect();
    let mut mass = vec![0.0; nq * groups];
    let mut stats = AttnStats {
        probs: Some((&mut probs, 1.0)),
        group_mass: Some(GroupMass {
            key_group: &key_group,
            groups,
            out: &mut mass,
            weight: 1.0,
        }),
    };
    attention_f32(&q, nq, &k, &v, nk, d, heads, &mut out, &mut stats);
    let (want_out, want_p) = naive_attention(&q, nq, &k, &v, nk, d, heads);
    assert_close("attention out", &out, &want_out, 1e-4)?;
    assert_close("attention probs", &probs, &want_p, 1e-5)?;
    let want_mass: Vec<f32> = (0..nq * groups)
        .map(|i| {
            (0..nk)
                .filter(|j| j % groups == i % groups)
                .map(|j| want_p[(i / groups) * nk + j])
                .sum()
        })
        .collect();
    assert_close("attention group mass", &mass, &want_mass, 1e-5)?;
    for i in 0..nq {
        let s: f32 = mass[i * groups..(i + 1) * groups].iter().sum();
        prop_assert!(
            (s - 1.0).abs() < 1e-4,
            "attention group mass f32: row {} sums to {}",
            i,
            s
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cpu_matches_reference(rows in 1usize..40, in_dim in 1usize..70, out_dim in 1usize..70,
                             nq in 1usize..20, nk in 1usize..40, heads in 1usize..5, dh in 1usize..17, seed in any::<u64>()) {
        check_kernels(rows, in_dim, out_dim, nq, nk, heads, dh, seed)?;
    }

    #[test]
    fn elementwise_ops(n in 1usize..8, d in 1usize..40, seed in any::<u64>()) {
        let x = vals(n * d, seed);
        let mut g = x.clone();
        gelu_tanh_f32(&mut g);
        let want: Vec<f32> = x.iter().map(|&u| 0.5 * u * (1.0 + ((2.0f32 / std::f32::consts::PI).sqrt() * (u + 0.044715 * u.powi(3))).tanh())).collect();
        assert_close("gelu_tanh", &g, &want, 1e-5)?;
        let mut s = x.clone();
        silu_f32(&mut s);
        let want: Vec<f32> = x.iter().map(|&u| u / (1.0 + (-u).exp())).collect();
        assert_close("silu", &s, &want, 1e-5)?;
        let mut l = x.clone();
        let w = vals(d, seed + 9);
        layer_norm_f32(&mut l, d, 1e-6, Some(&w), Some(&w));
        let wr = &w;
        let want: Vec<f32> = x.chunks(d).flat_map(|r| {
            let m = r.iter().sum::<f32>() / d as f32;
            let var = r.iter().map(|v| (v - m).powi(2)).sum::<f32>() / d as f32;
            r.iter().enumerate().map(move |(i, v)| (v - m) / (var + 1e-6).sqrt() * wr[i] + wr[i]).collect::<Vec<_>>()
        }).collect();
        assert_close("layer_norm", &l, &want, 1e-3)?;
        let mut m = x.clone();
        modulate_f32(&mut m, d, &w, &w);
        let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * (1.0 + w[i % d]) + w[i % d]).collect();
        assert_close("modulate", &m, &want, 1e-6)?;
        let idx: Vec<u32> = (0..n as u32).rev().collect();
        let mut gathered = vec![0.0; n * d];
        gather_rows_f32(&x, d, &idx, &mut gathered);
        let mut back = vec![0.0; n * d];
        scatter_rows_f32(&gathered, d, &idx, &mut back);
        assert_close("gather/scatter", &back, &x, 0.0)?;
    }
}
