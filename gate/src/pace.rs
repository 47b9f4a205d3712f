//! Work targets: which steps to compute when a request may compute only so many.
//!
//! A request given a work budget F (its model work as a fraction of full computation's) may
//! compute `floor(F * steps)` steps where a computed step is all its work, fewer where it
//! also pays for every step and for a signal ([`computes_within`]); the warm-up and the final steps are always computed, so
//! a [`Pace`] is given the steps still to decide and how many of them it may compute. It
//! spends that allowance where the latent moves: a step is computed when the level of the
//! patches' changes accumulated since the last computed step (the change budget's
//! [`crate::budget::Budget::level`]) reaches the change of an equal share of the span from
//! the last computed step to the final one (computed after the decided steps),
//! `rate * (since + steps_left + 1) / (computes_left + 1)`, with `rate` the level of this
//! step's one-step changes ([`crate::budget::level`]) and `since` the steps skipped since the
//! last computed one. At a steady rate that cuts the span into `computes_left + 1` equal runs
//! (the remainder going first); where the change speeds up it computes sooner. Counting the
//! span from the last computed step, not from this one, matters: a bar of
//! `rate * steps_left / (computes_left + 1)` shrinks while a run grows and so spends the
//! allowance early, leaving the run before the final step the longest.
//! Two bounds make the count exact: a step is computed whenever the allowance covers every
//! step left, and never once the allowance is spent. So a run computes `min(computes,
//! steps)` steps, and latency is known when the request is admitted.
//!
//! ```
//! use flashdiff_gate::pace::Pace;
//!
//! let mut p = Pace::new(10, 3)?; // 10 steps to decide, 3 may be computed
//! let mut computed = 0;
//! for _ in 0..10 {
//!     let c = p.decide(0.05 * (p.since() as f32 + 1.0), 0.05);
//!     p.stepped(c)?;
//!     computed += c as u32;
//! }
//! assert_eq!(computed, 3);
//! # Ok::<(), flashdiff_gate::GateError>(())
//! ```

use crate::GateError;

/// A work target's state: steps left to decide, computations left to spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    steps_left: u32,
    computes_left: u32,
    since: u32,
}

impl Pace {
    /// `steps` steps to decide, of which `computes` may be computed (at most `steps`).
    pub fn new(steps: u32, computes: u32) -> Result<Self, GateError> {
        Self::at(steps, computes, 0)
    }

    /// A pace part-way through a run: `since` steps skipped since the last computed one.
    /// A request that persists or rebuilds its pace from its own report uses this.
    pub fn at(steps_left: u32, computes_left: u32, since: u32) -> Result<Self, GateError> {
        if computes_left > steps_left {
            return Err(GateError::BadPace {
                steps: steps_left,
                computes: computes_left,
            });
        }
        Ok(Self {
            steps_left,
            computes_left,
            since,
        })
    }

    /// Steps left to decide.
    pub fn steps_left(&self) -> u32 {
        self.steps_left
    }

    /// Computations left to spend.
    pub fn computes_left(&self) -> u32 {
        self.computes_left
    }

    /// Steps skipped since the last computed one.
    pub fn since(&self) -> u32 {
        self.since
    }

    /// The accumulated change at which a step is computed, given the level of this step's
    /// one-step change `rate`: `rate * (since + steps_left + 1) / (computes_left + 1)`, the
    /// change of an equal share of the steps from the last computed one to the final one.
    pub fn bar(&self, rate: f32) -> f32 {
        let span = self.since as f32 + self.steps_left as f32 + 1.0;
        rate * span / (self.computes_left as f32 + 1.0)
    }

    /// Whether this step is computed: `accumulated` is the level of the changes accumulated
    /// since the last computed step, `rate` the level of this step's one-step changes
    /// (a NaN or negative value counts as 0; an infinite `accumulated`, a patch that has not
    /// reported yet, is over any bar). The state changes only in [`Pace::stepped`].
    pub fn decide(&self, accumulated: f32, rate: f32) -> bool {
        if self.computes_left == 0 || self.steps_left == 0 {
            return false;
        }
        if self.computes_left >= self.steps_left {
            return true;
        }
        let clean = |v: f32| if v.is_nan() || v < 0.0 { 0.0 } else { v };
        clean(accumulated) >= self.bar(clean(rate))
    }

    /// Records the step: it was computed or not (the decision, or a choice that respects
    /// the allowance). Computing with no allowance left, or stepping past the last step,
    /// is refused and changes nothing.
    pub fn stepped(&mut self, computed: bool) -> Result<(), GateError> {
        if self.steps_left == 0 || (computed && self.computes_left == 0) {
            return Err(GateError::PaceSpent {
                steps_left: self.steps_left,
                computes_left: self.computes_left,
            });
        }
        self.steps_left -= 1;
        if computed {
            self.computes_left -= 1;
            self.since = 0;
        } else {
            self.since += 1;
        }
        Ok(())
    }
}

