//! The command line: every command's arguments (clap), their parsers and checks, and the
//! request a command's knobs make.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use flashdiff_runtime::engine::{
    LayoutKind, Mode, RequestConfig, Reuse, DEFAULT_CACHE_THRESHOLD, DEFAULT_STEPS, DEFAULT_WARMUP,
    ENGINE_DEFAULT_EPSILON, ENGINE_DEFAULT_MAX_SKIP,
};
use flashdiff_runtime::schema::Count;

/// flashdiff: diffusion serving with semantic patches and selective refinement (CPU,
/// built-in model).
#[derive(Parser, Debug)]
#[command(name = "flashdiff", version, about, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// One image, with a report.
    Generate(GenerateArgs),
    /// JSON-lines requests in, JSON-lines results out. Each line is an object such as
    /// {"id": 1, "prompt": "...", "seed": 0, "priority": 0, "steps": 50, "warmup": 5,
    /// "patches": 8, "epsilon": 0.1, "adaptive_epsilon": false, "max_skip": 3, "mode": "auto", "reuse":
    /// "extrapolate", "monotasks": 1, "model": "tinyvideo"}; only "prompt" is required. A
    /// "model" other than the server's starts that built-in model's engine on first use.
    Serve(ServeArgs),
    /// FlashDiff against the other ways to serve the model.
    Bench(BenchArgs),
    /// A worker process (started by the engine, not by hand).
    #[command(hide = true)]
    Worker {
        /// The model's description, as the engine writes it (`--model NAME --weights PATH
        /// [--options ...]`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        spec: Vec<String>,
    },
}

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    /// The prompt, quoted as one argument.
    pub(crate) prompt: String,
    /// Output path: a PNG for an image, an animated GIF for a video, a WAV for a sound
    /// (default: flashdiff.png, .gif or .wav by the model's kind).
    #[arg(short, long)]
    pub(crate) output: Option<PathBuf>,
    /// Also run full computation from the same seed: PSNR and SSIM (images), clip, worst
    /// frame and temporal PSNR (video), SNR and log-spectral distance (sound); the checker
    /// for both where the model has one.
    #[arg(long)]
    pub(crate) compare: bool,
    /// Also write the patch map to this PNG: the image with the border of every patch drawn
    /// (image models).
    #[arg(long, value_name = "FILE.png")]
    pub(crate) patch_map: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) sampling: Sampling,
    #[command(flatten)]
    pub(crate) knobs: Knobs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Serve HTTP on this port (0: any free port, printed at start) instead of reading JSON
    /// lines: POST /v1/images/generations, /v1/jobs, GET /healthz, /metrics.
    #[arg(long, conflicts_with_all = ["input", "out_dir"])]
    pub(crate) port: Option<u16>,
    /// Address to bind with --port.
    #[arg(long, default_value = "127.0.0.1", requires = "port")]
    pub(crate) host: String,
    /// With --port: most unfinished jobs before new requests get 429 (1..=100000).
    #[arg(long, default_value_t = 256, requires = "port", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) max_queue: u32,
    /// With --port: largest request body in bytes.
    #[arg(long, default_value_t = 65_536, requires = "port", value_parser = clap::value_parser!(u32).range(64..=16_777_216))]
    pub(crate) max_body: u32,
    /// With --port: where jobs, results and per-step checkpoints live, so that a server
    /// killed at any point and started again on the same directory resumes every unfinished
    /// job and still answers for finished ones (default: $XDG_STATE_HOME/flashdiff, else
    /// ~/.local/state/flashdiff). One server per directory.
    #[arg(long, requires = "port", conflicts_with = "ephemeral")]
    pub(crate) state_dir: Option<PathBuf>,
    /// With --port and a state directory: least milliseconds between two checkpoints of a
    /// request; after a crash it resumes from its last one (0: every step, which costs
    /// throughput; see the README).
    #[arg(long, default_value_t = 1000, requires = "port", value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub(crate) checkpoint_every_ms: u64,
    /// With --port: keep no state; nothing survives a restart.
    #[arg(long, requires = "port")]
    pub(crate) ephemeral: bool,
    /// Requests file (JSON lines); standard input when absent or "-".
    #[arg(long)]
    pub(crate) input: Option<PathBuf>,
    /// Where to write each request's PNG.
    #[arg(long)]
    pub(crate) out_dir: Option<PathBuf>,
    /// Order within a priority level: arrival (first come, first served across steps) or
    /// deadline (earliest `deadline_ms` first, re-decided at every step; requests without
    /// one after those with one).
    #[arg(long, default_value = "arrival", value_parser = ["arrival", "deadline"])]
    pub(crate) order: String,
    /// Start a request while fewer than this many started requests are at its priority
    /// level or above; the others wait, highest level first, then by --order (without it
    /// every request starts when it arrives and all advance interleaved step by step).
    /// Outputs do not depend on it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) start_window: Option<u32>,
    #[command(flatten)]
    pub(crate) sampling: Sampling,
    #[command(flatten)]
    pub(crate) knobs: Knobs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// 8 prompts instead of 64.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Run one study alone: "wall-time" (full computation against `generate`'s defaults, in
    /// the engine and as whole processes). Image models only.
    #[arg(long, value_parser = ["wall-time"], conflicts_with = "study")]
    pub(crate) only: Option<String>,
    /// Run a study instead of the whole bench, under the verdict protocol (each method's
    /// setting per target work chosen on --validation prompts, judged on --prompts test
    /// prompts after them: image 64, video 32, sound 64, 8 with --quick): "curve" (FlashDiff
    /// regional against every other way to save work on the engine; writes OUT_DIR/curve.json,
    /// report.md and the picture); "crossover" (image models: regional against whole-step
    /// caching with a forecaster and FlashDiff's ablations; writes OUT_DIR/MODEL/ and
    /// OUT_DIR/crossover.md, the margin by size from every model run into OUT_DIR);
    /// "serving" (regional, whole-step caching and fewer steps chosen as in "curve", then each
    /// chosen setting serves a bursty trace of the test prompts, with and without the
    /// scheduler, compared request by request; writes OUT_DIR/serving.json and report.md).
    /// Each keeps every result in a journal as it is measured (OUT_DIR/measured.jsonl, the
    /// crossover's in OUT_DIR/MODEL/): the same command again continues a stopped run.
    #[arg(long, value_parser = ["curve", "crossover", "serving"])]
    pub(crate) study: Option<String>,
    /// With --study: run nothing; write the reports and pictures again from the study's files
    /// in OUT_DIR (curve: OUT_DIR/curve.json; crossover: every OUT_DIR/MODEL/crossover.json,
    /// and OUT_DIR/crossover.md; serving: OUT_DIR/serving.json).
    #[arg(long, requires = "study")]
    pub(crate) reread: bool,
    /// With --study: validation prompts (seeds from --seed; the test prompts' seeds follow
    /// them).
    #[arg(long, requires = "study", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) validation: u32,
    /// With --study curve: run only these methods (comma-separated names of the study's
    /// rows, e.g. regional,whole-step); full computation always runs as the reference.
    #[arg(long, requires = "study", value_delimiter = ',')]
    pub(crate) methods: Vec<String>,
    /// Held-out prompts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) prompts: Option<u32>,
    /// Seed of the first prompt (prompts and noise).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) seed: u64,
    /// Total Euler steps.
    #[arg(long, default_value_t = DEFAULT_STEPS, value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub(crate) steps: u32,
    /// Patch count R for FlashDiff and the patch baselines.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) patches: u32,
    /// Where bench.json, report.md and the plots go.
    #[arg(long, default_value = "bench-out")]
    pub(crate) out_dir: PathBuf,
    #[command(flatten)]
    pub(crate) knobs: Knobs,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// Steps, patches and seed of a request (serve: the defaults for lines that do not say).
