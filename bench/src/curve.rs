//! `flashdiff bench --study curve`: quality against work for FlashDiff and every other way to
//! save work on the same engine and workers, each over its own knob, on held-out prompts.
//!
//! Every method is measured against full computation from the same seed: work (the share of
//! full computation's model work, warm-up included), mean and worst-prompt fidelity (image:
//! PSNR, video: PSNR over the clip, sound: SNR), SSIM (images), agreement of the built-in
//! checker with its verdict on full computation, and in-engine latency. The verdict reads
//! each method as a [`Curve`] (its best setting at or below each work level, or the straight
//! line between two settings of one knob line) and compares FlashDiff's with every other
//! method's at every work level both reach within the judged range, for the mean and for the
//! worst prompt; it prints the worst margin and where it occurs.

use crate::plots::PlotResult;
pub use crate::reading::{frontier, interpolate, knob_lines, worst_margin, Curve};
use std::path::Path;

use serde_json::{json, Value};

use crate::{ms, prepare, work, write_outputs, BenchConfig};
use flashdiff_gate::pace::computes_for;
use flashdiff_models::scene::{self, IMAGE};
use flashdiff_models::{Kind, Sample};
use flashdiff_runtime::engine::{
    Engine, EngineError, LayoutKind, Mode, Output, RequestConfig, Reuse, DBCACHE_FRONT_BLOCKS,
    DEFAULT_WARMUP, FINAL_FULL_STEPS,
};

/// The short warm-up every method also runs at where the model's own is longer than the
/// paper's ([`DEFAULT_WARMUP`]).
pub const SHORT_WARMUP: u32 = 3;

/// The work range the verdict is judged over.
pub const JUDGED: (f64, f64) = (0.25, 0.6);

/// One setting of one method.
struct Setting {
    method: &'static str,
    label: String,
    cfg: RequestConfig,
}

/// What each method is and how it reuses what it does not compute.
const METHODS: [(&str, &str); 15] = [
    ("flashdiff", "saliency patches, each accumulating block 0's input change; a step runs whole once the latent's accumulated change (the patches' weighted by their share of that input) reaches ε (or one patch 2ε, or a patch K skips), else every token is forecast; knob: ε at K 3, K 1-12 at ε 1 (a computed step every K + 1), ε with no K bound (K = steps), each at first and at second order (\"order 2\": skipped velocities along the parabola through their last three computations), the last also reusing stale velocities (\"reuse stale\"); its curve also reads per-patch's settings (\"share 1\": a computed step runs only the patches at their budget)"),
    ("flashdiff-budget", "FlashDiff under a work budget F: floor(F x steps) computed steps, the warm-up and final step among them, paced by the same accumulated change (latency known at admission); knob: F, at first and second order, each again with the resume correction (\"reuse corrected\": a resumed token's latent moved half-way to where velocities interpolated through its computations would have taken it)"),
    ("flashdiff-order1", "ablation: FlashDiff's first-order settings alone, both shares (read from its rows without \"order 2\" or \"stale\")"),
    ("flashdiff-uniform", "ablation: FlashDiff on a uniform grid of patches instead of the saliency cut; same knob"),
    ("per-patch", "ablation: FlashDiff at share 1 alone: a computed step runs only the patches at their budget, the others stand in with forecast K/V and velocity; same knob"),
    ("random-patches", "ablation: per-patch's number of patches per step, drawn at random; same knob"),
    ("patch-gate", "ablation: the paper's memoryless gate on normalised importance change (at least one patch a step); knob: ε, then K at ε 1"),
    ("teacache", "whole-step caching on block 0's accumulated input change, skipped steps forecast at first order and, as \"order 2\", at second (TaylorSeer's orders 1 and 2); knob: threshold"),
    ("teacache-stale", "whole-step caching as its authors run it: skipped steps reuse the last velocity; knob: threshold"),
    ("dbcache", "cache-dit's DBCache, F1B0: the first block runs every step and decides on its residual's relative L1 change since the last computed step; the other blocks' residual forecast at first and second order (TaylorSeer) or, as \"stale\", reused; a skipped step costs the first block's work; knob: threshold"),
    ("ras", "RAS: the regions whose velocity changed most, dense reset steps, the others forecast; knob: share recomputed"),
    ("ras-stale", "RAS as its authors run it: the others reuse their velocity and K/V; knob: share recomputed"),
    ("fewer-steps", "full computation with fewer steps; knob: steps"),
    ("distrifusion", "DistriFusion as published: one patch per worker, in parallel, one-step-old K/V of the others, no skipping"),
    ("full", "full computation: the reference"),
];

