//! DBCache (cache-dit's dual block cache, front 1 block and back 0, "F1B0"): every step after
//! the warm-up runs the first block over the whole latent. When the relative L1 change of
//! that block's residual (its output minus its input) since the last computed step is under
//! the request's `cache_threshold`, the remaining blocks are skipped: the residual they add is
//! forecast from the steps they last ran (TaylorSeer's orders 1 and 2; reused as last
//! computed with `reuse: stale`, DBCache without a forecaster) and the output layer reads the
//! first block's output plus that residual. Else the remaining blocks run. At most `max_skip`
//! (K) steps in a row are skipped (cache-dit's `max_continuous_cached_steps`). A skipped step
//! still costs the first block's share of a step's work ([`Method::front_work`]).

use std::time::Instant;

use flashdiff_models::{Denoiser, ModelError, StepInput, Tensor};

use super::{below_skip_cap, euler, relative_l1, step_tensors, Method};
use crate::engine::request::Request;
use crate::engine::series::Series;
use crate::engine::{EngineError, LayoutKind, RequestConfig, FINAL_FULL_STEPS};
use crate::state::Region;

/// Blocks [`Mode::DbCache`](crate::engine::Mode::DbCache) runs every step to decide (its
/// `Fn`); a model needs more than these to run it.
pub const FRONT_BLOCKS: usize = 1;

pub(super) struct DbCache;

impl Method for DbCache {
    fn partition(&self, cfg: &RequestConfig, _: u32) -> (u32, bool) {
        (1, cfg.layout == LayoutKind::Uniform)
    }

    fn adapts_patches(&self) -> bool {
        false
    }

    fn front_work(&self, model: &dyn Denoiser) -> f64 {
        FRONT_BLOCKS as f64 / model.depth().max(1) as f64
    }

    /// Runs the step itself, whether it computes the remaining blocks or forecasts them: the
    /// first block decides, so the step never reaches the patch scheduler.
    fn skip_step(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        _: f32,
    ) -> Result<bool, EngineError> {
        let t0 = Instant::now();
        let dims = model.dims();
        let (tokens, channels) = (dims.grid.tokens(), dims.channels);
        let (x, cond) = step_tensors(model, r)?;
        let step = StepInput {
            context: &r.context,
            cond: &cond,
        };
        let embedded = model.front(&x, step, 0)?;
        let front = model.front(&x, step, FRONT_BLOCKS)?;
        let residual = flat(&front - &embedded)?;
        if let Some(s) = r.series.as_ref().filter(|s| s.base.len() != residual.len()) {
            // Only a damaged or foreign checkpoint gets here: the model's hidden rows are
            // not what the forecast was made of.
            return Err(EngineError::Config(format!(
                "the forecast of the skipped blocks has {} values, the model's hidden rows {}",
                s.base.len(),
                residual.len()
            )));
        }
        let final_full = r.step + FINAL_FULL_STEPS >= r.cfg.steps;
        let change = match &r.tea {
            Some((prev, _)) if prev.len() == residual.len() => relative_l1(&residual, prev),
            _ => f32::INFINITY,
        };
        let skip = change < r.cfg.cache_threshold
            && below_skip_cap(r)
            && !final_full
            && r.series.is_some();
        let hidden = if skip {
            let series = r.series.as_ref().expect("checked above");
            let mut rest = vec![0.0f32; series.base.len()];
            series.predict(r.step, &mut rest);
            Tensor::from_vec(rest, front.dims(), model.device())
                .and_then(|rest| &front + rest)
                .map_err(ModelError::from)?
        } else {
            let hidden = model.rest(&front, step, FRONT_BLOCKS)?;
            let rest = flat(&hidden - &front)?;
            match r.series.as_mut() {
                Some(s) => {
                    if r.step > s.last + 1 {
                        // Resuming after skips: how wrong the forecast residual would be.
                        let mut predicted = vec![0.0f32; rest.len()];
                        s.predict(r.step, &mut predicted);
                        for (&p, &f) in predicted.iter().zip(&rest) {
                            r.report.reuse_err2 += ((f - p) as f64).powi(2);
                            r.report.reuse_norm2 += (f as f64).powi(2);
                        }
                    }
                    s.update(&rest, r.step)
                }
                None => r.series = Some(Series::start(rest, r.step, r.cfg.reuse.order())),
            }
            r.tea = Some((residual, 0.0));
            hidden
        };
        let v = flat(model.output(&hidden, step))?;
        if v.len() != tokens * channels {
            return Err(EngineError::Internal(format!(
                "the output layer gave {} values for a latent of {}",
                v.len(),
                tokens * channels
            )));
        }
        r.state.get_mut(Region::Velocity).copy_from_slice(&v);
        euler(model, r);
        r.report.active_per_step.push(u32::from(!skip));
        r.report.patch_steps += 1;
        if !skip {
            r.report.computed += 1;
            r.report.computed_tokens += tokens as u64;
        }
        r.step += 1;
        r.report.time.compute += t0.elapsed();
        Ok(true)
    }
}

/// A tensor result as its values, row-major.
fn flat<E: Into<ModelError>>(t: Result<Tensor, E>) -> Result<Vec<f32>, ModelError> {
    let t = t.map_err(Into::into)?;
    Ok(t.flatten_all()?.to_vec1()?)
}
