//! Whole-step caching (TeaCache / first-block-cache style): the whole step is skipped while
//! the accumulated relative L1 change of block 0's modulated input stays under the request's
//! `cache_threshold`, advancing every token with its velocity forecast from the computed
//! steps (TaylorSeer-style, first order; `reuse: stale` reuses the last one as TeaCache
//! does).

use std::time::Instant;

use flashdiff_models::{Denoiser, ModelError, StepInput, Tensor};

use super::Method;
use crate::engine::forecast::forecast_velocity;
use crate::engine::request::Request;
use crate::engine::{LayoutKind, RequestConfig};
use crate::state::Region;

pub(super) struct WholeStep;

impl Method for WholeStep {
    fn partition(&self, cfg: &RequestConfig, _: u32) -> (u32, bool) {
        (1, cfg.layout == LayoutKind::Uniform)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.extrapolate
    }

    /// Skips the step (advancing with the forecast or cached velocity) when the accumulated
    /// relative L1 change of block 0's modulated input is under the threshold.
    fn skip_step(&self, model: &dyn Denoiser, r: &mut Request) -> Result<bool, ModelError> {
        let t0 = Instant::now();
        let h = model.time(r.step, r.cfg.steps) - model.time(r.step + 1, r.cfg.steps);
        let dims = model.dims();
        let at = r.step as usize * dims.cond_len;
        let cond = Tensor::from_slice(
            &r.conds[at..at + dims.cond_len],
            dims.cond_len,
            model.device(),
        )?;
        let x = Tensor::from_slice(
            r.state.get(Region::X),
            (dims.grid.tokens(), dims.channels),
            model.device(),
        )?;
        let step = StepInput {
            context: &r.context,
            cond: &cond,
        };
        let m = model
            .first_block_input(&x, step)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let final_full = r.step + crate::engine::FINAL_FULL_STEPS >= r.cfg.steps;
        let acc = match &r.tea {
            Some((prev, acc)) => {
                let num: f32 = m.iter().zip(prev).map(|(a, b)| (a - b).abs()).sum();
                let den: f32 = prev.iter().map(|b| b.abs()).sum::<f32>().max(1e-12);
                acc + num / den
            }
            None => f32::INFINITY,
        };
        let skip = acc < r.cfg.cache_threshold && !final_full;
        r.tea = Some((m, if skip { acc } else { 0.0 }));
        r.report.time.gate += t0.elapsed();
        if skip {
            if let Some(tr) = r.track.as_ref() {
                forecast_velocity(&mut r.state, tr, r.step, dims.channels);
            }
            let (v, x) = r.state.get_pair(Region::Velocity, Region::X);
            for (xi, vi) in x.iter_mut().zip(v) {
                *xi -= h * vi;
            }
            r.step += 1;
            r.report.active_per_step.push(0);
            r.report.patch_steps += 1;
        }
        Ok(skip)
    }
}
