//! FlashDiff (§4): saliency patches, each computed only while its predicted change exceeds the
//! gate's threshold, with every reused value forecast.

use flashdiff_models::Denoiser;

use super::{gate_choose, Method};
use crate::engine::request::Request;
use crate::engine::{EngineError, LayoutKind, RequestConfig};

pub(super) struct FlashDiff;

impl Method for FlashDiff {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        (
            cfg.patches.unwrap_or(adaptive_r),
            cfg.layout == LayoutKind::Uniform,
        )
    }

    fn epsilon(&self, cfg: &RequestConfig) -> f32 {
        cfg.epsilon
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.extrapolate
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
