//! Partitioner exports: salient words, saliency maps, layouts, the adaptive-R controller.

use std::ffi::CStr;
use std::os::raw::c_char;

use flashdiff_partitioner::{
    partition_saliency, partition_uniform, saliency_map, salient_mask, GranularityConfig,
    GranularityController, Grid, PartitionError, PatchLayout,
};

use crate::error::{boundary, boundary_value, fd_status, Fail};
use crate::{bad, ptr};

fn from_partition(e: PartitionError) -> Fail {
    let status = match e {
        PartitionError::BadGrid { .. } => fd_status::FD_ERR_GRID,
        PartitionError::LengthMismatch { .. } => fd_status::FD_ERR_LENGTH,
        PartitionError::BadValue { .. } => fd_status::FD_ERR_VALUE,
        PartitionError::BadPatchCount { .. } => fd_status::FD_ERR_PATCH_COUNT,
        PartitionError::NoSalientTokens => fd_status::FD_ERR_NO_SALIENT,
        PartitionError::BadLayout(_) => fd_status::FD_ERR_INDEX,
        PartitionError::BadConfig(_) => fd_status::FD_ERR_CONFIG,
    };
    Fail::new(status, e.to_string())
}

/// A patch layout: R disjoint, balanced patches covering a grid. Opaque.
///
/// Thread safety: immutable after creation; any number of threads may read one at once
/// (`fd_layout_free` must not overlap them).
pub struct fd_layout {
    inner: PatchLayout,
}

/// Adaptive patch-count controller (bounded binary search on observed cost). Opaque.
///
/// Thread safety: not safe for concurrent use; calls from several threads need the
/// caller's lock.
pub struct fd_granularity {
    inner: GranularityController,
}

/// Marks each of `n_words` NUL-terminated words salient (content word, `true`) or not
/// (function word or punctuation) into `mask_out[0..n_words]`.
///
/// # Safety
/// `words` points to `n_words` pointers, each to a NUL-terminated string; `mask_out` is
/// writable for `n_words` bools. Either may be NULL only when `n_words` is 0.
#[no_mangle]
pub unsafe extern "C" fn fd_salient_mask(
    words: *const *const c_char,
    n_words: usize,
    mask_out: *mut bool,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: `words` holds n_words pointers.
        let ptrs = unsafe { ptr::slice(words, n_words, "words") }?;
        let mut owned = Vec::with_capacity(n_words);
        for (i, &p) in ptrs.iter().enumerate() {
            if p.is_null() {
                return Err(bad(fd_status::FD_ERR_NULL, format!("words[{i}] is NULL")));
            }
            // SAFETY: this function's `# Safety` section: each non-NULL word is NUL-terminated and readable.
            let s = unsafe { CStr::from_ptr(p) }.to_str().map_err(|e| {
                bad(
                    fd_status::FD_ERR_UTF8,
                    format!("words[{i}] is not UTF-8: {e}"),
                )
            })?;
            owned.push(s);
        }
        // SAFETY: this function's `# Safety` section: mask_out is writable for n_words bools.
        let out = unsafe { ptr::slice_mut(mask_out, n_words, "mask_out") }?;
        out.copy_from_slice(&salient_mask(&owned));
        Ok(())
    })
}

/// Saliency map of §4.1 into `saliency_out[0..tokens]`: the mean, over salient prompt words,
/// of the cross-attention `attn[token * prompt_len + word]` (`attn_len == tokens * prompt_len`,
/// averaged over heads and layers by the caller).
///
/// # Safety
/// `attn` readable for `attn_len` floats, `salient` for `prompt_len` bools, `saliency_out`
/// writable for `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn fd_saliency_map(
    attn: *const f32,
    attn_len: usize,
    tokens: usize,
    salient: *const bool,
    prompt_len: usize,
    saliency_out: *mut f32,
    out_len: usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: caller contract on each (pointer, length) pair.
        let (a, m, out) = unsafe {
            (
                ptr::slice(attn, attn_len, "attn")?,
                ptr::slice(salient, prompt_len, "salient")?,
                ptr::slice_mut(saliency_out, out_len, "saliency_out")?,
            )
        };
        if out.len() != tokens {
            return Err(bad(
                fd_status::FD_ERR_LENGTH,
                format!("saliency_out has length {out_len}, expected tokens = {tokens}"),
            ));
        }
        let s = saliency_map(a, tokens, m).map_err(from_partition)?;
        out.copy_from_slice(&s);
        Ok(())
    })
}

