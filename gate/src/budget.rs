//! Change budgets: the rule FlashDiff's engine decides patches with.
//!
//! Each step, every patch reports its *change*: the relative L1 change of a cheap signal over
//! its tokens since the previous step (the engine uses block 0's modulated input, the signal
//! whole-step caches read), with its share of that signal (the L1 norm over its tokens). A
//! patch accumulates its change while it is skipped. A step is computed when the latent's
//! accumulated change reaches the budget ε: each step adds the patches' changes weighted by
//! their share of the signal (the whole latent's relative change), or, for a change confined
//! to one patch, which that weighting dilutes, once one patch alone has accumulated
//! [`LONE_PATCH`] x ε (see [`level`]). In a computed step a patch runs when its accumulated
//! change reaches `share * ε` (share 0: every patch runs, so a step is computed whole or
//! forecast whole; share 1: the patches at their own budget). When the level is under ε, no
//! patch runs and the step is forecast for every token. A patch skipped K steps in a row
//! runs, and a patch that has not reported a change since the budget began runs, so the
//! first decision computes everything.
//!
//! A memoryless rule (the paper's gate) compares this step's change with the others'; a
//! budget compares what has accumulated since the last computation with what may, so a
//! slowly drifting latent is still refreshed and a step in which nothing moves costs nothing.
//! Weighted by the signal, a quiet patch (small values, large relative change) counts for
//! its share of the latent and no more; with share 0 and K past the steps, the rule decides
//! exactly as whole-step caching's accumulated change does, so FlashDiff contains it.
//!
//! ```
//! use flashdiff_gate::budget::{Budget, BudgetConfig};
//!
//! let mut b = Budget::new(2, BudgetConfig { epsilon: 0.25, share: 1.0, max_skip: 100 })?;
//! let mut active = [false; 2];
//! b.decide(&mut active);
//! assert_eq!(active, [true, true]); // nothing reported yet: everything runs
//! b.ran(&active)?;
//! for _ in 0..2 {
//!     // patch 0 moves and carries three quarters of the signal, patch 1 barely moves
//!     b.observe_weighted(&[0.2, 0.01], &[3.0, 1.0])?;
//!     b.decide(&mut active);
//!     b.ran(&active)?;
//! }
//! // After two steps the level is 2 x (0.75 x 0.2 + 0.25 x 0.01) = 0.305 >= 0.25: the step is
//! // computed, and patch 0 (0.4) is at its budget while patch 1 (0.02) is not.
//! assert_eq!(active, [true, false]);
//! # Ok::<(), flashdiff_gate::GateError>(())
//! ```

use crate::{check_epsilon, GateError, MAX_PATCHES};

/// How many times ε one patch's accumulated change may reach before it computes the step on
/// its own (see [`level`]).
pub const LONE_PATCH: f32 = 2.0;

/// One step's level from per-patch values (changes, each >= 0) and each patch's share of the
/// signal (>= 0; uniform when `signal` is empty, of another length, or sums to 0 or to a
/// non-finite value): the signal-weighted mean of the values, or the largest over
/// [`LONE_PATCH`], whichever is higher; 0 for no values, infinite when any value is; a NaN or
/// negative value (or weight) counts as 0. [`Budget::level`] is the sum of the weighted means
/// since the last computed step, against the same lone-patch bar.
pub fn level(values: &[f32], signal: &[f32]) -> f32 {
    let clean = |v: f32| if v.is_nan() || v < 0.0 { 0.0 } else { v };
    let most = values.iter().fold(0.0f32, |m, &v| m.max(clean(v)));
    if values.is_empty() || most.is_infinite() {
        return most;
    }
    weighted_mean(values, signal).max(most / LONE_PATCH)
}

/// The signal-weighted mean of `values` (the rules of [`level`]).
fn weighted_mean(values: &[f32], signal: &[f32]) -> f32 {
    let clean = |v: f32| if v.is_nan() || v < 0.0 { 0.0 } else { v as f64 };
    let total: f64 = signal.iter().map(|&w| clean(w)).sum();
    let uniform = signal.len() != values.len() || !(total > 0.0 && total.is_finite());
    let sum: f64 = values
        .iter()
        .enumerate()
        .map(|(p, &v)| {
            let w = if uniform { 1.0 } else { clean(signal[p]) };
            w * clean(v)
        })
        .sum();
    let total = if uniform { values.len() as f64 } else { total };
    if total > 0.0 {
        (sum / total) as f32
    } else {
        0.0
    }
}

