//! Gate exports: per-request gate state, decisions, importances, the load-adaptive ε.

use flashdiff_gate::{Gate, GateConfig, GateError, LoadAdaptiveEpsilon};

use crate::error::{boundary, boundary_value, fd_status, Fail};
use crate::ptr;

fn from_gate(e: GateError) -> Fail {
    let status = match e {
        GateError::NoPatches | GateError::TooManyPatches(_) => fd_status::FD_ERR_PATCH_COUNT,
        GateError::BadLoad(_) => fd_status::FD_ERR_VALUE,
        GateError::BadEpsilon(_) | GateError::BadEta(_) | GateError::BadShare(_) => {
            fd_status::FD_ERR_CONFIG
        }
        GateError::BadImportance { .. }
        | GateError::BadChange { .. }
        | GateError::BadSignal { .. }
        | GateError::BadWhole(_) => fd_status::FD_ERR_VALUE,
        GateError::BadPatch { .. } => fd_status::FD_ERR_INDEX,
        GateError::NotActive { .. } => fd_status::FD_ERR_NOT_ACTIVE,
        GateError::BadBuffer { .. } => fd_status::FD_ERR_LENGTH,
        GateError::BadPace { .. } => fd_status::FD_ERR_CONFIG,
        GateError::PaceSpent { .. } => fd_status::FD_ERR_VALUE,
    };
    Fail::new(status, e.to_string())
}

/// Gate settings.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_gate_config {
    /// ε in [0, 1]: a patch whose normalised weight is below it is skipped. 0 never skips.
    pub epsilon: f32,
    /// η >= 0 added to every change before normalising.
    pub eta: f32,
    /// K: no patch is skipped more than K steps in a row.
    pub max_skip: u32,
}

/// Load-adaptive ε settings: ε is `eps_min` up to load `low`, `eps_base` at load 1 and
/// `eps_max` from load `high` on, linear in between.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_load_epsilon {
    /// ε with slack.
    pub eps_min: f32,
    /// ε at full load.
    pub eps_base: f32,
    /// ε under overload.
    pub eps_max: f32,
    /// Load at and below which ε is `eps_min`, in [0, 1).
    pub low: f32,
    /// Load at and above which ε is `eps_max`, > 1.
    pub high: f32,
}

/// Per-request gate for R patches. Opaque.
///
/// Thread safety: not safe for concurrent use; calls on one gate from several threads need
/// the caller's lock (different gates are independent).
pub struct fd_gate {
    inner: Gate,
}

/// The default gate settings (ε 0.05, η 1e-6, K 4).
#[no_mangle]
pub extern "C" fn fd_gate_config_default() -> fd_gate_config {
    let c = GateConfig::default();
    fd_gate_config {
        epsilon: c.epsilon,
        eta: c.eta,
        max_skip: c.max_skip,
    }
}

/// The default load-adaptive ε settings.
#[no_mangle]
pub extern "C" fn fd_load_epsilon_default() -> fd_load_epsilon {
    let d = LoadAdaptiveEpsilon::default();
    fd_load_epsilon {
        eps_min: d.eps_min,
        eps_base: d.eps_base,
        eps_max: d.eps_max,
        low: d.low,
        high: d.high,
    }
}

/// A gate for `patches` patches (1..=2^20, `FD_ERR_PATCH_COUNT` otherwise) right after a
/// partition. `cfg` NULL means the defaults.
///
/// # Safety
/// `cfg` NULL or readable; `gate_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_new(
    patches: u32,
    cfg: *const fd_gate_config,
    gate_out: *mut *mut fd_gate,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: cfg NULL or readable.
        let c = unsafe { cfg.as_ref() }
            .copied()
            .unwrap_or_else(|| fd_gate_config_default());
        if gate_out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "gate_out is NULL"));
        }
        let inner = Gate::new(
            patches as usize,
            GateConfig {
                epsilon: c.epsilon,
                eta: c.eta,
                max_skip: c.max_skip,
            },
        )
        .map_err(from_gate)?;
        // SAFETY: gate_out non-NULL and writable.
        unsafe { ptr::write_handle(gate_out, fd_gate { inner }, "gate_out") }
    })
}

