//! Independent checker of scheduler event logs. From the events alone (the scheduler's inputs
//! and decisions) it rebuilds requests, step barriers, every worker's queue, load and state
//! holdings, recomputes each decision the way the paper states it, and fails on the first
//! that differs:
//! - no worker holds more than `depth` monotasks at once (it runs the first, the others
//!   wait in its hand-off queue); only monotasks of a request's open step run; a
//!   step opens only when the previous one completed; every monotask of a finished request
//!   completed exactly once;
//! - placement is equation 1 with affinity: the chosen worker minimises the maximum load
//!   after adding the monotask (plus the transfer cost where it does not hold the request's
//!   state); a warm-up goes to the least-loaded worker;
//! - dispatch: a worker takes the head of its own highest level unless another worker's
//!   head is of a higher level, and then takes that one exactly when Benefit (the work queued
//!   ahead of it times one plus the priority gap) exceeds SwitchCost, keeping its own
//!   (`KeptOwn`) otherwise; the head of a level is its request admitted first (or with the
//!   earliest deadline under [`QueueOrder::Deadline`]), so arrival order within a level holds.
//!
//! Loads, charges and benefits are recomputed here, never read from the log. Comparisons
//! of recomputed floating-point quantities allow a relative slack of 1e-9, so that a
//! different summation order cannot fail a correct log; a decision within that slack may go
//! either way.

use std::collections::{HashMap, HashSet};

use crate::sched::QueueOrder;
use crate::{Event, Pick, RequestId, SchedulerConfig, Tag, WorkerId, WARMUP_MONOTASK};

#[derive(Debug, Default)]
struct ReqView {
    open: Option<u32>,
    expected: u32,
    done_in_open: u32,
    completions: HashMap<Tag, u32>,
    arrival: u64,
    deadline: Option<f64>,
    /// The priority the request was admitted with: every monotask of it queues at this one.
    priority: u8,
    holders: HashSet<WorkerId>,
}

#[derive(Debug, Clone, Copy)]
struct QItem {
    tag: Tag,
    priority: u8,
    cost: f64,
    charged: f64,
    seq: u64,
}

#[derive(Debug)]
struct WorkerView {
    alive: bool,
    load: f64,
    queue: Vec<QItem>,
    /// Monotasks dispatched to it and not reported, in dispatch order (the first runs).
    held: Vec<Held>,
}

/// A dispatched monotask: tag, cost, charge, and whether its request has ended since (a
/// later incarnation of the id may then reuse the tag).
#[derive(Debug, Clone, Copy)]
struct Held {
    tag: Tag,
    cost: f64,
    charged: f64,
    ended: bool,
}

