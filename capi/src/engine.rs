//! Engine exports: create an engine over the built-in model (or given weights), submit
//! requests, advance it a round at a time or run it to completion, poll, read each image and
//! report, cancel, free. The engine runs on its own thread (a [`Mailbox`] over the
//! runtime's service); the handle is shared between threads, and every call other than
//! `fd_engine_free` may come from any of them at any time.

use std::ffi::CStr;
use std::os::raw::c_char;
use std::path::PathBuf;
use std::time::Duration;

use flashdiff_runtime::engine::{
    default_weights, Engine, EngineError, LayoutKind, Mode, RequestConfig, Reuse,
};
use flashdiff_runtime::service::{Mailbox, MailboxError, Standing};

use flashdiff_runtime::schema::{Front, RequestFields};

use crate::error::{boundary, boundary_value, fd_status, Fail};
use crate::ptr;

/// Engine settings.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_engine_config {
    /// Model (NUL-terminated path): a built-in family's safetensors file (TinyDiT, TinyVideo,
    /// TinyAudio) or a TinyFLUX folder; NULL for the shipped built-in image model.
    pub weights: *const c_char,
    /// Workers (1..=1024).
    pub workers: u32,
    /// Run workers as processes (requires the `flashdiff` executable at `worker_exe`).
    pub processes: bool,
    /// Path of the `flashdiff` executable that workers run; NULL when `processes` is false.
    pub worker_exe: *const c_char,
}

/// Per-request settings (see `flashdiff generate --help`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_request_config {
    /// Total steps (2..=1000).
    pub steps: u32,
    /// Warm-up steps (>= 1, below steps).
    pub warmup: u32,
    /// Patch count; 0 lets the adaptive controller choose.
    pub patches: u32,
    /// Change budget ε in [0, 1]: a step is computed once the latent's accumulated relative
    /// change of the model's first-block input since the last computed step (the patches'
    /// changes weighted by their share of it) reaches this, or one patch's reaches twice this.
    pub epsilon: f32,
    /// Longest run of skips per patch.
    pub max_skip: u32,
    /// Noise seed.
    pub seed: u64,
    /// An `fd_mode`: how the request is executed (the header's `enum fd_mode` is generated
    /// from the runtime's list of modes).
    pub mode: u32,
    /// 0 = saliency patches, 1 = uniform patches.
    pub layout: u32,
    /// Threshold of mode 4.
    pub cache_threshold: f32,
    /// Priority 0..7, higher first.
    pub priority: u8,
    /// Reused values in modes 0, 1 and 4 (other patches' K/V, skipped patches' and skipped
    /// steps' velocity): 0 = extrapolated along their slope (default), 1 = as last computed
    /// (the paper's rule; whole-step caching as TeaCache runs it). Second-order forecasting
    /// is the JSON field `"reuse": "extrapolate2"` of `fd_engine_submit_json`, the resume
    /// correction `"corrected"` / `"corrected2"`.
    pub reuse: u32,
    /// Monotasks per step: a step's active patches run packed into at most this many
    /// forwards; patches of one forward see each other's fresh K/V. Default 1 (the output
    /// is the same for any worker count); 0 = the engine's worker count; at least the patch
    /// count gives every patch its own.
    pub monotasks: u32,
}

/// Where a request stands.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fd_request_state {
    /// Never submitted, or released.
    FD_REQUEST_UNKNOWN = 0,
    /// Submitted, not finished: call `fd_engine_run`.
    FD_REQUEST_PENDING = 1,
    /// Finished: read it with `fd_engine_result`.
    FD_REQUEST_DONE = 2,
    /// Failed or cancelled: `fd_engine_result` returns the reason.
    FD_REQUEST_FAILED = 3,
}

