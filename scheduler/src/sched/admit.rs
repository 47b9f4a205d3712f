//! Admitting requests (new or resumed from a checkpoint) and opening their steps.

use super::*;

impl Scheduler {
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

    pub(super) fn admit(
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
}
