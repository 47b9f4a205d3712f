//! The skipping methods: each decides which tokens a step computes and how the others are
//! stood in for. The engine asks a request's method at the few points where methods differ
//! (the partition after the warm-up, the start of a step, the choice of active patches, the
//! commit) and knows no method by name. A method owns what it remembers between steps (its
//! [`Memory`], kept in the request as an opaque box, written into checkpoints as named
//! arrays that only the method reads back) and its own check of a request's settings.
//! Adding a method is adding a file here and a row in [`of`] (and its [`Mode`]).

mod dbcache;
mod flashdiff;
mod full;
mod naive_patch;
mod no_skip;
mod patch_gate;
mod random_patches;
mod ras;
mod whole_step;

use std::any::Any;

use flashdiff_models::{Denoiser, ModelError, StepInput, Tensor};

use super::forecast::forecast_velocity;
use super::request::Request;
use super::{adaptive_epsilon, EngineError, RequestConfig};
use crate::checkpoint::MemoryRecord;
use crate::state::Region;

/// What a request's method remembers between steps. Each method has its own type, kept in
/// the request ([`Request::memory`]) and read back with [`memory_of`]; checkpoints carry it
/// as the named arrays [`Memory::save`] writes and [`Method::recall`] reads.
pub(super) trait Memory: Any + Send {
    /// Its checkpoint record.
    fn save(&self, out: &mut Vec<MemoryRecord>);
}

/// The memory of a method that remembers nothing.
pub(super) struct Nothing;

impl Memory for Nothing {
    fn save(&self, _: &mut Vec<MemoryRecord>) {}
}

/// A request's memory as its method's own type `T`.
pub(super) fn memory_of<T: Memory>(m: &mut Box<dyn Memory>) -> Result<&mut T, EngineError> {
    let any: &mut dyn Any = m.as_mut();
    any.downcast_mut::<T>().ok_or_else(|| {
        EngineError::Internal("a request's memory is not of its method's type".into())
    })
}

/// The patch count (a fixed one, else the adaptive controller's `adaptive_r`) and the cut
/// (uniform when asked, else the saliency map's) of the methods that cut patches.
fn saliency_patches(cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool) {
    (
        cfg.patches.unwrap_or(adaptive_r),
        cfg.layout == super::LayoutKind::Uniform,
    )
}

/// The steps a request with work budget `fraction` may compute, the warm-up and the final
/// steps among them: the budget counts the model's FLOPs ([`Denoiser::flops`]), so every
/// step's conditioning and the signal read on every step after the warm-up are paid from it
/// before whole computed steps are (a regionally computed step costs less than the whole
/// step counted here). A model that counts rows has neither, and this is `floor(fraction *
/// steps)`.
pub(super) fn budget_steps(model: &dyn Denoiser, cfg: &RequestConfig, fraction: f32) -> u32 {
    let (step, every, extra) = budget_costs(model, cfg);
    flashdiff_gate::pace::computes_within(fraction, cfg.steps, step, every, extra)
}

/// The least work budget under which a request computes `steps` steps ([`budget_steps`]),
/// rounded up to a thousandth so that the number shown is one the budget accepts; over 1
/// when those steps and the signal cost more than full computation.
pub(super) fn least_budget(model: &dyn Denoiser, cfg: &RequestConfig, steps: u32) -> f64 {
    let (step, every, extra) = budget_costs(model, cfg);
    let n = cfg.steps as f64;
    let least = (steps as f64 * step + n * every + extra) / (n * (step + every));
    (1000.0 * least).ceil() / 1000.0
}

/// A budget's costs in the model's FLOPs: a computed step's, every step's, and the signal's
/// over the run (see [`flashdiff_gate::pace::computes_within`]).
fn budget_costs(model: &dyn Denoiser, cfg: &RequestConfig) -> (f64, f64, f64) {
    let f = model.flops();
    let tokens = model.dims().grid.tokens();
    let watched = cfg.steps.saturating_sub(cfg.warmup) as f64;
    (
        f.step(tokens) - f.every_step,
        f.every_step,
        watched * tokens as f64 * f.signal_per_token,
    )
}

/// Refuses a work budget: a method whose own knob sets its work.
fn no_work_budget(cfg: &RequestConfig) -> Result<(), EngineError> {
    match cfg.budget {
        Some(f) => Err(EngineError::Invalid {
            field: "budget",
            reason: format!(
                "{f}: a work budget applies to modes flashdiff, auto and per-patch only (mode \
                 {} has its own knob)",
                cfg.mode.name()
            ),
        }),
        None => Ok(()),
    }
}

