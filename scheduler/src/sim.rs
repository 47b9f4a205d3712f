//! Deterministic discrete-event simulator: workers, a cost model, arrivals and a synthetic
//! gate drive the real [`Scheduler`], so the policy can be evaluated and tested without a
//! model. Same input, same output, bit for bit.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use crate::{Completion, Event, SchedError, Scheduler, SchedulerConfig, Tag, WorkerId};

/// SplitMix64: tiny, seedable, good enough for workloads.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Arrival times of a bursty stream (a two-state Markov-modulated Poisson process): `n`
/// arrivals at mean rate `rate` per unit time, alternating between a burst state (twice the
/// rate) and a calm state (half), switching after a geometric number of arrivals (mean 8).
pub fn bursty_arrivals(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = Rng::new(seed);
    let (mut t, mut burst) = (0.0, false);
    let mut out = Vec::with_capacity(n);
    // Each state lasts 8 arrivals on average, so time splits 1 : 4 between 2x and 0.5x and
    // the long-run rate is 0.8x the base: scale the base by 1.25 to get `rate`.
    let scale = 1.25;
    for _ in 0..n {
        if rng.unit() < 1.0 / 8.0 {
            burst = !burst;
        }
        let r = rate * scale * if burst { 2.0 } else { 0.5 };
        t += -(1.0 - rng.unit()).ln() / r;
        out.push(t);
    }
    out
}

/// Which patches run each step: a stand-in for the gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ActiveModel {
    /// Every patch every step (no skipping).
    All,
    /// Each patch runs with probability `p`, never skipped more than `max_skip` steps in a
    /// row, at least one per step.
    Bernoulli {
        /// Probability a patch runs.
        p: f64,
        /// K.
        max_skip: u32,
    },
}

/// One simulated request.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Id.
    pub id: u64,
    /// Arrival time.
    pub arrival: f64,
    /// Priority.
    pub priority: u8,
    /// Cost of the warm-up monotask.
    pub warmup_cost: f64,
    /// Patch-parallel steps after the warm-up.
    pub steps: u32,
    /// Patches.
    pub patches: u32,
    /// Cost of one patch-step.
    pub patch_cost: f64,
    /// Gate stand-in.
    pub active: ActiveModel,
}

/// Outcome of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Id.
    pub id: u64,
    /// Arrival time.
    pub arrival: f64,
    /// When admission control let it in.
    pub admitted: f64,
    /// When its last step completed.
    pub completion: f64,
    /// Patch-steps that ran.
    pub patch_steps: u64,
}

/// Result of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    /// Per request, in completion order.
    pub outcomes: Vec<Outcome>,
    /// Time the last request completed.
    pub makespan: f64,
    /// Busy time per worker (work plus overhead).
    pub busy: Vec<f64>,
    /// Scheduler events (when recording was asked for).
    pub events: Vec<Event>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursty_arrivals_have_the_asked_mean_rate_and_bursts() {
        let a = bursty_arrivals(20_000, 4.0, 7);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        let rate = a.len() as f64 / a.last().unwrap();
        assert!((rate - 4.0).abs() / 4.0 < 0.15, "rate {rate}");
        // Burstier than Poisson: gaps have a coefficient of variation above 1.
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        let m = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - m).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!(sd / m > 1.05, "cv {}", sd / m);
        assert_eq!(a, bursty_arrivals(20_000, 4.0, 7));
    }
}

#[derive(Debug, PartialEq)]
struct Pending {
    time: f64,
    seq: u64,
    kind: Kind,
}

#[derive(Debug, PartialEq)]
enum Kind {
    Arrive(usize),
    Done(WorkerId, Tag),
}

impl Eq for Pending {}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (time, seq).
        o.time.total_cmp(&self.time).then(o.seq.cmp(&self.seq))
    }
}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

struct ReqSim {
    step: u32,
    skip_run: Vec<u32>,
    rng: Rng,
    patch_steps: u64,
    admitted: f64,
}

impl ReqSim {
    /// The patches that run this step under the request's activity model (at least one;
    /// none skipped more than `max_skip` steps in a row), updating the skip runs.
    fn draw_active(&mut self, r: &SimRequest) -> Vec<usize> {
        let mut active = Vec::new();
        for p in 0..r.patches as usize {
            let run = match r.active {
                ActiveModel::All => true,
                ActiveModel::Bernoulli { p: prob, max_skip } => {
                    self.step == 1 || self.skip_run[p] >= max_skip || self.rng.unit() < prob
                }
            };
            if run {
                active.push(p);
            }
        }
        if active.is_empty() {
            active.push((self.rng.next_u64() % r.patches as u64) as usize);
        }
        let mut run = vec![false; r.patches as usize];
        for &p in &active {
            run[p] = true;
        }
        for (p, &ran) in run.iter().enumerate() {
            self.skip_run[p] = if ran { 0 } else { self.skip_run[p] + 1 };
        }
        active
    }
}

