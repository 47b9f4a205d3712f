//! Full computation: one patch, computed every step (ordinary sampling; with fewer steps, the
//! fewer-steps baseline). The quality reference of every comparison.

use super::Method;
use crate::engine::{LayoutKind, RequestConfig};

pub(super) struct Full;

impl Method for Full {
    fn partition(&self, cfg: &RequestConfig, _: u32) -> (u32, bool) {
        (1, cfg.layout == LayoutKind::Uniform)
    }

    fn adapts_patches(&self) -> bool {
        false
    }
}
