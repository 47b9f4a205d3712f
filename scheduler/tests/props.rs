//! Scheduler properties: simulated workloads pass the independent checker; the paper's rules
//! (barriers, eq. 1 packing, priority, switch cost, at-most-once, admission) hold in unit cases.

use flashdiff_scheduler::checker::SchedChecker;
use flashdiff_scheduler::sim::{simulate, ActiveModel, SimRequest};
use flashdiff_scheduler::{
    Completion, Event, Pick, QueueOrder, SchedError, Scheduler, SchedulerConfig, Tag,
    PRIORITY_LEVELS, WARMUP_MONOTASK,
};
use proptest::prelude::*;

fn cfg(workers: u32) -> SchedulerConfig {
    SchedulerConfig {
        workers,
        record_events: true,
        ..Default::default()
    }
}

fn request() -> impl Strategy<Value = (f64, u8, u32, u32, f64, Option<(f64, u32)>)> {
    (
        0.0f64..20.0,
        0u8..PRIORITY_LEVELS as u8,
        0u32..8,
        1u32..12,
        0.1f64..2.0,
        prop::option::of((0.0f64..1.0, 0u32..5)),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn simulated_workloads_pass_the_checker(
        workers in 1u32..5,
        max_requests in 1usize..10,
        switch in 0.0f64..2.0,
        transfer in 0.0f64..2.0,
        reqs in prop::collection::vec(request(), 1..20),
        seed in any::<u64>(),
        depth in 1u32..4,
    ) {
        let c = SchedulerConfig { workers, max_requests, switch_cost: switch, transfer_cost: transfer, record_events: true, depth, ..Default::default() };
        let reqs: Vec<SimRequest> = reqs.into_iter().enumerate().map(|(i, (arrival, priority, steps, patches, patch_cost, skip))| SimRequest {
            id: i as u64 + 100, arrival, priority, warmup_cost: 1.0, steps, patches, patch_cost,
            active: skip.map_or(ActiveModel::All, |(p, max_skip)| ActiveModel::Bernoulli { p, max_skip }),
        }).collect();
        let res = simulate(c, &reqs, seed).unwrap();
        prop_assert_eq!(res.outcomes.len(), reqs.len());
        let mut checker = SchedChecker::new(&c);
        prop_assert_eq!(checker.check_all(&res.events), Ok(()));
        prop_assert_eq!(checker.finished(), reqs.len() as u64);
        for o in &res.outcomes {
            prop_assert!(o.completion >= o.admitted && o.admitted >= o.arrival);
        }
        prop_assert_eq!(res, simulate(c, &reqs, seed).unwrap());
    }
}

fn run_warmup(s: &mut Scheduler, w: u32, r: u64) {
    let a = s.next(w).unwrap().unwrap();
    assert_eq!(
        a.task.tag,
        Tag {
            request: r,
            step: 0,
            monotask: WARMUP_MONOTASK
        }
    );
    assert_eq!(
        s.complete(w, a.task.tag).unwrap(),
        Completion::WarmupDone(r)
    );
}

#[test]
fn barriers_hold() {
    let mut s = Scheduler::new(cfg(1)).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    assert!(matches!(
        s.submit_step(1, 5, &[(0, 1.0)]),
        Err(SchedError::Barrier { .. })
    ));
    run_warmup(&mut s, 0, 1);
    s.submit_step(1, 5, &[(0, 1.0), (1, 1.0)]).unwrap();
    assert!(matches!(
        s.submit_step(1, 6, &[(0, 1.0)]),
        Err(SchedError::Barrier { .. })
    ));
    for _ in 0..2 {
        let a = s.next(0).unwrap().unwrap();
        s.complete(0, a.task.tag).unwrap();
    }
    assert!(matches!(
        s.submit_step(1, 5, &[(0, 1.0)]),
        Err(SchedError::Barrier {
            why: "steps must increase",
            ..
        })
    ));
    assert!(matches!(
        s.submit_step(1, 6, &[(0, 1.0), (0, 2.0)]),
        Err(SchedError::BadPatches(_))
    ));
    assert!(matches!(
        s.submit_step(1, 6, &[]),
        Err(SchedError::BadPatches(_))
    ));
    assert!(
        matches!(s.submit_step(1, 6, &[(0, f64::NAN)]), Err(SchedError::BadCost(c)) if c.is_nan())
    );
    s.submit_step(1, 6, &[(3, 1.0)]).unwrap();
    assert_eq!(s.finish(1), Err(SchedError::NotIdle(1)));
}

#[test]
fn least_max_load_packing_balances_and_prefers_state_holders() {
    let mut c = cfg(2);
    c.transfer_cost = 0.5;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    run_warmup(&mut s, 0, 1); // worker 0 now holds request 1's state
    s.take_events();
    s.submit_step(1, 1, &[(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0)])
        .unwrap();
    let placed: Vec<u32> = s
        .take_events()
        .iter()
        .filter_map(|e| match e {
            Event::Ready { worker, .. } => Some(*worker),
            _ => None,
        })
        .collect();
    // Eq. 1: 0 -> w0 (holder, load 1); 1 -> w1 (max(1, 1.5) < 2); 2 -> w0 (max 2 < 2.5);
    // 3 -> w1 (max(2, 2.5) < 3).
    assert_eq!(placed, [0, 1, 0, 1]);
    let l = s.load();
    assert_eq!(l.per_worker, vec![2.0, 2.5]);
}

/// Worker 0 runs `n` monotasks one after another; the requests they belonged to, in order.
fn warmups_in_order(s: &mut Scheduler, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let a = s.next(0).unwrap().unwrap();
            s.complete(0, a.task.tag).unwrap();
            a.task.tag.request
        })
        .collect()
}

