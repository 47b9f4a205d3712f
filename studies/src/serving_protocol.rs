//! `flashdiff bench --study serving`: serving a bursty stream under the verdict protocol.
//!
//! 1. Each method's setting per target work level is chosen on **validation prompts**, and
//!    judged once on the **test prompts** after them, exactly as the curve study does
//!    ([`crate::study::run`] over [`METHODS`]).
//! 2. At each target, every method's chosen setting serves the same bursty trace (a seeded
//!    two-state MMPP) whose request i is test prompt `i mod test prompts`, its seed that
//!    prompt's: the outputs are the ones judged in step 1. Regional execution and whole-step
//!    caching are served by the engine's patch scheduler (every arrival submitted when it
//!    comes); whole-step caching and fewer steps are also served as a user without the
//!    scheduler would, whole requests in arrival order, one per worker ("-fifo").
//! 3. The trace's mean rate is [`LOAD`] times the capacity of the strongest "-fifo" way (its
//!    throughput with [`SATURATE`] requests submitted at once). Every way serves the trace
//!    [`ROUNDS`] times, the ways alternating within each round, so the machine's drift falls
//!    on all of them.
//! 4. Each served output's fidelity to full computation of its prompt is recomputed from the
//!    sample (not read from step 1), and every pair of ways is compared request by request
//!    ([`crate::protocol::latency`]): the mean latency saved and the p99 saved, each with a
//!    block-bootstrap interval; "ahead" when both lie above zero.

use anyhow::Error;
use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use flashdiff_models::{Kind, Sample};
use flashdiff_runtime::engine::{Engine, Mode, RequestConfig};
use flashdiff_scheduler::sim::bursty_arrivals;

use crate::protocol::latency::{latency_verdict, paired_latency, quantile};
use crate::serving::serve_requests;
use crate::study::{self, Method};
use crate::{curve, BenchConfig};

/// The curve study's methods this study serves: FlashDiff's regional execution, whole-step
/// caching with a forecaster (the strongest whole-step method of the curve studies) and
/// fewer steps.
pub const METHODS: [&str; 3] = ["regional", "whole-step", "fewer-steps"];

/// The trace's mean arrival rate, times the strongest "-fifo" way's capacity: busy, yet
/// below that way's capacity, so its queue is stable and its p99 a property of the way
/// rather than of the trace's length.
pub const LOAD: f64 = 0.8;

/// Passes over the trace per way.
pub const ROUNDS: usize = 3;

/// Requests submitted at once to measure a way's capacity.
pub const SATURATE: usize = 24;

/// Requests in the trace.
pub const TRACE: usize = 200;

/// One way of serving at one target.
struct Way {
    name: String,
    method: &'static str,
    setting: String,
    cfg: RequestConfig,
    fifo: bool,
}

