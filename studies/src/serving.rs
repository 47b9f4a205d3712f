//! Serving a bursty request stream on this machine: FlashDiff under its scheduler against
//! what a user would otherwise run on the same cores (whole requests in arrival order with
//! full computation or whole-step caching, one per worker) and DistriFusion-style patch
//! parallelism (its displaced patches spread over the workers).
//!
//! Loads are multiples of the strongest other way's measured capacity: the highest among the
//! baselines whose mean PSNR in the bench's quality table meets [`QUALITY_BAR_DB`] (the
//! paper states its targets at load 1.2 of DistriFusion-style's, which on these cores is
//! slower than full computation, so any load of it leaves every other method idle). Each
//! method's own capacity is measured too (every request at once), so a row whose arrivals
//! outpace its method is marked: that queue grows without bound, and its p99 is the wait at
//! the end of the trace, which grows with the trace's length, not a property of the method.
//!
//! The trace's requests cycle through priority levels 0-3, which the scheduler honours and the
//! FIFO rows ignore; FlashDiff's scheduler also serves the same trace with every request at
//! one level, and the report shows each level's completions, so a p99 that the lowest level
//! pays for the others is told apart from one the engine is slower at.

use anyhow::Error;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use flashdiff_models::families::tinydit::scene;
use flashdiff_runtime::engine::{Engine, Mode, Output, RequestConfig, START_WINDOW_EXTRA};
use flashdiff_runtime::service::{Reply, Service};
use flashdiff_scheduler::sim::bursty_arrivals;

use crate::{verdict, work, BenchConfig};

/// One way to serve the stream.
struct Server {
    name: &'static str,
    what: &'static str,
    cfg: RequestConfig,
    /// Whole requests in arrival order, at most one per worker in flight (no scheduler
    /// interleaving); otherwise every arrival is submitted at once to the scheduler.
    fifo: bool,
    /// On worker processes (request state in shared memory) instead of the bench's engine.
    processes: bool,
    /// Every request at one priority level instead of the trace's levels 0-3 cycling.
    one_level: bool,
    /// Under the engine's start window of the workers plus [`START_WINDOW_EXTRA`] (every
    /// request starts when it is submitted otherwise, the engine's default).
    window: bool,
    /// The method of the bench's quality table whose output this one serves.
    quality: &'static str,
}

/// The mean PSNR against full computation a way of serving must reach for its capacity to
/// set the loads (the quality the project promises).
pub(crate) const QUALITY_BAR_DB: f64 = 30.0;

fn servers(base: &RequestConfig, distrifusion: &RequestConfig) -> Vec<Server> {
    vec![
        Server {
            name: "flashdiff",
            what: "FlashDiff: every arrival to the patch scheduler",
            cfg: base.clone(),
            fifo: false,
            processes: false,
            one_level: false,
            window: false,
            quality: "flashdiff",
        },
        Server {
            name: "flashdiff-one-level",
            what: "FlashDiff: every arrival to the patch scheduler, every request at one priority level (the FIFO rows ignore the levels; this one serves the same trace without them)",
            cfg: base.clone(),
            fifo: false,
            processes: false,
            one_level: true,
            window: false,
            quality: "flashdiff",
        },
        Server {
            name: "flashdiff-window",
            what: "FlashDiff under a start window: a request starts while fewer than the workers plus one run at its level and above, the others wait (without it a burst's requests advance interleaved)",
            cfg: base.clone(),
            fifo: false,
            processes: false,
            one_level: false,
            window: true,
            quality: "flashdiff",
        },
        Server {
            name: "flashdiff-adaptive-eps",
            what: "FlashDiff with load-adaptive ε (ε/2 with slack .. 2ε overloaded)",
            cfg: RequestConfig {
                adaptive_epsilon: true,
                ..base.clone()
            },
            fifo: false,
            processes: false,
            one_level: false,
            window: false,
            quality: "flashdiff",
        },
        Server {
            name: "distrifusion",
            what: "DistriFusion-style: displaced patches, one monotask each, over every worker",
            cfg: distrifusion.clone(),
            fifo: false,
            processes: false,
            one_level: false,
            window: false,
            quality: "distrifusion",
        },
        Server {
            name: "distrifusion-processes",
            what: "DistriFusion-style as above, its workers separate processes sharing request state in /dev/shm",
            cfg: distrifusion.clone(),
            fifo: false,
            processes: true,
            one_level: false,
            window: false,
            quality: "distrifusion",
        },
        Server {
            name: "full-fifo",
            what: "full computation, whole requests in arrival order, one per worker",
            cfg: RequestConfig {
                mode: Mode::Full,
                ..base.clone()
            },
            fifo: true,
            processes: false,
            one_level: false,
            window: false,
            quality: "full",
        },
        Server {
            name: "teacache-fifo",
            what: "whole-step caching, whole requests in arrival order, one per worker",
            cfg: RequestConfig {
                mode: Mode::TeaCache,
                // The threshold alone, as TeaCache's authors run it.
                max_skip: base.steps,
                ..base.clone()
            },
            fifo: true,
            processes: false,
            one_level: false,
            window: false,
            quality: "teacache",
        },
        Server {
            name: "flashdiff-fifo",
            what: "FlashDiff requests without the scheduler's interleaving, one per worker",
            cfg: base.clone(),
            fifo: true,
            processes: false,
            one_level: false,
            window: false,
            quality: "flashdiff",
        },
    ]
}

