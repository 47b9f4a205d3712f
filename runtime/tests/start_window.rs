//! The start window: requests beyond it wait in the engine, higher levels never wait for
//! lower ones, the best waiting request starts when one leaves, and outputs do not depend on
//! the window. Any run of submissions, cancellations and polls against the rule: the
//! `start_window` fuzz harness (`flashdiff_runtime::fuzzing`).

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
