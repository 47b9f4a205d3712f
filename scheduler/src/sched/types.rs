//! What callers of the scheduler see: settings and their limits, errors, events, what a
//! dispatch, a completion or a lost worker did, and the load.

use std::fmt;

use crate::{Monotask, RequestId, Tag, WorkerId, PRIORITY_LEVELS};

/// Order of monotasks within one priority level of a worker's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueOrder {
    /// The upstream order: the monotasks of the request admitted first go first, whatever
    /// step each request is at, so requests of one level finish in the order they came
    /// (FIFO) instead of advancing together step by step.
    #[default]
    Arrival,
    /// Earliest deadline first, decided again at every step boundary; requests without a
    /// deadline come after those with one, in arrival order.
    Deadline,
}

/// Scheduler settings. Costs share one unit (seconds of device time in the engine).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Workers at start (more can be added).
    pub workers: u32,
    /// Requests admitted at once; `submit` refuses beyond.
    pub max_requests: usize,
    /// Monotasks queued at once; `submit_step` refuses beyond (back-pressure).
    pub max_queued: usize,
    /// Fixed cost of a worker switching to a monotask planned for another worker.
    pub switch_cost: f64,
    /// Cost of bringing a request's state (latent, K/V) to a worker that does not hold it.
    pub transfer_cost: f64,
    /// Executions of one monotask before its request fails.
    pub max_attempts: u32,
    /// Keep an event log for the checker ([`super::Scheduler::take_events`]).
    pub record_events: bool,
    /// Order within a priority level.
    pub order: QueueOrder,
    /// Monotasks a worker may hold at once: the one it runs plus those dispatched to it
    /// ahead, waiting in its hand-off queue ([`crate::HandOff`]) so that it starts the next
    /// the moment it finishes one, without waiting for the coordinator. 1 dispatches only to
    /// an idle worker. A worker runs what it holds in dispatch order.
    pub depth: u32,
}

/// Most workers a scheduler holds, the lost ones included (`new` and `add_worker` refuse
/// beyond).
pub const MAX_WORKERS: u32 = 1 << 16;
/// Largest `max_requests`.
pub const MAX_REQUESTS: usize = 1 << 20;
/// Largest `max_queued`.
pub const MAX_QUEUED: usize = 1 << 26;
/// Largest `max_attempts`.
pub const MAX_ATTEMPTS: u32 = 1000;
/// Largest `depth`.
pub const MAX_DEPTH: u32 = 64;

/// What [`super::Scheduler::worker_lost`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lost {
    /// Monotasks placed on other workers.
    pub requeued: usize,
    /// The request whose running monotask had now been lost `max_attempts` times with its
    /// worker: it failed (ended) instead of running again.
    pub failed: Option<RequestId>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            workers: 1,
            max_requests: 1024,
            max_queued: 1 << 20,
            switch_cost: 0.0,
            transfer_cost: 0.0,
            max_attempts: 3,
            record_events: false,
            order: QueueOrder::Arrival,
            depth: 1,
        }
    }
}

/// Why the scheduler refused a call.
#[derive(Debug, Clone, PartialEq)]
pub enum SchedError {
    /// Settings out of range.
    BadConfig(String),
    /// Admission control: the named bound is reached; retry after requests finish.
    Full {
        /// "requests" or "queued monotasks".
        what: &'static str,
        /// The configured bound.
        limit: usize,
    },
    /// Request id already admitted.
    DuplicateRequest(RequestId),
    /// No such request (never submitted, finished, failed or cancelled).
    UnknownRequest(RequestId),
    /// Priority outside `0..PRIORITY_LEVELS`.
    BadPriority(u8),
    /// Cost NaN, infinite or negative.
    BadCost(f64),
    /// Deadline NaN or infinite.
    BadDeadline(f64),
    /// The step cannot open: the previous step (or warm-up) has not completed, or the step
    /// number does not increase.
    Barrier {
        /// Request.
        request: RequestId,
        /// Step asked for.
        step: u32,
        /// Why.
        why: &'static str,
    },
    /// A step must run at least one patch, each patch once.
    BadPatches(String),
    /// Worker id out of range.
    UnknownWorker(WorkerId),
    /// The worker was declared lost.
    WorkerDead(WorkerId),
    /// The worker already holds `depth` monotasks: complete or fail one first.
    Busy(WorkerId),
    /// The worker does not run that monotask.
    NotRunning {
        /// Worker.
        worker: WorkerId,
        /// The tag reported.
        tag: Tag,
    },
    /// The request is not between steps, so it cannot finish yet.
    NotIdle(RequestId),
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadConfig(s) => write!(f, "invalid scheduler configuration: {s}"),
            Self::Full { what, limit } => write!(
                f,
                "scheduler full: {what} at the limit of {limit}; retry when requests finish"
            ),
            Self::DuplicateRequest(r) => write!(f, "request {r} is already admitted"),
            Self::UnknownRequest(r) => write!(
                f,
                "request {r} is not admitted (finished, failed, cancelled or never submitted)"
            ),
            Self::BadPriority(p) => write!(f, "priority {p} out of range 0..{PRIORITY_LEVELS}"),
            Self::BadCost(c) => write!(f, "cost {c} must be finite and >= 0"),
            Self::BadDeadline(d) => write!(f, "deadline {d} must be a finite time"),
            Self::Barrier { request, step, why } => {
                write!(f, "request {request} cannot open step {step}: {why}")
            }
            Self::BadPatches(s) => write!(f, "bad patch list: {s}"),
            Self::UnknownWorker(w) => write!(f, "worker {w} does not exist"),
            Self::WorkerDead(w) => write!(f, "worker {w} was declared lost"),
            Self::Busy(w) => write!(f, "worker {w} already holds as many monotasks as it may"),
            Self::NotRunning { worker, tag } => write!(f, "worker {worker} does not run {tag}"),
            Self::NotIdle(r) => write!(f, "request {r} has a step in flight"),
        }
    }
}

