//! The start window: how many requests the scheduler interleaves at each priority level.
//!
//! The scheduler runs a level's monotasks in request arrival order, but a request's next
//! step exists only once its last one is committed and gated, and in that gap a worker takes
//! the next request's step. With every submitted request started, a burst of arrivals is
//! interleaved step by step, and each of them finishes late. With a window W, a request
//! starts (its warm-up goes to the scheduler) only while fewer than W started requests are
//! at its level or above; the others wait in the engine, the highest level first, then in
//! the scheduler's order within a level (arrival, or earliest deadline). Counting the levels
//! above keeps a higher level from ever waiting for a lower one: a request at level 3 starts
//! at once unless W requests at level 3 run, and then preempts the lower levels at the next
//! step boundary as before. Off by default (every request starts when it is submitted): on
//! the serving study's bursty traces a window of the workers plus one
//! ([`START_WINDOW_EXTRA`]) lowered p99 at one load and not at the others (see the
//! benchmarks). Outputs do not depend on the window; only when each request runs does.

use std::cmp::Reverse;

use flashdiff_scheduler::{QueueOrder, SchedError, PRIORITY_LEVELS};

use super::{Engine, EngineError};

/// The start window the serving study measures is the worker count plus this: one started
/// request more than the workers keeps every worker fed while a request's step is gated.
pub const START_WINDOW_EXTRA: u32 = 1;

/// A submitted request that has not started: what its warm-up needs from the scheduler.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiting {
    pub(super) id: u64,
    pub(super) priority: u8,
    pub(super) warmup_cost: f64,
    /// On the engine's clock.
    pub(super) deadline: Option<f64>,
    /// Submission order.
    pub(super) seq: u64,
}

impl Engine {
    /// How many requests at a priority level and above run interleaved at once (see the
    /// module docs of the start window); `None`: every submitted request starts at once.
    /// At least 1. Requests waiting start at once if a larger window lets them.
    pub fn set_start_window(&mut self, window: Option<u32>) -> Result<(), EngineError> {
        if window == Some(0) {
            return Err(EngineError::Config(
                "start window 0: must be at least 1 (or none: every request starts at once)".into(),
            ));
        }
        self.window = window;
        self.start_waiting();
        Ok(())
    }

    /// The start window (`None`: every request starts when it is submitted).
    pub fn start_window(&self) -> Option<u32> {
        self.window
    }

    /// Requests submitted and not yet started (in [`Engine::in_flight`] too).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Started requests at `priority` or above.
    fn started_at_or_above(&self, priority: u8) -> usize {
        let all = self
            .requests
            .values()
            .filter(|r| r.cfg.priority >= priority)
            .count();
        let waiting = self
            .waiting
            .iter()
            .filter(|w| w.priority >= priority)
            .count();
        all - waiting
    }

    /// Whether the window lets one more request at `priority` start.
    fn window_open(&self, priority: u8) -> bool {
        self.window
            .is_none_or(|w| self.started_at_or_above(priority) < w as usize)
    }

    /// Starts a request now if the window lets it, otherwise queues it; the caller inserts
    /// the request itself after this returns `Ok`. Whatever the scheduler would refuse at
    /// the start (a bad priority or deadline, too many requests) is refused here too, so a
    /// waiting request fails at submission or not at all (short of a full monotask queue).
    pub(super) fn start_or_wait(&mut self, w: Waiting) -> Result<(), EngineError> {
        if self.window_open(w.priority) {
            return self.start(&w);
        }
        if let Some(d) = w.deadline.filter(|d| !d.is_finite()) {
            return Err(SchedError::BadDeadline(d).into());
        }
        if w.priority as usize >= PRIORITY_LEVELS {
            return Err(SchedError::BadPriority(w.priority).into());
        }
        let limit = self.sched.config().max_requests;
        if self.requests.len() >= limit {
            return Err(SchedError::Full {
                what: "requests",
                limit,
            }
            .into());
        }
        self.waiting.push(w);
        Ok(())
    }

    fn start(&mut self, w: &Waiting) -> Result<(), EngineError> {
        self.sched
            .submit_with_deadline(w.id, w.priority, w.warmup_cost, w.deadline)?;
        Ok(())
    }

    /// Starts waiting requests, best first, while the window lets them. Called whenever a
    /// request leaves and when the window changes.
    pub(super) fn start_waiting(&mut self) {
        let by_deadline = self.sched.config().order == QueueOrder::Deadline;
        let key = |w: &Waiting| {
            let d = if by_deadline {
                w.deadline.unwrap_or(f64::INFINITY)
            } else {
                0.0
            };
            (Reverse(w.priority), d, w.seq)
        };
        while let Some(i) = (0..self.waiting.len()).min_by(|&a, &b| {
            let (ka, kb) = (key(&self.waiting[a]), key(&self.waiting[b]));
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then(ka.2.cmp(&kb.2))
        }) {
            let w = self.waiting[i];
            if !self.window_open(w.priority) {
                return;
            }
            self.waiting.swap_remove(i);
            if let Err(e) = self.start(&w) {
                self.fail(w.id, e);
            }
        }
    }
}
