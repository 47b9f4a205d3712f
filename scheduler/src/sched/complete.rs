//! Completions and failures, lost and added workers, finishing and cancelling requests.

use super::*;

impl Scheduler {
    /// Where `tag` is among worker `w`'s held monotasks.
    pub(super) fn held_at(&self, w: WorkerId, tag: Tag) -> Result<usize, SchedError> {
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
    pub(super) fn end(&mut self, request: RequestId, failed: bool) {
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
}
