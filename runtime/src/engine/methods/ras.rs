//! Region-adaptive sampling (RAS, Liu et al. 2025): each step recomputes the `ras_ratio` share
//! of 2x2 token regions with the highest score; the rest stand in with their K/V and velocity
//! forecast along their slopes (`reuse: stale`: as last computed, as RAS's authors do); dense
//! steps at about 45% and 80% of the steps and at the end reset the error.
//!
//! The score is RAS's: the spread (standard deviation over channels) of the model's last
//! output at each token, averaged over the region, times `exp(STARVATION * d)` where `d`
//! counts the steps the region was left out, so a region left out long enough is recomputed
//! (the authors' starvation term, at their default scale 0.1). Where this departs from the
//! reference code: the authors' script sorts the scores ascending and, at its default
//! `high_ratio` of 1, caches the highest; this recomputes the highest, the reading under which
//! the starvation term (which raises the scores of regions left out) prevents starvation.
//! Regions are 2x2 tokens here (the reference's unit is one DiT token of 2x2 latent pixels;
//! the built-in models' tokens are already patches of the latent).

use flashdiff_models::Denoiser;
use flashdiff_partitioner::{Grid, PatchLayout};

use super::{floats, memory_of, Memory, Method, Recall};
use crate::checkpoint::MemoryRecord;
use crate::engine::request::Request;
use crate::engine::{EngineError, RequestConfig};
use crate::state::Region;

pub(super) struct Ras;

/// Per 2x2 region, the steps it was left out (its starvation term).
#[derive(Default)]
struct Remembered {
    dropped: Option<Vec<f32>>,
}

impl Memory for Remembered {
    fn save(&self, out: &mut Vec<MemoryRecord>) {
        if let Some(d) = &self.dropped {
            out.push(floats("ras.dropped", d));
        }
    }
}

impl Method for Ras {
    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Remembered::default())
    }

    /// No more counts than tokens; their number against the latent's regions is checked by
    /// the step that reads them.
    fn recall(&self, rec: &Recall) -> Result<Box<dyn Memory>, String> {
        let dropped = rec.floats("ras.dropped").map(<[f32]>::to_vec);
        if dropped.as_ref().is_some_and(|d| d.len() > rec.tokens) {
            return Err("RAS's starvation counts outnumber the tokens".into());
        }
        Ok(Box::new(Remembered { dropped }))
    }

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
}

/// The authors' starvation scale: a region's score grows by `exp(STARVATION)` for each step
/// it was left out.
pub const STARVATION: f32 = 0.1;

/// Patch 0 = the 2x2 regions with the highest score (the `ras_ratio` share; see the module
/// docs), patch 1 = the rest, which runs only on dense steps.
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
    // Score of a token: spread over its channels of the model's last output there.
    let score: Vec<f32> = (0..frames * h * w)
        .map(|t| {
            let cur = &v[t * pd..(t + 1) * pd];
            let m = cur.iter().sum::<f32>() / pd as f32;
            (cur.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / pd as f32).sqrt()
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
    let memory = memory_of::<Remembered>(&mut r.memory).map_err(|e| e.to_string())?;
    let dropped = memory.dropped.get_or_insert_with(|| vec![0.0; count]);
    if dropped.len() != count {
        return Err(format!(
            "RAS's starvation counts cover {} regions, the latent has {count}",
            dropped.len()
        ));
    }
    let mut regions: Vec<(f32, usize)> = (0..count)
        .map(|q| {
            let spread = sum[q] / members[q].max(1) as f32;
            (spread * (STARVATION * dropped[q]).exp(), q)
        })
        .collect();
    regions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let keep = ((r.cfg.ras_ratio * count as f32).round() as usize).clamp(1, count - 1);
    let mut kept = vec![false; count];
    for &(_, q) in &regions[..keep] {
        kept[q] = true;
    }
    if !dense {
        for (d, &k) in dropped.iter_mut().zip(&kept) {
            if !k {
                *d += 1.0;
            }
        }
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
