//! `flashdiff bench --study curve`: every way to save work on the same engine and workers,
//! under the verdict protocol ([`crate::protocol`], run by [`crate::study`]): each method's
//! setting per target work level chosen on validation prompts, judged once on test prompts,
//! every pair of methods compared prompt by prompt.
//!
//! Every method gets [`CANDIDATES`] settings drawn from the same knob kinds where they apply:
//! the change threshold (ε for the patch methods, the threshold for the whole-step ones; the
//! same values), the skip cap K (a computed step at least every K + 1: FORA's and
//! TaylorSeer's interval, cache-dit's `max_continuous_cached_steps`) and the forecast order
//! (1 or 2; the authors' stale reuse is a method of its own where they run it so). RAS's knob
//! is its sample ratio; fewer steps' the step count. The model's warm-up is every method's.
//!
//! "regional" is FlashDiff: a computed step runs only the patches whose own change reached
//! their budget. The engine's default rule computes whole steps; it is a whole-step method
//! here ("default-rule").

use anyhow::Error;
use std::path::Path;

use crate::study::{self, Candidate, Method};
use crate::BenchConfig;
use flashdiff_runtime::engine::{
    Engine, EngineError, LayoutKind, Mode, RequestConfig, Reuse, DBCACHE_FRONT_BLOCKS,
};

/// Candidate settings per method.
pub const CANDIDATES: usize = 32;

/// The change thresholds the forecasting methods try (ε, or the whole-step methods'
/// threshold; the same values).
const THRESHOLDS: [f32; 4] = [0.05, 0.1, 0.2, 0.4];

/// The thresholds the stale methods try: twice as many, as they have no forecast order.
const STALE_THRESHOLDS: [f32; 8] = [0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4];

/// The skip caps K: at 50 steps after a warm-up of 5, K 16 lets whole steps reach work 0.2
/// (10 computed steps), K 2 keeps them near 0.4.
const SKIP_CAPS: [u32; 4] = [2, 4, 8, 16];

/// RAS's sample ratios with a forecaster (each at orders 1 and 2): the share of regions
/// recomputed each step between its dense steps.
const RAS_RATIOS: [f32; 16] = [
    0.02, 0.04, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.75,
];

/// Every method the study knows: name and what it is.
pub const METHODS: [Method; 11] = [
    (
        "regional",
        "FlashDiff regional: saliency patches; a computed step runs only the patches whose own accumulated change of block 0's input reached ε (or that skipped K steps), the others advance on forecast velocity and K/V; knobs ε, K, order",
    ),
    (
        "default-rule",
        "whole-step: the engine's default rule (--mode flashdiff): a step is computed whole once the latent's accumulated change (its patches' changes weighted by their share) reaches ε, one patch's 2ε, or a patch skipped K steps, else every token is forecast; knobs ε, K, order",
    ),
    (
        "whole-step",
        "whole-step caching with a forecaster (TeaCache's signal, TaylorSeer's forecast): every token is computed once the latent's accumulated change of block 0's input reaches the threshold (or K steps were skipped), else every token advances on its forecast velocity; knobs threshold, K, order",
    ),
    (
        "whole-step-stale",
        "whole-step caching as TeaCache's authors run it: skipped steps reuse the last velocity; knobs threshold, K",
    ),
    (
        "dbcache",
        "cache-dit's DBCache F1B0 with its TaylorSeer calibrator: the first block runs every step; when its residual's relative L1 change since the last computed step is under the threshold (and fewer than K steps in a row were cached) the other blocks' residual is forecast; a cached step costs the first block; knobs threshold, K, order",
    ),
    (
        "dbcache-stale",
        "DBCache F1B0 without a calibrator: a cached step reuses the other blocks' last residual; knobs threshold, K",
    ),
    (
        "ras",
        "RAS with a forecaster: each step recomputes the share of 2x2 regions with the highest output spread (times its starvation term), dense steps at 45% and 80% and the last; the others advance on forecast velocity and K/V; knobs sample ratio, order",
    ),
    (
        "ras-stale",
        "RAS as its authors run it: the regions left out reuse their last velocity and K/V; knob sample ratio",
    ),
    (
        "uniform-grid",
        "ablation: regional on a uniform grid of patches instead of the saliency cut",
    ),
    (
        "random-patches",
        "ablation: regional's number of patches per step, drawn at random",
    ),
    ("fewer-steps", "full computation with fewer steps; knob: steps"),
];

