//! Full computation: one patch, computed every step (ordinary sampling; with fewer steps, the
//! fewer-steps baseline). The quality reference of every comparison.

use flashdiff_models::Denoiser;

use super::{gate_choose, Method};
use crate::engine::request::Request;
use crate::engine::{EngineError, LayoutKind, RequestConfig};

pub(super) struct Full;

impl Method for Full {
    fn partition(&self, cfg: &RequestConfig, _: u32) -> (u32, bool) {
        (1, cfg.layout == LayoutKind::Uniform)
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

    fn adapts_patches(&self) -> bool {
        false
    }
}
