//! Worker supervision: dispatching monotasks to worker threads or processes, their reports,
//! losses, hangs and replacements.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use flashdiff_scheduler::{SchedError, Tag, WARMUP_MONOTASK};

use super::methods;
use super::{Engine, EngineError, StepEvent};
use crate::proc::{Order, Pool, Report as WorkerReport, WorkerEvent};

/// Where monotasks run.
pub(super) enum Executor {
    /// In the coordinator's own thread.
    InProcess,
    /// In worker threads or processes; `busy[w]` holds the monotasks dispatched to worker
    /// w and not reported, in dispatch order: the first runs (with the time it started, as
    /// far as the coordinator knows: its dispatch, or the report of the one before it), the
    /// others wait in its hand-off queue.
    Workers {
        pool: Box<Pool>,
        busy: Vec<VecDeque<(Tag, Instant)>>,
        replacements: u32,
        health: Health,
    },
}

/// Consecutive losses of workers before they were ready after which the engine stops
/// starting replacements and fails the requests in flight (a worker executable that exits
/// at once must not be respawned forever).
const MAX_STARTUP_FAILURES: u32 = 3;

/// When a silent worker counts as hung: a monotask may run `factor` times the longest one
/// of its kind (warm-up or patch-step) seen so far, and never less than `floor`; before the
/// first of its kind completed, and for a worker not yet ready, `first` more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HangPolicy {
    /// Smallest limit.
    pub floor: Duration,
    /// Multiple of the longest monotask of the same kind seen so far.
    pub factor: f64,
    /// Limit before any monotask of the kind completed (and extra time for a worker that is
    /// still loading its model).
    pub first: Duration,
}

impl Default for HangPolicy {
    fn default() -> Self {
        Self {
            floor: Duration::from_secs(10),
            factor: 20.0,
            first: Duration::from_secs(300),
        }
    }
}

/// Worker health: who is ready, failed starts in a row, measured monotask times.
#[derive(Debug, Default)]
pub(super) struct Health {
    pub(super) ready: Vec<bool>,
    pub(super) startup_failures: u32,
    /// Longest warm-up and longest patch monotask seen.
    pub(super) longest: [Option<Duration>; 2],
    pub(super) policy: HangPolicy,
}

impl Health {
    pub(super) fn new(workers: u32) -> Self {
        Self {
            ready: vec![false; workers as usize],
            ..Self::default()
        }
    }

    fn limit(&self, w: u32, tag: Tag) -> Duration {
        let kind = usize::from(tag.monotask != WARMUP_MONOTASK);
        let p = self.policy;
        let mut limit = match self.longest[kind] {
            None => p.first,
            Some(d) => d.mul_f64(p.factor).max(p.floor),
        };
        if !self.ready.get(w as usize).copied().unwrap_or(false) {
            limit += p.first;
        }
        limit
    }

    fn observed(&mut self, tag: Tag, d: Duration) {
        let kind = usize::from(tag.monotask != WARMUP_MONOTASK);
        self.longest[kind] = Some(self.longest[kind].map_or(d, |l| l.max(d)));
    }
}

