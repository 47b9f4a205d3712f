//! Scheduler exports: requests, steps, workers asking for monotasks, completions, load.

use flashdiff_scheduler::{Completion, SchedError, Scheduler, SchedulerConfig, Tag};

use crate::error::{boundary, boundary_value, fd_status, Fail};
use crate::ptr;

fn from_sched(e: SchedError) -> Fail {
    let status = match e {
        SchedError::BadConfig(_) => fd_status::FD_ERR_CONFIG,
        SchedError::Full { .. } => fd_status::FD_ERR_FULL,
        SchedError::DuplicateRequest(_) => fd_status::FD_ERR_DUPLICATE_REQUEST,
        SchedError::UnknownRequest(_) => fd_status::FD_ERR_UNKNOWN_REQUEST,
        SchedError::BadPriority(_) | SchedError::BadCost(_) | SchedError::BadDeadline(_) => {
            fd_status::FD_ERR_VALUE
        }
        SchedError::Barrier { .. } => fd_status::FD_ERR_BARRIER,
        SchedError::BadPatches(_) => fd_status::FD_ERR_BAD_PATCHES,
        SchedError::UnknownWorker(_) => fd_status::FD_ERR_UNKNOWN_WORKER,
        SchedError::WorkerDead(_) => fd_status::FD_ERR_WORKER_DEAD,
        SchedError::Busy(_) => fd_status::FD_ERR_BUSY,
        SchedError::NotRunning { .. } => fd_status::FD_ERR_NOT_RUNNING,
        SchedError::NotIdle(_) => fd_status::FD_ERR_NOT_IDLE,
    };
    Fail::new(status, e.to_string())
}

/// Scheduler settings (costs in one unit, e.g. seconds of device time).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_scheduler_config {
    /// Workers at start.
    pub workers: u32,
    /// Requests admitted at once.
    pub max_requests: usize,
    /// Monotasks queued at once (back-pressure).
    pub max_queued: usize,
    /// Fixed cost of a worker taking a monotask planned for another worker.
    pub switch_cost: f64,
    /// Cost of moving a request's state to a worker that does not hold it.
    pub transfer_cost: f64,
    /// Executions of one monotask before its request fails.
    pub max_attempts: u32,
}

/// Identity of a monotask's result: (request, step, patch); `patch == FD_WARMUP_PATCH` for
/// a warm-up (step 0).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fd_tag {
    /// Request id.
    pub request: u64,
    /// Step.
    pub step: u32,
    /// Patch.
    pub patch: u32,
}

/// The `patch` of a warm-up monotask's tag.
pub const FD_WARMUP_PATCH: u32 = u32::MAX;

/// A monotask handed to a worker.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_assignment {
    /// What to run.
    pub tag: fd_tag,
    /// Its priority (higher first, 0..7).
    pub priority: u8,
    /// Expected cost.
    pub cost: f64,
    /// Extra cost of this dispatch (state transfer, switch).
    pub overhead: f64,
    /// Earlier executions (after failures or lost workers).
    pub attempt: u32,
}

/// A patch of a step to run, with its expected cost.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_patch_cost {
    /// Patch index.
    pub patch: u32,
    /// Expected cost (e.g. proportional to its token count).
    pub cost: f64,
}

/// What a completion did.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fd_completion {
    /// A patch-step done; its step has others outstanding.
    FD_COMPLETION_PATCH = 0,
    /// The warm-up is done: partition and open the first step.
    FD_COMPLETION_WARMUP_DONE = 1,
    /// The step is done: run the gate and open the next step, or finish.
    FD_COMPLETION_STEP_DONE = 2,
    /// Already applied, from a lost worker, or for a cancelled request: ignored.
    FD_COMPLETION_STALE = 3,
    /// The monotask failed too often: the request was dropped.
    FD_COMPLETION_REQUEST_FAILED = 4,
}

