//! FlashDiff Patch Gate (paper §4.2, Appendix A.1 eq. 5, 8, 9).
//!
//! Decides *when* each patch is refined. It takes, after every step, the refinement importance
//! `R_i` (mean self-attention mass inside patch `i`'s block) of the patches that ran, and
//! returns for the next step which patches run and which advance on their cached velocity.
//!
//! Per patch it keeps `R̄_i` (importance at its last execution) and `Δ_i = |R_i - R̄_i|`,
//! frozen while the patch is skipped. Weights `w_i = (Δ_i + η) / Σ_j (Δ_j + η)`; a patch is
//! skipped when `w_i < ε`, except that
//! - a patch with no `Δ` yet (fewer than two executions since the partition) runs, so the
//!   first two decisions after a partition run everything;
//! - a patch skipped `K` steps in a row runs (forced reactivation, eq. 5: `n - n_i <= K`);
//! - at least one patch runs every step (the largest weight, lowest index on ties).
//!
//! ```
//! use flashdiff_gate::{Gate, GateConfig};
//!
//! let mut gate = Gate::new(4, GateConfig { epsilon: 0.1, eta: 1e-6, max_skip: 3 })?;
//! let mut active = [false; 4];
//! for step in 0..6 {
//!     gate.decide(&mut active)?;
//!     for p in 0..4 {
//!         if active[p] {
//!             // Patch 0 keeps changing; the others have converged.
//!             let r = if p == 0 { 0.5 + 0.1 * step as f32 } else { 0.25 };
//!             gate.observe(p, r)?;
//!         }
//!     }
//! }
//! gate.decide(&mut active)?;
//! assert_eq!(active, [true, false, false, false]);
//! # Ok::<(), flashdiff_gate::GateError>(())
//! ```

pub mod budget;
pub mod checker;
pub mod choice;
mod epsilon;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod pace;

pub use epsilon::LoadAdaptiveEpsilon;

use std::fmt;

/// Default ε, the skip threshold on normalised weights. With R patches the mean weight is
/// 1/R; 0.05 skips patches whose change is under ~half the mean at R = 8..16, in the paper's
/// studied range (Fig. 20 sweeps 0.01-0.1).
pub const DEFAULT_EPSILON: f32 = 0.05;
/// Default η: keeps weights defined when every Δ is zero; far below any real Δ.
pub const DEFAULT_ETA: f32 = 1e-6;
/// Default K, the longest run of skips (the design: 3-5; the paper's bound, §5).
pub const DEFAULT_MAX_SKIP: u32 = 4;
/// Most patches a gate accepts (2^20: far above any real partition, small enough that a
/// gate's per-patch arrays are always allocatable).
pub const MAX_PATCHES: usize = 1 << 20;

/// Gate settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateConfig {
    /// ε in `[0, 1]`: skip when the weight is below it. 0 never skips.
    pub epsilon: f32,
    /// η >= 0, finite.
    pub eta: f32,
    /// K: a patch is never skipped more than K steps in a row. 0 never skips.
    pub max_skip: u32,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            epsilon: DEFAULT_EPSILON,
            eta: DEFAULT_ETA,
            max_skip: DEFAULT_MAX_SKIP,
        }
    }
}