/// Every setting the study runs, full computation first.
fn settings(base: &RequestConfig, workers: u32, dbcache: bool) -> Vec<Setting> {
    let mut v = vec![Setting {
        method: "full",
        label: "-".into(),
        cfg: RequestConfig {
            mode: Mode::Full,
            ..base.clone()
        },
    }];
    // ε at the default K; K at ε 1 (where no patch reaches its budget and K alone spaces
    // the computed steps); and ε with no K bound (K = steps), where the budget alone places
    // the computed steps as whole-step caching's threshold does.
    let k = base.max_skip;
    let unbounded = base.steps;
    let mut budget_knob = vec![
        (0.02f32, k),
        (0.05, k),
        (0.07, k),
        (0.1, k),
        (0.15, k),
        (0.2, k),
        (0.3, k),
        (0.5, k),
        (1.0, k),
        (1.0, k + 1),
        (1.0, k + 2),
        (1.0, k + 3),
        (1.0, k + 5),
        (1.0, k + 9),
    ];
    // K below the default on the ε-1 line: a computed step every second or third step
    // (work about 0.4-0.55 at 50 steps), where the line would otherwise stop at K's default.
    for below in (1..k).rev().take(2) {
        budget_knob.push((1.0, below));
    }
    for e in [
        0.03f32, 0.05, 0.07, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.8, 1.0,
    ] {
        budget_knob.push((e, unbounded));
    }
    // Every method that forecasts gets both forecasters: its knob at first order and again
    // at second order, on knob lines of their own ("ε 0.1 K 3 order 2"); with the resume
    // correction (`--reuse corrected`) both orders are corrected.
    let orders: Vec<(Reuse, &str)> = if matches!(base.reuse, Reuse::Extrapolate | Reuse::Corrected)
    {
        vec![
            (base.reuse.at_order(1), ""),
            (base.reuse.at_order(2), " order 2"),
        ]
    } else {
        vec![(base.reuse, "")]
    };
    for (method, mode, layout) in [
        ("flashdiff", Mode::FlashDiff, base.layout),
        ("flashdiff-uniform", Mode::FlashDiff, LayoutKind::Uniform),
        ("per-patch", Mode::PerPatch, base.layout),
        ("random-patches", Mode::RandomPatches, base.layout),
    ] {
        for &(reuse, order) in &orders {
            for &(e, k) in &budget_knob {
                v.push(Setting {
                    method,
                    label: format!("ε {e} K {k}{order}"),
                    cfg: RequestConfig {
                        mode,
                        epsilon: e,
                        max_skip: k,
                        layout,
                        reuse,
                        ..base.clone()
                    },
                });
            }
        }
    }
    // FlashDiff also reuses stale values where whole-step caching's authors do: its ε line
    // with no K bound, reusing the last velocity, so it contains stale caching too.
    if base.reuse != Reuse::Stale {
        for &(e, k) in budget_knob.iter().filter(|&&(_, k)| k == unbounded) {
            v.push(Setting {
                method: "flashdiff",
                label: format!("ε {e} K {k} reuse stale"),
                cfg: RequestConfig {
                    mode: Mode::FlashDiff,
                    epsilon: e,
                    max_skip: k,
                    reuse: Reuse::Stale,
                    ..base.clone()
                },
            });
        }
    }
    // A work budget F: the pace computes floor(F x steps) steps, spent where the change is;
    // with extrapolated reuse, again with the resume correction (" reuse corrected", on knob
    // lines of their own).
    let mut budget_orders: Vec<(Reuse, String)> =
        orders.iter().map(|&(r, o)| (r, o.to_string())).collect();
    if base.reuse == Reuse::Extrapolate {
        for &(r, o) in &orders {
            budget_orders.push((r.corrected(), format!("{o} reuse corrected")));
        }
    }
    for (reuse, order) in budget_orders {
        for f in [
            0.2f32, 0.25, 0.3, 0.33, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
        ] {
            if computes_for(f, base.steps) >= base.warmup + FINAL_FULL_STEPS {
                v.push(Setting {
                    method: "flashdiff-budget",
                    label: format!("F {f}{order}"),
                    cfg: RequestConfig {
                        mode: Mode::FlashDiff,
                        budget: Some(f),
                        reuse,
                        ..base.clone()
                    },
                });
            }
        }
    }
    let gate_knob = [
        (0.02f32, 3u32),
        (0.05, 3),
        (0.1, 3),
        (0.2, 3),
        (0.3, 3),
        (0.5, 3),
        (1.0, 3),
        (1.0, 5),
        (1.0, 8),
        (1.0, 12),
    ];
    for (e, k) in gate_knob {
        v.push(Setting {
            method: "patch-gate",
            label: format!("ε {e} K {k}"),
            cfg: RequestConfig {
                mode: Mode::PatchGate,
                epsilon: e,
                max_skip: k,
                ..base.clone()
            },
        });
    }
    let stale = [(Reuse::Stale, "")];
    for (method, reuses) in [("teacache", &orders[..]), ("teacache-stale", &stale[..])] {
        for &(reuse, order) in reuses {
            for t in [
                0.03f32, 0.05, 0.07, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.8, 1.2,
            ] {
                v.push(Setting {
                    method,
                    label: format!("threshold {t}{order}"),
                    cfg: RequestConfig {
                        mode: Mode::TeaCache,
                        cache_threshold: t,
                        // The threshold alone, as TeaCache's authors run it.
                        max_skip: base.steps,
                        reuse,
                        ..base.clone()
                    },
                });
            }
        }
    }
    // DBCache on the watched model's split forward, with every reuse rule on lines of its
    // own, so its curve is the best of the three.
    let db_reuses: Vec<(Reuse, &str)> = orders
        .iter()
        .copied()
        .chain((base.reuse != Reuse::Stale).then_some((Reuse::Stale, " reuse stale")))
        .collect();
    if dbcache {
        for &(reuse, order) in &db_reuses {
            for t in [
                0.02f32, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.2,
            ] {
                v.push(Setting {
                    method: "dbcache",
                    label: format!("threshold {t}{order}"),
                    cfg: RequestConfig {
                        mode: Mode::DbCache,
                        cache_threshold: t,
                        reuse,
                        ..base.clone()
                    },
                });
            }
        }
    }
    for (method, reuses) in [("ras", &orders[..]), ("ras-stale", &stale[..])] {
        for &(reuse, order) in reuses {
            for q in [0.1f32, 0.2, 0.3, 0.5, 0.75] {
                v.push(Setting {
                    method,
                    label: format!("share {q}{order}"),
                    cfg: RequestConfig {
                        mode: Mode::Ras,
                        ras_ratio: q,
                        reuse,
                        ..base.clone()
                    },
                });
            }
        }
    }
    for n in [8u32, 12, 16, 20, 25, 30, 35, 40] {
        if n < base.steps {
            v.push(Setting {
                method: "fewer-steps",
                label: format!("{n} steps"),
                cfg: RequestConfig {
                    mode: Mode::Full,
                    steps: n,
                    warmup: base.warmup.min(n - 1),
                    ..base.clone()
                },
            });
        }
    }
    // The budget is the flashdiff-budget row's knob alone: a --budget given to the study
    // does not turn every other setting into a budgeted one.
    for s in &mut v {
        if s.method != "flashdiff-budget" {
            s.cfg.budget = None;
        }
    }
    let r = workers.max(2);
    v.push(Setting {
        method: "distrifusion",
        label: format!("R {r}"),
        cfg: RequestConfig {
            mode: Mode::NoSkip,
            patches: Some(r),
            layout: LayoutKind::Uniform,
            reuse: Reuse::Stale,
            monotasks: Some(u32::MAX),
            ..base.clone()
        },
    });
    // How long to warm up is a setting of every method: where the model's own warm-up is
    // longer than the paper's, every setting but full computation's (whose warm-up steps are
    // full steps like the rest) runs again at SHORT_WARMUP, on knob lines of its own, and
    // each method's curve is the best of both.
    if base.warmup > DEFAULT_WARMUP {
        let short: Vec<Setting> = v
            .iter()
            .filter(|s| s.cfg.mode != Mode::Full)
            .map(|s| Setting {
                method: s.method,
                label: format!("{} warm-up {SHORT_WARMUP}", s.label),
                cfg: RequestConfig {
                    warmup: SHORT_WARMUP,
                    ..s.cfg.clone()
                },
            })
            .collect();
        v.extend(short);
    }
    v
}