fn grid(frames: u32, height: u32, width: u32) -> Result<Grid, Fail> {
    Grid::new(frames, height, width).map_err(from_partition)
}

/// Partitions a `frames x height x width` grid into `r` patches from its saliency map
/// (`saliency_len == frames * height * width`); `*layout_out` receives a new layout.
///
/// # Safety
/// `saliency` readable for `saliency_len` floats; `layout_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_partition_saliency(
    frames: u32,
    height: u32,
    width: u32,
    saliency: *const f32,
    saliency_len: usize,
    r: u32,
    layout_out: *mut *mut fd_layout,
) -> fd_status {
    boundary(|| {
        let g = grid(frames, height, width)?;
        // SAFETY: caller contract on (saliency, saliency_len).
        let s = unsafe { ptr::slice(saliency, saliency_len, "saliency") }?;
        if layout_out.is_null() {
            return Err(bad(fd_status::FD_ERR_NULL, "layout_out is NULL"));
        }
        let inner = partition_saliency(g, s, r).map_err(from_partition)?;
        // SAFETY: layout_out non-NULL and writable (caller contract).
        unsafe { ptr::write_handle(layout_out, fd_layout { inner }, "layout_out") }
    })
}

/// Uniform layout (balanced recursive bisection) of a grid into `r` patches: the NaivePatch /
/// DistriFusion baseline and the fallback when no saliency exists. A grid holds at most
/// 2^24 tokens (`FD_ERR_GRID` beyond).
///
/// # Safety
/// `layout_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_partition_uniform(
    frames: u32,
    height: u32,
    width: u32,
    r: u32,
    layout_out: *mut *mut fd_layout,
) -> fd_status {
    boundary(|| {
        let g = grid(frames, height, width)?;
        if layout_out.is_null() {
            return Err(bad(fd_status::FD_ERR_NULL, "layout_out is NULL"));
        }
        let inner = partition_uniform(g, r).map_err(from_partition)?;
        // SAFETY: layout_out non-NULL and writable (caller contract).
        unsafe { ptr::write_handle(layout_out, fd_layout { inner }, "layout_out") }
    })
}

/// Frees a layout and sets `*layout` to NULL. NULL or `*layout == NULL`: no-op.
///
/// # Safety
/// `layout` is NULL or points to NULL or to a layout from this library not freed since.
/// Pointers borrowed from the layout (`fd_layout_patch_of`, ...) die with it.
#[no_mangle]
pub unsafe extern "C" fn fd_layout_free(layout: *mut *mut fd_layout) {
    // SAFETY: the caller's contract is free_handle's.
    boundary_value((), || unsafe { ptr::free_handle(layout) })
}

/// Patch count R of a layout (0 when `layout` is NULL).
///
/// # Safety
/// `layout` is NULL or a live layout.
#[no_mangle]
pub unsafe extern "C" fn fd_layout_patches(layout: *const fd_layout) -> u32 {
    boundary_value(0, || {
        // SAFETY: `layout` is NULL or a live layout (# Safety above); as_ref maps NULL to None.
        unsafe { layout.as_ref() }.map_or(0, |l| l.inner.patches())
    })
}

/// Token count of a layout's grid (0 when `layout` is NULL).
///
/// # Safety
/// `layout` is NULL or a live layout.
#[no_mangle]
pub unsafe extern "C" fn fd_layout_tokens(layout: *const fd_layout) -> u32 {
    boundary_value(0, || {
        // SAFETY: `layout` is NULL or a live layout (# Safety above); as_ref maps NULL to None.
        unsafe { layout.as_ref() }.map_or(0, |l| l.inner.grid().tokens())
    })
}

