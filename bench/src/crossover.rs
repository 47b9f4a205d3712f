//! `flashdiff bench --study crossover`: regional execution (a computed step runs only the
//! patches whose own change reached their budget, the others forecast) against whole-step
//! caching with a forecaster, on one image model, under the verdict protocol
//! ([`crate::protocol`]). Run once per model size into one folder, the study keeps each
//! size's results in a folder of its own (`<out>/<model>/`) and rewrites the table of the
//! regional-minus-whole-step margin by size and work (`<out>/crossover.md`) from every size
//! found there.
//!
//! Every method gets the same [`CANDIDATES`] settings of the same knobs: the change threshold
//! (ε for the regional methods, the threshold for whole-step caching; the same values), the
//! skip cap K (a computed step at least every K + 1: FORA's and TaylorSeer's interval) and
//! the forecast order (1 or 2, velocities and K/V alike); fewer steps gets as many step
//! counts. The model's warm-up is every method's.

use std::path::Path;

use serde_json::{json, Value};

use crate::protocol::{self, PerPrompt, Split, IMAGE_TARGETS};
use crate::{ms, work, write_outputs, BenchConfig};
use flashdiff_models::scene;
use flashdiff_runtime::engine::{
    Engine, EngineError, LayoutKind, Mode, Output, RequestConfig, FINAL_FULL_STEPS,
};

/// Candidate settings per method.
pub const CANDIDATES: usize = 32;

/// The change thresholds every method but fewer steps tries (ε, or whole-step caching's
/// threshold on the same accumulated relative change of block 0's input).
const THRESHOLDS: [f32; 4] = [0.05, 0.1, 0.2, 0.4];

/// The skip caps K every method but fewer steps tries: at 50 steps after a warm-up of 5, K
/// 16 lets whole steps reach work 0.2 (10 computed steps), K 2 keeps them near 0.4.
const SKIP_CAPS: [u32; 4] = [2, 4, 8, 16];

/// The compared methods: name and what it is.
pub const METHODS: [(&str, &str); 5] = [
    (
        "regional",
        "FlashDiff regional: saliency patches; a computed step runs only the patches whose own accumulated change of block 0's input reached ε (or that skipped K steps), the others advance on forecast velocity and K/V",
    ),
    (
        "whole-step",
        "whole-step caching with a forecaster: every token is computed once the latent's accumulated change of block 0's input reaches the threshold (or K steps were skipped), else every token advances on its forecast velocity",
    ),
    (
        "uniform-grid",
        "ablation: regional on a uniform grid of patches instead of the saliency cut",
    ),
    (
        "random-patches",
        "ablation: regional's number of patches per step, drawn at random",
    ),
    ("fewer-steps", "full computation with fewer steps"),
];

/// One candidate setting of one method.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The method's name ([`METHODS`]).
    pub method: &'static str,
    /// The setting as the report names it.
    pub label: String,
    /// The request it runs (the prompt's seed is set per prompt).
    pub cfg: RequestConfig,
}

/// Every method's candidates, [`CANDIDATES`] each, in [`METHODS`] order.
pub fn candidates(base: &RequestConfig) -> Vec<Candidate> {
    let mut v = Vec::new();
    for (method, mode, layout) in [
        ("regional", Mode::PerPatch, base.layout),
        ("whole-step", Mode::TeaCache, base.layout),
        ("uniform-grid", Mode::PerPatch, LayoutKind::Uniform),
        ("random-patches", Mode::RandomPatches, base.layout),
    ] {
        for order in [1u8, 2] {
            for &k in &SKIP_CAPS {
                for &t in &THRESHOLDS {
                    v.push(Candidate {
                        method,
                        label: format!("{} {t} K {k} order {order}", knob_name(mode)),
                        cfg: RequestConfig {
                            mode,
                            layout,
                            epsilon: t,
                            cache_threshold: t,
                            max_skip: k,
                            reuse: base.reuse.at_order(order),
                            budget: None,
                            ..base.clone()
                        },
                    });
                }
            }
        }
    }
    for n in fewer_steps(base.steps) {
        v.push(Candidate {
            method: "fewer-steps",
            label: format!("{n} steps"),
            cfg: RequestConfig {
                mode: Mode::Full,
                steps: n,
                warmup: base.warmup.min(n - 1),
                budget: None,
                ..base.clone()
            },
        });
    }
    v
}

