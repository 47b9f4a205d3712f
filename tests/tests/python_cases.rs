//! The policy cases the Python package is checked against: inputs and what the Rust crates
//! make of them (layouts, saliency maps, gate decisions, a schedule), kept in
//! `python/tests/data/policy_cases.json`. This test recomputes every output from the inputs
//! and fails when the file differs; `python/tests/test_policies.py` runs the same inputs
//! through `flashdiff` from Python and compares. After a deliberate change of a policy:
//! `FLASHDIFF_BLESS=1 cargo test -p flashdiff-tests --test python_cases`.

use std::path::PathBuf;

use flashdiff_gate::{Gate, GateConfig};
use flashdiff_partitioner::{
    partition_saliency, partition_uniform, saliency_map, salient_mask, split_words, Grid,
};
use flashdiff_scheduler::{Completion, Scheduler, SchedulerConfig, WARMUP_MONOTASK};
use serde_json::{json, Value};

fn file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python/tests/data/policy_cases.json")
}

/// A deterministic field of values in (0, 1) with a few bright blobs, so that partitions
/// have structure to follow.
fn field(n: usize, salt: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as f32 + 1.0) * (0.618_034 + salt as f32 * 0.1);
            let noise = x.fract() * 0.2;
            let blob = if (i / 3 + salt as usize) % 7 < 2 {
                0.7
            } else {
                0.0
            };
            noise + blob + 0.05
        })
        .collect()
}

fn partitions() -> Value {
    let cases = [
        (1u32, 8u32, 8u32, 4u32),
        (1, 16, 16, 16),
        (2, 8, 8, 6),
        (1, 4, 12, 3),
    ];
    let mut out = vec![];
    for (salt, &(f, h, w, r)) in cases.iter().enumerate() {
        let grid = Grid::new(f, h, w).unwrap();
        let s = field(grid.tokens() as usize, salt as u32);
        let sal = partition_saliency(grid, &s, r).unwrap();
        let uni = partition_uniform(grid, r).unwrap();
        out.push(json!({
            "grid": [f, h, w],
            "patches": r,
            "saliency": s,
            "saliency_patch_of": sal.patch_of(),
            "uniform_patch_of": uni.patch_of(),
        }));
    }
    Value::Array(out)
}

fn saliency_maps() -> Value {
    let prompt = "a red circle left of a small blue square";
    let words = split_words(prompt);
    let mask = salient_mask(&words);
    let tokens = 24;
    let attn = field(tokens * words.len(), 5);
    let s = saliency_map(&attn, tokens, &mask).unwrap();
    json!([{
        "prompt": prompt,
        "words": words,
        "salient": mask,
        "tokens": tokens,
        "attn": attn,
        "saliency": s,
    }])
}

fn gates() -> Value {
    let mut out = vec![];
    for (patches, epsilon, max_skip) in [(6usize, 0.1f32, 3u32), (5, 0.3, 2), (4, 0.0, 3)] {
        let cfg = GateConfig {
            epsilon,
            max_skip,
            ..GateConfig::default()
        };
        let mut g = Gate::new(patches, cfg).unwrap();
        let steps = 12;
        let importance: Vec<Vec<f32>> = (0..steps)
            .map(|t| {
                field(patches, t as u32 + 11)
                    .into_iter()
                    .enumerate()
                    .map(|(p, v)| v * if p == 0 { 1.0 } else { 0.2 })
                    .collect()
            })
            .collect();
        let mut decisions = vec![];
        let mut stats = vec![];
        for imp in &importance {
            let mut active = vec![false; patches];
            let s = g.decide(&mut active).unwrap();
            g.observe_all(imp).unwrap();
            decisions.push(active);
            stats.push(json!({
                "active": s.active, "forced": s.forced,
                "no_history": s.no_history, "kept_one": s.kept_one,
            }));
        }
        out.push(json!({
            "patches": patches,
            "epsilon": epsilon,
            "eta": cfg.eta,
            "max_skip": max_skip,
            "importance": importance,
            "decisions": decisions,
            "stats": stats,
            "weights": g.weights(),
        }));
    }
    Value::Array(out)
}

/// The schedule of three requests on two workers: workers ask in turn; a finished warm-up
/// opens step 1 with every patch, a finished step opens the next until `steps`. Records
/// every dispatch `[worker, request, step, monotask or null]` and completion.
fn schedule() -> Value {
    let (workers, steps) = (2u32, 3u32);
    // (id, priority, warm-up cost, the patches of each step with their costs)
    type Request = (u64, u8, f64, Vec<(u32, f64)>);
    let requests: [Request; 3] = [
        (1, 0, 1.0, vec![(0, 0.5), (1, 0.25), (2, 0.25)]),
        (2, 3, 2.0, vec![(0, 1.0), (1, 1.0)]),
        (3, 1, 0.5, vec![(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)]),
    ];
    let mut s = Scheduler::new(SchedulerConfig {
        workers,
        depth: 1,
        ..SchedulerConfig::default()
    })
    .unwrap();
    for (id, prio, cost, _) in &requests {
        s.submit(*id, *prio, *cost).unwrap();
    }
    let mut log = vec![];
    let mut idle_rounds = 0;
    while idle_rounds < 2 {
        let mut any = false;
        for w in 0..workers {
            let Some(a) = s.next(w).unwrap() else {
                continue;
            };
            any = true;
            let t = a.task.tag;
            let m = (t.monotask != WARMUP_MONOTASK).then_some(t.monotask);
            log.push(json!(["dispatch", w, t.request, t.step, m]));
            let c = s.complete(w, t).unwrap();
            let patches = |r: u64| &requests.iter().find(|q| q.0 == r).unwrap().3;
            match c {
                Completion::WarmupDone(r) => {
                    log.push(json!(["warmup_done", r]));
                    s.submit_step(r, 1, patches(r)).unwrap();
                }
                Completion::StepDone(r, step) => {
                    log.push(json!(["step_done", r, step]));
                    if step < steps {
                        s.submit_step(r, step + 1, patches(r)).unwrap();
                    } else {
                        s.finish(r).unwrap();
                    }
                }
                Completion::Patch => log.push(json!(["patch"])),
                other => panic!("unexpected completion {other:?}"),
            }
        }
        idle_rounds = if any { 0 } else { idle_rounds + 1 };
    }
    json!({
        "workers": workers,
        "steps": steps,
        "requests": requests.iter().map(|(id, p, c, ps)| json!({
            "id": id, "priority": p, "warmup_cost": c, "patches": ps,
        })).collect::<Vec<_>>(),
        "log": log,
    })
}

/// Equal JSON, numbers compared as the `f32` / integer values they hold: how a number is
/// spelled and read back depends on serde_json's features, which other crates of the
/// workspace may turn on.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(p), Some(q)) => p == q || (p as f32) == (q as f32),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn python_policy_cases_match_the_rust_crates() {
    let now = json!({
        "partitions": partitions(),
        "saliency_maps": saliency_maps(),
        "gates": gates(),
        "schedule": schedule(),
    });
    let path = file();
    if std::env::var_os("FLASHDIFF_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&now).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let kept: Value = serde_json::from_str(&text).unwrap();
    for key in ["partitions", "saliency_maps", "gates", "schedule"] {
        assert!(
            same(&kept[key], &now[key]),
            "{key} in {} differs from what the crates compute now: if the change is \
             deliberate, run FLASHDIFF_BLESS=1 cargo test -p flashdiff-tests --test python_cases",
            path.display()
        );
    }
}
