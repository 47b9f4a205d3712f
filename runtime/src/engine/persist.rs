//! Persistence: a request between steps as a checkpoint, and a request resumed from one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flashdiff_gate::choice::Execution;
use flashdiff_models::{Dims, ModelError, Tensor};
use flashdiff_partitioner::{Grid, PatchLayout};

use super::forecast::Track;
use super::methods;
use super::request::Request;
use super::Choice;
use super::{
    check_request, create_private_dir, Engine, EngineError, LayoutKind, Report, RequestConfig,
    Reuse, TimeSplit,
};
use crate::checkpoint::{self, Checkpoint};
use crate::state::{Region, SharedState};

impl Engine {
    /// Keeps a checkpoint of every request in `dir` (created, mode 0700), replaced at a step
    /// boundary once `every` has passed since the request's last one (`Duration::ZERO`: at
    /// every step boundary; the first right after the partition), removed when the request
    /// ends: after a crash, [`Engine::resume`] continues each from its last checkpointed
    /// step, bit-identically. A checkpoint of the built-in model's request is about 1.6 MB,
    /// so every step costs throughput (README); `None` stops (the default).
    pub fn set_checkpoint_dir(
        &mut self,
        dir: Option<PathBuf>,
        every: Duration,
    ) -> Result<(), EngineError> {
        if let Some(d) = &dir {
            create_private_dir(d).map_err(|source| EngineError::Io {
                what: format!("checkpoint directory {}", d.display()),
                source,
            })?;
        }
        self.checkpoints = dir;
        self.checkpoint_every = every;
        Ok(())
    }

    /// Where checkpoints go, if anywhere ([`Engine::set_checkpoint_dir`]).
    pub fn checkpoint_dir(&self) -> Option<&Path> {
        self.checkpoints.as_deref()
    }

    pub(super) fn save_checkpoint(&mut self, id: u64) {
        let (Some(dir), Some(r)) = (&self.checkpoints, self.requests.get(&id)) else {
            return;
        };
        let Some(c) = to_checkpoint(id, r) else {
            return;
        };
        let path = checkpoint::path(dir, id);
        if let Err(e) = checkpoint::write_atomic(&path, &checkpoint::encode(&c), false) {
            log::error!(
                "cannot write the checkpoint {}: {e}; request {id} would restart from scratch after a crash",
                path.display()
            );
        }
    }

    /// Continues a request from its checkpoint (written by an engine of the same model,
    /// perhaps in a process that died): the rest of its steps run as they would have, so
    /// its output is bit-identical to an uninterrupted run's.
    pub fn resume(&mut self, c: Checkpoint) -> Result<(), EngineError> {
        let bad = |reason: String| EngineError::Checkpoint { id: c.id, reason };
        if c.dims != self.layout.dims_words() {
            return Err(bad(format!(
                "made for a model of dimensions {:?}, this one has {:?}",
                c.dims,
                self.layout.dims_words()
            )));
        }
        if self.requests.contains_key(&c.id) {
            return Err(bad("the request is already in flight".into()));
        }
        let cfg = from_config_record(&c.cfg).map_err(bad)?;
        check_request(&*self.model, &cfg)?;
        if c.step < cfg.warmup || c.step >= cfg.steps {
            return Err(bad(format!(
                "step {} is outside {}..{} (after the warm-up, before the end)",
                c.step, cfg.warmup, cfg.steps
            )));
        }
        let method = methods::of(cfg.mode);
        let (layout, track) = restore_policies(&c, self.model.dims()).map_err(|e| match e {
            EngineError::Config(m) => bad(m),
            e => e,
        })?;
        let memory = method
            .recall(&methods::Recall {
                records: &c.memory,
                tokens: self.model.dims().grid.tokens(),
                patches: layout.patches() as usize,
                step: c.step,
                cfg: &cfg,
            })
            .map_err(bad)?;
        let cond = self.model.condition(&c.prompt)?;
        let context = Tensor::from_slice(&cond.context, cond.context.len(), self.model.device())
            .map_err(ModelError::from)?;
        let mut state = SharedState::create(self.layout.clone(), self.shm.as_deref(), c.id)
            .map_err(|source| EngineError::Io {
                what: "cannot create request state".into(),
                source,
            })?;
        restore_regions(&mut state, &c.regions).map_err(bad)?;
        state
            .get_mut(Region::Context)
            .copy_from_slice(&cond.context);
        // Latency and the deadline count from the first submission, on the wall clock.
        let submitted_unix = std::time::UNIX_EPOCH + Duration::from_nanos(c.submitted_unix_ns);
        let age = std::time::SystemTime::now()
            .duration_since(submitted_unix)
            .unwrap_or_default();
        let submitted = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let deadline = cfg
            .deadline
            .map(|d| (d.as_secs_f64() - age.as_secs_f64()) + self.origin.elapsed().as_secs_f64());
        self.sched
            .resume(c.id, cfg.priority, deadline, c.step - 1)?;
        let id = c.id;
        let report = report_from(id, &cfg, &c.report);
        self.requests.insert(
            id,
            Request {
                prompt: c.prompt,
                submitted_unix,
                salient: cond.salient,
                context,
                conds: Vec::new(),
                state,
                layout: Some(layout),
                step: c.step,
                active: c.active,
                report,
                cfg,
                submitted,
                memory,
                track,
                checkpointed: Some(Instant::now()),
            },
        );
        self.open_step(id, &mut |_| {});
        Ok(())
    }
}