fn knob_name(mode: Mode) -> &'static str {
    if mode == Mode::TeaCache {
        "threshold"
    } else {
        "ε"
    }
}

/// [`CANDIDATES`] step counts below `steps` (fewer where there are not that many), spread
/// evenly from the fewest a run can take (2) up.
fn fewer_steps(steps: u32) -> Vec<u32> {
    let lo = 2u32.max(FINAL_FULL_STEPS + 1);
    let hi = steps.saturating_sub(1);
    if hi < lo {
        return Vec::new();
    }
    let span = (hi - lo) as usize;
    let mut v: Vec<u32> = (0..CANDIDATES)
        .map(|i| lo + ((i * span) as f64 / (CANDIDATES - 1) as f64).round() as u32)
        .collect();
    v.dedup();
    v
}

/// Per prompt of one setting: what the protocol reads and what the report adds.
#[derive(Default, Clone)]
struct Measured {
    scores: PerPrompt,
    ssim: Vec<f64>,
    agree: Vec<bool>,
    ms: Vec<f64>,
}

/// The study's prompts: its seeds and the canvas side their scenes are drawn for.
fn prompt_for(side: usize, seed: u64) -> (String, scene::Scene) {
    let s = scene::sample_sized(side, seed);
    (scene::prompt_text(&s), s)
}

/// The checker's per-part verdict, empty where the canvas has no checker.
fn check(rgb: &[f32], s: &scene::Scene) -> Vec<bool> {
    flashdiff_eval::image::check_sized(rgb, s)
        .map_or_else(Vec::new, |v| vec![v.background, v.present, v.shape])
}

