//! Random patches, the ablation of the per-patch choice: the change budget per patch
//! ([`Mode::PerPatch`](crate::engine::Mode::PerPatch)) decides whether a step is computed and
//! how many patches run, but which ones is drawn at random (seeded by the request's seed and
//! the step), everything else equal; the budget restarts the drawn patches. The method is
//! the change budget with this draw as its pick ([`super::flashdiff::Pick::AtRandom`]).

use rand::rngs::StdRng;
use rand::SeedableRng;

/// Replaces the active patches with as many drawn at random (all of them stay all).
pub(super) fn draw(active: &mut [bool], seed: u64, step: u32) {
    let k = active.iter().filter(|&&a| a).count();
    let patches = active.len();
    if k < patches {
        let mut rng = StdRng::seed_from_u64(step_seed(seed, step));
        active.fill(false);
        for p in rand::seq::index::sample(&mut rng, patches, k) {
            active[p] = true;
        }
    }
}

/// The draw's seed for `step` of a request seeded `seed` (a different stream from its noise).
fn step_seed(seed: u64, step: u32) -> u64 {
    seed.rotate_left(17) ^ (u64::from(step) << 1 | 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
