//! The engine, single-process mode: requests move through warm-up, partition and gated
//! patch-wise denoising, with every unit of work (a request's warm-up, a step's patches) a
//! monotask that the Patch Scheduler orders and places on (virtual) workers.
//!
//! Execution semantics, per request:
//! 1. Warm-up: `warmup` ordinary Euler steps over the whole latent, recording the
//!    cross-attention of every latent token to every prompt word (head- and saliency-layer
//!    average, mean over the warm-up steps).
//! 2. Partition: salient words ([`crate::scene::is_salient`]) -> saliency map -> R patches
//!    (R fixed, or from the adaptive controller).
//! 3. Each remaining step: the gate picks the active patches (all of them in the final
//!    [`FINAL_FULL_STEPS`] steps) and [`pack_monotasks`] packs them into at most
//!    [`RequestConfig::monotasks`] monotasks (default one). A monotask runs the token-subset
//!    forward over its patches' tokens: fresh K/V among them, every other token's K/V from
//!    the start-of-step cache (displaced K/V); skipped patches advance with their cached
//!    velocity. When the step's last monotask completes, velocities and K/V are committed,
//!    the gate is fed each active patch's refinement importance, and `x <- x - h v` for the
//!    whole latent.
//! 4. Reused values ([`RequestConfig::extrapolate`]). The paper reuses them as last
//!    computed: other patches' K/V one step stale (more for skipped patches), a skipped
//!    patch's cached velocity. By default we extrapolate them along their per-step slope:
//!    every token's K/V to the coming step (`last + (next - computed_at) * slope`, the raw
//!    slope with one monotask per step, else averaged over its computations,
//!    [`KV_SLOPE_SMOOTHING`]) and a skipped patch's
//!    velocity to the current step (slope of its last two computations). On this model the
//!    stale values, not the skipping itself, cost most of the PSNR (bench ablation
//!    `flashdiff-stale`).
//!
//! Because every monotask reads only start-of-step state, its patches are a function of the
//! gate's decisions and the request's monotask count alone, and the coordinator computes
//! that state from committed values alone, the result does not depend on the worker count,
//! on which worker ran which monotask or in which order: it is bit-identical for any
//! packing onto workers and after any re-run.
//!
//! Modes: [`Mode::FlashDiff`] (default), [`Mode::NoSkip`] (all patches every step, displaced
//! K/V: with stale K/V and uniform patches, the DistriFusion-style baseline), [`Mode::Full`]
//! (one patch: ordinary sampling, the quality reference), and the baselines
//! [`Mode::NaivePatch`], [`Mode::TeaCache`], [`Mode::Ras`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flashdiff_gate::{Gate, GateConfig, GateError, LoadAdaptiveEpsilon};
use flashdiff_partitioner::{
    objective, partition_saliency, partition_uniform, saliency_map, GranularityConfig,
    GranularityController, Grid, PartitionError, PatchLayout,
};
pub use flashdiff_scheduler::QueueOrder;
use flashdiff_scheduler::{
    Completion, SchedError, Scheduler, SchedulerConfig, Tag, MAX_DEPTH, WARMUP_PATCH,
};

use crate::checkpoint::{self, Checkpoint};
use crate::exec::{self, Task};
use crate::proc::{Event, Order, Pool, Report as WorkerReport};
use crate::state::{Layout, Region, SharedState};
use flashdiff_models::scene::PromptError;
use flashdiff_models::{
    Denoiser, Device, Dims, ModelError, Sample, StepInput, Tensor, TinyDit, WeightsError,
};
use std::sync::Arc;

/// Default total steps (DESIGN.md: N = 50).
pub const DEFAULT_STEPS: u32 = 50;
/// Default warm-up steps (DESIGN.md and the paper's §4.1: the first five steps).
pub const DEFAULT_WARMUP: u32 = 5;
/// Steps at the end run with every patch active whatever the gate says. Measured on the
/// built-in model at step 20000 (`flashdiff bench`, section "The final step": full
/// computation, 8 prompts, 50 steps): the mean relative velocity change per token is 0.007,
/// 0.008 and 0.011 at steps 44-46, then 0.015, 0.029 and 0.087 at the last step (21x the
/// median step; every token over 3x its own median). Skipping there would reuse a velocity
/// that is far off. Steps 47-48 also rise, but forcing 2 or 3 final steps did not raise PSNR
/// on 8 prompts with the step-11200 weights and K/V extrapolation (ε 0.1: 42.8 / 43.2 /
/// 42.4 dB mean for 1 / 2 / 3; ε 0.2: 35.9 / 35.8 / 34.5), so one step it is.
pub const FINAL_FULL_STEPS: u32 = 1;

/// Default whole-step caching threshold (TeaCache's published range is 0.1-0.3 for its
/// models; ours is measured by `flashdiff bench`).
pub const DEFAULT_CACHE_THRESHOLD: f32 = 0.1;

/// How a request is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Saliency patches, gated skipping, displaced K/V.
    FlashDiff,
    /// Saliency patches, no skipping, displaced K/V.
    NoSkip,
    /// One patch, every step: ordinary sampling.
    Full,
    /// Uniform patches denoised independently (attention inside the patch only) and stitched
    /// each step, no skipping: the NaivePatch baseline.
    NaivePatch,
    /// Whole-step caching (TeaCache / first-block-cache style): the whole step is skipped,
    /// reusing the last velocity, while the accumulated relative L1 change of block 0's
    /// modulated input stays under `cache_threshold`.
    TeaCache,
    /// Region-adaptive sampling (RAS-style): each step recomputes the `ras_ratio` share of 2x2
    /// token regions whose velocity changed most, the rest reuse their cached velocity and
    /// stale K/V; dense steps at about 45% and 80% of the steps and at the end.
    Ras,
}

/// How the latent is cut after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    /// Cross-attention saliency, recursive Otsu, load-aware (§4.1).
    Saliency,
    /// Balanced recursive bisection of the grid (NaivePatch / DistriFusion layout).
    Uniform,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "flashdiff" => Ok(Self::FlashDiff),
            "no-skip" => Ok(Self::NoSkip),
            "full" => Ok(Self::Full),
            "naive-patch" => Ok(Self::NaivePatch),
            "teacache" => Ok(Self::TeaCache),
            "ras" => Ok(Self::Ras),
            _ => Err(format!(
                "mode {s:?}: expected flashdiff, no-skip, full, naive-patch, teacache or ras"
            )),
        }
    }
}

/// Per-request settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestConfig {
    /// Total Euler steps N.
    pub steps: u32,
    /// Warm-up steps T_w (>= 1, < steps).
    pub warmup: u32,
    /// Patch count R; `None`: the engine's adaptive controller picks it.
    pub patches: Option<u32>,
    /// Gate threshold ε.
    pub epsilon: f32,
    /// Load-adaptive ε (§4.3): before each step the gate's ε follows the engine's load
    /// (requests in flight per worker; 1 = every worker has one) through
    /// [`LoadAdaptiveEpsilon`] with `epsilon` at load 1, `epsilon / 2` at load 0.5 and below
    /// (quality first when there is slack) and `min(2 epsilon, 1)` at load 1.5 and above
    /// (throughput first). Off by default: a lone request then runs at `epsilon / 2`.
    pub adaptive_epsilon: bool,
    /// Longest run of skips K.
    pub max_skip: u32,
    /// Noise seed.
    pub seed: u64,
    /// Execution mode.
    pub mode: Mode,
    /// Scheduling priority (0..8, higher first).
    pub priority: u8,
    /// Patch layout (saliency by default; NaivePatch always uses uniform).
    pub layout: LayoutKind,
    /// Threshold of [`Mode::TeaCache`] on the accumulated relative L1 change.
    pub cache_threshold: f32,
    /// Share of 2x2 regions [`Mode::Ras`] recomputes each step (RAS's sample ratio, 0.5).
    pub ras_ratio: f32,
    /// Values reused instead of recomputed ([`Mode::FlashDiff`], [`Mode::NoSkip`]): `true`
    /// extrapolates them along their per-step slope: the displaced K/V monotasks read (raw
    /// slope with one monotask per step, else averaged, [`KV_SLOPE_SMOOTHING`]) and a skipped
    /// patch's velocity (slope of its last two computations); `false` reuses them as last computed (the paper's rule; with
    /// no skipping, DistriFusion's).
    pub extrapolate: bool,
    /// Monotasks per step: the step's active patches are packed, in patch order and balanced
    /// by tokens, into at most this many monotasks; the patches of one monotask run in one
    /// forward and see each other's fresh K/V, patches in different monotasks see each
    /// other's cached (displaced) K/V. The default, [`DEFAULT_MONOTASKS`] = 1, runs a step
    /// as one forward over its active tokens. `None`: the engine's worker count (a single
    /// request's step spread over every worker). A count of at least the patch count gives
    /// every patch its own monotask (DistriFusion's displaced patches). The output depends
    /// on this count, never on the worker count, timing or which worker ran what.
    /// [`Mode::NaivePatch`] always runs one patch per monotask.
    pub monotasks: Option<u32>,
    /// Time after submission by which the request should be done. Under the deadline order
    /// ([`Engine::set_queue_order`]) it orders the request within its priority level
    /// (earliest first, at step boundaries); the report says whether it was met.
    pub deadline: Option<Duration>,
}

