//! Random patches, the ablation of FlashDiff's choice: the gate decides how many patches a
//! step computes, exactly as in FlashDiff, but which ones is drawn at random (seeded by the
//! request's seed and the step), everything else equal. The gate learns from the patches
//! it chose that were also drawn.

use flashdiff_models::Denoiser;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::flashdiff::FlashDiff;
use super::Method;
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};
use crate::state::Region;

pub(super) struct RandomPatches;

impl Method for RandomPatches {
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
        FlashDiff.partition(cfg, adaptive_r)
    }

    fn epsilon(&self, cfg: &RequestConfig) -> f32 {
        FlashDiff.epsilon(cfg)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        FlashDiff.forecasts(cfg)
    }

    fn choose(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        load: f32,
        final_full: bool,
    ) -> Result<(), EngineError> {
        FlashDiff.choose(model, r, load, final_full)?;
        r.gate_chose.clone_from(&r.active);
        let k = r.active.iter().filter(|&&a| a).count();
        let patches = r.active.len();
        if k == patches {
            return Ok(());
        }
        let mut rng = StdRng::seed_from_u64(step_seed(r.cfg.seed, r.step));
        r.active.fill(false);
        for p in rand::seq::index::sample(&mut rng, patches, k) {
            r.active[p] = true;
        }
        Ok(())
    }

    fn feeds_gate(&self) -> bool {
        false
    }

    fn before_commit(&self, r: &mut Request) -> Result<(), EngineError> {
        let gate = r.gate.as_mut().expect("partitioned");
        let importance = r.state.get(Region::Importance);
        for (p, (&drawn, &chosen)) in r.active.iter().zip(&r.gate_chose).enumerate() {
            if drawn && chosen {
                gate.observe(p, importance[p])?;
            }
        }
        Ok(())
    }
}

/// The draw's seed for `step` of a request seeded `seed` (a different stream from its noise).
fn step_seed(seed: u64, step: u32) -> u64 {
    seed.rotate_left(17) ^ (u64::from(step) << 1 | 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