/// Whether a study asked for the methods `only` runs `method`: full computation always (the
/// reference), per-patch with FlashDiff (whose curve reads its settings as share 1).
fn runs(only: &[String], method: &str) -> bool {
    let wanted = |m: &str| only.iter().any(|o| o == m);
    method == "full" || wanted(method) || (method == "per-patch" && wanted("flashdiff"))
}

/// A held-out prompt and the checker's per-part verdict on a sample.
type Checker = Box<dyn Fn(&Sample) -> Vec<bool>>;

fn prompt_and_checker(kind: Kind, seed: u64) -> (String, Checker) {
    match kind {
        Kind::Image => {
            let s = scene::sample(seed);
            let p = scene::prompt_text(&s);
            (
                p,
                Box::new(move |o: &Sample| {
                    let v = flashdiff_eval::image::check(&o.rgb, &s);
                    vec![v.background, v.present, v.shape]
                }),
            )
        }
        _ => {
            let (p, check) = crate::media::prompt_and_checker(kind, seed);
            (p, Box::new(move |o: &Sample| check(o).1))
        }
    }
}

/// Fidelity against full computation (dB) and SSIM (images; NaN otherwise).
fn fidelity(kind: Kind, o: &Sample, full: &Sample) -> (f64, f64) {
    match kind {
        Kind::Image => (
            flashdiff_eval::metrics::psnr(&o.rgb, &full.rgb).min(99.0),
            flashdiff_eval::metrics::ssim(&o.rgb, &full.rgb, IMAGE, IMAGE),
        ),
        Kind::Video => (
            flashdiff_eval::metrics::video_quality(o, full)
                .map_or(f64::NAN, |q| q.clip_psnr.min(99.0)),
            f64::NAN,
        ),
        _ => (
            flashdiff_eval::metrics::audio_quality(o, full).map_or(f64::NAN, |q| q.snr.min(99.0)),
            f64::NAN,
        ),
    }
}

