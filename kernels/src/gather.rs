/// Copies rows `idx[i]` of `src` (`d` wide) to row `i` of `dst`. Panics on an index out of range.
pub fn gather_rows_f32(src: &[f32], d: usize, idx: &[u32], dst: &mut [f32]) {
    assert_eq!(
        dst.len(),
        idx.len() * d,
        "gather_rows_f32: dst is not idx.len() x d"
    );
    for (i, &r) in idx.iter().enumerate() {
        let r = r as usize;
        dst[i * d..(i + 1) * d].copy_from_slice(&src[r * d..(r + 1) * d]);
    }
}

/// Copies row `i` of `src` to row `idx[i]` of `dst`. Panics on an index out of range.
pub fn scatter_rows_f32(src: &[f32], d: usize, idx: &[u32], dst: &mut [f32]) {
    assert_eq!(
        src.len(),
        idx.len() * d,
        "scatter_rows_f32: src is not idx.len() x d"
    );
    for (i, &r) in idx.iter().enumerate() {
        let r = r as usize;
        dst[r * d..(r + 1) * d].copy_from_slice(&src[i * d..(i + 1) * d]);
    }
}
