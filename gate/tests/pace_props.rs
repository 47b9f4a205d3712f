//! Property tests of work targets: the checker accepts every decision on arbitrary change
//! streams; a run computes exactly its allowance; a steady change is computed evenly, the
//! run before the final step no longer than the others; more change computes no later; a
//! checker catches a pace that breaks the rule; a FLOPs budget allows the most steps whose
//! FLOPs stay within it.

use flashdiff_gate::checker::PaceChecker;
use flashdiff_gate::pace::{computes_for, computes_within, Pace};
use proptest::prelude::*;

/// Runs a pace over `rates` (one per step; the accumulated change restarts at each computed
/// step) with `decide` standing in for the pace's rule; returns the computed steps.
fn drive(
    steps: u32,
    computes: u32,
    rates: &[f32],
    decide: impl Fn(&Pace, f32, f32) -> bool,
) -> Result<Vec<u32>, String> {
    let mut p = Pace::new(steps, computes).map_err(|e| e.to_string())?;
    let mut checker = PaceChecker::new(steps, computes);
    let (mut acc, mut at) = (0.0f32, vec![]);
    for s in 0..steps {
        let rate = rates[s as usize % rates.len()];
        acc += rate;
        let c = decide(&p, acc, rate);
        checker.check(acc, rate, c)?;
        p.stepped(c).map_err(|e| e.to_string())?;
        if c {
            acc = 0.0;
            at.push(s);
        }
    }
    checker.finish()?;
    Ok(at)
}

proptest! {
    #[test]
    fn a_run_computes_exactly_its_allowance(
        steps in 0u32..80,
        frac in 0.0f32..=1.0,
        rates in prop::collection::vec(0.0f32..2.0, 1..40),
    ) {
        let computes = computes_for(frac, steps);
        let at = drive(steps, computes, &rates, |p, a, r| p.decide(a, r))
            .map_err(TestCaseError::fail)?;
        prop_assert_eq!(at.len() as u32, computes);
        prop_assert!(computes as f32 <= frac * steps as f32 + 1e-3);
    }

    #[test]
    fn a_flops_budget_allows_the_most_steps_within_it(
        steps in 0u32..200,
        frac in 0.0f32..=1.0,
        step in 1.0f64..1e9,
        every in 0.0f64..0.1,
        extra in 0.0f64..0.3,
    ) {
        // `every` and `extra` as shares of a step and of the run's computed FLOPs.
        let every = every * step;
        let extra = extra * step * steps as f64;
        let k = computes_within(frac, steps, step, every, extra);
        let n = steps as f64;
        let budget = frac as f64 * n * (step + every);
        let run = |k: u32| k as f64 * step + n * every + extra;
        prop_assert!(k <= steps);
        if k > 0 {
            prop_assert!(run(k) <= budget + 1e-5 * step, "{} steps exceed the budget", k);
        }
        if k < steps {
            prop_assert!(run(k + 1) > budget - 1e-5 * step, "{} more steps fit the budget", k + 1);
        }
        // The overheads only ever take steps away.
        prop_assert!(k <= computes_for(frac, steps));
    }

    #[test]
    fn more_accumulated_change_never_skips_a_step_less_did_compute(
        steps in 1u32..50,
        computes in 0u32..50,
        rate in 0.0f32..1.0,
        a in 0.0f32..5.0,
        extra in 0.0f32..5.0,
    ) {
        let p = Pace::new(steps, computes.min(steps)).unwrap();
        prop_assert!(!p.decide(a, rate) || p.decide(a + extra, rate));
    }

    #[test]
    fn a_steady_change_cuts_the_span_into_runs_that_never_grow(
        steps in 0u32..80,
        frac in 0.0f32..=1.0,
        rate in prop::sample::select(vec![0.125f32, 0.25, 0.5, 1.0]),
    ) {
        // Runs from the step before the decided ones (-1) to each computed step and on to the
        // final computed step after them (`steps`). A power-of-two rate keeps the sums exact.
        let computes = computes_for(frac, steps);
        let at = drive(steps, computes, &[rate], |p, a, r| p.decide(a, r))
            .map_err(TestCaseError::fail)?;
        let mut ends: Vec<i64> = vec![-1];
        ends.extend(at.iter().map(|&s| s as i64));
        ends.push(steps as i64);
        let runs: Vec<i64> = ends.windows(2).map(|w| w[1] - w[0]).collect();
        prop_assert!(runs.windows(2).all(|w| w[1] <= w[0]), "runs {:?}", runs);
        let (lo, hi) = (runs.iter().min().unwrap(), runs.iter().max().unwrap());
        prop_assert!(hi - lo <= 1, "runs {:?}", runs);
    }

    #[test]
    fn a_pace_that_ignores_the_change_is_caught(
        steps in 4u32..40,
        rates in prop::collection::vec(0.01f32..1.0, 1..10),
    ) {
        // Half the steps allowed; a rule that computes every step while it can breaks the
        // bar somewhere (the first step's change is below its bar of about 2 rates).
        let computes = steps / 2;
        let greedy = |p: &Pace, _: f32, _: f32| p.computes_left() > 0;
        prop_assert!(drive(steps, computes, &rates, greedy).is_err());
    }
}

#[test]
fn bad_targets_are_refused_by_name() {
    let e = Pace::new(3, 4).unwrap_err().to_string();
    assert!(e.contains("4 computed steps among 3"), "{e}");
    let mut p = Pace::new(1, 0).unwrap();
    let e = p.stepped(true).unwrap_err().to_string();
    assert!(e.contains("overspent"), "{e}");
}
