//! Random patches, the ablation of the per-patch choice: the change budget per patch
//! ([`Mode::PerPatch`](crate::engine::Mode::PerPatch)) decides whether a step is computed and
//! how many patches run, but which ones is drawn at random (seeded by the request's seed and
//! the step), everything else equal; the budget restarts the drawn patches.

use flashdiff_models::Denoiser;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::flashdiff::FlashDiff;
use super::Method;
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};

pub(super) struct RandomPatches;

const PER_PATCH: FlashDiff = FlashDiff {
    share: 1.0,
    auto: false,
};

impl Method for RandomPatches {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        PER_PATCH.partition(cfg, adaptive_r)
    }

    fn epsilon(&self, cfg: &RequestConfig) -> f32 {
        PER_PATCH.epsilon(cfg)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        PER_PATCH.forecasts(cfg)
    }

    fn skip_step(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        load: f32,
    ) -> Result<bool, EngineError> {
        PER_PATCH.skip_step(model, r, load)
    }

    fn choose(
        &self,
        _: &dyn Denoiser,
        r: &mut Request,
        _: f32,
        _: bool,
    ) -> Result<(), EngineError> {
        let k = r.active.iter().filter(|&&a| a).count();
        let patches = r.active.len();
        if k < patches {
            let mut rng = StdRng::seed_from_u64(step_seed(r.cfg.seed, r.step));
            r.active.fill(false);
            for p in rand::seq::index::sample(&mut rng, patches, k) {
                r.active[p] = true;
            }
        }
        r.budget.as_mut().expect("decided").ran(&r.active)?;
        Ok(())
    }

    fn uses_gate(&self) -> bool {
        false
    }
}

/// The draw's seed for `step` of a request seeded `seed` (a different stream from its noise).
fn step_seed(seed: u64, step: u32) -> u64 {
    seed.rotate_left(17) ^ (u64::from(step) << 1 | 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
