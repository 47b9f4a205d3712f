//! Independent checker for gate decisions. It keeps its own history (in f64) from the
//! importances it is shown and re-derives what every decision was allowed to be.

use crate::GateConfig;

/// Shadows one gate: call [`check`](GateChecker::check) after every decision with the
/// decision and weights, then [`observed`](GateChecker::observed) for every importance fed.
#[derive(Debug, Clone)]
pub struct GateChecker {
    cfg: GateConfig,
    last: Vec<Option<f64>>,
    delta: Vec<Option<f64>>,
    run: Vec<u32>,
    active: Vec<bool>,
}

impl GateChecker {
    /// A checker for a fresh gate of `patches` patches.
    pub fn new(patches: usize, cfg: GateConfig) -> Self {
        Self {
            cfg,
            last: vec![None; patches],
            delta: vec![None; patches],
            run: vec![0; patches],
            active: vec![false; patches],
        }
    }

    /// ε changed (load-adaptive hook).
    pub fn set_epsilon(&mut self, epsilon: f32) {
        self.cfg.epsilon = epsilon;
    }

    /// Checks one decision against the rules; `weights` are the gate's reported weights.
    pub fn check(&mut self, active: &[bool], weights: &[f32]) -> Result<(), String> {
        let r = self.run.len();
        if active.len() != r || weights.len() != r {
            return Err(format!(
                "decision for {} patches, expected {r}",
                active.len()
            ));
        }
        if !active.iter().any(|&a| a) {
            return Err("no patch active".into());
        }
        let eta = self.cfg.eta as f64;
        let total: f64 = self.delta.iter().map(|d| d.unwrap_or(0.0) + eta).sum();
        let mine: Vec<f64> = self
            .delta
            .iter()
            .map(|d| {
                if total > 0.0 {
                    (d.unwrap_or(0.0) + eta) / total
                } else {
                    1.0 / r as f64
                }
            })
            .collect();
        let sum: f64 = weights.iter().map(|&w| w as f64).sum();
        if weights.iter().any(|w| !w.is_finite()) || (sum - 1.0).abs() > 1e-4 {
            return Err(format!("weights not finite or sum {sum} != 1"));
        }
        let eps = self.cfg.epsilon as f64;
        let tol = 1e-5;
        let under: Vec<bool> = (0..r)
            .map(|i| self.delta[i].is_some() && mine[i] < eps - tol)
            .collect();
        let all_under =
            (0..r).all(|i| under[i] || (self.delta[i].is_some() && mine[i] < eps + tol));
        let mut kept = 0;
        for i in 0..r {
            if (weights[i] as f64 - mine[i]).abs() > 1e-4 {
                return Err(format!(
                    "patch {i}: weight {} but re-derived {}",
                    weights[i], mine[i]
                ));
            }
            let forced = self.run[i] >= self.cfg.max_skip;
            if !active[i] {
                if self.cfg.epsilon == 0.0 {
                    return Err(format!("patch {i} skipped with epsilon 0"));
                }
                if self.delta[i].is_none() {
                    return Err(format!("patch {i} skipped before it had a change history"));
                }
                if forced {
                    return Err(format!(
                        "patch {i} skipped {} steps in a row, K = {}",
                        self.run[i] + 1,
                        self.cfg.max_skip
                    ));
                }
                if mine[i] >= eps + tol {
                    return Err(format!(
                        "patch {i} skipped with weight {} >= epsilon {eps}",
                        mine[i]
                    ));
                }
            } else if under[i] && !forced {
                kept += 1;
            }
        }
        if kept > 0 && !(kept == 1 && all_under) {
            return Err(format!(
                "{kept} patches ran with weight under epsilon and no reason"
            ));
        }
        for i in 0..r {
            self.run[i] = if active[i] { 0 } else { self.run[i] + 1 };
        }
        self.active.copy_from_slice(active);
        Ok(())
    }

    /// Records an importance fed to the gate for a patch that ran.
    pub fn observed(&mut self, patch: usize, importance: f32) {
        let v = importance as f64;
        if let Some(prev) = self.last[patch] {
            self.delta[patch] = Some((v - prev).abs());
        }
        self.last[patch] = Some(v);
    }
}

/// Shadows one [`Budget`](crate::budget::Budget): call
/// [`observed`](BudgetChecker::observed) with every change reported and
/// [`check`](BudgetChecker::check) with every decision (or, for a choice other than the
/// decision, [`ran`](BudgetChecker::ran)). It accumulates in f64 and tolerates disagreement
/// only within 1e-4 (relative) of a bar, where f32 rounding may fall either way.
#[derive(Debug, Clone)]
pub struct BudgetChecker {
    cfg: crate::budget::BudgetConfig,
    acc: Vec<Option<f64>>,
    whole: Option<f64>,
    run: Vec<u32>,
}