/// Ranges are the engine's, checked once for every interface.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct Sampling {
    /// Total Euler steps, in 2..=1000.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub(crate) steps: u32,
    /// Patch count R: auto (the adaptive controller, which searches R over a stream of
    /// requests) or an integer from 1 to the latent's tokens. Default: 16 for generate (a lone request cannot
    /// search; 16 is the measured default, see the README), auto for serve.
    #[arg(long, value_parser = parse_patches)]
    pub(crate) patches: Option<Patches>,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
}

/// FlashDiff's knobs, shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub(crate) struct Knobs {
    /// Warm-up steps before partitioning (at least 1, below --steps). Default: the model's,
    /// 5 (the paper's), 12 for tinyaudio (measured: its events settle later), shortened to
    /// steps - 1 when there are fewer steps.
    #[arg(long)]
    pub(crate) warmup: Option<u32>,
    /// Change budget ε in [0, 1]: a step is computed once the latent's accumulated relative
    /// change of block 0's input (the patches' changes weighted by their share of it) reaches
    /// it, or one patch's reaches twice it (patch-gate mode: the gate's weight threshold).
    #[arg(long, default_value_t = ENGINE_DEFAULT_EPSILON)]
    pub(crate) epsilon: f32,
    /// Let ε follow the load: --epsilon at one request per worker, half of it with slack,
    /// up to twice it under overload (serve and bench; a lone request runs at half).
    #[arg(long)]
    pub(crate) adaptive_epsilon: bool,
    /// Longest run of skips per patch, in 0..=1000.
    #[arg(long, default_value_t = ENGINE_DEFAULT_MAX_SKIP)]
    pub(crate) max_skip: u32,
    /// Work budget F in (0, 1] (modes flashdiff, auto, per-patch): compute as many steps,
    /// the warm-up and the final step among them, as keep the model FLOPs (every step's
    /// conditioning and the signal included) within F of full computation's; the change
    /// decides which. Replaces --epsilon and --max-skip.
    #[arg(long)]
    pub(crate) budget: Option<f32>,
    /// Scheduling priority, in 0..8 (higher first).
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: u8,
    /// auto | flashdiff | per-patch | no-skip | full | naive-patch | teacache | ras |
    /// random-patches | patch-gate | dbcache. auto: after the warm-up the request runs
    /// regionally (per-patch: a computed step runs only the patches at their budget) when its
    /// patches changed unevenly, else in whole steps (flashdiff, the change budget's whole-step
    /// rule); the report says which. random-patches and patch-gate: ablations of FlashDiff's
    /// choice; dbcache needs a built-in TinyDiT-family model.
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    pub(crate) mode: Mode,
    /// saliency | uniform.
    #[arg(long, default_value = "saliency", value_parser = ["saliency", "uniform"])]
    pub(crate) layout: String,
    /// extrapolate | extrapolate2 | corrected | corrected2 | stale: reused K/V and skipped
    /// tokens' velocity (every method that skips) extrapolated along their slope, skipped
    /// velocities along the parabola through their last three computations (second order,
    /// TaylorSeer's), either of those with the resume correction (a token computed again
    /// after skipped steps has its latent moved half-way to where velocities interpolated
    /// through its computations would have taken it), or reused as last computed (the
    /// paper's rule; TeaCache's and RAS's authors').
    #[arg(long, default_value = "extrapolate", value_parser = parse_reuse)]
    pub(crate) reuse: Reuse,
    /// N | workers | per-patch: a step's active patches run packed into at most N forwards
    /// (neighbours together, balanced by tokens); patches in one forward see each other's
    /// fresh K/V, the others' cached K/V. 1 (the default) gives the same output for any
    /// --workers; workers: one per worker; per-patch: DistriFusion's displaced patches.
    #[arg(long, default_value = "1", value_parser = parse_monotasks)]
    pub(crate) monotasks: Monotasks,
    /// teacache: skip a step while the accumulated change stays under T (>= 0); dbcache:
    /// skip the blocks after the first while its residual's change since the last computed
    /// step stays under T.
    #[arg(long, default_value_t = DEFAULT_CACHE_THRESHOLD)]
    pub(crate) cache_threshold: f32,
}

