//! Model check of the hand-off's wake-up protocol under every interleaving loom reaches:
//! no push and no close is ever slept through, every item arrives once and in order.
//!
//!     RUSTFLAGS="--cfg loom" cargo test -p flashdiff-scheduler --release --test loom --target-dir target/loom
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use flashdiff_scheduler::HandOff;

/// A consumer thread taking everything until the hand-off closes, named as its consumer.
fn consume(h: &Arc<HandOff<u32>>) -> thread::JoinHandle<Vec<u32>> {
    let mine = h.clone();
    let t = thread::spawn(move || {
        let mut got = Vec::new();
        while let Some(x) = mine.take() {
            got.push(x);
        }
        got
    });
    h.set_consumer(t.thread().clone());
    t
}

/// The consumer parks while the queue is empty; the producer pushes two items and closes.
/// A lost wake-up leaves the consumer parked forever, which loom reports as a deadlock.
#[test]
fn pushes_and_close_always_wake_the_consumer() {
    loom::model(|| {
        let h = Arc::new(HandOff::new());
        let consumer = consume(&h);
        h.push(1u32);
        h.push(2);
        h.close();
        assert_eq!(consumer.join().unwrap(), vec![1, 2]);
    });
}

/// Two producers (the coordinator and a reaper draining with `try_take`) against the
/// consumer: every item is taken exactly once, by one of them.
#[test]
fn an_item_is_taken_once_even_while_another_thread_drains() {
    loom::model(|| {
        let h = Arc::new(HandOff::new());
        let consumer = consume(&h);
        let pusher = {
            let h = h.clone();
            thread::spawn(move || h.push(7u32))
        };
        h.push(8);
        let drained = h.try_take();
        pusher.join().unwrap();
        h.close();
        let mut all = consumer.join().unwrap();
        all.extend(drained);
        all.sort();
        assert_eq!(all, vec![7, 8]);
    });
}

/// Ping-pong: each side parks until the other's push wakes it (no close to fall back on).
/// A push that does not wake its consumer leaves both parked: loom reports the deadlock.
#[test]
fn every_push_wakes_a_parked_consumer() {
    loom::model(|| {
        let (ping, pong) = (Arc::new(HandOff::new()), Arc::new(HandOff::new()));
        pong.set_consumer(thread::current());
        let worker = {
            let (ping, pong) = (ping.clone(), pong.clone());
            thread::spawn(move || {
                for _ in 0..2 {
                    let x: u32 = ping.take().expect("open");
                    pong.push(x + 1);
                }
            })
        };
        ping.set_consumer(worker.thread().clone());
        for x in [10u32, 20] {
            ping.push(x);
            assert_eq!(pong.take(), Some(x + 1));
        }
        worker.join().unwrap();
    });
}