#[test]
fn highest_priority_first_fifo_within_a_level() {
    let mut s = Scheduler::new(cfg(1)).unwrap();
    s.submit(1, 1, 1.0).unwrap();
    s.submit(2, 1, 1.0).unwrap();
    s.submit(3, 6, 1.0).unwrap();
    let order = warmups_in_order(&mut s, 3);
    assert_eq!(order, [3, 1, 2]);
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

/// The checker orders queues by the priority each request was admitted with: a log whose
/// monotasks carry another priority (as a scheduler that mixed up requests would write) is
/// refused even though it is consistent with itself.
#[test]
fn the_checker_takes_priorities_from_the_admitted_requests() {
    let mut s = Scheduler::new(cfg(1)).unwrap();
    s.submit(1, 1, 1.0).unwrap();
    s.submit(2, 6, 1.0).unwrap();
    warmups_in_order(&mut s, 2);
    let events = s.take_events();
    SchedChecker::new(s.config()).check_all(&events).unwrap();
    let relabelled: Vec<Event> = events
        .iter()
        .map(|e| match *e {
            Event::Ready {
                tag,
                priority,
                worker,
                cost,
            } if tag.request == 1 => Event::Ready {
                tag,
                priority: priority + 6,
                worker,
                cost,
            },
            ref e => e.clone(),
        })
        .collect();
    let err = SchedChecker::new(s.config())
        .check_all(&relabelled)
        .unwrap_err();
    assert!(err.contains("admitted at 1"), "{err}");
}

#[test]
fn switch_cost_rule_keeps_own_work_when_moving_costs_more() {
    let mut c = cfg(2);
    c.transfer_cost = 100.0;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap(); // low priority -> w0
    s.submit(2, 7, 1.0).unwrap(); // high priority -> w1
    run_warmup(&mut s, 0, 1);
    run_warmup(&mut s, 1, 2);
    s.submit_step(1, 1, &[(0, 1.0)]).unwrap();
    s.submit_step(2, 1, &[(0, 1.0), (1, 1.0)]).unwrap();
    // w1 holds request 2, so both its patches land on w1 (w0 would pay the transfer).
    let a = s.next(1).unwrap().unwrap();
    assert_eq!(a.task.tag.request, 2);
    // w0: request 2's other patch waits behind 1.0 of work on w1; moving it costs 100.
    let b = s.next(0).unwrap().unwrap();
    assert_eq!(b.task.tag.request, 1);
    assert!(
        matches!(
            b.pick,
            Pick::KeptOwn {
                waiting_priority: 7,
                ..
            }
        ),
        "{:?}",
        b.pick
    );
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

#[test]
fn idle_worker_steals_when_it_pays() {
    let mut s = Scheduler::new(cfg(2)).unwrap();
    s.submit(1, 0, 1.0).unwrap(); // warm-up -> w0
    s.submit(2, 0, 5.0).unwrap(); // warm-up -> w1 (lighter)
    run_warmup(&mut s, 0, 1);
    let long = s.next(1).unwrap().unwrap();
    assert_eq!(long.task.tag.request, 2);
    // w1 is busy for 5, so eq. 1 puts both patches of request 1 on w0.
    s.submit_step(1, 1, &[(0, 1.0), (1, 1.0)]).unwrap();
    let a = s.next(0).unwrap().unwrap();
    s.complete(1, long.task.tag).unwrap();
    // w1 is idle; request 1's second patch would wait behind w0's running one: steal it.
    let b = s.next(1).unwrap().unwrap();
    assert_eq!((a.task.tag.request, b.task.tag.request), (1, 1));
    assert_eq!(b.pick, Pick::Stolen { from: 0 });
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

#[test]
fn admission_control_refuses_and_recovers() {
    let mut c = cfg(1);
    c.max_requests = 1;
    c.max_queued = 3;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    assert_eq!(
        s.submit(2, 0, 1.0),
        Err(SchedError::Full {
            what: "requests",
            limit: 1
        })
    );
    assert_eq!(s.submit(1, 0, 1.0), Err(SchedError::DuplicateRequest(1)));
    run_warmup(&mut s, 0, 1);
    assert_eq!(
        s.submit_step(1, 1, &[(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0)]),
        Err(SchedError::Full {
            what: "queued monotasks",
            limit: 3
        })
    );
    assert_eq!(
        s.is_between_steps(1),
        Some(true),
        "a refused step leaves nothing behind"
    );
    s.finish(1).unwrap();
    s.submit(2, 0, 1.0).unwrap();
    assert_eq!(s.submit(3, 9, 1.0), Err(SchedError::BadPriority(9)));
}

#[test]
fn lost_worker_work_runs_again_and_applies_once() {
    let mut s = Scheduler::new(cfg(2)).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    run_warmup(&mut s, 0, 1);
    s.submit_step(1, 1, &[(0, 1.0), (1, 1.0)]).unwrap();
    let a = s.next(0).unwrap().unwrap();
    let b = s.next(1).unwrap().unwrap();
    assert_eq!(s.worker_lost(1).unwrap().requeued, 1);
    // The lost worker's late report is stale; its monotask runs on worker 0.
    assert_eq!(s.complete(1, b.task.tag).unwrap(), Completion::Stale);
    assert_eq!(s.next(1), Err(SchedError::WorkerDead(1)));
    assert_eq!(s.complete(0, a.task.tag).unwrap(), Completion::Patch);
    let again = s.next(0).unwrap().unwrap();
    assert_eq!(again.task.tag, b.task.tag);
    assert_eq!(again.task.attempt, 1);
    assert_eq!(
        s.complete(0, again.task.tag).unwrap(),
        Completion::StepDone(1, 1)
    );
    assert_eq!(s.complete(0, again.task.tag).unwrap(), Completion::Stale);
    let w = s.add_worker().unwrap();
    assert_eq!(w, 2);
    s.finish(1).unwrap();
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
    assert_eq!(checker.finished(), 1);
}

#[test]
fn orphaned_work_waits_for_a_replacement_worker() {
    let mut s = Scheduler::new(cfg(1)).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    assert_eq!(s.worker_lost(0).unwrap().requeued, 1);
    let w = s.add_worker().unwrap();
    run_warmup(&mut s, w, 1);
}

#[test]
fn failures_retry_then_fail_the_request() {
    let mut c = cfg(1);
    c.max_attempts = 2;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    let a = s.next(0).unwrap().unwrap();
    assert_eq!(s.fail(0, a.task.tag).unwrap(), Completion::Patch);
    let a = s.next(0).unwrap().unwrap();
    assert_eq!(a.task.attempt, 1);
    assert_eq!(s.fail(0, a.task.tag).unwrap(), Completion::RequestFailed(1));
    assert_eq!(s.next(0).unwrap(), None);
    assert_eq!(s.load().requests, 0);
}

/// A monotask that takes its worker down every time it runs (a poison input) fails its
/// request after `max_attempts` losses; the other request finishes on the replacements.
#[test]
fn a_monotask_that_kills_its_workers_fails_its_request_only() {
    let mut c = cfg(1);
    c.max_attempts = 3;
    c.record_events = true;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    s.submit(2, 0, 1.0).unwrap();
    let mut w = 0;
    for attempt in 0..3 {
        let a = s.next(w).unwrap().unwrap();
        assert_eq!(a.task.tag.request, 1, "request 1 was admitted first");
        assert_eq!(a.task.attempt, attempt);
        let lost = s.worker_lost(w).unwrap();
        if attempt < 2 {
            assert_eq!(lost.failed, None);
            assert_eq!(
                lost.requeued, 2,
                "the poison monotask and request 2's warm-up"
            );
        } else {
            assert_eq!(lost.failed, Some(1), "third loss: the request fails");
            assert_eq!(lost.requeued, 1, "only request 2's warm-up moves");
        }
        w = s.add_worker().unwrap();
    }
    assert!(!s.is_alive(0));
    run_warmup(&mut s, w, 2);
    assert_eq!(s.load().requests, 1);
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

#[test]
fn the_checker_refuses_a_retry_past_max_attempts() {
    let mut c = cfg(1);
    c.max_attempts = 1;
    c.record_events = true;
    let mut s = Scheduler::new(c).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    s.next(0).unwrap().unwrap();
    assert_eq!(s.worker_lost(0).unwrap().failed, Some(1));
    let mut events = s.take_events();
    // Forge the old behaviour: the request survives and its monotask is queued again.
    let at = events
        .iter()
        .position(|e| matches!(e, Event::RequestEnded { .. }))
        .unwrap();
    let tag = Tag {
        request: 1,
        step: 0,
        monotask: WARMUP_MONOTASK,
    };
    events[at] = Event::Requeued { tag };
    let err = SchedChecker::new(s.config())
        .check_all(&events)
        .unwrap_err();
    assert!(err.contains("attempts"), "{err}");
}

#[test]
fn sizes_have_upper_bounds() {
    for (workers, req, queued, attempts) in [
        (u32::MAX, 1, 1, 1),
        (1, usize::MAX, 1, 1),
        (1, 1, usize::MAX, 1),
        (1, 1, 1, u32::MAX),
    ] {
        let c = SchedulerConfig {
            workers,
            max_requests: req,
            max_queued: queued,
            max_attempts: attempts,
            ..SchedulerConfig::default()
        };
        assert!(matches!(Scheduler::new(c), Err(SchedError::BadConfig(_))));
    }
}

/// Found by the fuzz harness once it checked the event log after misuse: a request
/// cancelled and submitted again under the same id left its old warm-up in a worker's
/// lock-free queue (which cannot remove entries), and that leftover was later dispatched
/// (stolen) as if it were the new request's work.
#[test]
fn a_resubmitted_id_never_runs_its_cancelled_incarnations_work() {
    let mut s = Scheduler::new(cfg(2)).unwrap();
    s.submit(2, 0, 1.0).unwrap();
    s.cancel(2).unwrap();
    s.submit(2, 0, 3.0).unwrap();
    let mut dispatched = Vec::new();
    for w in 0..2 {
        if let Some(a) = s.next(w).unwrap() {
            dispatched.push(a.task);
        }
    }
    assert_eq!(
        dispatched.len(),
        1,
        "one warm-up for one live request: {dispatched:?}"
    );
    assert_eq!(dispatched[0].cost, 3.0, "the old incarnation's warm-up ran");
    let mut c = SchedChecker::new(s.config());
    c.check_all(&s.take_events()).unwrap();
}

#[test]
fn misuse_is_refused_by_name() {
    assert!(matches!(
        Scheduler::new(SchedulerConfig {
            workers: 0,
            ..Default::default()
        }),
        Err(SchedError::BadConfig(_))
    ));
    let mut s = Scheduler::new(cfg(1)).unwrap();
    assert_eq!(s.next(4), Err(SchedError::UnknownWorker(4)));
    assert_eq!(s.submit(1, 0, -1.0), Err(SchedError::BadCost(-1.0)));
    s.submit(1, 0, 1.0).unwrap();
    let a = s.next(0).unwrap().unwrap();
    assert_eq!(s.next(0), Err(SchedError::Busy(0)));
    let wrong = Tag {
        request: 1,
        step: 0,
        monotask: 3,
    };
    assert!(matches!(s.complete(0, wrong), Ok(Completion::Stale)));
    assert!(matches!(
        s.fail(0, wrong),
        Err(SchedError::NotRunning { .. })
    ));
    assert_eq!(
        s.complete(0, a.task.tag).unwrap(),
        Completion::WarmupDone(1)
    );
    assert_eq!(
        s.submit_step(9, 1, &[(0, 1.0)]),
        Err(SchedError::UnknownRequest(9))
    );
    s.cancel(1).unwrap();
    assert_eq!(s.cancel(1), Err(SchedError::UnknownRequest(1)));
}

#[test]
fn checker_catches_violations() {
    let t = |request, patch| Tag {
        request,
        step: 1,
        monotask: patch,
    };
    let warm = |request| Tag {
        request,
        step: 0,
        monotask: WARMUP_MONOTASK,
    };
    let admit = |request| Event::Admitted {
        request,
        priority: 1,
        deadline: None,
    };
    let open = |request, step, tasks| Event::StepOpened {
        request,
        step,
        tasks,
    };
    let ready = |tag, priority, worker| Event::Ready {
        tag,
        priority,
        worker,
        cost: 1.0,
    };
    let disp = |worker, tag, priority, pick| Event::Dispatched {
        worker,
        tag,
        priority,
        pick,
    };
    let one = cfg(1);
    let check = |c: &SchedulerConfig, evs: &[Event]| SchedChecker::new(c).check_all(evs);

    let two_at_once = [
        admit(1),
        open(1, 1, 2),
        ready(t(1, 0), 1, 0),
        ready(t(1, 1), 1, 0),
        disp(0, t(1, 0), 1, Pick::Own),
        disp(0, t(1, 1), 1, Pick::Own),
    ];
    assert!(check(&one, &two_at_once)
        .unwrap_err()
        .contains("already holds 1 monotasks"));
    // At depth 2 the same log is right; a third dispatch is not.
    let two = SchedulerConfig { depth: 2, ..one };
    assert_eq!(check(&two, &two_at_once), Ok(()));
    let three_at_once = [
        admit(1),
        open(1, 1, 3),
        ready(t(1, 0), 1, 0),
        ready(t(1, 1), 1, 0),
        ready(t(1, 2), 1, 0),
        disp(0, t(1, 0), 1, Pick::Own),
        disp(0, t(1, 1), 1, Pick::Own),
        disp(0, t(1, 2), 1, Pick::Own),
    ];
    assert!(check(&two, &three_at_once)
        .unwrap_err()
        .contains("already holds 2 monotasks"));

    let inversion = [
        admit(1),
        open(1, 1, 1),
        ready(t(1, 0), 1, 0),
        Event::Admitted {
            request: 2,
            priority: 5,
            deadline: None,
        },
        open(2, 1, 1),
        ready(t(2, 0), 5, 0),
        disp(0, t(1, 0), 1, Pick::Own),
    ];
    assert!(check(&one, &inversion)
        .unwrap_err()
        .contains("the rule picks"));

    let early = [
        admit(1),
        open(1, 1, 2),
        ready(t(1, 0), 1, 0),
        ready(t(1, 1), 1, 0),
        disp(0, t(1, 0), 1, Pick::Own),
        Event::Completed {
            worker: 0,
            tag: t(1, 0),
        },
        open(1, 2, 1),
    ];
    assert!(check(&one, &early).unwrap_err().contains("opened while"));

    // Arrival order within a level: request 1 came first, so its warm-up goes first even
    // though request 2's was queued before it.
    let out_of_order = [
        admit(1),
        open(1, 0, 1),
        admit(2),
        open(2, 0, 1),
        ready(warm(2), 1, 0),
        ready(warm(1), 1, 0),
        disp(0, warm(2), 1, Pick::Own),
    ];
    assert!(check(&one, &out_of_order)
        .unwrap_err()
        .contains("the rule picks"));
    let in_order = [&out_of_order[..6], &[disp(0, warm(1), 1, Pick::Own)]].concat();
    check(&one, &in_order).unwrap();

    // Equation 1: a warm-up goes to the least-loaded worker.
    let two = cfg(2);
    let piled = [
        admit(1),
        open(1, 0, 1),
        ready(warm(1), 1, 0),
        admit(2),
        open(2, 0, 1),
        ready(warm(2), 1, 0),
    ];
    assert!(check(&two, &piled).unwrap_err().contains("equation 1"));

    // Switching costs more than it saves: taking the other worker's monotask is wrong
    // whatever the log claims, and keeping its own is right whatever benefit it logs.
    let costly = SchedulerConfig {
        switch_cost: 10.0,
        ..cfg(2)
    };
    let setup = [
        admit(1),
        open(1, 1, 1),
        ready(t(1, 0), 1, 0),
        Event::Admitted {
            request: 2,
            priority: 5,
            deadline: None,
        },
        open(2, 1, 1),
        ready(t(2, 0), 5, 1),
    ];
    let stolen = [&setup[..], &[disp(0, t(2, 0), 5, Pick::Stolen { from: 1 })]].concat();
    assert!(check(&costly, &stolen)
        .unwrap_err()
        .contains("the rule picks"));
    let kept = Pick::KeptOwn {
        waiting_priority: 5,
        benefit: 1e9,
        cost: 0.0,
    };
    let kept = [&setup[..], &[disp(0, t(1, 0), 1, kept)]].concat();
    check(&costly, &kept).unwrap();
}

/// Within a level, a request admitted earlier runs first at every step: here request 1's
/// first step, queued after request 2's warm-up, still runs before it.
#[test]
fn arrival_order_holds_within_a_level_across_steps() {
    let mut s = Scheduler::new(cfg(1)).unwrap();
    s.submit(1, 2, 1.0).unwrap();
    s.submit(2, 2, 1.0).unwrap();
    let a = s.next(0).unwrap().unwrap();
    assert_eq!(
        a.task.tag,
        Tag {
            request: 1,
            step: 0,
            monotask: WARMUP_MONOTASK
        }
    );
    assert_eq!(
        s.complete(0, a.task.tag).unwrap(),
        Completion::WarmupDone(1)
    );
    s.submit_step(1, 1, &[(0, 1.0)]).unwrap();
    let b = s.next(0).unwrap().unwrap();
    assert_eq!(b.task.tag.request, 1, "request 2 overtook request 1: {b:?}");
    s.complete(0, b.task.tag).unwrap();
    s.finish(1).unwrap();
    let c = s.next(0).unwrap().unwrap();
    assert_eq!(c.task.tag.request, 2);
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

/// Under the deadline order the earliest deadline goes first within a level; requests
/// without one wait behind those with one; a deadline that is not a time is refused.
#[test]
fn earliest_deadline_first_under_the_deadline_order() {
    let mut s = Scheduler::new(SchedulerConfig {
        order: QueueOrder::Deadline,
        ..cfg(1)
    })
    .unwrap();
    s.submit(1, 0, 1.0).unwrap();
    s.submit_with_deadline(2, 0, 1.0, Some(9.0)).unwrap();
    s.submit_with_deadline(3, 0, 1.0, Some(4.0)).unwrap();
    assert!(matches!(
        s.submit_with_deadline(4, 0, 1.0, Some(f64::NAN)),
        Err(SchedError::BadDeadline(d)) if d.is_nan()
    ));
    let order = warmups_in_order(&mut s, 3);
    assert_eq!(order, [3, 2, 1]);
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

/// Transfer and switch overheads are charged to a worker's load when work is placed or
/// taken, and taken off again when it leaves: after every request has finished, no load is
/// left behind (phantom load would steer eq. 1 placement away from that worker forever).
#[test]
fn overheads_leave_no_phantom_load_behind() {
    let mut s = Scheduler::new(SchedulerConfig {
        workers: 3,
        transfer_cost: 0.7,
        switch_cost: 0.05,
        record_events: true,
        ..Default::default()
    })
    .unwrap();
    for r in 0..6u64 {
        s.submit(r, (r % 3) as u8, 1.0 + r as f64).unwrap();
    }
    let mut steps = [0u32; 6];
    let mut moved = 0;
    let mut guard = 0;
    while s.load().requests > 0 {
        guard += 1;
        assert!(guard < 10_000, "no progress");
        for w in 0..3 {
            let Some(a) = s.next(w).unwrap() else {
                continue;
            };
            moved += matches!(a.pick, Pick::Stolen { .. }) as u32;
            match s.complete(w, a.task.tag).unwrap() {
                Completion::WarmupDone(r) | Completion::StepDone(r, _) => {
                    let i = r as usize;
                    steps[i] += 1;
                    if steps[i] <= 4 {
                        let patches: Vec<(u32, f64)> =
                            (0..5).map(|p| (p, 0.3 + 0.1 * p as f64)).collect();
                        s.submit_step(r, steps[i], &patches).unwrap();
                    } else {
                        s.finish(r).unwrap();
                    }
                }
                _ => {}
            }
        }
    }
    assert!(
        moved > 0,
        "no monotask changed workers: the test exercises nothing"
    );
    let load = s.load();
    assert!(
        load.per_worker.iter().all(|&l| l.abs() < 1e-9),
        "load left behind: {:?}",
        load.per_worker
    );
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
}

#[test]
fn a_worker_holds_up_to_depth_monotasks_dispatched_ahead() {
    let mut s = Scheduler::new(SchedulerConfig { depth: 2, ..cfg(1) }).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    run_warmup(&mut s, 0, 1);
    s.submit_step(1, 1, &[(0, 1.0), (1, 1.0), (2, 1.0)])
        .unwrap();
    let a = s.next(0).unwrap().unwrap();
    let b = s.next(0).unwrap().unwrap();
    assert_eq!((a.task.tag.monotask, b.task.tag.monotask), (0, 1));
    assert_eq!(s.next(0), Err(SchedError::Busy(0)));
    assert_eq!(s.load().running, 2);
    assert_eq!(s.complete(0, a.task.tag).unwrap(), Completion::Patch);
    let c = s.next(0).unwrap().unwrap();
    assert_eq!(c.task.tag.monotask, 2);
    assert_eq!(s.complete(0, b.task.tag).unwrap(), Completion::Patch);
    assert_eq!(
        s.complete(0, c.task.tag).unwrap(),
        Completion::StepDone(1, 1)
    );
    s.finish(1).unwrap();
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
    assert_eq!(checker.finished(), 1);
    assert!(matches!(
        Scheduler::new(SchedulerConfig { depth: 0, ..cfg(1) }),
        Err(SchedError::BadConfig(_))
    ));
    assert!(matches!(
        Scheduler::new(SchedulerConfig {
            depth: 65,
            ..cfg(1)
        }),
        Err(SchedError::BadConfig(_))
    ));
}

#[test]
fn a_lost_worker_costs_an_attempt_only_to_the_monotask_it_was_running() {
    let mut s = Scheduler::new(SchedulerConfig { depth: 2, ..cfg(1) }).unwrap();
    s.submit(1, 0, 1.0).unwrap();
    run_warmup(&mut s, 0, 1);
    s.submit_step(1, 1, &[(0, 1.0), (1, 1.0)]).unwrap();
    // Worker 0 runs patch 0 and holds patch 1 ahead; then it is lost.
    let a = s.next(0).unwrap().unwrap();
    let b = s.next(0).unwrap().unwrap();
    assert_eq!(s.add_worker().unwrap(), 1);
    assert_eq!(s.worker_lost(0).unwrap().requeued, 2);
    let first = s.next(1).unwrap().unwrap();
    let second = s.next(1).unwrap().unwrap();
    assert_eq!((first.task.tag, first.task.attempt), (a.task.tag, 1));
    assert_eq!((second.task.tag, second.task.attempt), (b.task.tag, 0));
    assert_eq!(s.complete(1, first.task.tag).unwrap(), Completion::Patch);
    assert_eq!(
        s.complete(1, second.task.tag).unwrap(),
        Completion::StepDone(1, 1)
    );
    s.finish(1).unwrap();
    let mut checker = SchedChecker::new(s.config());
    checker.check_all(&s.take_events()).unwrap();
    assert_eq!(checker.finished(), 1);
}
