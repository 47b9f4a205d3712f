//! The start window: requests beyond it wait in the engine, higher levels never wait for
//! lower ones, the best waiting request starts when one leaves, and outputs do not depend on
//! the window.

use std::time::Duration;

use flashdiff_runtime::engine::{default_weights, Engine, Mode, QueueOrder, RequestConfig};

const PROMPT: &str = "a red circle top left and a blue square bottom right on a white background";

fn cfg(seed: u64, priority: u8) -> RequestConfig {
    RequestConfig {
        steps: 10,
        warmup: 3,
        patches: Some(4),
        seed,
        priority,
        mode: Mode::FlashDiff,
        ..Default::default()
    }
}

fn engine(window: Option<u32>) -> Engine {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    e.set_start_window(window).unwrap();
    e
}

/// Polls until `done` holds (or fails the test after a minute).
fn poll_until(e: &mut Engine, done: &mut dyn FnMut(&Engine) -> bool) {
    for _ in 0..60_000 {
        if done(e) {
            return;
        }
        e.poll(&mut |_| {}, Duration::from_millis(1));
    }
    panic!("the engine did not get there");
}

#[test]
fn every_request_starts_by_default_and_a_zero_window_is_refused() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    assert_eq!(e.start_window(), None);
    for id in 1..=3 {
        e.submit(id, PROMPT, cfg(id, 0)).unwrap();
    }
    assert_eq!((e.in_flight(), e.waiting()), (3, 0));
    let err = e.set_start_window(Some(0)).unwrap_err().to_string();
    assert!(err.contains("start window 0"), "{err}");
    assert_eq!(e.start_window(), None);
    e.set_start_window(Some(2)).unwrap();
    assert_eq!(e.start_window(), Some(2));
}

#[test]
fn requests_beyond_the_window_wait_and_a_higher_level_does_not() {
    let mut e = engine(Some(1));
    e.submit(1, PROMPT, cfg(1, 0)).unwrap();
    e.submit(2, PROMPT, cfg(2, 0)).unwrap();
    assert_eq!((e.in_flight(), e.waiting()), (2, 1));
    // A request at a higher level starts although the window is full of lower ones.
    e.submit(3, PROMPT, cfg(3, 5)).unwrap();
    assert_eq!((e.in_flight(), e.waiting()), (3, 1));
    // Another at that level waits for it.
    e.submit(4, PROMPT, cfg(4, 5)).unwrap();
    assert_eq!((e.in_flight(), e.waiting()), (4, 2));
    // The waiting request 2 has not started: no warm-up, so no patches, while 1 has them.
    poll_until(&mut e, &mut |e| e.patch_of(1).is_some());
    assert!(e.patch_of(2).is_none());
    // A larger window starts them at once.
    e.set_start_window(Some(4)).unwrap();
    assert_eq!(e.waiting(), 0);
    let done = e.run(&mut |_| {});
    assert_eq!(done.iter().filter(|r| r.is_ok()).count(), 4);
}

#[test]
fn the_best_waiting_request_starts_when_one_leaves() {
    // Earliest deadline first within a level: 3 (1 s) starts before 2 (10 s), although 2
    // came first.
    let mut e = engine(Some(1));
    e.set_queue_order(QueueOrder::Deadline).unwrap();
    e.submit(1, PROMPT, cfg(1, 0)).unwrap();
    let with = |seed, s| RequestConfig {
        deadline: Some(Duration::from_secs(s)),
        ..cfg(seed, 0)
    };
    e.submit(2, PROMPT, with(2, 10)).unwrap();
    e.submit(3, PROMPT, with(3, 1)).unwrap();
    poll_until(&mut e, &mut |e| {
        e.patch_of(2).is_some() || e.patch_of(3).is_some()
    });
    assert!(e.patch_of(3).is_some() && e.patch_of(2).is_none());
    // Arrival order otherwise, and a cancelled waiting request leaves the queue.
    let mut e = engine(Some(1));
    for id in 1..=3 {
        e.submit(id, PROMPT, cfg(id, 0)).unwrap();
    }
    e.cancel(2).unwrap();
    assert_eq!((e.in_flight(), e.waiting()), (2, 1));
    let mut order = Vec::new();
    for r in e.run(&mut |_| {}) {
        order.push(match r {
            Ok(o) => (o.report.id, true),
            Err((id, _)) => (id, false),
        });
    }
    assert_eq!(order, [(2, false), (1, true), (3, true)]);
}