/// Runs the study on `engine`'s model: `validation` prompts choose, `cfg.prompts` test
/// prompts judge and make the traces; writes `serving.json` and `report.md` into `out`;
/// returns the report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    validation: u32,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let quick = cfg.prompts <= 8;
    let tiny = cfg.prompts <= 2;
    let (trace_len, rounds, saturate) = match (tiny, quick) {
        (true, _) => (6, 1, 2 * engine.workers() as usize),
        (false, true) => (24, 2, 4 * engine.workers() as usize),
        _ => (TRACE, ROUNDS, SATURATE),
    };
    let methods: Vec<Method> = curve::METHODS
        .iter()
        .copied()
        .filter(|(m, _)| METHODS.contains(m))
        .collect();
    let base = RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    };
    let list = curve::candidates(&base, &methods);
    let mut choice = study::run(
        engine,
        cfg,
        "serving",
        &methods,
        &list,
        (validation, Some(out)),
        progress,
    )?;
    let kind = engine.model().kind();
    let side = study::side_of(engine)?;
    let test = choice["config"]["test_seeds"]
        .as_array()
        .and_then(|a| Some(a.first()?.as_u64()?..a.get(1)?.as_u64()?))
        .ok_or_else(|| Error::msg("the protocol's document has no test seeds"))?;
    // Full computation of every test prompt: the reference each served output is held to.
    let mut reference: Vec<Sample> = Vec::new();
    let mut prompts: Vec<String> = Vec::new();
    for (k, seed) in test.clone().enumerate() {
        progress(&format!(
            "serving: full computation of test prompt {}/{}",
            k + 1,
            test.end - test.start
        ));
        let text = study::prompt(kind, side, seed).0;
        let o = engine.generate(
            &text,
            RequestConfig {
                mode: Mode::Full,
                seed,
                budget: None,
                ..base.clone()
            },
            &mut |_| {},
        )?;
        reference.push(o.sample);
        prompts.push(text);
    }
    let mut targets = Vec::new();
    for t in choice["targets"].as_array().cloned().unwrap_or_default() {
        let target = t["target"].as_f64().unwrap_or(f64::NAN);
        let mut ways = Vec::new();
        for r in t["rows"].as_array().into_iter().flatten() {
            let (Some(m), Some(setting)) = (r["method"].as_str(), r["setting"].as_str()) else {
                continue;
            };
            let Some(c) = list.iter().find(|c| c.method == m && c.label == setting) else {
                return Err(Error::msg(format!(
                    "{m}'s chosen setting {setting:?} is not one of its candidates"
                )));
            };
            let scheduled = m != "fewer-steps";
            let fifo = m != "regional";
            for (on, fifo, name) in [
                (scheduled, false, m.to_string()),
                (fifo, true, format!("{m}-fifo")),
            ] {
                if on {
                    ways.push(Way {
                        name,
                        method: c.method,
                        setting: setting.to_string(),
                        cfg: c.cfg.clone(),
                        fifo,
                    });
                }
            }
        }
        let has = |m: &str| ways.iter().any(|w| w.method == m);
        if !has("regional") || !ways.iter().any(|w| w.fifo) {
            targets.push(json!({"target": target, "served": false,
                "why": "regional execution or every baseline has no setting at this work on the validation prompts"}));
            continue;
        }
        targets.push(serve_target(
            engine,
            target,
            &ways,
            (&prompts, &reference, test.start),
            (kind, side, base.steps),
            (trace_len, rounds, saturate),
            progress,
        )?);
    }
    choice["config"]["study"] = json!("serving");
    choice["serving"] = json!({
        "load": LOAD, "rounds": rounds, "trace": trace_len, "saturate": saturate,
        "workers": engine.workers(), "targets": targets,
    });
    std::fs::create_dir_all(out)?;
    let md = report(&choice);
    std::fs::write(
        out.join("serving.json"),
        serde_json::to_string_pretty(&choice)?,
    )?;
    std::fs::write(out.join("report.md"), &md)?;
    Ok(md)
}

