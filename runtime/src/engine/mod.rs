//! The engine: requests move through warm-up, partition and gated patch-wise denoising, with
//! every unit of work (a request's warm-up, a step's patches) a monotask that the Patch
//! Scheduler orders and places on workers (the coordinator's thread, worker threads, or worker
//! processes).
//!
//! Execution semantics, per request:
//! 1. Warm-up: `warmup` ordinary Euler steps over the whole latent, recording the
//!    cross-attention of every latent token to every prompt word (head- and saliency-layer
//!    average, mean over the warm-up steps).
//! 2. Partition: the model's salient words -> saliency map -> R patches (R fixed, or from the
//!    adaptive controller).
//! 3. Each remaining step: the request's skipping method picks the active patches (all of
//!    them in the final [`FINAL_FULL_STEPS`] steps) and [`pack_monotasks`] packs them into at
//!    most [`RequestConfig::monotasks`] monotasks (default one). A monotask runs the
//!    token-subset forward over its patches' tokens: fresh K/V among them, every other
//!    token's K/V from the start-of-step cache (displaced K/V); skipped patches advance with
//!    their cached velocity. When the step's last monotask completes, velocities and K/V are
//!    committed, the gate is fed each active patch's refinement importance, and
//!    `x <- x - h v` for the whole latent. Each step is reported as a [`StepEvent`].
//! 4. Reused values ([`RequestConfig::reuse`]). The paper reuses them as last
//!    computed: other patches' K/V one step stale (more for skipped patches), a skipped
//!    patch's cached velocity. By default they are forecast along their per-step slope:
//!    every token's K/V to the coming step (`last + (next - computed_at) * slope`, the raw
//!    slope with one monotask per step, else averaged over its computations,
//!    [`KV_SLOPE_SMOOTHING`]) and a skipped patch's velocity to the current step (slope of
//!    its last two computations; with [`Reuse::Extrapolate2`], the parabola through its last
//!    three).
//!
//! Because every monotask reads only start-of-step state, its patches are a function of the
//! method's decisions and the request's monotask count alone, and the coordinator computes
//! that state from committed values alone, the result does not depend on the worker count,
//! on which worker ran which monotask or in which order: it is bit-identical for any
//! packing onto workers and after any re-run.
//!
//! The code by role: `settings.rs` (a request's settings and their one range check),
//! `error.rs`, `report.rs` (outputs, reports, step events), `request.rs` and `life.rs`
//! (admission, warm-up, partition, finish), `step.rs` (a step's choice, packing and commit),
//! `methods/` (FlashDiff and the baselines, a file each, behind one trait), `forecast.rs`,
//! `packing.rs`, `workers.rs` (supervision: losses, hangs, replacements) and `persist.rs`
//! (checkpoints and resume).
//!
//! Modes: [`Mode::FlashDiff`] (default), [`Mode::NoSkip`] (all patches every step, displaced
//! K/V: with stale K/V and uniform patches, the DistriFusion-style baseline), [`Mode::Full`]
//! (one patch: ordinary sampling, the quality reference), and the baselines
//! [`Mode::NaivePatch`], [`Mode::TeaCache`], [`Mode::Ras`], and the ablations of FlashDiff's
//! choice [`Mode::PerPatch`], [`Mode::RandomPatches`], [`Mode::PatchGate`].

mod builder;
mod error;
mod forecast;
mod life;
mod methods;
mod newton;
mod packing;
mod paths;
mod persist;
mod report;
mod request;
mod series;
mod settings;
mod step;
mod window;
mod workers;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashdiff_models::pipelines::registry::ModelSpec;
use flashdiff_models::{Denoiser, Device};
use flashdiff_partitioner::{GranularityConfig, GranularityController};
pub use flashdiff_scheduler::QueueOrder;
use flashdiff_scheduler::{Scheduler, SchedulerConfig, MAX_DEPTH};

pub use builder::EngineBuilder;
pub use error::EngineError;
pub use forecast::KV_SLOPE_SMOOTHING;
pub use life::noise;
pub use methods::FRONT_BLOCKS as DBCACHE_FRONT_BLOCKS;
pub use packing::pack_monotasks;
pub use paths::{builtin_weights, create_private_dir, default_weights, state_dir, BUILTIN_MODELS};
pub use persist::{from_config_record, to_config_record};
pub use report::{
    report_json, Choice, FlopsCount, Output, Report, StepEvent, StepKinds, TimeSplit,
};
pub use settings::{
    adaptive_epsilon, check_request, fit_warmup, lone_request_patches, LayoutKind, Mode,
    RequestConfig, Reuse, AUTO_DISPERSION, DEFAULT_CACHE_THRESHOLD, DEFAULT_MONOTASKS,
    DEFAULT_PATCHES, DEFAULT_STEPS, DEFAULT_WARMUP, DISPATCH_DEPTH, ENGINE_DEFAULT_EPSILON,
    ENGINE_DEFAULT_MAX_SKIP, FINAL_FULL_STEPS, QUALITY_WEIGHT, RESUME_CORRECTION,
};
pub use window::START_WINDOW_EXTRA;
pub use workers::HangPolicy;