/// Sums over the prompts of one setting.
#[derive(Default)]
struct Acc {
    work: f64,
    db: f64,
    worst_db: Option<f64>,
    worst_prompt: u64,
    /// The worst over the prompts whose full computation the checker accepts.
    worst_right: Option<f64>,
    /// Those prompts.
    right: usize,
    ssim: f64,
    agree: usize,
    skipped: f64,
    ms: f64,
    n: usize,
}

impl Acc {
    /// One prompt's result; `full_right`: the checker accepts every part of full
    /// computation's output for this prompt.
    fn add(
        &mut self,
        o: &Output,
        steps: u32,
        (db, ssim): (f64, f64),
        (agree, full_right): (bool, bool),
        seed: u64,
    ) {
        self.work += work(o, steps);
        self.quality(db, seed, full_right);
        self.ssim += ssim;
        self.agree += usize::from(agree);
        self.skipped += 1.0 - o.report.computed as f64 / o.report.patch_steps.max(1) as f64;
        self.ms += ms(o.report.latency);
        self.n += 1;
    }

    /// One prompt's fidelity: the mean's sum, the worst prompt, and the worst among the
    /// prompts full computation gets right.
    fn quality(&mut self, db: f64, seed: u64, full_right: bool) {
        self.db += db;
        if self.worst_db.is_none_or(|w| db < w) {
            self.worst_db = Some(db);
            self.worst_prompt = seed;
        }
        if full_right {
            self.right += 1;
            self.worst_right = Some(self.worst_right.map_or(db, |w| w.min(db)));
        }
    }
}