impl Engine {
    /// One round of work: every idle worker gets its next monotask (in-process: run at once);
    /// with worker processes, then waits up to `timeout` for one of them to report. Finished
    /// requests collect for [`Engine::take_finished`]. For callers that admit requests while
    /// others run (a serving loop).
    pub fn poll(&mut self, progress: &mut dyn FnMut(&StepEvent), timeout: Duration) {
        if self.requests.is_empty() {
            return;
        }
        if let Executor::Workers { pool, health, .. } = &mut self.exec {
            // Every worker is gone (they kept dying at start, or none could be started): new
            // requests get a fresh try at starting one.
            if !(0..self.sched.workers()).any(|w| pool.is_live(w) && self.sched.is_alive(w)) {
                health.startup_failures = 0;
                self.start_replacement();
                if self.requests.is_empty() {
                    return;
                }
            }
        }
        let mut dispatched = false;
        // Breadth first: every idle worker gets a monotask before any gets one ahead.
        let rounds = match self.exec {
            Executor::InProcess => 1,
            Executor::Workers { .. } => self.sched.config().depth,
        };
        let workers = self.sched.workers();
        for (round, w) in (0..rounds).flat_map(|r| (0..workers).map(move |w| (r, w))) {
            if let Executor::Workers { busy, health, .. } = &self.exec {
                // A worker gets monotasks once it is ready (model loaded): one that dies
                // while starting has run nothing, so its death costs no monotask an attempt.
                if busy
                    .get(w as usize)
                    .is_none_or(|b| b.len() != round as usize)
                    || !health.ready.get(w as usize).copied().unwrap_or(false)
                {
                    continue;
                }
            }
            let t_sched = Instant::now();
            let next = self.sched.next(w);
            let sched_time = t_sched.elapsed();
            let a = match next {
                Ok(Some(a)) => a,
                Ok(None) | Err(SchedError::WorkerDead(_)) => continue,
                Err(e) => {
                    self.fail_all(EngineError::Scheduler(e));
                    break;
                }
            };
            dispatched = true;
            let tag = a.task.tag;
            if let Some(r) = self.requests.get_mut(&tag.request) {
                r.report.time.schedule += sched_time;
            }
            match &mut self.exec {
                Executor::InProcess => {
                    let t0 = Instant::now();
                    let res = self.execute_here(tag);
                    self.account(tag, t0.elapsed());
                    match res {
                        Ok(()) => self.completed(w, tag, progress),
                        Err(e) => self.failed(w, tag, e),
                    }
                }
                Executor::Workers { pool, busy, .. } => {
                    let Some(r) = self.requests.get(&tag.request) else {
                        continue;
                    };
                    let order = Order::Run {
                        request: tag.request,
                        step: tag.step,
                        monotask: tag.monotask,
                        steps: r.cfg.steps,
                        warmup: r.cfg.warmup,
                        isolated: methods::of(r.cfg.mode).isolated(),
                        state: r
                            .state
                            .path()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                    };
                    busy[w as usize].push_back((tag, Instant::now()));
                    // A broken pipe shows up as the worker's Lost event.
                    pool.send(w, &order);
                }
            }
        }
        if let Executor::Workers {
            busy, health, pool, ..
        } = &self.exec
        {
            let starting = (0..self.sched.workers()).any(|w| {
                pool.is_live(w) && !health.ready.get(w as usize).copied().unwrap_or(false)
            });
            if starting || busy.iter().any(|b| !b.is_empty()) {
                self.wait_worker(progress, timeout);
                return;
            }
        }
        if !dispatched && !self.requests.is_empty() {
            // Nothing runnable yet nothing finished: a bug, never a hang.
            self.fail_all(EngineError::Internal(
                "scheduler has no runnable monotask for requests in flight".into(),
            ));
        }
    }
}

