//! The skipping methods: each decides which tokens a step computes and how the others are
//! stood in for. The engine asks a request's method at the few points where methods differ
//! (the partition after the warm-up, the start of a step, the choice of active patches, the
//! commit) and knows no method by name; adding a method is adding a file here and a
//! [`Mode`].

mod dbcache;
mod flashdiff;
mod full;
mod naive_patch;
mod no_skip;
mod patch_gate;
mod random_patches;
mod ras;
mod whole_step;

use flashdiff_models::{Denoiser, ModelError, StepInput, Tensor};

use super::forecast::forecast_velocity;
use super::request::Request;
use super::{adaptive_epsilon, EngineError, Mode, RequestConfig};
use crate::state::Region;

/// A skipping method. Methods hold no state of their own: what they remember between steps
/// lives in the request ([`Request::tea`], [`Request::budget`], [`Request::ras_dropped`]) so that checkpoints carry
/// it; what lasts one step only ([`Request::active`]) is set again every step.
pub(super) trait Method: Sync {
    /// How the warm-up's partition cuts the latent: the patch count (`adaptive_r` is the
    /// engine's adaptive controller's current choice) and whether the cut is uniform
    /// (`true`) or follows the saliency map.
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool);

    /// The gate's threshold ε (0 computes every patch every step).
    fn epsilon(&self, _cfg: &RequestConfig) -> f32 {
        0.0
    }

    /// Whether reused K/V and skipped velocities are forecast along their slopes
    /// (`forecast.rs`) rather than reused as last computed.
    fn forecasts(&self, _cfg: &RequestConfig) -> bool {
        false
    }

    /// At the start of a step: `true` when the method advanced the whole latent through the
    /// step without the model (whole-step caching).
    fn skip_step(
        &self,
        _model: &dyn Denoiser,
        _r: &mut Request,
        _load: f32,
    ) -> Result<bool, EngineError> {
        Ok(false)
    }

    /// Decides the step's active patches into `r.active` (every patch when `final_full`);
    /// by default the gate at its fixed threshold.
    fn choose(
        &self,
        _model: &dyn Denoiser,
        r: &mut Request,
        load: f32,
        final_full: bool,
    ) -> Result<(), EngineError> {
        gate_choose(r, load, final_full, false)
    }

    /// Whether the method decides through the paper's gate, which computed patches'
    /// refinement importance then feeds; a method that decides otherwise has no gate.
    fn uses_gate(&self) -> bool {
        true
    }

    /// Just before a step's fresh velocities are committed.
    fn before_commit(&self, _r: &mut Request) -> Result<(), EngineError> {
        Ok(())
    }

    /// Whether a patch attends only to its own tokens (patches denoised independently).
    fn isolated(&self) -> bool {
        false
    }

    /// The most monotasks a step runs in ([`RequestConfig::monotasks`]; `None` there: the
    /// engine's worker count).
    fn monotask_limit(&self, cfg: &RequestConfig, workers: u32) -> usize {
        cfg.monotasks.unwrap_or(workers) as usize
    }

    /// The share of a step's model work a step costs that [`Method::skip_step`] advanced
    /// without the whole model (DBCache runs its first blocks there); 0 by default.
    fn front_work(&self, _model: &dyn Denoiser) -> f64 {
        0.0
    }

    /// Whether a request without a fixed patch count informs the adaptive R controller.
    fn adapts_patches(&self) -> bool {
        true
    }
}

pub use dbcache::FRONT_BLOCKS;

/// The method that runs a request of `mode`.
pub(super) fn of(mode: Mode) -> &'static dyn Method {
    match mode {
        Mode::FlashDiff => &flashdiff::FlashDiff {
            share: 0.0,
            auto: false,
        },
        Mode::PerPatch => &flashdiff::FlashDiff {
            share: 1.0,
            auto: false,
        },
        Mode::Auto => &flashdiff::FlashDiff {
            share: 0.0,
            auto: true,
        },
        Mode::PatchGate => &patch_gate::PatchGate,
        Mode::NoSkip => &no_skip::NoSkip,
        Mode::Full => &full::Full,
        Mode::NaivePatch => &naive_patch::NaivePatch,
        Mode::TeaCache => &whole_step::WholeStep,
        Mode::DbCache => &dbcache::DbCache,
        Mode::Ras => &ras::Ras,
        Mode::RandomPatches => &random_patches::RandomPatches,
    }
}