/// Default gate threshold of the engine. The gate crate's default (0.05) follows the paper.
/// With a step's active patches in one monotask and extrapolated reuse, the bench's 64
/// held-out prompts give, against full computation (work = share of its compute done):
///
/// | R | ε | work | patch-steps skipped | mean PSNR | worst | checker agrees |
/// | --- | --- | --- | --- | --- | --- | --- |
/// | adaptive (the CLI's) | 0.1 | 0.46 | 59-60% | 57.6-57.8 dB | 30.2 dB | 62/64 |
/// | adaptive | 0.2 | 0.38 | 69% | 52.6-53.9 dB | 26.4 dB | 59-60/64 |
/// | 8 | 0.1 | 0.65 | 39% | 63.2 dB | 31.4 dB | 63/64 |
/// | 8 | 0.2 | 0.45 | 61% | 57.7 dB | 26.4 dB | 61/64 |
/// | 16 (the bench's) | 0.1 | 0.44 | 62% | 58.2 dB | 30.2 dB | 62/64 |
///
/// 0.2 lets the checker's verdict drift from full computation's on more than 5% of prompts
/// with the adaptive R, so the default is 0.1 (and the bench runs R = 16).
pub const ENGINE_DEFAULT_EPSILON: f32 = 0.1;

/// Weight of the adaptive R controller's quality term: a request's cost is its own time x
/// (1 + QUALITY_WEIGHT x reuse error in percent) ([`Report::reuse_error`],
/// `flashdiff_partitioner::objective`), so 1% relative error in the extrapolated stand-ins
/// of skipped steps costs as much as 2% more time. See the README for what it picks.
pub const QUALITY_WEIGHT: f64 = 0.02;

/// Patch count R of a lone request (`flashdiff generate`), which the adaptive controller
/// cannot search: with one request per process it would run its first probe (R = 9) every
/// time. Measured with `flashdiff bench` (64 held-out prompts, ε 0.1, K 3, one monotask per
/// step): R = 16 did 0.44 of full computation's work at 58.2 dB mean PSNR (worst prompt
/// 30.2 dB); R = 8 did 0.65 at 63.2 dB. `flashdiff serve` starts from `auto`.
pub const DEFAULT_PATCHES: u32 = 16;

/// Default monotasks per step ([`RequestConfig::monotasks`]): one forward over a step's
/// active patches, which then see each other's fresh K/V, and an output that is the same for
/// any worker count (DESIGN.md step 4). Measured with `flashdiff bench` (64 prompts, R = 16,
/// ε 0.1): one monotask per step gave 58.2 dB mean PSNR against full computation at 0.44 of
/// its work; one monotask per patch (every patch reading the others' displaced K/V, the
/// `flashdiff-per-patch` ablation) gave 42.9 dB at 0.45, below 47.7 dB for full
/// computation with fewer steps at 0.44.
/// Concurrent requests still spread over the workers, one request-step per monotask.
pub const DEFAULT_MONOTASKS: u32 = 1;

/// Monotasks a worker thread or process holds at once: the one it runs and one dispatched
/// ahead, which it starts the moment the first is done instead of idling while its report
/// travels to the coordinator and the next order back. More than 2 would only commit work
/// to a worker earlier, when another may become free first.
pub const DISPATCH_DEPTH: u32 = 2;

/// Default longest run of skips per patch (DESIGN.md: K 3-5; the gate crate's default is 4).
/// Measured on the bench's 64 held-out prompts at the other defaults (adaptive R, ε 0.1):
/// K = 4 skipped 47.0% of patch-steps at 46.9 dB mean PSNR with the checker agreeing with
/// full computation on 60 of 64 prompts; K = 3 skipped 43.5% at 48.3 dB and agreed on 62,
/// meeting the engine issue's bar (>= 40% skipped, >= 30 dB, >= 95% agreement). Measured
/// again with a step's patches in one monotask (bench's first 16 prompts, R = 8): K = 3 did
/// 0.66 / 0.45 of the work at 66.1 / 58.2 dB for ε 0.1 / 0.2; K = 4 did 0.62 / 0.42 at 58.4 /
/// 48.8 dB and K = 5 0.60 / 0.40 at 56.9 / 48.7 dB.
pub const ENGINE_DEFAULT_MAX_SKIP: u32 = 3;

/// Weight of the newest measurement in a token's K/V slope (an exponential average with the
/// previous slope) when a step runs in more than one monotask. Raw one-step differences then
/// carry the displaced-K/V error of the step they came from, and extrapolating them doubles
/// it: on 8 prompts without skipping, one monotask per patch, raw slopes lost 10 dB of PSNR,
/// slopes averaged with weight 0.5 gained 1 dB over stale K/V, and with the gate at ε = 0.1 /
/// 0.2 the averaged slopes gained 3 / 1.5 dB mean and 5 / 4 dB on the worst prompt.
///
/// With one monotask per step nothing is displaced and the raw slope (weight 1) is best: on
/// the bench's first 16 prompts, R = 8, ε = 0.1 / 0.2 / 0.3, 66.1 / 58.2 / 51.5 dB mean PSNR
/// against full computation, where weight 0.5 gave 62.0 / 53.2 / 50.6 and 0.25 gave 56.0 /
/// 53.1 / 47.9.
///
/// Velocities are extrapolated along their raw last slope: on the same 8 prompts, weight 1.0
/// beat 0.5 by 3.5 dB mean at ε = 0.2 and 0.3 and lost 1 dB at ε = 0.1. Velocity on top of
/// K/V extrapolation: 47.9 instead of 42.8 dB mean (worst prompt 34.2 instead of 32.3) at
/// ε = 0.1, 42.8 instead of 35.9 (worst 29.8 instead of 26.6) at ε = 0.2; reusing both as
/// last computed gives 40.0 (26.8) and 34.3 (22.5).
pub const KV_SLOPE_SMOOTHING: f32 = 0.5;

impl Default for RequestConfig {
    fn default() -> Self {
        Self {
            steps: DEFAULT_STEPS,
            warmup: DEFAULT_WARMUP,
            patches: None,
            epsilon: ENGINE_DEFAULT_EPSILON,
            adaptive_epsilon: false,
            max_skip: ENGINE_DEFAULT_MAX_SKIP,
            seed: 0,
            mode: Mode::FlashDiff,
            priority: 0,
            layout: LayoutKind::Saliency,
            cache_threshold: DEFAULT_CACHE_THRESHOLD,
            ras_ratio: 0.5,
            extrapolate: true,
            monotasks: Some(DEFAULT_MONOTASKS),
            deadline: None,
        }
    }
}

/// Why a request or the engine failed.
#[derive(Debug)]
pub enum EngineError {
    /// The model could not be loaded.
    Weights(WeightsError),
    /// The prompt is not in the model's language.
    Prompt(PromptError),
    /// A setting is out of range: which, and the valid range.
    Config(String),
    /// A policy refused (should not happen for validated input).
    Partition(PartitionError),
    /// Gate refusal.
    Gate(GateError),
    /// Scheduler refusal (admission control included).
    Scheduler(SchedError),
    /// The model refused its input or its tensor library failed.
    Model(ModelError),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Weights(e) => write!(f, "{e}"),
            Self::Prompt(e) => write!(f, "{e}"),
            Self::Config(e) => write!(f, "{e}"),
            Self::Partition(e) => write!(f, "partitioner: {e}"),
            Self::Gate(e) => write!(f, "gate: {e}"),
            Self::Scheduler(e) => write!(f, "scheduler: {e}"),
            Self::Model(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<WeightsError> for EngineError {
    fn from(e: WeightsError) -> Self {
        Self::Weights(e)
    }
}
impl From<PromptError> for EngineError {
    fn from(e: PromptError) -> Self {
        Self::Prompt(e)
    }
}
impl From<ModelError> for EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Weights(e) => Self::Weights(e),
            ModelError::Prompt(e) => Self::Prompt(e),
            e => Self::Model(e),
        }
    }
}
impl From<PartitionError> for EngineError {
    fn from(e: PartitionError) -> Self {
        Self::Partition(e)
    }
}
impl From<GateError> for EngineError {
    fn from(e: GateError) -> Self {
        Self::Gate(e)
    }
}
impl From<SchedError> for EngineError {
    fn from(e: SchedError) -> Self {
        Self::Scheduler(e)
    }
}