/// Budget settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// ε in `[0, 1]`: the accumulated relative change that makes a step computed. 0 computes
    /// every step.
    pub epsilon: f32,
    /// In `[0, 1]`: in a computed step, a patch runs once its accumulated change reaches
    /// `share * epsilon`.
    pub share: f32,
    /// K: a patch is never skipped more than K steps in a row.
    pub max_skip: u32,
}

/// A budget's whole state, to persist a request between processes.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetState {
    /// Settings.
    pub cfg: BudgetConfig,
    /// Accumulated change per patch since it last ran (infinite before its first report).
    pub accumulated: Vec<f32>,
    /// Steps skipped in a row per patch.
    pub skipped_run: Vec<u32>,
    /// The latent's accumulated change since the last computed step: the sum of each step's
    /// signal-weighted mean change (infinite before the first report).
    pub whole: f32,
}

/// Per-request budget state for R patches.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    st: BudgetState,
}

fn check_share(s: f32) -> Result<(), GateError> {
    if s.is_finite() && (0.0..=1.0).contains(&s) {
        Ok(())
    } else {
        Err(GateError::BadShare(s))
    }
}

impl Budget {
    /// A budget for `patches` patches; every patch runs at the first decision.
    pub fn new(patches: usize, cfg: BudgetConfig) -> Result<Self, GateError> {
        Self::from_state(BudgetState {
            cfg,
            accumulated: vec![f32::INFINITY; patches],
            skipped_run: vec![0; patches],
            whole: f32::INFINITY,
        })
    }

    /// Restores a budget from [`Budget::state`], checking every field.
    pub fn from_state(st: BudgetState) -> Result<Self, GateError> {
        let n = st.accumulated.len();
        if n == 0 {
            return Err(GateError::NoPatches);
        }
        if n > MAX_PATCHES {
            return Err(GateError::TooManyPatches(n));
        }
        check_epsilon(st.cfg.epsilon)?;
        check_share(st.cfg.share)?;
        if st.skipped_run.len() != n {
            return Err(GateError::BadBuffer {
                expected: n,
                got: st.skipped_run.len(),
            });
        }
        if let Some((patch, &value)) = st
            .accumulated
            .iter()
            .enumerate()
            .find(|(_, a)| a.is_nan() || **a < 0.0)
        {
            return Err(GateError::BadChange { patch, value });
        }
        if st.whole.is_nan() || st.whole < 0.0 {
            return Err(GateError::BadWhole(st.whole));
        }
        Ok(Self { st })
    }

    /// The whole state, for [`Budget::from_state`].
    pub fn state(&self) -> &BudgetState {
        &self.st
    }

    /// Patches.
    pub fn patches(&self) -> usize {
        self.st.accumulated.len()
    }

    /// Settings.
    pub fn config(&self) -> BudgetConfig {
        self.st.cfg
    }

    /// Sets ε (the load-adaptive hook).
    pub fn set_epsilon(&mut self, epsilon: f32) -> Result<(), GateError> {
        check_epsilon(epsilon)?;
        self.st.cfg.epsilon = epsilon;
        Ok(())
    }

    /// Accumulated change per patch since it last ran.
    pub fn accumulated(&self) -> &[f32] {
        &self.st.accumulated
    }

    /// Adds one step's change per patch (each finite and >= 0), every patch weighing the
    /// same. Nothing is added when any value is refused.
    pub fn observe(&mut self, change: &[f32]) -> Result<(), GateError> {
        self.observe_weighted(change, &[])
    }

    /// Adds one step's change per patch (each finite and >= 0) with each patch's share of the
    /// signal (one finite value >= 0 per patch; empty: every patch weighs the same). Nothing
    /// is added when any value is refused.
    pub fn observe_weighted(&mut self, change: &[f32], signal: &[f32]) -> Result<(), GateError> {
        let n = self.patches();
        for got in [
            change.len(),
            if signal.is_empty() { n } else { signal.len() },
        ] {
            if got != n {
                return Err(GateError::BadBuffer { expected: n, got });
            }
        }
        let bad = |(_, c): &(usize, &f32)| !c.is_finite() || **c < 0.0;
        if let Some((patch, &value)) = change.iter().enumerate().find(bad) {
            return Err(GateError::BadChange { patch, value });
        }
        if let Some((patch, &value)) = signal.iter().enumerate().find(bad) {
            return Err(GateError::BadSignal { patch, value });
        }
        for (a, &c) in self.st.accumulated.iter_mut().zip(change) {
            *a += c;
        }
        self.st.whole += weighted_mean(change, signal);
        Ok(())
    }