/// A finished request's report (times in milliseconds).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fd_report {
    /// Request id.
    pub id: u64,
    /// Total steps.
    pub steps: u32,
    /// Warm-up steps.
    pub warmup: u32,
    /// Patches.
    pub patches: u32,
    /// Patch-steps after the warm-up if nothing were skipped.
    pub patch_steps: u64,
    /// Patch-steps computed.
    pub computed: u64,
    /// Submit to completion.
    pub latency_ms: f64,
    /// Warm-up.
    pub warmup_ms: f64,
    /// Partition.
    pub partition_ms: f64,
    /// Gate.
    pub gate_ms: f64,
    /// Scheduler calls.
    pub schedule_ms: f64,
    /// Patch-step compute.
    pub compute_ms: f64,
    /// Waiting and bookkeeping.
    pub queue_ms: f64,
}

/// The serving engine. Opaque.
///
/// Thread safety: one handle may be used from any number of threads at once for every
/// function except `fd_engine_free`, which must not overlap any other call on the handle.
/// The engine runs on its own thread from the first submit; `fd_engine_run` and
/// `fd_engine_step` wait for it.
pub struct fd_engine {
    pub(crate) inner: Mailbox,
    /// Side of the model's square image, in pixels.
    pub(crate) side: u32,
}

pub(crate) fn from_mailbox(e: MailboxError) -> Fail {
    let status = match &e {
        MailboxError::Duplicate(_) => fd_status::FD_ERR_DUPLICATE_REQUEST,
        MailboxError::Finished(_) => fd_status::FD_ERR_FINISHED,
        MailboxError::Pending(_) => fd_status::FD_ERR_NOT_IDLE,
        MailboxError::Unknown(_) => fd_status::FD_ERR_UNKNOWN_REQUEST,
        MailboxError::Engine(e) => return from_engine_ref(e),
    };
    Fail::new(status, e.to_string())
}

fn from_engine(e: EngineError) -> Fail {
    from_engine_ref(&e)
}

fn from_engine_ref(e: &EngineError) -> Fail {
    let status = match e {
        EngineError::Weights(_) => fd_status::FD_ERR_CONFIG,
        EngineError::Prompt(_) => fd_status::FD_ERR_VALUE,
        EngineError::Model(_) => fd_status::FD_ERR_VALUE,
        EngineError::Config(_)
        | EngineError::Io { .. }
        | EngineError::Checkpoint { .. }
        | EngineError::Stopped
        | EngineError::Invalid { .. }
        | EngineError::Cancelled(_)
        | EngineError::WorkerLost(_)
        | EngineError::Internal(_) => fd_status::FD_ERR_CONFIG,
        EngineError::Scheduler(flashdiff_scheduler::SchedError::Full { .. }) => {
            fd_status::FD_ERR_FULL
        }
        _ => fd_status::FD_ERR_VALUE,
    };
    Fail::new(status, e.to_string())
}

/// Defaults: built-in model, one in-process worker.
#[no_mangle]
pub extern "C" fn fd_engine_config_default() -> fd_engine_config {
    fd_engine_config {
        weights: std::ptr::null(),
        workers: 1,
        processes: false,
        worker_exe: std::ptr::null(),
    }
}

/// Defaults: 50 steps, 5 warm-up, adaptive patches, ε 0.1, K 3, seed 0, FlashDiff, priority 0,
/// extrapolated reuse, one monotask per step. The warm-up is the paper's; the built-in sound
/// model (TinyAudio) is measured to want 12, which `flashdiff` uses for it: set `warmup` to
/// 12 when serving it.
#[no_mangle]
pub extern "C" fn fd_request_config_default() -> fd_request_config {
    let d = RequestConfig::default();
    fd_request_config {
        steps: d.steps,
        warmup: d.warmup,
        patches: 0,
        epsilon: d.epsilon,
        max_skip: d.max_skip,
        seed: d.seed,
        mode: 0,
        priority: d.priority,
        layout: 0,
        cache_threshold: d.cache_threshold,
        reuse: u32::from(d.reuse == Reuse::Stale),
        monotasks: d.monotasks.unwrap_or(0),
    }
}

/// Reads a C string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string readable for the duration of the call.
unsafe fn c_str(p: *const c_char, what: &str) -> Result<Option<String>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the function's contract: non-NULL `p` is NUL-terminated and readable.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|e| Fail::new(fd_status::FD_ERR_UTF8, format!("{what} is not UTF-8: {e}")))
}