/// Runs full computation and `settings` on the prompts of `seeds`; `progress` hears of each.
fn measure(
    engine: &mut Engine,
    side: usize,
    steps: u32,
    settings: &[&Candidate],
    seeds: std::ops::Range<u64>,
    what: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(Measured, Vec<Measured>), EngineError> {
    let mut full = Measured::default();
    let mut each = vec![Measured::default(); settings.len()];
    let n = seeds.end - seeds.start;
    for (i, seed) in seeds.enumerate() {
        progress(&format!(
            "{what} prompt {}/{n}: full computation and {} settings",
            i + 1,
            settings.len()
        ));
        let (prompt, s) = prompt_for(side, seed);
        let base = settings
            .first()
            .map_or_else(RequestConfig::default, |c| c.cfg.clone());
        let reference = engine.generate(
            &prompt,
            RequestConfig {
                mode: Mode::Full,
                steps,
                seed,
                ..base
            },
            &mut |_| {},
        )?;
        let fparts = check(&reference.sample.rgb, &s);
        let record = |m: &mut Measured, o: &Output| {
            let (db, ssim) = fidelity(side, &o.sample.rgb, &reference.sample.rgb);
            m.scores.push(work(o, steps), db);
            m.ssim.push(ssim);
            m.agree.push(check(&o.sample.rgb, &s) == fparts);
            m.ms.push(ms(o.report.latency));
        };
        record(&mut full, &reference);
        for (c, m) in settings.iter().zip(&mut each) {
            let o = engine.generate(
                &prompt,
                RequestConfig {
                    seed,
                    ..c.cfg.clone()
                },
                &mut |_| {},
            )?;
            record(m, &o);
        }
    }
    Ok((full, each))
}

/// PSNR (capped at 99 dB) and SSIM of `rgb` against `full`.
fn fidelity(side: usize, rgb: &[f32], full: &[f32]) -> (f64, f64) {
    (
        flashdiff_eval::metrics::psnr(rgb, full).min(99.0),
        flashdiff_eval::metrics::ssim(rgb, full, side, side),
    )
}

/// Runs the study on `engine`'s model: `validation` prompts choose each method's setting per
/// target, `cfg.prompts` test prompts (the seeds after them) judge; writes
/// `<out>/<model>/crossover.json`, `report.md` and `quality_vs_work.svg` (and `.png`), rewrites
/// `<out>/crossover.md`; returns the model's report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    validation: u32,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<String, EngineError> {
    let model = engine.model().name().to_string();
    if engine.model().kind() != flashdiff_models::Kind::Image {
        return Err(EngineError::Config(format!(
            "the crossover study runs on image models; {model} is not one"
        )));
    }
    let side = match engine.model().image_size() {
        Some((w, h)) if w == h => w,
        Some((w, h)) => {
            return Err(EngineError::Config(format!(
                "the crossover study draws square scenes; {model} makes {w}x{h} images"
            )))
        }
        None => scene::IMAGE,
    };
    let split = Split::consecutive(cfg.seed, validation, cfg.prompts).map_err(|e| {
        EngineError::Invalid {
            field: "prompts",
            reason: e,
        }
    })?;
    let base = RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    };
    let list = candidates(&base);
    let dir = out.join(&model);
    std::fs::create_dir_all(&dir)
        .map_err(|e| EngineError::Config(format!("cannot create {}: {e}", dir.display())))?;
    // Validation: every candidate on every validation prompt.
    let all: Vec<&Candidate> = list.iter().collect();
    let (_, val) = measure(
        engine,
        side,
        cfg.steps,
        &all,
        split.validation(),
        "validation",
        progress,
    )?;
    // Each method's choice per target.
    let mut chosen: Vec<usize> = Vec::new();
    let mut choice: Vec<Vec<Option<usize>>> = Vec::new();
    for &t in &IMAGE_TARGETS {
        let mut row = Vec::new();
        for (m, _) in METHODS {
            let idx: Vec<usize> = (0..list.len()).filter(|&i| list[i].method == m).collect();
            let scores: Vec<PerPrompt> = idx.iter().map(|&i| val[i].scores.clone()).collect();
            let pick = protocol::choose(&scores, t).map(|j| idx[j]);
            if let Some(i) = pick {
                if !chosen.contains(&i) {
                    chosen.push(i);
                }
            }
            row.push(pick);
        }
        choice.push(row);
    }
    // Test: the chosen settings once each.
    let run_list: Vec<&Candidate> = chosen.iter().map(|&i| &list[i]).collect();
    let (full, test) = measure(
        engine,
        side,
        cfg.steps,
        &run_list,
        split.test(),
        "test",
        progress,
    )?;
    let tested = |i: usize| &test[chosen.iter().position(|&c| c == i).expect("chosen")];
    let boot_seed = split.test().start;
    let mut targets = Vec::new();
    for (ti, &t) in IMAGE_TARGETS.iter().enumerate() {
        let mut rows = Vec::new();
        for (mi, (m, _)) in METHODS.iter().enumerate() {
            rows.push(match choice[ti][mi] {
                Some(i) => {
                    let r = tested(i);
                    let v = &val[i].scores;
                    json!({
                        "method": m, "setting": list[i].label,
                        "validation_work": v.mean_work(), "validation_db": v.mean_db(),
                        "work": r.scores.mean_work(), "max_work": r.scores.max_work(),
                        "db": r.scores.mean_db(), "worst_db": r.scores.worst_db(),
                        "ssim": mean(&r.ssim),
                        "agreement": r.agree.iter().filter(|&&a| a).count() as f64 / r.agree.len() as f64,
                        "wall_ms": mean(&r.ms),
                        "per_prompt_db": r.scores.db, "per_prompt_work": r.scores.work,
                    })
                }
                None => json!({"method": m, "setting": Value::Null}),
            });
        }
        let mut pairs = Vec::new();
        for a in 0..METHODS.len() {
            for b in a + 1..METHODS.len() {
                let (Some(ia), Some(ib)) = (choice[ti][a], choice[ti][b]) else {
                    continue;
                };
                let (p, v) = protocol::compare(&tested(ia).scores, &tested(ib).scores, boot_seed)
                    .map_err(EngineError::Config)?;
                pairs.push(json!({
                    "a": METHODS[a].0, "b": METHODS[b].0, "mean": p.mean, "lo": p.lo,
                    "hi": p.hi, "worst": p.worst, "verdict": v.to_string(),
                }));
            }
        }
        targets.push(json!({"target": t, "rows": rows, "pairs": pairs}));
    }
    let doc = json!({
        "config": {
            "model": model, "side": side, "steps": cfg.steps, "patches": cfg.patches,
            "warmup": base.warmup, "workers": engine.workers(),
            "validation_seeds": [split.validation().start, split.validation().end],
            "test_seeds": [split.test().start, split.test().end],
            "candidates_per_method": CANDIDATES, "bootstrap_seed": boot_seed,
            "resamples": protocol::RESAMPLES,
        },
        "full": {"wall_ms": mean(&full.ms), "agreement_checked": full.agree.len()},
        "candidates": list.iter().zip(&val).map(|(c, v)| json!({
            "method": c.method, "setting": c.label,
            "validation_work": v.scores.mean_work(), "validation_db": v.scores.mean_db(),
        })).collect::<Vec<_>>(),
        "targets": targets,
    });
    let md = report(&doc);
    write_outputs(&dir, &doc, &md)?;
    let _ = std::fs::rename(dir.join("bench.json"), dir.join("crossover.json"));
    plot(&dir, &doc).map_err(|e| EngineError::Config(format!("plotting: {e}")))?;
    let table = margin_table(out).map_err(EngineError::Config)?;
    std::fs::write(out.join("crossover.md"), &table).map_err(|e| {
        EngineError::Config(format!(
            "cannot write {}: {e}",
            out.join("crossover.md").display()
        ))
    })?;
    Ok(format!("{md}\n{table}"))
}