/// Where and on what the engine runs.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// Workers, in 1..=1024: with more than one, worker threads (or processes). Default: 1
    /// for generate, one per CPU core for serve and bench.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) workers: Option<u32>,
    /// Run the workers as separate processes sharing request state in /dev/shm (outputs are
    /// bit-identical either way).
    #[arg(long)]
    pub(crate) processes: bool,
    /// Model: built-in tinydit (images), tinyvideo (8-frame clips), tinyaudio (2 s sounds),
    /// tinyflux, tinyflux-l, tinyflux-xl (32x32, 64x64 and 128x128 images: 64, 256 and 1024
    /// tokens of a FLUX transformer run by the FLUX code); or flux-dev, flux-schnell, sd3, sd3.5 (images), wan2.1 (video), stable-audio-open
    /// (sound) from a diffusers folder given with --weights.
    #[arg(long, default_value = "tinydit", value_parser = MODELS)]
    pub(crate) model: String,
    /// Model file or TinyFLUX folder (default: the built-in --model's shipped weights), or with --model
    /// flux-dev|flux-schnell|sd3|sd3.5|wan2.1|stable-audio-open the pipeline's diffusers folder (transformer/,
    /// text_encoder*/, tokenizer*/, vae/).
    #[arg(long)]
    pub(crate) weights: Option<PathBuf>,
    /// Image size WIDTHxHEIGHT in pixels for the pipelines (multiples of 16 up to 2048;
    /// default 1024x1024). The built-in models have fixed sizes.
    #[arg(long, value_parser = parse_size)]
    pub(crate) size: Option<(usize, usize)>,
    /// Guidance, 0..=100: FLUX.1 dev's embedded guidance (default 3.5), SD3's
    /// classifier-free guidance scale (default 7.0); flux-schnell takes none.
    #[arg(long, value_parser = parse_guidance)]
    pub(crate) guidance: Option<f32>,
    /// What the pipelines' transformer and T5 compute in: f32 (default), or bf16 (the
    /// released weights' dtype: half the memory; fast on a GPU, slower than f32 on a CPU).
    /// The built-in models compute in f32.
    #[arg(long, value_parser = ["f32", "bf16"])]
    pub(crate) dtype: Option<String>,
    /// Seconds of audio for stable-audio-open (default: its whole window, 47.55 s for the
    /// released model); written as a WAV file.
    #[arg(long, value_parser = parse_seconds)]
    pub(crate) seconds: Option<f32>,
    /// Video frames for wan2.1: 1 + 4k, up to 1001 (default 81); written as a GIF (the
    /// latent preview if the folder has no vae/).
    #[arg(long, value_parser = parse_frames)]
    pub(crate) frames: Option<usize>,
    /// Whether --model was on the command line (not its default).
    #[arg(skip)]
    pub(crate) model_given: bool,
    /// Where the model runs: cpu, or cuda (GPU 0; needs a build with --features cuda and an
    /// NVIDIA GPU; worker processes run on the CPU only for now).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub(crate) device: String,
}

