//! Property tests: the checker accepts every decision on arbitrary importance streams; the
//! paper's worked rules hold; bad input is refused by name.

use flashdiff_gate::checker::GateChecker;
use flashdiff_gate::{Gate, GateConfig, GateError, LoadAdaptiveEpsilon, MAX_PATCHES};
use proptest::prelude::*;

fn drive(r: usize, cfg: GateConfig, stream: &[f32]) -> Result<Vec<Vec<bool>>, String> {
    let mut gate = Gate::new(r, cfg).map_err(|e| e.to_string())?;
    let mut checker = GateChecker::new(r, cfg);
    let mut active = vec![false; r];
    let mut out = Vec::new();
    let mut it = stream.iter().cycle();
    for _ in 0..40 {
        gate.decide(&mut active).map_err(|e| e.to_string())?;
        checker.check(&active, gate.weights())?;
        out.push(active.clone());
        for p in 0..r {
            let v = *it.next().unwrap();
            if active[p] {
                gate.observe(p, v).map_err(|e| e.to_string())?;
                checker.observed(p, v);
            }
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_decision_passes_the_checker_and_repeats(
        r in 1usize..=64,
        eps in 0.0f32..=1.0,
        k in 0u32..=6,
        stream in prop::collection::vec(0.0f32..2.0, 1..200),
    ) {
        let cfg = GateConfig { epsilon: eps, eta: 1e-6, max_skip: k };
        let a = drive(r, cfg, &stream);
        prop_assert!(a.is_ok(), "{:?}", a.err());
        prop_assert_eq!(a, drive(r, cfg, &stream));
    }

    #[test]
    fn epsilon_zero_never_skips(r in 1usize..=32, stream in prop::collection::vec(0.0f32..2.0, 1..100)) {
        let cfg = GateConfig { epsilon: 0.0, eta: 0.0, max_skip: 5 };
        for step in drive(r, cfg, &stream).unwrap() {
            prop_assert!(step.iter().all(|&a| a));
        }
    }

    #[test]
    fn no_patch_skips_more_than_k(r in 2usize..=32, k in 0u32..=5) {
        // Patch 0 changes a lot every step; the rest never change: they skip as much as allowed.
        let cfg = GateConfig { epsilon: 0.5, eta: 1e-6, max_skip: k };
        let mut gate = Gate::new(r, cfg).unwrap();
        let mut active = vec![false; r];
        let mut run = vec![0u32; r];
        let mut max_run = 0;
        for step in 0..50 {
            gate.decide(&mut active).unwrap();
            for p in 0..r {
                run[p] = if active[p] { 0 } else { run[p] + 1 };
                max_run = max_run.max(run[p]);
                if active[p] {
                    gate.observe(p, if p == 0 { (step % 2) as f32 } else { 0.3 }).unwrap();
                }
            }
        }
        prop_assert_eq!(max_run, k, "longest skip run");
    }

    #[test]
    fn load_hook_is_monotone_and_bounded(a in 0.0f32..3.0, b in 0.0f32..3.0) {
        let h = LoadAdaptiveEpsilon::default();
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(h.epsilon(lo) <= h.epsilon(hi));
        for l in [lo, hi] {
            prop_assert!(h.epsilon(l) >= h.eps_min && h.epsilon(l) <= h.eps_max);
        }
    }
}

#[test]
fn first_two_decisions_run_everything() {
    let mut gate = Gate::new(
        3,
        GateConfig {
            epsilon: 0.9,
            eta: 0.0,
            max_skip: 9,
        },
    )
    .unwrap();
    let mut a = [false; 3];
    for _ in 0..2 {
        let s = gate.decide(&mut a).unwrap();
        assert_eq!(a, [true; 3]);
        assert_eq!(s.no_history, 3);
        gate.observe_all(&[0.1, 0.2, 0.3]).unwrap();
    }
}

#[test]
fn weights_follow_equation_nine() {
    // Δ = (0.3, 0.1, 0.0, 0.0), η = 0.1: w = (0.4, 0.2, 0.1, 0.1) / 0.8.
    let mut gate = Gate::new(
        4,
        GateConfig {
            epsilon: 0.2,
            eta: 0.1,
            max_skip: 3,
        },
    )
    .unwrap();
    let mut a = [false; 4];
    gate.decide(&mut a).unwrap();
    gate.observe_all(&[0.5, 0.5, 0.5, 0.5]).unwrap();
    gate.decide(&mut a).unwrap();
    gate.observe_all(&[0.8, 0.4, 0.5, 0.5]).unwrap();
    gate.decide(&mut a).unwrap();
    let w = gate.weights();
    for (got, want) in w.iter().zip([0.5f32, 0.25, 0.125, 0.125]) {
        assert!((got - want).abs() < 1e-6, "{w:?}");
    }
    assert_eq!(a, [true, true, false, false]);
    // A skipped patch keeps its Δ and cannot be fed.
    assert_eq!(gate.observe(2, 0.1), Err(GateError::NotActive { patch: 2 }));
}

#[test]
fn at_least_one_patch_runs_when_all_fall_under_epsilon() {
    let mut gate = Gate::new(
        4,
        GateConfig {
            epsilon: 0.9,
            eta: 1e-6,
            max_skip: 100,
        },
    )
    .unwrap();
    let mut a = [false; 4];
    for step in 0..10 {
        let s = gate.decide(&mut a).unwrap();
        assert!(a.iter().any(|&x| x), "step {step}");
        if step >= 2 {
            assert_eq!(s.active, 1);
            assert_eq!(s.kept_one, 1);
        }
        for p in 0..4 {
            if a[p] {
                gate.observe(p, (step * (p + 1)) as f32 * 0.1).unwrap();
            }
        }
    }
}

#[test]
fn bad_input_is_refused_by_name() {
    assert_eq!(
        Gate::new(0, GateConfig::default()),
        Err(GateError::NoPatches)
    );
    let bad = GateConfig {
        epsilon: f32::NAN,
        ..Default::default()
    };
    assert!(matches!(Gate::new(2, bad), Err(GateError::BadEpsilon(_))));
    let bad = GateConfig {
        eta: -1.0,
        ..Default::default()
    };
    assert_eq!(Gate::new(2, bad), Err(GateError::BadEta(-1.0)));
    let mut gate = Gate::new(2, GateConfig::default()).unwrap();
    assert_eq!(
        gate.decide(&mut [false; 3]),
        Err(GateError::BadBuffer {
            expected: 2,
            got: 3
        })
    );
    gate.decide(&mut [false; 2]).unwrap();
    assert_eq!(
        gate.observe(5, 0.1),
        Err(GateError::BadPatch {
            patch: 5,
            patches: 2
        })
    );
    assert!(matches!(
        gate.observe(0, f32::INFINITY),
        Err(GateError::BadImportance { patch: 0, .. })
    ));
    assert!(gate.set_epsilon(1.5).is_err());
    assert!(LoadAdaptiveEpsilon {
        eps_min: 0.2,
        eps_base: 0.1,
        ..Default::default()
    }
    .validate()
    .is_err());
    assert!(LoadAdaptiveEpsilon::default().validate().is_ok());
}

#[test]
fn checker_rejects_wrong_decisions() {
    let cfg = GateConfig {
        epsilon: 0.0,
        eta: 1e-6,
        max_skip: 1,
    };
    let mut c = GateChecker::new(2, cfg);
    assert!(c
        .check(&[false, false], &[0.5, 0.5])
        .unwrap_err()
        .contains("no patch active"));
    assert!(c
        .check(&[true, false], &[0.5, 0.5])
        .unwrap_err()
        .contains("epsilon 0"));
    let mut c = GateChecker::new(
        2,
        GateConfig {
            epsilon: 0.1,
            ..cfg
        },
    );
    assert!(c
        .check(&[true, false], &[0.5, 0.5])
        .unwrap_err()
        .contains("history"));
    let mut c = GateChecker::new(
        2,
        GateConfig {
            epsilon: 0.4,
            ..cfg
        },
    );
    for _ in 0..2 {
        c.check(&[true, true], &[0.5, 0.5]).unwrap();
        c.observed(0, 0.1);
        c.observed(1, 0.1);
    }
    assert!(c
        .check(&[true, false], &[0.6, 0.4])
        .unwrap_err()
        .contains("weight"));
    c.check(&[true, false], &[0.5, 0.5]).unwrap_err();
}

#[test]
fn patch_counts_and_loads_have_bounds() {
    assert_eq!(
        Gate::new(MAX_PATCHES + 1, GateConfig::default()).unwrap_err(),
        GateError::TooManyPatches(MAX_PATCHES + 1)
    );
    assert!(Gate::new(MAX_PATCHES, GateConfig::default()).is_ok());
    let h = LoadAdaptiveEpsilon::default();
    for bad in [f32::NAN, -1.0, f32::INFINITY, f32::NEG_INFINITY] {
        assert!(
            matches!(h.try_epsilon(bad), Err(GateError::BadLoad(_))),
            "{bad}"
        );
    }
    assert_eq!(h.try_epsilon(1.0).unwrap(), h.epsilon(1.0));
}
