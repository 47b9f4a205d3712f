//! Properties of the automatic choice between regional and whole-step execution, each case
//! also checked by the independent checker.

use flashdiff_gate::checker::check_choice;
use flashdiff_gate::choice::{choose, dispersion, Execution};
use proptest::prelude::*;

fn patches() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (1usize..24).prop_flat_map(|n| {
        (
            prop::collection::vec(0.0f32..2.0, n),
            prop::collection::vec(0.01f32..10.0, n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The checker recomputes every dispersion and choice.
    #[test]
    fn the_checker_agrees((change, signal) in patches(), t in 0.0f32..3.0) {
        let d = dispersion(&change, &signal).unwrap();
        prop_assert!(d.is_finite() && d >= 0.0);
        prop_assert!(check_choice(&change, &signal, t, d, choose(d, t)).is_ok());
        // The other choice is refused unless the dispersion is within rounding of the bar.
        let other = match choose(d, t) {
            Execution::Regional => Execution::WholeStep,
            Execution::WholeStep => Execution::Regional,
        };
        if (d - t).abs() > 1e-2 * t.max(1e-2) {
            prop_assert!(check_choice(&change, &signal, t, d, other).is_err());
        }
    }

    /// The dispersion reads how unevenly the patches change, not how much: scaling every
    /// change, or every signal, leaves it as it was.
    #[test]
    fn it_is_free_of_scale((change, signal) in patches(), k in 0.1f32..10.0) {
        let d = dispersion(&change, &signal).unwrap();
        let scaled: Vec<f32> = change.iter().map(|c| c * k).collect();
        let heavier: Vec<f32> = signal.iter().map(|s| s * k).collect();
        let near = |a: f32, b: f32| (a - b).abs() <= 1e-3 * b.max(1e-3);
        prop_assert!(near(dispersion(&scaled, &signal).unwrap(), d));
        prop_assert!(near(dispersion(&change, &heavier).unwrap(), d));
    }

    /// The order of the patches does not matter.
    #[test]
    fn it_is_free_of_order((change, signal) in patches(), by in 0usize..24) {
        let n = change.len();
        let r = by % n;
        let mut c2 = change.clone();
        let mut s2 = signal.clone();
        c2.rotate_left(r);
        s2.rotate_left(r);
        let (a, b) = (dispersion(&change, &signal).unwrap(), dispersion(&c2, &s2).unwrap());
        prop_assert!((a - b).abs() <= 1e-4 * a.max(1e-3));
    }

    /// Patches changing alike have no dispersion; one patch changing alone among `n` equal
    /// ones has sqrt(n - 1).
    #[test]
    fn even_and_lone_changes(n in 2usize..24, c in 0.01f32..2.0) {
        let signal = vec![1.0f32; n];
        prop_assert!(dispersion(&vec![c; n], &signal).unwrap() < 1e-5);
        let mut lone = vec![0.0f32; n];
        lone[n / 2] = c;
        let d = dispersion(&lone, &signal).unwrap();
        prop_assert!((d - ((n - 1) as f32).sqrt()).abs() < 1e-3 * d);
    }
}

#[test]
fn bad_values_and_lengths_are_refused_by_name() {
    use flashdiff_gate::GateError;
    assert!(matches!(
        dispersion(&[0.1, f32::NAN], &[1.0, 1.0]),
        Err(GateError::BadChange { patch: 1, .. })
    ));
    assert!(matches!(
        dispersion(&[0.1, 0.2], &[1.0, -1.0]),
        Err(GateError::BadSignal { patch: 1, .. })
    ));
    assert!(dispersion(&[0.1], &[1.0, 1.0]).is_err());
    // No signal or no change: nothing to read, whole steps.
    assert_eq!(dispersion(&[0.3, 0.1], &[0.0, 0.0]).unwrap(), 0.0);
    assert_eq!(dispersion(&[0.0, 0.0], &[1.0, 2.0]).unwrap(), 0.0);
    assert_eq!(choose(0.0, 0.5), Execution::WholeStep);
    assert_eq!(choose(0.5, 0.5), Execution::Regional);
}
