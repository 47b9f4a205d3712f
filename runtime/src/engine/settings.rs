//! A request's settings, their defaults and the one range check every interface goes through.

use std::time::Duration;

use flashdiff_gate::LoadAdaptiveEpsilon;
use flashdiff_models::Denoiser;

use super::EngineError;

/// Default total steps (N = 50, the design's default).
pub const DEFAULT_STEPS: u32 = 50;
/// Default warm-up steps (the paper's §4.1: the first five steps).
pub const DEFAULT_WARMUP: u32 = 5;
/// Steps at the end that run every patch whatever the gate says: the velocity changes most
/// in the last step (about 20x the median step on the built-in image model), so a reused one
/// would be far off; forcing more than one final step did not raise PSNR (docs/benchmarks.md,
/// "Defaults").
pub const FINAL_FULL_STEPS: u32 = 1;

/// Default whole-step caching threshold (TeaCache's published range is 0.1-0.3).
pub const DEFAULT_CACHE_THRESHOLD: f32 = 0.1;

/// Default ε: FlashDiff's change budget (the relative change of block 0's input a patch may
/// accumulate before its step is computed), and the patch gate's weight threshold. At 0.1
/// FlashDiff does about half of full computation's work on the image model with the
/// checker's verdict equal to full computation's (docs/benchmarks.md).
pub const ENGINE_DEFAULT_EPSILON: f32 = 0.1;

/// Weight of the adaptive R controller's quality term: a request's cost is its own time x
/// (1 + QUALITY_WEIGHT x reuse error in percent) ([`super::Report::reuse_error`],
/// `flashdiff_partitioner::objective`), so 1% relative error in the forecast stand-ins of
/// skipped steps costs as much as 2% more time.
pub const QUALITY_WEIGHT: f64 = 0.02;

/// Patch count R of a lone request (`flashdiff generate`), which the adaptive controller
/// cannot search: with one request per process it would run its first probe every time.
/// `flashdiff serve` starts from `auto`.
pub const DEFAULT_PATCHES: u32 = 16;

/// Default monotasks per step ([`RequestConfig::monotasks`]): one forward over a step's active
/// patches, which then see each other's fresh K/V, and an output that is the same for any
/// worker count. One monotask per patch (each reading the others' displaced K/V) loses about
/// 15 dB on the built-in image model (docs/benchmarks.md, "Defaults"). Concurrent requests
/// still spread over the workers, one request-step per monotask.
pub const DEFAULT_MONOTASKS: u32 = 1;

/// Monotasks a worker thread or process holds at once: the one it runs and one dispatched
/// ahead, which it starts the moment the first is done instead of idling while its report
/// travels to the coordinator and the next order back. More than 2 would only commit work
/// to a worker earlier, when another may become free first.
pub const DISPATCH_DEPTH: u32 = 2;

/// Default longest run of skips per patch K (the design's range is 3-5; the gate crate's
/// default is 4): K = 3 keeps the checker's agreement with full computation at the bar where
/// K = 4 and 5 skip a little more at lower PSNR (docs/benchmarks.md, "Defaults").
pub const ENGINE_DEFAULT_MAX_SKIP: u32 = 3;

/// Share of the resume correction a request with [`Reuse::Corrected`] or
/// [`Reuse::Corrected2`] applies. When a token is computed again after skipped steps, the
/// latent updates of those steps are redone with velocities interpolated between its
/// computations (through the new one) instead of the extrapolated ones they used; the
/// computed velocity itself was evaluated at the uncorrected latent, and applying the whole
/// difference overshoots. Chosen on 64 validation prompts (seed 20000) of the built-in image
/// model under a work budget: the full correction lost up to 12 dB of mean PSNR at a fifth
/// of the work, half of it gained on the mean from F 0.3 to 0.7 at first order
/// (docs/benchmarks.md, "The resume correction").
pub const RESUME_CORRECTION: f32 = 0.5;

/// How a request stands in for values it does not compute ([`RequestConfig::reuse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// As last computed.
    Stale,
    /// Along the slope of their last two computations (first order): the displaced K/V
    /// monotasks read (raw slope with one monotask per step, else averaged,
    /// [`super::KV_SLOPE_SMOOTHING`]) and a skipped token's velocity.
    Extrapolate,
    /// A skipped token's velocity along the parabola through its last three computations
    /// (second order, TaylorSeer's order 2 with Newton's divided differences, so computations
    /// at uneven gaps are exact for a quadratic trajectory); K/V as [`Reuse::Extrapolate`].
    Extrapolate2,
    /// As [`Reuse::Extrapolate`], and when a skipped token is computed again its latent is
    /// corrected by [`RESUME_CORRECTION`] of the difference the skipped steps' Euler updates
    /// would have made with velocities on the line through its last two computations (the
    /// new one included) rather than the extrapolated ones. Applies where velocities are
    /// forecast per token (FlashDiff, whole-step caching, RAS, random patches); DBCache
    /// forecasts a residual and runs as [`Reuse::Extrapolate`].
    Corrected,
    /// [`Reuse::Extrapolate2`] with the correction of [`Reuse::Corrected`], interpolating
    /// along the parabola through the last three computations.
    Corrected2,
}

