//! The paper's patch gate (§4.2), kept as an ablation of the change budget: saliency patches,
//! each computed while its normalised importance change is at least ε (at most K skips in a
//! row, one patch at least every step), every reused value forecast. The gate is this
//! method's memory: made at its first decision, fed each computed patch's refinement
//! importance before the step commits, and kept in the request's checkpoint.

use flashdiff_gate::{Gate, GateConfig, GateState};
use flashdiff_models::Denoiser;

use super::{
    adaptive_epsilon, counts, floats, memory_of, saliency_patches, Memory, Method, Recall,
};
use crate::checkpoint::MemoryRecord;
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};
use crate::state::Region;

pub(super) struct PatchGate;

/// The gate, from the first step after the partition.
#[derive(Default)]
struct Remembered {
    gate: Option<Gate>,
}

impl Memory for Remembered {
    fn save(&self, out: &mut Vec<MemoryRecord>) {
        let Some(g) = &self.gate else {
            return;
        };
        let st = g.state();
        out.push(floats("gate.settings", &[st.cfg.epsilon, st.cfg.eta]));
        out.push(counts(
            "gate.counts",
            &[st.cfg.max_skip, st.steps as u32, (st.steps >> 32) as u32],
        ));
        out.push(floats("gate.r_bar", &st.r_bar));
        out.push(floats("gate.delta", &st.delta));
        let seen: Vec<u32> = st.seen.iter().map(|&s| s as u32).collect();
        out.push(counts("gate.seen", &seen));
        out.push(counts("gate.skipped_run", &st.skipped_run));
        let active: Vec<u32> = st.active.iter().map(|&a| a as u32).collect();
        out.push(counts("gate.active", &active));
        out.push(floats("gate.weights", &st.weights));
    }
}

/// Partitions, ε and forecasting as the change budget has them; only the choice differs.
impl Method for PatchGate {
    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Remembered::default())
    }

    /// The gate's record, checked as [`Gate::from_state`] checks any state and against the
    /// request's patches.
    fn recall(&self, rec: &Recall) -> Result<Box<dyn Memory>, String> {
        let names = [
            "gate.settings",
            "gate.counts",
            "gate.r_bar",
            "gate.delta",
            "gate.seen",
            "gate.skipped_run",
            "gate.active",
            "gate.weights",
        ];
        let found = names
            .iter()
            .filter(|n| rec.floats(n).is_some() || rec.counts(n).is_some())
            .count();
        if found == 0 {
            return Ok(Box::new(Remembered::default()));
        }
        let whole = || "the gate's record is incomplete".to_string();
        let (Some(&[epsilon, eta]), Some(&[max_skip, lo, hi])) =
            (rec.floats("gate.settings"), rec.counts("gate.counts"))
        else {
            return Err(whole());
        };
        let f = |n: &str| rec.floats(n).map(<[f32]>::to_vec).ok_or_else(whole);
        let c = |n: &str| rec.counts(n).ok_or_else(whole);
        let seen = c("gate.seen")?
            .iter()
            .map(|&s| u8::try_from(s).map_err(|_| format!("gate: seen count {s} is over 255")))
            .collect::<Result<Vec<u8>, String>>()?;
        let active = c("gate.active")?
            .iter()
            .map(|&a| match a {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(format!("gate: active flag {a} is neither 0 nor 1")),
            })
            .collect::<Result<Vec<bool>, String>>()?;
        let gate = Gate::from_state(GateState {
            cfg: GateConfig {
                epsilon,
                eta,
                max_skip,
            },
            r_bar: f("gate.r_bar")?,
            delta: f("gate.delta")?,
            seen,
            skipped_run: c("gate.skipped_run")?.to_vec(),
            active,
            weights: f("gate.weights")?,
            steps: u64::from(lo) | (u64::from(hi) << 32),
        })
        .map_err(|e| format!("gate: {e}"))?;
        if gate.patches() != rec.patches {
            return Err("gate and layout disagree on the patch count".into());
        }
        Ok(Box::new(Remembered { gate: Some(gate) }))
    }

    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        saliency_patches(cfg, adaptive_r)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }

    /// Every patch in the final steps (ε = 0 never skips, and the gate records every patch
    /// as run), else the gate at its threshold, or at the load's ε with `adaptive_epsilon`.
    fn choose(
        &self,
        _: &dyn Denoiser,
        r: &mut Request,
        load: f32,
        final_full: bool,
    ) -> Result<(), EngineError> {
        let patches = r.active.len();
        let cfg = GateConfig {
            epsilon: r.cfg.epsilon,
            eta: flashdiff_gate::DEFAULT_ETA,
            max_skip: r.cfg.max_skip,
        };
        let eps = if final_full {
            Some(0.0)
        } else if r.cfg.adaptive_epsilon {
            let e = adaptive_epsilon(r.cfg.epsilon).epsilon(load);
            r.report.epsilon_sum += e as f64;
            r.report.epsilon_steps += 1;
            Some(e)
        } else {
            None
        };
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        let gate = match &mut memory.gate {
            Some(g) => g,
            slot => slot.insert(Gate::new(patches, cfg)?),
        };
        if let Some(e) = eps {
            gate.set_epsilon(e)?;
        }
        gate.decide(&mut r.active)?;
        Ok(())
    }

    /// The gate learns each computed patch's refinement importance from this step's forward.
    fn before_commit(&self, r: &mut Request) -> Result<(), EngineError> {
        let importance = r.state.get(Region::Importance);
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        let Some(gate) = memory.gate.as_mut() else {
            return Ok(());
        };
        for (p, _) in r.active.iter().enumerate().filter(|(_, &a)| a) {
            gate.observe(p, importance[p])?;
        }
        Ok(())
    }
}