/// Runs `requests` on a scheduler built from `cfg` until every request completes.
pub fn simulate(
    cfg: SchedulerConfig,
    requests: &[SimRequest],
    seed: u64,
) -> Result<SimResult, SchedError> {
    let mut s = Scheduler::new(cfg)?;
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Pending>, time: f64, kind: Kind| {
        seq += 1;
        heap.push(Pending { time, seq, kind });
    };
    for (i, r) in requests.iter().enumerate() {
        push(&mut heap, r.arrival, Kind::Arrive(i));
    }
    let index: std::collections::HashMap<u64, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let mut state: Vec<Option<ReqSim>> = (0..requests.len()).map(|_| None).collect();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    // Monotasks each worker holds (running plus dispatched ahead, up to `cfg.depth`) and
    // when it will have finished the last of them: it runs them one after another.
    let mut held = vec![0u32; cfg.workers as usize];
    let mut free_at = vec![0.0f64; cfg.workers as usize];
    let mut busy = vec![0.0; cfg.workers as usize];
    let mut outcomes = Vec::new();
    let mut events = Vec::new();
    let mut now = 0.0;

    while let Some(ev) = heap.pop() {
        now = ev.time;
        let admit = |i: usize,
                     s: &mut Scheduler,
                     state: &mut Vec<Option<ReqSim>>|
         -> Result<bool, SchedError> {
            let r = &requests[i];
            match s.submit(r.id, r.priority, r.warmup_cost) {
                Ok(()) => {
                    state[i] = Some(ReqSim {
                        step: 0,
                        skip_run: vec![0; r.patches as usize],
                        rng: Rng::new(seed ^ r.id.wrapping_mul(0x2545_F491_4F6C_DD1D)),
                        patch_steps: 0,
                        admitted: now,
                    });
                    Ok(true)
                }
                Err(SchedError::Full { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        };
        match ev.kind {
            Kind::Arrive(i) => {
                if !waiting.is_empty() || !admit(i, &mut s, &mut state)? {
                    waiting.push_back(i);
                }
            }
            Kind::Done(w, tag) => {
                held[w as usize] -= 1;
                let done = match s.complete(w, tag)? {
                    Completion::WarmupDone(r) => Some(r),
                    Completion::StepDone(r, _) => Some(r),
                    _ => None,
                };
                if let Some(id) = done {
                    let i = index[&id];
                    let r = &requests[i];
                    let st = state[i].as_mut().expect("admitted");
                    if st.step == r.steps {
                        s.finish(id)?;
                        outcomes.push(Outcome {
                            id,
                            arrival: r.arrival,
                            admitted: st.admitted,
                            completion: now,
                            patch_steps: st.patch_steps,
                        });
                        while let Some(&j) = waiting.front() {
                            if admit(j, &mut s, &mut state)? {
                                waiting.pop_front();
                            } else {
                                break;
                            }
                        }
                    } else {
                        st.step += 1;
                        let active = st.draw_active(r);
                        st.patch_steps += active.len() as u64;
                        let list: Vec<(u32, f64)> =
                            active.iter().map(|&p| (p as u32, r.patch_cost)).collect();
                        s.submit_step(id, st.step, &list)?;
                    }
                }
            }
        }
        // Breadth first: every idle worker gets a monotask before any is given one ahead.
        for depth in 0..cfg.depth {
            for w in 0..held.len() {
                if held[w] == depth {
                    if let Some(a) = s.next(w as WorkerId)? {
                        held[w] += 1;
                        let d = a.task.cost + a.overhead;
                        busy[w] += d;
                        free_at[w] = free_at[w].max(now) + d;
                        push(&mut heap, free_at[w], Kind::Done(w as WorkerId, a.task.tag));
                    }
                }
            }
        }
        if cfg.record_events {
            events.extend(s.take_events());
        }
    }
    if !waiting.is_empty() {
        return Err(SchedError::BadConfig(format!(
            "{} requests never admitted",
            waiting.len()
        )));
    }
    Ok(SimResult {
        outcomes,
        makespan: now,
        busy,
        events,
    })
}