/// The load the serving targets are judged at, times the strongest other way's capacity.
const TARGET_LOAD: f64 = 1.2;

/// Runs of the trace at the target load for every contender (one in a quick run): serving
/// on a shared machine drifts by tens of percent between runs of the same trace, so one run
/// cannot order methods that close.
const TARGET_ROUNDS: usize = 3;

/// A way of serving runs every round at the target load when it is FlashDiff's or its
/// capacity is at least this share of the strongest other way's (the others are behind by
/// more than the drift).
const CONTENDER_SHARE: f64 = 0.75;

fn is_contender(s: &Server, cap: f64, base_cap: f64) -> bool {
    s.name.starts_with("flashdiff") || cap >= CONTENDER_SHARE * base_cap
}

/// One way's runs of a trace as one row: the run with the median `key` (the upper of the two
/// middle ones; p99 at a load, throughput for capacity), its numbers all from that run, with
/// every run's `key` in `all_key` in the order they ran.
fn median_run(runs: Vec<Value>, key: &str, all_key: &str) -> Value {
    let of = |r: &Value| r[key].as_f64().unwrap_or(f64::NAN);
    let all: Vec<f64> = runs.iter().map(of).collect();
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| all[a].total_cmp(&all[b]));
    let Some(&mid) = order.get(order.len() / 2) else {
        return Value::Null;
    };
    let mut r = runs.into_iter().nth(mid).unwrap_or(Value::Null);
    r[all_key] = json!(all);
    r
}

/// The other's p99 over FlashDiff's, round by round over the rounds both ran: the median of
/// those ratios (upper middle) and the worst (smallest), or `None` when they share none.
fn p99_ratios(other: &Value, fd: &Value) -> Option<(f64, f64, usize)> {
    let rounds = |r: &Value| -> Vec<f64> {
        match r["p99_rounds_s"].as_array() {
            Some(a) => a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect(),
            None => r["p99_s"].as_f64().into_iter().collect(),
        }
    };
    let mut v: Vec<f64> = rounds(other)
        .iter()
        .zip(rounds(fd))
        .map(|(o, f)| o / f)
        .collect();
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some((v[v.len() / 2], v[0], v.len()))
}

