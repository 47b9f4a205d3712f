//! Forecasting the values a step reuses instead of computing: every token's K/V and a skipped
//! token's velocity, extrapolated along their per-step slopes from committed state alone.

use flashdiff_models::Dims;
use flashdiff_partitioner::PatchLayout;

use super::newton;
use crate::state::{Region, SharedState};

/// Weight of the newest measurement in a token's K/V slope (an exponential average with the
/// previous slope) when a step runs in more than one monotask: raw one-step differences then
/// carry the displaced-K/V error of the step they came from, and extrapolating them would
/// double it. With one monotask per step nothing is displaced and the raw slope (weight 1) is
/// used. Velocities always follow their raw last slope. The measurements behind both are in
/// docs/benchmarks.md, "Defaults".
pub const KV_SLOPE_SMOOTHING: f32 = 0.5;

/// Per token: the last computed K, V (every block) and velocity, their per-step slopes, and
/// the step the token was last computed at.
pub(super) struct Track {
    /// Weight of the newest K/V slope measurement ([`KV_SLOPE_SMOOTHING`] or 1).
    pub(super) kv_weight: f32,
    pub(super) kv_base: [Vec<f32>; 2],
    pub(super) kv_slope: [Vec<f32>; 2],
    pub(super) v_base: Vec<f32>,
    pub(super) v_slope: Vec<f32>,
    /// Second divided differences of the velocities ([`super::Reuse::Extrapolate2`]; empty
    /// at first order).
    pub(super) v_curve: Vec<f32>,
    /// Share of the resume correction applied ([`super::Reuse::correction`]; 0: none).
    pub(super) correction: f32,
    /// Steps between each token's last two computations (0: one computation so far).
    pub(super) gap: Vec<u32>,
    pub(super) last: Vec<u32>,
}

impl Track {
    /// Starts tracking from the state the warm-up left: every token computed at `at`.
    /// Velocities are forecast to `order` 1 or 2; a resumed token's latent is corrected by
    /// `correction` of the difference interpolation makes ([`extrapolate`]).
    pub(super) fn start(
        state: &SharedState,
        at: u32,
        cfg: &Dims,
        kv_weight: f32,
        order: u8,
        correction: f32,
    ) -> Self {
        let kv = cfg.kv_layers * cfg.grid.tokens() * cfg.kv_dim;
        let vel = cfg.grid.tokens() * cfg.channels;
        Self {
            kv_weight,
            kv_base: [
                state.get(Region::CacheKeys).to_vec(),
                state.get(Region::CacheValues).to_vec(),
            ],
            kv_slope: [vec![0.0; kv], vec![0.0; kv]],
            v_base: state.get(Region::Velocity).to_vec(),
            v_slope: vec![0.0; vel],
            v_curve: if order >= 2 {
                vec![0.0; vel]
            } else {
                Vec::new()
            },
            correction,
            gap: vec![0; cfg.grid.tokens()],
            last: vec![at; cfg.grid.tokens()],
        }
    }
}