/// Borrows the token -> patch map (`*len_out` entries, raster order). The pointer stays valid
/// until the layout is freed; nothing is copied.
///
/// # Safety
/// `layout` live; `map_out`, `len_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_layout_patch_of(
    layout: *const fd_layout,
    map_out: *mut *const u32,
    len_out: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live layout; out-parameters writable.
        unsafe {
            let l = ptr::handle(layout, "layout")?;
            let m = l.inner.patch_of();
            ptr::write_out(map_out, m.as_ptr(), "map_out")?;
            ptr::write_out(len_out, m.len(), "len_out")
        }
    })
}

/// Borrows the ascending token list of patch `patch` (`*len_out` entries), valid until the
/// layout is freed.
///
/// # Safety
/// `layout` live; `tokens_out`, `len_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_layout_patch_tokens(
    layout: *const fd_layout,
    patch: u32,
    tokens_out: *mut *const u32,
    len_out: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live layout; out-parameters writable.
        unsafe {
            let l = ptr::handle(layout, "layout")?;
            if patch >= l.inner.patches() {
                return Err(bad(
                    fd_status::FD_ERR_INDEX,
                    format!(
                        "patch {patch} out of range: the layout has {} patches",
                        l.inner.patches()
                    ),
                ));
            }
            let t = l.inner.patch_tokens(patch);
            ptr::write_out(tokens_out, t.as_ptr(), "tokens_out")?;
            ptr::write_out(len_out, t.len(), "len_out")
        }
    })
}

/// A controller choosing R in `[r_min, r_max]` (the design's defaults: 2 and 16) by bounded
/// binary search over observed per-request cost, averaging `samples_per_probe` requests per
/// probe (0 means the default, 3).
///
/// # Safety
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_granularity_new(
    r_min: u32,
    r_max: u32,
    samples_per_probe: u32,
    out: *mut *mut fd_granularity,
) -> fd_status {
    boundary(|| {
        let mut cfg = GranularityConfig {
            r_min,
            r_max,
            ..Default::default()
        };
        if samples_per_probe > 0 {
            cfg.samples_per_probe = samples_per_probe;
        }
        if out.is_null() {
            return Err(bad(fd_status::FD_ERR_NULL, "out is NULL"));
        }
        let inner = GranularityController::new(cfg).map_err(from_partition)?;
        // SAFETY: out non-NULL and writable.
        unsafe { ptr::write_handle(out, fd_granularity { inner }, "out") }
    })
}

/// Frees a controller and NULLs `*g`; NULL is a no-op.
///
/// # Safety
/// As `fd_layout_free`.
#[no_mangle]
pub unsafe extern "C" fn fd_granularity_free(g: *mut *mut fd_granularity) {
    // SAFETY: the caller's contract is free_handle's.
    boundary_value((), || unsafe { ptr::free_handle(g) })
}

/// The R to use for the next request.
///
/// # Safety
/// `g` live; `r_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_granularity_current(
    g: *const fd_granularity,
    r_out: *mut u32,
) -> fd_status {
    // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
    // writable outputs), which is what the ptr helpers used here require.
    boundary(|| unsafe { ptr::write_out(r_out, ptr::handle(g, "g")?.inner.current(), "r_out") })
}

/// Feeds the cost (lower is better; e.g. latency x (1 + w x quality drop)) of a request served
/// with `r` patches; `*used_out` (may be NULL) tells whether it counted (observations for an R
/// other than the current one are ignored).
///
/// # Safety
/// `g` live; `used_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_granularity_observe(
    g: *mut fd_granularity,
    r: u32,
    cost: f64,
    used_out: *mut bool,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        let g = unsafe { ptr::handle_mut(g, "g") }?;
        let used = g
            .inner
            .observe(r, cost)
            .map_err(|e| Fail::new(fd_status::FD_ERR_VALUE, e.to_string()))?;
        if !used_out.is_null() {
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { ptr::write_out(used_out, used, "used_out") }?;
        }
        Ok(())
    })
}