/// Runs the study, appends its section to `md`, returns one JSON row per run.
pub(crate) fn study(
    engine: &mut Engine,
    cfg: &BenchConfig,
    base: &RequestConfig,
    distrifusion: &RequestConfig,
    quality_db: &dyn Fn(&str) -> f64,
    md: &mut String,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Value>> {
    let quick = cfg.prompts <= 8;
    // A smoke run (a test's): the least that still exercises every path.
    let tiny = cfg.prompts <= 2;
    let workers = engine.workers();
    let mut list = servers(base, distrifusion);
    // Worker processes need the executable; without it (a library caller) those rows are
    // left out and the report says so.
    let mut procs = match &cfg.exe {
        Some((exe, _)) if list.iter().any(|s| s.processes) => Some(
            Engine::builder(&cfg.weights)
                .workers(workers)
                .processes(exe, &flashdiff_runtime::engine::state_dir())
                .build()?,
        ),
        _ => None,
    };
    let skipped: Vec<&str> = if procs.is_none() {
        list.iter()
            .filter(|s| s.processes)
            .map(|s| s.name)
            .collect()
    } else {
        Vec::new()
    };
    list.retain(|s| procs.is_some() || !s.processes);
    // Capacity: every request at once, so nobody waits for arrivals.
    let n_sat = if tiny {
        2 * workers as usize
    } else if quick {
        4 * workers as usize
    } else {
        24
    };
    let mut rows = Vec::new();
    let mut capacity = Vec::new();
    // Like the target load's traces, capacity runs again for the contenders (read from the
    // first runs) and each takes its median run.
    let rounds_at_target = if quick { 1 } else { TARGET_ROUNDS };
    let mut cap_runs: Vec<Vec<Value>> = vec![Vec::new(); list.len()];
    let mut first: Vec<f64> = Vec::new();
    for round in 0..rounds_at_target {
        let first_base = load_base(&list, &first, quality_db).map_or(f64::INFINITY, |b| b.1);
        for (k, s) in list.iter().enumerate() {
            if round > 0 && !is_contender(s, first[k], first_base) {
                continue;
            }
            progress(&format!(
                "serving: capacity of {} (run {} of {rounds_at_target})",
                s.name,
                round + 1
            ));
            cap_runs[k].push(serve_on(
                engine,
                &mut procs,
                s,
                &vec![0.0; n_sat],
                cfg.seed,
            )?);
        }
        if round == 0 {
            first = cap_runs
                .iter()
                .map(|r| r[0]["throughput_rps"].as_f64().unwrap_or(f64::NAN))
                .collect();
        }
    }
    let mut cap_lines = Vec::new();
    for (s, runs) in list.iter().zip(cap_runs) {
        let mut r = median_run(runs, "throughput_rps", "throughput_rounds_rps");
        capacity.push(r["throughput_rps"].as_f64().unwrap_or(f64::NAN));
        if let Some(all) = r["throughput_rounds_rps"]
            .as_array()
            .filter(|a| a.len() > 1)
        {
            let all: Vec<String> = all
                .iter()
                .map(|x| format!("{:.2}", x.as_f64().unwrap_or(f64::NAN)))
                .collect();
            cap_lines.push(format!("{} {}", s.name, all.join(" / ")));
        }
        r["load"] = json!("saturated");
        r["method"] = json!(s.name);
        rows.push(r);
    }
    let cap_of = |name: &str| {
        list.iter()
            .position(|s| s.name == name)
            .map_or(f64::NAN, |i| capacity[i])
    };
    // Without a baseline at the bar (a run whose quality table failed), DistriFusion-style's,
    // and the report says so.
    let chosen = load_base(&list, &capacity, quality_db);
    let (base_name, base_cap) = chosen.unwrap_or(("distrifusion", cap_of("distrifusion")));
    let why = match chosen {
        Some(_) => format!(
            "the highest among the other ways of serving whose mean PSNR in the quality table meets {QUALITY_BAR_DB} dB"
        ),
        None => format!("no other way of serving met {QUALITY_BAR_DB} dB mean PSNR in the quality table"),
    };
    let loads: &[f64] = if quick {
        &[TARGET_LOAD]
    } else {
        &[0.8, TARGET_LOAD, 1.5]
    };
    // Long enough that p99 is not the maximum (>= 200) outside smoke and quick runs.
    let length = if tiny {
        6
    } else if quick {
        16
    } else {
        200
    };
    md.push_str(&format!(
        "\n## Serving a bursty stream on this machine\n\n{workers} worker(s). Arrivals from a two-state MMPP (seeded, the same trace for every method at a load), priorities 0-3 cycling. Load is a multiple of {base_name}'s capacity, {base_cap:.2} req/s ({why}), measured like every method's own capacity column with {n_sat} requests submitted at once. Requests per run: {}. A row is **overloaded** when its arrivals come faster than its method's capacity: that queue grows without bound and its p99 is the wait at the end of the trace, which grows with the trace's length.\n\n| method | what |\n| --- | --- |\n",
        length
    ));
    for s in &list {
        md.push_str(&format!("| {} | {} |\n", s.name, s.what));
    }
    if !cap_lines.is_empty() {
        md.push_str(&format!(
            "\nCapacity runs (req/s, each way's column is its median run; FlashDiff's rows and every way within {CONTENDER_SHARE} of the strongest's first run): {}.\n",
            cap_lines.join("; ")
        ));
    }
    if !skipped.is_empty() {
        md.push_str(&format!(
            "\nNot run (no flashdiff executable to start worker processes): {}.\n",
            skipped.join(", ")
        ));
    }
    md.push_str("\n| load | method | arrivals req/s | capacity req/s | throughput req/s | p50 s | p95 s | p99 s | work | mean ε | queue |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let rounds_at_target = if quick { 1 } else { TARGET_ROUNDS };
    for &load in loads {
        let n = length;
        let rate = load * base_cap;
        let arrivals = bursty_arrivals(n, rate, 99 + (load * 100.0) as u64);
        let rounds = if load == TARGET_LOAD {
            rounds_at_target
        } else {
            1
        };
        // Round after round over the same trace, so that the machine's drift falls on every
        // method alike; after the first, only the contenders run again.
        let mut runs: Vec<Vec<Value>> = vec![Vec::new(); list.len()];
        for round in 0..rounds {
            for (k, (s, &cap)) in list.iter().zip(&capacity).enumerate() {
                if round > 0 && !is_contender(s, cap, base_cap) {
                    continue;
                }
                progress(&format!(
                    "serving: load {load}, {} ({n} requests, round {} of {rounds})",
                    s.name,
                    round + 1
                ));
                runs[k].push(serve_on(engine, &mut procs, s, &arrivals, cfg.seed)?);
            }
        }
        for ((s, &cap), runs) in list.iter().zip(&capacity).zip(runs) {
            let mut r = median_run(runs, "p99_s", "p99_rounds_s");
            let overloaded = rate > cap;
            md.push_str(&load_row(load, s.name, rate, cap, n, &r));
            r["load"] = json!(load);
            r["method"] = json!(s.name);
            r["arrival_rps"] = json!(rate);
            r["capacity_rps"] = json!(cap);
            r["overloaded"] = json!(overloaded);
            rows.push(r);
        }
    }
    by_level(&rows, &list, md);
    verdicts(&rows, &list, &capacity, base_name, md);
    Ok(rows)
}

/// The strongest other way of serving: the highest measured capacity among the servers that
/// are not FlashDiff's and whose quality meets [`QUALITY_BAR_DB`]; its name and capacity.
fn load_base<'a>(
    list: &'a [Server],
    capacity: &[f64],
    quality_db: &dyn Fn(&str) -> f64,
) -> Option<(&'a str, f64)> {
    list.iter()
        .zip(capacity)
        .filter(|(s, c)| {
            !s.name.starts_with("flashdiff")
                && c.is_finite()
                && quality_db(s.quality) >= QUALITY_BAR_DB
        })
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(s, &c)| (s.name, c))
}