/// Serves one target's ways (see the module docs); its part of the document.
fn serve_target(
    engine: &mut Engine,
    target: f64,
    ways: &[Way],
    (prompts, reference, first_seed): (&[String], &[Sample], u64),
    (kind, side, full_steps): (Kind, usize, u32),
    (trace_len, rounds, saturate): (usize, usize, usize),
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Value> {
    let n_test = prompts.len();
    let request = |w: &Way| {
        let cfg = w.cfg.clone();
        move |i: usize| {
            let k = i % n_test;
            (
                prompts[k].clone(),
                RequestConfig {
                    seed: first_seed + k as u64,
                    ..cfg.clone()
                },
            )
        }
    };
    // Capacity: every request at once.
    let mut capacity = Vec::new();
    for w in ways {
        progress(&format!("serving at work {target}: capacity of {}", w.name));
        let r = serve_requests(
            engine,
            &vec![0.0; saturate],
            w.fifo,
            (2_000_000, full_steps),
            &request(w),
            &mut |_, _| {},
        )?;
        capacity.push(r["throughput_rps"].as_f64().unwrap_or(f64::NAN));
    }
    let (base_name, base_cap) = ways
        .iter()
        .zip(&capacity)
        .filter(|(w, _)| w.fifo)
        .map(|(w, &c)| (w.name.clone(), c))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .ok_or_else(|| Error::msg("no way served without the scheduler"))?;
    let rate = LOAD * base_cap;
    let arrivals = bursty_arrivals(trace_len, rate, 7_000 + (target * 100.0).round() as u64);
    // Per way: each round's per-request latencies; the first round's fidelities and work.
    let mut lat: Vec<Vec<Vec<f64>>> = vec![Vec::new(); ways.len()];
    let mut db: Vec<Vec<f64>> = vec![vec![f64::NAN; trace_len]; ways.len()];
    let mut work: Vec<f64> = vec![f64::NAN; ways.len()];
    let mut runs: Vec<Vec<Value>> = vec![Vec::new(); ways.len()];
    for round in 0..rounds {
        for (k, w) in ways.iter().enumerate() {
            progress(&format!(
                "serving at work {target}: {} round {}/{rounds} ({trace_len} requests at {rate:.2}/s)",
                w.name,
                round + 1
            ));
            let mut fid: HashMap<usize, f64> = HashMap::new();
            let r = serve_requests(
                engine,
                &arrivals,
                w.fifo,
                (3_000_000, full_steps),
                &request(w),
                &mut |i, o| {
                    let full = &reference[i % n_test];
                    fid.insert(i, study::fidelity(kind, side, &o.sample, full).0);
                },
            )?;
            if round == 0 {
                for (i, v) in fid {
                    db[k][i] = v;
                }
                work[k] = r["work"].as_f64().unwrap_or(f64::NAN);
            }
            let l: Vec<f64> = r["latency_of_request_s"]
                .as_array()
                .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())
                .unwrap_or_default();
            lat[k].push(l);
            runs[k].push(json!({
                "throughput_rps": r["throughput_rps"], "p50_s": r["p50_s"], "p99_s": r["p99_s"],
            }));
        }
    }
    let mut rows = Vec::new();
    for (k, w) in ways.iter().enumerate() {
        let pooled: Vec<f64> = lat[k].iter().flatten().copied().collect();
        rows.push(json!({
            "way": w.name, "method": w.method, "setting": w.setting, "fifo": w.fifo,
            "capacity_rps": capacity[k], "overloaded": rate > capacity[k],
            "work": work[k], "db": study::mean(&db[k]),
            "worst_db": db[k].iter().copied().fold(f64::INFINITY, f64::min),
            "mean_s": study::mean(&pooled), "p50_s": quantile(&pooled, 0.5),
            "p95_s": quantile(&pooled, 0.95), "p99_s": quantile(&pooled, 0.99),
            "runs": runs[k],
        }));
    }
    let mut pairs = Vec::new();
    for a in 0..ways.len() {
        for b in a + 1..ways.len() {
            let p = paired_latency(&lat[a], &lat[b], first_seed).map_err(Error::msg)?;
            pairs.push(json!({
                "a": ways[a].name, "b": ways[b].name, "saved_mean_s": p.mean, "lo": p.lo,
                "hi": p.hi, "saved_p99_s": p.p99, "p99_lo": p.p99_lo, "p99_hi": p.p99_hi,
                "verdict": latency_verdict(&p).to_string(),
            }));
        }
    }
    Ok(json!({
        "target": target, "served": true, "load_of": base_name, "load_of_rps": base_cap,
        "rate_rps": rate, "arrivals_s": arrivals, "rows": rows, "pairs": pairs,
    }))
}

