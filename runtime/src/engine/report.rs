//! What a finished request returns: its output and a report of where its work and time went.

use std::time::Duration;

use flashdiff_gate::choice::Execution;
use flashdiff_models::Sample;
use flashdiff_partitioner::PatchLayout;

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
    /// as computed); a step that computes anything also pays the rows every forward computes
    /// ([`flashdiff_models::Denoiser::fixed_rows`]: a joint model's text stream), once (a
    /// step split across workers repeats them, a cost of parallelism not counted here).
    pub work_skipped: f64,
    /// With [`super::RequestConfig::adaptive_epsilon`]: the sum of the ε the gate used over the
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
    /// With [`super::Mode::Auto`], once made: how the request chose to run its computed
    /// steps.
    pub choice: Option<Choice>,
    /// With [`super::RequestConfig::deadline`]: whether it finished in time.
    pub deadline_met: Option<bool>,
    /// The model FLOPs the request ran and full computation's (see [`FlopsCount`]).
    pub flops: FlopsCount,
}

/// Model FLOPs a request ran, from the model's [`flashdiff_models::Flops`]: the warm-up's
/// whole steps, each later step's computed tokens and fixed rows, every step's
/// conditioning, the signal of every step after the warm-up where the method reads it, and
/// a partial step's first blocks (DBCache); against the same request's steps all computed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FlopsCount {
    /// FLOPs run.
    pub run: f64,
    /// Full computation's FLOPs for the same steps.
    pub full: f64,
    /// `false` when the model's layers are not counted, and these count rows.
    pub counted: bool,
}

impl FlopsCount {
    /// `run / full` (1 when there is nothing to count).
    pub fn fraction(&self) -> f64 {
        if self.full > 0.0 {
            self.run / self.full
        } else {
            1.0
        }
    }
}

/// The automatic choice of [`super::Mode::Auto`] ([`flashdiff_gate::choice`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Regional or whole steps.
    pub execution: Execution,
    /// The dispersion of the patches' changes it was made on.
    pub dispersion: f32,
    /// The threshold it was held against (regional at or above it).
    pub threshold: f32,
}

impl Choice {
    /// The choice and why, in a sentence: "regional: the patches changed unevenly
    /// (dispersion 0.83, regional from 0.50)".
    pub fn explain(&self) -> String {
        let why = match self.execution {
            Execution::Regional => "the patches changed unevenly",
            Execution::WholeStep => "the patches changed together",
        };
        format!(
            "{}: {why} (dispersion {:.2}, regional from {:.2})",
            self.execution, self.dispersion, self.threshold
        )
    }
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
    /// [`super::RequestConfig::adaptive_epsilon`].
    pub fn mean_epsilon(&self) -> Option<f64> {
        (self.epsilon_steps > 0).then(|| self.epsilon_sum / self.epsilon_steps as f64)
    }

    /// The steps after the warm-up by what they computed: every patch (whole), some patches
    /// (regional) or none (every token forecast).
    pub fn step_kinds(&self) -> StepKinds {
        let mut k = StepKinds::default();
        for &a in &self.active_per_step {
            match a {
                0 => k.forecast += 1,
                a if a >= self.patches => k.whole += 1,
                _ => k.regional += 1,
            }
        }
        k
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

/// Counts of the steps after the warm-up by what they computed ([`Report::step_kinds`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepKinds {
    /// Steps that computed every patch.
    pub whole: u32,
    /// Steps that computed some patches and forecast the others.
    pub regional: u32,
    /// Steps that computed nothing: every token advanced on its forecast.
    pub forecast: u32,
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

/// A request moved: its warm-up ended (`step == warmup`, no patches yet) or one of its steps
/// was committed. What [`super::Engine::poll`] reports as it goes.
#[derive(Debug, Clone, Copy)]
pub struct StepEvent<'a> {
    /// The request.
    pub id: u64,
    /// Steps done.
    pub step: u32,
    /// Total steps.
    pub steps: u32,
    /// Which patches the step just done computed (empty before the first patch-wise step).
    pub active: &'a [bool],
    /// The patch of every latent token, once the warm-up has partitioned the latent.
    pub patch_of: Option<&'a [u32]>,
}

/// A finished request's report as JSON, as the HTTP API's jobs and the Python package give
/// it: the step and patch counts (the steps after the warm-up that computed every patch and
/// those that computed some), the work skipped, latency, reuse error, and the layout's
/// patch of every token.
pub fn report_json(o: &Output) -> serde_json::Value {
    let r = &o.report;
    serde_json::json!({
        "steps": r.steps,
        "warmup": r.warmup,
        "patches": r.patches,
        "patch_steps": r.patch_steps,
        "computed": r.computed,
        "computed_tokens": r.computed_tokens,
        "skipped_share": r.skipped_share(),
        "work_skipped": r.work_skipped,
        "flops": r.flops.run,
        "flops_full": r.flops.full,
        "flops_fraction": r.flops.fraction(),
        "flops_counted": r.flops.counted,
        "active_per_step": r.active_per_step,
        "whole_steps": r.step_kinds().whole,
        "execution": r.choice.map(|c| c.execution.to_string()),
        "dispersion": r.choice.map(|c| c.dispersion),
        "regional_steps": r.step_kinds().regional,
        "latency_ms": r.latency.as_secs_f64() * 1e3,
        "reuse_error": r.reuse_error(),
        "mean_epsilon": r.mean_epsilon(),
        "deadline_met": r.deadline_met,
        "patch_of": o.layout.patch_of(),
    })
}