/// Creates an engine; `cfg` NULL means the defaults.
///
/// # Safety
/// `cfg` NULL or readable, its strings NULL or NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_new(
    cfg: *const fd_engine_config,
    out: *mut *mut fd_engine,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: cfg NULL or readable.
        let c = unsafe { cfg.as_ref() }
            .copied()
            .unwrap_or_else(|| fd_engine_config_default());
        if out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "out is NULL"));
        }
        // SAFETY: the config's strings are NULL or NUL-terminated (this function's contract).
        let (weights, exe) = unsafe {
            (
                c_str(c.weights, "weights")?,
                c_str(c.worker_exe, "worker_exe")?,
            )
        };
        let weights = weights.map(PathBuf::from).unwrap_or_else(default_weights);
        let inner = if c.processes {
            let exe = exe.ok_or_else(|| {
                Fail::new(
                    fd_status::FD_ERR_NULL,
                    "worker_exe is NULL but processes is true",
                )
            })?;
            Engine::builder(&weights)
                .workers(c.workers)
                .processes(&PathBuf::from(exe), &flashdiff_runtime::engine::state_dir())
                .build()
        } else {
            Engine::new(&weights, c.workers)
        }
        .map_err(from_engine)?;
        let kind = inner.model().kind();
        if kind != flashdiff_runtime::models::Kind::Image {
            return Err(Fail::new(
                fd_status::FD_ERR_CONFIG,
                format!(
                    "the C ABI returns square RGB images; this model makes a {} (use the \
                     flashdiff command for video and sound)",
                    kind.name()
                ),
            ));
        }
        // The image a request returns: the model decodes a latent of its own grid.
        let dims = inner.model().dims().clone();
        let side = inner
            .model()
            .decode(&vec![0.0; dims.grid.tokens() * dims.channels])
            .map(|s| ((s.rgb.len() / 3) as f64).sqrt().round() as u32)
            .map_err(|e| {
                Fail::new(
                    fd_status::FD_ERR_CONFIG,
                    format!("model cannot decode: {e}"),
                )
            })?;
        let inner = Mailbox::start(inner).map_err(from_engine)?;
        // SAFETY: out non-NULL and writable (checked above; this function's contract).
        unsafe { ptr::write_handle(out, fd_engine { inner, side }, "out") }
    })
}

/// Frees an engine (cancelling its pending requests, stopping its worker processes) and
/// NULLs `*e`; NULL is a no-op.
///
/// # Safety
/// `e` NULL, or points to NULL or to an engine from this library not freed since.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_free(e: *mut *mut fd_engine) {
    // SAFETY: the caller's contract is free_handle's.
    boundary_value((), || unsafe { ptr::free_handle(e) })
}

/// Submits a request; the prompt and settings are checked now (`cfg` NULL: defaults).
///
/// # Safety
/// `e` live; `prompt` NUL-terminated; `cfg` NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_submit(
    e: *const fd_engine,
    id: u64,
    prompt: *const c_char,
    cfg: *const fd_request_config,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section (live engine, readable config, string).
        let (e, c, prompt) = unsafe {
            (
                ptr::handle(e, "engine")?,
                cfg.as_ref()
                    .copied()
                    .unwrap_or_else(|| fd_request_config_default()),
                c_str(prompt, "prompt")?,
            )
        };
        let prompt = prompt.ok_or_else(|| Fail::new(fd_status::FD_ERR_NULL, "prompt is NULL"))?;
        submit(e, id, &prompt, &c)
    })
}

