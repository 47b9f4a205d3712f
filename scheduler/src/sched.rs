//! The coordinator's scheduling state: requests, step barriers, per-worker ready queues,
//! placement and dispatch.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;

use crate::{Monotask, RequestId, Tag, WorkerId, PRIORITY_LEVELS, WARMUP_MONOTASK};

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
    /// Keep an event log for the checker ([`Scheduler::take_events`]).
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

/// What [`Scheduler::worker_lost`] did.
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

    /// Admits a request and queues its warm-up monotask on the least-loaded worker.
    pub fn submit(
        &mut self,
        request: RequestId,
        priority: u8,
        warmup_cost: f64,
    ) -> Result<(), SchedError> {
        self.submit_with_deadline(request, priority, warmup_cost, None)
    }

    /// [`Scheduler::submit`] with a deadline (any finite time on the caller's clock), which
    /// orders it within its level under [`QueueOrder::Deadline`].
    pub fn submit_with_deadline(
        &mut self,
        request: RequestId,
        priority: u8,
        warmup_cost: f64,
        deadline: Option<f64>,
    ) -> Result<(), SchedError> {
        check_cost(warmup_cost)?;
        let epoch = self.admit(request, priority, deadline, Some(0), None)?;
        self.log(|| Event::StepOpened {
            request,
            step: 0,
            tasks: 1,
        });
        let m = Monotask {
            tag: Tag {
                request,
                step: 0,
                monotask: WARMUP_MONOTASK,
            },
            priority,
            cost: warmup_cost,
            attempt: 0,
            epoch,
            charged: 0.0,
        };
        self.place(m);
        Ok(())
    }

    /// Admits a request that resumes between steps (restored from a checkpoint after a
    /// restart): no warm-up; its next [`Scheduler::submit_step`] must be after `last_done`.
    pub fn resume(
        &mut self,
        request: RequestId,
        priority: u8,
        deadline: Option<f64>,
        last_done: u32,
    ) -> Result<(), SchedError> {
        self.admit(request, priority, deadline, None, Some(last_done))
            .map(|_| ())
    }

    fn admit(
        &mut self,
        request: RequestId,
        priority: u8,
        deadline: Option<f64>,
        open: Option<u32>,
        last_done: Option<u32>,
    ) -> Result<u64, SchedError> {
        if let Some(d) = deadline.filter(|d| !d.is_finite()) {
            return Err(SchedError::BadDeadline(d));
        }
        if self.requests.contains_key(&request) {
            return Err(SchedError::DuplicateRequest(request));
        }
        if priority as usize >= PRIORITY_LEVELS {
            return Err(SchedError::BadPriority(priority));
        }
        if self.requests.len() >= self.cfg.max_requests {
            return Err(SchedError::Full {
                what: "requests",
                limit: self.cfg.max_requests,
            });
        }
        if open.is_some() && self.queued >= self.cfg.max_queued {
            return Err(SchedError::Full {
                what: "queued monotasks",
                limit: self.cfg.max_queued,
            });
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        self.requests.insert(
            request,
            Req {
                priority,
                deadline,
                open,
                last_done,
                outstanding: u32::from(open.is_some()),
                pending: if open.is_some() {
                    vec![WARMUP_MONOTASK]
                } else {
                    Vec::new()
                },
                holders: Vec::new(),
                epoch,
            },
        );
        self.log(|| Event::Admitted {
            request,
            priority,
            deadline,
        });
        Ok(epoch)
    }

    /// Opens `step` of a request with its active patches `(patch, cost)`, after its previous
    /// step (or warm-up) completed. Steps must increase; patch ids must be unique.
    pub fn submit_step(
        &mut self,
        request: RequestId,
        step: u32,
        patches: &[(u32, f64)],
    ) -> Result<(), SchedError> {
        let req = self
            .requests
            .get(&request)
            .ok_or(SchedError::UnknownRequest(request))?;
        if req.open.is_some() {
            return Err(SchedError::Barrier {
                request,
                step,
                why: "the previous step has not completed",
            });
        }
        if req.last_done.is_some_and(|d| step <= d) {
            return Err(SchedError::Barrier {
                request,
                step,
                why: "steps must increase",
            });
        }
        if patches.is_empty() {
            return Err(SchedError::BadPatches(
                "a step runs at least one patch".into(),
            ));
        }
        let mut ids: Vec<u32> = patches.iter().map(|p| p.0).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) || ids.last() == Some(&WARMUP_MONOTASK) {
            return Err(SchedError::BadPatches(
                "patch ids must be unique and below u32::MAX".into(),
            ));
        }
        for &(_, c) in patches {
            check_cost(c)?;
        }
        if self.queued + patches.len() > self.cfg.max_queued {
            return Err(SchedError::Full {
                what: "queued monotasks",
                limit: self.cfg.max_queued,
            });
        }
        let priority = req.priority;
        let req = self.requests.get_mut(&request).expect("checked above");
        let req_epoch = req.epoch;
        req.open = Some(step);
        req.outstanding = patches.len() as u32;
        req.pending = ids;
        self.log(|| Event::StepOpened {
            request,
            step,
            tasks: patches.len() as u32,
        });
        // Longest first: the classic LPT order makes least-max-load packing tighter.
        let mut order: Vec<(u32, f64)> = patches.to_vec();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (patch, cost) in order {
            self.place(Monotask {
                tag: Tag {
                    request,
                    step,
                    monotask: patch,
                },
                priority,
                cost,
                attempt: 0,
                epoch: req_epoch,
                charged: 0.0,
            });
        }
        Ok(())
    }

    /// Eq. 1 with affinity: the worker minimising the maximum load after adding the task,
    /// where a worker that does not hold the request's state also pays `transfer_cost`;
    /// ties prefer a holder, then the lighter worker, then the lower id. Warm-ups go to the
    /// least-loaded worker (no state exists yet).
    fn place(&mut self, mut m: Monotask) {
        let alive: Vec<usize> = (0..self.workers.len())
            .filter(|&g| self.workers[g].alive)
            .collect();
        if alive.is_empty() {
            self.orphans.push(m);
            self.queued += 1;
            return;
        }
        let holders: &[WorkerId] = self
            .requests
            .get(&m.tag.request)
            .map_or(&[], |r| &r.holders);
        let (mut top1, mut top2, mut arg1) = (f64::NEG_INFINITY, f64::NEG_INFINITY, usize::MAX);
        for &g in &alive {
            let l = self.workers[g].load;
            if l > top1 {
                top2 = top1;
                top1 = l;
                arg1 = g;
            } else if l > top2 {
                top2 = l;
            }
        }
        let warmup = m.tag.monotask == WARMUP_MONOTASK;
        let mut best: Option<(f64, bool, f64, usize, f64)> = None;
        for &g in &alive {
            let holder = holders.contains(&(g as WorkerId));
            let extra = if warmup || holder {
                0.0
            } else {
                self.cfg.transfer_cost
            };
            let load = self.workers[g].load;
            let others = if g == arg1 { top2 } else { top1 };
            let key = if warmup {
                load
            } else {
                (load + m.cost + extra).max(others)
            };
            let better = match best {
                None => true,
                Some((k, h, l, id, _)) => (key, !holder, load, g) < (k, !h, l, id),
            };
            if better {
                best = Some((key, holder, load, g, extra));
            }
        }
        let (_, _, _, g, extra) = best.expect("at least one alive worker");
        m.charged = m.cost + extra;
        self.workers[g].load += m.charged;
        self.push(g, m);
        if let Some(r) = self.requests.get_mut(&m.tag.request) {
            if !r.holders.contains(&(g as WorkerId)) {
                r.holders.push(g as WorkerId);
            }
        }
        self.log(|| Event::Ready {
            tag: m.tag,
            priority: m.priority,
            worker: g as WorkerId,
            cost: m.cost,
        });
    }

    /// Queues `m` on worker `g` at its place in its level.
    fn push(&mut self, g: usize, m: Monotask) {
        let (deadline, arrival) = match self.requests.get(&m.tag.request) {
            Some(r) if r.epoch == m.epoch => (
                match self.cfg.order {
                    QueueOrder::Arrival => 0.0,
                    QueueOrder::Deadline => r.deadline.unwrap_or(f64::INFINITY),
                },
                r.epoch,
            ),
            _ => (f64::INFINITY, u64::MAX),
        };
        let level = (m.priority as usize).min(PRIORITY_LEVELS - 1);
        self.workers[g].levels[level].push(Queued {
            deadline,
            arrival,
            seq: self.pushes,
            m,
        });
        self.pushes += 1;
        self.queued += 1;
    }

    /// Highest level holding a monotask on worker `g` (its head is that level's first).
    /// Queues hold only live monotasks: a request's are removed when it ends.
    fn head_level(&self, g: usize) -> Option<usize> {
        (0..PRIORITY_LEVELS)
            .rev()
            .find(|&l| !self.workers[g].levels[l].is_empty())
    }

    /// The head of level `level` on worker `g`.
    fn head(&self, g: usize, level: usize) -> Monotask {
        self.workers[g].levels[level]
            .peek()
            .expect("head_level found the level non-empty")
            .m
    }

    /// Whether `m` belongs to the current incarnation of an admitted request.
    fn is_current(&self, m: &Monotask) -> bool {
        self.requests
            .get(&m.tag.request)
            .is_some_and(|r| r.epoch == m.epoch)
    }

    fn take_head(&mut self, g: usize, level: usize) -> Monotask {
        let m = self.workers[g].levels[level]
            .pop()
            .expect("head_level found the level non-empty")
            .m;
        self.queued -= 1;
        m
    }

    /// Worker `w` asks for its next monotask (Algorithm 1 lines 17-21). It takes the
    /// highest-priority monotask anywhere; one planned for another worker is taken when
    /// `Benefit > SwitchCost`, where Benefit is the wait it saves (work queued ahead of it on
    /// its planned worker) times `1 + priority gap`, and SwitchCost is `switch_cost` plus
    /// `transfer_cost` unless `w` holds the request's state. `None`: nothing worth running.
    pub fn next(&mut self, w: WorkerId) -> Result<Option<Assignment>, SchedError> {
        let wi = w as usize;
        let slot = self.workers.get(wi).ok_or(SchedError::UnknownWorker(w))?;
        if !slot.alive {
            return Err(SchedError::WorkerDead(w));
        }
        if slot.held.len() >= self.cfg.depth as usize {
            return Err(SchedError::Busy(w));
        }
        let own = self.head_level(wi);
        // The best foreign head: highest level, then most work queued ahead of it.
        let mut foreign: Option<(usize, usize, f64)> = None;
        for v in 0..self.workers.len() {
            if v == wi || !self.workers[v].alive {
                continue;
            }
            if let Some(l) = self.head_level(v) {
                let load = self.workers[v].load;
                if foreign.is_none_or(|(fl, _, fload)| (l, load) > (fl, fload)) {
                    foreign = Some((l, v, load));
                }
            }
        }
        let pick = match (own, foreign) {
            (None, None) => return Ok(None),
            (Some(lo), f) if f.is_none_or(|(lf, _, _)| lo >= lf) => (wi, lo, Pick::Own, 0.0),
            (own, Some((lf, v, vload))) => {
                let m = self.head(v, lf);
                let holder = self
                    .requests
                    .get(&m.tag.request)
                    .is_some_and(|r| r.holders.contains(&w));
                let cost = self.cfg.switch_cost + if holder { 0.0 } else { self.cfg.transfer_cost };
                let gap = lf as f64 - own.map_or(-1.0, |lo| lo as f64);
                let running_v: f64 = self.workers[v].held.iter().map(|r| r.cost).sum();
                let ahead = (vload - m.cost).max(0.0).max(running_v);
                let benefit = ahead * (1.0 + gap);
                if benefit > cost {
                    (
                        v,
                        lf,
                        Pick::Stolen {
                            from: v as WorkerId,
                        },
                        cost,
                    )
                } else if let Some(lo) = own {
                    (
                        wi,
                        lo,
                        Pick::KeptOwn {
                            waiting_priority: m.priority,
                            benefit,
                            cost,
                        },
                        0.0,
                    )
                } else {
                    return Ok(None);
                }
            }
            (Some(_), None) => unreachable!("covered by the own-first arm"),
        };
        let (from, level, pick, overhead) = pick;
        let mut m = self.take_head(from, level);
        if from != wi {
            let v = &mut self.workers[from];
            v.load = (v.load - m.charged).max(0.0);
            m.charged = m.cost + overhead;
            self.workers[wi].load += m.charged;
            if let Some(r) = self.requests.get_mut(&m.tag.request) {
                if !r.holders.contains(&w) {
                    r.holders.push(w);
                }
            }
        }
        self.workers[wi].held.push(m);
        self.log(|| Event::Dispatched {
            worker: w,
            tag: m.tag,
            priority: m.priority,
            pick,
        });
        Ok(Some(Assignment {
            task: m,
            overhead,
            pick,
        }))
    }

    /// Where `tag` is among worker `w`'s held monotasks.
    fn held_at(&self, w: WorkerId, tag: Tag) -> Result<usize, SchedError> {
        let slot = self
            .workers
            .get(w as usize)
            .ok_or(SchedError::UnknownWorker(w))?;
        slot.held
            .iter()
            .position(|m| m.tag == tag)
            .ok_or(SchedError::NotRunning { worker: w, tag })
    }

    /// Worker `w` finished the monotask `tag`. Each (request, step, patch) is applied at most
    /// once: reports from lost workers, for cancelled requests, or repeated, are `Stale`.
    pub fn complete(&mut self, w: WorkerId, tag: Tag) -> Result<Completion, SchedError> {
        let slot = self
            .workers
            .get(w as usize)
            .ok_or(SchedError::UnknownWorker(w))?;
        if !slot.alive {
            return Ok(Completion::Stale);
        }
        let at = match self.held_at(w, tag) {
            Ok(at) => at,
            Err(e) => {
                let applied = self
                    .requests
                    .get(&tag.request)
                    .is_none_or(|r| r.open != Some(tag.step) || !r.pending.contains(&tag.monotask));
                return if applied {
                    Ok(Completion::Stale)
                } else {
                    Err(e)
                };
            }
        };
        let slot = &mut self.workers[w as usize];
        let m = slot.held.remove(at);
        slot.load = (slot.load - m.charged).max(0.0);
        let Some(req) = self
            .requests
            .get_mut(&tag.request)
            .filter(|r| r.epoch == m.epoch)
        else {
            self.log(|| Event::Dropped { worker: w, tag });
            return Ok(Completion::Stale);
        };
        let Some(pos) = req
            .pending
            .iter()
            .position(|&p| p == tag.monotask)
            .filter(|_| req.open == Some(tag.step))
        else {
            self.log(|| Event::Dropped { worker: w, tag });
            return Ok(Completion::Stale);
        };
        req.pending.swap_remove(pos);
        req.outstanding -= 1;
        let result = if req.outstanding > 0 {
            Completion::Patch
        } else {
            req.open = None;
            req.last_done = Some(tag.step);
            if tag.monotask == WARMUP_MONOTASK {
                Completion::WarmupDone(tag.request)
            } else {
                Completion::StepDone(tag.request, tag.step)
            }
        };
        self.log(|| Event::Completed { worker: w, tag });
        Ok(result)
    }

    /// Worker `w` could not run `tag` (an error, not a death): it is queued again, or after
    /// `max_attempts` executions its request fails.
    pub fn fail(&mut self, w: WorkerId, tag: Tag) -> Result<Completion, SchedError> {
        let at = self.held_at(w, tag)?;
        let slot = &mut self.workers[w as usize];
        let mut m = slot.held.remove(at);
        slot.load = (slot.load - m.charged).max(0.0);
        self.log(|| Event::Failed { worker: w, tag });
        if !self.is_current(&m) {
            return Ok(Completion::Stale);
        }
        m.attempt += 1;
        if m.attempt >= self.cfg.max_attempts {
            self.end(tag.request, true);
            return Ok(Completion::RequestFailed(tag.request));
        }
        self.log(|| Event::Requeued { tag });
        self.place(m);
        Ok(Completion::Patch)
    }

    /// Declares worker `w` lost: its running and queued monotasks are placed on the others
    /// (they run again; completions stay at most once). A running monotask counts the loss
    /// as one of its `max_attempts` executions: at the last one its request fails instead
    /// (a monotask that kills every worker it runs on must not be retried forever).
    pub fn worker_lost(&mut self, w: WorkerId) -> Result<Lost, SchedError> {
        let slot = self
            .workers
            .get_mut(w as usize)
            .ok_or(SchedError::UnknownWorker(w))?;
        if !slot.alive {
            return Ok(Lost::default());
        }
        slot.alive = false;
        slot.load = 0.0;
        // The first held monotask was running: the loss counts as one of its executions.
        // The others waited in the worker's hand-off queue and never started.
        let mut held = std::mem::take(&mut slot.held).into_iter();
        let running = held.next().map(|mut m| {
            m.attempt += 1;
            m
        });
        let waiting: Vec<Monotask> = held.collect();
        // Highest level first, each in its order: they keep that order on the others.
        let mut queued = Vec::new();
        for l in (0..PRIORITY_LEVELS).rev() {
            let mut level: Vec<Queued> = std::mem::take(&mut slot.levels[l]).into_vec();
            level.sort_by(|a, b| b.cmp(a));
            queued.extend(level.into_iter().map(|q| q.m));
        }
        self.queued -= queued.len();
        for r in self.requests.values_mut() {
            r.holders.retain(|&h| h != w);
        }
        self.log(|| Event::WorkerLost(w));
        let mut out = Lost::default();
        if let Some(m) = running {
            if self.is_current(&m) && m.attempt >= self.cfg.max_attempts {
                out.failed = Some(m.tag.request);
                self.end(m.tag.request, true);
            } else if self.is_current(&m) {
                self.log(|| Event::Requeued { tag: m.tag });
                self.place(m);
                out.requeued += 1;
            }
        }
        for m in waiting.into_iter().chain(queued) {
            if self.is_current(&m) {
                self.log(|| Event::Requeued { tag: m.tag });
                self.place(m);
                out.requeued += 1;
            }
        }
        Ok(out)
    }

    /// Adds a worker (a replacement); monotasks waiting for any worker go to it.
    pub fn add_worker(&mut self) -> Result<WorkerId, SchedError> {
        if self.workers.len() >= MAX_WORKERS as usize {
            return Err(SchedError::BadConfig(format!(
                "cannot add a worker: the scheduler already holds {MAX_WORKERS}, lost ones included"
            )));
        }
        self.workers.push(WorkerSlot::new());
        let w = (self.workers.len() - 1) as WorkerId;
        self.log(|| Event::WorkerAdded(w));
        let orphans = std::mem::take(&mut self.orphans);
        self.queued -= orphans.len();
        for m in orphans {
            self.place(m);
        }
        Ok(w)
    }

    /// The engine is done with a request (after its last step): frees its admission slot.
    pub fn finish(&mut self, request: RequestId) -> Result<(), SchedError> {
        let r = self
            .requests
            .get(&request)
            .ok_or(SchedError::UnknownRequest(request))?;
        if r.open.is_some() {
            return Err(SchedError::NotIdle(request));
        }
        self.end(request, false);
        Ok(())
    }

    /// Drops a request in any phase; its queued monotasks are discarded, running ones report
    /// `Stale`.
    pub fn cancel(&mut self, request: RequestId) -> Result<(), SchedError> {
        if !self.requests.contains_key(&request) {
            return Err(SchedError::UnknownRequest(request));
        }
        self.end(request, true);
        Ok(())
    }

    /// Removes a request and, at once, its queued monotasks and the load they added (a
    /// running one stays until its worker reports it: `Dropped`).
    fn end(&mut self, request: RequestId, failed: bool) {
        self.requests.remove(&request);
        let mut removed = 0;
        for w in &mut self.workers {
            for level in &mut w.levels {
                if level.iter().all(|q| q.m.tag.request != request) {
                    continue;
                }
                let mut kept = std::mem::take(level).into_vec();
                kept.sort_by(|a, b| b.cmp(a));
                for q in kept {
                    if q.m.tag.request == request {
                        w.load = (w.load - q.m.charged).max(0.0);
                        removed += 1;
                    } else {
                        level.push(q);
                    }
                }
            }
        }
        let before = self.orphans.len();
        self.orphans.retain(|m| m.tag.request != request);
        self.queued -= removed + (before - self.orphans.len());
        self.log(|| Event::RequestEnded { request, failed });
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
