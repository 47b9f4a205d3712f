//! What dispatching ahead buys: the same burst of requests on worker threads with a dispatch
//! depth of 1 (a worker gets its next monotask only after the coordinator read its report)
//! and the default 2 (it takes the next from its hand-off queue at once), alternated so that
//! drift on the machine hits both alike.
//!
//!     cargo run --release -p flashdiff-runtime --example dispatch_depth -- [WORKERS] [REQUESTS] [ROUNDS]
//!
//! Prints, per depth, the median wall time of a burst, its CPU time / wall time, and the
//! outputs' agreement (they must be bit-identical: R is fixed at 16 here, because the
//! adaptive controller's choice depends on the order in which requests finish).

use std::time::Instant;

use flashdiff_runtime::engine::{default_weights, Engine, RequestConfig};

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own; RUSAGE_SELF is one
    // of the constants it accepts.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    [u.ru_utime, u.ru_stime]
        .iter()
        .map(|t| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6)
        .sum()
}

fn arg(i: usize, default: u32) -> u32 {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("a whole number"))
        .unwrap_or(default)
}

fn main() {
    let (workers, requests, rounds) = (arg(1, 2), arg(2, 8), arg(3, 5));
    let prompts = [
        "a yellow square center on a blue background",
        "a red circle top left and a green triangle bottom right on a white background",
        "a purple triangle left on a orange background",
        "a white circle bottom on a black background",
    ];
    let mut engines: Vec<(u32, Engine)> = [1u32, 2]
        .into_iter()
        .map(|d| {
            let mut e = Engine::new(&default_weights(), workers).expect("engine");
            e.set_dispatch_depth(d).expect("depth");
            (d, e)
        })
        .collect();
    let mut walls = vec![Vec::new(); engines.len()];
    let mut ratios = vec![Vec::new(); engines.len()];
    let mut first: Option<Vec<Vec<f32>>> = None;
    for round in 0..=rounds {
        for (k, (_, e)) in engines.iter_mut().enumerate() {
            for i in 0..requests as u64 {
                // A fixed R: the adaptive controller learns from completions, whose order
                // is timing.
                let cfg = RequestConfig {
                    seed: i,
                    patches: Some(16),
                    ..Default::default()
                };
                e.submit(i, prompts[i as usize % prompts.len()], cfg)
                    .expect("submit");
            }
            let (t0, c0) = (Instant::now(), cpu_seconds());
            let mut outs: Vec<_> = e
                .run(&mut |_| {})
                .into_iter()
                .map(|r| r.expect("request"))
                .collect();
            let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
            outs.sort_by_key(|o| o.report.id);
            let latents: Vec<Vec<f32>> = outs.into_iter().map(|o| o.latent).collect();
            match &first {
                None => first = Some(latents),
                Some(f) => assert_eq!(f, &latents, "outputs differ between depths"),
            }
            // Round 0 warms caches and page mappings up; it is not counted.
            if round > 0 {
                walls[k].push(wall);
                ratios[k].push(cpu / wall);
            }
        }
    }
    println!("{requests} requests on {workers} worker threads, {rounds} rounds alternated:");
    for (k, (d, _)) in engines.iter().enumerate() {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "  depth {d}: median wall {:.3} s (all: {}), CPU/wall {:.2}",
            median(&mut walls[k].clone()),
            walls[k]
                .iter()
                .map(|w| format!("{w:.3}"))
                .collect::<Vec<_>>()
                .join(" "),
            median(&mut ratios[k])
        );
    }
    println!("outputs bit-identical at both depths");
}