/// Load snapshot.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fd_load {
    /// Admitted requests.
    pub requests: usize,
    /// Queued monotasks.
    pub queued: usize,
    /// Running monotasks.
    pub running: usize,
    /// Alive workers.
    pub alive: usize,
    /// Outstanding cost per alive worker.
    pub backlog: f64,
}

/// The Patch Scheduler. Opaque.
///
/// Thread safety: not safe for concurrent use; calls on one scheduler from several threads
/// (e.g. workers completing monotasks) need the caller's lock.
pub struct fd_scheduler {
    inner: Scheduler,
}

/// Default scheduler settings (1 worker, 1024 requests, 2^20 queued, no switch costs,
/// 3 attempts).
#[no_mangle]
pub extern "C" fn fd_scheduler_config_default() -> fd_scheduler_config {
    let c = SchedulerConfig::default();
    fd_scheduler_config {
        workers: c.workers,
        max_requests: c.max_requests,
        max_queued: c.max_queued,
        switch_cost: c.switch_cost,
        transfer_cost: c.transfer_cost,
        max_attempts: c.max_attempts,
    }
}

/// A scheduler; `cfg` NULL means the defaults.
///
/// # Safety
/// `cfg` NULL or readable; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_new(
    cfg: *const fd_scheduler_config,
    out: *mut *mut fd_scheduler,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: cfg NULL or readable.
        let c = unsafe { cfg.as_ref() }
            .copied()
            .unwrap_or_else(|| fd_scheduler_config_default());
        if out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "out is NULL"));
        }
        let inner = Scheduler::new(SchedulerConfig {
            workers: c.workers,
            max_requests: c.max_requests,
            max_queued: c.max_queued,
            switch_cost: c.switch_cost,
            transfer_cost: c.transfer_cost,
            max_attempts: c.max_attempts,
            record_events: false,
            order: Default::default(),
            // A C caller completes what it dispatched before asking again (the ABI's
            // contract since its first version); dispatching ahead is the engine's.
            depth: 1,
        })
        .map_err(from_sched)?;
        // SAFETY: out non-NULL and writable.
        unsafe { ptr::write_handle(out, fd_scheduler { inner }, "out") }
    })
}

/// Frees a scheduler and NULLs `*s`; NULL is a no-op.
///
/// # Safety
/// `s` NULL, or points to NULL or to a scheduler from this library not freed since.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_free(s: *mut *mut fd_scheduler) {
    // SAFETY: the caller's contract is free_handle's.
    boundary_value((), || unsafe { ptr::free_handle(s) })
}

/// Runs `f` on the live scheduler behind `s`.
///
/// # Safety
/// `s` NULL or live and unaliased during the call.
unsafe fn with<R>(
    s: *mut fd_scheduler,
    f: impl FnOnce(&mut Scheduler) -> Result<R, SchedError>,
) -> Result<R, Fail> {
    // SAFETY: this function's contract.
    let s = unsafe { ptr::handle_mut(s, "scheduler") }?;
    f(&mut s.inner).map_err(from_sched)
}

/// Admits a request (priority 0..7, higher first) and queues its warm-up monotask.
/// `FD_ERR_FULL`: admission control refused; nothing changed.
///
/// # Safety
/// `s` live.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_submit(
    s: *mut fd_scheduler,
    request: u64,
    priority: u8,
    warmup_cost: f64,
) -> fd_status {
    // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
    // writable outputs), which is what the ptr helpers used here require.
    boundary(|| unsafe { with(s, |s| s.submit(request, priority, warmup_cost)) })
}

/// Opens `step` of a request with its active patches, after its previous step completed.
///
/// # Safety
/// `s` live; `patches` readable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_submit_step(
    s: *mut fd_scheduler,
    request: u64,
    step: u32,
    patches: *const fd_patch_cost,
    n: usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: caller contract on (patches, n).
        let p = unsafe { ptr::slice(patches, n, "patches") }?;
        let list: Vec<(u32, f64)> = p.iter().map(|p| (p.patch, p.cost)).collect();
        // SAFETY: this function's `# Safety` section: s live.
        unsafe { with(s, |s| s.submit_step(request, step, &list)) }
    })
}

