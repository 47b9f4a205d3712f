//! Attention without the score matrix: each block of queries walks the keys in tiles with an
//! online softmax (a running maximum and sum per query, the partial output rescaled when the
//! maximum grows), as FlashAttention does on a GPU (Dao et al., 2022, algorithm 1). Per task
//! the working set is one `QB x KB` tile of scores and one `QB x head_dim` accumulator, which
//! stay in cache at any sequence length; query blocks run in parallel.

use gemm::{gemm, Parallelism};

use crate::activation::exp_f32;
use crate::attention::check_shapes;
use crate::par::for_row_chunks;

/// Queries per task and keys per tile: the best of 32-256 x 128-1536 for FLUX's heads of 128
/// at 1536 and 4608 keys on a 2-core AVX2 machine (`kernels/examples/attn_speed.rs`).
const QB: usize = 128;
const KB: usize = 512;

/// Keys from which the tiles' products go to a system BLAS when one is loaded.
const BLAS_MIN_KEYS: usize = 256;

/// Multi-head scaled dot-product attention of `q` (`nq x d`) over `k`, `v` (`nk x d`),
/// `heads` heads interleaved in the columns, into `out` (`nq x d`), with no statistics and no
/// `nq x nk` buffer. Queries are cut into the same blocks whatever the thread count, so the
/// result does not depend on it (a query's last bits may depend on which queries share its
/// block: the GEMM's blocking follows the block's size). From 256 keys the tiles' products
/// run on a system BLAS when one is loaded ([`crate::blas`]). Panics on bad shapes.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_f32(
    q: &[f32],
    nq: usize,
    k: &[f32],
    v: &[f32],
    nk: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
) {
    check_shapes("flash_attention_f32", (q, nq), (k, v, nk), d, heads, out);
    if nq == 0 {
        return;
    }
    if nk == 0 {
        out.fill(0.0);
        return;
    }
    // A system BLAS's sgemm for the tiles' two products from 256 keys (as for the linear
    // layers); shorter sequences keep this crate's results on every machine.
    let blas = (nk >= BLAS_MIN_KEYS).then(crate::blas::blas).flatten();
    for_row_chunks(out, d, QB, |first, o| {
        let n = o.len() / d;
        block(
            &q[first * d..(first + n) * d],
            n,
            k,
            v,
            nk,
            d,
            heads,
            o,
            blas,
        );
    });
}

/// One block of `nq <= QB` queries over every key, all heads.
#[allow(clippy::too_many_arguments)]
fn block(
    q: &[f32],
    nq: usize,
    k: &[f32],
    v: &[f32],
    nk: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    blas: Option<&crate::blas::Blas>,
) {
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut s = vec![0.0f32; nq * KB];
    let mut acc = vec![0.0f32; nq * dh];
    let mut m = vec![f32::NEG_INFINITY; nq];
    let mut l = vec![0.0f32; nq];
    for h in 0..heads {
        acc.fill(0.0);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        for k0 in (0..nk).step_by(KB) {
            let kb = KB.min(nk - k0);
            // s[nq x kb] = scale * q_h · k_h^T; k_h^T element (c, j) = k[(k0 + j) * d + h*dh + c].
            if let Some(b) = blas {
                b.gemm_strided(
                    (nq, kb, dh),
                    scale,
                    (&q[h * dh..], d),
                    (&k[k0 * d + h * dh..], d, true),
                    0.0,
                    (&mut s, KB),
                );
            } else {
                let (qh, kh) = (q[h * dh..].as_ptr(), k[k0 * d + h * dh..].as_ptr());
                // SAFETY: q_h is nq rows of dh at stride d, k_h kb rows of dh at stride d, inside
                // q (nq*d) and k (rows k0..k0 + kb < nk) as asserted by the caller; s holds nq*KB
                // floats written at row stride KB over kb <= KB columns; s aliases neither input.
                unsafe {
                    gemm(
                        nq,
                        kb,
                        dh,
                        s.as_mut_ptr(),
                        1,
                        KB as isize,
                        false,
                        qh,
                        1,
                        d as isize,
                        kh,
                        d as isize,
                        1,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                }
            }
            online_softmax(&mut s, kb, &mut m, &mut l, &mut acc, dh);
            // acc[nq x dh] += p[nq x kb] · v_h[kb x dh]; v_h element (j, c) = v[(k0 + j) * d +
            // h*dh + c].
            if let Some(b) = blas {
                b.gemm_strided(
                    (nq, dh, kb),
                    1.0,
                    (&s, KB),
                    (&v[k0 * d + h * dh..], d, false),
                    1.0,
                    (&mut acc, dh),
                );
            } else {
                let vh = v[k0 * d + h * dh..].as_ptr();
                // SAFETY: v_h is kb rows of dh at stride d inside v (rows k0..k0 + kb); s is read
                // as nq x kb at stride KB; acc holds nq*dh floats at stride dh and aliases neither.
                unsafe {
                    gemm(
                        nq,
                        dh,
                        kb,
                        acc.as_mut_ptr(),
                        1,
                        dh as isize,
                        true,
                        s.as_ptr(),
                        1,
                        KB as isize,
                        vh,
                        1,
                        d as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    )
                }
            }
        }
        for i in 0..nq {
            let inv = 1.0 / l[i];
            let dst = &mut out[i * d + h * dh..i * d + (h + 1) * dh];
            for (o, a) in dst.iter_mut().zip(&acc[i * dh..(i + 1) * dh]) {
                *o = a * inv;
            }
        }
    }
}

crate::simd::simd_fn! {
    /// Turns each row's `kb` scores into `exp(s - max)` against the row's running maximum,
    /// updates the running sum, and rescales the row's accumulator when the maximum grew.
    fn online_softmax(
        s: &mut [f32],
        kb: usize,
        m: &mut [f32],
        l: &mut [f32],
        acc: &mut [f32],
        dh: usize,
    ) {
        for (i, row) in s.chunks_exact_mut(KB).enumerate().take(m.len()) {
            let row = &mut row[..kb];
            let top = crate::simd::max(row);
            let mi = m[i].max(top);
            let corr = if m[i] == f32::NEG_INFINITY {
                0.0
            } else {
                exp_f32(m[i] - mi)
            };
            for x in row.iter_mut() {
                *x = exp_f32(*x - mi);
            }
            l[i] = l[i] * corr + crate::simd::sum(row);
            m[i] = mi;
            if corr != 1.0 {
                for a in &mut acc[i * dh..(i + 1) * dh] {
                    *a *= corr;
                }
            }
        }
    }
}
