//! NaivePatch: uniform patches denoised independently (attention inside the patch only), one
//! monotask each, stitched every step; nothing skipped.

use super::Method;
use crate::engine::RequestConfig;

pub(super) struct NaivePatch;

impl Method for NaivePatch {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        (cfg.patches.unwrap_or(adaptive_r), true)
    }

    fn isolated(&self) -> bool {
        true
    }

    fn monotask_limit(&self, _: &RequestConfig, _: u32) -> usize {
        usize::MAX
    }
}
