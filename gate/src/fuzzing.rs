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