/// Every `--model`: the registry's names.
pub(crate) use flashdiff_runtime::models::pipelines::registry::MODELS;

pub(crate) fn is_pipeline(model: &str) -> bool {
    flashdiff_runtime::models::pipelines::PIPELINES.contains(&model)
}

/// `WIDTHxHEIGHT` -> (height, width).
pub(crate) fn parse_size(v: &str) -> Result<(usize, usize), String> {
    let bad = || format!("expected WIDTHxHEIGHT in pixels, e.g. 1024x1024; got {v:?}");
    let (w, h) = v.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (usize, usize) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    flashdiff_runtime::models::pipelines::check_size((h, w)).map_err(|e| e.to_string())?;
    Ok((h, w))
}

pub(crate) fn parse_seconds(v: &str) -> Result<f32, String> {
    match v.parse::<f32>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err("must be a number of seconds in (0, 3600]".into()),
    }
}

pub(crate) fn parse_frames(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(f) if (1..=1001).contains(&f) && (f - 1) % 4 == 0 => Ok(f),
        _ => Err("must be 1 + 4k frames in 1..=1001, e.g. 81".into()),
    }
}

pub(crate) fn parse_guidance(v: &str) -> Result<f32, String> {
    match v.parse::<f32>() {
        Ok(g) if g.is_finite() && (0.0..=100.0).contains(&g) => Ok(g),
        _ => Err("must be a number in [0, 100]".into()),
    }
}

