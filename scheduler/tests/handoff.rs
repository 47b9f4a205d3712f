//! Stress test of the dispatch path's hand-off: one coordinator pushes to many worker
//! threads at once while they take; every item arrives exactly once, at the worker it was
//! pushed to, in push order, and closing ends every worker after it drained its queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flashdiff_scheduler::HandOff;

#[test]
fn every_item_arrives_once_in_order_under_contention() {
    const WORKERS: usize = 8;
    const ITEMS: u64 = 200_000;
    let taken = Arc::new(AtomicU64::new(0));
    let queues: Vec<Arc<HandOff<(usize, u64)>>> =
        (0..WORKERS).map(|_| Arc::new(HandOff::new())).collect();
    let handles: Vec<_> = queues
        .iter()
        .enumerate()
        .map(|(w, q)| {
            let (mine, taken) = (q.clone(), taken.clone());
            let h = std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some((to, x)) = mine.take() {
                    assert_eq!(to, w, "item for worker {to} taken by worker {w}");
                    got.push(x);
                    taken.fetch_add(1, Ordering::Relaxed);
                    // Sometimes slow, so that queues fill and drain.
                    if x % 1009 == 0 {
                        std::thread::yield_now();
                    }
                }
                got
            });
            q.set_consumer(h.thread().clone());
            h
        })
        .collect();
    // Uneven fan-out, in bursts, with the coordinator waiting now and then for the
    // workers to catch up (so that they park and must be woken).
    let mut pushed = vec![Vec::new(); WORKERS];
    for x in 0..ITEMS {
        let w = ((x * 7) ^ (x >> 3)) as usize % WORKERS;
        queues[w].push((w, x));
        pushed[w].push(x);
        if x % 50_000 == 0 {
            let t0 = std::time::Instant::now();
            while taken.load(Ordering::Relaxed) < x {
                assert!(
                    t0.elapsed().as_secs() < 30,
                    "workers stopped taking: a wake-up was lost"
                );
                std::thread::yield_now();
            }
        }
    }
    for q in &queues {
        q.close();
    }
    let mut total = 0;
    for (w, h) in handles.into_iter().enumerate() {
        let got = h.join().expect("worker thread");
        assert_eq!(
            got, pushed[w],
            "worker {w} got its items out of order or not all"
        );
        total += got.len() as u64;
    }
    assert_eq!(total, ITEMS);
    assert!(queues.iter().all(|q| q.is_empty()));
}

#[test]
fn a_parked_worker_wakes_for_each_push_and_for_close() {
    let q = Arc::new(HandOff::new());
    let (tx, rx) = std::sync::mpsc::channel();
    let h = {
        let q = q.clone();
        std::thread::spawn(move || {
            while let Some(x) = q.take() {
                tx.send(x).unwrap();
            }
        })
    };
    q.set_consumer(h.thread().clone());
    for x in 0..200u32 {
        // The worker has taken everything before: it is parked (or about to be) each time.
        q.push(x);
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(x));
    }
    q.close();
    h.join().unwrap();
    assert!(q.is_closed());
    assert_eq!(q.try_take(), None);
}
