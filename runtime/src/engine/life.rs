//! A request's life: admitted with its noise and conditioning, warmed up, partitioned, stepped
//! (step.rs), finished and decoded, or failed.

use std::time::{Duration, Instant};

use flashdiff_models::{Conditioning, ModelError, Tensor};
use flashdiff_partitioner::{
    objective, partition_saliency, partition_uniform, saliency_map, Grid, PartitionError,
};
use flashdiff_scheduler::{Completion, Tag, WARMUP_MONOTASK};

use super::methods;
use super::request::Request;
use super::window;
use super::workers::Executor;
use super::{
    Engine, EngineError, Output, Report, RequestConfig, StepEvent, TimeSplit, QUALITY_WEIGHT,
};
use crate::checkpoint;
use crate::exec::{self, Task};
use crate::proc::Order;
use crate::state::{Region, SharedState};

/// Gaussian noise from a seed (SplitMix64 + Box-Muller): the same seed gives the same latent.
pub fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed ^ 0x5DEE_CE66_D1CE_4E5D;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let (u1, u2) = (next().max(1e-300), next());
        let r = (-2.0 * u1.ln()).sqrt();
        out.push((r * (2.0 * std::f64::consts::PI * u2).cos()) as f32);
        out.push((r * (2.0 * std::f64::consts::PI * u2).sin()) as f32);
    }
    out.truncate(n);
    out
}

impl Engine {
    /// Admits a request. Prompt and settings are checked here, so a bad request fails alone.
    pub fn submit(&mut self, id: u64, prompt: &str, cfg: RequestConfig) -> Result<(), EngineError> {
        self.check_admission(id, &cfg)?;
        let submitted = Instant::now();
        let c = self.model.condition(prompt)?;
        self.admit(id, prompt, c, cfg, submitted)
    }

    /// [`Engine::submit`] with the prompt already conditioned by this engine's model
    /// ([`Engine::shared_model`]'s `condition`), so that a caller that checks prompts before
    /// it queues them (a server) encodes each prompt once. The conditioning's sizes are
    /// checked against the model.
    pub fn submit_conditioned(
        &mut self,
        id: u64,
        prompt: &str,
        c: Conditioning,
        cfg: RequestConfig,
    ) -> Result<(), EngineError> {
        self.check_admission(id, &cfg)?;
        let dims = self.model.dims();
        if c.context.len() != dims.context_len
            || c.salient.len() != c.words.len()
            || c.words.len() > dims.words
        {
            return Err(EngineError::Invalid {
                field: "prompt",
                reason: format!(
                    "conditioning of {} values and {} words does not fit this model ({} values, \
                     at most {} words)",
                    c.context.len(),
                    c.words.len(),
                    dims.context_len,
                    dims.words
                ),
            });
        }
        self.admit(id, prompt, c, cfg, Instant::now())
    }

    fn check_admission(&self, id: u64, cfg: &RequestConfig) -> Result<(), EngineError> {
        self.validate(cfg)?;
        if self.requests.contains_key(&id) {
            return Err(EngineError::Invalid {
                field: "id",
                reason: format!("{id}: a request with this id is already in flight"),
            });
        }
        Ok(())
    }

    fn admit(
        &mut self,
        id: u64,
        prompt: &str,
        c: Conditioning,
        cfg: RequestConfig,
        submitted: Instant,
    ) -> Result<(), EngineError> {
        let dims = self.model.dims().clone();
        let context = Tensor::from_slice(&c.context, c.context.len(), self.model.device())
            .map_err(ModelError::from)?;
        let tokens = dims.grid.tokens();
        let mut state = SharedState::create(self.layout.clone(), self.shm.as_deref(), id).map_err(
            |source| EngineError::Io {
                what: "cannot create request state".into(),
                source,
            },
        )?;
        state
            .get_mut(Region::X0)
            .copy_from_slice(&noise(cfg.seed, tokens * dims.channels));
        state.get_mut(Region::Context).copy_from_slice(&c.context);
        // Deadlines on the engine's clock: seconds since it was built.
        let deadline = cfg
            .deadline
            .map(|d| (submitted + d - self.origin).as_secs_f64());
        self.submissions += 1;
        self.start_or_wait(window::Waiting {
            id,
            priority: cfg.priority,
            warmup_cost: (cfg.warmup as usize * tokens) as f64,
            deadline,
            seq: self.submissions,
        })?;
        let req = Request {
            salient: c.salient,
            context,
            conds: Vec::new(),
            state,
            layout: None,
            step: 0,
            active: Vec::new(),
            report: Report {
                id,
                steps: cfg.steps,
                warmup: cfg.warmup,
                patches: 0,
                patch_steps: 0,
                computed: 0,
                computed_tokens: 0,
                active_per_step: Vec::new(),
                time: TimeSplit {
                    io: submitted.elapsed(),
                    ..TimeSplit::default()
                },
                latency: Duration::ZERO,
                work_skipped: 0.0,
                flops: super::FlopsCount::default(),
                epsilon_sum: 0.0,
                epsilon_steps: 0,
                reuse_err2: 0.0,
                reuse_norm2: 0.0,
                choice: None,
                deadline_met: None,
            },
            prompt: prompt.to_string(),
            submitted_unix: std::time::SystemTime::now(),
            memory: methods::of(cfg.mode).memory(),
            cfg,
            submitted,
            track: None,
            checkpointed: None,
        };
        self.requests.insert(id, req);
        Ok(())
    }
}