impl std::error::Error for SchedError {}

/// How a dispatched monotask was chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// The highest-priority monotask anywhere was in the worker's own queue.
    Own,
    /// Taken from another worker's queue: `Benefit > SwitchCost`, or it was higher priority.
    Stolen {
        /// The worker it was planned for.
        from: WorkerId,
    },
    /// A higher-priority monotask waited elsewhere, but moving it here would cost more than
    /// it gains (`benefit <= cost`): the worker took its own lower-priority one.
    KeptOwn {
        /// Priority of the monotask left waiting.
        waiting_priority: u8,
        /// Wait it would have saved, weighted by the priority gap.
        benefit: f64,
        /// What switching would have cost.
        cost: f64,
    },
}

/// A monotask handed to a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assignment {
    /// The work.
    pub task: Monotask,
    /// Extra cost this dispatch pays (state transfer, switch).
    pub overhead: f64,
    /// Why it was chosen.
    pub pick: Pick,
}

/// What a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// One patch-step done; its step still has others outstanding.
    Patch,
    /// The request's warm-up is done: partition it and open its first step.
    WarmupDone(RequestId),
    /// Every patch-step of `step` is done: run the gate and open the next step (or finish).
    StepDone(RequestId, u32),
    /// Already applied, or from a lost worker, or for a cancelled request: ignored.
    Stale,
    /// The monotask failed too often: the request is dropped.
    RequestFailed(RequestId),
}

/// Scheduler events, recorded when `record_events` is set. They carry the scheduler's
/// inputs (what was submitted, its costs and deadlines) and its decisions, never the state
/// it derived (loads, charges, benefits), so that a checker can recompute that state.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A request was admitted (its warm-up's `StepOpened` follows).
    Admitted {
        /// Request.
        request: RequestId,
        /// Priority.
        priority: u8,
        /// Deadline, if it has one.
        deadline: Option<f64>,
    },
    /// A monotask was placed on a worker's queue.
    Ready {
        /// Tag.
        tag: Tag,
        /// Priority.
        priority: u8,
        /// Planned worker.
        worker: WorkerId,
        /// Its cost, as submitted.
        cost: f64,
    },
    /// A step (or warm-up) opened with this many monotasks.
    StepOpened {
        /// Request.
        request: RequestId,
        /// Step (0 for warm-up).
        step: u32,
        /// Monotasks in it.
        tasks: u32,
    },
    /// A worker started a monotask.
    Dispatched {
        /// Worker.
        worker: WorkerId,
        /// Tag.
        tag: Tag,
        /// Priority.
        priority: u8,
        /// How it was chosen.
        pick: Pick,
    },
    /// A completion was applied.
    Completed {
        /// Worker.
        worker: WorkerId,
        /// Tag.
        tag: Tag,
    },
    /// A worker reported a monotask whose request had ended meanwhile: the worker is free,
    /// nothing was applied.
    Dropped {
        /// Worker.
        worker: WorkerId,
        /// Tag.
        tag: Tag,
    },
    /// A worker was added.
    WorkerAdded(WorkerId),
    /// A worker could not run a monotask; it is free again (`Requeued` or, after too many
    /// attempts, `RequestEnded` follows).
    Failed {
        /// Worker.
        worker: WorkerId,
        /// Tag.
        tag: Tag,
    },
    /// A monotask went back to the queues (failure or lost worker); it is Ready again.
    Requeued {
        /// Tag.
        tag: Tag,
    },
    /// A worker was declared lost.
    WorkerLost(WorkerId),
    /// A request left (finished, failed or cancelled); its queued monotasks are dropped.
    RequestEnded {
        /// Request.
        request: RequestId,
        /// Whether it ended by failure or cancellation.
        failed: bool,
    },
}

/// Queue/worker load snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadInfo {
    /// Admitted requests.
    pub requests: usize,
    /// Monotasks queued.
    pub queued: usize,
    /// Monotasks dispatched and not yet reported (running, or waiting in a worker's
    /// hand-off queue).
    pub running: usize,
    /// Queued + running cost per worker (0 for lost workers).
    pub per_worker: Vec<f64>,
    /// Alive workers.
    pub alive: usize,
}

impl LoadInfo {
    /// Mean outstanding cost per alive worker: how long the current work would keep every
    /// worker busy.
    pub fn backlog(&self) -> f64 {
        self.per_worker.iter().sum::<f64>() / self.alive.max(1) as f64
    }
}