/// [`fd_engine_submit`] with the prompt as `prompt_len` bytes of UTF-8 at `prompt` (no NUL
/// terminator needed; a NUL byte inside is an error, not the end of the prompt).
///
/// # Safety
/// `e` live; `prompt` readable for `prompt_len` bytes (or NULL with 0); `cfg` NULL or
/// readable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_submit_n(
    e: *const fd_engine,
    id: u64,
    prompt: *const c_char,
    prompt_len: usize,
    cfg: *const fd_request_config,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section (live engine, readable bytes, config).
        let (e, c, bytes) = unsafe {
            (
                ptr::handle(e, "engine")?,
                cfg.as_ref()
                    .copied()
                    .unwrap_or_else(|| fd_request_config_default()),
                ptr::slice(prompt.cast::<u8>(), prompt_len, "prompt")?,
            )
        };
        if let Some(at) = bytes.iter().position(|&b| b == 0) {
            return Err(Fail::new(
                fd_status::FD_ERR_VALUE,
                format!("prompt has a NUL byte at offset {at} of {prompt_len}"),
            ));
        }
        let prompt = std::str::from_utf8(bytes)
            .map_err(|e| Fail::new(fd_status::FD_ERR_UTF8, format!("prompt is not UTF-8: {e}")))?;
        submit(e, id, prompt, &c)
    })
}

/// Submits a request given as one JSON object of the request schema's fields, the same
/// fields and errors as JSON lines and HTTP: "prompt" (required), "steps", "warmup",
/// "patches", "epsilon", "adaptive_epsilon", "max_skip", "budget" (a work budget in (0, 1]:
/// the request computes at most that fraction of full computation's work), "seed", "mode",
/// "layout", "reuse", "monotasks", "cache_threshold", "priority", "deadline_ms". Fields
/// left out take [`fd_request_config_default`]'s values, except the warm-up: left out, it is
/// the model's own, fitted to the steps (as over HTTP and JSON lines). It is the way to set
/// what `fd_request_config` has no field for. `json_len` bytes of UTF-8 at `json`; "id",
/// "model" and the OpenAI image fields are refused (the id is the argument, the model the
/// engine's).
///
/// # Safety
/// `e` live; `json` readable for `json_len` bytes (or NULL with 0).
#[no_mangle]
pub unsafe extern "C" fn fd_engine_submit_json(
    e: *const fd_engine,
    id: u64,
    json: *const c_char,
    json_len: usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section (live engine, readable bytes).
        let (e, bytes) = unsafe {
            (
                ptr::handle(e, "engine")?,
                ptr::slice(json.cast::<u8>(), json_len, "json")?,
            )
        };
        let bad = |msg: String| Fail::new(fd_status::FD_ERR_VALUE, msg);
        let f = RequestFields::from_json(bytes).map_err(|e| bad(e.to_string()))?;
        let (prompt, rc) = f
            .resolve(
                Front::C,
                &**e.inner.service().model(),
                &RequestConfig::default(),
                None,
            )
            .map_err(from_engine)?;
        submit_config(e, id, &prompt, rc)
    })
}

fn submit(e: &fd_engine, id: u64, prompt: &str, c: &fd_request_config) -> Result<(), Fail> {
    {
        let mode = Mode::of_code(c.mode).ok_or_else(|| {
            let mut codes: Vec<(u32, &str)> =
                Mode::ALL.iter().map(|m| (m.code(), m.name())).collect();
            codes.sort_unstable();
            let list: Vec<String> = codes.iter().map(|(c, n)| format!("{c} ({n})")).collect();
            Fail::new(
                fd_status::FD_ERR_VALUE,
                format!("mode {}: must be one of {}", c.mode, list.join(", ")),
            )
        })?;
        let layout = match c.layout {
            0 => LayoutKind::Saliency,
            1 => LayoutKind::Uniform,
            l => {
                return Err(Fail::new(
                    fd_status::FD_ERR_VALUE,
                    format!("layout {l}: must be 0 (saliency) or 1 (uniform)"),
                ))
            }
        };
        let reuse = match c.reuse {
            0 => Reuse::Extrapolate,
            1 => Reuse::Stale,
            k => {
                return Err(Fail::new(
                    fd_status::FD_ERR_VALUE,
                    format!("reuse {k}: must be 0 (extrapolated) or 1 (stale)"),
                ))
            }
        };
        let rc = RequestConfig {
            steps: c.steps,
            warmup: c.warmup,
            patches: (c.patches > 0).then_some(c.patches),
            epsilon: c.epsilon,
            // Not in the C request struct yet (adding a field changes its layout).
            adaptive_epsilon: false,
            max_skip: c.max_skip,
            // Not in the C request struct (its layout is fixed): fd_engine_submit_json
            // takes it.
            budget: None,
            seed: c.seed,
            mode,
            priority: c.priority,
            layout,
            cache_threshold: c.cache_threshold,
            ras_ratio: RequestConfig::default().ras_ratio,
            auto_dispersion: RequestConfig::default().auto_dispersion,
            reuse,
            monotasks: (c.monotasks > 0).then_some(c.monotasks),
            // Not in the C request struct yet either (same reason).
            deadline: None,
        };
        submit_config(e, id, prompt, rc)
    }
}

