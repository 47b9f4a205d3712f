/// `y[rows x out_dim] = x[rows x in_dim] · Wᵀ + b`, with `w` stored `[out_dim x in_dim]`
/// (PyTorch's layout). Panics on mismatched lengths.
///
/// Every output element is computed by the same sequence of operations whatever `rows` is
/// and whichever other rows share the call (8-wide partial sums over the shared dimension in
/// order, then a fixed reduction): a patch computed alone or batched with others gives
/// bit-identical results, which the engine's determinism across workers relies on. No packing
/// either, so the cost is proportional to the rows computed.
pub fn linear_f32(
    x: &[f32],
    rows: usize,
    in_dim: usize,
    w: &[f32],
    b: Option<&[f32]>,
    out_dim: usize,
    y: &mut [f32],
) {
    assert_eq!(x.len(), rows * in_dim, "linear_f32: x is not rows x in_dim");
    assert_eq!(
        w.len(),
        out_dim * in_dim,
        "linear_f32: w is not out_dim x in_dim"
    );
    assert_eq!(
        y.len(),
        rows * out_dim,
        "linear_f32: y is not rows x out_dim"
    );
    if let Some(b) = b {
        assert_eq!(b.len(), out_dim, "linear_f32: bias is not out_dim");
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present (detected above), the only requirement of the
            // target_feature function; slice lengths were checked above.
            unsafe { avx2::linear(x, rows, in_dim, w, b, out_dim, y) };
            return;
        }
    }
    scalar(x, rows, in_dim, w, b, out_dim, y);
}

/// Portable fallback with the same order of operations as the AVX2 kernel (8 partial sums).
fn scalar(
    x: &[f32],
    rows: usize,
    in_dim: usize,
    w: &[f32],
    b: Option<&[f32]>,
    out_dim: usize,
    y: &mut [f32],
) {
    for r in 0..rows {
        let xr = &x[r * in_dim..(r + 1) * in_dim];
        for o in 0..out_dim {
            let wr = &w[o * in_dim..(o + 1) * in_dim];
            let mut acc = [0.0f32; 8];
            let k8 = in_dim / 8 * 8;
            for k in (0..k8).step_by(8) {
                for l in 0..8 {
                    acc[l] = xr[k + l].mul_add(wr[k + l], acc[l]);
                }
            }
            let mut s = reduce8(&acc);
            for k in k8..in_dim {
                s = xr[k].mul_add(wr[k], s);
            }
            y[r * out_dim + o] = s + b.map_or(0.0, |b| b[o]);
        }
    }
}

/// The fixed reduction order of 8 partial sums shared by both kernels.
#[inline(always)]
fn reduce8(a: &[f32; 8]) -> f32 {
    let s4 = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Rows in blocks of 4 and outputs in blocks of 4 share each load; every (row, output)
    /// accumulator sees the same k order as in [`super::scalar`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `x`, `w`, `y`, `b` have the lengths `linear_f32` checks.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn linear(
        x: &[f32],
        rows: usize,
        in_dim: usize,
        w: &[f32],
        b: Option<&[f32]>,
        out_dim: usize,
        y: &mut [f32],
    ) {
        // Outputs outer, rows inner: a block of weight rows is loaded from memory once and
        // stays in L1 while every input row streams past it, so the weights (the large
        // operand) cross the memory hierarchy once per call whatever `rows` is, and a call's
        // cost stays proportional to its rows down to a handful of them.
        let mut o0 = 0;
        while o0 < out_dim {
            let on = (out_dim - o0).min(OB);
            let mut r0 = 0;
            while r0 < rows {
                let rn = (rows - r0).min(RB);
                // Full blocks and edges use the same per-element arithmetic; edges only share
                // fewer loads.
                macro_rules! go {
                    ($($r:literal, $o:literal);*) => {
                        match (rn, on) {
                            // SAFETY: forwarded from this function's contract; the block of
                            // rn rows and on outputs lies inside the matrices.
                            $(($r, $o) => unsafe { block::<$r, $o>(x, r0, in_dim, w, o0, b, out_dim, y) },)*
                            _ => unreachable!("rn <= RB and on <= OB"),
                        }
                    };
                }
                go!(4, 3; 4, 2; 4, 1; 3, 3; 3, 2; 3, 1; 2, 3; 2, 2; 2, 1; 1, 3; 1, 2; 1, 1);
                r0 += RB;
            }
            o0 += OB;
        }
    }

    /// Rows per register block: 4 rows x 3 outputs keep 12 accumulators, 3 weight vectors and
    /// one input vector in the 16 AVX2 registers.
    const RB: usize = 4;
    /// Outputs per register block.
    const OB: usize = 3;

    /// One `R x O` block of outputs starting at row `r0`, output `o0`. Each element's
    /// accumulator sees k in order in 8 lanes, then `reduce8`, then the tail, then the bias:
    /// the same arithmetic for any block shape.
    ///
    /// # Safety
    /// AVX2 and FMA present; rows `r0..r0+R` and outputs `o0..o0+O` exist.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const R: usize, const O: usize>(
        x: &[f32],
        r0: usize,
        in_dim: usize,
        w: &[f32],
        o0: usize,
        b: Option<&[f32]>,
        out_dim: usize,
        y: &mut [f32],
    ) {
        let k8 = in_dim / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); O]; R];
        let mut k = 0;
        while k < k8 {
            let mut wv = [_mm256_setzero_ps(); O];
            for j in 0..O {
                // SAFETY: o0 + j < out_dim and k + 8 <= in_dim: inside w.
                wv[j] = unsafe { _mm256_loadu_ps(w.as_ptr().add((o0 + j) * in_dim + k)) };
            }
            for i in 0..R {
                // SAFETY: r0 + i < rows and k + 8 <= in_dim: inside x.
                let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add((r0 + i) * in_dim + k)) };
                for j in 0..O {
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
            k += 8;
        }
        for i in 0..R {
            for j in 0..O {
                let mut lanes = [0.0f32; 8];
                // SAFETY: `lanes` is 8 writable floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][j]) };
                let mut s = super::reduce8(&lanes);
                let (xr, wr) = ((r0 + i) * in_dim, (o0 + j) * in_dim);
                for kk in k8..in_dim {
                    s = x[xr + kk].mul_add(w[wr + kk], s);
                }
                y[(r0 + i) * out_dim + o0 + j] = s + b.map_or(0.0, |b| b[o0 + j]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_computed_independently_of_their_batch() {
        let (rows, inp, out) = (13, 37, 11);
        let x: Vec<f32> = (0..rows * inp)
            .map(|i| ((i * 7919) % 1000) as f32 / 333.0 - 1.5)
            .collect();
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 104729) % 1000) as f32 / 777.0 - 0.6)
            .collect();
        let mut all = vec![0.0; rows * out];
        linear_f32(&x, rows, inp, &w, None, out, &mut all);
        for r in 0..rows {
            let mut one = vec![0.0; out];
            linear_f32(&x[r * inp..(r + 1) * inp], 1, inp, &w, None, out, &mut one);
            assert_eq!(one, all[r * out..(r + 1) * out], "row {r} differs alone");
        }
        let mut s = vec![0.0; rows * out];
        scalar(&x, rows, inp, &w, None, out, &mut s);
        assert_eq!(s, all, "scalar fallback and AVX2 kernel disagree");
    }
}