/// A named array of floats for a checkpoint.
pub(super) fn floats(name: &str, v: &[f32]) -> MemoryRecord {
    MemoryRecord {
        name: name.into(),
        floats: v.to_vec(),
        counts: Vec::new(),
    }
}

/// A named array of counts for a checkpoint.
pub(super) fn counts(name: &str, v: &[u32]) -> MemoryRecord {
    MemoryRecord {
        name: name.into(),
        floats: Vec::new(),
        counts: v.to_vec(),
    }
}

/// A checkpoint's memory record as a method reads it back (untrusted input), with what the
/// method checks it against.
pub(super) struct Recall<'a> {
    pub(super) records: &'a [MemoryRecord],
    /// Tokens in the latent.
    pub(super) tokens: usize,
    /// Patches in the request's layout.
    pub(super) patches: usize,
    /// The step the request continues from.
    pub(super) step: u32,
    /// The request's settings.
    pub(super) cfg: &'a RequestConfig,
}

impl Recall<'_> {
    /// The floats named `name`, if the record has them.
    pub(super) fn floats(&self, name: &str) -> Option<&[f32]> {
        self.records
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.floats.as_slice())
    }

    /// The counts named `name`, if the record has them.
    pub(super) fn counts(&self, name: &str) -> Option<&[u32]> {
        self.records
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.counts.as_slice())
    }
}

/// A skipping method. What it remembers between steps is its [`Memory`], in the request;
/// what lasts one step only ([`Request::active`]) is set again every step.
pub(super) trait Method: Sync {
    /// What a new request remembers (nothing, by default).
    fn memory(&self) -> Box<dyn Memory> {
        Box::new(Nothing)
    }

    /// Its memory from a checkpoint's record, checked against the request.
    fn recall(&self, _: &Recall) -> Result<Box<dyn Memory>, String> {
        Ok(Box::new(Nothing))
    }

    /// Settings this method cannot run with on `model`, beyond the ranges every request is
    /// checked against. By default: no work budget (the budgeted methods have one).
    fn check(&self, _model: &dyn Denoiser, cfg: &RequestConfig) -> Result<(), EngineError> {
        no_work_budget(cfg)
    }

    /// How the warm-up's partition cuts the latent: the patch count (`adaptive_r` is the
    /// engine's adaptive controller's current choice) and whether the cut is uniform
    /// (`true`) or follows the saliency map.
    fn partition(&self, cfg: &RequestConfig, adaptive_r: u32) -> (u32, bool);

    /// Whether reused K/V and skipped velocities are forecast along their slopes
    /// (`forecast.rs`) rather than reused as last computed.
    fn forecasts(&self, _cfg: &RequestConfig) -> bool {
        false
    }

    /// At the start of a step: `true` when the method advanced the whole latent through the
    /// step without the model (whole-step caching).
    fn skip_step(
        &self,
        _model: &dyn Denoiser,
        _r: &mut Request,
        _load: f32,
    ) -> Result<bool, EngineError> {
        Ok(false)
    }

    /// Decides the step's active patches into `r.active` (every patch when `final_full`);
    /// by default every patch.
    fn choose(
        &self,
        _model: &dyn Denoiser,
        r: &mut Request,
        _load: f32,
        _final_full: bool,
    ) -> Result<(), EngineError> {
        r.active.fill(true);
        Ok(())
    }

    /// Just before a step's fresh velocities are committed.
    fn before_commit(&self, _r: &mut Request) -> Result<(), EngineError> {
        Ok(())
    }

    /// Whether a patch attends only to its own tokens (patches denoised independently).
    fn isolated(&self) -> bool {
        false
    }

    /// The most monotasks a step runs in ([`RequestConfig::monotasks`]; `None` there: the
    /// engine's worker count).
    fn monotask_limit(&self, cfg: &RequestConfig, workers: u32) -> usize {
        cfg.monotasks.unwrap_or(workers) as usize
    }

    /// Whether the method reads block 0's modulated input of the whole latent every step
    /// after the warm-up (the accumulated-change rules): its FLOPs count in the request's.
    fn reads_signal(&self) -> bool {
        false
    }

    /// The share of a step's model work a step costs that [`Method::skip_step`] advanced
    /// without the whole model (DBCache runs its first blocks there); 0 by default.
    fn front_work(&self, _model: &dyn Denoiser) -> f64 {
        0.0
    }

    /// Whether a request without a fixed patch count informs the adaptive R controller.
    fn adapts_patches(&self) -> bool {
        true
    }
}