/// A request's settings as a checkpoint or journal record.
pub fn to_config_record(c: &RequestConfig) -> checkpoint::ConfigRecord {
    checkpoint::ConfigRecord {
        steps: c.steps,
        warmup: c.warmup,
        patches: c.patches,
        epsilon: c.epsilon,
        adaptive_epsilon: c.adaptive_epsilon,
        max_skip: c.max_skip,
        budget: c.budget,
        seed: c.seed,
        mode: c.mode.name().into(),
        priority: c.priority,
        layout: u8::from(c.layout == LayoutKind::Uniform),
        cache_threshold: c.cache_threshold,
        ras_ratio: c.ras_ratio,
        auto_dispersion: c.auto_dispersion,
        reuse: c.reuse.code(),
        monotasks: c.monotasks,
        deadline_ns: c
            .deadline
            .map(|d| d.as_nanos().min(u64::MAX as u128) as u64),
    }
}

/// Settings from a record (untrusted: the mode and layout are checked; the rest by
/// [`check_request`] when submitted).
pub fn from_config_record(c: &checkpoint::ConfigRecord) -> Result<RequestConfig, String> {
    Ok(RequestConfig {
        steps: c.steps,
        warmup: c.warmup,
        patches: c.patches,
        epsilon: c.epsilon,
        adaptive_epsilon: c.adaptive_epsilon,
        max_skip: c.max_skip,
        budget: c.budget,
        seed: c.seed,
        mode: c.mode.parse()?,
        priority: c.priority,
        layout: match c.layout {
            0 => LayoutKind::Saliency,
            1 => LayoutKind::Uniform,
            n => return Err(format!("layout {n}: expected 0 or 1")),
        },
        cache_threshold: c.cache_threshold,
        ras_ratio: c.ras_ratio,
        auto_dispersion: c.auto_dispersion,
        reuse: Reuse::of_code(c.reuse)
            .ok_or_else(|| format!("reuse {}: expected 0 to 4", c.reuse))?,
        monotasks: c.monotasks,
        deadline: c.deadline_ns.map(Duration::from_nanos),
    })
}

/// A request's policies as a checkpoint restores them: layout and extrapolation (what its
/// method remembers, a gate or a budget, is the method's to recall).
type Policies = (PatchLayout, Option<Track>);

/// A checkpoint's patch layout and extrapolation state, each checked against the model
/// (untrusted input).
fn restore_policies(c: &Checkpoint, dims: &Dims) -> Result<Policies, EngineError> {
    let bad = |m: &str| EngineError::Config(m.to_string());
    let g = dims.grid;
    let grid = Grid::new(g.frames as u32, g.height as u32, g.width as u32)?;
    let layout = PatchLayout::from_assignment(grid, c.patch_of.clone(), c.patches)?;
    if c.active.len() != layout.patches() as usize {
        return Err(bad(
            "the active patches and the layout disagree on the patch count",
        ));
    }
    let tokens = g.tokens();
    let vel = tokens * dims.channels;
    let kv = dims.kv_layers * tokens * dims.kv_dim;
    let Some(t) = &c.track else {
        return Ok((layout, None));
    };
    let reuse = Reuse::of_code(c.cfg.reuse);
    let ok = [&t.k_base, &t.v_base_kv, &t.k_slope, &t.v_slope_kv]
        .iter()
        .all(|v| v.len() == kv)
        && t.v_base.len() == vel
        && t.v_slope.len() == vel
        && t.v_curve.len()
            == if reuse.map(Reuse::order) == Some(2) {
                vel
            } else {
                0
            }
        && t.gap.len() == tokens
        && t.last.len() == tokens;
    if !ok {
        return Err(bad("extrapolation state of the wrong size"));
    }
    let track = Track {
        kv_weight: t.kv_weight,
        kv_base: [t.k_base.clone(), t.v_base_kv.clone()],
        kv_slope: [t.k_slope.clone(), t.v_slope_kv.clone()],
        v_base: t.v_base.clone(),
        v_slope: t.v_slope.clone(),
        v_curve: t.v_curve.clone(),
        correction: reuse.map_or(0.0, Reuse::correction),
        gap: t.gap.clone(),
        last: t.last.clone(),
    };
    Ok((layout, Some(track)))
}