/// A request's life after admission: completed monotasks, the warm-up's end, the end.
impl Engine {
    pub(super) fn account(&mut self, tag: Tag, d: Duration) {
        if let Some(r) = self.requests.get_mut(&tag.request) {
            if tag.monotask == WARMUP_MONOTASK {
                r.report.time.warmup += d;
            } else {
                r.report.time.compute += d;
            }
        }
    }

    pub(super) fn completed(&mut self, w: u32, tag: Tag, progress: &mut dyn FnMut(&StepEvent)) {
        let t0 = Instant::now();
        let done = self.sched.complete(w, tag);
        if let Some(r) = self.requests.get_mut(&tag.request) {
            r.report.time.schedule += t0.elapsed();
        }
        match done {
            Ok(Completion::WarmupDone(id)) => {
                if let Some(r) = self.requests.get_mut(&id) {
                    r.step = r.cfg.warmup;
                }
                self.after_warmup(id);
                self.open_step(id, progress);
            }
            Ok(Completion::StepDone(id, _)) => {
                self.commit_step(id);
                self.open_step(id, progress);
            }
            Ok(_) => {}
            Err(e) => self.fail(tag.request, EngineError::Scheduler(e)),
        }
    }

    pub(super) fn failed(&mut self, w: u32, tag: Tag, why: String) {
        log::warn!("monotask {tag} failed on worker {w}: {why}");
        match self.sched.fail(w, tag) {
            Ok(Completion::RequestFailed(id)) => self.fail(
                id,
                EngineError::Config(format!("monotask {tag} failed repeatedly: {why}")),
            ),
            Ok(_) => {}
            Err(e) => self.fail(tag.request, EngineError::Scheduler(e)),
        }
    }

    pub(super) fn execute_here(&mut self, tag: Tag) -> Result<(), String> {
        let Some(r) = self.requests.get_mut(&tag.request) else {
            return Ok(());
        };
        let task = if tag.monotask == WARMUP_MONOTASK {
            Task::Warmup {
                steps: r.cfg.steps,
                warmup: r.cfg.warmup,
            }
        } else {
            Task::Patches {
                monotask: tag.monotask,
                isolated: methods::of(r.cfg.mode).isolated(),
            }
        };
        exec::run(&*self.model, &mut r.state, task)
    }