/// Where the time of a request went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TimeSplit {
    /// Warm-up steps (model time).
    pub warmup: Duration,
    /// Salient words, saliency map, partition.
    pub partition: Duration,
    /// Gate decisions and importance bookkeeping.
    pub gate: Duration,
    /// Patch-step forwards and commits.
    pub compute: Duration,
    /// Scheduler calls made for this request (placement, dispatch, completion).
    pub schedule: Duration,
    /// Encoding the prompt and the initial noise at submission, decoding the final latent.
    pub io: Duration,
    /// Waiting for a worker (behind other requests' monotasks), handing monotasks to worker
    /// threads or processes, and everything not counted above.
    pub queue: Duration,
}

/// What happened to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Request id.
    pub id: u64,
    /// Total steps.
    pub steps: u32,
    /// Warm-up steps.
    pub warmup: u32,
    /// Patches after the warm-up.
    pub patches: u32,
    /// Patch-steps after the warm-up if nothing were skipped.
    pub patch_steps: u64,
    /// Patch-steps computed.
    pub computed: u64,
    /// Latent tokens computed after the warm-up (sum over computed patch-steps of their size).
    pub computed_tokens: u64,
    /// Active patches per step after the warm-up.
    pub active_per_step: Vec<u32>,
    /// Time split.
    pub time: TimeSplit,
    /// Submit to completion.
    pub latency: Duration,
    /// Share of model work skipped, weighting patch-steps by their tokens (warm-up included
    /// as computed).
    pub work_skipped: f64,
    /// With [`RequestConfig::adaptive_epsilon`]: the sum of the ε the gate used over the
    /// steps it chose one for, and how many steps that was (mean: [`Report::mean_epsilon`]).
    pub epsilon_sum: f64,
    /// See [`Report::epsilon_sum`].
    pub epsilon_steps: u32,
    /// Reuse error: over every patch-step that resumed a skipped patch, the squared
    /// distance between the velocity extrapolation predicted for it and the one computed,
    /// summed, and the squared norm of the computed ones (see [`Report::reuse_error`]).
    pub reuse_err2: f64,
    /// See [`Report::reuse_err2`].
    pub reuse_norm2: f64,
    /// With [`RequestConfig::deadline`]: whether it finished in time.
    pub deadline_met: Option<bool>,
}

impl Report {
    /// Relative RMS error of extrapolated velocities, measured when skipped patches resume
    /// (0 when nothing resumed): how far the skipped steps' stand-ins were from what the
    /// model computed. The adaptive R controller's quality signal.
    pub fn reuse_error(&self) -> f64 {
        if self.reuse_norm2 > 0.0 {
            (self.reuse_err2 / self.reuse_norm2).sqrt()
        } else {
            0.0
        }
    }

    /// Mean load-adaptive ε over the steps after the warm-up; `None` without
    /// [`RequestConfig::adaptive_epsilon`].
    pub fn mean_epsilon(&self) -> Option<f64> {
        (self.epsilon_steps > 0).then(|| self.epsilon_sum / self.epsilon_steps as f64)
    }

    /// Patch-steps skipped, as a share of all patch-steps after the warm-up.
    pub fn skipped_share(&self) -> f64 {
        if self.patch_steps == 0 {
            0.0
        } else {
            1.0 - self.computed as f64 / self.patch_steps as f64
        }
    }
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Output {
    /// Final latent (`tokens x patch_dim`, model space).
    pub latent: Vec<f32>,
    /// The decoded sample: an image, a video's frames or a sound.
    pub sample: Sample,
    /// The report.
    pub report: Report,
    /// The patch layout used.
    pub layout: PatchLayout,
}

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

struct Request {
    cfg: RequestConfig,
    /// The prompt (kept for checkpoints).
    prompt: String,
    /// Submission time on the wall clock (a resumed request's latency counts from it).
    submitted_unix: std::time::SystemTime,
    /// Whether each of the prompt's words is salient (the saliency map's columns).
    salient: Vec<bool>,
    /// The prompt's conditioning on the model's device.
    context: Tensor,
    /// Every step's time conditioning (`steps x cond_len`), computed in one batched call
    /// when the first step after the warm-up opens.
    conds: Vec<f32>,
    state: SharedState,
    layout: Option<PatchLayout>,
    gate: Option<Gate>,
    step: u32,
    active: Vec<bool>,
    report: Report,
    submitted: Instant,
    /// TeaCache: block 0's modulated input at the previous step, and the accumulated change.
    tea: Option<(Vec<f32>, f32)>,
    /// RAS: cached velocities before the last commit.
    ras_prev: Option<Vec<f32>>,
    /// Extrapolation state ([`RequestConfig::extrapolate`]), from the first commit on.
    track: Option<Track>,
    /// When its last checkpoint was written.
    checkpointed: Option<Instant>,
}

/// Per token: the last computed K, V (every block) and velocity, their per-step slopes, and
/// the step the token was last computed at.
struct Track {
    /// Weight of the newest K/V slope measurement ([`KV_SLOPE_SMOOTHING`] or 1).
    kv_weight: f32,
    kv_base: [Vec<f32>; 2],
    kv_slope: [Vec<f32>; 2],
    v_base: Vec<f32>,
    v_slope: Vec<f32>,
    last: Vec<u32>,
}

/// Where monotasks run.
enum Executor {
    /// In the coordinator's own thread.
    InProcess,
    /// In worker threads or processes; `busy[w]` holds the monotasks dispatched to worker
    /// w and not reported, in dispatch order: the first runs (with the time it started, as
    /// far as the coordinator knows: its dispatch, or the report of the one before it), the
    /// others wait in its hand-off queue.
    Workers {
        pool: Box<Pool>,
        busy: Vec<VecDeque<(Tag, Instant)>>,
        replacements: u32,
        health: Health,
    },
}

/// Consecutive losses of workers before they were ready after which the engine stops
/// starting replacements and fails the requests in flight (a worker executable that exits
/// at once must not be respawned forever).
const MAX_STARTUP_FAILURES: u32 = 3;

/// When a silent worker counts as hung: a monotask may run `factor` times the longest one
/// of its kind (warm-up or patch-step) seen so far, and never less than `floor`; before the
/// first of its kind completed, and for a worker not yet ready, `first` more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HangPolicy {
    /// Smallest limit.
    pub floor: Duration,
    /// Multiple of the longest monotask of the same kind seen so far.
    pub factor: f64,
    /// Limit before any monotask of the kind completed (and extra time for a worker that is
    /// still loading its model).
    pub first: Duration,
}

impl Default for HangPolicy {
    fn default() -> Self {
        Self {
            floor: Duration::from_secs(10),
            factor: 20.0,
            first: Duration::from_secs(300),
        }
    }
}

/// Worker health: who is ready, failed starts in a row, measured monotask times.
#[derive(Debug, Default)]
struct Health {
    ready: Vec<bool>,
    startup_failures: u32,
    /// Longest warm-up and longest patch monotask seen.
    longest: [Option<Duration>; 2],
    policy: HangPolicy,
}

impl Health {
    fn new(workers: u32) -> Self {
        Self {
            ready: vec![false; workers as usize],
            ..Self::default()
        }
    }

    fn limit(&self, w: u32, tag: Tag) -> Duration {
        let kind = usize::from(tag.patch != WARMUP_PATCH);
        let p = self.policy;
        let mut limit = match self.longest[kind] {
            None => p.first,
            Some(d) => d.mul_f64(p.factor).max(p.floor),
        };
        if !self.ready.get(w as usize).copied().unwrap_or(false) {
            limit += p.first;
        }
        limit
    }

    fn observed(&mut self, tag: Tag, d: Duration) {
        let kind = usize::from(tag.patch != WARMUP_PATCH);
        self.longest[kind] = Some(self.longest[kind].map_or(d, |l| l.max(d)));
    }
}

/// The engine: one model, a scheduler over `workers` virtual workers, the adaptive-R
/// controller, and the requests in flight.
pub struct Engine {
    model: Arc<dyn Denoiser>,
    layout: Layout,
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
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.model)
            .field("workers", &self.workers)
            .finish()
    }
}

/// Where request state files go: `/dev/shm` (memory) when it exists, else the temporary
/// directory.
pub fn state_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.into()
    } else {
        std::env::temp_dir()
    }
}

/// The shipped weights: `$FLASHDIFF_WEIGHTS`, or `models/tinydit/tinydit.safetensors` of the
/// source tree this binary was built from.
pub fn default_weights() -> PathBuf {
    std::env::var_os("FLASHDIFF_WEIGHTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| builtin_weights("tinydit").expect("tinydit is built in"))
}

/// The built-in models, by name: image, video, audio.
pub const BUILTIN_MODELS: [&str; 3] = ["tinydit", "tinyvideo", "tinyaudio"];

/// The shipped weights of a built-in model (`models/NAME/NAME.safetensors` of the source
/// tree this binary was built from); `None` for a name not in [`BUILTIN_MODELS`].
pub fn builtin_weights(name: &str) -> Option<PathBuf> {
    BUILTIN_MODELS.contains(&name).then(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../models/{name}/{name}.safetensors"))
    })
}