use crate::proc::Pool;
use crate::state::StateLayout;
use request::Request;
use workers::{Executor, Health};

/// The engine: one model, a scheduler over `workers` virtual workers, the adaptive-R
/// controller, and the requests in flight.
pub struct Engine {
    model: Arc<dyn Denoiser>,
    layout: StateLayout,
    sched: Scheduler,
    workers: u32,
    granularity: GranularityController,
    requests: HashMap<u64, Request>,
    finished: Vec<Result<Output, (u64, EngineError)>>,
    exec: Executor,
    shm: Option<PathBuf>,
    /// The engine's own directory of state files (inside `shm`), removed on drop.
    _state_dir: Option<crate::state::StateDir>,
    /// The engine's clock origin (deadlines are seconds since it).
    origin: Instant,
    /// Where every request's checkpoint is replaced at step boundaries, if anywhere.
    checkpoints: Option<PathBuf>,
    /// Least time between two checkpoints of one request.
    checkpoint_every: Duration,
    /// The start window (see [`Engine::set_start_window`]).
    window: Option<u32>,
    /// Requests submitted and not yet started, and the next submission's number.
    waiting: Vec<window::Waiting>,
    submissions: u64,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.model)
            .field("workers", &self.workers)
            .finish()
    }
}

/// Building an engine: its model, its workers.
impl Engine {
    /// An engine over the model at `weights` with `workers` workers in this process: with
    /// one, monotasks run on the coordinator's thread; with more, on that many worker
    /// threads sharing the model (request state in files under [`state_dir`]).
    pub fn new(weights: &Path, workers: u32) -> Result<Self, EngineError> {
        Self::new_on(weights, workers, &Device::Cpu)
    }

    /// [`Engine::new`] with the model on `device` (see `flashdiff_models::device`); request
    /// state stays in host memory and is copied to the device per monotask.
    pub(crate) fn new_on(
        weights: &Path,
        workers: u32,
        device: &Device,
    ) -> Result<Self, EngineError> {
        Self::load(&ModelSpec::file(weights), workers, device, None)
    }

    /// An engine over the model `spec` describes, loaded onto `device`, with `workers`
    /// workers in this process (as [`Engine::new`]; worker threads keep request state under
    /// `shm_dir`, else under [`state_dir`]).
    pub(crate) fn load(
        spec: &ModelSpec,
        workers: u32,
        device: &Device,
        shm_dir: Option<&Path>,
    ) -> Result<Self, EngineError> {
        check_workers(workers)?;
        flashdiff_kernels::flush_denormals_to_zero();
        let model: Arc<dyn Denoiser> = spec.load(device)?.into();
        match shm_dir {
            None if workers <= 1 => Self::with_model(model, workers, None),
            None => Self::with_threads(model, workers, &state_dir()),
            Some(dir) => Self::with_threads(model, workers, dir),
        }
    }

    /// An engine whose `workers` are threads of this process sharing `model`, with request
    /// state in memory-mapped files under `shm_dir` that every thread maps.
    pub(crate) fn with_threads(
        model: Arc<dyn Denoiser>,
        workers: u32,
        shm_dir: &Path,
    ) -> Result<Self, EngineError> {
        let mut e = Self::with_model(model.clone(), workers, Some(shm_dir.to_path_buf()))?;
        let pool = Box::new(Pool::threads(model, workers).map_err(EngineError::Config)?);
        e.use_pool(pool, workers)?;
        Ok(e)
    }

    /// An engine whose `workers` run as child processes of `exe` (`exe worker ...`), each
    /// loading the model `spec` describes (a path: a TinyDiT-family file) onto its CPU, with request state in memory-mapped
    /// files under `shm_dir` (e.g. `/dev/shm`). The coordinator loads the model too (to
    /// condition prompts and decode results).
    pub(crate) fn with_processes(
        spec: impl Into<ModelSpec>,
        workers: u32,
        exe: &Path,
        shm_dir: &Path,
    ) -> Result<Self, EngineError> {
        let spec = &spec.into();
        check_workers(workers)?;
        flashdiff_kernels::flush_denormals_to_zero();
        let model: Arc<dyn Denoiser> = spec.load(&Device::Cpu)?.into();
        let mut e = Self::with_model(model, workers, Some(shm_dir.to_path_buf()))?;
        let pool = Box::new(Pool::new(exe, spec, workers).map_err(EngineError::Config)?);
        e.use_pool(pool, workers)?;
        Ok(e)
    }