    pub(super) fn after_warmup(&mut self, id: u64) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let t0 = Instant::now();
        let dims = self.model.dims();
        let g = dims.grid;
        let grid = match Grid::new(g.frames as u32, g.height as u32, g.width as u32) {
            Ok(g) => g,
            Err(e) => return self.fail(id, e.into()),
        };
        let (r_count, uniform) =
            methods::of(r.cfg.mode).partition(&r.cfg, self.granularity.current());
        // Saliency over the prompt's real words (padding excluded).
        let n_words = r.salient.len();
        let tokens = g.tokens();
        let mt = dims.words;
        let cross = r.state.get(Region::Cross);
        let attn: Vec<f32> = (0..tokens)
            .flat_map(|t| cross[t * mt..t * mt + n_words].to_vec())
            .collect();
        let salient = &r.salient;
        let layout = match saliency_map(&attn, tokens, salient).and_then(|s| {
            if uniform {
                partition_uniform(grid, r_count)
            } else {
                partition_saliency(grid, &s, r_count)
            }
        }) {
            Ok(l) => l,
            Err(PartitionError::NoSalientTokens) => match partition_uniform(grid, r_count) {
                Ok(l) => l,
                Err(e) => return self.fail(id, e.into()),
            },
            Err(e) => return self.fail(id, e.into()),
        };
        for (dst, &p) in r
            .state
            .get_mut(Region::PatchOf)
            .iter_mut()
            .zip(layout.patch_of())
        {
            *dst = p as f32;
        }
        r.report.patches = layout.patches();
        r.active = vec![false; layout.patches() as usize];
        r.layout = Some(layout);
        r.report.time.partition += t0.elapsed();
    }

    pub(super) fn finish(&mut self, id: u64) {
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        let _ = self.sched.finish(id);
        self.forget(id);
        self.start_waiting();
        let cfg = self.model.dims();
        let t0 = Instant::now();
        let latent = r.state.get(Region::X).to_vec();
        let sample = match self.model.decode(&latent) {
            Ok(s) => s,
            Err(e) => {
                self.finished.push(Err((id, e.into())));
                return;
            }
        };
        r.report.time.io += t0.elapsed();
        r.report.latency = r.submitted.elapsed();
        r.report.deadline_met = r.cfg.deadline.map(|d| r.report.latency <= d);
        let t = &r.report.time;
        r.report.time.queue = r
            .report
            .latency
            .saturating_sub(t.warmup + t.partition + t.gate + t.compute + t.schedule + t.io);
        let layout = r.layout.take().expect("partitioned");
        // Work: warm-up steps are full; after that, the tokens actually computed, plus the
        // rows a forward computes whatever it is asked (a joint model's text stream) once
        // for every step that computed anything.
        let row = cfg.grid.tokens() as f64 + self.model.fixed_rows() as f64;
        let stepped = r.report.active_per_step.iter().filter(|&&a| a > 0).count() as f64;
        // A step a method advanced with part of the model (DBCache's first block) costs
        // that part of a step.
        let front = methods::of(r.cfg.mode).front_work(&*self.model);
        let partial = r.report.active_per_step.len() as f64 - stepped;
        let done = r.cfg.warmup as f64 * row
            + r.report.computed_tokens as f64
            + stepped * self.model.fixed_rows() as f64
            + partial * front * row;
        r.report.work_skipped = (1.0 - done / (r.cfg.steps as f64 * row)).max(0.0);
        let f = self.model.flops();
        let tokens = cfg.grid.tokens();
        let watched = if methods::of(r.cfg.mode).reads_signal() {
            r.report.active_per_step.len() as f64
        } else {
            0.0
        };
        let steps = r.cfg.steps as f64;
        r.report.flops = super::FlopsCount {
            run: r.cfg.warmup as f64 * f.step(tokens)
                + r.report.computed_tokens as f64 * f.per_token
                + stepped * f.per_step
                + (steps - r.cfg.warmup as f64) * f.every_step
                + partial * front * (f.step(tokens) - f.every_step)
                + watched * tokens as f64 * f.signal_per_token,
            full: steps * f.step(tokens),
            counted: f.counted,
        };
        if r.cfg.patches.is_none() && methods::of(r.cfg.mode).adapts_patches() {
            // The request's own time (its queueing belongs to the other requests' load) and
            // the paper's quality term: how wrong the skipped steps' stand-ins were.
            let own = r.report.latency.saturating_sub(r.report.time.queue);
            let cost = objective(
                own.as_secs_f64(),
                100.0 * r.report.reuse_error(),
                QUALITY_WEIGHT,
            );
            let _ = self.granularity.observe(layout.patches(), cost);
        }
        self.finished.push(Ok(Output {
            latent,
            sample,
            report: r.report,
            layout,
        }));
    }

    pub(super) fn forget(&mut self, id: u64) {
        if let Executor::Workers { pool, .. } = &mut self.exec {
            pool.broadcast(&Order::Forget { request: id });
        }
        if let Some(dir) = &self.checkpoints {
            let _ = std::fs::remove_file(checkpoint::path(dir, id));
        }
    }

    pub(super) fn fail(&mut self, id: u64, e: EngineError) {
        if self.requests.remove(&id).is_some() {
            self.waiting.retain(|w| w.id != id);
            let _ = self.sched.cancel(id);
            self.forget(id);
            self.finished.push(Err((id, e)));
            self.start_waiting();
        }
    }

    pub(super) fn fail_all(&mut self, e: EngineError) {
        // Nothing more starts: every request fails.
        self.waiting.clear();
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(id, e.duplicate());
        }
    }
}