#[test]
fn outputs_do_not_depend_on_the_window() {
    let run = |window| {
        let mut e = engine(window);
        for id in 1..=3 {
            e.submit(id, PROMPT, cfg(10 + id, (id % 2) as u8)).unwrap();
        }
        let mut out: Vec<(u64, Vec<f32>)> = e
            .run(&mut |_| {})
            .into_iter()
            .map(|r| {
                let o = r.unwrap();
                (o.report.id, o.latent)
            })
            .collect();
        out.sort_by_key(|o| o.0);
        out
    };
    assert_eq!(run(Some(1)), run(None));
}

/// What the window should have started, recomputed from the rule alone: submissions,
/// cancellations and completions replayed on a list of (id, level, started).
#[derive(Default)]
struct Rule {
    window: usize,
    requests: Vec<(u64, u8, bool)>,
}

impl Rule {
    fn started_at_or_above(&self, level: u8) -> usize {
        self.requests.iter().filter(|r| r.2 && r.1 >= level).count()
    }

    /// Starts the best waiting requests (highest level, then submission order) while the
    /// window lets them.
    fn fill(&mut self) {
        loop {
            let best = self
                .requests
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.2)
                .max_by_key(|(i, r)| (r.1, std::cmp::Reverse(*i)))
                .map(|(i, r)| (i, r.1));
            match best {
                Some((i, level)) if self.started_at_or_above(level) < self.window => {
                    self.requests[i].2 = true
                }
                _ => return,
            }
        }
    }

    fn submit(&mut self, id: u64, level: u8) {
        let start = self.started_at_or_above(level) < self.window;
        self.requests.push((id, level, start));
    }

    fn leave(&mut self, id: u64) {
        self.requests.retain(|r| r.0 != id);
        self.fill();
    }
}

#[derive(Debug, Clone)]
enum Op {
    Submit(u8),
    Cancel(usize),
    Poll,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0u8..3).prop_map(Op::Submit),
        1 => (0usize..8).prop_map(Op::Cancel),
        2 => Just(Op::Poll),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(12))]

    /// Whatever the order of submissions, cancellations and completions, the engine's
    /// waiting requests are exactly those the rule leaves waiting, and none has started.
    #[test]
    fn the_engine_starts_what_the_rule_starts(
        window in 1u32..3,
        ops in proptest::collection::vec(op(), 1..14),
    ) {
        let mut e = engine(Some(window));
        let mut rule = Rule { window: window as usize, ..Default::default() };
        let mut next = 0u64;
        let small = |seed, level| RequestConfig { steps: 6, ..cfg(seed, level) };
        let check = |e: &mut Engine, rule: &mut Rule| {
            for r in e.take_finished() {
                let id = match r {
                    Ok(o) => o.report.id,
                    Err((id, _)) => id,
                };
                rule.leave(id);
            }
            let waiting: Vec<u64> = rule.requests.iter().filter(|r| !r.2).map(|r| r.0).collect();
            proptest::prop_assert_eq!(e.waiting(), waiting.len());
            proptest::prop_assert_eq!(e.in_flight(), rule.requests.len());
            for id in waiting {
                proptest::prop_assert!(e.patch_of(id).is_none(), "waiting {} has started", id);
            }
            Ok(())
        };
        for o in ops {
            match o {
                Op::Submit(level) => {
                    next += 1;
                    e.submit(next, PROMPT, small(next, level)).unwrap();
                    rule.submit(next, level);
                }
                Op::Cancel(i) => {
                    if let Some(&(id, _, _)) = rule.requests.get(i) {
                        e.cancel(id).unwrap();
                    }
                }
                Op::Poll => e.poll(&mut |_| {}, Duration::from_millis(20)),
            }
            check(&mut e, &mut rule)?;
        }
        while e.in_flight() > 0 {
            e.poll(&mut |_| {}, Duration::from_millis(20));
            check(&mut e, &mut rule)?;
        }
    }
}
