//! Every patch every step, each monotask reading the others' displaced K/V: with uniform
//! patches, one per worker and stale K/V, DistriFusion's scheme.

use super::Method;
use crate::engine::{LayoutKind, RequestConfig};

pub(super) struct NoSkip;

impl Method for NoSkip {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        (
            cfg.patches.unwrap_or(adaptive_r),
            cfg.layout == LayoutKind::Uniform,
        )
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }
}