/// After step `n`'s commit (fresh rows already copied into `V`): updates the slopes of every
/// token computed in it and advances every skipped token's velocity along its slope to step
/// `n` (`V = base + (n - last) * slope`, before the Euler update). The K/V the next step
/// reads are written by [`write_cache`] once its monotasks are known. Runs on the
/// coordinator from committed state only, so the result stays independent of the packing.
/// Returns, over the tokens that resumed after a skip, the squared error of the velocity
/// extrapolation had predicted for them and the squared norm of the computed velocity.
pub(super) fn extrapolate(
    state: &mut SharedState,
    tr: &mut Track,
    layout: &PatchLayout,
    active: &[bool],
    n: u32,
    cfg: &Dims,
    h: &dyn Fn(u32) -> f32,
) -> (f64, f64) {
    if tr.correction > 0.0 {
        correct_resumed(state, tr, layout, active, n, cfg.channels, h);
    }
    let (mut err2, mut norm2) = (0.0f64, 0.0f64);
    let (tokens, d, depth, pd) = (cfg.grid.tokens(), cfg.kv_dim, cfg.kv_layers, cfg.channels);
    let fresh = [state.get(Region::FreshKeys), state.get(Region::FreshValues)];
    let fresh_vel = state.get(Region::FreshVelocity);
    for p in (0..layout.patches()).filter(|&p| active[p as usize]) {
        for &t in layout.patch_tokens(p) {
            let t = t as usize;
            let gap = n.saturating_sub(tr.last[t]).max(1) as f32;
            // One division per token, not per value (a vector divide per 4 values was most
            // of this loop's time).
            let (inv_gap, w) = (1.0 / gap, tr.kv_weight);
            for kv in 0..2 {
                for l in 0..depth {
                    let at = (l * tokens + t) * d;
                    let (base, slope) = (
                        &mut tr.kv_base[kv][at..at + d],
                        &mut tr.kv_slope[kv][at..at + d],
                    );
                    for ((b, sl), &f) in base.iter_mut().zip(slope).zip(&fresh[kv][at..at + d]) {
                        let measured = (f - *b) * inv_gap;
                        *sl += w * (measured - *sl);
                        *b = f;
                    }
                }
            }
            let r = t * pd..(t + 1) * pd;
            // The velocities follow Newton's form through their last computations (the
            // curve, at second order, through the last three, `before` the base).
            let before = tr.gap[t] as f32;
            let curve = if tr.v_curve.is_empty() {
                &mut [][..]
            } else {
                &mut tr.v_curve[r.clone()]
            };
            if gap > 1.0 {
                // A token resumed after a skip: what the forecast had predicted for it.
                newton::miss(
                    &tr.v_base[r.clone()],
                    &tr.v_slope[r.clone()],
                    curve,
                    &fresh_vel[r.clone()],
                    gap,
                    before,
                    (&mut err2, &mut norm2),
                );
            }
            newton::update(
                &mut tr.v_base[r.clone()],
                &mut tr.v_slope[r.clone()],
                curve,
                &fresh_vel[r],
                gap,
                before,
            );
            tr.gap[t] = gap as u32;
            tr.last[t] = n;
        }
    }
    forecast_velocity(state, tr, n, pd);
    (err2, norm2)
}

/// The resume correction ([`super::Reuse::Corrected`]), before [`extrapolate`] updates the
/// forecast: for every token computed at step `n` after skipped steps, the skipped steps'
/// Euler updates (`x -= h_s v_s`, `h(s)` the step's time decrease) used the forecast
/// `v_s = base + a slope (+ a (a + before) curve)`, `a = s - last`; the polynomial through the
/// computations that interpolates the new one differs from it by `a (measured - slope)` at
/// first order (`measured` the slope from the base to the new velocity) and by
/// `a (a + before) (curve' - curve)` at second order (`curve'` the second divided difference
/// through the new one; with no computation before the base, the line's difference). The
/// latent moves by `correction` of `-sum_s h_s (difference)`.
fn correct_resumed(
    state: &mut SharedState,
    tr: &Track,
    layout: &PatchLayout,
    active: &[bool],
    n: u32,
    pd: usize,
    h: &dyn Fn(u32) -> f32,
) {
    let (fresh, x) = state.get_pair(Region::FreshVelocity, Region::X);
    for p in (0..layout.patches()).filter(|&p| active[p as usize]) {
        for &t in layout.patch_tokens(p) {
            let t = t as usize;
            let (last, gap) = (tr.last[t], n.saturating_sub(tr.last[t]));
            if gap < 2 {
                continue;
            }
            let before = tr.gap[t] as f32;
            let (mut w1, mut w2) = (0.0f32, 0.0f32);
            for a in 1..gap {
                let h = h(last + a);
                let a = a as f32;
                w1 += h * a;
                w2 += h * a * (a + before);
            }
            let (w1, w2) = (w1 * tr.correction, w2 * tr.correction);
            let inv_gap = 1.0 / gap as f32;
            let r = t * pd..(t + 1) * pd;
            let (f, b, sl) = (
                &fresh[r.clone()],
                &tr.v_base[r.clone()],
                &tr.v_slope[r.clone()],
            );
            // Before a second computation (no computation before the base) the curve is
            // still 0, as the track starts, and both orders interpolate the line.
            if tr.v_curve.is_empty() || before == 0.0 {
                for (((xi, &f), &b), &sl) in x[r.clone()].iter_mut().zip(f).zip(b).zip(sl) {
                    *xi -= w1 * ((f - b) * inv_gap - sl);
                }
            } else {
                let c = &tr.v_curve[r.clone()];
                let to_curve = 1.0 / (gap as f32 + before);
                for ((((xi, &f), &b), &sl), &c) in x[r].iter_mut().zip(f).zip(b).zip(sl).zip(c) {
                    *xi -= w2 * (((f - b) * inv_gap - sl) * to_curve - c);
                }
            }
        }
    }
}