/// Runs the curve study on `engine`'s model over `cfg.prompts` held-out prompts, writes
/// `curve.json`, `report.md` and `quality_vs_work.svg` into `out`, returns the report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    only: Option<&[String]>,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<String, EngineError> {
    let base = RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    };
    let split = engine.model().depth() > DBCACHE_FRONT_BLOCKS;
    let mut list = settings(&base, engine.workers(), split);
    if let Some(only) = only {
        if let Some(bad) = only
            .iter()
            .find(|m| !list.iter().any(|s| s.method == m.as_str()))
        {
            let mut names: Vec<&str> = list.iter().map(|s| s.method).collect();
            names.dedup();
            return Err(EngineError::Invalid {
                field: "methods",
                reason: format!(
                    "{bad:?}: the study runs {} (the ablation flashdiff-order1 is read from \
                     flashdiff's settings)",
                    names.join(", ")
                ),
            });
        }
        list.retain(|s| runs(only, s.method));
    }
    prepare(cfg, out)?;
    let kind = engine.model().kind();
    let mut acc: Vec<Acc> = list.iter().map(|_| Acc::default()).collect();
    let mut prompts = Vec::new();
    for i in 0..cfg.prompts as u64 {
        let seed = cfg.seed + i;
        progress(&format!(
            "prompt {}/{}: {} settings",
            i + 1,
            cfg.prompts,
            list.len()
        ));
        let (prompt, check) = prompt_and_checker(kind, seed);
        prompts.push(json!({"seed": seed, "prompt": prompt}));
        let mut full: Option<(Output, Vec<bool>)> = None;
        for (s, a) in list.iter().zip(&mut acc) {
            let o = engine.generate(
                &prompt,
                RequestConfig {
                    seed,
                    ..s.cfg.clone()
                },
                &mut |_| {},
            )?;
            let parts = check(&o.sample);
            let (q, agree) = match &full {
                Some((f, fparts)) => (fidelity(kind, &o.sample, &f.sample), parts == *fparts),
                None => (fidelity(kind, &o.sample, &o.sample), true),
            };
            let fparts = full.as_ref().map_or(&parts, |(_, fp)| fp);
            let full_right = !fparts.is_empty() && fparts.iter().all(|&ok| ok);
            a.add(&o, cfg.steps, q, (agree, full_right), seed);
            if full.is_none() {
                full = Some((o, parts));
            }
        }
    }
    let points: Vec<Value> = list
        .iter()
        .zip(&acc)
        .map(|(s, a)| {
            let n = a.n.max(1) as f64;
            json!({
                "method": s.method,
                "setting": s.label,
                "work": a.work / n,
                "db": a.db / n,
                "worst_db": a.worst_db.unwrap_or(f64::NAN),
                "worst_prompt_seed": a.worst_prompt,
                "worst_db_full_right": a.worst_right.unwrap_or(f64::NAN),
                "full_right_prompts": a.right,
                "ssim": a.ssim / n,
                "agreement": a.agree as f64 / n,
                "patch_steps_skipped": a.skipped / n,
                "latency_ms": a.ms / n,
            })
        })
        .collect();
    let head = Header {
        prompts: cfg.prompts,
        seed: cfg.seed,
        steps: cfg.steps,
        patches: cfg.patches,
        workers: engine.workers(),
    };
    let md = report(kind, &head, &points);
    plot(out, kind, &points).map_err(|e| EngineError::Config(format!("plotting: {e}")))?;
    let doc = json!({
        "config": {"model_kind": format!("{kind:?}"), "prompts": cfg.prompts, "seed": cfg.seed, "steps": cfg.steps, "patches": cfg.patches, "workers": engine.workers(), "judged_work": [JUDGED.0, JUDGED.1]},
        "prompts": prompts,
        "points": points,
    });
    write_outputs(out, &doc, &md)?;
    let _ = std::fs::rename(out.join("bench.json"), out.join("curve.json"));
    Ok(md)
}