/// Worker `worker` asks for its next monotask: `*has_out` is false when nothing is worth
/// running now; otherwise `*assignment_out` holds it.
///
/// # Safety
/// `s` live; out-parameters writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_next(
    s: *mut fd_scheduler,
    worker: u32,
    assignment_out: *mut fd_assignment,
    has_out: *mut bool,
) -> fd_status {
    boundary(|| {
        if assignment_out.is_null() || has_out.is_null() {
            return Err(Fail::new(
                fd_status::FD_ERR_NULL,
                "assignment_out or has_out is NULL",
            ));
        }
        // SAFETY: this function's `# Safety` section: s live.
        let a = unsafe { with(s, |s| s.next(worker)) }?;
        // SAFETY: both out-parameters non-NULL and writable (caller contract).
        unsafe {
            ptr::write_out(has_out, a.is_some(), "has_out")?;
            if let Some(a) = a {
                let t = a.task.tag;
                ptr::write_out(
                    assignment_out,
                    fd_assignment {
                        tag: fd_tag {
                            request: t.request,
                            step: t.step,
                            patch: t.monotask,
                        },
                        priority: a.task.priority,
                        cost: a.task.cost,
                        overhead: a.overhead,
                        attempt: a.task.attempt,
                    },
                    "assignment_out",
                )?;
            }
        }
        Ok(())
    })
}

fn completion(c: Completion) -> fd_completion {
    match c {
        Completion::Patch => fd_completion::FD_COMPLETION_PATCH,
        Completion::WarmupDone(_) => fd_completion::FD_COMPLETION_WARMUP_DONE,
        Completion::StepDone(..) => fd_completion::FD_COMPLETION_STEP_DONE,
        Completion::Stale => fd_completion::FD_COMPLETION_STALE,
        Completion::RequestFailed(_) => fd_completion::FD_COMPLETION_REQUEST_FAILED,
    }
}

fn tag(t: fd_tag) -> Tag {
    Tag {
        request: t.request,
        step: t.step,
        monotask: t.patch,
    }
}

/// Applies a worker's outcome (completion or failure) and writes what it did.
///
/// # Safety
/// `s` NULL or live and unaliased; `completion_out` NULL or writable.
unsafe fn report_outcome(
    s: *mut fd_scheduler,
    completion_out: *mut fd_completion,
    f: impl FnOnce(&mut Scheduler) -> Result<Completion, SchedError>,
) -> fd_status {
    boundary(|| {
        if completion_out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "completion_out is NULL"));
        }
        // SAFETY: `s` is NULL or live and unaliased, `completion_out` writable (this
        // function's contract), as `with` and `write_out` require.
        unsafe {
            let c = with(s, f)?;
            ptr::write_out(completion_out, completion(c), "completion_out")
        }
    })
}

/// Worker `worker` finished `t`. Results are applied at most once: repeats and reports from
/// lost workers give `FD_COMPLETION_STALE`.
///
/// # Safety
/// `s` live; `completion_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_complete(
    s: *mut fd_scheduler,
    worker: u32,
    t: fd_tag,
    completion_out: *mut fd_completion,
) -> fd_status {
    // SAFETY: this function's `# Safety` section is report_outcome's.
    unsafe { report_outcome(s, completion_out, |s| s.complete(worker, tag(t))) }
}

/// Worker `worker` could not run `t`: it is queued again, or its request fails after too
/// many attempts (`FD_COMPLETION_REQUEST_FAILED`).
///
/// # Safety
/// `s` live; `completion_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_fail(
    s: *mut fd_scheduler,
    worker: u32,
    t: fd_tag,
    completion_out: *mut fd_completion,
) -> fd_status {
    // SAFETY: this function's `# Safety` section is report_outcome's.
    unsafe { report_outcome(s, completion_out, |s| s.fail(worker, tag(t))) }
}