impl Reuse {
    /// Every value, in wire order.
    pub const ALL: [Reuse; 5] = [
        Reuse::Extrapolate,
        Reuse::Extrapolate2,
        Reuse::Stale,
        Reuse::Corrected,
        Reuse::Corrected2,
    ];

    /// The name requests use (`reuse` field, `--reuse`).
    pub fn name(self) -> &'static str {
        match self {
            Reuse::Stale => "stale",
            Reuse::Extrapolate => "extrapolate",
            Reuse::Extrapolate2 => "extrapolate2",
            Reuse::Corrected => "corrected",
            Reuse::Corrected2 => "corrected2",
        }
    }

    /// Whether skipped values are forecast rather than reused as last computed.
    pub fn forecasts(self) -> bool {
        self != Reuse::Stale
    }

    /// The velocity forecast's order (0 for stale reuse).
    pub fn order(self) -> u8 {
        match self {
            Reuse::Stale => 0,
            Reuse::Extrapolate | Reuse::Corrected => 1,
            Reuse::Extrapolate2 | Reuse::Corrected2 => 2,
        }
    }

    /// The share of the resume correction applied (0 without one, [`RESUME_CORRECTION`]
    /// with [`Reuse::Corrected`] and [`Reuse::Corrected2`]).
    pub fn correction(self) -> f32 {
        match self {
            Reuse::Corrected | Reuse::Corrected2 => RESUME_CORRECTION,
            _ => 0.0,
        }
    }

    /// The same reuse at forecast order `order` (1 or 2), keeping the correction; stale reuse
    /// has no order and stays.
    pub fn at_order(self, order: u8) -> Reuse {
        match (self, order) {
            (Reuse::Stale, _) => Reuse::Stale,
            (Reuse::Corrected | Reuse::Corrected2, 1) => Reuse::Corrected,
            (Reuse::Corrected | Reuse::Corrected2, _) => Reuse::Corrected2,
            (_, 1) => Reuse::Extrapolate,
            _ => Reuse::Extrapolate2,
        }
    }

    /// This reuse with the resume correction (stale reuse and DBCache's residual have none).
    pub fn corrected(self) -> Reuse {
        match self {
            Reuse::Extrapolate => Reuse::Corrected,
            Reuse::Extrapolate2 => Reuse::Corrected2,
            r => r,
        }
    }

    /// The number a checkpoint stores: the order (0 stale, 1, 2), 3 and 4 for the corrected
    /// first and second order.
    pub fn code(self) -> u8 {
        match self {
            Reuse::Corrected => 3,
            Reuse::Corrected2 => 4,
            r => r.order(),
        }
    }

    /// The value of [`Reuse::code`] `code`.
    pub fn of_code(code: u8) -> Option<Reuse> {
        Reuse::ALL.into_iter().find(|r| r.code() == code)
    }
}

impl std::str::FromStr for Reuse {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Reuse::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                "expected extrapolate, extrapolate2, corrected, corrected2 or stale".to_string()
            })
    }
}

/// The dispersion of the patches' changes (see [`flashdiff_gate::choice`]) at and above which
/// [`Mode::Auto`] runs a request regionally. Measured with `cargo run --release -p
/// flashdiff-studies --example auto_calibrate -- MODEL 16` (validation seeds 10000-10015, 50
/// steps, 16 patches, ε 0.1 / 0.2 / 0.4 at K 2 / 4 / 8, second order): on TinyFLUX the
/// dispersions lie in 0.027-0.055, on TinyFLUX-L in 0.020-0.052, and at every setting whole
/// steps gave the higher mean PSNR (regional 0.2-4.0 dB lower), so the best threshold lay
/// above every measured value. 0.5, ten times the largest, keeps whole steps there and leaves
/// regional execution to requests whose patches change an order of magnitude more unevenly.
pub const AUTO_DISPERSION: f32 = 0.5;

pub use super::methods::Mode;

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
                format!("mode {s:?}: expected one of {}", names.join(", "))
            })
    }
}

