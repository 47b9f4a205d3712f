//! The simulated scale study: the scheduler over 1-64 devices, fed the measured costs.

use flashdiff_runtime::engine::RequestConfig;
use flashdiff_scheduler::sim::{bursty_arrivals, simulate, ActiveModel, SimRequest};
use flashdiff_scheduler::SchedulerConfig;
use serde_json::{json, Value};

use crate::BenchConfig;

/// The scheduler's simulator beyond this machine, with the costs measured in this run.
pub(crate) fn scale_section(
    cfg: &BenchConfig,
    base: &RequestConfig,
    get: &dyn Fn(&str, &str) -> f64,
    md: &mut String,
) -> Vec<Value> {
    // Scale beyond this machine: the scheduler's simulator with costs measured above.
    let full_ms = get("full", "latency_ms");
    let per_token = full_ms / 1e3 / (cfg.steps as f64 * 64.0);
    // Share of patch-steps after the warm-up that ran, from the FlashDiff runs' work.
    let active = (get("flashdiff", "work") * cfg.steps as f64 - base.warmup as f64)
        / (cfg.steps - base.warmup) as f64;
    let transfer = transfer_cost_s();
    let scale = scale_study(
        per_token,
        active.clamp(0.01, 1.0),
        cfg,
        base.warmup,
        base.max_skip,
        transfer,
    );
    md.push_str(&format!(
        "\n## Scale beyond this machine (simulated)\n\nThe scheduler's discrete-event simulator with costs measured in this run: {:.3} ms per token-step, state transfer {:.3} ms, FlashDiff running {:.0}% of patch-steps (Bernoulli stand-in for the gate, K = {}). Bursty arrivals (two-state MMPP) at 1.2x the DistriFusion-style capacity, 40 requests per device.\n\n| devices | DistriFusion-style req/s | FlashDiff req/s | throughput ratio | DistriFusion p99 s | FlashDiff p99 s | p99 ratio |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        per_token * 1e3,
        transfer * 1e3,
        100.0 * active.clamp(0.01, 1.0),
        base.max_skip
    ));
    for r in &scale {
        md.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.2} | {:.2}x |\n",
            r["devices"],
            r["distrifusion_rps"].as_f64().unwrap_or(0.0),
            r["flashdiff_rps"].as_f64().unwrap_or(0.0),
            r["flashdiff_rps"].as_f64().unwrap_or(0.0)
                / r["distrifusion_rps"].as_f64().unwrap_or(1.0),
            r["distrifusion_p99_s"].as_f64().unwrap_or(0.0),
            r["flashdiff_p99_s"].as_f64().unwrap_or(0.0),
            r["distrifusion_p99_s"].as_f64().unwrap_or(0.0)
                / r["flashdiff_p99_s"].as_f64().unwrap_or(1.0),
        ));
    }
    scale
}

/// Seconds to copy one request's state (the built-in model's ~1.3 MB) in memory: the cost a
/// worker pays to take a request it does not hold. Measured, best of 20 copies.
pub(crate) fn transfer_cost_s() -> f64 {
    let src = vec![1.0f32; 330_000];
    let mut dst = vec![0.0f32; src.len()];
    let mut best = f64::INFINITY;
    for _ in 0..20 {
        let t = std::time::Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    best
}

/// FlashDiff against DistriFusion-style on 1..64 simulated devices.
pub(crate) fn scale_study(
    per_token: f64,
    active: f64,
    cfg: &BenchConfig,
    warmup: u32,
    max_skip: u32,
    transfer: f64,
) -> Vec<Value> {
    let tokens = 64.0;
    let patch_cost = per_token * tokens / cfg.patches as f64;
    let warmup_cost = per_token * tokens * warmup as f64;
    let steps = cfg.steps - warmup;
    let request_work = warmup_cost + steps as f64 * cfg.patches as f64 * patch_cost;
    let mut rows = Vec::new();
    for devices in [1u32, 2, 4, 8, 16, 64] {
        let n = (40 * devices as usize).min(2000);
        let rate = 1.2 * devices as f64 / request_work;
        let arrivals = bursty_arrivals(n, rate, 2026 + devices as u64);
        let run = |model: ActiveModel| {
            let reqs: Vec<SimRequest> = arrivals
                .iter()
                .enumerate()
                .map(|(i, &t)| SimRequest {
                    id: i as u64,
                    arrival: t,
                    priority: (i % 4) as u8,
                    warmup_cost,
                    steps,
                    patches: cfg.patches,
                    patch_cost,
                    active: model,
                })
                .collect();
            let sc = SchedulerConfig {
                workers: devices,
                max_requests: 4096,
                transfer_cost: transfer,
                ..Default::default()
            };
            let res = simulate(sc, &reqs, 7).expect("valid simulated workload");
            let mut lat: Vec<f64> = res
                .outcomes
                .iter()
                .map(|o| o.completion - o.arrival)
                .collect();
            lat.sort_by(f64::total_cmp);
            let p99 = lat[((lat.len() as f64 * 0.99) as usize).min(lat.len() - 1)];
            let p50 = lat[lat.len() / 2];
            (res.outcomes.len() as f64 / res.makespan, p50, p99)
        };
        let (d_rps, d_p50, d_p99) = run(ActiveModel::All);
        let (f_rps, f_p50, f_p99) = run(ActiveModel::Bernoulli {
            p: active,
            max_skip,
        });
        rows.push(json!({"devices": devices, "requests": n, "distrifusion_rps": d_rps, "distrifusion_p50_s": d_p50, "distrifusion_p99_s": d_p99, "flashdiff_rps": f_rps, "flashdiff_p50_s": f_p50, "flashdiff_p99_s": f_p99}));
    }
    rows
}