pub use dbcache::FRONT_BLOCKS;

/// The list of modes: each row is a mode's C ABI number (fixed once given: modes are numbered
/// in the order they reached the C ABI), its name on every interface (`--mode`, the `mode`
/// field, checkpoints), a line for the C header, and the method that runs it. It makes
/// [`Mode`], [`Mode::ALL`] (in the rows' order, the order the help texts list them),
/// [`Mode::name`], [`Mode::code`], [`Mode::summary`] and [`of`]; the C header's `fd_mode` is
/// generated from it.
macro_rules! modes {
    ($( $(#[doc = $doc:literal])* $variant:ident = $code:literal, $name:literal, $summary:literal => $method:expr; )*) => {
        /// How a request is executed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Mode {
            $( $(#[doc = $doc])* $variant, )*
        }

        const MODES: usize = [$($code),*].len();

        impl Mode {
            /// Every mode, in the order the help texts list them.
            pub const ALL: [Mode; MODES] = [$(Mode::$variant),*];

            /// The mode's name on every interface (`--mode`, the `mode` field, checkpoints).
            pub fn name(self) -> &'static str {
                match self { $(Mode::$variant => $name,)* }
            }

            /// The mode's number in the C ABI (`fd_request_config.mode`, `fd_mode`).
            pub fn code(self) -> u32 {
                match self { $(Mode::$variant => $code,)* }
            }

            /// The mode of a C ABI number.
            pub fn of_code(code: u32) -> Option<Mode> {
                Mode::ALL.into_iter().find(|m| m.code() == code)
            }

            /// One line on what the mode does (the C header's).
            pub fn summary(self) -> &'static str {
                match self { $(Mode::$variant => $summary,)* }
            }
        }

        /// The method that runs a request of `mode`.
        pub(super) fn of(mode: Mode) -> &'static dyn Method {
            use flashdiff::{FlashDiff, Pick};
            match mode { $(Mode::$variant => $method,)* }
        }
    };
}

modes! {
    /// Saliency patches under a change budget: each patch accumulates the relative change of
    /// block 0's input since it last ran; a step runs (every patch) once the latent's
    /// accumulated change (the patches' weighted by their share of that input) reaches
    /// `epsilon`, or one patch alone twice that, or a patch K skips, else it is forecast for
    /// every token.
    FlashDiff = 0, "flashdiff", "The change budget deciding whole steps from the patches' changes."
        => &FlashDiff { share: 0.0, auto: false, pick: Pick::AtBudget };
    /// The change budget of [`Mode::FlashDiff`], run regionally or in whole steps as the
    /// request's own patches changed: at the first step after the warm-up whose change it
    /// observes, a request whose patches' changes disperse at least
    /// [`crate::engine::AUTO_DISPERSION`] continues as [`Mode::PerPatch`] (only the patches at
    /// their budget run), any other as [`Mode::FlashDiff`] (whole steps). The report says
    /// which and why.
    Auto = 6, "auto", "The automatic choice between regional and whole steps (the CLI's default)."
        => &FlashDiff { share: 0.0, auto: true, pick: Pick::AtBudget };
    /// Saliency patches, no skipping, displaced K/V.
    NoSkip = 1, "no-skip", "Saliency patches, no skipping."
        => &no_skip::NoSkip;
    /// One patch, every step: ordinary sampling.
    Full = 2, "full", "Full computation: ordinary sampling."
        => &full::Full;
    /// Uniform patches denoised independently (attention inside the patch only) and stitched
    /// each step, no skipping: the NaivePatch baseline.
    NaivePatch = 3, "naive-patch", "NaivePatch: patches denoised independently and stitched."
        => &naive_patch::NaivePatch;
    /// Whole-step caching (TeaCache / first-block-cache style): the whole step is skipped,
    /// advancing on the forecast (or, `extrapolate` off, the last) velocity, while the
    /// accumulated relative L1 change of block 0's modulated input stays under
    /// `cache_threshold`, at most `max_skip` (K) steps in a row, as FlashDiff's budget (K at
    /// least the step count: the threshold alone, as TeaCache's authors run it).
    TeaCache = 4, "teacache", "Whole-step caching (TeaCache-style), thresholded by cache_threshold."
        => &whole_step::WholeStep;
    /// Region-adaptive sampling (RAS-style): each step recomputes the `ras_ratio` share of 2x2
    /// token regions whose velocity changed most, the rest reuse their velocity and K/V
    /// (forecast, or with `extrapolate` off as last computed); dense steps at about 45% and
    /// 80% of the steps and at the end.
    Ras = 7, "ras", "Region-adaptive sampling (RAS-style)."
        => &ras::Ras;
    /// The ablation of the per-patch choice: as many patches per step as the change budget
    /// per patch ([`Mode::PerPatch`]) runs, drawn at random (seeded by the request's seed
    /// and the step).
    RandomPatches = 8, "random-patches", "Ablation: as many patches as per-patch runs, drawn at random."
        => &FlashDiff { share: 1.0, auto: false, pick: Pick::AtRandom };
    /// Ablation: the change budget per patch (a computed step runs only the patches that
    /// reached `epsilon`, the others forecast with their K/V).
    PerPatch = 5, "per-patch", "Regional: a computed step runs only the patches at their budget."
        => &FlashDiff { share: 1.0, auto: false, pick: Pick::AtBudget };
    /// Ablation: the paper's memoryless patch gate (a patch runs while its share of the
    /// steps' importance change is at least `epsilon`; one patch at least every step).
    PatchGate = 9, "patch-gate", "Ablation: the paper's memoryless patch gate."
        => &patch_gate::PatchGate;
    /// DBCache (cache-dit's dual block cache, F1B0): the first block runs every step; while
    /// the relative L1 change of its residual since the last computed step stays under
    /// `cache_threshold`, the other blocks are skipped and their residual is forecast
    /// (reused as last computed with [`crate::engine::Reuse::Stale`]). Needs a model that
    /// runs its blocks apart ([`flashdiff_models::Denoiser::depth`]). Its steps run on the
    /// engine's own thread, not on the workers: a comparison baseline, which holds the engine
    /// for the length of its steps when other requests are in flight.
    DbCache = 10, "dbcache", "DBCache (cache-dit's dual block cache), thresholded by cache_threshold."
        => &dbcache::DbCache;
}