/// How the latent is cut after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    /// Cross-attention saliency, recursive Otsu, load-aware (§4.1).
    Saliency,
    /// Balanced recursive bisection of the grid (NaivePatch / DistriFusion layout).
    Uniform,
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
    /// ε in `[0, 1]`: FlashDiff's change budget (per-patch and random patches too); the
    /// patch gate's weight threshold.
    pub epsilon: f32,
    /// Load-adaptive ε (§4.3): before each step the gate's ε follows the engine's load
    /// (requests in flight per worker; 1 = every worker has one) through
    /// [`LoadAdaptiveEpsilon`] with `epsilon` at load 1, `epsilon / 2` at load 0.5 and below
    /// (quality first when there is slack) and `min(2 epsilon, 1)` at load 1.5 and above
    /// (throughput first). Off by default: a lone request then runs at `epsilon / 2`.
    pub adaptive_epsilon: bool,
    /// Longest run of skips K.
    pub max_skip: u32,
    /// A work budget F in `(0, 1]` ([`Mode::FlashDiff`], [`Mode::Auto`] and
    /// [`Mode::PerPatch`]; regionally a computed step runs the patches at their budget, every
    /// patch where none is): the request computes the most steps, the warm-up and final
    /// steps among them, whose model FLOPs (every step's conditioning and the signal read
    /// after the warm-up included) stay within F of full computation's; the others are
    /// forecast. Which steps is decided by
    /// [`flashdiff_gate::pace::Pace`] from the change budget's accumulated change (`epsilon`
    /// and K are then not used). `None`: `epsilon` decides, and the work follows the content.
    pub budget: Option<f32>,
    /// Noise seed.
    pub seed: u64,
    /// Execution mode.
    pub mode: Mode,
    /// Scheduling priority (0..8, higher first).
    pub priority: u8,
    /// Patch layout (saliency by default; NaivePatch always uses uniform).
    pub layout: LayoutKind,
    /// Threshold of [`Mode::TeaCache`] on the accumulated relative L1 change, and of
    /// [`Mode::DbCache`] on the first block's residual change since its last computed step.
    pub cache_threshold: f32,
    /// Share of 2x2 regions [`Mode::Ras`] recomputes each step (RAS's sample ratio, 0.5).
    pub ras_ratio: f32,
    /// [`Mode::Auto`]: the dispersion of the patches' changes at and above which the request
    /// runs regionally ([`AUTO_DISPERSION`] by default; 0 always regional, infinity never).
    pub auto_dispersion: f32,
    /// Values reused instead of recomputed (every method that skips: FlashDiff, no-skip's
    /// displaced K/V, whole-step caching, RAS): forecast along their per-step slopes
    /// ([`Reuse::Extrapolate`], [`Reuse::Extrapolate2`]) or reused as last computed
    /// ([`Reuse::Stale`]: the paper's rule; with no skipping, DistriFusion's; TeaCache's and
    /// RAS's authors' rule).
    pub reuse: Reuse,
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
    /// ([`super::Engine::set_queue_order`]) it orders the request within its priority level
    /// (earliest first, at step boundaries); the report says whether it was met.
    pub deadline: Option<Duration>,
}

impl Default for RequestConfig {
    fn default() -> Self {
        Self {
            steps: DEFAULT_STEPS,
            warmup: DEFAULT_WARMUP,
            patches: None,
            epsilon: ENGINE_DEFAULT_EPSILON,
            adaptive_epsilon: false,
            max_skip: ENGINE_DEFAULT_MAX_SKIP,
            budget: None,
            seed: 0,
            mode: Mode::Auto,
            priority: 0,
            layout: LayoutKind::Saliency,
            cache_threshold: DEFAULT_CACHE_THRESHOLD,
            ras_ratio: 0.5,
            auto_dispersion: AUTO_DISPERSION,
            reuse: Reuse::Extrapolate,
            monotasks: Some(DEFAULT_MONOTASKS),
            deadline: None,
        }
    }
}

/// A warm-up nobody asked for: the model's `default`, shortened to fit below `steps` (the
/// engine refuses a warm-up of `steps` or more, and a request should not fail over a
/// setting it did not give).
pub fn fit_warmup(default: u32, steps: u32) -> u32 {
    default.min(steps.saturating_sub(1)).max(1)
}

/// The patch count of a lone request that gives none: [`DEFAULT_PATCHES`], or one patch a
/// token on a smaller latent (a lone request cannot search R as the adaptive controller
/// does over a stream). What `flashdiff generate` and the Python package use.
pub fn lone_request_patches(model: &dyn Denoiser) -> u32 {
    DEFAULT_PATCHES.min(model.dims().grid.tokens() as u32)
}