/// Why the gate refused a call.
#[derive(Debug, Clone, PartialEq)]
pub enum GateError {
    /// Zero patches.
    NoPatches,
    /// More patches than [`MAX_PATCHES`].
    TooManyPatches(usize),
    /// A load (for [`LoadAdaptiveEpsilon::try_epsilon`]) that is NaN, infinite or negative.
    BadLoad(f32),
    /// ε outside `[0, 1]` or not finite.
    BadEpsilon(f32),
    /// η negative or not finite.
    BadEta(f32),
    /// Importance NaN, infinite or negative.
    BadImportance {
        /// Patch index.
        patch: usize,
        /// The value given.
        value: f32,
    },
    /// A budget's share outside `[0, 1]` or not finite.
    BadShare(f32),
    /// A patch's change (or accumulated change) NaN, infinite or negative.
    BadChange {
        /// Patch index.
        patch: usize,
        /// The value given.
        value: f32,
    },
    /// A budget state's accumulated change of the whole latent NaN or negative.
    BadWhole(f32),
    /// A patch's share of the signal NaN, infinite or negative.
    BadSignal {
        /// Patch index.
        patch: usize,
        /// The value given.
        value: f32,
    },
    /// Patch index out of range.
    BadPatch {
        /// Index given.
        patch: usize,
        /// Patches in the gate.
        patches: usize,
    },
    /// The patch did not run in the step just decided: it has no fresh importance.
    NotActive {
        /// Patch index.
        patch: usize,
    },
    /// The decision buffer's length is not the patch count.
    BadBuffer {
        /// Expected length.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A work target allowed more computed steps than it has steps.
    BadPace {
        /// Steps to decide.
        steps: u32,
        /// Computations allowed.
        computes: u32,
    },
    /// A step recorded past a work target's last step, or computed with its allowance spent.
    PaceSpent {
        /// Steps left.
        steps_left: u32,
        /// Computations left.
        computes_left: u32,
    },
}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPatches => write!(f, "a gate needs at least one patch"),
            Self::TooManyPatches(n) => write!(
                f,
                "{n} patches exceed the limit of {MAX_PATCHES} (a patch holds at least one token)"
            ),
            Self::BadLoad(l) => write!(
                f,
                "load {l} must be a finite number >= 0 (demand over capacity)"
            ),
            Self::BadEpsilon(e) => write!(f, "epsilon {e} must be a finite number in [0, 1]"),
            Self::BadEta(e) => write!(f, "eta {e} must be finite and >= 0"),
            Self::BadImportance { patch, value } => write!(
                f,
                "importance of patch {patch} is {value}: must be finite and >= 0"
            ),
            Self::BadShare(s) => write!(f, "share {s} must be a finite number in [0, 1]"),
            Self::BadWhole(v) => write!(
                f,
                "the latent's accumulated change is {v}: must be >= 0 and not NaN"
            ),
            Self::BadSignal { patch, value } => write!(
                f,
                "signal of patch {patch} is {value}: must be finite and >= 0"
            ),
            Self::BadChange { patch, value } => write!(
                f,
                "change of patch {patch} is {value}: must be finite and >= 0"
            ),
            Self::BadPatch { patch, patches } => {
                write!(
                    f,
                    "patch {patch} out of range: the gate has {patches} patches"
                )
            }
            Self::NotActive { patch } => write!(
                f,
                "patch {patch} was skipped in the step just decided, so it has no fresh importance"
            ),
            Self::BadBuffer { expected, got } => write!(
                f,
                "decision buffer has {got} entries, expected one per patch ({expected})"
            ),
            Self::BadPace { steps, computes } => write!(
                f,
                "a work target of {computes} computed steps among {steps} steps: at most one per step"
            ),
            Self::PaceSpent {
                steps_left,
                computes_left,
            } => write!(
                f,
                "work target overspent: {steps_left} steps and {computes_left} computations were left"
            ),
        }
    }
}

impl std::error::Error for GateError {}

fn check_epsilon(e: f32) -> Result<(), GateError> {
    if e.is_finite() && (0.0..=1.0).contains(&e) {
        Ok(())
    } else {
        Err(GateError::BadEpsilon(e))
    }
}

/// What one decision did, for reports and the checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecisionStats {
    /// Patches that run this step.
    pub active: u32,
    /// Of those, forced by the K bound.
    pub forced: u32,
    /// Of those, run because they have no Δ yet.
    pub no_history: u32,
    /// 1 when every patch fell under ε and the heaviest was kept to make progress.
    pub kept_one: u32,
}

/// Per-request gate state for R patches.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    cfg: GateConfig,
    r_bar: Vec<f32>,
    delta: Vec<f32>,
    /// Executions observed since the partition, saturating at 2 (Δ defined from 2).
    seen: Vec<u8>,
    /// Consecutive skips so far.
    skipped_run: Vec<u32>,
    active: Vec<bool>,
    weights: Vec<f32>,
    steps: u64,
}

/// A gate's whole state, to persist a request between processes ([`Gate::state`],
/// [`Gate::from_state`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GateState {
    /// Settings.
    pub cfg: GateConfig,
    /// Smoothed importance per patch.
    pub r_bar: Vec<f32>,
    /// Smoothed change per patch.
    pub delta: Vec<f32>,
    /// Executions observed since the partition (saturating at 2).
    pub seen: Vec<u8>,
    /// Consecutive skips.
    pub skipped_run: Vec<u32>,
    /// Active patches of the last decision.
    pub active: Vec<bool>,
    /// Weights of the last decision.
    pub weights: Vec<f32>,
    /// Decisions made.
    pub steps: u64,
}

impl Gate {
    /// Everything the gate holds, for [`Gate::from_state`].
    pub fn state(&self) -> GateState {
        GateState {
            cfg: self.cfg,
            r_bar: self.r_bar.clone(),
            delta: self.delta.clone(),
            seen: self.seen.clone(),
            skipped_run: self.skipped_run.clone(),
            active: self.active.clone(),
            weights: self.weights.clone(),
            steps: self.steps,
        }
    }

