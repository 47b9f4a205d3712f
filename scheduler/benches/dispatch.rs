//! Scheduler dispatch throughput (target: >= 1M monotasks/s on one thread): a full cycle per
//! monotask (placement by eq. 1, a worker's `next`, `complete`), many requests, four workers.
//! Also the lock-free ready queue alone, push + pop, on one and on two threads.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flashdiff_scheduler::{
    Completion, Monotask, ReadyQueue, Scheduler, SchedulerConfig, Tag, WARMUP_MONOTASK,
};
use std::sync::Arc;

const REQUESTS: u64 = 16;
const PATCHES: u32 = 16;

fn dispatch_cycle(c: &mut Criterion) {
    let workers = 4u32;
    let mut s = Scheduler::new(SchedulerConfig {
        workers,
        ..Default::default()
    })
    .unwrap();
    let mut step = vec![0u32; REQUESTS as usize];
    for r in 0..REQUESTS {
        s.submit(r, (r % 8) as u8, 1.0).unwrap();
    }
    let patches: Vec<(u32, f64)> = (0..PATCHES).map(|p| (p, 1.0)).collect();
    let mut g = c.benchmark_group("scheduler");
    g.throughput(Throughput::Elements(1));
    g.bench_function("dispatch_cycle_per_monotask", |b| {
        let mut w = 0u32;
        b.iter(|| {
            // One monotask: some worker takes the next one and completes it; finished steps
            // reopen at once with all patches active.
            w = (w + 1) % workers;
            let a = match s.next(w).unwrap() {
                Some(a) => a,
                None => return,
            };
            match s.complete(w, a.task.tag).unwrap() {
                Completion::WarmupDone(r) | Completion::StepDone(r, _) => {
                    step[r as usize] += 1;
                    s.submit_step(r, step[r as usize], black_box(&patches))
                        .unwrap();
                }
                _ => {}
            }
        })
    });
    g.finish();
}

fn queue(c: &mut Criterion) {
    let m = |i: u64| Monotask {
        tag: Tag {
            request: i,
            step: 0,
            monotask: WARMUP_MONOTASK,
        },
        priority: (i % 8) as u8,
        cost: 1.0,
        epoch: 0,
        attempt: 0,
        charged: 0.0,
    };
    let mut g = c.benchmark_group("ready_queue");
    g.throughput(Throughput::Elements(1));
    let q = ReadyQueue::new();
    for i in 0..64 {
        q.push(m(i));
    }
    g.bench_function("push_pop_one_thread", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            q.push(m(i));
            black_box(q.pop())
        })
    });
    // Two threads: each iteration does a push and a pop on each thread concurrently.
    g.bench_function("push_pop_two_threads", |b| {
        b.iter_custom(|iters| {
            let q = Arc::new(ReadyQueue::new());
            for i in 0..64 {
                q.push(m(i));
            }
            let start = std::time::Instant::now();
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let q = Arc::clone(&q);
                    std::thread::spawn(move || {
                        for i in 0..iters {
                            q.push(m(i * 2 + t));
                            black_box(q.pop());
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            // Time per push+pop pair, two pairs in flight at once.
            start.elapsed() / 2
        })
    });
    g.finish();
}

criterion_group!(benches, dispatch_cycle, queue);
criterion_main!(benches);