/// Frees a gate and NULLs `*gate`; NULL is a no-op.
///
/// # Safety
/// `gate` NULL, or points to NULL or to a gate from this library not freed since.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_free(gate: *mut *mut fd_gate) {
    // SAFETY: the caller's contract is free_handle's.
    boundary_value((), || unsafe { ptr::free_handle(gate) })
}

/// Decides the next step: `active_out[i]` (`len` == patches) tells whether patch `i` runs;
/// `n_active_out` (may be NULL) gets how many run.
///
/// # Safety
/// `gate` live; `active_out` writable for `len` bools; `n_active_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_decide(
    gate: *mut fd_gate,
    active_out: *mut bool,
    len: usize,
    n_active_out: *mut u32,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        let (g, out) = unsafe {
            (
                ptr::handle_mut(gate, "gate")?,
                ptr::slice_mut(active_out, len, "active_out")?,
            )
        };
        let stats = g.inner.decide(out).map_err(from_gate)?;
        if !n_active_out.is_null() {
            // SAFETY: non-NULL, writable (caller contract).
            unsafe { ptr::write_out(n_active_out, stats.active, "n_active_out") }?;
        }
        Ok(())
    })
}

/// Feeds the refinement importance (mean self-attention mass inside the patch's block) of a
/// patch that ran in the step just decided.
///
/// # Safety
/// `gate` live.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_observe(
    gate: *mut fd_gate,
    patch: u32,
    importance: f32,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        let g = unsafe { ptr::handle_mut(gate, "gate") }?;
        g.inner
            .observe(patch as usize, importance)
            .map_err(from_gate)
    })
}

/// Feeds importances for all patches at once (`len` == patches); entries of skipped patches
/// are ignored.
///
/// # Safety
/// `gate` live; `importance` readable for `len` floats.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_observe_all(
    gate: *mut fd_gate,
    importance: *const f32,
    len: usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        let (g, v) = unsafe {
            (
                ptr::handle_mut(gate, "gate")?,
                ptr::slice(importance, len, "importance")?,
            )
        };
        g.inner.observe_all(v).map_err(from_gate)
    })
}

/// Sets ε for the following decisions (e.g. from `fd_load_epsilon_for`).
///
/// # Safety
/// `gate` live.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_set_epsilon(gate: *mut fd_gate, epsilon: f32) -> fd_status {
    boundary(|| {
        // SAFETY: `gate` is NULL or a live, unaliased gate (# Safety above), as handle_mut needs.
        unsafe { ptr::handle_mut(gate, "gate") }?
            .inner
            .set_epsilon(epsilon)
            .map_err(from_gate)
    })
}

/// Borrows the weights of the last decision (`*len_out` == patches, summing to 1), valid
/// until the next call on this gate.
///
/// # Safety
/// `gate` live; out-parameters writable.
#[no_mangle]
pub unsafe extern "C" fn fd_gate_weights(
    gate: *const fd_gate,
    weights_out: *mut *const f32,
    len_out: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        unsafe {
            let w = ptr::handle(gate, "gate")?.inner.weights();
            ptr::write_out(weights_out, w.as_ptr(), "weights_out")?;
            ptr::write_out(len_out, w.len(), "len_out")
        }
    })
}

/// ε for a load (demand / capacity; 1 = saturated), which must be finite and >= 0
/// (`FD_ERR_VALUE` otherwise). `cfg` NULL means the defaults.
///
/// # Safety
/// `cfg` NULL or readable; `epsilon_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_load_epsilon_for(
    cfg: *const fd_load_epsilon,
    load: f32,
    epsilon_out: *mut f32,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: cfg NULL or readable.
        let c = unsafe { cfg.as_ref() }
            .copied()
            .unwrap_or_else(|| fd_load_epsilon_default());
        let h = LoadAdaptiveEpsilon {
            eps_min: c.eps_min,
            eps_base: c.eps_base,
            eps_max: c.eps_max,
            low: c.low,
            high: c.high,
        };
        h.validate().map_err(|_| Fail::new(fd_status::FD_ERR_CONFIG, format!("load-epsilon settings {c:?} need 0 <= eps_min <= eps_base <= eps_max <= 1 and 0 <= low < 1 < high")))?;
        let eps = h.try_epsilon(load).map_err(from_gate)?;
        // SAFETY: this function's `# Safety` section: epsilon_out writable.
        unsafe { ptr::write_out(epsilon_out, eps, "epsilon_out") }
    })
}