impl Engine {
    /// An engine over the model at `weights` with `workers` workers in this process: with
    /// one, monotasks run on the coordinator's thread; with more, on that many worker
    /// threads sharing the model (request state in files under [`state_dir`]).
    pub fn new(weights: &Path, workers: u32) -> Result<Self, EngineError> {
        Self::new_on(weights, workers, &Device::Cpu)
    }

    /// [`Engine::new`] with the model on `device` (see `flashdiff_models::device`); request
    /// state stays in host memory and is copied to the device per monotask.
    pub fn new_on(weights: &Path, workers: u32, device: &Device) -> Result<Self, EngineError> {
        flashdiff_kernels::flush_denormals_to_zero();
        let model: Arc<dyn Denoiser> = Arc::new(TinyDit::load(weights, device)?);
        if workers <= 1 {
            return Self::with_model(model, workers, None);
        }
        Self::with_threads(model, workers, &state_dir())
    }

    /// An engine whose `workers` are threads of this process sharing `model`, with request
    /// state in memory-mapped files under `shm_dir` that every thread maps.
    pub fn with_threads(
        model: Arc<dyn Denoiser>,
        workers: u32,
        shm_dir: &Path,
    ) -> Result<Self, EngineError> {
        let mut e = Self::with_model(model.clone(), workers, Some(shm_dir.to_path_buf()))?;
        let pool = Box::new(Pool::threads(model, workers).map_err(EngineError::Config)?);
        e.use_pool(pool, workers)?;
        Ok(e)
    }