impl BudgetChecker {
    /// A checker for a fresh budget of `patches` patches.
    pub fn new(patches: usize, cfg: crate::budget::BudgetConfig) -> Self {
        Self {
            cfg,
            acc: vec![None; patches],
            whole: None,
            run: vec![0; patches],
        }
    }

    /// ε changed (load-adaptive hook).
    pub fn set_epsilon(&mut self, epsilon: f32) {
        self.cfg.epsilon = epsilon;
    }

    /// A step's change per patch was reported (and accepted), every patch weighing the same.
    pub fn observed(&mut self, change: &[f32]) {
        self.observed_weighted(change, &vec![1.0; change.len()]);
    }

    /// A step's change per patch was reported (and accepted) with each patch's share of the
    /// signal; the latent's change is their weighted mean (uniform when the signal sums to 0).
    pub fn observed_weighted(&mut self, change: &[f32], signal: &[f32]) {
        for (a, &c) in self.acc.iter_mut().zip(change) {
            if let Some(a) = a {
                *a += c as f64;
            }
        }
        let total: f64 = signal.iter().map(|&w| w as f64).sum();
        let step = if total > 0.0 {
            change
                .iter()
                .zip(signal)
                .map(|(&c, &w)| c as f64 * w as f64)
                .sum::<f64>()
                / total
        } else {
            change.iter().map(|&c| c as f64).sum::<f64>() / change.len().max(1) as f64
        };
        if let Some(w) = &mut self.whole {
            *w += step;
        }
    }

    /// Checks one decision of the budget, then records it as run.
    pub fn check(&mut self, active: &[bool]) -> Result<(), String> {
        let n = self.run.len();
        if active.len() != n {
            return Err(format!(
                "decision for {} patches, expected {n}",
                active.len()
            ));
        }
        let eps = self.cfg.epsilon as f64;
        let near = |a: f64, bar: f64| (a - bar).abs() <= 1e-4 * bar.abs().max(1e-6);
        // Each patch: due at the bar `bar`, with `None` where rounding may go either way.
        let due = |p: usize, bar: f64| -> Option<bool> {
            if self.run[p] >= self.cfg.max_skip {
                return Some(true);
            }
            match self.acc[p] {
                None => Some(true),
                Some(a) if near(a, bar) => None,
                Some(a) => Some(a >= bar),
            }
        };
        // The step: computed at the K bound, or when the level (the latent's accumulated
        // change, or the largest patch's over LONE_PATCH) reaches ε; a patch yet to report,
        // or no computed step yet, makes it infinite.
        let forced = self.run.iter().any(|&r| r >= self.cfg.max_skip);
        let level = match (self.whole, self.acc.iter().any(Option::is_none)) {
            (Some(whole), false) => {
                let most = self.acc.iter().fold(0.0f64, |m, a| m.max(a.unwrap_or(0.0)));
                whole.max(most / crate::budget::LONE_PATCH as f64)
            }
            _ => f64::INFINITY,
        };
        let want = if forced || (n > 0 && level.is_infinite()) {
            Some(true)
        } else if n == 0 || near(level, eps) {
            None
        } else {
            Some(level >= eps)
        };
        let computed = active.iter().any(|&a| a);
        if want == Some(false) && computed {
            return Err(format!(
                "a patch ran although the level {level} is under ε {eps} and no patch is at the K bound"
            ));
        }
        if want == Some(true) && !computed {
            return Err(format!(
                "no patch ran although the level {level} reached ε {eps} or a patch the K bound"
            ));
        }
        if computed {
            let bar = self.cfg.share as f64 * eps;
            let dues: Vec<Option<bool>> = (0..n).map(|p| due(p, bar)).collect();
            // No patch due: the step runs whole; a patch near its bar may go either way.
            let whole = !dues.contains(&Some(true));
            if whole && !dues.contains(&None) && active.contains(&false) {
                return Err(format!(
                    "the step is computed and no patch reached {bar}, yet not every patch ran"
                ));
            }
            for (p, &on) in active.iter().enumerate() {
                if !whole && dues[p].is_some_and(|d| d != on) {
                    return Err(format!(
                        "patch {p}: {} with accumulated change {:?} against {bar} (skipped {} in a row)",
                        if on { "ran" } else { "skipped" },
                        self.acc[p],
                        self.run[p]
                    ));
                }
            }
        }
        self.ran(active);
        Ok(())
    }