/// Declares a worker lost: its monotasks run again elsewhere. The monotask it was running
/// counts the loss as one of its `max_attempts` executions; at the last one its request
/// fails instead (use `fd_scheduler_lose_worker` to learn which). `requeued_out` may be NULL.
///
/// # Safety
/// `s` live; `requeued_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_worker_lost(
    s: *mut fd_scheduler,
    worker: u32,
    requeued_out: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        let lost = unsafe { with(s, |s| s.worker_lost(worker)) }?;
        if !requeued_out.is_null() {
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { ptr::write_out(requeued_out, lost.requeued, "requeued_out") }?;
        }
        Ok(())
    })
}

/// What `fd_scheduler_lose_worker` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fd_lost {
    /// Monotasks placed on other workers.
    pub requeued: usize,
    /// Whether the lost worker's running monotask had used its last attempt, so that its
    /// request failed (it is no longer admitted).
    pub request_failed: bool,
    /// That request, when `request_failed`.
    pub failed_request: u64,
}

/// Declares a worker lost, like `fd_scheduler_worker_lost`, and says whether a request
/// failed because of it (its monotask had now been lost `max_attempts` times).
///
/// # Safety
/// `s` live; `lost_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_lose_worker(
    s: *mut fd_scheduler,
    worker: u32,
    lost_out: *mut fd_lost,
) -> fd_status {
    boundary(|| {
        if lost_out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "lost_out is NULL"));
        }
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        unsafe {
            let lost = with(s, |s| s.worker_lost(worker))?;
            let out = fd_lost {
                requeued: lost.requeued,
                request_failed: lost.failed.is_some(),
                failed_request: lost.failed.unwrap_or(0),
            };
            ptr::write_out(lost_out, out, "lost_out")
        }
    })
}

/// Adds a worker (e.g. a replacement); its id goes to `*worker_out`. A scheduler holds at
/// most 65536 workers, lost ones included (`FD_ERR_CONFIG` beyond).
///
/// # Safety
/// `s` live; `worker_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_add_worker(
    s: *mut fd_scheduler,
    worker_out: *mut u32,
) -> fd_status {
    boundary(|| {
        if worker_out.is_null() {
            return Err(Fail::new(fd_status::FD_ERR_NULL, "worker_out is NULL"));
        }
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        unsafe {
            let w = with(s, |s| s.add_worker())?;
            ptr::write_out(worker_out, w, "worker_out")
        }
    })
}

/// The engine is done with a request (between steps): frees its admission slot.
///
/// # Safety
/// `s` live.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_finish(s: *mut fd_scheduler, request: u64) -> fd_status {
    // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
    // writable outputs), which is what the ptr helpers used here require.
    boundary(|| unsafe { with(s, |s| s.finish(request)) })
}

/// Drops a request in any phase.
///
/// # Safety
/// `s` live.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_cancel(s: *mut fd_scheduler, request: u64) -> fd_status {
    // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
    // writable outputs), which is what the ptr helpers used here require.
    boundary(|| unsafe { with(s, |s| s.cancel(request)) })
}

/// Load snapshot (for upstream admission and `fd_load_epsilon_for`).
///
/// # Safety
/// `s` live; `load_out` writable.
#[no_mangle]
pub unsafe extern "C" fn fd_scheduler_load(
    s: *const fd_scheduler,
    load_out: *mut fd_load,
) -> fd_status {
    boundary(|| {
        // SAFETY: every pointer argument meets this function's `# Safety` section (live handle,
        // writable outputs), which is what the ptr helpers used here require.
        unsafe {
            let l = ptr::handle(s, "scheduler")?.inner.load();
            ptr::write_out(
                load_out,
                fd_load {
                    requests: l.requests,
                    queued: l.queued,
                    running: l.running,
                    alive: l.alive,
                    backlog: l.backlog(),
                },
                "load_out",
            )
        }
    })
}