    /// Runs monotasks on `pool`'s workers, dispatching up to [`DISPATCH_DEPTH`] to each.
    fn use_pool(&mut self, pool: Box<Pool>, workers: u32) -> Result<(), EngineError> {
        self.exec = Executor::Workers {
            pool,
            busy: vec![VecDeque::new(); workers as usize],
            replacements: 0,
            health: Health::new(workers),
        };
        self.set_dispatch_depth(DISPATCH_DEPTH)
    }

    /// How many monotasks a worker thread or process may hold at once: the one it runs
    /// plus those dispatched to it ahead ([`DISPATCH_DEPTH`] by default; 1 dispatches only
    /// to idle workers). In 1..=64; only while nothing is in flight; no effect without
    /// workers (the coordinator runs monotasks itself, one at a time). Outputs do not depend
    /// on it.
    pub fn set_dispatch_depth(&mut self, depth: u32) -> Result<(), EngineError> {
        if !self.requests.is_empty() {
            return Err(EngineError::Config(
                "the dispatch depth can change only while no request is in flight".into(),
            ));
        }
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(EngineError::Config(format!(
                "dispatch depth {depth}: must be in 1..={}",
                MAX_DEPTH
            )));
        }
        if matches!(self.exec, Executor::InProcess) {
            return Ok(());
        }
        self.rebuild_scheduler(SchedulerConfig {
            depth,
            ..*self.sched.config()
        })
    }

    /// Process ids of the worker processes (empty without workers; `None` for threads).
    pub fn worker_pids(&self) -> Vec<Option<u32>> {
        match &self.exec {
            Executor::InProcess => Vec::new(),
            Executor::Workers { pool, .. } => pool.pids(),
        }
    }

    /// Workers started to replace lost ones.
    pub fn replacements(&self) -> u32 {
        match &self.exec {
            Executor::InProcess => 0,
            Executor::Workers { replacements, .. } => *replacements,
        }
    }

    /// An engine over any model, with `workers` virtual workers in this process.
    pub(crate) fn with_model(
        model: Arc<dyn Denoiser>,
        workers: u32,
        shm: Option<PathBuf>,
    ) -> Result<Self, EngineError> {
        check_workers(workers)?;
        let sched = Scheduler::new(SchedulerConfig {
            workers,
            ..Default::default()
        })?;
        let tokens = model.dims().grid.tokens() as u32;
        let granularity = GranularityController::new(GranularityConfig {
            r_min: 2,
            r_max: 16.min(tokens),
            ..Default::default()
        })?;
        let layout = StateLayout::new(model.dims());
        let state_dir =
            match &shm {
                None => None,
                Some(root) => Some(crate::state::StateDir::create(root).map_err(|source| {
                    EngineError::Io {
                        what: format!(
                            "cannot create the engine's state directory under {}",
                            root.display()
                        ),
                        source,
                    }
                })?),
            };
        Ok(Self {
            model,
            layout,
            sched,
            workers,
            granularity,
            requests: HashMap::new(),
            finished: Vec::new(),
            exec: Executor::InProcess,
            shm: state_dir.as_ref().map(|d| d.path().to_path_buf()),
            _state_dir: state_dir,
            origin: Instant::now(),
            checkpoints: None,
            checkpoint_every: Duration::ZERO,
            window: None,
            waiting: Vec::new(),
            submissions: 0,
        })
    }
}

/// What the engine runs and holds, and its settings.
impl Engine {
    /// The model.
    pub fn model(&self) -> &dyn Denoiser {
        &*self.model
    }

    /// The model, shared (e.g. to check prompts on another thread while this engine runs).
    pub fn shared_model(&self) -> Arc<dyn Denoiser> {
        self.model.clone()
    }

    /// Workers the scheduler places monotasks on.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Checks a request's settings; the error names the setting and its valid range.
    pub fn validate(&self, cfg: &RequestConfig) -> Result<(), EngineError> {
        check_request(&*self.model, cfg)
    }

