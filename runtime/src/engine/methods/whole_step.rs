//! Whole-step caching (TeaCache / first-block-cache style): the whole step is skipped while
//! the accumulated relative L1 change of block 0's modulated input stays under the request's
//! `cache_threshold`, advancing every token with its velocity forecast from the computed
//! steps (TaylorSeer-style, first order; `reuse: stale` reuses the last one as TeaCache
//! does). Like FlashDiff's budget, at most `max_skip` (K) steps in a row are skipped
//! (cache-dit's `max_continuous_cached_steps`): with a threshold no change reaches, K alone
//! spaces the computed steps, a computed step every K + 1 (FORA's and TaylorSeer's fixed
//! interval N = K + 1). K at least the step count leaves the threshold alone to decide, as
//! TeaCache's authors run it.

use std::time::Instant;

use flashdiff_models::Denoiser;

use super::{
    below_skip_cap, block0_input, floats, forecast_whole_step, memory_of, relative_l1, Memory,
    Method, Recall,
};
use crate::checkpoint::MemoryRecord;
use crate::engine::request::Request;
use crate::engine::{EngineError, LayoutKind, RequestConfig};

pub(super) struct WholeStep;

/// Block 0's modulated input at the previous step, and the change accumulated since the
/// last computed step.
#[derive(Default)]
struct Remembered {
    before: Option<(Vec<f32>, f32)>,
}

impl Memory for Remembered {
    fn save(&self, out: &mut Vec<MemoryRecord>) {
        if let Some((input, acc)) = &self.before {
            out.push(floats("block0.input", input));
            out.push(floats("caching.accumulated", &[*acc]));
        }
    }
}

impl Method for WholeStep {
    fn reads_signal(&self) -> bool {
        true
    }

    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Remembered::default())
    }

    fn recall(&self, rec: &Recall) -> Result<Box<dyn Memory>, String> {
        let before = match (
            rec.floats("block0.input"),
            rec.floats("caching.accumulated"),
        ) {
            (None, None) => None,
            (Some(input), Some(&[acc])) if input.len() % rec.tokens.max(1) == 0 => {
                Some((input.to_vec(), acc))
            }
            _ => return Err("whole-step caching's record is damaged".into()),
        };
        Ok(Box::new(Remembered { before }))
    }

    fn partition(&self, cfg: &RequestConfig, _: u32) -> (u32, bool) {
        (1, cfg.layout == LayoutKind::Uniform)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }

    /// Skips the step (advancing with the forecast or cached velocity) when the accumulated
    /// relative L1 change of block 0's modulated input is under the threshold.
    fn skip_step(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        _: f32,
    ) -> Result<bool, EngineError> {
        let t0 = Instant::now();
        let m = block0_input(model, r)?;
        let final_full = r.step + crate::engine::FINAL_FULL_STEPS >= r.cfg.steps;
        let below_cap = below_skip_cap(r);
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        let acc = match &memory.before {
            Some((prev, acc)) => acc + relative_l1(&m, prev),
            None => f32::INFINITY,
        };
        let skip = acc < r.cfg.cache_threshold && below_cap && !final_full;
        memory.before = Some((m, if skip { acc } else { 0.0 }));
        r.report.time.gate += t0.elapsed();
        if skip {
            forecast_whole_step(model, r);
        }
        Ok(skip)
    }
}