/// One method's row of the serving table at one load.
fn load_row(load: f64, name: &str, rate: f64, cap: f64, n: usize, r: &Value) -> String {
    // Under 100 requests the 99th percentile is the largest completion time: say so.
    let p99 = r["p99_s"].as_f64().unwrap_or(0.0);
    let mut p99 = if n < 100 {
        format!("{p99:.2} (max of {n})")
    } else {
        format!("{p99:.2}")
    };
    if let Some(all) = r["p99_rounds_s"].as_array().filter(|a| a.len() > 1) {
        let all: Vec<String> = all
            .iter()
            .map(|x| format!("{:.2}", x.as_f64().unwrap_or(f64::NAN)))
            .collect();
        p99.push_str(&format!(" (runs: {})", all.join(" / ")));
    }
    format!(
        "| {load} | {name} | {rate:.2} | {cap:.2} | {:.2} | {:.2} | {:.2} | {p99} | {:.2} | {} | {} |\n",
        r["throughput_rps"].as_f64().unwrap_or(0.0),
        r["p50_s"].as_f64().unwrap_or(0.0),
        r["p95_s"].as_f64().unwrap_or(0.0),
        r["work"].as_f64().unwrap_or(0.0),
        r["mean_epsilon"]
            .as_f64()
            .map_or("-".to_string(), |e| format!("{e:.3}")),
        if rate > cap {
            "**overloaded**"
        } else {
            "stable"
        },
    )
}