/// The methods the study runs on a model: DBCache only where the model has blocks beyond the
/// first.
pub fn methods(depth: usize) -> Vec<Method> {
    METHODS
        .iter()
        .copied()
        .filter(|(m, _)| depth > DBCACHE_FRONT_BLOCKS || !m.starts_with("dbcache"))
        .collect()
}

/// `methods`' candidates, [`CANDIDATES`] each, in their order.
pub fn candidates(base: &RequestConfig, methods: &[Method]) -> Vec<Candidate> {
    let plain = RequestConfig {
        budget: None,
        ..base.clone()
    };
    let mut v = Vec::new();
    for &(method, _) in methods {
        let (mode, layout) = match method {
            "regional" => (Mode::PerPatch, base.layout),
            "default-rule" => (Mode::FlashDiff, base.layout),
            "whole-step" | "whole-step-stale" => (Mode::TeaCache, base.layout),
            "dbcache" | "dbcache-stale" => (Mode::DbCache, base.layout),
            "ras" | "ras-stale" => (Mode::Ras, base.layout),
            "uniform-grid" => (Mode::PerPatch, LayoutKind::Uniform),
            "random-patches" => (Mode::RandomPatches, base.layout),
            _ => {
                v.extend(study::fewer_steps_candidates(&plain, CANDIDATES));
                continue;
            }
        };
        let knob = if mode == Mode::TeaCache || mode == Mode::DbCache {
            "threshold"
        } else {
            "ε"
        };
        let at = |t: f32, k: u32, reuse: Reuse| RequestConfig {
            mode,
            layout,
            epsilon: t,
            cache_threshold: t,
            max_skip: k,
            reuse,
            ..plain.clone()
        };
        if mode == Mode::Ras {
            let grid: Vec<(f32, Reuse, String)> = if method == "ras-stale" {
                (0..CANDIDATES)
                    .map(|i| {
                        let q = 0.02 + 0.73 * i as f32 / (CANDIDATES - 1) as f32;
                        let q = (q * 1000.0).round() / 1000.0;
                        (q, Reuse::Stale, String::new())
                    })
                    .collect()
            } else {
                [1u8, 2]
                    .iter()
                    .flat_map(|&o| {
                        RAS_RATIOS
                            .iter()
                            .map(move |&q| (q, base.reuse.at_order(o), format!(" order {o}")))
                    })
                    .collect()
            };
            for (q, reuse, order) in grid {
                v.push(Candidate {
                    method,
                    label: format!("share {q}{order}"),
                    cfg: RequestConfig {
                        ras_ratio: q,
                        ..at(0.0, base.max_skip, reuse)
                    },
                });
            }
        } else if method.ends_with("-stale") {
            for &k in &SKIP_CAPS {
                for &t in &STALE_THRESHOLDS {
                    v.push(Candidate {
                        method,
                        label: format!("{knob} {t} K {k} stale"),
                        cfg: at(t, k, Reuse::Stale),
                    });
                }
            }
        } else {
            for order in [1u8, 2] {
                for &k in &SKIP_CAPS {
                    for &t in &THRESHOLDS {
                        v.push(Candidate {
                            method,
                            label: format!("{knob} {t} K {k} order {order}"),
                            cfg: at(t, k, base.reuse.at_order(order)),
                        });
                    }
                }
            }
        }
    }
    v
}

/// Runs the study on `engine`'s model (`only`: those methods alone, by name): `validation`
/// prompts choose, `cfg.prompts` test prompts after them judge; writes `curve.json`,
/// `report.md` and `quality_vs_work.svg` (and `.png`) into `out`; returns the report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    only: Option<&[String]>,
    validation: u32,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let mut list = methods(engine.model().depth());
    if let Some(only) = only {
        if let Some(bad) = only.iter().find(|m| !list.iter().any(|(n, _)| n == m)) {
            let names: Vec<&str> = list.iter().map(|(n, _)| *n).collect();
            return Err(EngineError::Invalid {
                field: "methods",
                reason: format!("{bad:?}: the study runs {}", names.join(", ")),
            }
            .into());
        }
        list.retain(|(n, _)| only.iter().any(|o| o == n));
    }
    let base = RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    };
    let settings = candidates(&base, &list);
    let doc = study::run(
        engine,
        cfg,
        "curve",
        &list,
        &settings,
        (validation, Some(out)),
        progress,
    )?;
    study::write(out, "curve.json", &doc).map_err(Error::msg)
}