/// Flags that only make sense together: the error names them.
pub(crate) fn check_run_args(o: &RunArgs, model_given: bool) -> Result<(), String> {
    let pipeline = is_pipeline(&o.model);
    if pipeline && o.weights.is_none() {
        return Err(format!(
            "--model {} needs --weights DIR: the pipeline's diffusers folder (transformer/, \
             text_encoder*/, tokenizer*/, vae/)",
            o.model
        ));
    }
    if !pipeline && model_given && o.weights.is_some() {
        return Err(format!(
            "--model {} cannot be used with --weights: a built-in model runs its shipped \
             weights (--weights alone takes a TinyDiT-family file or a TinyFLUX folder; a \
             diffusers folder needs --model with one of {})",
            o.model,
            flashdiff_runtime::models::pipelines::PIPELINES.join(", ")
        ));
    }
    if !pipeline && (o.size.is_some() || o.guidance.is_some() || o.dtype.is_some()) {
        return Err(format!(
            "--size, --guidance and --dtype apply to the pipelines ({}); {} has a fixed size, \
             no guidance and computes in f32",
            flashdiff_runtime::models::pipelines::PIPELINES.join(", "),
            o.model
        ));
    }
    use flashdiff_runtime::models::{pipelines, Kind};
    let kind = pipelines::pipeline(&o.model).map(|p| p.kind);
    let audio = kind == Some(Kind::Audio);
    if audio && o.size.is_some() {
        return Err(format!(
            "--size: {} makes sound; give its length with --seconds",
            o.model
        ));
    }
    let video = kind == Some(Kind::Video);
    if !video && o.frames.is_some() {
        return Err(format!(
            "--frames applies to wan2.1; {} makes {}",
            o.model,
            if audio {
                "sound"
            } else if pipeline {
                "images"
            } else {
                "its own fixed-size samples"
            }
        ));
    }
    if !audio && o.seconds.is_some() {
        return Err(format!(
            "--seconds applies to stable-audio-open; {} makes {}",
            o.model,
            if pipeline {
                "images"
            } else {
                "its own fixed-size samples"
            }
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Patches(pub(crate) Option<u32>);

pub(crate) fn parse_patches(v: &str) -> Result<Patches, String> {
    flashdiff_runtime::schema::parse_patches(&Count::Word(v.into()))
        .map(Patches)
        .map_err(|e| e.to_string())
}

/// `extrapolate`, `extrapolate2`, `corrected`, `corrected2` or `stale` (the `--reuse` flag).
pub(crate) fn parse_reuse(v: &str) -> Result<Reuse, String> {
    flashdiff_runtime::schema::parse_reuse(v).map_err(|e| e.to_string())
}

pub(crate) fn parse_mode(v: &str) -> Result<Mode, String> {
    v.parse()
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Monotasks(pub(crate) Option<u32>);

pub(crate) fn parse_monotasks(v: &str) -> Result<Monotasks, String> {
    flashdiff_runtime::schema::parse_monotasks(&Count::Word(v.into()))
        .map(Monotasks)
        .map_err(|e| e.to_string())
}

impl Knobs {
    /// The request these knobs make; a warm-up not given is the generic default until
    /// [`crate::generate::with_model_warmup`] sets the model's.
    pub(crate) fn request(&self, steps: u32, patches: Option<u32>, seed: u64) -> RequestConfig {
        RequestConfig {
            steps,
            warmup: self.warmup.unwrap_or(DEFAULT_WARMUP),
            patches,
            epsilon: self.epsilon,
            adaptive_epsilon: self.adaptive_epsilon,
            max_skip: self.max_skip,
            budget: self.budget,
            seed,
            priority: self.priority,
            mode: self.mode,
            layout: match self.layout.as_str() {
                "uniform" => LayoutKind::Uniform,
                _ => LayoutKind::Saliency,
            },
            reuse: self.reuse,
            monotasks: self.monotasks.0,
            cache_threshold: self.cache_threshold,
            ..RequestConfig::default()
        }
    }
}