/// Worker supervision: events, hangs, losses and replacements.
impl Engine {
    /// Handles one event from the workers, waiting at most `timeout` (less when a busy
    /// worker's hang limit comes first); kills workers silent past their limit.
    fn wait_worker(&mut self, progress: &mut dyn FnMut(&StepEvent), timeout: Duration) {
        let Executor::Workers {
            pool, busy, health, ..
        } = &mut self.exec
        else {
            return;
        };
        let now = Instant::now();
        let first_limit = busy
            .iter()
            .enumerate()
            .filter_map(|(w, b)| b.front().map(|&(tag, t0)| t0 + health.limit(w as u32, tag)))
            .min();
        let wait = first_limit.map_or(timeout, |t| timeout.min(t.saturating_duration_since(now)));
        let got = match pool.recv_timeout(wait) {
            Ok(x) => Some(x),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return self.fail_all(EngineError::WorkerLost("all workers are gone".into()));
            }
        };
        if let Some((w, ev)) = got {
            self.worker_event(w, ev, progress);
        }
        self.kill_hung();
    }

    /// Workers silent past their hang limit are killed; their monotasks run again.
    fn kill_hung(&mut self) {
        let Executor::Workers { busy, health, .. } = &self.exec else {
            return;
        };
        let now = Instant::now();
        let hung: Vec<(u32, Tag, Duration)> = busy
            .iter()
            .enumerate()
            .filter_map(|(w, b)| {
                let &(tag, t0) = b.front()?;
                let limit = health.limit(w as u32, tag);
                (now.duration_since(t0) > limit).then_some((w as u32, tag, limit))
            })
            .collect();
        for (w, tag, limit) in hung {
            self.lose_worker(
                w,
                format!(
                    "silent for more than {:.1} s while running {tag} (hung); killed",
                    limit.as_secs_f64()
                ),
            );
        }
    }

    fn worker_event(&mut self, w: u32, ev: WorkerEvent, progress: &mut dyn FnMut(&StepEvent)) {
        let Executor::Workers { pool, health, .. } = &mut self.exec else {
            return;
        };
        if !pool.is_live(w) {
            // A late word from a worker already reaped (lost, hung): its monotasks were
            // re-queued; nothing it says counts.
            return;
        }
        let (tag, err) = match ev {
            WorkerEvent::Lost(why) => return self.lose_worker(w, why),
            WorkerEvent::Report(WorkerReport::Ready) => {
                if let Some(r) = health.ready.get_mut(w as usize) {
                    *r = true;
                }
                health.startup_failures = 0;
                return;
            }
            WorkerEvent::Report(WorkerReport::Done {
                request,
                step,
                monotask,
            }) => (
                Tag {
                    request,
                    step,
                    monotask,
                },
                None,
            ),
            WorkerEvent::Report(WorkerReport::Failed {
                request,
                step,
                monotask,
                error,
            }) => (
                Tag {
                    request,
                    step,
                    monotask,
                },
                Some(error),
            ),
        };
        let started = match &mut self.exec {
            Executor::Workers { busy, health, .. } => busy.get_mut(w as usize).and_then(|b| {
                // A worker runs what it holds in order: the one reported was the first, and
                // the next one started now.
                let at = b.iter().position(|(t, _)| *t == tag)?;
                let (t, t0) = b.remove(at)?;
                if at == 0 {
                    health.observed(t, t0.elapsed());
                    if let Some(next) = b.front_mut() {
                        next.1 = Instant::now();
                    }
                }
                (at == 0).then_some(t0)
            }),
            Executor::InProcess => None,
        };
        if let Some(t0) = started {
            self.account(tag, t0.elapsed());
        }
        match err {
            None => self.completed(w, tag, progress),
            Some(e) => self.failed(w, tag, e),
        }
    }

    /// Worker `w` is gone (exited, killed, hung, unreadable): its monotasks run again on the
    /// others (its running one counts an attempt), and a replacement starts unless workers
    /// keep dying before they are ready.
    fn lose_worker(&mut self, w: u32, why: String) {
        let Executor::Workers {
            pool, busy, health, ..
        } = &mut self.exec
        else {
            return;
        };
        if !pool.is_live(w) {
            return;
        }
        pool.reap(w);
        if let Some(b) = busy.get_mut(w as usize) {
            b.clear();
        }
        let was_ready = health.ready.get(w as usize).copied().unwrap_or(false);
        if !was_ready {
            health.startup_failures += 1;
        }
        let give_up = health.startup_failures >= MAX_STARTUP_FAILURES;
        log::warn!("worker {w} lost ({why})");
        let lost = self.sched.worker_lost(w).unwrap_or_default();
        if let Some(id) = lost.failed {
            self.fail(
                id,
                EngineError::WorkerLost(format!(
                    "a monotask of request {id} was running on a lost worker for the {} time \
                     (last: {why}); the request fails, the others go on",
                    self.sched.config().max_attempts
                )),
            );
        }
        if give_up {
            self.fail_all(EngineError::WorkerLost(format!(
                "workers keep exiting before they are ready ({MAX_STARTUP_FAILURES} in a row; \
                 last: {why}); no replacement is started until the next request"
            )));
            return;
        }
        self.start_replacement();
    }

    /// Starts one more worker in place of a lost one; if that fails and no worker is left,
    /// the requests in flight fail instead of waiting forever.
    fn start_replacement(&mut self) {
        let Executor::Workers {
            pool,
            busy,
            replacements,
            health,
        } = &mut self.exec
        else {
            return;
        };
        let started = self
            .sched
            .add_worker()
            .map_err(|e| e.to_string())
            .and_then(|id| {
                let r = pool.spawn(id);
                if r.is_err() {
                    let _ = self.sched.worker_lost(id);
                }
                r.map(|()| id)
            });
        match started {
            Ok(id) => {
                *replacements += 1;
                if busy.len() <= id as usize {
                    busy.resize(id as usize + 1, VecDeque::new());
                }
                if health.ready.len() <= id as usize {
                    health.ready.resize(id as usize + 1, false);
                }
            }
            Err(e) => {
                log::error!("cannot start a replacement worker: {e}");
                let alive = (0..self.sched.workers()).any(|w| self.sched.is_alive(w));
                if !alive {
                    self.fail_all(EngineError::WorkerLost(format!(
                        "no worker is left and none can be started: {e}"
                    )));
                }
            }
        }
    }
}