/// The steps a request with `steps` steps may compute under the work budget `fraction`
/// when a computed step is all its work: `floor(fraction * steps)` (a budget within 1e-6 of
/// the next whole step counts as reaching it, so 0.3 of 10 steps is 3). [`computes_within`]
/// with no other cost.
pub fn computes_for(fraction: f32, steps: u32) -> u32 {
    computes_within(fraction, steps, 1.0, 0.0, 0.0)
}

/// The steps a request may compute when its budget `fraction` counts FLOPs: a computed
/// step costs `step` FLOPs, every step costs `every` more whether it is computed or not (its
/// conditioning; full computation pays it too), and the run pays `extra` that full
/// computation does not (the signal a method reads to decide). Of full computation's
/// `steps * (step + every)` the budget allows `fraction` of it, so
/// `floor((fraction * steps * (step + every) - steps * every - extra) / step)`, a budget
/// within 1e-6 of a step counting as reaching it, between 0 and `steps`. A `step` that is not positive and finite
/// allows every step (there is nothing to count).
pub fn computes_within(fraction: f32, steps: u32, step: f64, every: f64, extra: f64) -> u32 {
    if !(step.is_finite() && step > 0.0) {
        return steps;
    }
    let n = steps as f64;
    let allowed = fraction as f64 * n * (step + every) - n * every - extra;
    let c = (allowed / step + 1e-6).floor();
    if c.is_nan() {
        return 0;
    }
    c.clamp(0.0, n) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spends_exactly_the_allowance_whatever_the_change() {
        for (steps, computes) in [(10, 0), (10, 1), (10, 9), (10, 10), (1, 1), (0, 0)] {
            for rate in [0.0f32, 0.01, 1.0, f32::NAN] {
                let mut p = Pace::new(steps, computes).unwrap();
                let (mut acc, mut n) = (0.0f32, 0);
                for _ in 0..steps {
                    acc += rate;
                    let c = p.decide(acc, rate);
                    p.stepped(c).unwrap();
                    if c {
                        acc = 0.0;
                        n += 1;
                    }
                }
                assert_eq!(n, computes, "steps {steps} computes {computes} rate {rate}");
            }
        }
    }

    #[test]
    fn a_steady_change_is_computed_evenly() {
        let mut p = Pace::new(12, 3).unwrap();
        let mut at = vec![];
        for s in 0..12 {
            let c = p.decide(0.1 * (p.since() + 1) as f32, 0.1);
            p.stepped(c).unwrap();
            if c {
                at.push(s);
            }
        }
        // Three computed steps cut the span from the step before the twelve to the final
        // computed step after them (13 steps) into four runs of 4, 3, 3, 3: the remainder
        // goes first, and the run before the final step is no longer than the others.
        assert_eq!(at, vec![3, 6, 9]);
    }

    #[test]
    fn refuses_more_computations_than_steps_and_overspending() {
        assert!(Pace::new(3, 4).is_err());
        let mut p = Pace::new(2, 0).unwrap();
        assert!(p.stepped(true).is_err());
        assert_eq!(p, Pace::new(2, 0).unwrap());
        p.stepped(false).unwrap();
        p.stepped(false).unwrap();
        assert!(p.stepped(false).is_err());
        assert!(GateError::BadPace {
            steps: 3,
            computes: 4
        }
        .to_string()
        .contains("4"));
    }

    #[test]
    fn computes_within_pays_the_overheads_first() {
        // 10 steps of 100 FLOPs computed and 10 paid by every step: full is 1100; half of
        // it (550) less the every-step 100 and a signal of 20 leaves 430: 4 steps.
        assert_eq!(computes_within(0.5, 10, 100.0, 10.0, 20.0), 4);
        // No overheads: the step count's share.
        assert_eq!(computes_within(0.5, 10, 100.0, 0.0, 0.0), 5);
        // More overhead than budget: nothing; all of it: every step.
        assert_eq!(computes_within(0.01, 10, 100.0, 10.0, 20.0), 0);
        assert_eq!(computes_within(1.0, 10, 100.0, 10.0, 0.0), 10);
        assert_eq!(computes_within(1.0, 10, 100.0, 10.0, 20.0), 9);
        assert_eq!(computes_within(0.5, 10, 0.0, 10.0, 20.0), 10);
    }

    #[test]
    fn computes_for_floors_the_fraction() {
        assert_eq!(computes_for(0.3, 10), 3);
        assert_eq!(computes_for(0.33, 30), 9);
        assert_eq!(computes_for(0.35, 10), 3);
        assert_eq!(computes_for(1.0, 7), 7);
        assert_eq!(computes_for(0.0, 7), 0);
    }
}
