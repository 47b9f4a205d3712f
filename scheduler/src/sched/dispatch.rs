//! Placement (least maximum load after the monotask, plus the transfer cost: equation 1)
//! and dispatch (a worker's own highest level, unless moving another's saves more than the
//! switch cost).

use super::*;

impl Scheduler {
    /// Eq. 1 with affinity: the worker minimising the maximum load after adding the task,
    /// where a worker that does not hold the request's state also pays `transfer_cost`;
    /// ties prefer a holder, then the lighter worker, then the lower id. Warm-ups go to the
    /// least-loaded worker (no state exists yet).
    pub(super) fn place(&mut self, mut m: Monotask) {
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
    pub(super) fn push(&mut self, g: usize, m: Monotask) {
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
    pub(super) fn head_level(&self, g: usize) -> Option<usize> {
        (0..PRIORITY_LEVELS)
            .rev()
            .find(|&l| !self.workers[g].levels[l].is_empty())
    }

    /// The head of level `level` on worker `g`.
    pub(super) fn head(&self, g: usize, level: usize) -> Monotask {
        self.workers[g].levels[level]
            .peek()
            .expect("head_level found the level non-empty")
            .m
    }

    /// Whether `m` belongs to the current incarnation of an admitted request.
    pub(super) fn is_current(&self, m: &Monotask) -> bool {
        self.requests
            .get(&m.tag.request)
            .is_some_and(|r| r.epoch == m.epoch)
    }

    pub(super) fn take_head(&mut self, g: usize, level: usize) -> Monotask {
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
}
