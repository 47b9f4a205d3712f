//! FlashDiff Patch Scheduler (paper §4.3, Algorithm 1, eq. 1).
//!
//! Decides *which worker runs which monotask, and when*. A monotask is a request's warm-up or
//! one patch-step. The engine submits requests and, after each step's gate decision, the
//! step's active patches; workers ask for their next monotask and report completions tagged
//! `(request, step, monotask)`. The scheduler enforces step barriers, packs patch-steps of all
//! requests onto workers by the affinity-aware least-maximum-load rule, serves the highest
//! priority first with switch-cost-aware preemption at step boundaries, refuses work beyond
//! its bounds, and survives lost workers. No tensors, no threads of its own.
//!
//! ```
//! use flashdiff_scheduler::{Completion, Scheduler, SchedulerConfig};
//!
//! let mut s = Scheduler::new(SchedulerConfig { workers: 2, ..Default::default() })?;
//! s.submit(7, 1, 5.0)?; // request 7, priority 1, warm-up cost 5
//! let a = s.next(0)?.unwrap(); // worker 0 takes the warm-up
//! assert_eq!(s.complete(0, a.task.tag)?, Completion::WarmupDone(7));
//! s.submit_step(7, 5, &[(0, 1.0), (1, 1.0), (2, 1.0)])?; // step 5, three active patches
//! let a = s.next(0)?.unwrap();
//! let b = s.next(1)?.unwrap();
//! assert_eq!(s.complete(0, a.task.tag)?, Completion::Patch);
//! assert_eq!(s.complete(1, b.task.tag)?, Completion::Patch);
//! let c = s.next(0)?.unwrap();
//! assert_eq!(s.complete(0, c.task.tag)?, Completion::StepDone(7, 5));
//! s.finish(7)?;
//! # Ok::<(), flashdiff_scheduler::SchedError>(())
//! ```
//!
//! Within a priority level, monotasks go in request arrival order (or earliest deadline
//! first, [`QueueOrder`]), so one level's requests finish in the order they came instead of
//! advancing together step by step.
//!
//! Dispatch is lock-free on the workers' side: the coordinator (the scheduler's only caller)
//! decides, pushes each dispatched monotask to the worker's [`HandOff`] queue, and may
//! dispatch up to [`SchedulerConfig::depth`] to a worker ahead, so that a worker takes its
//! next monotask from its queue the moment it finishes one, without waiting for the
//! coordinator or taking a lock. The decisions themselves need one view of every queue
//! (arrival order within a level, Benefit > SwitchCost across workers, deadlines), so they
//! stay with the coordinator; so do the step barriers and commits.
//!
//! Also here: the lock-free [`ReadyQueue`] (a FIFO per level; the scheduler's own queues
//! are ordered, so it no longer dispatches through it), an independent [`checker`] of event logs, and a deterministic discrete-event
//! simulator ([`sim`]) for evaluating the policy without a model.

pub mod checker;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handoff;
mod queue;
mod sched;
pub mod sim;

pub use handoff::HandOff;
pub use queue::ReadyQueue;
pub use sched::{
    Assignment, Completion, Event, LoadInfo, Pick, QueueOrder, SchedError, Scheduler,
    SchedulerConfig, MAX_DEPTH,
};

use std::fmt;

/// Request id, chosen by the caller.
pub type RequestId = u64;
/// Worker index.
pub type WorkerId = u32;

/// Priority levels; higher is more urgent. Upstream schedulers map their classes onto these.
pub const PRIORITY_LEVELS: usize = 8;

/// The `monotask` of a warm-up monotask's tag.
pub const WARMUP_MONOTASK: u32 = u32::MAX;

/// Identity of a monotask's result: applied at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    /// Request.
    pub request: RequestId,
    /// Denoising step (0 for the warm-up).
    pub step: u32,
    /// The monotask's index within its step (the engine packs a step's patches into
    /// monotasks), or [`WARMUP_MONOTASK`] for a request's warm-up.
    pub monotask: u32,
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.monotask == WARMUP_MONOTASK {
            write!(f, "(request {}, warm-up)", self.request)
        } else {
            write!(
                f,
                // "patch": the C ABI's name for this field (`fd_tag.patch`), whose error
                // details carry this text.
                "(request {}, step {}, patch {})",
                self.request, self.step, self.monotask
            )
        }
    }
}

/// One unit of schedulable work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Monotask {
    /// Its result's identity.
    pub tag: Tag,
    /// Upstream priority, `0..PRIORITY_LEVELS`, higher first.
    pub priority: u8,
    /// Expected cost (the engine's unit: seconds of device time).
    pub cost: f64,
    /// Executions started before this one (after failures or lost workers).
    pub attempt: u32,
    /// Incarnation of its request: an id cancelled and submitted again gets a new one, so
    /// the old incarnation's leftovers in the lock-free queues (which cannot remove
    /// entries) are dropped instead of running as the new request's work.
    pub epoch: u64,
    /// Load it adds to the worker that holds it: `cost` plus the transfer or switch overhead
    /// it was placed or taken with (set by the scheduler; 0 when built elsewhere). Exactly
    /// this is taken off again when it leaves the worker, so overheads never pile up as
    /// phantom load.
    pub charged: f64,
}

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