/// Completion times (s) of the requests a run's trace puts at `level` (request i at
/// [`trace_level`]`(i)`, whatever priority the method served it at), sorted.
fn level_latencies(r: &Value, level: u8) -> Vec<f64> {
    let mut v: Vec<f64> = r["latency_of_request_s"]
        .as_array()
        .map(|a| {
            a.iter()
                .enumerate()
                .filter(|(i, _)| trace_level(*i) == level)
                .filter_map(|(_, x)| x.as_f64())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(f64::total_cmp);
    v
}

/// At the target load, each method's median and slowest completion per priority level of
/// the trace: what the scheduler's priorities buy the upper levels and cost the lowest.
fn by_level(rows: &[Value], list: &[Server], md: &mut String) {
    let levels: Vec<u8> = (0..4).collect();
    let mut lines = String::new();
    for s in list {
        let Some(r) = rows
            .iter()
            .find(|r| r["method"] == s.name && r["load"] == json!(TARGET_LOAD))
        else {
            continue;
        };
        let cells: String = levels
            .iter()
            .map(|&l| {
                let v = level_latencies(r, l);
                match (v.get(v.len() / 2), v.last()) {
                    (Some(m), Some(x)) => format!(" {m:.2} / {x:.2} |"),
                    _ => " - |".to_string(),
                }
            })
            .collect();
        lines.push_str(&format!("| {} |{cells}\n", s.name));
    }
    if lines.is_empty() {
        return;
    }
    md.push_str(&format!(
        "\nAt load {TARGET_LOAD}, by the trace's priority level (request i at level i mod 4, 3 served first by the scheduler; the FIFO rows and the one-level row ignore the levels): median / slowest completion in s of that level's requests.\n\n| method |{}\n| --- |{}\n{lines}",
        levels.iter().map(|l| format!(" level {l} |")).collect::<String>(),
        " --- |".repeat(levels.len()),
    ));
}

/// The serving targets at the load they are stated for, and FlashDiff against every other
/// way of serving, worst margin first.
fn verdicts(rows: &[Value], list: &[Server], capacity: &[f64], base: &str, md: &mut String) {
    let row = |m: &str| {
        rows.iter()
            .find(|r| r["method"] == m && r["load"] == json!(TARGET_LOAD))
            .unwrap_or(&Value::Null)
    };
    let at = |m: &str, k: &str| row(m)[k].as_f64().unwrap_or(f64::NAN);
    let over = |m: &str| {
        rows.iter()
            .find(|r| r["method"] == m && r["load"] == json!(TARGET_LOAD))
            .is_some_and(|r| r["overloaded"] == json!(true))
    };
    let n = at("flashdiff", "requests");
    let short = if n < 100.0 {
        format!(" (over {n} requests p99 is their maximum: a smoke run, not a verdict to quote)")
    } else {
        String::new()
    };
    let tput = at("flashdiff", "throughput_rps") / at("distrifusion", "throughput_rps");
    let p99 = at("distrifusion", "p99_s") / at("flashdiff", "p99_s");
    md.push_str(&format!(
        "\n### The paper's targets against DistriFusion-style, at load {TARGET_LOAD} of {base}'s capacity\n\n| target | measured | wanted | verdict |\n| --- | --- | --- | --- |\n| throughput vs DistriFusion-style | {tput:.2}x | >= 1.5x | {} |\n| p99 completion vs DistriFusion-style | {p99:.2}x lower{short} | >= 2x | {} |\n",
        verdict(tput >= 1.5),
        verdict(p99 >= 2.0),
    ));
    md.push_str(&format!(
        "\nOn an open stream no method completes requests faster than they arrive, so FlashDiff's throughput on this trace is at most the arrival rate, {TARGET_LOAD}x {base}'s capacity; against DistriFusion-style a ratio comes from DistriFusion-style falling below that rate.{} \n",
        if over("distrifusion") {
            " DistriFusion-style is overloaded at this load, so its p99 (and the p99 ratio) grows with the trace's length; the capacity ratios below do not depend on it."
        } else {
            ""
        }
    ));
    // Against every other way, worst margin.
    let fd_cap = capacity[0];
    let mut worst_cap: Option<(&str, f64)> = None;
    let mut worst_p99: Option<(&str, f64)> = None;
    let mut worst_round: Option<(&str, f64)> = None;
    let mut lines = String::new();
    for (s, &cap) in list.iter().zip(capacity).skip(1) {
        if s.name.starts_with("flashdiff") {
            continue;
        }
        let c = fd_cap / cap;
        let (p, low, runs) =
            p99_ratios(row(s.name), row("flashdiff")).unwrap_or((f64::NAN, f64::NAN, 0));
        lines.push_str(&format!(
            "| {} | {c:.2}x | {} |\n",
            s.name,
            ratio_cell(p, low, runs, over(s.name))
        ));
        if worst_cap.is_none_or(|w| c < w.1) {
            worst_cap = Some((s.name, c));
        }
        if worst_p99.is_none_or(|w| p < w.1) {
            worst_p99 = Some((s.name, p));
        }
        if worst_round.is_none_or(|w| low < w.1) {
            worst_round = Some((s.name, low));
        }
    }
    md.push_str(&format!(
        "\nFlashDiff against every other way of serving the model on these cores (capacity: saturated throughput ratio; p99: the other's p99 over FlashDiff's at load {TARGET_LOAD}, run by run over the runs both made, their median and the worst run):\n\n| other | FlashDiff capacity ratio | p99 ratio |\n| --- | --- | --- |\n{lines}"
    ));
    if let (Some((cn, c)), Some((pn, p)), Some((rn, r))) = (worst_cap, worst_p99, worst_round) {
        md.push_str(&format!(
            "\nWorst margins: capacity {c:.2}x ({cn}), p99 {p:.2}x in the median ({pn}), {r:.2}x in the worst run ({rn}). FlashDiff is {} the others in capacity, {} in median p99 at this load, and {} in every run.\n",
            if c >= 1.0 { "at least as good as all" } else { "**not** better than all" },
            if p >= 1.0 { "at least as good as all" } else { "**not** better than all" },
            if r >= 1.0 { "at least as good as all" } else { "**not** ahead of all" },
        ));
    }
    let win = at("flashdiff-window", "p99_s");
    let cap = |name: &str| {
        list.iter()
            .position(|s| s.name == name)
            .map_or(f64::NAN, |i| capacity[i])
    };
    if win.is_finite() {
        md.push_str(&format!(
            "\nA start window (a request starts while fewer than the workers plus {START_WINDOW_EXTRA} run at its level and above): p99 {win:.2} s at this load (median runs) against {:.2} s with every request started at once (the default); capacity {:.2} against {:.2} req/s.\n",
            at("flashdiff", "p99_s"),
            cap("flashdiff-window"),
            cap("flashdiff"),
        ));
    }
    let one = at("flashdiff-one-level", "p99_s");
    if one.is_finite() {
        if let Some((pn, _)) = worst_p99 {
            if let Some((p, low, runs)) = p99_ratios(row(pn), row("flashdiff-one-level")) {
                md.push_str(&format!(
                    "With every request at one priority level, as the FIFO rows serve them, FlashDiff's scheduler has p99 {one:.2} s at this load (its median run); {pn}'s p99 over it: {} ({} {pn} on median p99).\n",
                    ratio_cell(p, low, runs, false),
                    if p >= 1.0 { "at least as good as" } else { "**behind**" },
                ));
            }
        }
    }
    if fd_cap.is_finite() {
        let eps = list
            .iter()
            .position(|s| s.name == "flashdiff-adaptive-eps")
            .map_or(f64::NAN, |i| capacity[i]);
        md.push_str(&format!(
            "Load-adaptive ε: capacity {:.2}x fixed ε's; p99 at load {TARGET_LOAD} {:.2}x lower; work {:.2} vs {:.2} (quality at the ε it used: see the epsilon sweep).\n",
            eps / fd_cap,
            at("flashdiff", "p99_s") / at("flashdiff-adaptive-eps", "p99_s"),
            at("flashdiff-adaptive-eps", "work"),
            at("flashdiff", "work"),
        ));
    }
}

/// A p99 ratio's cell: the median over `runs` paired runs and the worst of them.
fn ratio_cell(median: f64, worst: f64, runs: usize, overloaded: bool) -> String {
    let mut c = if runs > 1 {
        format!("{median:.2}x (worst of {runs} runs {worst:.2}x)")
    } else {
        format!("{median:.2}x")
    };
    if overloaded {
        c.push_str(" (it is overloaded)");
    }
    c
}

/// Serves one arrival trace in real time: requests are submitted when their arrival time
/// passes (all at once to the scheduler, or in arrival order with at most one per worker in
/// flight when `fifo`), and completion times are taken when they finish.
fn serve_trace(
    engine: &mut Engine,
    arrivals: &[f64],
    s: &Server,
    seed: u64,
) -> anyhow::Result<Value> {
    let one_level = s.one_level;
    let window = engine.start_window();
    if s.window {
        engine.set_start_window(Some(engine.workers() + START_WINDOW_EXTRA))?;
    }
    let r = serve_shaped(engine, arrivals, &s.cfg, s.fifo, seed, &|i| {
        (if one_level { 0 } else { trace_level(i) }, None)
    });
    engine.set_start_window(window)?;
    r
}

/// [`serve_trace`] on the engine `s` runs on: the worker-process engine for a way on
/// processes, the bench's engine otherwise.
fn serve_on(
    engine: &mut Engine,
    procs: &mut Option<Engine>,
    s: &Server,
    arrivals: &[f64],
    seed: u64,
) -> anyhow::Result<Value> {
    let e = match (procs.as_mut(), s.processes) {
        (Some(p), true) => p,
        _ => engine,
    };
    serve_trace(e, arrivals, s, seed)
}

/// Request i's priority level in the serving traces: 0-3 cycling.
fn trace_level(i: usize) -> u8 {
    (i % 4) as u8
}

/// [`serve_trace`] with request i's priority and deadline from `shape(i)`.
pub(crate) fn serve_shaped(
    engine: &mut Engine,
    arrivals: &[f64],
    base: &RequestConfig,
    fifo: bool,
    seed: u64,
    shape: &dyn Fn(usize) -> (u8, Option<Duration>),
) -> anyhow::Result<Value> {
    let request = |i: usize| {
        let scene = scene::sample(seed + 500 + i as u64);
        let (priority, deadline) = shape(i);
        let c = RequestConfig {
            seed: seed + i as u64,
            priority,
            deadline,
            ..base.clone()
        };
        (scene::prompt_text(&scene), crate::budget_for_mode(c))
    };
    let mut r = serve_requests(
        engine,
        arrivals,
        fifo,
        (1_000_000 + seed, base.steps),
        &request,
        &mut |_, _| {},
    )?;
    let order: Vec<usize> = r["completion_order"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default();
    r["completion_inversions"] = json!(inversions(&order, shape));
    Ok(r)
}

/// Serves `arrivals` in real time: request i, `request(i)` (its prompt and settings; its id
/// `id_base + i`), is submitted when its arrival time passes (at once to the scheduler, or
/// in arrival order with at most one per worker in flight when `fifo`); `seen(i, output)`
/// hears of each output as it finishes. Returns the run's numbers: throughput, percentiles,
/// each request's latency (`latency_of_request_s`), the completion order, mean work (a share
/// of full computation's at `full_steps`).
pub(crate) fn serve_requests(
    engine: &mut Engine,
    arrivals: &[f64],
    fifo: bool,
    (id_base, full_steps): (u64, u32),
    request: &dyn Fn(usize) -> (String, RequestConfig),
    seen: &mut dyn FnMut(usize, &Output),
) -> anyhow::Result<Value> {
    let start = Instant::now();
    let n = arrivals.len();
    let slots = engine.workers() as usize;
    let (mut next, mut done) = (0usize, 0usize);
    let mut queue = std::collections::VecDeque::new();
    let mut latency = Vec::with_capacity(n);
    let mut of_request = vec![f64::NAN; n];
    let (mut work_sum, mut eps_sum, mut eps_n) = (0.0, 0.0, 0u32);
    let (mut met, mut with_deadline) = (0usize, 0usize);
    // Model time spent (warm-up + compute of every request), and completion order.
    let (mut busy, mut order) = (0.0, Vec::with_capacity(n));
    Service::scoped(engine, |service| {
        let (tx, rx) = mpsc::channel();
        let mut in_flight = 0usize;
        while done < n {
            let now = start.elapsed().as_secs_f64();
            while next < n && arrivals[next] <= now {
                queue.push_back(next);
                next += 1;
            }
            while let Some(&i) = queue.front() {
                if fifo && in_flight >= slots {
                    break;
                }
                queue.pop_front();
                let (prompt, c) = request(i);
                service.submit(id_base + i as u64, &prompt, c, Reply::to(tx.clone()))?;
                in_flight += 1;
            }
            // Until the next arrival, or a while when every request has arrived.
            let wait = match next < n {
                true => (arrivals[next] - now).clamp(0.0, 0.05),
                false => 0.05,
            };
            let first = match rx.recv_timeout(Duration::from_secs_f64(wait)) {
                Ok(r) => r,
                Err(_) => continue,
            };
            let t = start.elapsed().as_secs_f64();
            for (_, r) in std::iter::once(first).chain(rx.try_iter()) {
                in_flight -= 1;
                let o = r?;
                let i = (o.report.id - id_base) as usize;
                latency.push(t - arrivals[i]);
                of_request[i] = t - arrivals[i];
                busy += (o.report.time.warmup + o.report.time.compute).as_secs_f64();
                order.push(i);
                work_sum += work(&o, full_steps);
                if let Some(m) = o.report.deadline_met {
                    with_deadline += 1;
                    met += m as usize;
                }
                if let Some(e) = o.report.mean_epsilon() {
                    eps_sum += e;
                    eps_n += 1;
                }
                seen(i, &o);
                done += 1;
            }
        }
        Ok::<(), Error>(())
    })?;
    let makespan = start.elapsed().as_secs_f64() - arrivals[0].min(start.elapsed().as_secs_f64());
    latency.sort_by(f64::total_cmp);
    let pct = |q: f64| crate::protocol::latency::quantile(&latency, q);
    Ok(json!({
        "requests": n,
        "throughput_rps": n as f64 / makespan.max(1e-9),
        "p50_s": pct(0.5),
        "p95_s": pct(0.95),
        "p99_s": pct(0.99),
        "work": work_sum / n as f64,
        "mean_epsilon": if eps_n > 0 { json!(eps_sum / eps_n as f64) } else { Value::Null },
        "deadlines_met": if with_deadline > 0 { json!(met as f64 / with_deadline as f64) } else { Value::Null },
        "busy_s": busy,
        "completion_order": order,
        "latencies_s": latency,
        "latency_of_request_s": of_request,
    }))
}

/// Pairs of requests of one priority level where the later arrival finished first, counted
/// between consecutive completions of that level.
fn inversions(order: &[usize], shape: &dyn Fn(usize) -> (u8, Option<Duration>)) -> usize {
    let mut last: std::collections::HashMap<u8, usize> = std::collections::HashMap::new();
    let mut n = 0;
    for &i in order {
        let level = shape(i).0;
        if last.get(&level).is_some_and(|&j| j > i) {
            n += 1;
        }
        last.insert(level, i);
    }
    n
}

#[cfg(test)]
#[path = "serving_tests.rs"]
mod tests;