/// Reads a study's `curve.json` in `dir` again and writes its `report.md` and pictures as
/// this version writes them; returns the report. The error names what is wrong with the file.
pub fn reread(dir: &Path) -> Result<String, String> {
    let path = dir.join("curve.json");
    let doc = study::read(&path)?;
    if !doc["methods"].is_array() {
        return Err(format!("{}: no methods", path.display()));
    }
    study::write(dir, "curve.json", &doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol;

    fn base() -> RequestConfig {
        RequestConfig {
            steps: 50,
            warmup: 5,
            patches: Some(16),
            reuse: Reuse::Extrapolate,
            budget: Some(0.3),
            ..RequestConfig::default()
        }
    }

    #[test]
    fn every_method_gets_the_same_tries_and_its_rows_hold_only_its_own_settings() {
        let all = methods(6);
        assert_eq!(all.len(), METHODS.len());
        let list = candidates(&base(), &all);
        let counts: Vec<(&str, usize)> = all
            .iter()
            .map(|(m, _)| (*m, list.iter().filter(|c| c.method == *m).count()))
            .collect();
        assert_eq!(protocol::equal_tries(&counts), Ok(CANDIDATES), "{counts:?}");
        for c in &list {
            let (mode, layout, stale) = (c.cfg.mode, c.cfg.layout, c.cfg.reuse == Reuse::Stale);
            let own = match c.method {
                "regional" => mode == Mode::PerPatch && layout != LayoutKind::Uniform && !stale,
                "default-rule" => mode == Mode::FlashDiff && !stale,
                "whole-step" => mode == Mode::TeaCache && !stale,
                "whole-step-stale" => mode == Mode::TeaCache && stale,
                "dbcache" => mode == Mode::DbCache && !stale,
                "dbcache-stale" => mode == Mode::DbCache && stale,
                "ras" => mode == Mode::Ras && !stale,
                "ras-stale" => mode == Mode::Ras && stale,
                "uniform-grid" => mode == Mode::PerPatch && layout == LayoutKind::Uniform,
                "random-patches" => mode == Mode::RandomPatches,
                "fewer-steps" => mode == Mode::Full && c.cfg.steps < 50,
                _ => false,
            };
            assert!(own, "{} holds {:?}", c.method, c.label);
            assert!(c.cfg.budget.is_none(), "{} {}", c.method, c.label);
        }
        // Within a method no setting twice.
        for (m, _) in &all {
            let mut labels: Vec<&str> = list
                .iter()
                .filter(|c| c.method == *m)
                .map(|c| c.label.as_str())
                .collect();
            labels.sort_unstable();
            let n = labels.len();
            labels.dedup();
            assert_eq!(labels.len(), n, "{m} repeats a setting");
        }
    }

    #[test]
    fn the_patch_and_whole_step_methods_try_the_same_knob_values() {
        let all = methods(6);
        let list = candidates(&base(), &all);
        let knobs = |m: &str| -> Vec<(u32, u32, u8)> {
            list.iter()
                .filter(|c| c.method == m)
                .map(|c| {
                    let t = if matches!(c.cfg.mode, Mode::TeaCache | Mode::DbCache) {
                        c.cfg.cache_threshold
                    } else {
                        c.cfg.epsilon
                    };
                    (t.to_bits(), c.cfg.max_skip, c.cfg.reuse.order())
                })
                .collect()
        };
        for m in ["default-rule", "whole-step", "dbcache", "uniform-grid"] {
            assert_eq!(knobs("regional"), knobs(m), "{m}");
        }
        assert_eq!(knobs("whole-step-stale"), knobs("dbcache-stale"));
    }

    #[test]
    fn a_one_block_model_runs_no_dbcache() {
        let names: Vec<&str> = methods(DBCACHE_FRONT_BLOCKS)
            .iter()
            .map(|(m, _)| *m)
            .collect();
        assert!(!names.iter().any(|m| m.starts_with("dbcache")), "{names:?}");
        assert!(names.contains(&"regional") && names.contains(&"whole-step"));
    }
}