/// Writes every size's `report.md` and pictures in `out` again from its `crossover.json`, and
/// `crossover.md` from all of them, as this version reads them; returns the margin table.
/// The error names the file that could not be read or written.
pub fn reread(out: &Path) -> Result<String, String> {
    let entries = std::fs::read_dir(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut sizes = 0;
    for e in entries.flatten() {
        let dir = e.path();
        let path = dir.join("crossover.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let doc: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
        if !doc["targets"].is_array() {
            return Err(format!("{}: no targets", path.display()));
        }
        std::fs::write(dir.join("report.md"), report(&doc))
            .map_err(|e| format!("cannot write {}: {e}", dir.join("report.md").display()))?;
        plot(&dir, &doc).map_err(|e| format!("plotting {}: {e}", dir.display()))?;
        sizes += 1;
    }
    if sizes == 0 {
        return Err(format!(
            "{}: no MODEL/crossover.json in it (bench --study crossover writes them)",
            out.display()
        ));
    }
    let table = margin_table(out)?;
    std::fs::write(out.join("crossover.md"), &table)
        .map_err(|e| format!("cannot write {}: {e}", out.join("crossover.md").display()))?;
    Ok(table)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// One model's report from its `crossover.json` document.
fn report(doc: &Value) -> String {
    let c = &doc["config"];
    let mut md = format!(
        "# Crossover study: {} ({} x {} pixels)\n\n{} steps (warm-up {}), {} patches, {} worker(s). Settings chosen on validation seeds {}..{}, judged on test seeds {}..{} ({} prompts); {} candidate settings per method. Work: the share of full computation's model work, warm-up included. PSNR against full computation from the same seed (capped at 99 dB). Verdicts: the paired per-prompt difference (A minus B), its 95% bootstrap interval ({} resamples), and the worst-prompt difference; \"ahead\" when the interval lies above +{} dB and the worst prompt is higher, \"behind\" symmetrically, else \"level\"; \"not matched\" when the mean work differs by more than {} and the cheaper one is not ahead. Full computation: {:.0} ms a request.\n\n| method | what it is |\n| --- | --- |\n",
        c["model"].as_str().unwrap_or("?"),
        c["side"], c["side"], c["steps"], c["warmup"], c["patches"], c["workers"],
        c["validation_seeds"][0], c["validation_seeds"][1], c["test_seeds"][0], c["test_seeds"][1],
        c["test_seeds"][1]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(c["test_seeds"][0].as_u64().unwrap_or(0)),
        c["candidates_per_method"], protocol::RESAMPLES, protocol::MARGIN_DB, protocol::WORK_MATCH,
        num(&doc["full"], "wall_ms"),
    );
    for (m, what) in METHODS {
        md.push_str(&format!("| {m} | {what} |\n"));
    }
    for t in doc["targets"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "\n## Work {}\n\n| method | setting (validation work, mean dB) | work mean / max | PSNR mean dB | PSNR worst dB | SSIM | agreement | wall ms |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
            t["target"]
        ));
        for r in t["rows"].as_array().into_iter().flatten() {
            let m = r["method"].as_str().unwrap_or("?");
            match r["setting"].as_str() {
                Some(s) => md.push_str(&format!(
                    "| {m} | {s} ({:.3}, {:.2}) | {:.3} / {:.3} | {:.2} | {:.2} | {:.4} | {:.0}% | {:.0} |\n",
                    num(r, "validation_work"), num(r, "validation_db"), num(r, "work"),
                    num(r, "max_work"), num(r, "db"), num(r, "worst_db"), num(r, "ssim"),
                    100.0 * num(r, "agreement"), num(r, "wall_ms"),
                )),
                None => md.push_str(&format!(
                    "| {m} | no candidate at or under this work on the validation prompts | - | - | - | - | - | - |\n"
                )),
            }
        }
        md.push_str("\n| A | B | mean A - B dB [95% interval] | worst A - worst B dB | verdict of A |\n| --- | --- | --- | --- | --- |\n");
        for p in t["pairs"].as_array().into_iter().flatten() {
            md.push_str(&format!(
                "| {} | {} | {:+.2} [{:+.2}, {:+.2}] | {:+.2} | {} |\n",
                p["a"].as_str().unwrap_or("?"),
                p["b"].as_str().unwrap_or("?"),
                num(p, "mean"),
                num(p, "lo"),
                num(p, "hi"),
                num(p, "worst"),
                p["verdict"].as_str().unwrap_or("?"),
            ));
        }
    }
    md
}

/// The regional-minus-whole-step table over every size in `out` (each `<out>/<model>/
/// crossover.json`), smallest canvas first.
pub fn margin_table(out: &Path) -> Result<String, String> {
    let mut docs: Vec<Value> = Vec::new();
    let entries = std::fs::read_dir(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for e in entries.flatten() {
        let path = e.path().join("crossover.json");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let doc: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
            docs.push(doc);
        }
    }
    docs.sort_by_key(|d| d["config"]["side"].as_u64().unwrap_or(0));
    let mut md = format!(
        "# Crossover: regional against whole-step caching by size and work\n\nEach cell: regional minus whole-step, mean PSNR difference over the test prompts [95% bootstrap interval], worst-prompt difference, and the protocol's verdict of regional (settings chosen on validation prompts; see each size's report.md).\n\n| model | image tokens |{}\n| --- | --- |{}\n",
        IMAGE_TARGETS.map(|t| format!(" work {t} |")).concat(),
        " --- |".repeat(IMAGE_TARGETS.len()),
    );
    for d in &docs {
        let side = d["config"]["side"].as_u64().unwrap_or(0);
        let mut cells = String::new();
        for t in d["targets"].as_array().into_iter().flatten() {
            let pair = t["pairs"].as_array().into_iter().flatten().find(|p| {
                p["a"].as_str() == Some("regional") && p["b"].as_str() == Some("whole-step")
            });
            cells.push_str(&match pair {
                Some(p) => format!(
                    " {:+.2} [{:+.2}, {:+.2}], worst {:+.2}: {} |",
                    num(p, "mean"),
                    num(p, "lo"),
                    num(p, "hi"),
                    num(p, "worst"),
                    p["verdict"].as_str().unwrap_or("?")
                ),
                None => " not compared (a method had no setting this cheap) |".into(),
            });
        }
        md.push_str(&format!(
            "| {} | {} |{cells}\n",
            d["config"]["model"].as_str().unwrap_or("?"),
            (side / 4) * (side / 4),
        ));
    }
    Ok(md)
}

/// Test-prompt quality against work: each method's chosen settings (mean solid, worst
/// dashed), every validation candidate as a faint dot.
fn plot(dir: &Path, doc: &Value) -> crate::plots::PlotResult {
    use plotters::prelude::*;
    let path = dir.join("quality_vs_work.svg");
    let root = SVGBackend::new(&path, (820, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: PSNR against full computation vs work (test prompts)",
                doc["config"]["model"].as_str().unwrap_or("?")
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..0.7f64, 0f64..70f64)?;
    chart
        .configure_mesh()
        .x_desc("share of full computation's work")
        .y_desc("PSNR dB")
        .draw()?;
    let colours = crate::colours();
    for (mi, (m, _)) in METHODS.iter().enumerate() {
        let c = colours[mi % colours.len()];
        let rows: Vec<&Value> = doc["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| {
                t["rows"]
                    .as_array()?
                    .iter()
                    .find(|r| r["method"] == *m && r["setting"].is_string())
            })
            .collect();
        let mut mean: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (num(r, "work"), num(r, "db").min(70.0)))
            .collect();
        mean.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut worst: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (num(r, "work"), num(r, "worst_db").min(70.0)))
            .collect();
        worst.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(mean.clone(), c.stroke_width(2)))?
            .label(*m)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart.draw_series(mean.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
        chart.draw_series(worst.iter().map(|&p| Cross::new(p, 4, c)))?;
        chart.draw_series(LineSeries::new(worst, c))?;
        let cands = doc["candidates"].as_array().into_iter().flatten();
        chart.draw_series(
            cands
                .filter(|v| v["method"] == *m)
                .map(|v| (num(v, "validation_work"), num(v, "validation_db").min(70.0)))
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .map(|p| Circle::new(p, 2, c.mix(0.3).filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    drop(chart);
    drop(root);
    crate::plots::svg_to_png(&path, &dir.join("quality_vs_work.png"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_gets_the_same_tries_and_its_rows_hold_only_its_own_settings() {
        let base = RequestConfig {
            steps: 50,
            warmup: 5,
            patches: Some(16),
            ..RequestConfig::default()
        };
        let list = candidates(&base);
        let counts: Vec<(&str, usize)> = METHODS
            .iter()
            .map(|(m, _)| (*m, list.iter().filter(|c| c.method == *m).count()))
            .collect();
        assert_eq!(protocol::equal_tries(&counts), Ok(CANDIDATES), "{counts:?}");
        for c in &list {
            let (mode, layout) = (c.cfg.mode, c.cfg.layout);
            let own = match c.method {
                "regional" => mode == Mode::PerPatch && layout != LayoutKind::Uniform,
                "whole-step" => mode == Mode::TeaCache,
                "uniform-grid" => mode == Mode::PerPatch && layout == LayoutKind::Uniform,
                "random-patches" => mode == Mode::RandomPatches,
                "fewer-steps" => mode == Mode::Full && c.cfg.steps < base.steps,
                _ => false,
            };
            assert!(own, "{} holds {:?}", c.method, c.label);
            assert!(c.cfg.budget.is_none());
        }
        // The knobs the regional and whole-step methods try are the same values.
        let knobs = |m: &str| -> Vec<(u32, u32, bool)> {
            list.iter()
                .filter(|c| c.method == m)
                .map(|c| {
                    let t = if c.cfg.mode == Mode::TeaCache {
                        c.cfg.cache_threshold
                    } else {
                        c.cfg.epsilon
                    };
                    (t.to_bits(), c.cfg.max_skip, c.cfg.reuse.forecasts())
                })
                .collect()
        };
        assert_eq!(knobs("regional"), knobs("whole-step"));
    }

    #[test]
    fn the_margin_table_is_read_again_from_each_size() {
        let out = std::env::temp_dir().join(format!("fd-crossover-{}", std::process::id()));
        std::fs::create_dir_all(out.join("tinyflux-l")).unwrap();
        assert!(reread(&out)
            .unwrap_err()
            .contains("no MODEL/crossover.json"));
        let row = |m: &str, db: f64| {
            json!({"method": m, "setting": "ε 0.1 K 2 order 2", "validation_work": 0.3,
                   "validation_db": db, "work": 0.31, "max_work": 0.33, "db": db,
                   "worst_db": db - 5.0, "ssim": 0.99, "agreement": 1.0, "wall_ms": 100.0})
        };
        let doc = json!({
            "config": {"model": "tinyflux-l", "side": 64, "steps": 50, "patches": 16,
                       "warmup": 5, "workers": 2, "validation_seeds": [0, 8],
                       "test_seeds": [8, 40], "candidates_per_method": CANDIDATES},
            "full": {"wall_ms": 300.0},
            "candidates": [{"method": "regional", "setting": "x", "validation_work": 0.3,
                            "validation_db": 40.0}],
            "targets": [{"target": 0.33, "rows": [row("regional", 41.0), row("whole-step", 40.0)],
                         "pairs": [{"a": "regional", "b": "whole-step", "mean": 1.0, "lo": 0.4,
                                    "hi": 1.6, "worst": 0.5, "verdict": "ahead"}]}],
        });
        std::fs::write(
            out.join("tinyflux-l/crossover.json"),
            serde_json::to_string(&doc).unwrap(),
        )
        .unwrap();
        let table = reread(&out).unwrap();
        assert!(
            table.contains("| tinyflux-l | 256 | +1.00 [+0.40, +1.60], worst +0.50: ahead |"),
            "{table}"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("crossover.md")).unwrap(),
            table
        );
        let report = std::fs::read_to_string(out.join("tinyflux-l/report.md")).unwrap();
        assert!(report.contains("## Work 0.33"), "{report}");
        assert!(out.join("tinyflux-l/quality_vs_work.png").is_file());
        std::fs::remove_dir_all(&out).ok();
    }
}
