//! Every candle op of `flashdiff_kernels::ops` against its composed form (candle's own ops,
//! what runs on CUDA): one body per op, an explicit tolerance, a message naming op and index.
//! On a machine with a CUDA build and a GPU the same bodies also run on the GPU.

use candle_core::{Device, Tensor};
use flashdiff_kernels::ops::{
    attention, attention_composed, gelu_tanh, gelu_tanh_inplace, layer_norm_plain, linear,
    norm_modulate, scatter_rows, AttnWants,
};

fn close(op: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.dims(), want.dims(), "{op}: shapes");
    let g: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
    let w: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{op} f32: index {i}: got {a}, want {b} (tolerance {tol:.0e})"
        );
    }
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    // Deterministic values without a random-number crate: a scrambled counter in [-2, 2).
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| {
            let x = (i + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(seed)
                >> 40;
            (x % 4000) as f32 / 1000.0 - 2.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

#[test]
fn gelu_matches_candles_gelu() {
    let x = randn(&[7, 33], 1);
    close(
        "gelu_tanh",
        &gelu_tanh(&x).unwrap(),
        &x.gelu().unwrap(),
        1e-5,
    );
}

#[test]
fn norm_modulate_matches_the_composed_form() {
    let (x, shift, scale) = (randn(&[9, 16], 2), randn(&[16], 3), randn(&[16], 4));
    let want = layer_norm_plain(&x, 1e-6)
        .unwrap()
        .broadcast_mul(&(&scale + 1.0).unwrap())
        .unwrap()
        .broadcast_add(&shift)
        .unwrap();
    close(
        "norm_modulate",
        &norm_modulate(&x, &shift, &scale, 1e-6).unwrap(),
        &want,
        1e-5,
    );
    // A strided (transposed) input is made contiguous, not misread.
    let xt = randn(&[16, 9], 5).t().unwrap();
    let want = norm_modulate(&xt.contiguous().unwrap(), &shift, &scale, 1e-6).unwrap();
    close(
        "norm_modulate (strided input)",
        &norm_modulate(&xt, &shift, &scale, 1e-6).unwrap(),
        &want,
        0.0,
    );
}

#[test]
fn scatter_rows_matches_candles_scatter_and_refuses_bad_ids() {
    let (base, rows) = (randn(&[10, 4], 6), randn(&[3, 4], 7));
    let ids = [7u32, 0, 4];
    let idx = Tensor::new(&[[7u32; 4], [0; 4], [4; 4]], &Device::Cpu).unwrap();
    let want = base.scatter(&idx, &rows, 0).unwrap();
    close(
        "scatter_rows",
        &scatter_rows(&base, &rows, &ids).unwrap(),
        &want,
        0.0,
    );
    let e = scatter_rows(&base, &rows, &[7, 0, 10])
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 10"), "{e}");
    let e = scatter_rows(&base, &rows, &[7, 0]).unwrap_err().to_string();
    assert!(e.contains("3 rows given for 2 ids"), "{e}");
}

#[test]
fn attention_and_its_statistics_match_the_composed_form() {
    // More queries than one block of the CPU kernel, so the blocking is exercised too.
    for (nq, nk, d, heads) in [(5, 12, 8, 2), (300, 40, 16, 4), (1, 1, 4, 1)] {
        let (q, k, v) = (randn(&[nq, d], 8), randn(&[nk, d], 9), randn(&[nk, d], 10));
        let groups: Vec<u32> = (0..nk as u32).map(|j| j % 3).collect();
        let wants = AttnWants {
            probs: true,
            key_groups: Some((&groups, 3)),
        };
        let got = attention(&q, &k, &v, heads, wants).unwrap();
        let want = attention_composed(&q, &k, &v, heads, wants).unwrap();
        let at = format!("attention {nq}x{nk}x{d}/{heads}");
        close(&at, &got.out, &want.out, 1e-5);
        close(
            &format!("{at} probs"),
            got.probs.as_ref().unwrap(),
            want.probs.as_ref().unwrap(),
            1e-5,
        );
        close(
            &format!("{at} group mass"),
            got.group_mass.as_ref().unwrap(),
            want.group_mass.as_ref().unwrap(),
            1e-5,
        );
        // Each query's probabilities sum to one, so its group masses do too.
        let sums: Vec<f32> = got.group_mass.unwrap().sum(1).unwrap().to_vec1().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
    }
}

#[test]
fn attention_refuses_bad_shapes_and_groups() {
    let (q, k) = (randn(&[4, 8], 1), randn(&[6, 8], 2));
    let e = attention(&q, &k, &k, 3, AttnWants::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 heads"), "{e}");
    let short = randn(&[5, 8], 3);
    let e = attention(&q, &k, &short, 2, AttnWants::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be 6 x 8"), "{e}");
    let g = [0u32, 1, 2, 0, 1, 5];
    let wants = AttnWants {
        probs: false,
        key_groups: Some((&g, 3)),
    };
    let e = attention(&q, &k, &k, 2, wants).unwrap_err().to_string();
    assert!(e.contains("below 3"), "{e}");
}

#[test]
fn linear_matches_candles_matmul_and_is_row_independent() {
    let (x, w, b) = (randn(&[37, 24], 11), randn(&[10, 24], 12), randn(&[10], 13));
    let want = x
        .matmul(&w.t().unwrap())
        .unwrap()
        .broadcast_add(&b)
        .unwrap();
    let got = linear(&x, &w, &b).unwrap();
    close("linear", &got, &want, 1e-5);
    // A row computed alone is bit-identical to the same row computed among others.
    let alone = linear(&x.narrow(0, 5, 1).unwrap(), &w, &b).unwrap();
    close(
        "linear (one row)",
        &alone,
        &got.narrow(0, 5, 1).unwrap(),
        0.0,
    );
    let e = linear(&x, &w.t().unwrap(), &b).unwrap_err().to_string();
    assert!(e.contains("weight"), "{e}");
}

#[test]
fn gelu_in_place_equals_gelu() {
    let x = randn(&[5, 12], 14);
    let want = gelu_tanh(&x).unwrap();
    let fresh = (&x * 1.0).unwrap();
    close(
        "gelu_tanh_inplace",
        &gelu_tanh_inplace(fresh).unwrap(),
        &want,
        0.0,
    );
}

#[test]
fn flash_attention_matches_the_composed_form() {
    use flashdiff_kernels::ops::flash_attention;
    // Query blocks and key tiles with edges (64 and 256 per block), small and parallel sizes.
    for (nq, nk, heads, dh) in [
        (1, 1, 1, 2),
        (5, 9, 2, 4),
        (70, 300, 3, 8),
        (300, 600, 4, 32),
    ] {
        let d = heads * dh;
        let (q, k, v) = (
            randn(&[nq, d], 11 + nq as u64),
            randn(&[nk, d], 12 + nk as u64),
            randn(&[nk, d], 13),
        );
        let want = attention_composed(&q, &k, &v, heads, AttnWants::default())
            .unwrap()
            .out;
        let got = flash_attention(&q, &k, &v, heads).unwrap();
        close(&format!("flash_attention {nq}x{nk}"), &got, &want, 2e-5);
    }
}

#[test]
fn flash_attention_does_not_depend_on_the_thread_count() {
    use flashdiff_kernels::ops::flash_attention;
    let (nq, nk, heads, d) = (300, 520, 4, 128);
    let (q, k, v) = (
        randn(&[nq, d], 21),
        randn(&[nk, d], 22),
        randn(&[nk, d], 23),
    );
    let on = |threads: usize| -> Vec<f32> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| flash_attention(&q, &k, &v, heads).unwrap())
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let one = on(1);
    for threads in [2, 3] {
        assert!(
            on(threads) == one,
            "flash attention on {threads} threads differs from one thread"
        );
    }
}

#[test]
fn rms_rope_matches_the_composed_form_on_strided_rows() {
    use flashdiff_kernels::ops::{rms_rope, rms_rope_composed};
    for (rows, heads, dh) in [(1, 1, 2), (9, 2, 8), (600, 4, 32)] {
        let d = heads * dh;
        // The middle third of wider rows, as a fused QKV projection's output is read.
        let wide = randn(&[rows, 3 * d], 31 + rows as u64);
        let x = wide.narrow(1, d, d).unwrap();
        let scale = randn(&[dh], 32);
        let angles = randn(&[rows, dh / 2], 33);
        let table = Tensor::cat(&[angles.cos().unwrap(), angles.sin().unwrap()], 1).unwrap();
        let want =
            rms_rope_composed(&x.contiguous().unwrap(), &scale, &table, heads, 1e-6).unwrap();
        let got = rms_rope(&x, &scale, &table, heads, 1e-6).unwrap();
        close(&format!("rms_rope {rows}x{d}"), &got, &want, 1e-5);
    }
}

#[test]
fn rms_rope_refuses_odd_heads_and_bad_tables() {
    use flashdiff_kernels::ops::rms_rope;
    let x = randn(&[4, 6], 41);
    let table = randn(&[4, 3], 42);
    let e = rms_rope(&x, &randn(&[3], 43), &table, 2, 1e-6).unwrap_err();
    assert!(e.to_string().contains("even width"), "{e}");
    let e = rms_rope(&x, &randn(&[6], 43), &randn(&[3, 6], 42), 1, 1e-6).unwrap_err();
    assert!(e.to_string().contains("table"), "{e}");
    // A tensor of another rank is an error, not a panic.
    assert!(rms_rope(&randn(&[2, 2, 4], 44), &randn(&[4], 43), &table, 2, 1e-6).is_err());
}

#[test]
fn add_gated_matches_the_composed_form() {
    use flashdiff_kernels::ops::add_gated;
    for rows in [3usize, 700] {
        let (x, o, g) = (
            randn(&[rows, 64], 51),
            randn(&[rows, 64], 52),
            randn(&[64], 53),
        );
        let want = x.add(&o.broadcast_mul(&g).unwrap()).unwrap();
        close("add_gated", &add_gated(&x, &o, &g).unwrap(), &want, 1e-6);
    }
    let e = add_gated(&randn(&[3, 4], 1), &randn(&[3, 5], 2), &randn(&[4], 3)).unwrap_err();
    assert!(e.to_string().contains("must match"), "{e}");
}

#[test]
fn linear_fast_matches_candles_matmul_below_and_above_the_blas_rows() {
    use flashdiff_kernels::ops::linear_fast;
    // 300 rows reach the system BLAS where one is installed; 7 run the kernels' GEMM.
    for rows in [7usize, 300] {
        let (x, w, b) = (
            randn(&[rows, 40], 61),
            randn(&[24, 40], 62),
            randn(&[24], 63),
        );
        let want = x.matmul(&w.t().unwrap()).unwrap();
        close(
            "linear_fast",
            &linear_fast(&x, &w, None).unwrap(),
            &want,
            1e-5,
        );
        let want = want.broadcast_add(&b).unwrap();
        close(
            "linear_fast + bias",
            &linear_fast(&x, &w, Some(&b)).unwrap(),
            &want,
            1e-5,
        );
    }
    let e = linear_fast(
        &randn(&[300, 40], 1),
        &randn(&[24, 40], 2),
        Some(&randn(&[5], 3)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("bias"), "{e}");
}
