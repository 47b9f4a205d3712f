//! NaivePatch: uniform patches denoised independently (attention inside the patch only), one
//! monotask each, stitched every step; nothing skipped.

use flashdiff_models::Denoiser;

use super::{gate_choose, Method};
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};

pub(super) struct NaivePatch;

impl Method for NaivePatch {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        (cfg.patches.unwrap_or(adaptive_r), true)
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

    fn isolated(&self) -> bool {
        true
    }

    fn monotask_limit(&self, _: &RequestConfig, _: u32) -> usize {
        usize::MAX
    }
}
