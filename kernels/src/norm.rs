/// Layer norm over the last dimension `d` of `rows` rows, `eps` as in PyTorch; optional affine
/// `weight` and `bias` (length `d`). In place.
pub fn layer_norm_f32(
    x: &mut [f32],
    d: usize,
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
) {
    assert!(
        d > 0 && x.len() % d == 0,
        "layer_norm_f32: length not a multiple of d"
    );
    layer_norm_body(x, d, eps, weight, bias)
}

crate::simd::simd_fn! {
    fn layer_norm_body(
        x: &mut [f32],
        d: usize,
        eps: f32,
        weight: Option<&[f32]>,
        bias: Option<&[f32]>,
    ) {
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            let mut y = (*v - mean) * inv;
            if let Some(w) = weight {
                y *= w[i];
            }
            if let Some(b) = bias {
                y += b[i];
            }
            *v = y;
        }
    }
    }
}

/// adaLN modulation in place: `x = x * (1 + scale) + shift`, the same `shift`/`scale`
/// (length `d`) for every row.
pub fn modulate_f32(x: &mut [f32], d: usize, shift: &[f32], scale: &[f32]) {
    assert!(
        shift.len() == d && scale.len() == d,
        "modulate_f32: shift/scale not of length d"
    );
    modulate_body(x, d, shift, scale)
}

crate::simd::simd_fn! {
    fn modulate_body(x: &mut [f32], d: usize, shift: &[f32], scale: &[f32]) {
        for row in x.chunks_exact_mut(d) {
            for i in 0..d {
                row[i] = row[i] * (1.0 + scale[i]) + shift[i];
            }
        }
    }
}

/// `x + o * gate` row by row (`gate` of length `d`), written into `x`: a gated residual.
pub fn add_gated_f32(x: &mut [f32], o: &[f32], d: usize, gate: &[f32]) {
    assert!(
        gate.len() == d && o.len() == x.len() && x.len() % d.max(1) == 0,
        "add_gated_f32: x and o must be rows x d and gate d long"
    );
    add_gated_body(x, o, d, gate)
}

crate::simd::simd_fn! {
    fn add_gated_body(x: &mut [f32], o: &[f32], d: usize, gate: &[f32]) {
        for (row, orow) in x.chunks_exact_mut(d).zip(o.chunks_exact(d)) {
            for i in 0..d {
                row[i] += orow[i] * gate[i];
            }
        }
    }
}
