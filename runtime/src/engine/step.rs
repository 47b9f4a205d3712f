//! One step after the warm-up: the method chooses the active patches, they are packed into
//! monotasks, and when the last one completes the step is committed.

use std::time::Instant;

use flashdiff_models::Denoiser;

use super::forecast::{extrapolate, write_cache, Track, KV_SLOPE_SMOOTHING};
use super::methods;
use super::packing::pack_monotasks;
use super::request::Request;
use super::{Engine, StepEvent, FINAL_FULL_STEPS};
use crate::state::Region;

impl Engine {
    pub(super) fn open_step(&mut self, id: u64, progress: &mut dyn FnMut(&StepEvent)) {
        // The engine's load, only for a request that follows it (the snapshot allocates).
        let load = match self.requests.get(&id) {
            Some(r) if r.cfg.adaptive_epsilon => {
                self.requests.len() as f32 / self.sched.load().alive.max(1) as f32
            }
            _ => 0.0,
        };
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        progress(&StepEvent {
            id,
            step: r.step,
            steps: r.cfg.steps,
            active: &r.active,
            patch_of: r.layout.as_ref().map(|l| l.patch_of()),
        });
        if r.step >= r.cfg.steps {
            return self.finish(id);
        }
        if self.checkpoints.is_some()
            && r.checkpointed
                .is_none_or(|t| t.elapsed() >= self.checkpoint_every)
        {
            r.checkpointed = Some(Instant::now());
            self.save_checkpoint(id);
        }
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let t0 = Instant::now();
        if r.conds.is_empty() {
            let ts: Vec<f32> = (0..r.cfg.steps)
                .map(|n| self.model.time(n, r.cfg.steps))
                .collect();
            match self
                .model
                .step_conds(&r.context, &ts)
                .and_then(|c| Ok(c.flatten_all()?.to_vec1::<f32>()?))
            {
                Ok(c) => r.conds = c,
                Err(e) => return self.fail(id, e.into()),
            }
        }
        r.report.time.compute += t0.elapsed();
        let method = methods::of(r.cfg.mode);
        match method.skip_step(&*self.model, r, load) {
            Ok(true) => return self.open_step(id, progress),
            Ok(false) => {}
            Err(e) => return self.fail(id, e),
        }
        let t0 = Instant::now();
        let final_full = r.step + FINAL_FULL_STEPS >= r.cfg.steps;
        if let Err(e) = method.choose(&*self.model, r, load, final_full) {
            return self.fail(id, e);
        }
        r.report.time.gate += t0.elapsed();
        let t0 = Instant::now();
        let list = Self::pack_step(&*self.model, r, self.workers);
        let len = self.model.dims().cond_len;
        let at = r.step as usize * len;
        let (conds, state) = (&r.conds, &mut r.state);
        state
            .get_mut(Region::Cond)
            .copy_from_slice(&conds[at..at + len]);
        r.report.time.compute += t0.elapsed();
        let step = r.step;
        let t0 = Instant::now();
        let submitted = self.sched.submit_step(id, step, &list);
        if let Some(r) = self.requests.get_mut(&id) {
            r.report.time.schedule += t0.elapsed();
        }
        if let Err(e) = submitted {
            self.fail(id, e.into());
        }
    }

    /// Packs the step's active patches into monotasks (numbered from 0, written to the
    /// state's monotask map), writes the extrapolated K/V rows they will read, counts the
    /// step in the report, and returns each monotask's cost (its tokens).
    pub(super) fn pack_step(
        model: &dyn Denoiser,
        r: &mut Request,
        workers: u32,
    ) -> Vec<(u32, f64)> {
        let layout = r.layout.as_ref().expect("partitioned");
        let active: Vec<(u32, usize)> = (0..layout.patches())
            .filter(|&p| r.active[p as usize])
            .map(|p| (p, layout.patch_tokens(p).len()))
            .collect();
        let monotask_of = pack_monotasks(
            &active,
            methods::of(r.cfg.mode).monotask_limit(&r.cfg, workers),
        );
        let which = r.state.get_mut(Region::Monotask);
        which.fill(-1.0);
        let mut cost = vec![0.0f64; monotask_of.last().map_or(0, |&m| m as usize + 1)];
        for (&(p, n), &m) in active.iter().zip(&monotask_of) {
            for &t in layout.patch_tokens(p) {
                which[t as usize] = m as f32;
            }
            cost[m as usize] += n as f64;
        }
        if let Some(tr) = r.track.as_ref() {
            // Every row a monotask reads: with one monotask, the skipped patches' tokens.
            let split = cost.len() > 1;
            let read: Vec<bool> = r
                .state
                .get(Region::Monotask)
                .iter()
                .map(|&m| split || m < 0.0)
                .collect();
            write_cache(&mut r.state, tr, r.step, &read, model.dims());
        }
        r.report.active_per_step.push(active.len() as u32);
        r.report.patch_steps += layout.patches() as u64;
        r.report.computed += active.len() as u64;
        r.report.computed_tokens += active.iter().map(|p| p.1 as u64).sum::<u64>();
        cost.iter()
            .enumerate()
            .map(|(m, &c)| (m as u32, c))
            .collect()
    }

    /// The step's barrier: every active patch-step wrote its fresh rows; commit them, feed the
    /// gate, and advance the whole latent.
    pub(super) fn commit_step(&mut self, id: u64) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let t0 = Instant::now();
        let cfg = self.model.dims();
        let (tokens, pd, d) = (cfg.grid.tokens(), cfg.channels, cfg.kv_dim);
        let method = methods::of(r.cfg.mode);
        if let Err(e) = method.before_commit(r) {
            return self.fail(id, e);
        }
        if r.track.is_none() && method.forecasts(&r.cfg) {
            // First commit after the warm-up, whose last step computed every token.
            let one = method.monotask_limit(&r.cfg, self.workers) == 1;
            let w = if one { 1.0 } else { KV_SLOPE_SMOOTHING };
            r.track = Some(Track::start(
                &r.state,
                r.step.saturating_sub(1),
                cfg,
                w,
                r.cfg.reuse.order(),
                r.cfg.reuse.correction(),
            ));
        }
        let layout = r.layout.as_ref().expect("partitioned");
        for p in (0..layout.patches()).filter(|&p| r.active[p as usize]) {
            for &t in layout.patch_tokens(p) {
                let t = t as usize;
                // With extrapolation, `write_cache` writes the rows the next step reads.
                if r.track.is_none() {
                    for l in 0..cfg.kv_layers {
                        let at = (l * tokens + t) * d;
                        let (src, dst) = r.state.get_pair(Region::FreshKeys, Region::CacheKeys);
                        dst[at..at + d].copy_from_slice(&src[at..at + d]);
                        let (src, dst) = r.state.get_pair(Region::FreshValues, Region::CacheValues);
                        dst[at..at + d].copy_from_slice(&src[at..at + d]);
                    }
                }
                let (src, dst) = r.state.get_pair(Region::FreshVelocity, Region::Velocity);
                dst[t * pd..(t + 1) * pd].copy_from_slice(&src[t * pd..(t + 1) * pd]);
            }
        }
        if let Some(tr) = r.track.as_mut() {
            let (model, steps) = (&*self.model, r.cfg.steps);
            let h = |s| methods::time_step(model, s, steps);
            let (e2, n2) = extrapolate(&mut r.state, tr, layout, &r.active, r.step, cfg, &h);
            r.report.reuse_err2 += e2;
            r.report.reuse_norm2 += n2;
        }
        methods::euler(&*self.model, r);
        r.step += 1;
        r.report.time.compute += t0.elapsed();
    }
}
