//! The coordinator's scheduling state: requests, step barriers, per-worker ready queues,
//! placement and dispatch. Where each part lives:
//! - `types.rs`: the vocabulary callers see (settings and limits, errors, events, what a
//!   dispatch or a completion did, load);
//! - this file: the scheduler's state, its queue entries, creation and snapshots;
//! - `admit.rs`: admitting a request (or resuming one) and opening its steps;
//! - `dispatch.rs`: placing monotasks on workers (equation 1) and handing the next one to
//!   a worker (priority levels, switch cost);
//! - `complete.rs`: completions, failures, lost and added workers, finishing and
//!   cancelling requests.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::{Monotask, RequestId, Tag, WorkerId, PRIORITY_LEVELS, WARMUP_MONOTASK};

mod admit;
mod complete;
mod dispatch;
mod types;

pub use types::*;

/// A queued monotask with its place in its level: `(deadline, arrival, seq)` ascending.
#[derive(Debug, Clone, Copy)]
struct Queued {
    /// The request's deadline under [`QueueOrder::Deadline`] (infinite without one), 0
    /// under [`QueueOrder::Arrival`].
    deadline: f64,
    /// The request's admission number.
    arrival: u64,
    /// Push order: monotasks of one request keep the order they were placed in.
    seq: u64,
    m: Monotask,
}

impl Queued {
    fn key(&self) -> (f64, u64, u64) {
        (self.deadline, self.arrival, self.seq)
    }
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    /// Reversed, so that `BinaryHeap` (a max-heap) yields the smallest key first.
    fn cmp(&self, o: &Self) -> Ordering {
        let (a, b) = (self.key(), o.key());
        b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2))
    }
}

#[derive(Debug)]
struct WorkerSlot {
    alive: bool,
    /// Monotasks dispatched to it and not yet reported, in dispatch order (at most
    /// `depth`): the first runs, the others wait in its hand-off queue.
    held: Vec<Monotask>,
    load: f64,
    /// One ordered queue per priority level. Owned by the coordinator (every scheduler
    /// call takes `&mut self`); an ordered heap, because arrival order within a level is
    /// not push order once requests interleave steps (a FIFO would round-robin them).
    levels: [BinaryHeap<Queued>; PRIORITY_LEVELS],
}

impl WorkerSlot {
    fn new() -> Self {
        Self {
            alive: true,
            held: Vec::new(),
            load: 0.0,
            levels: Default::default(),
        }
    }
}

#[derive(Debug)]
struct Req {
    priority: u8,
    deadline: Option<f64>,
    /// Step in flight (0 = warm-up); `None` between steps.
    open: Option<u32>,
    last_done: Option<u32>,
    outstanding: u32,
    /// Patches of the open step still to complete.
    pending: Vec<u32>,
    holders: Vec<WorkerId>,
    /// This incarnation of the request id ([`Monotask::epoch`]).
    epoch: u64,
}

/// The Patch Scheduler's state (§4.3, Algorithm 1 lines 10-22).
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    workers: Vec<WorkerSlot>,
    requests: HashMap<RequestId, Req>,
    queued: usize,
    orphans: Vec<Monotask>,
    events: Vec<Event>,
    /// The next request incarnation ([`Monotask::epoch`]), also its admission number.
    next_epoch: u64,
    /// Pushes so far (the last part of a queue key).
    pushes: u64,
}

fn check_cost(c: f64) -> Result<(), SchedError> {
    if c.is_finite() && c >= 0.0 {
        Ok(())
    } else {
        Err(SchedError::BadCost(c))
    }
}

impl Scheduler {
    /// A scheduler with `cfg.workers` idle workers.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedError> {
        if cfg.workers == 0
            || cfg.max_requests == 0
            || cfg.max_queued == 0
            || cfg.max_attempts == 0
            || cfg.depth == 0
        {
            return Err(SchedError::BadConfig(
                "workers, max_requests, max_queued, max_attempts and depth must be >= 1".into(),
            ));
        }
        if cfg.depth > MAX_DEPTH {
            return Err(SchedError::BadConfig(format!(
                "depth {} is above its bound {MAX_DEPTH}",
                cfg.depth
            )));
        }
        if cfg.workers > MAX_WORKERS
            || cfg.max_requests > MAX_REQUESTS
            || cfg.max_queued > MAX_QUEUED
            || cfg.max_attempts > MAX_ATTEMPTS
        {
            return Err(SchedError::BadConfig(format!(
                "workers {} (at most {MAX_WORKERS}), max_requests {} (at most {MAX_REQUESTS}), \
                 max_queued {} (at most {MAX_QUEUED}), max_attempts {} (at most {MAX_ATTEMPTS}): \
                 one is above its bound",
                cfg.workers, cfg.max_requests, cfg.max_queued, cfg.max_attempts
            )));
        }
        check_cost(cfg.switch_cost)
            .and(check_cost(cfg.transfer_cost))
            .map_err(|_| {
                SchedError::BadConfig(
                    "switch_cost and transfer_cost must be finite and >= 0".into(),
                )
            })?;
        Ok(Self {
            cfg,
            workers: (0..cfg.workers).map(|_| WorkerSlot::new()).collect(),
            requests: HashMap::new(),
            queued: 0,
            orphans: Vec::new(),
            next_epoch: 0,
            pushes: 0,
            events: Vec::new(),
        })
    }

    /// Settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Workers ever created (lost ones included).
    pub fn workers(&self) -> u32 {
        self.workers.len() as u32
    }

    fn log(&mut self, e: impl FnOnce() -> Event) {
        if self.cfg.record_events {
            self.events.push(e());
        }
    }

    /// Drains the event log.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Load snapshot (for admission upstream and the load-adaptive ε).
    pub fn load(&self) -> LoadInfo {
        LoadInfo {
            requests: self.requests.len(),
            queued: self.queued,
            running: self.workers.iter().map(|w| w.held.len()).sum(),
            per_worker: self
                .workers
                .iter()
                .map(|w| if w.alive { w.load } else { 0.0 })
                .collect(),
            alive: self.workers.iter().filter(|w| w.alive).count(),
        }
    }

    /// Whether worker `w` exists and was not declared lost.
    pub fn is_alive(&self, w: WorkerId) -> bool {
        self.workers.get(w as usize).is_some_and(|s| s.alive)
    }

    /// Whether the request is admitted and between steps (ready for `submit_step`/`finish`).
    pub fn is_between_steps(&self, request: RequestId) -> Option<bool> {
        self.requests.get(&request).map(|r| r.open.is_none())
    }
}