/// Checks a request's settings against `model`; the error names the setting (as the
/// request's field: `"max_skip"` is the CLI's `--max-skip`) and its valid range. What
/// [`super::Engine::validate`] and [`super::Engine::submit`] do, for callers without an engine.
pub fn check_request(model: &dyn Denoiser, cfg: &RequestConfig) -> Result<(), EngineError> {
    let bad = |field: &'static str, reason: String| Err(EngineError::Invalid { field, reason });
    if !(2..=1000).contains(&cfg.steps) {
        return bad("steps", format!("{}: must be in 2..=1000", cfg.steps));
    }
    if cfg.warmup < 1 || cfg.warmup >= cfg.steps {
        let most = cfg.steps.max(2) - 1;
        return bad(
            "warmup",
            format!("{}: must be in 1..={most} (below \"steps\")", cfg.warmup),
        );
    }
    let tokens = model.dims().grid.tokens() as u32;
    if let Some(r) = cfg.patches {
        if r == 0 || r > tokens {
            return bad(
                "patches",
                format!("{r}: must be in 1..={tokens} (tokens in the latent)"),
            );
        }
    }
    if !(cfg.epsilon.is_finite() && (0.0..=1.0).contains(&cfg.epsilon)) {
        return bad("epsilon", format!("{}: must be in [0, 1]", cfg.epsilon));
    }
    if let Some(f) = cfg.budget {
        if !(f.is_finite() && f > 0.0 && f <= 1.0) {
            return bad("budget", format!("{f}: must be in (0, 1]"));
        }
    }
    // What the request's method itself cannot run with (a work budget it has no use for, a
    // model it cannot run).
    super::methods::of(cfg.mode).check(model, cfg)?;
    if let Some(f) = cfg.budget {
        let fixed = cfg.warmup + FINAL_FULL_STEPS;
        if super::methods::budget_steps(model, cfg, f) < fixed {
            let least = super::methods::least_budget(model, cfg, fixed);
            if least > 1.0 {
                return bad(
                    "budget",
                    format!(
                        "{f}: the {fixed} of {} steps always computed (the warm-up and the final \
                         step) and the signal read on every step cost more than full \
                         computation: no work budget holds them (more steps or a shorter \
                         warm-up do)",
                        cfg.steps,
                    ),
                );
            }
            return bad(
                "budget",
                format!(
                    "{f}: below the {fixed} of {} steps always computed (the warm-up and the \
                     final step) and the signal read on every step: at least {least:.3}",
                    cfg.steps,
                ),
            );
        }
    }
    if cfg.auto_dispersion.is_nan() || cfg.auto_dispersion < 0.0 {
        return bad(
            "auto_dispersion",
            format!("{}: must be 0 or more", cfg.auto_dispersion),
        );
    }
    if !(cfg.ras_ratio > 0.0 && cfg.ras_ratio < 1.0) {
        return bad("ras_ratio", format!("{}: must be in (0, 1)", cfg.ras_ratio));
    }
    if !(cfg.cache_threshold.is_finite() && cfg.cache_threshold >= 0.0) {
        return bad(
            "cache_threshold",
            format!("{}: must be finite and >= 0", cfg.cache_threshold),
        );
    }
    if cfg.monotasks == Some(0) {
        return bad("monotasks", "0: must be at least 1".into());
    }
    if cfg.max_skip > 1000 {
        return bad("max_skip", format!("{}: must be in 0..=1000", cfg.max_skip));
    }
    if cfg.priority as usize >= flashdiff_scheduler::PRIORITY_LEVELS {
        let levels = flashdiff_scheduler::PRIORITY_LEVELS;
        return bad(
            "priority",
            format!("{}: must be in 0..{levels}", cfg.priority),
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reuse reads back from its name and from its checkpoint code, the codes differ,
    /// and the corrected ones keep their order.
    #[test]
    fn every_reuse_round_trips_through_its_name_and_code() {
        for r in Reuse::ALL {
            assert_eq!(r.name().parse::<Reuse>(), Ok(r));
            assert_eq!(Reuse::of_code(r.code()), Some(r));
            assert_eq!(r.corrected().order(), r.order());
            assert_eq!(r.at_order(r.order().max(1)), r);
            assert_eq!(r.correction() > 0.0, r.corrected() == r && r.forecasts());
        }
        let mut codes: Vec<u8> = Reuse::ALL.iter().map(|r| r.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Reuse::ALL.len());
        assert_eq!(Reuse::of_code(5), None);
        assert!("fresh".parse::<Reuse>().unwrap_err().contains("corrected2"));
    }
}