/// A method's settings as (work, value) points, sorted by work.
fn settings_points(points: &[Value], method: &str, key: &str) -> Vec<(f64, f64)> {
    let mut c: Vec<(f64, f64)> = of_method(points, method)
        .map(|(p, _)| (f(p, "work"), f(p, key)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    c.sort_by(|a, b| a.0.total_cmp(&b.0));
    c
}

/// The settings a row of the study reads, each with what its label gains there: its own;
/// for `flashdiff` also per-patch's, which are FlashDiff at share 1 (a computed step runs
/// only the patches at their budget), on knob lines of their own (" share 1"); for
/// `flashdiff-order1` FlashDiff's first-order ones (both shares, no stale reuse).
fn of_method<'a>(
    points: &'a [Value],
    method: &'a str,
) -> impl Iterator<Item = (&'a Value, &'static str)> + 'a {
    let first_order_only = method == "flashdiff-order1";
    let flashdiff = first_order_only || method == "flashdiff";
    points.iter().filter_map(move |p| {
        let label = p["setting"].as_str().unwrap_or("");
        let suffix = match p["method"].as_str() {
            Some(m) if m == method && !flashdiff => "",
            Some("flashdiff") if flashdiff => "",
            Some("per-patch") if flashdiff => SHARE_1,
            _ => return None,
        };
        let second = label.contains("order 2") || label.contains("stale");
        (!(first_order_only && second)).then_some((p, suffix))
    })
}

/// What a per-patch setting's label gains among FlashDiff's.
const SHARE_1: &str = " share 1";

/// Whether the study ran `method` (a study may run some methods only): one of the rows it
/// reads is its own (FlashDiff's curve reading per-patch's rows does not make it run).
fn ran(points: &[Value], method: &str) -> bool {
    of_method(points, method).any(|(_, suffix)| suffix.is_empty())
}

