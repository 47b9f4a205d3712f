//! Every patch every step, each monotask reading the others' displaced K/V: with uniform
//! patches, one per worker and stale K/V, DistriFusion's scheme.

use flashdiff_models::Denoiser;

use super::{gate_choose, Method};
use crate::engine::request::Request;
use crate::engine::{EngineError, LayoutKind, RequestConfig};

pub(super) struct NoSkip;

impl Method for NoSkip {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        (
            cfg.patches.unwrap_or(adaptive_r),
            cfg.layout == LayoutKind::Uniform,
        )
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
        gate_choose(r, load, final_full, false)
    }
}