fn submit_config(e: &fd_engine, id: u64, prompt: &str, rc: RequestConfig) -> Result<(), Fail> {
    e.inner.submit(id, prompt, rc).map_err(from_mailbox)
}

/// Waits until no request is pending, including requests other threads submit meanwhile
/// (the results wait for `fd_engine_result`).
///
/// # Safety
/// `e` live.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_run(e: *const fd_engine) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine.
        let e = unsafe { ptr::handle(e, "engine") }?;
        e.inner.wait_all();
        Ok(())
    })
}

/// Waits until the engine completes its next scheduling round (one monotask per busy
/// worker: milliseconds for the built-in model) or `timeout_ms` (at most 10000) passes, and
/// returns at once when nothing is pending: a serving loop calls it between admitting new
/// requests. `timeout_ms` 0 waits for the round, however long it takes. `pending_out` (NULL
/// to skip) gets the requests still pending; finished ones are ready for
/// `fd_engine_result`.
///
/// # Safety
/// `e` live; `pending_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_step(
    e: *const fd_engine,
    timeout_ms: u32,
    pending_out: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine.
        let e = unsafe { ptr::handle(e, "engine") }?;
        if timeout_ms > 10_000 {
            return Err(Fail::new(
                fd_status::FD_ERR_VALUE,
                format!("timeout_ms {timeout_ms}: at most 10000"),
            ));
        }
        let wait = match timeout_ms {
            0 => Duration::from_secs(3600),
            t => Duration::from_millis(t.into()),
        };
        let n = e.inner.wait_round(wait);
        if !pending_out.is_null() {
            // SAFETY: pending_out non-NULL and writable (this function's contract).
            unsafe { ptr::write_out(pending_out, n, "pending_out") }?;
        }
        Ok(())
    })
}

/// Cancels a pending request (from any thread, also while another runs the engine); it
/// then reads as failed. A request that already finished gets `FD_ERR_FINISHED`.
///
/// # Safety
/// `e` live.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_cancel(e: *const fd_engine, id: u64) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine.
        let e = unsafe { ptr::handle(e, "engine") }?;
        e.inner.cancel(id).map_err(from_mailbox)
    })
}

/// Where request `id` stands.
///
/// # Safety
/// `e` live; `state_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_poll(
    e: *const fd_engine,
    id: u64,
    state_out: *mut fd_request_state,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine, writable output.
        let e = unsafe { ptr::handle(e, "engine") }?;
        let s = match e.inner.standing(id) {
            Standing::Done => fd_request_state::FD_REQUEST_DONE,
            Standing::Failed => fd_request_state::FD_REQUEST_FAILED,
            Standing::Pending => fd_request_state::FD_REQUEST_PENDING,
            Standing::Unknown => fd_request_state::FD_REQUEST_UNKNOWN,
        };
        // SAFETY: as above.
        unsafe { ptr::write_out(state_out, s, "state_out") }
    })
}

/// Image side of the engine's model, read from the model when the engine was created (the
/// image is `side x side x 3` floats in [0, 1]).
///
/// # Safety
/// `e` live; `side_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_image_side(
    e: *const fd_engine,
    side_out: *mut u32,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section.
        unsafe {
            let e = ptr::handle(e, "engine")?;
            ptr::write_out(side_out, e.side, "side_out")
        }
    })
}