/// A method's curve for `key` ("db" or "worst_db") from a study's points.
fn curve(points: &[Value], method: &str, key: &str) -> Curve {
    let settings: Vec<(String, f64, f64)> = of_method(points, method)
        .map(|(p, suffix)| {
            (
                format!("{}{suffix}", p["setting"].as_str().unwrap_or("")),
                f(p, "work"),
                f(p, key),
            )
        })
        .collect();
    Curve::new(&settings)
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// What a study's report says it ran.
struct Header {
    prompts: u32,
    seed: u64,
    steps: u32,
    patches: u32,
    workers: u32,
}

/// Reads a study's `curve.json` in `dir` again and writes its `report.md` and plot with the
/// verdict as this version reads it; returns the report. The error names what is wrong with
/// the file.
pub fn reread(dir: &Path) -> Result<String, String> {
    let path = dir.join("curve.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let c = &doc["config"];
    let kind = match c["model_kind"].as_str() {
        Some("Image") => Kind::Image,
        Some("Video") => Kind::Video,
        Some("Audio") => Kind::Audio,
        other => {
            return Err(format!(
                "{}: config.model_kind {other:?}: expected Image, Video or Audio",
                path.display()
            ))
        }
    };
    let num = |k: &str| {
        c[k].as_u64()
            .ok_or_else(|| format!("{}: config.{k} is not a whole number", path.display()))
    };
    let head = Header {
        prompts: num("prompts")? as u32,
        seed: num("seed")?,
        steps: num("steps")? as u32,
        patches: num("patches")? as u32,
        workers: num("workers")? as u32,
    };
    let points = doc["points"]
        .as_array()
        .ok_or_else(|| format!("{}: no points", path.display()))?;
    let md = report(kind, &head, points);
    plot(dir, kind, points).map_err(|e| format!("plotting: {e}"))?;
    std::fs::write(dir.join("report.md"), &md)
        .map_err(|e| format!("cannot write {}: {e}", dir.join("report.md").display()))?;
    Ok(md)
}

fn report(kind: Kind, cfg: &Header, points: &[Value]) -> String {
    let workers = cfg.workers;
    let unit = if kind == Kind::Audio { "SNR" } else { "PSNR" };
    let mut md = format!(
        "# FlashDiff bench: quality against work ({kind:?} model)\n\n{} held-out prompts (seeds from {}), {} steps, {} patches for the patch methods, {workers} worker(s). Work: the share of full computation's model work, warm-up included. {unit} against full computation from the same seed (capped at 99 dB); worst: the worst prompt; agreement: the built-in checker gives the same verdict as on full computation.\n\n| method | what it is |\n| --- | --- |\n",
        cfg.prompts, cfg.seed, cfg.steps, cfg.patches
    );
    for (m, what) in METHODS.iter().filter(|(m, _)| ran(points, m)) {
        md.push_str(&format!("| {m} | {what} |\n"));
    }
    let short = format!("warm-up {SHORT_WARMUP}");
    if points
        .iter()
        .any(|p| p["setting"].as_str().is_some_and(|l| l.ends_with(&short)))
    {
        md.push_str(&format!(
            "\nThe model's warm-up is longer than the paper's {DEFAULT_WARMUP} steps, so every setting but full computation's also ran at a warm-up of {SHORT_WARMUP} (\"{short}\"); each method's curve is the best of both.\n"
        ));
    }
    let right = points.iter().find_map(|p| p["full_right_prompts"].as_u64());
    if let Some(right) = right {
        md.push_str(&format!(
            "\nWorst where full is right: the worst prompt among the {right} of {} whose full computation the built-in checker accepts. A prompt the model renders wrongly sits where its output can flip between two images, so any change to which steps are computed may move it far from full computation's; this column leaves those prompts out (a prompt full computation renders rightly can still be that sensitive). The verdict below reads the worst prompt over all prompts.\n",
            cfg.prompts
        ));
    }
    md.push_str(&format!(
        "\n## Every setting\n\n| method | setting | work | {unit} mean dB | {unit} worst dB | {unit} worst dB where full is right | SSIM | agreement | patch-steps skipped | latency ms |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    ));
    for p in points {
        md.push_str(&format!(
            "| {} | {} | {:.3} | {:.2} | {:.2} | {} | {} | {:.0}% | {:.0}% | {:.0} |\n",
            p["method"].as_str().unwrap_or(""),
            p["setting"].as_str().unwrap_or(""),
            f(p, "work"),
            f(p, "db"),
            f(p, "worst_db"),
            if f(p, "worst_db_full_right").is_finite() {
                format!("{:.2}", f(p, "worst_db_full_right"))
            } else {
                "-".into()
            },
            if f(p, "ssim").is_finite() {
                format!("{:.4}", f(p, "ssim"))
            } else {
                "-".into()
            },
            100.0 * f(p, "agreement"),
            100.0 * f(p, "patch_steps_skipped"),
            f(p, "latency_ms"),
        ));
    }
    md.push_str(&format!(
        "\n## Verdict: FlashDiff against every other method over work {:.2}-{:.2}\n\nEach method is read at each work level as the better of its best setting at or below that work (what one setting reaches; above its most work, its best) and the straight line between the two neighbouring settings of one knob line on either side (a knob line: the settings along which one knob value changes and the others stay, as ε at K 3; the line stands for the knob values between the two). No line joins settings of different knob lines, so adding a setting on a new line can only raise a curve, and no curve is read below a setting it measured. The margin is FlashDiff's {unit} minus the other's at the same work, at every level from where both have a setting to the range's end. \"ahead\" needs a margin of at least 0 everywhere, for the mean and for the worst prompt.\n\n",
        JUDGED.0, JUDGED.1
    ));
    let all_ahead = verdict_table(points, &mut md);
    let levels = [0.25, 0.3, 0.35, 0.45, 0.6];
    md.push_str(&format!(
        "\nMean / worst-prompt {unit} (dB) at equal work, read off each curve:\n\n| method |{}\n| --- |{}\n",
        levels.map(|w| format!(" work {w} |")).concat(),
        " --- |".repeat(levels.len())
    ));
    for (m, _) in METHODS
        .iter()
        .filter(|(m, _)| *m != "full" && ran(points, m))
    {
        let (mean, worst) = (curve(points, m, "db"), curve(points, m, "worst_db"));
        let cells: String = levels
            .map(|w| match (mean.at(w), worst.at(w)) {
                (Some(a), Some(b)) => format!(" {a:.1} / {b:.1} |"),
                _ => " - |".to_string(),
            })
            .concat();
        md.push_str(&format!("| {m} |{cells}\n"));
    }
    let fd = curve(points, "flashdiff", "db").points;
    if let (Some(lo), Some(hi)) = (fd.first(), fd.last()) {
        md.push_str(&format!(
            "\nFlashDiff's settings reach work {:.3}-{:.3}{}.\n",
            lo.0,
            hi.0,
            if lo.0 > JUDGED.0 {
                format!(
                    "; below {:.3} it has no point, so the range {:.2}-{:.3} is not judged",
                    lo.0, JUDGED.0, lo.0
                )
            } else {
                String::new()
            }
        ));
    }
    md.push_str(&format!(
        "\nOverall: {} of every other method (the ablations, FlashDiff's own variants, aside) in the compared ranges.\n\nPlot: `quality_vs_work.svg` (solid: mean, dashed: worst prompt; each curve read as above).\n",
        if all_ahead { "ahead" } else { "**not ahead**" },
    ));
    md
}

/// FlashDiff's own variants in the study: rows that say what each part of it buys, not
/// methods it is judged against.
const ABLATIONS: [&str; 5] = [
    "flashdiff-budget",
    "flashdiff-order1",
    "flashdiff-uniform",
    "per-patch",
    "patch-gate",
];

/// The verdict table of FlashDiff against every other method; whether FlashDiff is ahead of
/// all of them but its [`ABLATIONS`].
fn verdict_table(points: &[Value], md: &mut String) -> bool {
    md.push_str("| method | compared over work | worst margin, mean | worst margin, worst prompt | verdict |\n| --- | --- | --- | --- | --- |\n");
    let mut all_ahead = true;
    for (m, _) in METHODS
        .iter()
        .filter(|(m, _)| *m != "flashdiff" && *m != "full" && ran(points, m))
    {
        let margin = |key: &str| {
            worst_margin(
                &curve(points, "flashdiff", key),
                &curve(points, m, key),
                JUDGED,
            )
        };
        let ablation = ABLATIONS.contains(m);
        let tag = if ablation { " (ablation)" } else { "" };
        let (Some((mm, mw, range)), Some((wm, ww, _))) = (margin("db"), margin("worst_db")) else {
            md.push_str(&format!(
                "| {m}{tag} | the curves share no work level in the range | - | - | not compared |\n"
            ));
            continue;
        };
        let ahead = mm >= 0.0 && wm >= 0.0;
        all_ahead &= ahead || ablation;
        md.push_str(&format!(
            "| {m}{tag} | {:.3}-{:.3} | {mm:+.2} dB at work {mw:.3} | {wm:+.2} dB at work {ww:.3} | {} |\n",
            range.0,
            range.1,
            if ahead { "ahead" } else { "**behind**" }
        ));
    }
    all_ahead
}

/// Mean (solid) and worst-prompt (dashed) quality against work, a colour per method.
fn plot(out: &Path, kind: Kind, points: &[Value]) -> PlotResult {
    use plotters::prelude::*;
    let path = out.join("quality_vs_work.svg");
    let root = SVGBackend::new(&path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = points
        .iter()
        .map(|p| f(p, "db"))
        .filter(|v| v.is_finite())
        .fold(30.0f64, f64::max)
        .min(100.0)
        + 5.0;
    let unit = if kind == Kind::Audio { "SNR" } else { "PSNR" };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{unit} against full computation vs work ({kind:?})"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..1.05f64, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("share of full computation's work")
        .y_desc(format!("{unit} dB"))
        .draw()?;
    let colours = crate::colours();
    for (i, (m, _)) in METHODS
        .iter()
        .filter(|(m, _)| *m != "full" && ran(points, m))
        .enumerate()
    {
        let c = colours[i % colours.len()];
        // Each curve sampled every 1/400 of the work from its least work.
        let sample = |key: &str| -> Vec<(f64, f64)> {
            let c = curve(points, m, key);
            (0..=420)
                .map(|i| i as f64 / 400.0)
                .filter_map(|w| Some((w, c.at(w)?)))
                .collect()
        };
        let (mean, worst) = (sample("db"), sample("worst_db"));
        chart
            .draw_series(LineSeries::new(mean, c.stroke_width(2)))?
            .label(*m)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart.draw_series(
            settings_points(points, m, "db")
                .into_iter()
                .map(|p| Circle::new(p, 3, c.filled())),
        )?;
        // Dashed: every other sample's segment.
        for pair in worst.windows(2).step_by(2) {
            chart.draw_series(LineSeries::new([pair[0], pair[1]], c))?;
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
#[path = "curve_tests.rs"]
mod tests;
