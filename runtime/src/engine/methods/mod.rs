//! The skipping methods: each decides which tokens a step computes and how the others are
//! stood in for. The engine asks a request's method at the few points where methods differ
//! (the partition after the warm-up, the start of a step, the choice of active patches, the
//! commit) and knows no method by name; adding a method is adding a file here and a
//! [`Mode`].

mod flashdiff;
mod full;
mod naive_patch;
mod no_skip;
mod random_patches;
mod ras;
mod whole_step;

use flashdiff_models::{Denoiser, ModelError};

use super::request::Request;
use super::{adaptive_epsilon, EngineError, Mode, RequestConfig};

/// A skipping method. Methods hold no state of their own: what they remember between steps
/// lives in the request ([`Request::tea`], [`Request::ras_prev`]) so that checkpoints carry
/// it; what lasts one step only ([`Request::gate_chose`]) is set again by every `choose`.
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
    fn skip_step(&self, _model: &dyn Denoiser, _r: &mut Request) -> Result<bool, ModelError> {
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

    /// Whether computed patches' refinement importance feeds the gate.
    fn feeds_gate(&self) -> bool {
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

    /// Whether a request without a fixed patch count informs the adaptive R controller.
    fn adapts_patches(&self) -> bool {
        true
    }
}

/// The method that runs a request of `mode`.
pub(super) fn of(mode: Mode) -> &'static dyn Method {
    match mode {
        Mode::FlashDiff => &flashdiff::FlashDiff,
        Mode::NoSkip => &no_skip::NoSkip,
        Mode::Full => &full::Full,
        Mode::NaivePatch => &naive_patch::NaivePatch,
        Mode::TeaCache => &whole_step::WholeStep,
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
