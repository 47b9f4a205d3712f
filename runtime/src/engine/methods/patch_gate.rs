//! The paper's patch gate (§4.2), kept as an ablation of the change budget: saliency patches,
//! each computed while its normalised importance change is at least ε (at most K skips in a
//! row, one patch at least every step), every reused value forecast.

use flashdiff_models::Denoiser;

use super::{gate_choose, saliency_patches, Method};
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};

pub(super) struct PatchGate;

/// Partitions, ε and forecasting as the change budget has them; only the choice differs.
impl Method for PatchGate {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        saliency_patches(cfg, adaptive_r)
    }

    fn epsilon(&self, cfg: &RequestConfig) -> f32 {
        cfg.epsilon
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }

    fn choose(
        &self,
        _: &dyn Denoiser,
        r: &mut Request,
        load: f32,
        final_full: bool,
    ) -> Result<(), EngineError> {
        let adaptive = r.cfg.adaptive_epsilon;
        gate_choose(r, load, final_full, adaptive)
    }
}
