//! Fuzz harness (feature `fuzzing`): arbitrary bytes drive a gate and its checker for many
//! steps; a twin gate fed the same input must decide the same.

use crate::checker::GateChecker;
use crate::{Gate, GateConfig, GateError, LoadAdaptiveEpsilon};

/// Runs one fuzz case. Panics on any violated property.
pub fn gate(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let r = 1 + data[0] as usize % 64;
    let cfg = GateConfig {
        epsilon: data[1] as f32 / 255.0,
        eta: if data[2] & 1 == 0 { 1e-6 } else { 0.0 },
        max_skip: (data[2] >> 1) as u32 % 7,
    };
    let mut gate = Gate::new(r, cfg).expect("valid config");
    let mut twin = gate.clone();
    let mut checker = GateChecker::new(r, cfg);
    let hook = LoadAdaptiveEpsilon::default();
    let mut active = vec![false; r];
    let mut twin_active = vec![false; r];
    let mut bytes = data[3..].iter().copied().cycle().take(4096);
    for _ in 0..data.len().min(64) {
        let op = bytes.next().unwrap_or(0);
        if op == 0xFF {
            // Load change through the hook.
            let e = hook.epsilon(bytes.next().unwrap_or(0) as f32 / 100.0);
            gate.set_epsilon(e).expect("hook stays in bounds");
            twin.set_epsilon(e).expect("hook stays in bounds");
            checker.set_epsilon(e);
        }
        gate.decide(&mut active).expect("buffer sized");
        twin.decide(&mut twin_active).expect("buffer sized");
        assert_eq!(active, twin_active, "gate is not deterministic");
        checker
            .check(&active, gate.weights())
            .unwrap_or_else(|e| panic!("checker: {e}"));
        for p in 0..r {
            let b = bytes.next().unwrap_or(0);
            let v = match b {
                0xFE => f32::NAN,
                0xFD => -1.0,
                _ => b as f32 / 64.0,
            };
            let res = gate.observe(p, v);
            let _ = twin.observe(p, v);
            match res {
                Ok(()) => checker.observed(p, v),
                Err(GateError::NotActive { .. }) => assert!(!active[p]),
                Err(GateError::BadImportance { .. }) => assert!(!v.is_finite() || v < 0.0),
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }
}

/// Runs one fuzz case of the change budget. Panics on any violated property.
pub fn budget(data: &[u8]) {
    use crate::budget::{step_change, Budget, BudgetConfig};
    use crate::checker::BudgetChecker;
    if data.len() < 4 {
        return;
    }
    let r = 1 + data[0] as usize % 32;
    let cfg = BudgetConfig {
        epsilon: data[1] as f32 / 255.0,
        share: (data[2] & 0x0F) as f32 / 15.0,
        max_skip: (data[2] >> 4) as u32 * 4,
    };
    let mut b = Budget::new(r, cfg).expect("valid config");
    let mut checker = BudgetChecker::new(r, cfg);
    let hook = LoadAdaptiveEpsilon::default();
    let mut active = vec![false; r];
    let mut bytes = data[3..].iter().copied().cycle().take(8192);
    // A per-token signal (one token per patch, width 1) drives the changes.
    let mut before: Vec<f32> = (0..r).map(|p| 1.0 + p as f32).collect();
    let patch_of: Vec<u32> = (0..r as u32).collect();
    for _ in 0..data.len().min(64) {
        if bytes.next() == Some(0xFF) {
            let e = hook.epsilon(bytes.next().unwrap_or(0) as f32 / 100.0);
            b.set_epsilon(e).expect("hook stays in bounds");
            checker.set_epsilon(e);
        }
        b.decide(&mut active);
        checker
            .check(&active)
            .unwrap_or_else(|e| panic!("checker: {e}"));
        b.ran(&active).expect("sized");
        let now: Vec<f32> = before
            .iter()
            .map(|&x| match bytes.next().unwrap_or(0) {
                0xFE => f32::NAN,
                0xFD => f32::INFINITY,
                v => x + (v as f32 - 128.0) / 64.0,
            })
            .collect();
        let Ok(step) = step_change(&now, &before, 1, &patch_of, r) else {
            panic!("sized buffers refused");
        };
        match b.observe_weighted(&step.change, &step.signal) {
            Ok(()) => checker.observed_weighted(&step.change, &step.signal),
            Err(GateError::BadChange { patch, .. }) => {
                assert!(!step.change[patch].is_finite() || step.change[patch] < 0.0)
            }
            Err(GateError::BadSignal { patch, .. }) => {
                assert!(!step.signal[patch].is_finite() || step.signal[patch] < 0.0)
            }
            Err(e) => panic!("unexpected {e}"),
        }
        if now.iter().all(|x| x.is_finite()) {
            before = now;
        }
    }
}

/// Runs one fuzz case of a work target ([`crate::pace::Pace`]) over a change budget's
/// accumulated changes. Panics on any violated property.
pub fn pace(data: &[u8]) {
    use crate::checker::PaceChecker;
    use crate::pace::Pace;
    if data.len() < 2 {
        return;
    }
    let steps = data[0] as u32 % 64;
    let computes = (data[1] as u32 % 65).min(steps);
    let mut p = Pace::new(steps, computes).expect("computes <= steps");
    let mut checker = PaceChecker::new(steps, computes);
    let mut bytes = data[2..].iter().copied().cycle();
    let mut acc = 0.0f32;
    for _ in 0..steps {
        let rate = match bytes.next().unwrap_or(0) {
            0xFF => f32::NAN,
            0xFE => f32::INFINITY,
            0xFD => -1.0,
            v => v as f32 / 100.0,
        };
        acc += if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            0.0
        };
        let computed = p.decide(acc, rate);
        checker
            .check(acc, rate, computed)
            .unwrap_or_else(|e| panic!("checker: {e}"));
        p.stepped(computed)
            .expect("a decision respects the allowance");
        if computed {
            acc = 0.0;
        }
    }
    checker.finish().unwrap_or_else(|e| panic!("checker: {e}"));
    assert!(
        p.stepped(false).is_err(),
        "a step past the last was accepted"
    );
    // The allowance of a FLOPs budget from the same bytes: costs of any value (NaN,
    // infinite, negative among them) give a count within the steps, and finite costs one
    // whose FLOPs stay within the budget.
    let cost = |b: u8| match b {
        0xFF => f64::NAN,
        0xFE => f64::INFINITY,
        0xFD => -1.0,
        v => v as f64,
    };
    let at = |i: usize| data.get(i).copied().unwrap_or(1);
    let fraction = at(2) as f32 / 255.0;
    let (step, every, extra) = (cost(at(3)), cost(at(4)), cost(at(5)) * steps as f64);
    let k = crate::pace::computes_within(fraction, steps, step, every, extra);
    assert!(k <= steps, "{k} of {steps} steps allowed");
    if k > 0
        && [step, every, extra]
            .iter()
            .all(|c| c.is_finite() && *c >= 0.0)
        && step > 0.0
    {
        let n = steps as f64;
        let run = k as f64 * step + n * every + extra;
        let budget = fraction as f64 * n * (step + every);
        assert!(
            run <= budget + 1e-5 * step,
            "{k} steps run {run} FLOPs over the budget {budget}"
        );
    }
}

/// Runs one fuzz case of the automatic choice ([`crate::choice`]): arbitrary changes and
/// signal, checked against [`crate::checker::check_choice`]; bad values must be refused by
/// name. Panics on any violated property.
pub fn choice(data: &[u8]) {
    use crate::checker::check_choice;
    use crate::choice::{choose, dispersion};
    if data.len() < 2 {
        return;
    }
    let threshold = data[0] as f32 / 64.0;
    let value = |b: u8| match b {
        0xFF => f32::NAN,
        0xFE => f32::INFINITY,
        0xFD => -1.0,
        v => v as f32 / 32.0,
    };
    let pairs = &data[1..];
    let n = pairs.len() / 2;
    let change: Vec<f32> = pairs[..n].iter().map(|&b| value(b)).collect();
    let signal: Vec<f32> = pairs[n..2 * n].iter().map(|&b| value(b)).collect();
    match dispersion(&change, &signal) {
        Ok(d) => {
            assert!(d.is_finite() && d >= 0.0, "dispersion {d}");
            check_choice(&change, &signal, threshold, d, choose(d, threshold))
                .unwrap_or_else(|e| panic!("checker: {e}"));
        }
        Err(GateError::BadChange { patch, value }) => {
            assert!(!value.is_finite() || value < 0.0);
            assert_eq!(change[patch].to_bits(), value.to_bits());
        }
        Err(GateError::BadSignal { patch, value }) => {
            assert!(!value.is_finite() || value < 0.0);
            assert_eq!(signal[patch].to_bits(), value.to_bits());
        }
        Err(e) => panic!("unexpected {e}"),
    }
}
