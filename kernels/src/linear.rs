use gemm::{gemm, Parallelism};

/// `y[rows x out_dim] = x[rows x in_dim] · Wᵀ + b`, with `w` stored `[out_dim x in_dim]`
/// (PyTorch's layout: the transpose is a stride, never a copy). Panics on mismatched lengths.
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
    if rows == 0 || out_dim == 0 {
        return;
    }
    if in_dim == 0 {
        for r in y.chunks_exact_mut(out_dim) {
            match b {
                Some(b) => r.copy_from_slice(b),
                None => r.fill(0.0),
            }
        }
        return;
    }
    // gemm computes dst := alpha * dst + beta * lhs * rhs (alpha ignored when read_dst is
    // false). We compute yᵀ = W · xᵀ: m = out_dim, n = rows, k = in_dim. The weight matrix is
    // the left operand, so its packing is amortised over the output rows of the large side,
    // and a few active rows (regional execution) cost in proportion to their number.
    // yᵀ (o, r) is y[r * out_dim + o]: row stride 1, column stride out_dim. W (o, kk) is
    // w[o * in_dim + kk]: row stride in_dim, column stride 1. xᵀ (kk, r) is x[r * in_dim + kk]:
    // row stride 1, column stride in_dim.
    // SAFETY: the pointers come from slices whose lengths were checked above against the
    // (m, n, k) shapes and the strides given, so every element gemm touches is in bounds; y
    // does not alias x or w (a &mut and & cannot overlap).
    unsafe {
        gemm(
            out_dim,
            rows,
            in_dim,
            y.as_mut_ptr(),
            out_dim as isize,
            1,
            false,
            w.as_ptr(),
            1,
            in_dim as isize,
            x.as_ptr(),
            in_dim as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
    add_bias(y, b, out_dim);
}

fn add_bias(y: &mut [f32], b: Option<&[f32]>, out_dim: usize) {
    if let Some(b) = b {
        for r in y.chunks_exact_mut(out_dim) {
            for (o, bb) in r.iter_mut().zip(b) {
                *o += bb;
            }
        }
    }
}