    /// An engine whose `workers` run as child processes of `exe` (`exe worker ...`), with
    /// request state in memory-mapped files under `shm_dir` (e.g. `/dev/shm`).
    pub fn with_processes(
        weights: &Path,
        workers: u32,
        exe: &Path,
        shm_dir: &Path,
    ) -> Result<Self, EngineError> {
        let mut e = Self::build(weights, workers, Some(shm_dir.to_path_buf()))?;
        let pool = Box::new(Pool::new(exe, weights, workers).map_err(EngineError::Config)?);
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

    fn build(weights: &Path, workers: u32, shm: Option<PathBuf>) -> Result<Self, EngineError> {
        flashdiff_kernels::flush_denormals_to_zero();
        if workers == 0 || workers > 1024 {
            return Err(EngineError::Config(format!(
                "--workers {workers}: must be in 1..=1024"
            )));
        }
        let model: Arc<dyn Denoiser> = Arc::new(TinyDit::load(weights, &Device::Cpu)?);
        Self::with_model(model, workers, shm)
    }

    /// An engine over any model, with `workers` virtual workers in this process.
    pub fn with_model(
        model: Arc<dyn Denoiser>,
        workers: u32,
        shm: Option<PathBuf>,
    ) -> Result<Self, EngineError> {
        if workers == 0 || workers > 1024 {
            return Err(EngineError::Config(format!(
                "--workers {workers}: must be in 1..=1024"
            )));
        }
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
        let layout = Layout::new(model.dims());
        let state_dir = match &shm {
            None => None,
            Some(root) => Some(crate::state::StateDir::create(root).map_err(|e| {
                EngineError::Config(format!(
                    "cannot create the engine's state directory under {}: {e}",
                    root.display()
                ))
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
        })
    }

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

    /// Admits a request. Prompt and settings are checked here, so a bad request fails alone.
    pub fn submit(&mut self, id: u64, prompt: &str, cfg: RequestConfig) -> Result<(), EngineError> {
        self.validate(&cfg)?;
        if self.requests.contains_key(&id) {
            return Err(EngineError::Config(format!(
                "request id {id} is already in flight"
            )));
        }
        let submitted = Instant::now();
        let dims = self.model.dims().clone();
        let c = self.model.condition(prompt)?;
        let context = Tensor::from_slice(&c.context, c.context.len(), self.model.device())
            .map_err(ModelError::from)?;
        let tokens = dims.grid.tokens();
        let mut state = SharedState::create(self.layout.clone(), self.shm.as_deref(), id)
            .map_err(|e| EngineError::Config(format!("cannot create request state: {e}")))?;
        state
            .get_mut(Region::X0)
            .copy_from_slice(&noise(cfg.seed, tokens * dims.channels));
        state.get_mut(Region::Context).copy_from_slice(&c.context);
        // Deadlines on the engine's clock: seconds since it was built.
        let deadline = cfg
            .deadline
            .map(|d| (submitted + d - self.origin).as_secs_f64());
        self.sched.submit_with_deadline(
            id,
            cfg.priority,
            (cfg.warmup as usize * tokens) as f64,
            deadline,
        )?;
        let req = Request {
            salient: c.salient,
            context,
            conds: Vec::new(),
            state,
            layout: None,
            gate: None,
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
                epsilon_sum: 0.0,
                epsilon_steps: 0,
                reuse_err2: 0.0,
                reuse_norm2: 0.0,
                deadline_met: None,
            },
            prompt: prompt.to_string(),
            submitted_unix: std::time::SystemTime::now(),
            cfg,
            submitted,
            tea: None,
            ras_prev: None,
            track: None,
            checkpointed: None,
        };
        self.requests.insert(id, req);
        Ok(())
    }

    /// Drops a request in flight; it is reported as cancelled by the next [`Engine::run`].
    pub fn cancel(&mut self, id: u64) -> Result<(), EngineError> {
        if !self.requests.contains_key(&id) {
            return Err(EngineError::Config(format!(
                "request {id} is not in flight"
            )));
        }
        self.fail(
            id,
            EngineError::Config(format!("request {id} was cancelled")),
        );
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

    /// Runs monotasks until every request in flight has finished; `progress(id, step, steps)`
    /// is called after every completed step. Returns the finished requests (or their errors).
    pub fn run(
        &mut self,
        progress: &mut dyn FnMut(u64, u32, u32),
    ) -> Vec<Result<Output, (u64, EngineError)>> {
        while !self.requests.is_empty() {
            self.poll(progress, Duration::from_secs(3600));
        }
        std::mem::take(&mut self.finished)
    }

    /// One round of work: every idle worker gets its next monotask (in-process: run at once);
    /// with worker processes, then waits up to `timeout` for one of them to report. Finished
    /// requests collect for [`Engine::take_finished`]. For callers that admit requests while
    /// others run (a serving loop).
    pub fn poll(&mut self, progress: &mut dyn FnMut(u64, u32, u32), timeout: Duration) {
        if self.requests.is_empty() {
            return;
        }
        if let Executor::Workers { pool, health, .. } = &mut self.exec {
            // Every worker is gone (they kept dying at start, or none could be started): new
            // requests get a fresh try at starting one.
            if !(0..self.sched.workers()).any(|w| pool.is_live(w) && self.sched.is_alive(w)) {
                health.startup_failures = 0;
                self.start_replacement();
                if self.requests.is_empty() {
                    return;
                }
            }
        }
        let mut dispatched = false;
        // Breadth first: every idle worker gets a monotask before any gets one ahead.
        let rounds = match self.exec {
            Executor::InProcess => 1,
            Executor::Workers { .. } => self.sched.config().depth,
        };
        let workers = self.sched.workers();
        for (round, w) in (0..rounds).flat_map(|r| (0..workers).map(move |w| (r, w))) {
            if let Executor::Workers { busy, health, .. } = &self.exec {
                // A worker gets monotasks once it is ready (model loaded): one that dies
                // while starting has run nothing, so its death costs no monotask an attempt.
                if busy
                    .get(w as usize)
                    .is_none_or(|b| b.len() != round as usize)
                    || !health.ready.get(w as usize).copied().unwrap_or(false)
                {
                    continue;
                }
            }
            let t_sched = Instant::now();
            let next = self.sched.next(w);
            let sched_time = t_sched.elapsed();
            let a = match next {
                Ok(Some(a)) => a,
                Ok(None) | Err(SchedError::WorkerDead(_)) => continue,
                Err(e) => {
                    self.fail_all(EngineError::Scheduler(e));
                    break;
                }
            };
            dispatched = true;
            let tag = a.task.tag;
            if let Some(r) = self.requests.get_mut(&tag.request) {
                r.report.time.schedule += sched_time;
            }
            match &mut self.exec {
                Executor::InProcess => {
                    let t0 = Instant::now();
                    let res = self.execute_here(tag);
                    self.account(tag, t0.elapsed());
                    match res {
                        Ok(()) => self.completed(w, tag, progress),
                        Err(e) => self.failed(w, tag, e),
                    }
                }
                Executor::Workers { pool, busy, .. } => {
                    let Some(r) = self.requests.get(&tag.request) else {
                        continue;
                    };
                    let order = Order::Run {
                        request: tag.request,
                        step: tag.step,
                        patch: tag.patch,
                        steps: r.cfg.steps,
                        warmup: r.cfg.warmup,
                        isolated: r.cfg.mode == Mode::NaivePatch,
                        state: r
                            .state
                            .path()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                    };
                    busy[w as usize].push_back((tag, Instant::now()));
                    // A broken pipe shows up as the worker's Lost event.
                    pool.send(w, &order);
                }
            }
        }
        if let Executor::Workers {
            busy, health, pool, ..
        } = &self.exec
        {
            let starting = (0..self.sched.workers()).any(|w| {
                pool.is_live(w) && !health.ready.get(w as usize).copied().unwrap_or(false)
            });
            if starting || busy.iter().any(|b| !b.is_empty()) {
                self.wait_worker(progress, timeout);
                return;
            }
        }
        if !dispatched && !self.requests.is_empty() {
            // Nothing runnable yet nothing finished: a bug, never a hang.
            self.fail_all(EngineError::Config(
                "scheduler has no runnable monotask for requests in flight".into(),
            ));
        }
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

    /// Handles one event from the workers, waiting at most `timeout` (less when a busy
    /// worker's hang limit comes first); kills workers silent past their limit.
    fn wait_worker(&mut self, progress: &mut dyn FnMut(u64, u32, u32), timeout: Duration) {
        let Executor::Workers {
            pool, busy, health, ..
        } = &mut self.exec
        else {
            return;
        };
        let now = Instant::now();
        let first_limit = busy
            .iter()
            .enumerate()
            .filter_map(|(w, b)| b.front().map(|&(tag, t0)| t0 + health.limit(w as u32, tag)))
            .min();
        let wait = first_limit.map_or(timeout, |t| timeout.min(t.saturating_duration_since(now)));
        let got = match pool.recv_timeout(wait) {
            Ok(x) => Some(x),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return self.fail_all(EngineError::Config("all workers are gone".into()));
            }
        };
        if let Some((w, ev)) = got {
            self.worker_event(w, ev, progress);
        }
        self.kill_hung();
    }

    /// Workers silent past their hang limit are killed; their monotasks run again.
    fn kill_hung(&mut self) {
        let Executor::Workers { busy, health, .. } = &self.exec else {
            return;
        };
        let now = Instant::now();
        let hung: Vec<(u32, Tag, Duration)> = busy
            .iter()
            .enumerate()
            .filter_map(|(w, b)| {
                let &(tag, t0) = b.front()?;
                let limit = health.limit(w as u32, tag);
                (now.duration_since(t0) > limit).then_some((w as u32, tag, limit))
            })
            .collect();
        for (w, tag, limit) in hung {
            self.lose_worker(
                w,
                format!(
                    "silent for more than {:.1} s while running {tag} (hung); killed",
                    limit.as_secs_f64()
                ),
            );
        }
    }

    fn worker_event(&mut self, w: u32, ev: Event, progress: &mut dyn FnMut(u64, u32, u32)) {
        let Executor::Workers { pool, health, .. } = &mut self.exec else {
            return;
        };
        if !pool.is_live(w) {
            // A late word from a worker already reaped (lost, hung): its monotasks were
            // re-queued; nothing it says counts.
            return;
        }
        let (tag, err) = match ev {
            Event::Lost(why) => return self.lose_worker(w, why),
            Event::Report(WorkerReport::Ready) => {
                if let Some(r) = health.ready.get_mut(w as usize) {
                    *r = true;
                }
                health.startup_failures = 0;
                return;
            }
            Event::Report(WorkerReport::Done {
                request,
                step,
                patch,
            }) => (
                Tag {
                    request,
                    step,
                    patch,
                },
                None,
            ),
            Event::Report(WorkerReport::Failed {
                request,
                step,
                patch,
                error,
            }) => (
                Tag {
                    request,
                    step,
                    patch,
                },
                Some(error),
            ),
        };
        let started = match &mut self.exec {
            Executor::Workers { busy, health, .. } => busy.get_mut(w as usize).and_then(|b| {
                // A worker runs what it holds in order: the one reported was the first, and
                // the next one started now.
                let at = b.iter().position(|(t, _)| *t == tag)?;
                let (t, t0) = b.remove(at)?;
                if at == 0 {
                    health.observed(t, t0.elapsed());
                    if let Some(next) = b.front_mut() {
                        next.1 = Instant::now();
                    }
                }
                (at == 0).then_some(t0)
            }),
            Executor::InProcess => None,
        };
        if let Some(t0) = started {
            self.account(tag, t0.elapsed());
        }
        match err {
            None => self.completed(w, tag, progress),
            Some(e) => self.failed(w, tag, e),
        }
    }

    /// Worker `w` is gone (exited, killed, hung, unreadable): its monotasks run again on the
    /// others (its running one counts an attempt), and a replacement starts unless workers
    /// keep dying before they are ready.
    fn lose_worker(&mut self, w: u32, why: String) {
        let Executor::Workers {
            pool, busy, health, ..
        } = &mut self.exec
        else {
            return;
        };
        if !pool.is_live(w) {
            return;
        }
        pool.reap(w);
        if let Some(b) = busy.get_mut(w as usize) {
            b.clear();
        }
        let was_ready = health.ready.get(w as usize).copied().unwrap_or(false);
        if !was_ready {
            health.startup_failures += 1;
        }
        let give_up = health.startup_failures >= MAX_STARTUP_FAILURES;
        log::warn!("worker {w} lost ({why})");
        let lost = self.sched.worker_lost(w).unwrap_or_default();
        if let Some(id) = lost.failed {
            self.fail(
                id,
                EngineError::Config(format!(
                    "a monotask of request {id} was running on a lost worker for the {} time \
                     (last: {why}); the request fails, the others go on",
                    self.sched.config().max_attempts
                )),
            );
        }
        if give_up {
            self.fail_all(EngineError::Config(format!(
                "workers keep exiting before they are ready ({MAX_STARTUP_FAILURES} in a row; \
                 last: {why}); no replacement is started until the next request"
            )));
            return;
        }
        self.start_replacement();
    }

    /// Starts one more worker in place of a lost one; if that fails and no worker is left,
    /// the requests in flight fail instead of waiting forever.
    fn start_replacement(&mut self) {
        let Executor::Workers {
            pool,
            busy,
            replacements,
            health,
        } = &mut self.exec
        else {
            return;
        };
        let started = self
            .sched
            .add_worker()
            .map_err(|e| e.to_string())
            .and_then(|id| {
                let r = pool.spawn(id);
                if r.is_err() {
                    let _ = self.sched.worker_lost(id);
                }
                r.map(|()| id)
            });
        match started {
            Ok(id) => {
                *replacements += 1;
                if busy.len() <= id as usize {
                    busy.resize(id as usize + 1, VecDeque::new());
                }
                if health.ready.len() <= id as usize {
                    health.ready.resize(id as usize + 1, false);
                }
            }
            Err(e) => {
                log::error!("cannot start a replacement worker: {e}");
                let alive = (0..self.sched.workers()).any(|w| self.sched.is_alive(w));
                if !alive {
                    self.fail_all(EngineError::Config(format!(
                        "no worker is left and none can be started: {e}"
                    )));
                }
            }
        }
    }

    fn account(&mut self, tag: Tag, d: Duration) {
        if let Some(r) = self.requests.get_mut(&tag.request) {
            if tag.patch == WARMUP_PATCH {
                r.report.time.warmup += d;
            } else {
                r.report.time.compute += d;
            }
        }
    }

    fn completed(&mut self, w: u32, tag: Tag, progress: &mut dyn FnMut(u64, u32, u32)) {
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

    fn failed(&mut self, w: u32, tag: Tag, why: String) {
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

    /// One request, start to end.
    pub fn generate(
        &mut self,
        prompt: &str,
        cfg: RequestConfig,
        progress: &mut dyn FnMut(u64, u32, u32),
    ) -> Result<Output, EngineError> {
        let id = u64::MAX - 1;
        self.submit(id, prompt, cfg)?;
        let mut out = self.run(progress);
        match out.pop() {
            Some(Ok(o)) => Ok(o),
            Some(Err((_, e))) => Err(e),
            None => Err(EngineError::Config("request vanished".into())),
        }
    }

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
            create_private_dir(d).map_err(|e| {
                EngineError::Config(format!("checkpoint directory {}: {e}", d.display()))
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

    fn save_checkpoint(&mut self, id: u64) {
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
        let bad = |m: String| EngineError::Config(format!("checkpoint of request {}: {m}", c.id));
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
        let (layout, gate, track) =
            restore_policies(&c, self.model.dims()).map_err(|e| match e {
                EngineError::Config(m) => bad(m),
                e => e,
            })?;
        let cond = self.model.condition(&c.prompt)?;
        let context = Tensor::from_slice(&cond.context, cond.context.len(), self.model.device())
            .map_err(ModelError::from)?;
        let mut state = SharedState::create(self.layout.clone(), self.shm.as_deref(), c.id)
            .map_err(|e| EngineError::Config(format!("cannot create request state: {e}")))?;
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
                gate: Some(gate),
                step: c.step,
                active: c.active,
                report,
                cfg,
                submitted,
                tea: c.tea,
                ras_prev: c.ras_prev,
                track,
                checkpointed: Some(Instant::now()),
            },
        );
        self.open_step(id, &mut |_, _, _| {});
        Ok(())
    }

    fn forget(&mut self, id: u64) {
        if let Executor::Workers { pool, .. } = &mut self.exec {
            pool.broadcast(&Order::Forget { request: id });
        }
        if let Some(dir) = &self.checkpoints {
            let _ = std::fs::remove_file(checkpoint::path(dir, id));
        }
    }

    fn fail(&mut self, id: u64, e: EngineError) {
        if self.requests.remove(&id).is_some() {
            let _ = self.sched.cancel(id);
            self.forget(id);
            self.finished.push(Err((id, e)));
        }
    }

    fn fail_all(&mut self, e: EngineError) {
        let ids: Vec<u64> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail(id, EngineError::Config(e.to_string()));
        }
    }

    fn execute_here(&mut self, tag: Tag) -> Result<(), String> {
        let Some(r) = self.requests.get_mut(&tag.request) else {
            return Ok(());
        };
        let task = if tag.patch == WARMUP_PATCH {
            Task::Warmup {
                steps: r.cfg.steps,
                warmup: r.cfg.warmup,
            }
        } else {
            Task::Patches {
                monotask: tag.patch,
                isolated: r.cfg.mode == Mode::NaivePatch,
            }
        };
        exec::run(&*self.model, &mut r.state, task)
    }

    fn after_warmup(&mut self, id: u64) {
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
        let r_count = match r.cfg.mode {
            Mode::Full | Mode::TeaCache => 1,
            Mode::Ras => 2,
            _ => r.cfg.patches.unwrap_or_else(|| self.granularity.current()),
        };
        let uniform = r.cfg.layout == LayoutKind::Uniform
            || matches!(r.cfg.mode, Mode::NaivePatch | Mode::Ras);
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
        let eps = if r.cfg.mode == Mode::FlashDiff {
            r.cfg.epsilon
        } else {
            0.0
        };
        let gate = match Gate::new(
            layout.patches() as usize,
            GateConfig {
                epsilon: eps,
                eta: flashdiff_gate::DEFAULT_ETA,
                max_skip: r.cfg.max_skip,
            },
        ) {
            Ok(g) => g,
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
        r.gate = Some(gate);
        r.report.time.partition += t0.elapsed();
    }

    fn open_step(&mut self, id: u64, progress: &mut dyn FnMut(u64, u32, u32)) {
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
        progress(id, r.step, r.cfg.steps);
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
        if r.cfg.mode == Mode::TeaCache {
            match Self::tea_skip(&*self.model, r) {
                Ok(true) => return self.open_step(id, progress),
                Ok(false) => {}
                Err(e) => return self.fail(id, e.into()),
            }
        }
        let t0 = Instant::now();
        if let Err(e) = Self::choose_active(&*self.model, r, load) {
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

    /// Decides the step's active patches: RAS picks its regions, the others ask the gate
    /// (every patch in the final steps; the load's ε with load-adaptive ε).
    fn choose_active(model: &dyn Denoiser, r: &mut Request, load: f32) -> Result<(), EngineError> {
        let final_full = r.step + FINAL_FULL_STEPS >= r.cfg.steps;
        if r.cfg.mode == Mode::Ras {
            return Self::ras_select(model, r, final_full).map_err(EngineError::Config);
        }
        let gate = r.gate.as_mut().expect("partitioned");
        let eps = if final_full {
            // ε = 0 never skips: the gate itself records every patch as run.
            Some(0.0)
        } else if r.cfg.adaptive_epsilon && r.cfg.mode == Mode::FlashDiff {
            let e = adaptive_epsilon(r.cfg.epsilon).epsilon(load);
            r.report.epsilon_sum += e as f64;
            r.report.epsilon_steps += 1;
            Some(e)
        } else {
            None
        };
        if let Some(e) = eps {
            gate.set_epsilon(e)?;
        }
        gate.decide(&mut r.active)?;
        Ok(())
    }

    /// Packs the step's active patches into monotasks (numbered from 0, written to the
    /// state's monotask map), writes the extrapolated K/V rows they will read, counts the
    /// step in the report, and returns each monotask's cost (its tokens).
    fn pack_step(model: &dyn Denoiser, r: &mut Request, workers: u32) -> Vec<(u32, f64)> {
        let layout = r.layout.as_ref().expect("partitioned");
        let active: Vec<(u32, usize)> = (0..layout.patches())
            .filter(|&p| r.active[p as usize])
            .map(|p| (p, layout.patch_tokens(p).len()))
            .collect();
        let monotask_of = pack_monotasks(&active, monotask_limit(&r.cfg, workers));
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

    /// Whole-step caching: skips the step (advancing with the cached velocity) when the
    /// accumulated relative L1 change of block 0's modulated input is under the threshold.
    fn tea_skip(model: &dyn Denoiser, r: &mut Request) -> Result<bool, ModelError> {
        let t0 = Instant::now();
        let h = model.time(r.step, r.cfg.steps) - model.time(r.step + 1, r.cfg.steps);
        let dims = model.dims();
        let at = r.step as usize * dims.cond_len;
        let cond = Tensor::from_slice(
            &r.conds[at..at + dims.cond_len],
            dims.cond_len,
            model.device(),
        )?;
        let x = Tensor::from_slice(
            r.state.get(Region::X),
            (dims.grid.tokens(), dims.channels),
            model.device(),
        )?;
        let step = StepInput {
            context: &r.context,
            cond: &cond,
        };
        let m = model
            .first_block_input(&x, step)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let final_full = r.step + FINAL_FULL_STEPS >= r.cfg.steps;
        let acc = match &r.tea {
            Some((prev, acc)) => {
                let num: f32 = m.iter().zip(prev).map(|(a, b)| (a - b).abs()).sum();
                let den: f32 = prev.iter().map(|b| b.abs()).sum::<f32>().max(1e-12);
                acc + num / den
            }
            None => f32::INFINITY,
        };
        let skip = acc < r.cfg.cache_threshold && !final_full;
        r.tea = Some((m, if skip { acc } else { 0.0 }));
        r.report.time.gate += t0.elapsed();
        if skip {
            let (v, x) = r.state.get_pair(Region::V, Region::X);
            for (xi, vi) in x.iter_mut().zip(v) {
                *xi -= h * vi;
            }
            r.step += 1;
            r.report.active_per_step.push(0);
            r.report.patch_steps += 1;
        }
        Ok(skip)
    }

    /// RAS-style selection: patch 0 = the 2x2 regions whose velocity changed most in the last
    /// step (the `ras_ratio` share), patch 1 = the rest, which runs only on dense steps.
    fn ras_select(model: &dyn Denoiser, r: &mut Request, final_full: bool) -> Result<(), String> {
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
        let v = r.state.get(Region::V);
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
        r.layout =
            Some(PatchLayout::from_assignment(grid, patch_of, 2).map_err(|e| e.to_string())?);
        r.active = vec![true, dense];
        Ok(())
    }

    /// The step's barrier: every active patch-step wrote its fresh rows; commit them, feed the
    /// gate, and advance the whole latent.
    fn commit_step(&mut self, id: u64) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let t0 = Instant::now();
        let cfg = self.model.dims();
        let (tokens, pd, d) = (cfg.grid.tokens(), cfg.channels, cfg.kv_dim);
        if r.cfg.mode == Mode::Ras {
            r.ras_prev = Some(r.state.get(Region::V).to_vec());
        }
        let mode = r.cfg.mode;
        if r.cfg.extrapolate && r.track.is_none() && matches!(mode, Mode::FlashDiff | Mode::NoSkip)
        {
            // First commit after the warm-up, whose last step computed every token.
            let one = monotask_limit(&r.cfg, self.workers) == 1;
            let w = if one { 1.0 } else { KV_SLOPE_SMOOTHING };
            r.track = Some(Track::start(&r.state, r.step.saturating_sub(1), cfg, w));
        }
        let layout = r.layout.as_ref().expect("partitioned");
        let gate = r.gate.as_mut().expect("partitioned");
        for p in (0..layout.patches()).filter(|&p| r.active[p as usize]) {
            for &t in layout.patch_tokens(p) {
                let t = t as usize;
                // With extrapolation, `write_cache` writes the rows the next step reads.
                if r.track.is_none() {
                    for l in 0..cfg.kv_layers {
                        let at = (l * tokens + t) * d;
                        let (src, dst) = r.state.get_pair(Region::FreshK, Region::CacheK);
                        dst[at..at + d].copy_from_slice(&src[at..at + d]);
                        let (src, dst) = r.state.get_pair(Region::FreshV, Region::CacheV);
                        dst[at..at + d].copy_from_slice(&src[at..at + d]);
                    }
                }
                let (src, dst) = r.state.get_pair(Region::FreshVel, Region::V);
                dst[t * pd..(t + 1) * pd].copy_from_slice(&src[t * pd..(t + 1) * pd]);
            }
            let importance = r.state.get(Region::Importance)[p as usize];
            // RAS picks its own tokens; the gate only follows saliency/uniform patches.
            if mode == Mode::Ras {
                continue;
            }
            if let Err(e) = gate.observe(p as usize, importance) {
                return self.fail(id, e.into());
            }
        }
        if let Some(tr) = r.track.as_mut() {
            let (e2, n2) = extrapolate(&mut r.state, tr, layout, &r.active, r.step, cfg);
            r.report.reuse_err2 += e2;
            r.report.reuse_norm2 += n2;
        }
        let h = self.model.time(r.step, r.cfg.steps) - self.model.time(r.step + 1, r.cfg.steps);
        let (v, x) = r.state.get_pair(Region::V, Region::X);
        for (xi, vi) in x.iter_mut().zip(v) {
            *xi -= h * vi;
        }
        r.step += 1;
        r.report.time.compute += t0.elapsed();
    }

    fn finish(&mut self, id: u64) {
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        let _ = self.sched.finish(id);
        self.forget(id);
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
        // Work: warm-up steps are full; after that, the tokens actually computed.
        let tokens = cfg.grid.tokens() as f64;
        let after = (r.cfg.steps - r.cfg.warmup) as f64 * tokens;
        let total = r.cfg.steps as f64 * tokens;
        r.report.work_skipped = ((after - r.report.computed_tokens as f64) / total).max(0.0);
        if r.cfg.patches.is_none() && r.cfg.mode != Mode::Full {
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
}

/// Creates `dir` (and its parents) if missing, mode 0700; refuses one that is not a
/// directory.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if !dir.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    Ok(())
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::FlashDiff => "flashdiff",
        Mode::NoSkip => "no-skip",
        Mode::Full => "full",
        Mode::NaivePatch => "naive-patch",
        Mode::TeaCache => "teacache",
        Mode::Ras => "ras",
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
        seed: c.seed,
        mode: mode_name(c.mode).into(),
        priority: c.priority,
        layout: u8::from(c.layout == LayoutKind::Uniform),
        cache_threshold: c.cache_threshold,
        ras_ratio: c.ras_ratio,
        extrapolate: c.extrapolate,
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
        extrapolate: c.extrapolate,
        monotasks: c.monotasks,
        deadline: c.deadline_ns.map(Duration::from_nanos),
    })
}

/// A checkpoint's patch layout, gate and extrapolation state, each checked against the
/// model (untrusted input).
fn restore_policies(
    c: &Checkpoint,
    dims: &Dims,
) -> Result<(PatchLayout, Gate, Option<Track>), EngineError> {
    let bad = |m: &str| EngineError::Config(m.to_string());
    let g = dims.grid;
    let grid = Grid::new(g.frames as u32, g.height as u32, g.width as u32)?;
    let layout = PatchLayout::from_assignment(grid, c.patch_of.clone(), c.patches)?;
    let gate = Gate::from_state(flashdiff_gate::GateState {
        cfg: GateConfig {
            epsilon: c.gate.epsilon,
            eta: c.gate.eta,
            max_skip: c.gate.max_skip,
        },
        r_bar: c.gate.r_bar.clone(),
        delta: c.gate.delta.clone(),
        seen: c.gate.seen.clone(),
        skipped_run: c.gate.skipped_run.clone(),
        active: c.gate.active.clone(),
        weights: c.gate.weights.clone(),
        steps: c.gate.steps,
    })?;
    if gate.patches() != layout.patches() as usize || c.active.len() != gate.patches() {
        return Err(bad("gate and layout disagree on the patch count"));
    }
    let tokens = g.tokens();
    let vel = tokens * dims.channels;
    let kv = dims.kv_layers * tokens * dims.kv_dim;
    // TeaCache's block-0 input is tokens x the model's width.
    if c.tea.as_ref().is_some_and(|(v, _)| v.len() % tokens != 0)
        || c.ras_prev.as_ref().is_some_and(|v| v.len() != vel)
    {
        return Err(bad("cached velocities of the wrong size"));
    }
    let Some(t) = &c.track else {
        return Ok((layout, gate, None));
    };
    let ok = [&t.k_base, &t.v_base_kv, &t.k_slope, &t.v_slope_kv]
        .iter()
        .all(|v| v.len() == kv)
        && t.v_base.len() == vel
        && t.v_slope.len() == vel
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
        last: t.last.clone(),
    };
    Ok((layout, gate, Some(track)))
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
        epsilon_sum: rr.epsilon_sum,
        epsilon_steps: rr.epsilon_steps,
        reuse_err2: rr.reuse_err2,
        reuse_norm2: rr.reuse_norm2,
        deadline_met: None,
    }
}

/// A request between steps as a checkpoint (`None` before its partition).
fn to_checkpoint(id: u64, r: &Request) -> Option<Checkpoint> {
    let layout = r.layout.as_ref()?;
    let gate = r.gate.as_ref()?.state();
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
        gate: checkpoint::GateRecord {
            epsilon: gate.cfg.epsilon,
            eta: gate.cfg.eta,
            max_skip: gate.cfg.max_skip,
            r_bar: gate.r_bar,
            delta: gate.delta,
            seen: gate.seen,
            skipped_run: gate.skipped_run,
            active: gate.active,
            weights: gate.weights,
            steps: gate.steps,
        },
        track: r.track.as_ref().map(|t| checkpoint::TrackRecord {
            kv_weight: t.kv_weight,
            k_base: t.kv_base[0].clone(),
            v_base_kv: t.kv_base[1].clone(),
            k_slope: t.kv_slope[0].clone(),
            v_slope_kv: t.kv_slope[1].clone(),
            v_base: t.v_base.clone(),
            v_slope: t.v_slope.clone(),
            last: t.last.clone(),
        }),
        tea: r.tea.clone(),
        ras_prev: r.ras_prev.clone(),
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
            reuse_norm2: rep.reuse_norm2,
        },
        regions: checkpoint::SAVED_REGIONS
            .iter()
            .map(|&reg| r.state.get(reg).to_vec())
            .collect(),
    })
}

/// Checks a request's settings against `model`; the error names the setting (as the
/// request's field: `"max_skip"` is the CLI's `--max-skip`) and its valid range. What
/// [`Engine::validate`] and [`Engine::submit`] do, for callers without an engine.
pub fn check_request(model: &dyn Denoiser, cfg: &RequestConfig) -> Result<(), EngineError> {
    let bad = |s: String| Err(EngineError::Config(s));
    if !(2..=1000).contains(&cfg.steps) {
        return bad(format!("\"steps\" {}: must be in 2..=1000", cfg.steps));
    }
    if cfg.warmup < 1 || cfg.warmup >= cfg.steps {
        return bad(format!(
            "\"warmup\" {}: must be in 1..={} (below \"steps\")",
            cfg.warmup,
            cfg.steps - 1
        ));
    }
    let tokens = model.dims().grid.tokens() as u32;
    if let Some(r) = cfg.patches {
        if r == 0 || r > tokens {
            return bad(format!(
                "\"patches\" {r}: must be in 1..={tokens} (tokens in the latent)"
            ));
        }
    }
    if !(cfg.epsilon.is_finite() && (0.0..=1.0).contains(&cfg.epsilon)) {
        return bad(format!("\"epsilon\" {}: must be in [0, 1]", cfg.epsilon));
    }
    if !(cfg.ras_ratio > 0.0 && cfg.ras_ratio < 1.0) {
        return bad(format!(
            "\"ras_ratio\" {}: must be in (0, 1)",
            cfg.ras_ratio
        ));
    }
    if !(cfg.cache_threshold.is_finite() && cfg.cache_threshold >= 0.0) {
        return bad(format!(
            "\"cache_threshold\" {}: must be finite and >= 0",
            cfg.cache_threshold
        ));
    }
    if cfg.monotasks == Some(0) {
        return bad("\"monotasks\" 0: must be at least 1".into());
    }
    if cfg.max_skip > 1000 {
        return bad(format!(
            "\"max_skip\" {}: must be in 0..=1000",
            cfg.max_skip
        ));
    }
    if cfg.priority as usize >= flashdiff_scheduler::PRIORITY_LEVELS {
        return bad(format!(
            "\"priority\" {}: must be in 0..{}",
            cfg.priority,
            flashdiff_scheduler::PRIORITY_LEVELS
        ));
    }
    Ok(())
}

/// The load-adaptive ε policy of a request whose ε at full load is `base`
/// ([`RequestConfig::adaptive_epsilon`]).
pub fn adaptive_epsilon(base: f32) -> LoadAdaptiveEpsilon {
    LoadAdaptiveEpsilon {
        eps_min: base / 2.0,
        eps_base: base,
        eps_max: (2.0 * base).min(1.0),
        low: 0.5,
        high: 1.5,
    }
}

/// The most monotasks a step of a request with `cfg` runs in ([`RequestConfig::monotasks`]);
/// NaivePatch always runs one patch per monotask.
fn monotask_limit(cfg: &RequestConfig, workers: u32) -> usize {
    match cfg.mode {
        Mode::NaivePatch => usize::MAX,
        _ => cfg.monotasks.unwrap_or(workers) as usize,
    }
}

/// Packs a step's active patches `(patch, tokens)` (ascending patch ids) into at most `most`
/// monotasks: consecutive patches (the partitioner numbers neighbours consecutively, so a
/// monotask holds patches that attend to each other most), balanced by tokens, each
/// monotask non-empty. Returns each patch's monotask, numbered from 0.
pub fn pack_monotasks(active: &[(u32, usize)], most: usize) -> Vec<u32> {
    if most >= active.len() {
        return (0..active.len() as u32).collect();
    }
    let total: usize = active.iter().map(|a| a.1).sum::<usize>().max(1);
    let g = most.max(1);
    let (mut cum, mut share, mut next) = (0usize, None, 0u32);
    let mut out = Vec::with_capacity(active.len());
    for &(_, n) in active {
        // The share of the tokens (of g equal shares) that holds this patch's midpoint; a
        // new share opens a new monotask, so monotasks are consecutive and never empty.
        let s = ((2 * cum + n) * g / (2 * total)).min(g - 1);
        cum += n;
        if share.is_some_and(|prev| s > prev) {
            next += 1;
        }
        share = Some(s);
        out.push(next);
    }
    out
}

impl Track {
    /// Starts tracking from the state the warm-up left: every token computed at `at`.
    fn start(state: &SharedState, at: u32, cfg: &Dims, kv_weight: f32) -> Self {
        let kv = cfg.kv_layers * cfg.grid.tokens() * cfg.kv_dim;
        let vel = cfg.grid.tokens() * cfg.channels;
        Self {
            kv_weight,
            kv_base: [
                state.get(Region::CacheK).to_vec(),
                state.get(Region::CacheV).to_vec(),
            ],
            kv_slope: [vec![0.0; kv], vec![0.0; kv]],
            v_base: state.get(Region::V).to_vec(),
            v_slope: vec![0.0; vel],
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
fn extrapolate(
    state: &mut SharedState,
    tr: &mut Track,
    layout: &PatchLayout,
    active: &[bool],
    n: u32,
    cfg: &Dims,
) -> (f64, f64) {
    let (mut err2, mut norm2) = (0.0f64, 0.0f64);
    let (tokens, d, depth, pd) = (cfg.grid.tokens(), cfg.kv_dim, cfg.kv_layers, cfg.channels);
    let fresh = [state.get(Region::FreshK), state.get(Region::FreshV)];
    let fresh_vel = state.get(Region::FreshVel);
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
            let (base, slope) = (&mut tr.v_base[r.clone()], &mut tr.v_slope[r.clone()]);
            let resumed = gap > 1.0;
            for ((b, sl), &f) in base.iter_mut().zip(slope).zip(&fresh_vel[r]) {
                if resumed {
                    let predicted = *b + gap * *sl;
                    err2 += ((f - predicted) as f64).powi(2);
                    norm2 += (f as f64).powi(2);
                }
                *sl = (f - *b) * inv_gap;
                *b = f;
            }
            tr.last[t] = n;
        }
    }
    let v = state.get_mut(Region::V);
    for (t, &last) in tr.last.iter().enumerate().filter(|(_, &l)| l < n) {
        let ahead = (n - last) as f32;
        let r = t * pd..(t + 1) * pd;
        for ((o, &b), &sl) in v[r.clone()]
            .iter_mut()
            .zip(&tr.v_base[r.clone()])
            .zip(&tr.v_slope[r])
        {
            *o = b + ahead * sl;
        }
    }
    (err2, norm2)
}

/// Writes into the K/V cache what the monotasks of step `n` read: the K/V of every token
/// with `read[t]`, extrapolated to step `n` (`base + (n - last) slope`). Rows no monotask
/// reads (the tokens of the only monotask of a step) are left as they are. From committed
/// state only, like [`extrapolate`].
fn write_cache(state: &mut SharedState, tr: &Track, n: u32, read: &[bool], cfg: &Dims) {
    let (tokens, d) = (cfg.grid.tokens(), cfg.kv_dim);
    for (kv, region) in [Region::CacheK, Region::CacheV].into_iter().enumerate() {
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
    fn monotasks_are_consecutive_balanced_and_never_more_than_asked() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..2000 {
            let n = 1 + rnd(20) as usize;
            let active: Vec<(u32, usize)> = (0..n)
                .map(|p| (p as u32 * 2, 1 + rnd(40) as usize))
                .collect();
            let most = 1 + rnd(24) as usize;
            let m = pack_monotasks(&active, most);
            assert_eq!(m.len(), n);
            assert_eq!(m[0], 0);
            assert!(m.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
            let count = m[n - 1] as usize + 1;
            assert!(count <= most, "{count} monotasks for at most {most}");
            if most >= n {
                assert_eq!(count, n, "every patch its own when allowed");
            }
            // Balance: a monotask holds at most a share plus one patch.
            let total: usize = active.iter().map(|a| a.1).sum();
            let biggest = active.iter().map(|a| a.1).max().unwrap();
            let mut load = vec![0usize; count];
            for (a, &k) in active.iter().zip(&m) {
                load[k as usize] += a.1;
            }
            let share = total.div_ceil(most.min(n));
            assert!(
                load.iter().all(|&l| l <= share + biggest),
                "loads {load:?}, share {share}, biggest patch {biggest}"
            );
            if most == 1 {
                assert!(m.iter().all(|&k| k == 0));
            }
        }
    }

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
        let layout = flashdiff_partitioner::partition_uniform(
            flashdiff_partitioner::Grid::image(2, 2).unwrap(),
            2,
        )
        .unwrap();
        let mut st = SharedState::create(crate::state::Layout::new(&cfg), None, 0).unwrap();
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
        fill(&mut st, Region::CacheK, d, 0, &everyone);
        fill(&mut st, Region::CacheV, d, 0, &everyone);
        fill(&mut st, Region::V, pd, 0, &everyone);
        let mut track = Track::start(&st, 0, &cfg, weight);
        // Patch 0 runs every step; patch 1 runs at steps 1 and 5 and is skipped in between.
        // Every measured slope is 0.5 (also across a gap); the averaged K/V slope after m
        // measurements is 0.5 (1 - (1 - weight)^m); the cache holds base + (n + 1 - last)
        // slope. A skipped token's velocity is base + (n - last) 0.5 once one slope was
        // measured.
        let smoothed = |m: i32| 0.5 * (1.0 - (1.0 - weight).powi(m));
        for n in 1..=5u32 {
            let active = [true, n == 1 || n == 5];
            let computed: Vec<bool> = layout
                .patch_of()
                .iter()
                .map(|&p| active[p as usize])
                .collect();
            fill(&mut st, Region::FreshK, d, n, &everyone);
            fill(&mut st, Region::FreshV, d, n, &everyone);
            fill(&mut st, Region::FreshVel, pd, n, &everyone);
            fill(&mut st, Region::V, pd, n, &computed); // the commit's copy of fresh rows
            extrapolate(&mut st, &mut track, &layout, &active, n, &cfg);
            write_cache(&mut st, &track, n + 1, &everyone, &cfg);
            for p in 0..2u32 {
                let (last, m) = match (p, n) {
                    (0, _) => (n, n as i32),
                    (_, 1..=4) => (1, 1),
                    _ => (5, 2),
                };
                for &t in layout.patch_tokens(p) {
                    let t = t as usize;
                    for region in [Region::CacheK, Region::CacheV] {
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
                        let got = st.get(Region::V)[t * pd + i];
                        assert!(
                            (got - value(t, i, n)).abs() < 1e-4,
                            "velocity step {n} token {t}: {got}"
                        );
                    }
                }
            }
        }
    }
}