    /// The level the step is decided on: the latent's accumulated change since the last
    /// computed step, or the largest patch's accumulated change over [`LONE_PATCH`],
    /// whichever is higher (see [`level`]); the step is computed when it reaches ε.
    pub fn level(&self) -> f32 {
        let most = self.st.accumulated.iter().fold(0.0f32, |m, &a| m.max(a));
        self.st.whole.max(most / LONE_PATCH)
    }

    /// Decides the step into `active` (one entry per patch; extra entries are left alone,
    /// missing ones are not decided): no patch when the [`Budget::level`] is under ε and no
    /// patch is at the K bound, otherwise every patch at or over `share * ε` or at the K
    /// bound, or every patch when none is. Returns whether the step is computed. The state
    /// changes only in [`Budget::ran`].
    pub fn decide(&self, active: &mut [bool]) -> bool {
        let cfg = self.st.cfg;
        let due = |a: f32, run: u32, bar: f32| a >= bar || run >= cfg.max_skip;
        let computed = self.level() >= cfg.epsilon
            || self.st.skipped_run.iter().any(|&run| run >= cfg.max_skip);
        let mut any = false;
        for ((o, &a), &run) in active
            .iter_mut()
            .zip(&self.st.accumulated)
            .zip(&self.st.skipped_run)
        {
            *o = computed && due(a, run, cfg.share * cfg.epsilon);
            any |= *o;
        }
        if computed && !any {
            // The latent's change reached ε spread over patches none of which reached its
            // share: the step runs whole.
            for o in active.iter_mut().take(self.patches()) {
                *o = true;
            }
        }
        computed
    }

    /// Records which patches ran this step (the decision, or another choice of the same
    /// size): their accumulated change restarts at 0, the others' skip runs grow; when any
    /// ran, the latent's accumulated change restarts at 0.
    pub fn ran(&mut self, active: &[bool]) -> Result<(), GateError> {
        let n = self.patches();
        if active.len() != n {
            return Err(GateError::BadBuffer {
                expected: n,
                got: active.len(),
            });
        }
        for ((a, run), &on) in self
            .st
            .accumulated
            .iter_mut()
            .zip(&mut self.st.skipped_run)
            .zip(active)
        {
            if on {
                *a = 0.0;
                *run = 0;
            } else {
                *run = run.saturating_add(1);
            }
        }
        if active.contains(&true) {
            self.st.whole = 0.0;
        }
        Ok(())
    }
}

/// One step's change per patch ([`relative_change`]) and each patch's share of the signal
/// (the L1 norm of the earlier snapshot over its tokens), for [`Budget::observe_weighted`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepChange {
    /// Relative L1 change per patch.
    pub change: Vec<f32>,
    /// `sum |before|` per patch.
    pub signal: Vec<f32>,
}

/// Each patch's relative L1 change between two snapshots of a per-token signal (`width`
/// values per token, tokens in the same order as `patch_of`): `sum |now - before| / sum
/// |before|` over the patch's tokens (0 when both are 0, the change itself over 1e-12
/// otherwise).
pub fn relative_change(
    now: &[f32],
    before: &[f32],
    width: usize,
    patch_of: &[u32],
    patches: usize,
) -> Result<Vec<f32>, GateError> {
    Ok(step_change(now, before, width, patch_of, patches)?.change)
}

/// [`relative_change`] with each patch's signal, `sum |before|` over its tokens.
pub fn step_change(
    now: &[f32],
    before: &[f32],
    width: usize,
    patch_of: &[u32],
    patches: usize,
) -> Result<StepChange, GateError> {
    let expected = patch_of.len() * width;
    for got in [now.len(), before.len()] {
        if got != expected || width == 0 {
            return Err(GateError::BadBuffer { expected, got });
        }
    }
    let (mut num, mut den) = (vec![0.0f32; patches], vec![0.0f32; patches]);
    for (t, &p) in patch_of.iter().enumerate() {
        let p = p as usize;
        if p >= patches {
            return Err(GateError::BadPatch { patch: p, patches });
        }
        let at = t * width;
        for (a, b) in now[at..at + width].iter().zip(&before[at..at + width]) {
            num[p] += (a - b).abs();
            den[p] += b.abs();
        }
    }
    let change = num
        .iter()
        .zip(&den)
        .map(|(&n, &d)| if n == 0.0 { 0.0 } else { n / d.max(1e-12) })
        .collect();
    Ok(StepChange {
        change,
        signal: den,
    })
}
