//! Change budgets: the rule FlashDiff's engine decides patches with.
//!
//! Each step, every patch reports its *change*: the relative L1 change of a cheap signal over
//! its tokens since the previous step (the engine uses block 0's modulated input, the signal
//! whole-step caches read). A patch accumulates its change while it is skipped. A step is
//! computed when the patches' accumulated changes reach the budget ε together, as their
//! [`level`]: their root mean square, or a [`LONE_PATCH`]-th of the largest (so a change
//! confined to one patch of R, which the root mean square dilutes by sqrt(R), still computes
//! once it reaches `LONE_PATCH * ε`). In a computed step a patch runs when its accumulated
//! change reaches `share * ε` (share 0: every patch runs, so a step is computed whole or
//! forecast whole; share 1: the patches at their own budget). When the level is under ε, no
//! patch runs and the step is forecast for every token. A patch skipped K steps in a row
//! runs, and a patch that has not reported a change since the budget began runs, so the
//! first decision computes everything.
//!
//! A memoryless rule (the paper's gate) compares this step's change with the others'; a
//! budget compares what a patch has accumulated since it last ran with what it may, so a
//! slowly drifting patch is still refreshed and a step in which nothing moves costs nothing.
//! The largest patch alone would decide on whichever patch fluctuates most: on the built-in
//! models, whose patches' changes move together (the largest is 1.10-1.15x their mean), it
//! spends about a tenth more work for the same quality than the level does.
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
//!     b.observe(&[0.2, 0.01])?; // patch 0 moves, patch 1 barely
//!     b.decide(&mut active);
//!     b.ran(&active)?;
//! }
//! // After two steps the level is sqrt((0.4^2 + 0.02^2) / 2) = 0.28 >= 0.25: the step is
//! // computed, and patch 0 (0.4) is at its budget while patch 1 (0.02) is not.
//! assert_eq!(active, [true, false]);
//! # Ok::<(), flashdiff_gate::GateError>(())
//! ```

use crate::{check_epsilon, GateError, MAX_PATCHES};

/// How many times ε one patch's accumulated change may reach before it computes the step on
/// its own (see [`level`]).
pub const LONE_PATCH: f32 = 2.0;

/// The level of per-patch values (accumulated or one-step changes, each >= 0): their root
/// mean square, or the largest over [`LONE_PATCH`], whichever is higher; 0 for no values,
/// infinite when any value is; a NaN or negative value counts as 0. A step is computed when
/// its accumulated level reaches ε.
pub fn level(values: &[f32]) -> f32 {
    if values.is_empty() {
        return 0.0;
    }
    let (mut squares, mut most) = (0.0f64, 0.0f32);
    for &v in values {
        let v = if v.is_nan() || v < 0.0 { 0.0 } else { v };
        squares += v as f64 * v as f64;
        most = most.max(v);
    }
    let rms = (squares / values.len() as f64).sqrt() as f32;
    rms.max(most / LONE_PATCH)
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

    /// Adds one step's change per patch (each finite and >= 0). Nothing is added when any
    /// value is refused.
    pub fn observe(&mut self, change: &[f32]) -> Result<(), GateError> {
        let n = self.patches();
        if change.len() != n {
            return Err(GateError::BadBuffer {
                expected: n,
                got: change.len(),
            });
        }
        if let Some((patch, &value)) = change
            .iter()
            .enumerate()
            .find(|(_, c)| !c.is_finite() || **c < 0.0)
        {
            return Err(GateError::BadChange { patch, value });
        }
        for (a, &c) in self.st.accumulated.iter_mut().zip(change) {
            *a += c;
        }
        Ok(())
    }

    /// The [`level`] of the accumulated changes: the step is computed when it reaches ε.
    pub fn level(&self) -> f32 {
        level(&self.st.accumulated)
    }

    /// Decides the step into `active` (one entry per patch; extra entries are left alone,
    /// missing ones are not decided): no patch when the [`level`] is under ε and no patch is
    /// at the K bound, otherwise every patch at or over `share * ε` or at the K bound (at
    /// least one: the level is at most the largest change). Returns whether the step is
    /// computed. The state changes only in [`Budget::ran`].
    pub fn decide(&self, active: &mut [bool]) -> bool {
        let cfg = self.st.cfg;
        let due = |a: f32, run: u32, bar: f32| a >= bar || run >= cfg.max_skip;
        let computed = self.level() >= cfg.epsilon
            || self.st.skipped_run.iter().any(|&run| run >= cfg.max_skip);
        for ((o, &a), &run) in active
            .iter_mut()
            .zip(&self.st.accumulated)
            .zip(&self.st.skipped_run)
        {
            *o = computed && due(a, run, cfg.share * cfg.epsilon);
        }
        computed
    }

    /// Records which patches ran this step (the decision, or another choice of the same
    /// size): their accumulated change restarts at 0, the others' skip runs grow.
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
        Ok(())
    }
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
    Ok(num
        .iter()
        .zip(&den)
        .map(|(&n, &d)| if n == 0.0 { 0.0 } else { n / d.max(1e-12) })
        .collect())
}
