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

use super::{
    below_skip_cap, counts, euler, floats, memory_of, no_work_budget, relative_l1, step_tensors,
    Memory, Method, Recall,
};
use crate::checkpoint::MemoryRecord;
use crate::engine::request::Request;
use crate::engine::series::Series;
use crate::engine::{EngineError, LayoutKind, RequestConfig, FINAL_FULL_STEPS};
use crate::state::Region;

/// Blocks [`Mode::DbCache`](crate::engine::Mode::DbCache) runs every step to decide (its
/// `Fn`); a model needs more than these to run it.
pub const FRONT_BLOCKS: usize = 1;

pub(super) struct DbCache;

/// The first block's residual at the last computed step, and the forecast of the residual
/// the skipped blocks add.
#[derive(Default)]
struct Remembered {
    residual: Option<Vec<f32>>,
    series: Option<Series>,
}

impl Memory for Remembered {
    fn save(&self, out: &mut Vec<MemoryRecord>) {
        if let Some(r) = &self.residual {
            out.push(floats("dbcache.front_residual", r));
        }
        if let Some(s) = &self.series {
            out.push(floats("dbcache.rest.base", &s.base));
            out.push(floats("dbcache.rest.slope", &s.slope));
            out.push(floats("dbcache.rest.curve", &s.curve));
            out.push(counts("dbcache.rest.steps", &[s.gap, s.last]));
        }
    }
}

impl Method for DbCache {
    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Remembered::default())
    }

    /// Its parts of one width, a whole number of rows per token, the request's order, and
    /// a last computation before the step it continues from. Its width against the model's
    /// hidden rows is checked by the step that reads it.
    fn recall(&self, rec: &Recall) -> Result<Box<dyn Memory>, String> {
        let residual = rec.floats("dbcache.front_residual").map(<[f32]>::to_vec);
        let order = rec.cfg.reuse.order();
        let parts = (
            rec.floats("dbcache.rest.base"),
            rec.floats("dbcache.rest.slope"),
            rec.floats("dbcache.rest.curve"),
            rec.counts("dbcache.rest.steps"),
        );
        let series = match parts {
            (None, None, None, None) => None,
            (Some(base), Some(slope), Some(curve), Some(&[gap, last])) => Some(Series {
                base: base.to_vec(),
                slope: slope.to_vec(),
                curve: curve.to_vec(),
                gap,
                last,
            }),
            _ => return Err("the forecast of the skipped blocks is incomplete".into()),
        };
        let tokens = rec.tokens.max(1);
        if residual.as_ref().is_some_and(|r| r.len() % tokens != 0) {
            return Err("the first block's residual is not a whole number of token rows".into());
        }
        if let Some(s) = &series {
            let n = s.base.len();
            if !s.well_formed(order)
                || n == 0
                || n % tokens != 0
                || residual.as_ref().is_some_and(|r| r.len() != n)
                || s.last >= rec.step
            {
                return Err(format!(
                    "the forecast of the skipped blocks is damaged ({n} values at order {}, \
                     for {tokens} tokens at order {order}, last computed at step {} of {})",
                    s.order(),
                    s.last,
                    rec.step
                ));
            }
        }
        Ok(Box::new(Remembered { residual, series }))
    }

    /// A model that runs its blocks apart, deeper than the blocks that decide; no work
    /// budget (its threshold sets its work).
    fn check(&self, model: &dyn Denoiser, cfg: &RequestConfig) -> Result<(), EngineError> {
        no_work_budget(cfg)?;
        if model.depth() <= FRONT_BLOCKS {
            return Err(EngineError::Invalid {
                field: "mode",
                reason: format!(
                    "dbcache runs the model's first block alone; {} runs its blocks only all \
                     together",
                    model.name()
                ),
            });
        }
        Ok(())
    }

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
        let final_full = r.step + FINAL_FULL_STEPS >= r.cfg.steps;
        let below_cap = below_skip_cap(r);
        let memory = memory_of::<Remembered>(&mut r.memory)?;
        if let Some(s) = memory
            .series
            .as_ref()
            .filter(|s| s.base.len() != residual.len())
        {
            // Only a damaged or foreign checkpoint gets here: the model's hidden rows are
            // not what the forecast was made of.
            return Err(EngineError::Config(format!(
                "the forecast of the skipped blocks has {} values, the model's hidden rows {}",
                s.base.len(),
                residual.len()
            )));
        }
        let change = match &memory.residual {
            Some(prev) if prev.len() == residual.len() => relative_l1(&residual, prev),
            _ => f32::INFINITY,
        };
        let skip =
            change < r.cfg.cache_threshold && below_cap && !final_full && memory.series.is_some();
        let hidden = match (&mut memory.series, skip) {
            (Some(series), true) => {
                let mut rest = vec![0.0f32; series.base.len()];
                series.predict(r.step, &mut rest);
                Tensor::from_vec(rest, front.dims(), model.device())
                    .and_then(|rest| &front + rest)
                    .map_err(ModelError::from)?
            }
            (series, _) => {
                let hidden = model.rest(&front, step, FRONT_BLOCKS)?;
                let rest = flat(&hidden - &front)?;
                match series {
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
                    None => *series = Some(Series::start(rest, r.step, r.cfg.reuse.order())),
                }
                memory.residual = Some(residual);
                hidden
            }
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