/// Writes into `V` every token's velocity forecast for step `n` from the last one computed
/// (`base + (n - last) slope`, at second order plus `(n - last) (n - last + gap) curve`);
/// tokens computed at step `n` keep theirs.
pub(super) fn forecast_velocity(state: &mut SharedState, tr: &Track, n: u32, pd: usize) {
    let v = state.get_mut(Region::Velocity);
    for (t, &last) in tr.last.iter().enumerate().filter(|(_, &l)| l < n) {
        let ahead = (n - last) as f32;
        let r = t * pd..(t + 1) * pd;
        // The parabola through the last three computations (`gap` before the base).
        let curve = if tr.v_curve.is_empty() {
            &[][..]
        } else {
            &tr.v_curve[r.clone()]
        };
        newton::predict(
            &mut v[r.clone()],
            &tr.v_base[r.clone()],
            &tr.v_slope[r],
            curve,
            ahead,
            tr.gap[t] as f32,
        );
    }
}

/// Writes into the K/V cache what the monotasks of step `n` read: the K/V of every token
/// with `read[t]`, extrapolated to step `n` (`base + (n - last) slope`). Rows no monotask
/// reads (the tokens of the only monotask of a step) are left as they are. From committed
/// state only, like [`extrapolate`].
pub(super) fn write_cache(state: &mut SharedState, tr: &Track, n: u32, read: &[bool], cfg: &Dims) {
    let (tokens, d) = (cfg.grid.tokens(), cfg.kv_dim);
    for (kv, region) in [Region::CacheKeys, Region::CacheValues]
        .into_iter()
        .enumerate()
    {
        let dst = state.get_mut(region);
        for l in 0..cfg.kv_layers {
            for (t, &last) in tr.last.iter().enumerate().filter(|&(t, _)| read[t]) {
                let ahead = n.saturating_sub(last) as f32;
                let at = (l * tokens + t) * d;
                let (base, slope) = (&tr.kv_base[kv][at..at + d], &tr.kv_slope[kv][at..at + d]);
                for ((o, &b), &sl) in dst[at..at + d].iter_mut().zip(base).zip(slope) {
                    *o = b + ahead * sl;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which tokens the `active` patches hold.
    fn tokens_of(layout: &PatchLayout, active: &[bool]) -> Vec<bool> {
        layout
            .patch_of()
            .iter()
            .map(|&p| active[p as usize])
            .collect()
    }

    /// [`tiny`]'s grid cut into two patches.
    fn two_patches() -> PatchLayout {
        flashdiff_partitioner::partition_uniform(
            flashdiff_partitioner::Grid::image(2, 2).unwrap(),
            2,
        )
        .unwrap()
    }

    fn tiny() -> Dims {
        // A 2x2 grid of 12-value tokens, one layer of width 2, two words.
        Dims {
            grid: flashdiff_models::LatentGrid {
                frames: 1,
                height: 2,
                width: 2,
            },
            channels: 12,
            kv_layers: 1,
            kv_dim: 2,
            words: 2,
            context_len: 2 + 2 * 2 * 2,
            cond_len: 6 * 2 + 2 * 2,
        }
    }

    /// K/V and velocities moving linearly with the step: the cache follows the smoothed slope
    /// and a skipped token's velocity its last slope, for tokens computed every step and for
    /// tokens skipped for a while.
    #[test]
    fn extrapolation_follows_a_linear_trajectory_through_skips() {
        // Averaged slopes (several monotasks per step) and raw ones (one monotask).
        for weight in [KV_SLOPE_SMOOTHING, 1.0] {
            linear_trajectory(weight);
        }
    }

    fn linear_trajectory(weight: f32) {
        let cfg = tiny();
        let (tokens, d, pd) = (cfg.grid.tokens(), cfg.kv_dim, cfg.channels);
        let layout = two_patches();
        let mut st = SharedState::create(crate::state::StateLayout::new(&cfg), None, 0).unwrap();
        // value(t, i, step) = 10 t + i + 0.5 step; the warm-up ended at step 0.
        let value = |t: usize, i: usize, step: u32| (10 * t + i) as f32 + 0.5 * step as f32;
        let fill =
            |st: &mut SharedState, region: Region, width: usize, step: u32, only: &[bool]| {
                let dst = st.get_mut(region);
                for t in (0..tokens).filter(|&t| only[t]) {
                    for i in 0..width {
                        dst[t * width + i] = value(t, i, step);
                    }
                }
            };
        let everyone = vec![true; tokens];
        fill(&mut st, Region::CacheKeys, d, 0, &everyone);
        fill(&mut st, Region::CacheValues, d, 0, &everyone);
        fill(&mut st, Region::Velocity, pd, 0, &everyone);
        let mut track = Track::start(&st, 0, &cfg, weight, 1, 0.0);
        // Patch 0 runs every step; patch 1 runs at steps 1 and 5 and is skipped in between.
        // Every measured slope is 0.5 (also across a gap); the averaged K/V slope after m
        // measurements is 0.5 (1 - (1 - weight)^m); the cache holds base + (n + 1 - last)
        // slope. A skipped token's velocity is base + (n - last) 0.5 once one slope was
        // measured.
        let smoothed = |m: i32| 0.5 * (1.0 - (1.0 - weight).powi(m));
        for n in 1..=5u32 {
            let active = [true, n == 1 || n == 5];
            let computed = tokens_of(&layout, &active);
            fill(&mut st, Region::FreshKeys, d, n, &everyone);
            fill(&mut st, Region::FreshValues, d, n, &everyone);
            fill(&mut st, Region::FreshVelocity, pd, n, &everyone);
            fill(&mut st, Region::Velocity, pd, n, &computed); // the commit's copy of fresh rows
            extrapolate(&mut st, &mut track, &layout, &active, n, &cfg, &|_| 0.0);
            write_cache(&mut st, &track, n + 1, &everyone, &cfg);
            for p in 0..2u32 {
                let (last, m) = match (p, n) {
                    (0, _) => (n, n as i32),
                    (_, 1..=4) => (1, 1),
                    _ => (5, 2),
                };
                for &t in layout.patch_tokens(p) {
                    let t = t as usize;
                    for region in [Region::CacheKeys, Region::CacheValues] {
                        for i in 0..d {
                            let want = value(t, i, last) + (n + 1 - last) as f32 * smoothed(m);
                            let got = st.get(region)[t * d + i];
                            assert!(
                                (got - want).abs() < 1e-5,
                                "weight {weight} step {n} token {t}: {got} vs {want}"
                            );
                        }
                    }
                    for i in 0..pd {
                        // Linear: the extrapolated velocity is the true one at step n.
                        let got = st.get(Region::Velocity)[t * pd + i];
                        assert!(
                            (got - value(t, i, n)).abs() < 1e-4,
                            "velocity step {n} token {t}: {got}"
                        );
                    }
                }
            }
        }
    }

    /// Velocities moving along a parabola in the step: at second order a skipped token's
    /// forecast is exact once three computations are known, also at uneven gaps, and the
    /// resumed token's prediction error is zero; at first order it is not.
    #[test]
    fn second_order_follows_a_quadratic_trajectory_through_uneven_skips() {
        let exact = quadratic_trajectory(2);
        assert!(exact < 1e-6, "second order: squared error {exact}");
        let first = quadratic_trajectory(1);
        assert!(first > 1.0, "first order cannot follow a parabola: {first}");
    }

    /// Runs patch 0 every step and patch 1 at steps 2, 3 and 7 (gaps 2, 1, 4) after a start at
    /// step 0, checking every forecast from the third computation on, and returns the
    /// squared prediction error summed over the forecasts and the resumes.
    fn quadratic_trajectory(order: u8) -> f64 {
        let cfg = tiny();
        let (tokens, pd) = (cfg.grid.tokens(), cfg.channels);
        let layout = two_patches();
        let mut st = SharedState::create(crate::state::StateLayout::new(&cfg), None, 0).unwrap();
        let value = |t: usize, i: usize, step: u32| {
            let s = step as f32;
            (t + i) as f32 - 0.3 * (i as f32) * s + 0.05 * (1 + t) as f32 * s * s
        };
        let fill = |st: &mut SharedState, region: Region, step: u32, only: &[bool]| {
            let dst = st.get_mut(region);
            for t in (0..tokens).filter(|&t| only[t]) {
                for i in 0..pd {
                    dst[t * pd + i] = value(t, i, step);
                }
            }
        };
        let everyone = vec![true; tokens];
        fill(&mut st, Region::Velocity, 0, &everyone);
        let mut track = Track::start(&st, 0, &cfg, 1.0, order, 0.0);
        let mut total = 0.0f64;
        for n in 1..=7u32 {
            let active = [true, [2, 3, 7].contains(&n)];
            let computed = tokens_of(&layout, &active);
            fill(&mut st, Region::FreshVelocity, n, &everyone);
            fill(&mut st, Region::Velocity, n, &computed);
            let (err2, _) = extrapolate(&mut st, &mut track, &layout, &active, n, &cfg, &|_| 0.0);
            if n == 7 {
                total += err2;
            }
            for &t in layout.patch_tokens(1) {
                let t = t as usize;
                if n > 3 {
                    for i in 0..pd {
                        let got = st.get(Region::Velocity)[t * pd + i];
                        total += ((got - value(t, i, n)) as f64).powi(2);
                    }
                }
            }
        }
        total
    }

    /// The resume correction, checked against an independent recomputation: with the whole
    /// correction the latent ends where Euler updates with the interpolating polynomial's
    /// velocities at the skipped steps (Lagrange's form through the computations around
    /// each run: the two ends at first order, the last three at second, the two ends after
    /// the first run) would have taken it; without it elsewhere; with half of it halfway.
    #[test]
    fn the_resume_correction_integrates_the_interpolated_velocities() {
        let (runs, hs, poly) = ([2u32, 3, 7], time_steps(8), [0.3f32, -0.05, 0.01]);
        for order in [1u8, 2] {
            let none = corrected_latent(order, 0.0, &runs, &hs, &poly);
            let off = agrees(order, &runs, &hs, &poly);
            assert!(
                off < 1e-4,
                "order {order}: {off} from the interpolated latent"
            );
            let want = interpolated_latent(order, &runs, &hs, &poly);
            let off = (0..want.len())
                .map(|i| (none[i] - want[i]).abs())
                .fold(0.0, f32::max);
            assert!(
                off > 1e-2,
                "order {order}: uncorrected already there ({off})"
            );
        }
    }

    proptest::proptest! {
        /// Any pattern of computed steps, any time steps, any cubic velocity: the corrected
        /// latent is the interpolated one, and half the correction lands halfway.
        #[test]
        fn the_resume_correction_matches_its_recomputation_for_any_runs(
            skips in proptest::collection::vec(0u32..4, 1..5),
            h in proptest::collection::vec(0.01f32..0.2, 20),
            poly in proptest::collection::vec(-0.1f32..0.1, 3),
            order in 1u8..3,
        ) {
            let mut runs = vec![];
            let mut at = 0;
            for s in skips {
                at += s + 1;
                runs.push(at);
            }
            let hs = h[..=at as usize].to_vec();
            let off = agrees(order, &runs, &hs, &poly);
            proptest::prop_assert!(off < 1e-3, "{off} from the interpolated latent");
        }
    }

    /// The largest distance of the corrected latent from the interpolated one (whole
    /// correction), or of the half-corrected one from halfway.
    fn agrees(order: u8, runs: &[u32], hs: &[f32], poly: &[f32]) -> f32 {
        let whole = corrected_latent(order, 1.0, runs, hs, poly);
        let none = corrected_latent(order, 0.0, runs, hs, poly);
        let half = corrected_latent(order, 0.5, runs, hs, poly);
        let want = interpolated_latent(order, runs, hs, poly);
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        (0..want.len())
            .map(|i| {
                let a = (whole[i] - want[i]).abs();
                let b = (half[i] - 0.5 * (whole[i] + none[i])).abs();
                a.max(b) / scale
            })
            .fold(0.0, f32::max)
    }

    /// Token `t`'s value `i` at `step`: `t + i` plus the polynomial `poly` (no constant term)
    /// in the step, scaled by the token.
    fn velocity(t: usize, i: usize, step: u32, poly: &[f32]) -> f32 {
        let s = step as f32;
        let scale = 1.0 + 0.1 * (t + i) as f32;
        (t + i) as f32 + scale * poly.iter().rev().fold(0.0, |acc, &c| (acc + c) * s)
    }

    fn time_steps(n: usize) -> Vec<f32> {
        (0..n).map(|s| 0.1 + 0.02 * s as f32).collect()
    }

    /// Patch 0 runs every step, patch 1 at `runs` (rising, after the start at 0; the last
    /// is the final step), velocities along [`velocity`], the latent from 0 by Euler updates
    /// over `hs`; returns patch 1's latent after the final step.
    fn corrected_latent(
        order: u8,
        correction: f32,
        runs: &[u32],
        hs: &[f32],
        poly: &[f32],
    ) -> Vec<f32> {
        let cfg = tiny();
        let (tokens, pd) = (cfg.grid.tokens(), cfg.channels);
        let layout = two_patches();
        let mut st = SharedState::create(crate::state::StateLayout::new(&cfg), None, 0).unwrap();
        let fill = |st: &mut SharedState, region: Region, step: u32, only: &[bool]| {
            let dst = st.get_mut(region);
            for t in (0..tokens).filter(|&t| only[t]) {
                for i in 0..pd {
                    dst[t * pd + i] = velocity(t, i, step, poly);
                }
            }
        };
        let euler = |st: &mut SharedState, h: f32| {
            let (v, x) = st.get_pair(Region::Velocity, Region::X);
            for (x, v) in x.iter_mut().zip(v) {
                *x -= h * v;
            }
        };
        let everyone = vec![true; tokens];
        st.get_mut(Region::X).fill(0.0);
        fill(&mut st, Region::Velocity, 0, &everyone);
        let mut track = Track::start(&st, 0, &cfg, 1.0, order, correction);
        euler(&mut st, hs[0]);
        for n in 1..=*runs.last().unwrap() {
            let active = [true, runs.contains(&n)];
            let computed = tokens_of(&layout, &active);
            fill(&mut st, Region::FreshVelocity, n, &everyone);
            fill(&mut st, Region::Velocity, n, &computed);
            extrapolate(&mut st, &mut track, &layout, &active, n, &cfg, &|s| {
                hs[s as usize]
            });
            euler(&mut st, hs[n as usize]);
        }
        let x = st.get(Region::X);
        layout
            .patch_tokens(1)
            .iter()
            .flat_map(|&t| x[t as usize * pd..(t as usize + 1) * pd].to_vec())
            .collect()
    }

    /// What [`corrected_latent`] should reach with the whole correction, recomputed with
    /// Lagrange's form of the interpolating polynomials.
    fn interpolated_latent(order: u8, runs: &[u32], hs: &[f32], poly: &[f32]) -> Vec<f32> {
        let cfg = tiny();
        let pd = cfg.channels;
        let layout = two_patches();
        let computed: Vec<u32> = std::iter::once(0).chain(runs.iter().copied()).collect();
        let lagrange = |points: &[u32], s: u32, value: &dyn Fn(u32) -> f64| -> f64 {
            let mut sum = 0.0;
            for (j, &pj) in points.iter().enumerate() {
                let mut w = 1.0;
                for (k, &pk) in points.iter().enumerate() {
                    if k != j {
                        w *= (s as f64 - pk as f64) / (pj as f64 - pk as f64);
                    }
                }
                sum += w * value(pj);
            }
            sum
        };
        let mut out = vec![];
        for &t in layout.patch_tokens(1) {
            for i in 0..pd {
                let value = |s: u32| velocity(t as usize, i, s, poly) as f64;
                let mut x = 0.0f64;
                for s in 0..=*runs.last().unwrap() {
                    let v = if computed.contains(&s) {
                        value(s)
                    } else {
                        // The computations on either side of the run, and at second order the
                        // one before it when there is one.
                        let end = computed.iter().position(|&c| c > s).unwrap();
                        let from = if order == 2 && end >= 2 {
                            end - 2
                        } else {
                            end - 1
                        };
                        lagrange(&computed[from..=end], s, &value)
                    };
                    x -= hs[s as usize] as f64 * v;
                }
                out.push(x as f32);
            }
        }
        out
    }
}