    /// Records which patches ran (a choice other than the budget's own).
    pub fn ran(&mut self, active: &[bool]) {
        for ((a, run), &on) in self.acc.iter_mut().zip(&mut self.run).zip(active) {
            if on {
                *a = Some(0.0);
                *run = 0;
            } else {
                *run = run.saturating_add(1);
            }
        }
        if active.contains(&true) {
            self.whole = Some(0.0);
        }
    }
}

/// Shadows one [`Pace`](crate::pace::Pace): call [`check`](PaceChecker::check) with every
/// step's inputs and whether it was computed, then [`finish`](PaceChecker::finish). It
/// keeps its own count of steps and computations and recomputes the bar in f64, tolerating
/// disagreement only within 1e-4 (relative) of it.
#[derive(Debug, Clone)]
pub struct PaceChecker {
    steps: u32,
    computes: u32,
    decided: u32,
    computed: u32,
    since: u32,
}

impl PaceChecker {
    /// A checker for a pace of `steps` steps with `computes` computations allowed.
    pub fn new(steps: u32, computes: u32) -> Self {
        Self {
            steps,
            computes,
            decided: 0,
            computed: 0,
            since: 0,
        }
    }

    /// Checks one step's decision and records it.
    pub fn check(&mut self, accumulated: f32, rate: f32, computed: bool) -> Result<(), String> {
        if self.decided >= self.steps {
            return Err(format!("a decision after the {} steps", self.steps));
        }
        let steps_left = (self.steps - self.decided) as f64;
        let computes_left = (self.computes - self.computed) as f64;
        let clean = |v: f32| if v.is_nan() || v < 0.0 { 0.0 } else { v as f64 };
        let (acc, rate) = (clean(accumulated), clean(rate));
        // An equal share of the span from the last computed step to the final one.
        let span = self.since as f64 + steps_left + 1.0;
        let bar = rate * span / (computes_left + 1.0);
        let want = if computes_left == 0.0 {
            Some(false)
        } else if computes_left >= steps_left {
            Some(true)
        } else if (acc - bar).abs() <= 1e-4 * bar.abs().max(1e-6) {
            None
        } else {
            Some(acc >= bar)
        };
        if want.is_some_and(|w| w != computed) {
            return Err(format!(
                "step {}: {} with accumulated change {acc} against the bar {bar} \
                 ({computes_left} computations for {steps_left} steps left)",
                self.decided,
                if computed { "computed" } else { "skipped" }
            ));
        }
        self.decided += 1;
        self.computed += computed as u32;
        self.since = if computed { 0 } else { self.since + 1 };
        Ok(())
    }

    /// After the last step: the run computed exactly its allowance.
    pub fn finish(&self) -> Result<(), String> {
        if self.decided != self.steps {
            return Err(format!("{} of {} steps decided", self.decided, self.steps));
        }
        if self.computed != self.computes.min(self.steps) {
            return Err(format!(
                "{} steps computed, the work target allows {}",
                self.computed, self.computes
            ));
        }
        Ok(())
    }
}

/// Checks an automatic choice ([`crate::choice`]) by recomputing the patches' dispersion
/// from their changes and signal (unweighted where the signal sums to 0, as a two-pass
/// variance in f64): `reported` must be it within rounding, and `chosen` regional exactly when
/// it is at or above `threshold` (either where it lies within rounding of the threshold).
pub fn check_choice(
    change: &[f32],
    signal: &[f32],
    threshold: f32,
    reported: f32,
    chosen: crate::choice::Execution,
) -> Result<(), String> {
    use crate::choice::Execution;
    let n = change.len();
    if signal.len() != n {
        return Err(format!("{n} changes and {} signal values", signal.len()));
    }
    let total: f64 = signal.iter().map(|&s| s as f64).sum();
    let d = if total > 0.0 && n > 0 {
        let mean = change
            .iter()
            .zip(signal)
            .map(|(&c, &s)| c as f64 * s as f64)
            .sum::<f64>()
            / total;
        let spread = change
            .iter()
            .zip(signal)
            .map(|(&c, &s)| s as f64 * (c as f64 - mean) * (c as f64 - mean))
            .sum::<f64>()
            / total;
        if mean > 0.0 {
            spread.sqrt() / mean
        } else {
            0.0
        }
    } else {
        0.0
    };
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs().max(1e-3);
    if !near(reported as f64, d) {
        return Err(format!("dispersion {reported} reported, {d} recomputed"));
    }
    let t = threshold as f64;
    if near(d, t) {
        return Ok(());
    }
    let want = if d >= t {
        Execution::Regional
    } else {
        Execution::WholeStep
    };
    if chosen != want {
        return Err(format!(
            "dispersion {d} against threshold {t}: {want} expected, {chosen} chosen"
        ));
    }
    Ok(())
}
