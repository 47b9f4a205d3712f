//! Independent checker of scheduler event logs. It rebuilds workers, steps and the ready set
//! from the events alone and fails on the first violated rule:
//! - no worker runs two monotasks at once;
//! - step barriers: a step opens only when the request's previous step has completed, and
//!   only monotasks of a request's open step run;
//! - every monotask of a finished request completed exactly once;
//! - no ready higher-priority monotask waits while a worker takes a lower one, except a
//!   `KeptOwn` dispatch whose recorded benefit did not exceed its switch cost.

use std::collections::{BTreeMap, HashMap};

use crate::{Event, Pick, RequestId, Tag, WorkerId};

#[derive(Debug, Default)]
struct ReqView {
    open: Option<u32>,
    expected: u32,
    done_in_open: u32,
    completions: HashMap<Tag, u32>,
}

/// Incremental checker: feed events in order.
#[derive(Debug, Default)]
pub struct SchedChecker {
    running: HashMap<WorkerId, Tag>,
    ready: BTreeMap<Tag, u8>,
    requests: HashMap<RequestId, ReqView>,
    finished: u64,
}

impl SchedChecker {
    /// An empty checker.
    pub fn new() -> Self {
        Self::default()
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

    /// Checks one event.
    pub fn check(&mut self, e: &Event) -> Result<(), String> {
        match *e {
            Event::StepOpened {
                request,
                step,
                tasks,
            } => {
                let r = self.requests.entry(request).or_default();
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
            Event::Ready { tag, priority, .. } => {
                self.ready.insert(tag, priority);
            }
            Event::Dispatched {
                worker,
                tag,
                priority,
                pick,
            } => {
                if let Some(t) = self.running.get(&worker) {
                    return Err(format!("worker {worker} already runs {t}"));
                }
                if self.ready.remove(&tag).is_none() {
                    return Err(format!("{tag} dispatched but not ready"));
                }
                let r = self
                    .requests
                    .get(&tag.request)
                    .ok_or("dispatch for an unknown request")?;
                if r.open != Some(tag.step) {
                    return Err(format!("{tag} runs but the open step is {:?}", r.open));
                }
                let top = self.ready.values().copied().max();
                match pick {
                    Pick::Own | Pick::Stolen { .. } => {
                        if let Some(top) = top.filter(|&t| t > priority) {
                            return Err(format!(
                                "took priority {priority} while priority {top} was ready"
                            ));
                        }
                    }
                    Pick::KeptOwn {
                        waiting_priority,
                        benefit,
                        cost,
                    } => {
                        if benefit > cost {
                            return Err(format!(
                                "kept own work though benefit {benefit} > switch cost {cost}"
                            ));
                        }
                        if waiting_priority <= priority {
                            return Err("KeptOwn without a higher-priority monotask waiting".into());
                        }
                    }
                }
                self.running.insert(worker, tag);
            }
            Event::Completed { worker, tag } => {
                if self.running.get(&worker) != Some(&tag) {
                    return Err(format!(
                        "worker {worker} completed {tag} it was not running"
                    ));
                }
                self.running.remove(&worker);
                let r = self
                    .requests
                    .get_mut(&tag.request)
                    .ok_or("completion for an unknown request")?;
                let n = r.completions.entry(tag).or_insert(0);
                *n += 1;
                if *n > 1 {
                    return Err(format!("{tag} applied twice"));
                }
                r.done_in_open += 1;
                if r.done_in_open == r.expected {
                    r.open = None;
                }
            }
            Event::Requeued { tag } => {
                self.running.retain(|_, t| *t != tag);
            }
            Event::WorkerLost(w) => {
                self.running.remove(&w);
            }
            Event::RequestEnded { request, failed } => {
                let r = self.requests.remove(&request).unwrap_or_default();
                self.ready.retain(|t, _| t.request != request);
                if !failed {
                    if r.open.is_some() {
                        return Err("request finished with a step in flight".into());
                    }
                    if let Some((t, n)) = r.completions.iter().find(|(_, &n)| n != 1) {
                        return Err(format!("{t} completed {n} times"));
                    }
                    self.finished += 1;
                }
            }
        }
        Ok(())
    }
}
