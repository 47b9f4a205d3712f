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

use anyhow::{bail, Context, Error};
use std::path::Path;

use serde_json::Value;

use crate::protocol::IMAGE_TARGETS;
use crate::study::{self, num, Candidate, Method};
use crate::BenchConfig;
use flashdiff_runtime::engine::{Engine, LayoutKind, Mode, RequestConfig};

/// Candidate settings per method.
pub const CANDIDATES: usize = 32;

/// The change thresholds every method but fewer steps tries (ε, or whole-step caching's
/// threshold on the same accumulated relative change of block 0's input).
const THRESHOLDS: [f32; 4] = [0.05, 0.1, 0.2, 0.4];

/// The skip caps K every method but fewer steps tries: at 50 steps after a warm-up of 5, K
/// 16 lets whole steps reach work 0.2 (10 computed steps), K 2 keeps them near 0.4.
const SKIP_CAPS: [u32; 4] = [2, 4, 8, 16];

/// The compared methods: name and what it is.
pub const METHODS: [Method; 6] = [
    (
        "regional",
        "FlashDiff regional: saliency patches; a computed step runs only the patches whose own accumulated change of block 0's input reached ε (or that skipped K steps), the others advance on forecast velocity and K/V",
    ),
    (
        "whole-step",
        "whole-step caching with a forecaster: every token is computed once the latent's accumulated change of block 0's input reaches the threshold (or K steps were skipped), else every token advances on its forecast velocity",
    ),
    (
        "auto",
        "FlashDiff's automatic choice (--mode auto): the change budget, run regionally when the request's patches changed unevenly after the warm-up, else in whole steps (the default rule)",
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

/// Every method's candidates, [`CANDIDATES`] each, in [`METHODS`] order.
pub fn candidates(base: &RequestConfig) -> Vec<Candidate> {
    let mut v = Vec::new();
    for (method, mode, layout) in [
        ("regional", Mode::PerPatch, base.layout),
        ("whole-step", Mode::TeaCache, base.layout),
        ("auto", Mode::Auto, base.layout),
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
    v.extend(study::fewer_steps_candidates(base, CANDIDATES));
    v
}

fn knob_name(mode: Mode) -> &'static str {
    if mode == Mode::TeaCache {
        "threshold"
    } else {
        "ε"
    }
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
) -> anyhow::Result<String> {
    let model = engine.model().name().to_string();
    if engine.model().kind() != flashdiff_models::Kind::Image {
        bail!("the crossover study runs on image models; {model} is not one");
    }
    let base = RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    };
    let list = candidates(&base);
    let doc = study::run(
        engine,
        cfg,
        "crossover",
        &METHODS,
        &list,
        (validation, Some(&out.join(&model))),
        progress,
    )?;
    let md = study::write(&out.join(&model), "crossover.json", &doc).map_err(Error::msg)?;
    let table = margin_table(out).map_err(Error::msg)?;
    std::fs::write(out.join("crossover.md"), &table)
        .with_context(|| format!("cannot write {}", out.join("crossover.md").display()))?;
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
        if !path.is_file() {
            continue;
        }
        let doc = with_methods(study::read(&path)?);
        study::write(&dir, "crossover.json", &doc)?;
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

/// A document written before the study kept its methods in it: the crossover's.
fn with_methods(mut doc: Value) -> Value {
    if !doc["methods"].is_array() {
        doc["methods"] = METHODS
            .iter()
            .map(|(m, w)| serde_json::json!({"name": m, "what": w}))
            .collect();
        doc["config"]["study"] = "crossover".into();
    }
    doc
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
    let head = format!(
        "| model | image tokens |{}\n| --- | --- |{}\n",
        IMAGE_TARGETS.map(|t| format!(" work {t} |")).concat(),
        " --- |".repeat(IMAGE_TARGETS.len()),
    );
    let mut md = format!(
        "# Crossover: regional against whole-step caching by size and work\n\nEach cell: A minus B, mean PSNR difference over the test prompts [95% bootstrap interval], worst-prompt difference, and the protocol's verdict of A (settings chosen on validation prompts; see each size's report.md).\n\n## Regional (A) against whole-step caching with a forecaster (B)\n\n{head}"
    );
    let rows = |a: &str, b: &str| {
        let mut md = String::new();
        for d in &docs {
            let side = d["config"]["side"].as_u64().unwrap_or(0);
            let mut cells = String::new();
            for t in d["targets"].as_array().into_iter().flatten() {
                // A pair is stored once, in method order: read B against A backwards.
                let pair = t["pairs"].as_array().into_iter().flatten().find_map(|p| {
                    let (pa, pb) = (p["a"].as_str(), p["b"].as_str());
                    if (pa, pb) == (Some(a), Some(b)) {
                        Some((p, 1.0))
                    } else if (pa, pb) == (Some(b), Some(a)) {
                        Some((p, -1.0))
                    } else {
                        None
                    }
                });
                cells.push_str(&match pair {
                    Some((p, sign)) => {
                        let (lo, hi) = if sign > 0.0 {
                            ("lo", "hi")
                        } else {
                            ("hi", "lo")
                        };
                        let verdict = match (p["verdict"].as_str().unwrap_or("?"), sign > 0.0) {
                            ("ahead", false) => "behind",
                            ("behind", false) => "ahead",
                            (v, _) => v,
                        };
                        format!(
                            " {:+.2} [{:+.2}, {:+.2}], worst {:+.2}: {verdict} |",
                            sign * num(p, "mean"),
                            sign * num(p, lo),
                            sign * num(p, hi),
                            sign * num(p, "worst"),
                        )
                    }
                    None => {
                        " not compared (not run, or a method had no setting this cheap) |".into()
                    }
                });
            }
            md.push_str(&format!(
                "| {} | {} |{cells}\n",
                d["config"]["model"].as_str().unwrap_or("?"),
                (side / 4) * (side / 4),
            ));
        }
        md
    };
    md.push_str(&rows("regional", "whole-step"));
    md.push_str("\n## The automatic choice (A) against each of its modes (B)\n");
    md.push_str("\nAgainst regional:\n\n");
    md.push_str(&head);
    md.push_str(&rows("auto", "regional"));
    md.push_str("\nAgainst whole-step caching with a forecaster:\n\n");
    md.push_str(&head);
    md.push_str(&rows("auto", "whole-step"));
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol;
    use serde_json::json;

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
                "auto" => mode == Mode::Auto,
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
        assert_eq!(knobs("regional"), knobs("auto"));
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
                                    "hi": 1.6, "worst": 0.5, "verdict": "ahead"},
                                   {"a": "regional", "b": "auto", "mean": 1.0, "lo": 0.4,
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
        // The automatic choice against regional: the stored pair read backwards.
        assert!(
            table.contains("| tinyflux-l | 256 | -1.00 [-1.60, -0.40], worst -0.50: behind |"),
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