    /// A gate continuing from a saved state, which is checked as untrusted input: equal
    /// lengths within the patch bound, valid settings, finite non-negative values, `seen`
    /// at most 2, no skip run beyond K.
    pub fn from_state(st: GateState) -> Result<Self, GateError> {
        let mut g = Self::new(st.r_bar.len(), st.cfg)?;
        let n = g.patches();
        for got in [
            st.delta.len(),
            st.seen.len(),
            st.skipped_run.len(),
            st.active.len(),
            st.weights.len(),
        ] {
            if got != n {
                return Err(GateError::BadBuffer { expected: n, got });
            }
        }
        for (i, &v) in st
            .r_bar
            .iter()
            .chain(&st.delta)
            .chain(&st.weights)
            .enumerate()
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(GateError::BadImportance {
                    patch: i % n,
                    value: v,
                });
            }
        }
        if let Some(i) = st.seen.iter().position(|&s| s > 2) {
            return Err(GateError::BadPatch {
                patch: i,
                patches: n,
            });
        }
        if let Some(i) = st.skipped_run.iter().position(|&k| k > st.cfg.max_skip) {
            return Err(GateError::BadPatch {
                patch: i,
                patches: n,
            });
        }
        g.r_bar = st.r_bar;
        g.delta = st.delta;
        g.seen = st.seen;
        g.skipped_run = st.skipped_run;
        g.active = st.active;
        g.weights = st.weights;
        g.steps = st.steps;
        Ok(g)
    }

    /// A gate for `patches` patches right after a partition (no history).
    pub fn new(patches: usize, cfg: GateConfig) -> Result<Self, GateError> {
        if patches == 0 {
            return Err(GateError::NoPatches);
        }
        if patches > MAX_PATCHES {
            return Err(GateError::TooManyPatches(patches));
        }
        check_epsilon(cfg.epsilon)?;
        if !(cfg.eta.is_finite() && cfg.eta >= 0.0) {
            return Err(GateError::BadEta(cfg.eta));
        }
        Ok(Self {
            cfg,
            r_bar: vec![0.0; patches],
            delta: vec![0.0; patches],
            seen: vec![0; patches],
            skipped_run: vec![0; patches],
            active: vec![false; patches],
            weights: vec![0.0; patches],
            steps: 0,
        })
    }

    /// Patch count.
    pub fn patches(&self) -> usize {
        self.r_bar.len()
    }

    /// Current settings.
    pub fn config(&self) -> GateConfig {
        self.cfg
    }

    /// Sets ε (e.g. from [`LoadAdaptiveEpsilon`]) for the following decisions.
    pub fn set_epsilon(&mut self, epsilon: f32) -> Result<(), GateError> {
        check_epsilon(epsilon)?;
        self.cfg.epsilon = epsilon;
        Ok(())
    }

    /// Weights `w_i` of the last decision (sum 1).
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// Consecutive skips of each patch after the last decision.
    pub fn skipped_run(&self) -> &[u32] {
        &self.skipped_run
    }

    /// Decisions made so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Decides the next step: `active_out[i]` is set to whether patch `i` runs.
    pub fn decide(&mut self, active_out: &mut [bool]) -> Result<DecisionStats, GateError> {
        let r = self.patches();
        if active_out.len() != r {
            return Err(GateError::BadBuffer {
                expected: r,
                got: active_out.len(),
            });
        }
        let eta = self.cfg.eta as f64;
        let total: f64 = self.delta.iter().map(|&d| d as f64 + eta).sum();
        for i in 0..r {
            self.weights[i] = if total > 0.0 {
                ((self.delta[i] as f64 + eta) / total) as f32
            } else {
                1.0 / r as f32
            };
        }
        let mut stats = DecisionStats::default();
        for i in 0..r {
            let no_history = self.seen[i] < 2;
            let forced = self.skipped_run[i] >= self.cfg.max_skip;
            let run = no_history || forced || self.weights[i] >= self.cfg.epsilon;
            self.active[i] = run;
            if run {
                stats.active += 1;
                if no_history {
                    stats.no_history += 1;
                } else if forced && self.weights[i] < self.cfg.epsilon {
                    stats.forced += 1;
                }
            }
        }
        if stats.active == 0 {
            // Weights sum to 1, so this happens only when ε > 1/R: keep the heaviest.
            let mut best = 0;
            for i in 1..r {
                if self.weights[i] > self.weights[best] {
                    best = i;
                }
            }
            self.active[best] = true;
            stats.active = 1;
            stats.kept_one = 1;
        }
        for i in 0..r {
            self.skipped_run[i] = if self.active[i] {
                0
            } else {
                self.skipped_run[i] + 1
            };
        }
        active_out.copy_from_slice(&self.active);
        self.steps += 1;
        Ok(stats)
    }

    /// Feeds the refinement importance of a patch that ran in the step just decided.
    pub fn observe(&mut self, patch: usize, importance: f32) -> Result<(), GateError> {
        let r = self.patches();
        if patch >= r {
            return Err(GateError::BadPatch { patch, patches: r });
        }
        if !(importance.is_finite() && importance >= 0.0) {
            return Err(GateError::BadImportance {
                patch,
                value: importance,
            });
        }
        if !self.active[patch] {
            return Err(GateError::NotActive { patch });
        }
        if self.seen[patch] > 0 {
            self.delta[patch] = (importance - self.r_bar[patch]).abs();
        }
        self.r_bar[patch] = importance;
        self.seen[patch] = (self.seen[patch] + 1).min(2);
        Ok(())
    }

    /// Feeds the importances of all patches that ran (`importance[i]` is ignored for patches
    /// that were skipped).
    pub fn observe_all(&mut self, importance: &[f32]) -> Result<(), GateError> {
        if importance.len() != self.patches() {
            return Err(GateError::BadBuffer {
                expected: self.patches(),
                got: importance.len(),
            });
        }
        for (i, &v) in importance.iter().enumerate() {
            if self.active[i] {
                self.observe(i, v)?;
            }
        }
        Ok(())
    }
}

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