/// The study's report from its document.
pub fn report(doc: &Value) -> String {
    let mut md = study::report(doc);
    let s = &doc["serving"];
    md.push_str(&format!(
        "\n## Serving the test prompts\n\n{} worker(s). At each target, every way serves the same bursty trace (a seeded two-state MMPP) of {} requests, request i being test prompt i mod {} with its own seed, so the outputs are the ones judged above; the trace's mean rate is {} times the capacity of the strongest way without the scheduler (\"-fifo\": whole requests in arrival order, one per worker), capacity being the throughput with {} requests submitted at once. Every way serves the trace {} times, the ways alternating within each round. Fidelity is recomputed from each served output against full computation of its prompt (first round). Latency: completion minus arrival, pooled over the rounds. Pairs: what A saves over B, request by request (B minus A, s), mean and p99, with 95% circular block-bootstrap intervals (blocks of the square root of the trace's length, within each round; {} resamples); \"ahead\" when both intervals lie above zero, \"behind\" when both lie below, else \"level\".\n",
        s["workers"],
        s["trace"],
        doc["prompts"]["test"].as_array().map_or(0, Vec::len),
        s["load"],
        s["saturate"],
        s["rounds"],
        crate::protocol::RESAMPLES,
    ));
    for t in s["targets"].as_array().into_iter().flatten() {
        let target = &t["target"];
        if t["served"] != json!(true) {
            md.push_str(&format!(
                "\n### Work {target}\n\nNot served: {}.\n",
                t["why"].as_str().unwrap_or("-")
            ));
            continue;
        }
        md.push_str(&format!(
            "\n### Work {target}\n\nArrivals {:.2} req/s ({} times {}'s capacity, {:.2} req/s).\n\n| way | setting | capacity req/s | work | {m} mean / worst | mean s | p50 s | p95 s | p99 s | p99 by round s | queue |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            t["rate_rps"].as_f64().unwrap_or(f64::NAN),
            s["load"],
            t["load_of"].as_str().unwrap_or("-"),
            t["load_of_rps"].as_f64().unwrap_or(f64::NAN),
            m = doc["config"]["measure"].as_str().unwrap_or("PSNR"),
        ));
        for r in t["rows"].as_array().into_iter().flatten() {
            let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
            let by_round: Vec<String> = r["runs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| format!("{:.2}", x["p99_s"].as_f64().unwrap_or(f64::NAN)))
                .collect();
            md.push_str(&format!(
                "| {} | {} | {:.2} | {:.3} | {:.2} / {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
                r["way"].as_str().unwrap_or("-"),
                r["setting"].as_str().unwrap_or("-"),
                f("capacity_rps"),
                f("work"),
                f("db"),
                f("worst_db"),
                f("mean_s"),
                f("p50_s"),
                f("p95_s"),
                f("p99_s"),
                by_round.join(" / "),
                if r["overloaded"] == json!(true) { "**overloaded**" } else { "stable" },
            ));
        }
        md.push_str("\n| A | B | mean saved s [95%] | p99 saved s [95%] | latency verdict of A | quality verdict of A (the protocol's, above) |\n| --- | --- | --- | --- | --- | --- |\n");
        let method_of = |way: &str| -> String {
            t["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["way"] == way)
                .and_then(|r| r["method"].as_str())
                .unwrap_or("-")
                .to_string()
        };
        let judged = doc["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["target"] == *target);
        for p in t["pairs"].as_array().into_iter().flatten() {
            let f = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
            let (a, b) = (
                p["a"].as_str().unwrap_or("-"),
                p["b"].as_str().unwrap_or("-"),
            );
            let quality = quality_of(judged, &method_of(a), &method_of(b));
            md.push_str(&format!(
                "| {a} | {b} | {:+.3} [{:+.3}, {:+.3}] | {:+.3} [{:+.3}, {:+.3}] | {} | {quality} |\n",
                f("saved_mean_s"),
                f("lo"),
                f("hi"),
                f("saved_p99_s"),
                f("p99_lo"),
                f("p99_hi"),
                p["verdict"].as_str().unwrap_or("-"),
            ));
        }
    }
    md
}

/// Method `a`'s quality verdict against method `b` at a target of the protocol's document
/// (its `pairs` hold each pair once, either way round); "the same outputs" for one method.
fn quality_of(target: Option<&Value>, a: &str, b: &str) -> String {
    if a == b {
        return "the same outputs".into();
    }
    let pairs = target.and_then(|t| t["pairs"].as_array());
    for p in pairs.into_iter().flatten() {
        let v = p["verdict"].as_str().unwrap_or("-");
        if p["a"] == a && p["b"] == b {
            return v.into();
        }
        if p["a"] == b && p["b"] == a {
            return match v {
                "ahead" => "behind",
                "behind" => "ahead",
                other => other,
            }
            .into();
        }
    }
    "-".into()
}

/// Reads `serving.json` in `dir` again and writes its `report.md` as this version writes it;
/// returns the report. The error names what is wrong with the file.
pub fn reread(dir: &Path) -> Result<String, String> {
    let path = dir.join("serving.json");
    let doc = study::read(&path)?;
    if !doc["serving"]["targets"].is_array() {
        return Err(format!("{}: no serving targets", path.display()));
    }
    let md = report(&doc);
    std::fs::write(dir.join("report.md"), &md)
        .map_err(|e| format!("{}: {e}", dir.join("report.md").display()))?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quality_verdict_is_read_either_way_round() {
        let t = json!({"pairs": [
            {"a": "regional", "b": "whole-step", "verdict": "behind"},
            {"a": "regional", "b": "fewer-steps", "verdict": "not matched"},
        ]});
        assert_eq!(quality_of(Some(&t), "regional", "whole-step"), "behind");
        assert_eq!(quality_of(Some(&t), "whole-step", "regional"), "ahead");
        assert_eq!(
            quality_of(Some(&t), "fewer-steps", "regional"),
            "not matched"
        );
        assert_eq!(
            quality_of(Some(&t), "whole-step", "whole-step"),
            "the same outputs"
        );
        assert_eq!(quality_of(Some(&t), "whole-step", "fewer-steps"), "-");
        assert_eq!(quality_of(None, "regional", "whole-step"), "-");
    }
}
