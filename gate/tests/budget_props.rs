//! Property tests of the change budget: the checker accepts every decision on arbitrary
//! change streams; the rule's promises hold; bad input is refused by name.

use flashdiff_gate::budget::{
    level, relative_change, step_change, Budget, BudgetConfig, LONE_PATCH,
};
use flashdiff_gate::checker::BudgetChecker;
use flashdiff_gate::GateError;
use proptest::prelude::*;

/// One decision, each patch's accumulated change before it and the budget's level.
type Step = (Vec<bool>, Vec<f32>, f32);

/// Runs 40 decisions over `stream` (one change per patch per step, cycled), each patch
/// weighted by `signal` (cycled; empty: every patch the same); returns each decision, each
/// patch's accumulated change before it and the level it was decided on.
fn drive(r: usize, cfg: BudgetConfig, stream: &[f32], signal: &[f32]) -> Result<Vec<Step>, String> {
    let mut b = Budget::new(r, cfg).map_err(|e| e.to_string())?;
    let mut checker = BudgetChecker::new(r, cfg);
    let mut active = vec![false; r];
    let mut out = Vec::new();
    let mut it = stream.iter().cycle();
    let mut weights = signal.iter().cycle();
    for step in 0..40 {
        if step > 0 {
            let change: Vec<f32> = (0..r).map(|_| *it.next().unwrap()).collect();
            if signal.is_empty() {
                b.observe(&change).map_err(|e| e.to_string())?;
                checker.observed(&change);
            } else {
                let w: Vec<f32> = (0..r).map(|_| *weights.next().unwrap()).collect();
                b.observe_weighted(&change, &w).map_err(|e| e.to_string())?;
                checker.observed_weighted(&change, &w);
            }
        }
        let before = b.accumulated().to_vec();
        let level = b.level();
        b.decide(&mut active);
        checker.check(&active)?;
        b.ran(&active).map_err(|e| e.to_string())?;
        out.push((active.clone(), before, level));
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_decision_passes_the_checker_and_repeats(
        r in 1usize..=32,
        eps in 0.0f32..=1.0,
        share in 0.0f32..=1.0,
        k in 0u32..=60,
        stream in prop::collection::vec(0.0f32..0.5, 1..200),
        signal in prop::collection::vec(0.0f32..10.0, 0..50),
    ) {
        let cfg = BudgetConfig { epsilon: eps, share, max_skip: k };
        let a = drive(r, cfg, &stream, &signal);
        prop_assert!(a.is_ok(), "{:?}", a.err());
        prop_assert_eq!(a, drive(r, cfg, &stream, &signal));
    }

    #[test]
    fn a_skipped_patch_stays_within_its_budget_and_the_k_bound(
        r in 1usize..=16,
        eps in 0.01f32..=1.0,
        share in 0.0f32..=1.0,
        k in 1u32..=20,
        stream in prop::collection::vec(0.0f32..0.5, 1..100),
        signal in prop::collection::vec(0.0f32..10.0, 0..50),
    ) {
        let cfg = BudgetConfig { epsilon: eps, share, max_skip: k };
        let steps = drive(r, cfg, &stream, &signal).unwrap();
        let mut run = vec![0u32; r];
        for (active, before, level) in &steps {
            let computed = active.iter().any(|&a| a);
            for p in 0..r {
                if active[p] {
                    run[p] = 0;
                } else {
                    run[p] += 1;
                    prop_assert!(run[p] <= k, "patch {p} skipped {} > K {k}", run[p]);
                    let bar = if computed { share * eps } else { LONE_PATCH * eps };
                    prop_assert!(before[p] < bar, "patch {p} skipped at {} >= {bar}", before[p]);
                }
            }
            if !computed {
                prop_assert!(*level < eps, "step skipped at level {level} >= {eps}");
            }
        }
        // The first decision computes every patch.
        prop_assert!(steps[0].0.iter().all(|&a| a));
    }

    #[test]
    fn share_zero_computes_a_step_whole_or_not_at_all(
        r in 1usize..=16,
        eps in 0.0f32..=1.0,
        stream in prop::collection::vec(0.0f32..0.5, 1..100),
    ) {
        let cfg = BudgetConfig { epsilon: eps, share: 0.0, max_skip: 1000 };
        for (active, _, _) in drive(r, cfg, &stream, &[]).unwrap() {
            prop_assert!(active.iter().all(|&a| a) || active.iter().all(|&a| !a));
        }
    }

    #[test]
    fn epsilon_zero_never_skips(r in 1usize..=16, stream in prop::collection::vec(0.0f32..0.5, 1..100)) {
        let cfg = BudgetConfig { epsilon: 0.0, share: 1.0, max_skip: 1000 };
        for (active, _, _) in drive(r, cfg, &stream, &[]).unwrap() {
            prop_assert!(active.iter().all(|&a| a));
        }
    }

    #[test]
    fn the_level_is_the_signal_weighted_mean_or_the_largest_over_lone_patch(
        values in prop::collection::vec(0.0f32..3.0, 1..40),
        signal in prop::collection::vec(0.01f32..5.0, 40),
    ) {
        let w = &signal[..values.len()];
        let total: f64 = w.iter().map(|&x| x as f64).sum();
        let mean = values.iter().zip(w).map(|(&v, &x)| v as f64 * x as f64).sum::<f64>() / total;
        let most = values.iter().fold(0.0f64, |m, &v| m.max(v as f64));
        let want = mean.max(most / LONE_PATCH as f64);
        let got = level(&values, w) as f64;
        prop_assert!((got - want).abs() <= 1e-5 * want.max(1e-6), "{got} against {want}");
        prop_assert!(got <= most * (1.0 + 1e-6), "the level {got} exceeds the largest {most}");
        // Without a signal every patch weighs the same.
        let n = values.len() as f64;
        let plain = (values.iter().map(|&v| v as f64).sum::<f64>() / n).max(most / LONE_PATCH as f64);
        let got = level(&values, &[]) as f64;
        prop_assert!((got - plain).abs() <= 1e-5 * plain.max(1e-6), "{got} against {plain}");
    }

    #[test]
    fn at_share_zero_and_no_k_bound_it_computes_whenever_whole_step_caching_would(
        r in 1usize..=8,
        eps in 0.01f32..=0.5,
        tokens in prop::collection::vec((0u32..8, 0.1f32..3.0), 1..24),
        moves in prop::collection::vec(-0.2f32..0.2, 1..200),
    ) {
        // Whole-step caching accumulates the whole latent's relative L1 change and computes
        // the step once it reaches the threshold; the budget computes at least then.
        let patch_of: Vec<u32> = tokens.iter().map(|&(p, _)| p % r as u32).collect();
        let mut x: Vec<f32> = tokens.iter().map(|&(_, v)| v).collect();
        let cfg = BudgetConfig { epsilon: eps, share: 0.0, max_skip: u32::MAX };
        let mut b = Budget::new(r, cfg).unwrap();
        let mut active = vec![false; r];
        b.decide(&mut active);
        b.ran(&active).unwrap();
        let mut whole = 0.0f64;
        let mut m = moves.iter().cycle();
        for _ in 0..30 {
            let now: Vec<f32> = x.iter().map(|&v| v * (1.0 + m.next().unwrap())).collect();
            let num: f64 = now.iter().zip(&x).map(|(a, b)| (a - b).abs() as f64).sum();
            let den: f64 = x.iter().map(|b| b.abs() as f64).sum();
            whole += num / den;
            let step = step_change(&now, &x, 1, &patch_of, r).unwrap();
            b.observe_weighted(&step.change, &step.signal).unwrap();
            let computed = b.decide(&mut active);
            if whole >= eps as f64 * (1.0 + 1e-4) {
                prop_assert!(computed, "whole-step caching computes at {whole} >= {eps}");
            }
            if computed {
                whole = 0.0;
            }
            b.ran(&active).unwrap();
            x = now;
        }
    }

    #[test]
    fn relative_change_is_each_patchs_l1_ratio(
        before in prop::collection::vec(0.1f32..2.0, 6),
        now in prop::collection::vec(-2.0f32..2.0, 6),
    ) {
        // Three tokens of width 2: tokens 0 and 2 in patch 1, token 1 in patch 0.
        let c = relative_change(&now, &before, 2, &[1, 0, 1], 2).unwrap();
        let l1 = |idx: &[usize], v: &dyn Fn(usize) -> f32| idx.iter().map(|&i| v(i).abs()).sum::<f32>();
        let diff = |i: usize| now[i] - before[i];
        let base = |i: usize| before[i];
        let want0 = l1(&[2, 3], &diff) / l1(&[2, 3], &base);
        let want1 = l1(&[0, 1, 4, 5], &diff) / l1(&[0, 1, 4, 5], &base);
        prop_assert!((c[0] - want0).abs() <= 1e-5 * want0.max(1.0));
        prop_assert!((c[1] - want1).abs() <= 1e-5 * want1.max(1.0));
    }
}

#[test]
fn a_quiet_step_computes_nothing_and_a_moving_patch_runs_alone() {
    let cfg = BudgetConfig {
        epsilon: 0.3,
        share: 1.0,
        max_skip: 1000,
    };
    let mut b = Budget::new(8, cfg).unwrap();
    let mut active = [false; 8];
    assert!(b.decide(&mut active));
    b.ran(&active).unwrap();
    b.observe(&[0.1; 8]).unwrap();
    assert!(!b.decide(&mut active));
    assert_eq!(active, [false; 8]);
    b.ran(&active).unwrap();
    // Patch 0 alone moves. At 0.35 the level is under ε (the latent's change 0.13, half the
    // largest 0.175)...
    let lone = [0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    b.observe(&lone).unwrap();
    assert!((b.level() - 0.175).abs() < 1e-6, "{}", b.level());
    assert!(!b.decide(&mut active));
    b.ran(&active).unwrap();
    // ...and at 0.6 = 2ε it computes the step on its own although the latent's change
    // (0.16) is still under ε; it runs alone.
    b.observe(&lone).unwrap();
    assert!(b.decide(&mut active));
    assert_eq!(
        active,
        [true, false, false, false, false, false, false, false]
    );
    // share 0 computes the whole step instead.
    let mut whole = Budget::from_state(flashdiff_gate::budget::BudgetState {
        cfg: BudgetConfig { share: 0.0, ..cfg },
        ..b.state().clone()
    })
    .unwrap();
    assert!(whole.decide(&mut active));
    assert_eq!(active, [true; 8]);
    whole.ran(&active).unwrap();
    assert_eq!(whole.accumulated(), &[0.0; 8]);
    assert_eq!(whole.level(), 0.0);
}

#[test]
fn a_change_spread_over_the_patches_computes_at_its_mean() {
    let cfg = BudgetConfig {
        epsilon: 0.3,
        share: 0.0,
        max_skip: 1000,
    };
    let fresh = || {
        let mut b = Budget::new(4, cfg).unwrap();
        let mut active = [false; 4];
        b.decide(&mut active);
        b.ran(&active).unwrap();
        b
    };
    let mut active = [false; 4];
    // Every patch at 0.29: under ε.
    let mut b = fresh();
    b.observe(&[0.29, 0.29, 0.29, 0.29]).unwrap();
    assert!(!b.decide(&mut active));
    // Two at 0.32, two at 0.28: their mean reaches ε.
    let mut c = fresh();
    c.observe(&[0.32, 0.28, 0.32, 0.28]).unwrap();
    assert!(c.decide(&mut active), "level {}", c.level());
    // One at 0.4, the others at 0.05: the largest is over ε, the level (0.2) is not.
    let mut d = fresh();
    d.observe(&[0.4, 0.05, 0.05, 0.05]).unwrap();
    assert!(!d.decide(&mut active), "level {}", d.level());
}

#[test]
fn a_quiet_patch_counts_for_its_share_of_the_signal() {
    let cfg = BudgetConfig {
        epsilon: 0.2,
        share: 0.0,
        max_skip: 1000,
    };
    let mut active = [false; 4];
    let change = [0.01, 0.35, 0.35, 0.35];
    // Three quiet patches (1% of the signal each) change by 35%, the loud one by 1%: the
    // latent moved by 1.2%, and no patch alone reached 2ε; unweighted, the mean is 26.5%.
    let mut weighted = Budget::new(4, cfg).unwrap();
    weighted.decide(&mut active);
    weighted.ran(&active).unwrap();
    weighted
        .observe_weighted(&change, &[97.0, 1.0, 1.0, 1.0])
        .unwrap();
    assert!((weighted.level() - 0.175).abs() < 1e-6);
    assert!(!weighted.decide(&mut active));
    let mut plain = Budget::new(4, cfg).unwrap();
    plain.decide(&mut active);
    plain.ran(&active).unwrap();
    plain.observe(&change).unwrap();
    assert!(plain.decide(&mut active), "level {}", plain.level());
    // A signal of zeros weighs every patch the same.
    let mut zeros = Budget::new(4, cfg).unwrap();
    zeros.decide(&mut active);
    zeros.ran(&active).unwrap();
    zeros.observe_weighted(&change, &[0.0; 4]).unwrap();
    assert_eq!(zeros.level(), plain.level());
}

#[test]
fn the_level_of_nothing_infinity_and_nan() {
    assert_eq!(level(&[], &[]), 0.0);
    assert_eq!(level(&[0.1, f32::INFINITY], &[1.0, 0.0]), f32::INFINITY);
    // A NaN or negative value counts as 0: [0.3, 0] -> mean 0.15, half the largest 0.15.
    assert!((level(&[0.3, f32::NAN], &[]) - 0.15).abs() < 1e-6);
    assert!((level(&[0.3, -1.0], &[]) - 0.15).abs() < 1e-6);
    // Weighted 3:1, [0.4, 0] -> 0.3; a NaN weight counts as 0, leaving patch 0 alone.
    assert!((level(&[0.4, 0.0], &[3.0, 1.0]) - 0.3).abs() < 1e-6);
    assert!((level(&[0.4, 0.0], &[f32::NAN, 1.0]) - 0.2).abs() < 1e-6);
}

#[test]
fn the_checker_catches_a_wrong_decision() {
    let cfg = BudgetConfig {
        epsilon: 0.3,
        share: 1.0,
        max_skip: 1000,
    };
    let mut c = BudgetChecker::new(2, cfg);
    c.check(&[true, true]).unwrap();
    c.observed(&[0.1, 0.5]);
    assert!(c.check(&[true, true]).is_err(), "patch 0 is under budget");
    let mut c = BudgetChecker::new(2, cfg);
    c.check(&[true, true]).unwrap();
    c.observed(&[0.1, 0.1]);
    assert!(
        c.check(&[false, true]).is_err(),
        "nothing reached the budget"
    );
    let mut c = BudgetChecker::new(2, BudgetConfig { share: 0.0, ..cfg });
    c.check(&[true, true]).unwrap();
    c.observed_weighted(&[0.1, 0.5], &[9.0, 1.0]);
    assert!(
        c.check(&[true, true]).is_err(),
        "the latent moved by 0.14 and patch 1 by 0.5 < 2ε"
    );
    let mut c = BudgetChecker::new(2, BudgetConfig { max_skip: 1, ..cfg });
    c.check(&[true, true]).unwrap();
    c.check(&[false, false]).unwrap();
    assert!(c.check(&[false, false]).is_err(), "K = 1 forces a run");
}

#[test]
fn bad_input_is_refused_by_name() {
    let cfg = BudgetConfig {
        epsilon: 0.3,
        share: 1.0,
        max_skip: 4,
    };
    assert_eq!(Budget::new(0, cfg).unwrap_err(), GateError::NoPatches);
    assert_eq!(
        Budget::new(2, BudgetConfig { share: 1.5, ..cfg }).unwrap_err(),
        GateError::BadShare(1.5)
    );
    assert!(matches!(
        Budget::new(
            2,
            BudgetConfig {
                epsilon: f32::NAN,
                ..cfg
            }
        ),
        Err(GateError::BadEpsilon(_))
    ));
    let mut b = Budget::new(2, cfg).unwrap();
    let e = b.observe(&[0.1, -1.0]).unwrap_err();
    assert_eq!(
        e,
        GateError::BadChange {
            patch: 1,
            value: -1.0
        }
    );
    assert!(e.to_string().contains("change of patch 1 is -1"));
    assert!(matches!(
        b.observe(&[0.1]),
        Err(GateError::BadBuffer {
            expected: 2,
            got: 1
        })
    ));
    assert!(matches!(b.ran(&[true]), Err(GateError::BadBuffer { .. })));
    let mut restored = b.state().clone();
    restored.whole = -1.0;
    let e = Budget::from_state(restored).unwrap_err();
    assert_eq!(e, GateError::BadWhole(-1.0));
    assert!(e.to_string().contains("latent's accumulated change is -1"));
    assert_eq!(
        b.observe_weighted(&[0.1, 0.1], &[1.0, f32::NAN])
            .unwrap_err()
            .to_string(),
        GateError::BadSignal {
            patch: 1,
            value: f32::NAN
        }
        .to_string()
    );
    assert!(matches!(
        b.observe_weighted(&[0.1, 0.1], &[1.0]),
        Err(GateError::BadBuffer {
            expected: 2,
            got: 1
        })
    ));
    assert_eq!(
        b.accumulated(),
        &[f32::INFINITY; 2],
        "nothing added on a refused report"
    );
    assert!(matches!(
        relative_change(&[1.0; 4], &[1.0; 4], 2, &[0, 5], 2),
        Err(GateError::BadPatch {
            patch: 5,
            patches: 2
        })
    ));
    assert!(matches!(
        relative_change(&[1.0; 3], &[1.0; 4], 2, &[0, 1], 2),
        Err(GateError::BadBuffer { .. })
    ));
}