impl WorkerView {
    fn new() -> Self {
        Self {
            alive: true,
            load: 0.0,
            queue: Vec::new(),
            held: Vec::new(),
        }
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Incremental checker: feed events in order.
#[derive(Debug)]
pub struct SchedChecker {
    cfg: SchedulerConfig,
    workers: Vec<WorkerView>,
    requests: HashMap<RequestId, ReqView>,
    admitted: u64,
    pushes: u64,
    finished: u64,
    /// Executions of each monotask that ended in a failure or its worker's loss.
    attempts: HashMap<Tag, u32>,
    /// A request whose monotask just used its last attempt: the next event must end it.
    must_fail: Option<RequestId>,
}

impl SchedChecker {
    /// A checker for a scheduler built with `cfg` (its workers, costs and queue order).
    pub fn new(cfg: &SchedulerConfig) -> Self {
        Self {
            cfg: *cfg,
            workers: (0..cfg.workers).map(|_| WorkerView::new()).collect(),
            requests: HashMap::new(),
            admitted: 0,
            pushes: 0,
            finished: 0,
            attempts: HashMap::new(),
            must_fail: None,
        }
    }

    /// Counts one lost execution of `tag`; at the last allowed one its request must fail.
    fn attempt_lost(&mut self, tag: Tag) {
        if !self.requests.contains_key(&tag.request) {
            return;
        }
        let n = self.attempts.entry(tag).or_insert(0);
        *n += 1;
        if *n >= self.cfg.max_attempts {
            self.must_fail = Some(tag.request);
        }
    }

    /// Requests that finished (not failed) and passed the exactly-once check.
    pub fn finished(&self) -> u64 {
        self.finished
    }

    /// Checks a slice of events, in order.
    pub fn check_all(&mut self, events: &[Event]) -> Result<(), String> {
        for (i, e) in events.iter().enumerate() {
            self.check(e).map_err(|m| format!("event {i} {e:?}: {m}"))?;
        }
        Ok(())
    }

    fn worker(&mut self, w: WorkerId) -> Result<&mut WorkerView, String> {
        self.workers
            .get_mut(w as usize)
            .ok_or_else(|| format!("worker {w} does not exist"))
    }

    /// Queue key of an item: (deadline, arrival, push order), smallest first.
    fn key(&self, q: &QItem) -> (f64, u64, u64) {
        let r = self.requests.get(&q.tag.request);
        let deadline = match self.cfg.order {
            QueueOrder::Arrival => 0.0,
            QueueOrder::Deadline => r.and_then(|r| r.deadline).unwrap_or(f64::INFINITY),
        };
        (deadline, r.map_or(u64::MAX, |r| r.arrival), q.seq)
    }

    /// Worker `g`'s head: its highest level's first item.
    fn head(&self, g: usize) -> Option<QItem> {
        let top = self.workers[g].queue.iter().map(|q| q.priority).max()?;
        self.workers[g]
            .queue
            .iter()
            .filter(|q| q.priority == top)
            .min_by(|a, b| {
                let (ka, kb) = (self.key(a), self.key(b));
                ka.0.total_cmp(&kb.0)
                    .then(ka.1.cmp(&kb.1))
                    .then(ka.2.cmp(&kb.2))
            })
            .copied()
    }

    fn alive(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.workers.len()).filter(|&g| self.workers[g].alive)
    }

    /// Equation 1 for `tag` of `cost` placed on `worker`; returns the charge it adds.
    fn check_placement(&self, tag: Tag, cost: f64, worker: usize) -> Result<f64, String> {
        let alive: Vec<usize> = self.alive().collect();
        if !alive.contains(&worker) {
            return Err(format!("placed on worker {worker}, which is not alive"));
        }
        let warmup = tag.monotask == WARMUP_MONOTASK;
        let holds = |g: usize| {
            self.requests
                .get(&tag.request)
                .is_some_and(|r| r.holders.contains(&(g as WorkerId)))
        };
        let extra = |g: usize| {
            if warmup || holds(g) {
                0.0
            } else {
                self.cfg.transfer_cost
            }
        };
        let key = |g: usize| {
            let load = self.workers[g].load;
            if warmup {
                return load;
            }
            let others = alive
                .iter()
                .filter(|&&v| v != g)
                .map(|&v| self.workers[v].load)
                .fold(f64::NEG_INFINITY, f64::max);
            (load + cost + extra(g)).max(others)
        };
        let best = alive.iter().map(|&g| key(g)).fold(f64::INFINITY, f64::min);
        let chosen = key(worker);
        if chosen > best && !close(chosen, best) {
            let better = alive
                .iter()
                .copied()
                .find(|&g| key(g) == best)
                .expect("the minimum is some worker's");
            return Err(format!(
                "equation 1: worker {worker} ends at max load {chosen}, worker {better} at {best}"
            ));
        }
        Ok(cost + extra(worker))
    }

    /// What worker `w` must take now (Algorithm 1, lines 17-21), recomputed: the item, the
    /// worker it is queued on, the pick kind, and whether the benefit/cost comparison was too
    /// close to call.
    fn expected_pick(&self, w: usize) -> Option<(QItem, usize, Pick, bool)> {
        let own = self.head(w);
        let mut foreign: Option<(QItem, usize)> = None;
        for v in self.alive().filter(|&v| v != w) {
            if let Some(h) = self.head(v) {
                let better = foreign.is_none_or(|(f, fv)| {
                    (h.priority, self.workers[v].load) > (f.priority, self.workers[fv].load)
                });
                if better {
                    foreign = Some((h, v));
                }
            }
        }
        match (own, foreign) {
            (None, None) => None,
            (Some(o), f) if f.is_none_or(|(h, _)| o.priority >= h.priority) => {
                Some((o, w, Pick::Own, false))
            }
            (own, Some((h, v))) => {
                let holder = self
                    .requests
                    .get(&h.tag.request)
                    .is_some_and(|r| r.holders.contains(&(w as WorkerId)));
                let cost = self.cfg.switch_cost + if holder { 0.0 } else { self.cfg.transfer_cost };
                let gap = h.priority as f64 - own.map_or(-1.0, |o| o.priority as f64);
                let running_v: f64 = self.workers[v].held.iter().map(|h| h.cost).sum();
                let ahead = (self.workers[v].load - h.cost).max(0.0).max(running_v);
                let benefit = ahead * (1.0 + gap);
                let tight = close(benefit, cost);
                if benefit > cost {
                    Some((
                        h,
                        v,
                        Pick::Stolen {
                            from: v as WorkerId,
                        },
                        tight,
                    ))
                } else if let Some(o) = own {
                    Some((
                        o,
                        w,
                        Pick::KeptOwn {
                            waiting_priority: h.priority,
                            benefit,
                            cost,
                        },
                        tight,
                    ))
                } else if tight {
                    // Nothing of its own and too close to call: taking it is acceptable.
                    Some((
                        h,
                        v,
                        Pick::Stolen {
                            from: v as WorkerId,
                        },
                        true,
                    ))
                } else {
                    None
                }
            }
            (Some(_), None) => unreachable!("covered by the own arm"),
        }
    }

    /// Removes `tag` from worker `g`'s queue, returning it.
    fn unqueue(&mut self, g: usize, tag: Tag) -> Option<QItem> {
        let q = &mut self.workers[g].queue;
        let i = q.iter().position(|x| x.tag == tag)?;
        Some(q.swap_remove(i))
    }

    fn check_dispatch(
        &mut self,
        worker: WorkerId,
        tag: Tag,
        priority: u8,
        pick: Pick,
    ) -> Result<(), String> {
        let w = worker as usize;
        if !self.worker(worker)?.alive {
            return Err(format!("worker {worker} is not alive"));
        }
        if self.workers[w].held.len() >= self.cfg.depth as usize {
            let t = self.workers[w].held[0].tag;
            return Err(format!(
                "worker {worker} already holds {} monotasks (runs {t}); depth is {}",
                self.workers[w].held.len(),
                self.cfg.depth
            ));
        }
        let r = self
            .requests
            .get(&tag.request)
            .ok_or("dispatch for an unknown request")?;
        if r.open != Some(tag.step) {
            return Err(format!("{tag} runs but the open step is {:?}", r.open));
        }
        let Some((want, from, kind, tight)) = self.expected_pick(w) else {
            return Err(format!("{tag} dispatched but nothing is queued"));
        };
        let (item, from) = if want.tag == tag {
            (want, from)
        } else if tight {
            // Too close to call: the other branch's monotask is acceptable.
            let g = (0..self.workers.len())
                .find(|&g| self.workers[g].queue.iter().any(|q| q.tag == tag))
                .ok_or_else(|| format!("{tag} dispatched but not queued"))?;
            let q = *self.workers[g]
                .queue
                .iter()
                .find(|q| q.tag == tag)
                .expect("found above");
            if Some(q.tag) != self.head(g).map(|h| h.tag) {
                return Err(format!("{tag} is not the head of worker {g}'s queue"));
            }
            (q, g)
        } else {
            let q = self
                .workers
                .iter()
                .flat_map(|x| &x.queue)
                .find(|q| q.tag == tag);
            return Err(match q {
                None => format!("{tag} dispatched but not queued"),
                Some(q) => format!(
                    "took {tag} (priority {}) but the rule picks {} (priority {}) from worker {from} ({kind:?})",
                    q.priority, want.tag, want.priority
                ),
            });
        };
        if item.priority != priority {
            return Err(format!(
                "logged priority {priority}, queued with {}",
                item.priority
            ));
        }
        let same_kind = std::mem::discriminant(&pick) == std::mem::discriminant(&kind);
        let ok = match pick {
            Pick::Own => matches!(kind, Pick::Own) && from == w,
            Pick::Stolen { from: f } => f as usize == from && from != w && (same_kind || tight),
            Pick::KeptOwn {
                waiting_priority, ..
            } => {
                if waiting_priority <= priority {
                    return Err("KeptOwn without a higher-priority monotask waiting".into());
                }
                from == w && (same_kind || tight)
            }
        };
        if !ok {
            return Err(format!(
                "logged {pick:?}, the recomputed decision is {kind:?} from worker {from}"
            ));
        }
        self.unqueue(from, tag).expect("found above");
        let charged = if from == w {
            item.charged
        } else {
            let holder = self
                .requests
                .get(&tag.request)
                .is_some_and(|r| r.holders.contains(&worker));
            let v = &mut self.workers[from];
            v.load = (v.load - item.charged).max(0.0);
            let overhead = self.cfg.switch_cost + if holder { 0.0 } else { self.cfg.transfer_cost };
            let c = item.cost + overhead;
            self.workers[w].load += c;
            if let Some(r) = self.requests.get_mut(&tag.request) {
                r.holders.insert(worker);
            }
            c
        };
        self.workers[w].held.push(Held {
            tag,
            cost: item.cost,
            charged,
            ended: false,
        });
        Ok(())
    }

    /// Frees worker `worker` from `tag` (its oldest holding of that tag), taking its charge
    /// off; returns the holding.
    fn release(&mut self, worker: WorkerId, tag: Tag) -> Result<Held, String> {
        let wv = self.worker(worker)?;
        let i = wv
            .held
            .iter()
            .position(|h| h.tag == tag)
            .ok_or_else(|| format!("worker {worker} reported {tag} it was not running"))?;
        let h = wv.held.remove(i);
        wv.load = (wv.load - h.charged).max(0.0);
        Ok(h)
    }

    /// Whether a worker holds `tag` for its request's current incarnation.
    fn held_live(&self, tag: Tag) -> bool {
        self.workers
            .iter()
            .any(|w| w.held.iter().any(|h| h.tag == tag && !h.ended))
    }

    fn on_ready(
        &mut self,
        tag: Tag,
        priority: u8,
        worker: WorkerId,
        cost: f64,
    ) -> Result<(), String> {
        let g = worker as usize;
        if g >= self.workers.len() {
            return Err(format!("worker {worker} does not exist"));
        }
        let Some(admitted) = self.requests.get(&tag.request).map(|r| r.priority) else {
            return Err(format!("{tag} queued for a request not admitted"));
        };
        // The queue position follows the admitted request's priority, not what the log says.
        if priority != admitted {
            return Err(format!(
                "{tag} queued at priority {priority}, its request was admitted at {admitted}"
            ));
        }
        if self.held_live(tag)
            || self
                .workers
                .iter()
                .any(|w| w.queue.iter().any(|q| q.tag == tag))
        {
            return Err(format!("{tag} queued while already queued or running"));
        }
        let charged = self.check_placement(tag, cost, g)?;
        self.workers[g].load += charged;
        self.workers[g].queue.push(QItem {
            tag,
            priority,
            cost,
            charged,
            seq: self.pushes,
        });
        self.pushes += 1;
        if let Some(r) = self.requests.get_mut(&tag.request) {
            r.holders.insert(worker);
        }
        Ok(())
    }

    fn on_completed(&mut self, worker: WorkerId, tag: Tag) -> Result<(), String> {
        if self.release(worker, tag)?.ended {
            return Err(format!("{tag} applied after its request ended"));
        }
        let r = self
            .requests
            .get_mut(&tag.request)
            .ok_or("completion for an unknown request")?;
        if r.open != Some(tag.step) {
            return Err(format!("{tag} completed but the open step is {:?}", r.open));
        }
        let n = r.completions.entry(tag).or_insert(0);
        *n += 1;
        if *n > 1 {
            return Err(format!("{tag} applied twice"));
        }
        r.done_in_open += 1;
        if r.done_in_open == r.expected {
            r.open = None;
        }
        Ok(())
    }

    /// After `Failed` or `WorkerLost`, which freed its worker: its `Ready` follows.
    fn on_requeued(&mut self, tag: Tag) -> Result<(), String> {
        // After `Failed` or `WorkerLost`, which freed its worker: its `Ready` follows.
        if self.held_live(tag) {
            return Err(format!("{tag} re-queued while a worker still runs it"));
        }
        if self
            .attempts
            .get(&tag)
            .is_some_and(|&n| n >= self.cfg.max_attempts)
        {
            return Err(format!(
                "{tag} re-queued after {} lost attempts",
                self.cfg.max_attempts
            ));
        }
        Ok(())
    }

    fn on_worker_lost(&mut self, w: WorkerId) -> Result<(), String> {
        // Only the first held monotask was running; the others never started.
        let wv = self.worker(w)?;
        let lost = wv.held.first().filter(|h| !h.ended).map(|h| h.tag);
        wv.alive = false;
        wv.load = 0.0;
        wv.held.clear();
        wv.queue.clear();
        for r in self.requests.values_mut() {
            r.holders.remove(&w);
        }
        if let Some(tag) = lost {
            self.attempt_lost(tag);
        }
        Ok(())
    }

    fn on_request_ended(&mut self, request: RequestId, failed: bool) -> Result<(), String> {
        let r = self
            .requests
            .remove(&request)
            .ok_or_else(|| format!("request {request} ended but was not admitted"))?;
        self.attempts.retain(|t, _| t.request != request);
        for w in &mut self.workers {
            for h in w.held.iter_mut().filter(|h| h.tag.request == request) {
                h.ended = true;
            }
            let (gone, kept): (Vec<QItem>, Vec<QItem>) = std::mem::take(&mut w.queue)
                .into_iter()
                .partition(|q| q.tag.request == request);
            w.queue = kept;
            for q in gone {
                w.load = (w.load - q.charged).max(0.0);
            }
        }
        if !failed {
            if r.open.is_some() {
                return Err("request finished with a step in flight".into());
            }
            if let Some((t, n)) = r.completions.iter().find(|(_, &n)| n != 1) {
                return Err(format!("{t} completed {n} times"));
            }
            self.finished += 1;
        }
        Ok(())
    }

    /// Checks one event.
    pub fn check(&mut self, e: &Event) -> Result<(), String> {
        if let Some(r) = self.must_fail.take() {
            if *e
                != (Event::RequestEnded {
                    request: r,
                    failed: true,
                })
            {
                return Err(format!(
                    "a monotask of request {r} used its last of {} attempts, but the request \
                     did not fail next",
                    self.cfg.max_attempts
                ));
            }
        }
        match *e {
            Event::Admitted {
                request,
                priority,
                deadline,
            } => {
                if self.requests.contains_key(&request) {
                    return Err(format!("request {request} admitted twice"));
                }
                self.requests.insert(
                    request,
                    ReqView {
                        arrival: self.admitted,
                        deadline,
                        priority,
                        ..Default::default()
                    },
                );
                self.admitted += 1;
            }
            Event::StepOpened {
                request,
                step,
                tasks,
            } => {
                let r = self
                    .requests
                    .get_mut(&request)
                    .ok_or_else(|| format!("step {step} of a request never admitted"))?;
                if let Some(open) = r.open {
                    return Err(format!(
                        "step {step} opened while step {open} has {} of {} done",
                        r.done_in_open, r.expected
                    ));
                }
                if tasks == 0 {
                    return Err("empty step".into());
                }
                r.open = Some(step);
                r.expected = tasks;
                r.done_in_open = 0;
            }
            Event::Ready {
                tag,
                priority,
                worker,
                cost,
            } => self.on_ready(tag, priority, worker, cost)?,
            Event::Dispatched {
                worker,
                tag,
                priority,
                pick,
            } => self.check_dispatch(worker, tag, priority, pick)?,
            Event::Completed { worker, tag } => self.on_completed(worker, tag)?,
            Event::Dropped { worker, tag } => {
                self.release(worker, tag)?;
            }
            Event::Failed { worker, tag } => {
                if !self.release(worker, tag)?.ended {
                    self.attempt_lost(tag);
                }
            }
            Event::Requeued { tag } => self.on_requeued(tag)?,
            Event::WorkerLost(w) => self.on_worker_lost(w)?,
            Event::WorkerAdded(w) => {
                if w as usize != self.workers.len() {
                    return Err(format!("worker {w} added, expected {}", self.workers.len()));
                }
                self.workers.push(WorkerView::new());
            }
            Event::RequestEnded { request, failed } => self.on_request_ended(request, failed)?,
        }
        Ok(())
    }
}
