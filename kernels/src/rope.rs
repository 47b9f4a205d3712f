//! Query/key normalisation and rotary position encoding in one pass: FLUX's RMS norm of each
//! head (a learned scale, eps inside the root) followed by the rotation of consecutive pairs.

use crate::par::{for_row_chunks, rows_per_task};

/// For every row `r` and head `h` of `x` (`rows` rows of `heads * dh` values, row `r`
/// starting at `r * stride`): the head's values scaled by `1 / sqrt(mean(x^2) + eps)` and
/// `scale` (`dh` values), then each pair `(y0, y1)` at columns `2i, 2i + 1` rotated by the
/// row's angle `i`: `(c y0 - s y1, s y0 + c y1)` with `c = cos[r * dh/2 + i]`, `s = sin[..]`.
/// Writes `out` (`rows x heads * dh`, contiguous). Panics on bad lengths.
#[allow(clippy::too_many_arguments)]
pub fn rms_rope_f32(
    x: &[f32],
    rows: usize,
    stride: usize,
    heads: usize,
    dh: usize,
    scale: &[f32],
    eps: f32,
    (cos, sin): (&[f32], &[f32]),
    out: &mut [f32],
) {
    let d = heads * dh;
    assert!(dh % 2 == 0, "rms_rope_f32: head width {dh} is odd");
    assert!(
        stride >= d,
        "rms_rope_f32: row stride {stride} below width {d}"
    );
    assert!(
        rows == 0 || x.len() >= (rows - 1) * stride + d,
        "rms_rope_f32: x holds fewer than {rows} rows"
    );
    assert_eq!(scale.len(), dh, "rms_rope_f32: scale is not dh long");
    assert!(
        cos.len() == rows * dh / 2 && sin.len() == cos.len(),
        "rms_rope_f32: tables are not rows x dh/2"
    );
    assert_eq!(
        out.len(),
        rows * d,
        "rms_rope_f32: out is not rows x heads*dh"
    );
    if rows == 0 || d == 0 {
        return;
    }
    for_row_chunks(out, d, rows_per_task(rows), |first, o| {
        rows_body(x, first, stride, heads, dh, scale, eps, (cos, sin), o)
    });
}

crate::simd::simd_fn! {
    #[allow(clippy::too_many_arguments)]
    fn rows_body(
        x: &[f32],
        first: usize,
        stride: usize,
        heads: usize,
        dh: usize,
        scale: &[f32],
        eps: f32,
        tables: (&[f32], &[f32]),
        out: &mut [f32],
    ) {
        let (cos, sin) = tables;
        let d = heads * dh;
        let half = dh / 2;
        for (i, o) in out.chunks_exact_mut(d).enumerate() {
            let r = first + i;
            let xr = &x[r * stride..r * stride + d];
            let (c, s) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
            for h in 0..heads {
                let xh = &xr[h * dh..(h + 1) * dh];
                let oh = &mut o[h * dh..(h + 1) * dh];
                let ss = crate::simd::sum_squares(xh);
                let inv = 1.0 / (ss / dh as f32 + eps).sqrt();
                for j in 0..half {
                    let y0 = xh[2 * j] * inv * scale[2 * j];
                    let y1 = xh[2 * j + 1] * inv * scale[2 * j + 1];
                    oh[2 * j] = c[j] * y0 - s[j] * y1;
                    oh[2 * j + 1] = s[j] * y0 + c[j] * y1;
                }
            }
        }
    }
}