    /// How requests of one priority level are ordered: arrival (the default; FIFO across
    /// steps) or earliest deadline first. Only while nothing is in flight.
    pub fn set_queue_order(&mut self, order: QueueOrder) -> Result<(), EngineError> {
        if !self.requests.is_empty() {
            return Err(EngineError::Config(
                "the queue order can change only while no request is in flight".into(),
            ));
        }
        self.rebuild_scheduler(SchedulerConfig {
            order,
            ..*self.sched.config()
        })
    }

    /// A fresh scheduler with `cfg` (nothing in flight), keeping which workers are lost.
    fn rebuild_scheduler(&mut self, cfg: SchedulerConfig) -> Result<(), EngineError> {
        let cfg = SchedulerConfig {
            workers: self.sched.workers(),
            ..cfg
        };
        let dead: Vec<u32> = self
            .sched
            .load()
            .per_worker
            .iter()
            .enumerate()
            .filter(|(w, _)| !self.sched.is_alive(*w as u32))
            .map(|(w, _)| w as u32)
            .collect();
        let mut sched = Scheduler::new(cfg)?;
        for w in dead {
            sched.worker_lost(w)?;
        }
        self.sched = sched;
        Ok(())
    }

    /// Drops a request in flight; it is reported as cancelled by the next [`Engine::run`].
    pub fn cancel(&mut self, id: u64) -> Result<(), EngineError> {
        if !self.requests.contains_key(&id) {
            return Err(EngineError::Invalid {
                field: "id",
                reason: format!("{id}: no request with this id is in flight"),
            });
        }
        self.fail(id, EngineError::Cancelled(id));
        Ok(())
    }

    /// Results finished (or failed, or cancelled) since the last [`Engine::run`], without
    /// running anything.
    pub fn take_finished(&mut self) -> Vec<Result<Output, (u64, EngineError)>> {
        std::mem::take(&mut self.finished)
    }

    /// The active patches of a request's current step (after the gate decided it; empty
    /// before the first step after the warm-up), `None` when it is not in flight.
    pub fn active_patches(&self, id: u64) -> Option<&[bool]> {
        self.requests.get(&id).map(|r| r.active.as_slice())
    }

    /// The patch of every latent token of a request in flight, once its warm-up has
    /// partitioned it (`None` before, or for an unknown id).
    pub fn patch_of(&self, id: u64) -> Option<&[u32]> {
        self.requests
            .get(&id)
            .and_then(|r| r.layout.as_ref())
            .map(|l| l.patch_of())
    }

    /// Whether a request is in flight.
    pub fn is_in_flight(&self, id: u64) -> bool {
        self.requests.contains_key(&id)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    /// Runs monotasks until every request in flight has finished; `progress`
    /// is called after every completed step. Returns the finished requests (or their errors).
    pub fn run(
        &mut self,
        progress: &mut dyn FnMut(&StepEvent),
    ) -> Vec<Result<Output, (u64, EngineError)>> {
        while !self.requests.is_empty() {
            self.poll(progress, Duration::from_secs(3600));
        }
        std::mem::take(&mut self.finished)
    }

    /// Sets when a silent worker counts as hung (see [`HangPolicy`]); without workers it
    /// has no effect.
    pub fn set_hang_policy(&mut self, policy: HangPolicy) -> Result<(), EngineError> {
        // Bounded, so that no limit overflows when added to a dispatch time.
        let day = Duration::from_secs(86_400);
        if !(1.0..=1000.0).contains(&policy.factor)
            || policy.floor.is_zero()
            || policy.floor > day
            || policy.first > day
        {
            return Err(EngineError::Config(format!(
                "hang policy {policy:?}: factor must be in 1..=1000, floor above zero, floor \
                 and first at most a day"
            )));
        }
        if let Executor::Workers { health, .. } = &mut self.exec {
            health.policy = policy;
        }
        Ok(())
    }

    /// One request, start to end.
    pub fn generate(
        &mut self,
        prompt: &str,
        cfg: RequestConfig,
        progress: &mut dyn FnMut(&StepEvent),
    ) -> Result<Output, EngineError> {
        let id = u64::MAX - 1;
        self.submit(id, prompt, cfg)?;
        let mut out = self.run(progress);
        match out.pop() {
            Some(Ok(o)) => Ok(o),
            Some(Err((_, e))) => Err(e),
            None => Err(EngineError::Internal("request vanished".into())),
        }
    }
}

/// The engine takes 1..=1024 workers.
fn check_workers(workers: u32) -> Result<(), EngineError> {
    if workers == 0 || workers > 1024 {
        return Err(EngineError::Config(format!(
            "--workers {workers}: must be in 1..=1024"
        )));
    }
    Ok(())
}