/// The gate decides the active patches: every patch in the final steps (ε = 0 never skips,
/// and the gate records every patch as run), else at its threshold, or at the load's ε when
/// `adaptive`.
fn gate_choose(
    r: &mut Request,
    load: f32,
    final_full: bool,
    adaptive: bool,
) -> Result<(), EngineError> {
    let gate = r.gate.as_mut().expect("partitioned");
    let eps = if final_full {
        Some(0.0)
    } else if adaptive {
        let e = adaptive_epsilon(r.cfg.epsilon).epsilon(load);
        r.report.epsilon_sum += e as f64;
        r.report.epsilon_steps += 1;
        Some(e)
    } else {
        None
    };
    if let Some(e) = eps {
        gate.set_epsilon(e)?;
    }
    gate.decide(&mut r.active)?;
    Ok(())
}

/// The request's latent (`tokens x channels`) and its step's conditioning as tensors on the
/// model's device: what a method that runs part of the model itself passes it.
fn step_tensors(model: &dyn Denoiser, r: &Request) -> Result<(Tensor, Tensor), ModelError> {
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
    Ok((x, cond))
}

/// Block 0's modulated input for the whole latent at the request's step (`tokens x width`,
/// flattened): the cheap signal the accumulated-change rules read.
fn block0_input(model: &dyn Denoiser, r: &Request) -> Result<Vec<f32>, ModelError> {
    let (x, cond) = step_tensors(model, r)?;
    let step = StepInput {
        context: &r.context,
        cond: &cond,
    };
    Ok(model
        .first_block_input(&x, step)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// The relative L1 change from `prev` to `now`: `sum |now - prev| / sum |prev|`, the
/// measure the whole-latent caching rules threshold.
fn relative_l1(now: &[f32], prev: &[f32]) -> f32 {
    let num: f32 = now.iter().zip(prev).map(|(a, b)| (a - b).abs()).sum();
    let den: f32 = prev.iter().map(|b| b.abs()).sum::<f32>().max(1e-12);
    num / den
}

/// How much the model's time falls over step `step` of `steps` (the Euler update's step).
/// Whether a whole-step method may skip one more step: fewer than `max_skip` (K) of its last
/// steps were skipped in a row.
fn below_skip_cap(r: &Request) -> bool {
    let run = r
        .report
        .active_per_step
        .iter()
        .rev()
        .take_while(|&&a| a == 0)
        .count();
    run < r.cfg.max_skip as usize
}

pub(super) fn time_step(model: &dyn Denoiser, step: u32, steps: u32) -> f32 {
    model.time(step, steps) - model.time(step + 1, steps)
}

/// The Euler update of the request's step with the velocities in its state.
pub(super) fn euler(model: &dyn Denoiser, r: &mut Request) {
    let h = time_step(model, r.step, r.cfg.steps);
    let (v, x) = r.state.get_pair(Region::Velocity, Region::X);
    for (xi, vi) in x.iter_mut().zip(v) {
        *xi -= h * vi;
    }
}

/// Advances the whole latent through the request's step without the model: every token's
/// velocity forecast from its computed steps (or reused as last computed without a
/// forecaster), then the Euler update.
fn forecast_whole_step(model: &dyn Denoiser, r: &mut Request) {
    if let Some(tr) = r.track.as_ref() {
        forecast_velocity(&mut r.state, tr, r.step, model.dims().channels);
    }
    euler(model, r);
    r.step += 1;
    r.report.active_per_step.push(0);
    r.report.patch_steps += r.layout.as_ref().map_or(1, |l| l.patches() as u64);
}