/// Copies a checkpoint's committed regions into a fresh state, refusing wrong sizes.
fn restore_regions(state: &mut SharedState, regions: &[Vec<f32>]) -> Result<(), String> {
    if regions.len() != checkpoint::SAVED_REGIONS.len() {
        return Err(format!(
            "{} regions, expected {}",
            regions.len(),
            checkpoint::SAVED_REGIONS.len()
        ));
    }
    for (&region, data) in checkpoint::SAVED_REGIONS.iter().zip(regions) {
        let dst = state.get_mut(region);
        if dst.len() != data.len() {
            return Err(format!(
                "region {region:?} has {} values, expected {}",
                data.len(),
                dst.len()
            ));
        }
        dst.copy_from_slice(data);
    }
    Ok(())
}

/// A resumed request's report: the counters so far; latency and shares are set at the end.
fn report_from(id: u64, cfg: &RequestConfig, rr: &checkpoint::ReportRecord) -> Report {
    let t = rr.time_ns.map(Duration::from_nanos);
    Report {
        id,
        steps: cfg.steps,
        warmup: cfg.warmup,
        patches: rr.patches,
        patch_steps: rr.patch_steps,
        computed: rr.computed,
        computed_tokens: rr.computed_tokens,
        active_per_step: rr.active_per_step.clone(),
        time: TimeSplit {
            warmup: t[0],
            partition: t[1],
            gate: t[2],
            compute: t[3],
            schedule: t[4],
            io: t[5],
            queue: Duration::ZERO,
        },
        latency: Duration::ZERO,
        work_skipped: 0.0,
        flops: super::FlopsCount::default(),
        epsilon_sum: rr.epsilon_sum,
        epsilon_steps: rr.epsilon_steps,
        reuse_err2: rr.reuse_err2,
        reuse_norm2: rr.reuse_norm2,
        choice: rr.choice.map(|(regional, dispersion)| Choice {
            execution: if regional {
                Execution::Regional
            } else {
                Execution::WholeStep
            },
            dispersion,
            threshold: cfg.auto_dispersion,
        }),
        deadline_met: None,
    }
}

/// A request between steps as a checkpoint (`None` before its partition).
fn to_checkpoint(id: u64, r: &Request) -> Option<Checkpoint> {
    let layout = r.layout.as_ref()?;
    let rep = &r.report;
    let t = &rep.time;
    let ns = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    Some(Checkpoint {
        id,
        prompt: r.prompt.clone(),
        cfg: to_config_record(&r.cfg),
        submitted_unix_ns: r
            .submitted_unix
            .duration_since(std::time::UNIX_EPOCH)
            .map(ns)
            .unwrap_or(0),
        step: r.step,
        dims: r.state.layout().dims_words(),
        patch_of: layout.patch_of().to_vec(),
        patches: layout.patches(),
        active: r.active.clone(),
        track: r.track.as_ref().map(|t| checkpoint::TrackRecord {
            kv_weight: t.kv_weight,
            k_base: t.kv_base[0].clone(),
            v_base_kv: t.kv_base[1].clone(),
            k_slope: t.kv_slope[0].clone(),
            v_slope_kv: t.kv_slope[1].clone(),
            v_base: t.v_base.clone(),
            v_slope: t.v_slope.clone(),
            v_curve: t.v_curve.clone(),
            gap: t.gap.clone(),
            last: t.last.clone(),
        }),
        memory: {
            let mut m = Vec::new();
            r.memory.save(&mut m);
            m
        },
        report: checkpoint::ReportRecord {
            patches: rep.patches,
            patch_steps: rep.patch_steps,
            computed: rep.computed,
            computed_tokens: rep.computed_tokens,
            active_per_step: rep.active_per_step.clone(),
            time_ns: [
                ns(t.warmup),
                ns(t.partition),
                ns(t.gate),
                ns(t.compute),
                ns(t.schedule),
                ns(t.io),
            ],
            epsilon_sum: rep.epsilon_sum,
            epsilon_steps: rep.epsilon_steps,
            reuse_err2: rep.reuse_err2,
            choice: rep
                .choice
                .map(|c| (c.execution == Execution::Regional, c.dispersion)),
            reuse_norm2: rep.reuse_norm2,
        },
        regions: checkpoint::SAVED_REGIONS
            .iter()
            .map(|&reg| r.state.get(reg).to_vec())
            .collect(),
    })
}