/// The request's latent (`tokens x channels`) and its step's conditioning as tensors on the
/// model's device: what a method that runs part of the model itself passes it.
fn step_tensors(model: &dyn Denoiser, r: &Request) -> Result<(Tensor, Tensor), ModelError> {
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
    Ok((x, cond))
}

/// Block 0's modulated input for the whole latent at the request's step (`tokens x width`,
/// flattened): the cheap signal the accumulated-change rules read.
fn block0_input(model: &dyn Denoiser, r: &Request) -> Result<Vec<f32>, ModelError> {
    let (x, cond) = step_tensors(model, r)?;
    let step = StepInput {
        context: &r.context,
        cond: &cond,
    };
    Ok(model
        .first_block_input(&x, step)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// The relative L1 change from `prev` to `now`: `sum |now - prev| / sum |prev|`, the
/// measure the whole-latent caching rules threshold.
fn relative_l1(now: &[f32], prev: &[f32]) -> f32 {
    let num: f32 = now.iter().zip(prev).map(|(a, b)| (a - b).abs()).sum();
    let den: f32 = prev.iter().map(|b| b.abs()).sum::<f32>().max(1e-12);
    num / den
}

/// How much the model's time falls over step `step` of `steps` (the Euler update's step).
/// Whether a whole-step method may skip one more step: fewer than `max_skip` (K) of its last
/// steps were skipped in a row.
fn below_skip_cap(r: &Request) -> bool {
    let run = r
        .report
        .active_per_step
        .iter()
        .rev()
        .take_while(|&&a| a == 0)
        .count();
    run < r.cfg.max_skip as usize
}

pub(super) fn time_step(model: &dyn Denoiser, step: u32, steps: u32) -> f32 {
    model.time(step, steps) - model.time(step + 1, steps)
}

/// The Euler update of the request's step with the velocities in its state.
pub(super) fn euler(model: &dyn Denoiser, r: &mut Request) {
    let h = time_step(model, r.step, r.cfg.steps);
    let (v, x) = r.state.get_pair(Region::Velocity, Region::X);
    for (xi, vi) in x.iter_mut().zip(v) {
        *xi -= h * vi;
    }
}

/// Advances the whole latent through the request's step without the model: every token's
/// velocity forecast from its computed steps (or reused as last computed without a
/// forecaster), then the Euler update.
fn forecast_whole_step(model: &dyn Denoiser, r: &mut Request) {
    if let Some(tr) = r.track.as_ref() {
        forecast_velocity(&mut r.state, tr, r.step, model.dims().channels);
    }
    euler(model, r);
    r.step += 1;
    r.report.active_per_step.push(0);
    r.report.patch_steps += r.layout.as_ref().map_or(1, |l| l.patches() as u64);
}
