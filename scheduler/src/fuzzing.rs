//! Fuzz harness (feature `fuzzing`): arbitrary bytes become a workload (arrivals, priorities,
//! sizes, skip rates, worker count, switch costs, dispatch depth) plus injected calls; the simulator runs it on
//! the real scheduler with events recorded, and the independent checker must accept the log
//! and count every request finished.

use crate::checker::SchedChecker;
use crate::sim::{simulate, ActiveModel, SimRequest};
use crate::{Scheduler, SchedulerConfig, Tag, PRIORITY_LEVELS};

/// Runs one fuzz case. Panics on any violated property.
pub fn scheduler(data: &[u8]) {
    if data.len() < 6 {
        return;
    }
    let cfg = SchedulerConfig {
        workers: 1 + data[0] as u32 % 4,
        max_requests: 1 + data[1] as usize % 8,
        switch_cost: (data[2] % 4) as f64 * 0.5,
        transfer_cost: (data[3] % 4) as f64 * 0.5,
        depth: 1 + (data[3] >> 4) as u32 % 3,
        record_events: true,
        ..Default::default()
    };
    let reqs: Vec<SimRequest> = data[4..]
        .chunks(4)
        .take(24)
        .enumerate()
        .map(|(i, c)| {
            let b = |k: usize| c.get(k).copied().unwrap_or(1);
            SimRequest {
                id: i as u64 * 3 + 1,
                arrival: b(0) as f64 * 0.25,
                priority: b(1) % PRIORITY_LEVELS as u8,
                warmup_cost: 1.0 + (b(2) % 3) as f64,
                steps: b(2) as u32 % 6,
                patches: 1 + b(3) as u32 % 9,
                patch_cost: 0.25 + (b(3) >> 4) as f64 * 0.1,
                active: if b(1) & 0x80 == 0 {
                    ActiveModel::All
                } else {
                    ActiveModel::Bernoulli {
                        p: (b(0) % 10) as f64 / 10.0,
                        max_skip: b(1) as u32 % 4,
                    }
                },
            }
        })
        .collect();
    let res = simulate(cfg, &reqs, data[5] as u64).expect("simulation of valid requests");
    assert_eq!(res.outcomes.len(), reqs.len(), "every request completes");
    let mut checker = SchedChecker::new(&cfg);
    checker
        .check_all(&res.events)
        .unwrap_or_else(|e| panic!("checker: {e}"));
    assert_eq!(checker.finished(), reqs.len() as u64);
    let again = simulate(cfg, &reqs, data[5] as u64).expect("same input");
    assert_eq!(res, again, "simulation is not deterministic");

    // Misuse never panics and never corrupts: every call answers with an error or works,
    // and the event log of whatever worked still satisfies the checker.
    let mut s = Scheduler::new(SchedulerConfig {
        record_events: true,
        ..cfg
    })
    .expect("valid config");
    for c in data.chunks(3).take(64) {
        let (a, b) = (c[0], c.get(1).copied().unwrap_or(0));
        let w = (b % 6) as u32;
        let tag = Tag {
            request: (a % 4) as u64,
            step: (b % 3) as u32,
            monotask: (a >> 4) as u32,
        };
        let res = match a % 7 {
            0 => s.submit(tag.request, b % 10, (a % 5) as f64).map(|_| ()),
            1 => s.submit_step(
                tag.request,
                tag.step,
                &[
                    (tag.monotask, 1.0),
                    ((tag.monotask + b as u32) % 5, f64::from(b) - 128.0),
                ],
            ),
            2 => s.next(w).map(|_| ()),
            3 => s.complete(w, tag).map(|_| ()),
            4 => s.fail(w, tag).map(|_| ()),
            5 => s.worker_lost(w).map(|_| ()),
            _ => s.cancel(tag.request).map(|_| ()),
        };
        // An error is a refusal with a message, never an empty one.
        if let Err(e) = res {
            assert!(!e.to_string().is_empty(), "an error without a message");
        }
    }
    let mut checker = SchedChecker::new(&cfg);
    checker
        .check_all(&s.take_events())
        .unwrap_or_else(|e| panic!("checker after misuse: {e}"));
}
