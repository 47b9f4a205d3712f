//! Region-adaptive sampling (RAS): each step recomputes the `ras_ratio` share of 2x2 token
//! regions whose velocity changed most; the rest stand in with their K/V and velocity
//! forecast along their slopes (`reuse: stale`: as last computed, as RAS's authors do);
//! dense steps at about 45% and 80% of the steps and at the end reset the error.

use flashdiff_models::Denoiser;
use flashdiff_partitioner::{Grid, PatchLayout};

use super::Method;
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};
use crate::state::Region;

pub(super) struct Ras;

impl Method for Ras {
    fn partition(&self, _: &RequestConfig, _: u32) -> (u32, bool) {
        (2, true)
    }

    fn choose(
        &self,
        model: &dyn Denoiser,
        r: &mut Request,
        _: f32,
        final_full: bool,
    ) -> Result<(), EngineError> {
        select(model, r, final_full).map_err(EngineError::Config)
    }

    fn forecasts(&self, cfg: &RequestConfig) -> bool {
        cfg.reuse.forecasts()
    }

    fn uses_gate(&self) -> bool {
        false
    }

    fn before_commit(&self, r: &mut Request) -> Result<(), EngineError> {
        r.ras_prev = Some(r.state.get(Region::Velocity).to_vec());
        Ok(())
    }
}

/// Patch 0 = the 2x2 regions whose velocity changed most in the last step (the `ras_ratio`
/// share), patch 1 = the rest, which runs only on dense steps.
fn select(model: &dyn Denoiser, r: &mut Request, final_full: bool) -> Result<(), String> {
    let dims = model.dims();
    let (frames, h, w, pd) = (
        dims.grid.frames,
        dims.grid.height,
        dims.grid.width,
        dims.channels,
    );
    let n = r.cfg.steps as f32;
    let dense = final_full
        || [0.45f32, 0.8]
            .iter()
            .any(|f| r.step == (f * n).round() as u32);
    let v = r.state.get(Region::Velocity);
    // Score of a token: spread over its channels of the velocity's last change.
    let score: Vec<f32> = (0..frames * h * w)
        .map(|t| {
            let cur = &v[t * pd..(t + 1) * pd];
            let diff: Vec<f32> = match &r.ras_prev {
                Some(p) => cur
                    .iter()
                    .zip(&p[t * pd..(t + 1) * pd])
                    .map(|(a, b)| a - b)
                    .collect(),
                None => cur.to_vec(),
            };
            let m = diff.iter().sum::<f32>() / pd as f32;
            (diff.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / pd as f32).sqrt()
        })
        .collect();
    // Regions: 2x2 tokens within a frame (2 consecutive tokens on a one-row grid).
    let (bh, bw) = (2.min(h), 2.min(w));
    let (rh, rw) = (h.div_ceil(bh), w.div_ceil(bw));
    let region_of = |t: usize| {
        let (f, y, x) = (t / (h * w), (t / w) % h, t % w);
        (f * rh + y / bh) * rw + x / bw
    };
    let count = frames * rh * rw;
    if count < 2 {
        return Err("RAS-style needs a latent of at least two regions".into());
    }
    let (mut sum, mut members) = (vec![0.0f32; count], vec![0usize; count]);
    for (t, &sc) in score.iter().enumerate() {
        sum[region_of(t)] += sc;
        members[region_of(t)] += 1;
    }
    let mut regions: Vec<(f32, usize)> = (0..count)
        .map(|q| (sum[q] / members[q].max(1) as f32, q))
        .collect();
    regions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let keep = ((r.cfg.ras_ratio * count as f32).round() as usize).clamp(1, count - 1);
    let mut kept = vec![false; count];
    for &(_, q) in &regions[..keep] {
        kept[q] = true;
    }
    let patch_of: Vec<u32> = (0..frames * h * w)
        .map(|t| u32::from(!kept[region_of(t)]))
        .collect();
    let grid = Grid::new(frames as u32, h as u32, w as u32).map_err(|e| e.to_string())?;
    for (dst, &p) in r.state.get_mut(Region::PatchOf).iter_mut().zip(&patch_of) {
        *dst = p as f32;
    }
    r.layout = Some(PatchLayout::from_assignment(grid, patch_of, 2).map_err(|e| e.to_string())?);
    r.active = vec![true, dense];
    Ok(())
}
