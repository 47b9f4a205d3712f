//! `flashdiff`: generate with the built-in model, serve a request stream, run the bench.

mod http;
mod journal;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use flashdiff_eval::image::Verdict;
use flashdiff_runtime::engine::{
    builtin_weights, default_weights, Engine, LayoutKind, Mode, Output, RequestConfig, StepEvent,
    BUILTIN_MODELS, DEFAULT_CACHE_THRESHOLD, DEFAULT_STEPS, DEFAULT_WARMUP, ENGINE_DEFAULT_EPSILON,
    ENGINE_DEFAULT_MAX_SKIP,
};
use flashdiff_runtime::media;
use flashdiff_runtime::models::registry::ModelSpec;
use flashdiff_runtime::models::scene;
use flashdiff_runtime::models::{clips, sounds};
use flashdiff_runtime::models::{Kind, Sample};
use flashdiff_runtime::schema::{Count, RequestFields, IMAGE_FIELDS};

/// flashdiff: diffusion serving with semantic patches and selective refinement (CPU,
/// built-in model).
#[derive(Parser, Debug)]
#[command(name = "flashdiff", version, about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// One image, with a report.
    Generate(GenerateArgs),
    /// JSON-lines requests in, JSON-lines results out. Each line is an object such as
    /// {"id": 1, "prompt": "...", "seed": 0, "priority": 0, "steps": 50, "warmup": 5,
    /// "patches": 8, "epsilon": 0.1, "adaptive_epsilon": false, "max_skip": 3, "mode": "flashdiff", "reuse":
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
struct GenerateArgs {
    /// The prompt, quoted as one argument.
    prompt: String,
    /// Output path: a PNG for an image, an animated GIF for a video, a WAV for a sound
    /// (default: flashdiff.png, .gif or .wav by the model's kind).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Also run full computation from the same seed: PSNR and SSIM (images), clip, worst
    /// frame and temporal PSNR (video), SNR and log-spectral distance (sound); the checker
    /// for both where the model has one.
    #[arg(long)]
    compare: bool,
    #[command(flatten)]
    sampling: Sampling,
    #[command(flatten)]
    knobs: Knobs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Serve HTTP on this port (0: any free port, printed at start) instead of reading JSON
    /// lines: POST /v1/images/generations, /v1/jobs, GET /healthz, /metrics.
    #[arg(long, conflicts_with_all = ["input", "out_dir"])]
    port: Option<u16>,
    /// Address to bind with --port.
    #[arg(long, default_value = "127.0.0.1", requires = "port")]
    host: String,
    /// With --port: most unfinished jobs before new requests get 429 (1..=100000).
    #[arg(long, default_value_t = 256, requires = "port", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_queue: u32,
    /// With --port: largest request body in bytes.
    #[arg(long, default_value_t = 65_536, requires = "port", value_parser = clap::value_parser!(u32).range(64..=16_777_216))]
    max_body: u32,
    /// With --port: where jobs, results and per-step checkpoints live, so that a server
    /// killed at any point and started again on the same directory resumes every unfinished
    /// job and still answers for finished ones (default: $XDG_STATE_HOME/flashdiff, else
    /// ~/.local/state/flashdiff). One server per directory.
    #[arg(long, requires = "port", conflicts_with = "ephemeral")]
    state_dir: Option<PathBuf>,
    /// With --port and a state directory: least milliseconds between two checkpoints of a
    /// request; after a crash it resumes from its last one (0: every step, which costs
    /// throughput; see the README).
    #[arg(long, default_value_t = 1000, requires = "port", value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    checkpoint_every_ms: u64,
    /// With --port: keep no state; nothing survives a restart.
    #[arg(long, requires = "port")]
    ephemeral: bool,
    /// Requests file (JSON lines); standard input when absent or "-".
    #[arg(long)]
    input: Option<PathBuf>,
    /// Where to write each request's PNG.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Order within a priority level: arrival (first come, first served across steps) or
    /// deadline (earliest `deadline_ms` first, re-decided at every step; requests without
    /// one after those with one).
    #[arg(long, default_value = "arrival", value_parser = ["arrival", "deadline"])]
    order: String,
    #[command(flatten)]
    sampling: Sampling,
    #[command(flatten)]
    knobs: Knobs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// 8 prompts instead of 64.
    #[arg(long)]
    quick: bool,
    /// Run one study alone: "wall-time" (full computation against `generate`'s defaults, in
    /// the engine and as whole processes). Image models only.
    #[arg(long, value_parser = ["wall-time"], conflicts_with = "study")]
    only: Option<String>,
    /// Run a study instead of the whole bench: "curve" (quality against work for FlashDiff
    /// and every other method over its own knob; held-out prompts: image 64, video 32, sound
    /// 64, 8 with --quick).
    #[arg(long, value_parser = ["curve"])]
    study: Option<String>,
    /// Held-out prompts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    prompts: Option<u32>,
    /// Seed of the first prompt (prompts and noise).
    #[arg(long, default_value_t = 10_000)]
    seed: u64,
    /// Total Euler steps.
    #[arg(long, default_value_t = DEFAULT_STEPS, value_parser = clap::value_parser!(u32).range(2..=1000))]
    steps: u32,
    /// Patch count R for FlashDiff and the patch baselines.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    patches: u32,
    /// Where bench.json, report.md and the plots go.
    #[arg(long, default_value = "bench-out")]
    out_dir: PathBuf,
    #[command(flatten)]
    knobs: Knobs,
    #[command(flatten)]
    run: RunArgs,
}

/// Steps, patches and seed of a request (serve: the defaults for lines that do not say).
/// Ranges are the engine's, checked once for every interface.
#[derive(Args, Debug, Clone, Copy)]
struct Sampling {
    /// Total Euler steps, in 2..=1000.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    steps: u32,
    /// Patch count R: auto (the adaptive controller, which searches R over a stream of
    /// requests) or an integer from 1 to the latent's tokens. Default: 16 for generate (a lone request cannot
    /// search; 16 is the measured default, see the README), auto for serve.
    #[arg(long, value_parser = parse_patches)]
    patches: Option<Patches>,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// FlashDiff's knobs, shared by every subcommand.
#[derive(Args, Debug, Clone)]
struct Knobs {
    /// Warm-up steps before partitioning (at least 1, below --steps). Default: the model's,
    /// 5 (the paper's), 12 for tinyaudio (measured: its events settle later), shortened to
    /// steps - 1 when there are fewer steps.
    #[arg(long)]
    warmup: Option<u32>,
    /// Gate threshold in [0, 1].
    #[arg(long, default_value_t = ENGINE_DEFAULT_EPSILON)]
    epsilon: f32,
    /// Let ε follow the load: --epsilon at one request per worker, half of it with slack,
    /// up to twice it under overload (serve and bench; a lone request runs at half).
    #[arg(long)]
    adaptive_epsilon: bool,
    /// Longest run of skips per patch, in 0..=1000.
    #[arg(long, default_value_t = ENGINE_DEFAULT_MAX_SKIP)]
    max_skip: u32,
    /// Scheduling priority, in 0..8 (higher first).
    #[arg(long, default_value_t = 0)]
    priority: u8,
    /// flashdiff | no-skip | full | naive-patch | teacache | ras.
    #[arg(long, default_value = "flashdiff", value_parser = parse_mode)]
    mode: Mode,
    /// saliency | uniform.
    #[arg(long, default_value = "saliency", value_parser = ["saliency", "uniform"])]
    layout: String,
    /// extrapolate | stale: reused K/V and skipped tokens' velocity (every method that
    /// skips) extrapolated along their slope, or reused as last computed (the paper's rule;
    /// TeaCache's and RAS's authors').
    #[arg(long, default_value = "extrapolate", value_parser = parse_reuse_flag)]
    reuse: Reuse,
    /// N | workers | per-patch: a step's active patches run packed into at most N forwards
    /// (neighbours together, balanced by tokens); patches in one forward see each other's
    /// fresh K/V, the others' cached K/V. 1 (the default) gives the same output for any
    /// --workers; workers: one per worker; per-patch: DistriFusion's displaced patches.
    #[arg(long, default_value = "1", value_parser = parse_monotasks)]
    monotasks: Monotasks,
    /// teacache: skip a step while the accumulated change stays under T (>= 0).
    #[arg(long, default_value_t = DEFAULT_CACHE_THRESHOLD)]
    cache_threshold: f32,
}

/// Where and on what the engine runs.
#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Workers, in 1..=1024: with more than one, worker threads (or processes). Default: 1
    /// for generate, one per CPU core for serve and bench.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Option<u32>,
    /// Run the workers as separate processes sharing request state in /dev/shm (outputs are
    /// bit-identical either way).
    #[arg(long)]
    processes: bool,
    /// Model: built-in tinydit (images), tinyvideo (8-frame clips), tinyaudio (2 s sounds);
    /// or flux-dev, flux-schnell, sd3, sd3.5 (images), wan2.1 (video), stable-audio-open
    /// (sound) from a diffusers folder given with --weights.
    #[arg(long, default_value = "tinydit", value_parser = MODELS)]
    model: String,
    /// Model file (default: the built-in --model's shipped weights), or with --model
    /// flux-dev|flux-schnell|sd3|sd3.5|wan2.1|stable-audio-open the pipeline's diffusers folder (transformer/,
    /// text_encoder*/, tokenizer*/, vae/).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Image size WIDTHxHEIGHT in pixels for the pipelines (multiples of 16 up to 2048;
    /// default 1024x1024). The built-in models have fixed sizes.
    #[arg(long, value_parser = parse_size)]
    size: Option<(usize, usize)>,
    /// Guidance, 0..=100: FLUX.1 dev's embedded guidance (default 3.5), SD3's
    /// classifier-free guidance scale (default 7.0); flux-schnell takes none.
    #[arg(long, value_parser = parse_guidance)]
    guidance: Option<f32>,
    /// What the pipelines' transformer and T5 compute in: f32 (default), or bf16 (the
    /// released weights' dtype: half the memory; fast on a GPU, slower than f32 on a CPU).
    /// The built-in models compute in f32.
    #[arg(long, value_parser = ["f32", "bf16"])]
    dtype: Option<String>,
    /// Seconds of audio for stable-audio-open (default: its whole window, 47.55 s for the
    /// released model); written as a WAV file.
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<f32>,
    /// Video frames for wan2.1: 1 + 4k, up to 1001 (default 81); written as a GIF (the
    /// latent preview if the folder has no vae/).
    #[arg(long, value_parser = parse_frames)]
    frames: Option<usize>,
    /// Whether --model was on the command line (not its default).
    #[arg(skip)]
    model_given: bool,
    /// Where the model runs: cpu, or cuda (GPU 0; needs a build with --features cuda and an
    /// NVIDIA GPU; worker processes run on the CPU only for now).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
}

/// For the one-shot commands (`generate`, `bench`): a reader that closes our standard
/// output early (`flashdiff generate ... | head`) ends the process quietly, as for any
/// Unix filter, instead of a panic on the failed print. Not for `serve`, whose sockets must
/// not raise SIGPIPE; worker-pipe writer threads block SIGPIPE themselves (`proc.rs`).
fn quiet_on_closed_stdout() {
    // SAFETY: called on the main thread before any other thread of ours exists for this
    // command; SIG_DFL is a valid disposition for SIGPIPE and changes nothing in memory.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Every `--model`: the built-in models, then the pipelines read from a folder.
const MODELS: [&str; 9] = [
    BUILTIN_MODELS[0],
    BUILTIN_MODELS[1],
    BUILTIN_MODELS[2],
    "flux-dev",
    "flux-schnell",
    "sd3",
    "sd3.5",
    "wan2.1",
    "stable-audio-open",
];

fn is_pipeline(model: &str) -> bool {
    flashdiff_runtime::models::pipeline::PIPELINES.contains(&model)
}

/// `WIDTHxHEIGHT` -> (height, width).
fn parse_size(v: &str) -> Result<(usize, usize), String> {
    let bad = || format!("expected WIDTHxHEIGHT in pixels, e.g. 1024x1024; got {v:?}");
    let (w, h) = v.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (usize, usize) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    flashdiff_runtime::models::pipeline::check_size((h, w)).map_err(|e| e.to_string())?;
    Ok((h, w))
}

fn parse_seconds(v: &str) -> Result<f32, String> {
    match v.parse::<f32>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Ok(s),
        _ => Err("must be a number of seconds in (0, 3600]".into()),
    }
}

fn parse_frames(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(f) if (1..=1001).contains(&f) && (f - 1) % 4 == 0 => Ok(f),
        _ => Err("must be 1 + 4k frames in 1..=1001, e.g. 81".into()),
    }
}

fn parse_guidance(v: &str) -> Result<f32, String> {
    match v.parse::<f32>() {
        Ok(g) if g.is_finite() && (0.0..=100.0).contains(&g) => Ok(g),
        _ => Err("must be a number in [0, 100]".into()),
    }
}

/// Flags that only make sense together: the error names them.
fn check_run_args(o: &RunArgs, model_given: bool) -> Result<(), String> {
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
             weights (--weights alone takes a TinyDiT-family file; a folder needs --model \
             flux-dev, flux-schnell, sd3 or sd3.5)",
            o.model
        ));
    }
    if !pipeline && (o.size.is_some() || o.guidance.is_some() || o.dtype.is_some()) {
        return Err(format!(
            "--size, --guidance and --dtype apply to the pipelines (flux-dev, flux-schnell, \
             sd3, sd3.5); {} has a fixed size, no guidance and computes in f32",
            o.model
        ));
    }
    let audio = o.model == flashdiff_runtime::models::pipeline::AUDIO;
    if audio && o.size.is_some() {
        return Err(format!(
            "--size: {} makes sound; give its length with --seconds",
            o.model
        ));
    }
    let video = o.model == flashdiff_runtime::models::pipeline::VIDEO;
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
struct Patches(Option<u32>);

fn parse_patches(v: &str) -> Result<Patches, String> {
    flashdiff_runtime::schema::parse_patches(&Count::Word(v.into()))
        .map(Patches)
        .map_err(|e| e.to_string())
}

fn parse_mode(v: &str) -> Result<Mode, String> {
    v.parse()
}

/// Whether reused values are extrapolated (`--reuse extrapolate`) or stale.
#[derive(Debug, Clone, Copy)]
struct Reuse(bool);

fn parse_reuse_flag(v: &str) -> Result<Reuse, String> {
    parse_reuse(v).map(Reuse)
}

#[derive(Debug, Clone, Copy)]
struct Monotasks(Option<u32>);

fn parse_monotasks(v: &str) -> Result<Monotasks, String> {
    flashdiff_runtime::schema::parse_monotasks(&Count::Word(v.into()))
        .map(Monotasks)
        .map_err(|e| e.to_string())
}

impl Knobs {
    /// The request these knobs make; a warm-up not given is the generic default until
    /// [`with_model_warmup`] sets the model's.
    fn request(&self, steps: u32, patches: Option<u32>, seed: u64) -> RequestConfig {
        RequestConfig {
            steps,
            warmup: self.warmup.unwrap_or(DEFAULT_WARMUP),
            patches,
            epsilon: self.epsilon,
            adaptive_epsilon: self.adaptive_epsilon,
            max_skip: self.max_skip,
            seed,
            priority: self.priority,
            mode: self.mode,
            layout: match self.layout.as_str() {
                "uniform" => LayoutKind::Uniform,
                _ => LayoutKind::Saliency,
            },
            extrapolate: self.reuse.0,
            monotasks: self.monotasks.0,
            cache_threshold: self.cache_threshold,
            ..RequestConfig::default()
        }
    }
}

/// Keeps freed memory in the process instead of handing it back to the kernel after every
/// step: candle allocates each op's output afresh, and with glibc's defaults buffers over
/// 128 KiB are mapped and unmapped per op, a page fault per 4 KiB each time (about 900 of
/// them in one `generate`). The heap then stays at its peak, which is what a server wants.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called first thing in main,
    // before any other thread exists, with parameters glibc documents for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

/// The library's log lines (worker losses, retries, a worker's own stderr) on stderr,
/// prefixed like the CLI's own messages.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("flashdiff: {}", r.args());
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    keep_freed_memory();
    static LOG: StderrLog = StderrLog;
    if log::set_logger(&LOG).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let given = matches.subcommand().is_some_and(|(name, m)| {
        name != "worker" && m.value_source("model") == Some(clap::parser::ValueSource::CommandLine)
    });
    let mut cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match &mut cli.cmd {
        Cmd::Generate(a) => a.run.model_given = given,
        Cmd::Serve(a) => a.run.model_given = given,
        Cmd::Bench(a) => a.run.model_given = given,
        Cmd::Worker { .. } => {}
    }
    let result = match cli.cmd {
        Cmd::Generate(a) => {
            quiet_on_closed_stdout();
            generate(a)
        }
        Cmd::Serve(a) => serve(a),
        Cmd::Bench(a) => {
            quiet_on_closed_stdout();
            bench(a)
        }
        Cmd::Worker { spec } => ModelSpec::from_worker_args(&spec)
            .and_then(|spec| flashdiff_runtime::proc::worker_main(&spec)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The built-in checker's verdict on a sample for its prompt, in words.
fn checker_note(prompt: &str, sample: &Sample, kind: Kind) -> String {
    let parts = |all: bool, named: &[(&str, bool)]| {
        if all {
            "all correct".to_string()
        } else {
            named
                .iter()
                .map(|(n, b)| format!("{n} {}", ok(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let res = match kind {
        Kind::Image => scene::parse(prompt)
            .map(|s| verdict_text(flashdiff_eval::image::check(&sample.rgb, &s))),
        Kind::Video => clips::parse(prompt).map(|c| {
            let v = flashdiff_eval::video::check(&sample.rgb, &c);
            parts(
                v.all(),
                &[
                    ("background", v.background),
                    ("objects present", v.present),
                    ("start places", v.place),
                    ("shapes", v.shape),
                    ("motion", v.motion),
                ],
            )
        }),
        Kind::Audio => sounds::parse(prompt).map(|e| {
            let v = flashdiff_eval::sound::check(&sample.audio, &e);
            parts(
                v.all(),
                &[
                    ("event count", v.count),
                    ("kinds", v.kinds),
                    ("pitches", v.pitches),
                ],
            )
        }),
    };
    res.unwrap_or_else(|e| format!("not checked ({e})"))
}

fn verdict_text(v: Verdict) -> String {
    if v.all() {
        "all correct".into()
    } else {
        format!(
            "background {}, objects present {}, shapes {}",
            ok(v.background),
            ok(v.present),
            ok(v.shape)
        )
    }
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "WRONG"
    }
}

fn progress_bar() -> impl FnMut(&StepEvent) {
    let tty = std::io::stderr().is_terminal();
    move |ev| {
        let (step, steps) = (ev.step, ev.steps);
        let width = 30;
        let filled = (step as usize * width) / steps.max(1) as usize;
        if tty {
            eprint!(
                "\r[{}{}] step {step}/{steps}",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            if step >= steps {
                eprintln!();
            }
        } else if step == steps || step % 10 == 0 {
            eprintln!("step {step}/{steps}");
        }
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn describe(sample: &Sample, kind: Kind) -> String {
    match kind {
        Kind::Image if media::zoom(sample) > 1 => format!(
            "{}x{} pixels, shown {}x",
            sample.width,
            sample.height,
            media::zoom(sample)
        ),
        Kind::Image => format!("{}x{} pixels", sample.width, sample.height),
        Kind::Video => format!(
            "{} frames of {}x{} pixels, shown {}x at 8 frames a second",
            sample.frames,
            sample.width,
            sample.height,
            media::zoom(sample)
        ),
        Kind::Audio => {
            let ch = sample.audio_channels.max(1);
            format!(
                "{:.2} s of {} sound at {} Hz",
                sample.audio.len() as f64 / ch as f64 / sample.sample_rate.max(1) as f64,
                match ch {
                    1 => "mono".to_string(),
                    2 => "stereo".to_string(),
                    n => format!("{n}-channel"),
                },
                sample.sample_rate
            )
        }
    }
}

/// The output path: as given (its extension must match the model's kind), or
/// flashdiff.png / .gif / .wav.
fn output_path(given: Option<PathBuf>, kind: Kind) -> Result<PathBuf, String> {
    let ext = media::extension(kind);
    let Some(p) = given else {
        return Ok(PathBuf::from(format!("flashdiff.{ext}")));
    };
    let got = p
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if got.as_deref() != Some(ext) {
        return Err(format!(
            "-o {}: this model makes {} {}, written as .{ext}; give a path ending in .{ext}",
            p.display(),
            if kind == Kind::Image { "an" } else { "a" },
            match kind {
                Kind::Image => "image",
                Kind::Video => "video",
                Kind::Audio => "sound",
            }
        ));
    }
    Ok(p)
}

/// The `--compare` line's quality part: `out` against full computation's `full`.
fn quality_vs(out: &Sample, full: &Sample, kind: Kind) -> Result<String, String> {
    Ok(match kind {
        Kind::Image => format!(
            "PSNR {:.2} dB, SSIM {:.4}",
            flashdiff_eval::metrics::psnr(&out.rgb, &full.rgb),
            flashdiff_eval::metrics::ssim(&out.rgb, &full.rgb, out.width, out.height)
        ),
        Kind::Video => {
            let q = flashdiff_eval::metrics::video_quality(out, full).map_err(|e| e.to_string())?;
            format!(
                "PSNR {:.2} dB over the clip, worst frame {:.2} dB, temporal (frame differences) {:.2} dB",
                q.clip_psnr, q.worst_frame_psnr, q.temporal_psnr
            )
        }
        Kind::Audio => {
            let q = flashdiff_eval::metrics::audio_quality(out, full).map_err(|e| e.to_string())?;
            format!("SNR {:.2} dB, log-spectral distance {:.3} dB", q.snr, q.lsd)
        }
    })
}

/// `cfg` with the warm-up of `model` unless one was given (`given`). A model's longer
/// default shrinks to fit fewer steps (never below the generic default), so that a request
/// the generic default served is not refused for a warm-up its sender never chose.
fn with_model_warmup(
    cfg: RequestConfig,
    given: Option<u32>,
    model: &dyn flashdiff_runtime::models::Denoiser,
) -> RequestConfig {
    RequestConfig {
        warmup: given.unwrap_or_else(|| {
            flashdiff_runtime::engine::fit_warmup(model.default_warmup(), cfg.steps)
        }),
        ..cfg
    }
}

fn generate(a: GenerateArgs) -> Result<(), String> {
    let prompt = a.prompt.clone();
    let mut engine = make_engine(&a.run, 1)?;
    let patches = a.sampling.patches.map_or(
        Some(flashdiff_runtime::engine::lone_request_patches(
            engine.model(),
        )),
        |p| p.0,
    );
    let cfg = with_model_warmup(
        a.knobs.request(a.sampling.steps, patches, a.sampling.seed),
        a.knobs.warmup,
        engine.model(),
    );
    let kind = engine.model().kind();
    let output = output_path(a.output.clone(), kind)?;
    let out = engine
        .generate(&prompt, cfg.clone(), &mut progress_bar())
        .map_err(|e| e.to_string())?;
    std::fs::write(
        &output,
        media::encode(&out.sample, kind).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    let r = &out.report;
    println!(
        "wrote {} ({})",
        output.display(),
        describe(&out.sample, kind)
    );
    println!(
        "mode {:?}, {} steps ({} warm-up), {} patches, seed {}",
        cfg.mode, r.steps, r.warmup, r.patches, cfg.seed
    );
    println!(
        "patch-steps computed {} of {} ({:.1}% skipped); model work skipped incl. warm-up {:.1}%",
        r.computed,
        r.patch_steps,
        100.0 * r.skipped_share(),
        100.0 * r.work_skipped
    );
    println!(
        "reuse error (extrapolated stand-ins of skipped patches vs computed, on resuming): {:.2}%{}",
        100.0 * r.reuse_error(),
        r.mean_epsilon()
            .map_or(String::new(), |e| format!("; mean load-adaptive epsilon {e:.3}"))
    );
    let t = r.time;
    println!(
        "time {:.0} ms: prompt+decode {:.1}, warm-up {:.0}, partition {:.2}, gate {:.2}, scheduler {:.2}, compute {:.0}, queue {:.1}",
        ms(r.latency),
        ms(t.io),
        ms(t.warmup),
        ms(t.partition),
        ms(t.gate),
        ms(t.schedule),
        ms(t.compute),
        ms(t.queue)
    );
    let pipeline = is_pipeline(&a.run.model);
    let grammar_note = |v: &Output| {
        if pipeline {
            "none (the checkers read the built-in models' prompt grammars)".to_string()
        } else {
            checker_note(&prompt, &v.sample, kind)
        }
    };
    let control = t.partition + t.gate + t.schedule;
    println!(
        "control plane (partition + gate + scheduler): {:.2} ms = {:.3}% of model time",
        ms(control),
        100.0 * control.as_secs_f64() / (t.warmup + t.compute).as_secs_f64().max(1e-9)
    );
    println!("checker: {}", grammar_note(&out));
    if a.compare {
        let full_cfg = RequestConfig {
            mode: Mode::Full,
            patches: None,
            ..cfg.clone()
        };
        let full = engine
            .generate(&prompt, full_cfg, &mut |_| {})
            .map_err(|e| e.to_string())?;
        println!(
            "vs full computation: {}; full took {:.0} ms ({:.2}x); full checker: {}",
            quality_vs(&out.sample, &full.sample, kind)?,
            ms(full.report.latency),
            full.report.latency.as_secs_f64() / r.latency.as_secs_f64(),
            grammar_note(&full)
        );
    }
    Ok(())
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// CPU time of this process and its finished children, in seconds.
fn cpu_time() -> f64 {
    let mut total = 0.0;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage writes one rusage into the zeroed struct we own; `who` is one of
        // the two constants it accepts.
        let u = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut u);
            u
        };
        for t in [u.ru_utime, u.ru_stime] {
            total += t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        }
    }
    total
}

fn serve(o: ServeArgs) -> Result<(), String> {
    let base = o.knobs.request(
        o.sampling.steps,
        o.sampling.patches.and_then(|p| p.0),
        o.sampling.seed,
    );
    if let Some(port) = o.port {
        let mut engine = make_engine(&o.run, cores())?;
        let base = with_model_warmup(base, o.knobs.warmup, engine.model());
        let kind = engine.model().kind();
        if kind != Kind::Image {
            return Err(format!(
                "serve --port returns images (OpenAI's image API); --model {} makes a {}: \
                 serve it as JSON lines (without --port), which writes .{} files",
                o.run.model,
                if kind == Kind::Video {
                    "video"
                } else {
                    "sound"
                },
                media::extension(kind)
            ));
        }
        engine.validate(&base).map_err(|e| e.to_string())?;
        engine
            .set_queue_order(queue_order(&o.order))
            .map_err(|e| e.to_string())?;
        return http::serve(
            engine,
            http::HttpConfig {
                addr: format!("{}:{port}", o.host),
                max_queue: o.max_queue as usize,
                body_limit: o.max_body as usize,
                base,
                warmup: o.knobs.warmup,
                checkpoint_every: std::time::Duration::from_millis(o.checkpoint_every_ms),
                state_dir: if o.ephemeral {
                    None
                } else {
                    Some(o.state_dir.clone().unwrap_or_else(journal::default_dir))
                },
            },
        );
    }
    serve_lines(o, base)
}

/// `serve` without `--port`: JSON lines in, a result line out as each request finishes.
fn serve_lines(o: ServeArgs, base: RequestConfig) -> Result<(), String> {
    if let Some(d) = &o.out_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let file = match o.input.as_deref() {
        None => None,
        Some(p) if p.as_os_str() == "-" => None,
        Some(p) => {
            Some(std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?)
        }
    };
    // The server's own model first; a line naming another built-in model starts an engine
    // for it on first use (each with its own workers).
    let mut engines = vec![ModelEngine::start(&o, None)?];
    // Lines are read on their own thread, so a request starts as soon as its line arrives
    // and results are written as they finish, while later lines are still being typed.
    let (tx, rx) = std::sync::mpsc::channel::<Result<String, String>>();
    std::thread::spawn(move || {
        let input: Box<dyn BufRead> = match file {
            Some(f) => Box::new(std::io::BufReader::new(f)),
            None => Box::new(std::io::BufReader::new(std::io::stdin())),
        };
        for line in input.lines() {
            let stop = line.is_err();
            if tx
                .send(line.map_err(|e| format!("reading requests: {e}")))
                .is_err()
                || stop
            {
                return;
            }
        }
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Prompt and model of every request in flight (ids are unique across models).
    let mut prompts: std::collections::HashMap<u64, (String, usize)> =
        std::collections::HashMap::new();
    let (wall0, cpu0) = (std::time::Instant::now(), cpu_time());
    let (mut n, mut served, mut open) = (0usize, 0u32, true);
    loop {
        // Admit every line that has arrived; wait for one only when nothing runs.
        loop {
            let in_flight: usize = engines.iter().map(|e| e.engine.in_flight()).sum();
            let msg = if in_flight == 0 && open {
                rx.recv()
                    .map_err(|_| std::sync::mpsc::TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            let line = match msg {
                Ok(l) => l?,
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            };
            n += 1;
            if line.trim().is_empty() {
                continue;
            }
            let fallback_id = n as u64;
            let outcome = match parse_request(&line, &base, fallback_id) {
                Ok((id, ..)) if prompts.contains_key(&id) => Some((
                    id,
                    format!("line {n}: request id {id} is already in flight"),
                )),
                Ok((id, prompt, cfg, model, warmup)) => {
                    match engine_for(&mut engines, &o, model.as_deref()) {
                        Ok(i) => {
                            let engine = &mut engines[i].engine;
                            let cfg =
                                with_model_warmup(cfg, warmup.or(o.knobs.warmup), engine.model());
                            match engine.submit(id, &prompt, cfg) {
                                Ok(()) => {
                                    prompts.insert(id, (prompt, i));
                                    None
                                }
                                Err(e) => Some((id, e.to_string())),
                            }
                        }
                        Err(e) => Some((id, format!("line {n}: {e}"))),
                    }
                }
                Err(e) => Some((fallback_id, format!("line {n}: {e}"))),
            };
            if let Some((id, e)) = outcome {
                writeln!(
                    out,
                    "{{\"id\":{id},\"ok\":false,\"error\":{}}}",
                    json_str(&e)
                )
                .and_then(|_| out.flush())
                .map_err(|e| e.to_string())?;
            }
        }
        if engines.iter().all(|e| e.engine.in_flight() == 0) {
            if open {
                continue;
            }
            break;
        }
        for m in engines.iter_mut().filter(|m| m.engine.in_flight() > 0) {
            m.engine
                .poll(&mut |_| {}, std::time::Duration::from_millis(5));
            for r in m.engine.take_finished() {
                served += r.is_ok() as u32;
                let line = result_line(r, &mut prompts, o.out_dir.as_deref(), m.kind)?;
                writeln!(out, "{line}")
                    .and_then(|_| out.flush())
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_time() - cpu0);
    eprintln!(
        "served {served} requests on {} worker(s) in {wall:.2} s wall, {cpu:.2} s CPU (CPU/wall {:.2}){}",
        engines[0].engine.workers(),
        cpu / wall.max(1e-9),
        if engines.len() > 1 {
            format!("; {} models, each with its own workers", engines.len())
        } else {
            String::new()
        }
    );
    Ok(())
}

/// One model's engine in a JSON-lines server.
struct ModelEngine {
    /// The built-in model's name (`None`: the server's own, from --model or --weights).
    name: Option<String>,
    kind: Kind,
    engine: Engine,
}

impl ModelEngine {
    fn start(o: &ServeArgs, model: Option<&str>) -> Result<Self, String> {
        let run = RunArgs {
            model: model.unwrap_or(&o.run.model).to_string(),
            weights: if model.is_some() {
                None
            } else {
                o.run.weights.clone()
            },
            // A built-in model a request names has its own size and no guidance.
            size: if model.is_some() { None } else { o.run.size },
            seconds: if model.is_some() { None } else { o.run.seconds },
            frames: if model.is_some() { None } else { o.run.frames },
            guidance: if model.is_some() {
                None
            } else {
                o.run.guidance
            },
            dtype: if model.is_some() {
                None
            } else {
                o.run.dtype.clone()
            },
            ..o.run.clone()
        };
        let mut engine = make_engine(&run, cores())?;
        engine
            .set_queue_order(queue_order(&o.order))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            name: model.map(str::to_string),
            kind: engine.model().kind(),
            engine,
        })
    }
}

/// The engine a request for `model` runs on (index into `engines`), started on first use.
/// A request naming no model, or the server's own --model (without --weights), runs on the
/// server's engine.
fn engine_for(
    engines: &mut Vec<ModelEngine>,
    o: &ServeArgs,
    model: Option<&str>,
) -> Result<usize, String> {
    let model = model
        .filter(|m| (o.run.weights.is_some() && !is_pipeline(&o.run.model)) || *m != o.run.model);
    if let Some(m) = model.filter(|m| is_pipeline(m)) {
        return Err(format!(
            "\"model\": {m} is not loaded by this server (start one with --model {m} --weights DIR)"
        ));
    }
    if let Some(i) = engines.iter().position(|e| e.name.as_deref() == model) {
        return Ok(i);
    }
    engines.push(ModelEngine::start(o, model)?);
    Ok(engines.len() - 1)
}

/// The JSON line of a finished request (its PNG, GIF or WAV written into `out_dir` when
/// given).
fn result_line(
    r: Result<Output, (u64, flashdiff_runtime::engine::EngineError)>,
    prompts: &mut std::collections::HashMap<u64, (String, usize)>,
    out_dir: Option<&std::path::Path>,
    kind: Kind,
) -> Result<String, String> {
    Ok(match r {
        Ok(o2) => {
            let rep = &o2.report;
            let prompt = prompts.remove(&rep.id).unwrap_or_default().0;
            let checker = match scene::parse(&prompt).ok().filter(|_| kind == Kind::Image) {
                Some(s) => {
                    let v = flashdiff_eval::image::check(&o2.sample.rgb, &s);
                    format!(
                        "{{\"background\":{},\"present\":{},\"shape\":{},\"all\":{}}}",
                        v.background,
                        v.present,
                        v.shape,
                        v.all()
                    )
                }
                None => "null".into(),
            };
            let image = match out_dir {
                Some(d) => {
                    let p = d.join(format!("{}.{}", rep.id, media::extension(kind)));
                    std::fs::write(
                        &p,
                        media::encode(&o2.sample, kind).map_err(|e| e.to_string())?,
                    )
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
                    json_str(&p.display().to_string())
                }
                None => "null".into(),
            };
            format!(
                "{{\"id\":{},\"ok\":true,\"image\":{image},\"latency_ms\":{:.1},\"patches\":{},\"patch_steps\":{},\"computed\":{},\"skipped_share\":{:.4},\"checker\":{checker}}}",
                rep.id,
                ms(rep.latency),
                rep.patches,
                rep.patch_steps,
                rep.computed,
                rep.skipped_share()
            )
        }
        Err((id, e)) => {
            prompts.remove(&id);
            format!(
                "{{\"id\":{id},\"ok\":false,\"error\":{}}}",
                json_str(&e.to_string())
            )
        }
    })
}

fn queue_order(s: &str) -> flashdiff_runtime::engine::QueueOrder {
    use flashdiff_runtime::engine::QueueOrder;
    if s == "deadline" {
        QueueOrder::Deadline
    } else {
        QueueOrder::Arrival
    }
}

/// A request line: id, prompt, settings, the built-in model it names (`None`: the
/// server's own) and the warm-up if the line gave one.
type ParsedRequest = (u64, String, RequestConfig, Option<String>, Option<u32>);

fn parse_request(
    line: &str,
    base: &RequestConfig,
    fallback_id: u64,
) -> Result<ParsedRequest, String> {
    let f = RequestFields::from_json(line.as_bytes()).map_err(|e| e.to_string())?;
    if let Some(k) = f.given().into_iter().find(|k| IMAGE_FIELDS.contains(k)) {
        return Err(format!(
            "\"{k}\": a field of the HTTP image endpoint, not of a JSON line"
        ));
    }
    let prompt = f
        .prompt
        .clone()
        .ok_or("\"prompt\" (a string) is required")?;
    let cfg = f.settings(base).map_err(|e| e.to_string())?;
    let model = match f.model.as_deref() {
        None => None,
        Some(m) if MODELS.contains(&m) => Some(m.to_string()),
        Some(m) => {
            return Err(format!(
                "\"model\" {m:?}: must be one of {}",
                MODELS.join(", ")
            ))
        }
    };
    let warmup = f.warmup.map(|w| w.min(u32::MAX as u64) as u32);
    Ok((f.id.unwrap_or(fallback_id), prompt, cfg, model, warmup))
}

/// `extrapolate` or `stale` (the `--reuse` flag and the `reuse` request field).
fn parse_reuse(v: &str) -> Result<bool, String> {
    flashdiff_runtime::schema::parse_reuse(v).map_err(|e| e.to_string())
}

/// CPU cores available to this process (the default worker count of serve and bench).
fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(1024) as u32)
}

/// `--weights`, else the built-in `--model`'s (TinyDiT's honours `$FLASHDIFF_WEIGHTS`).
fn weights_path(o: &RunArgs) -> PathBuf {
    match &o.weights {
        Some(w) => w.clone(),
        None if o.model == "tinydit" => default_weights(),
        None => builtin_weights(&o.model).unwrap_or_else(default_weights),
    }
}

fn make_engine(o: &RunArgs, default_workers: u32) -> Result<Engine, String> {
    check_run_args(o, o.model_given)?;
    let spec = model_spec(o)?;
    let workers = o.workers.unwrap_or(default_workers);
    let cuda = o.device == "cuda";
    let device = flashdiff_runtime::models::device(cuda)
        .map_err(|e| format!("--device {}: {e}", o.device))?;
    if cuda && o.processes {
        return Err(
            "--device cuda with --processes: worker processes run on the CPU only for now".into(),
        );
    }
    let t0 = std::time::Instant::now();
    if spec.is_pipeline() {
        eprintln!("loading {} from {} ...", o.model, spec.weights.display());
    }
    let engine = if o.processes {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the flashdiff executable: {e}"))?;
        Engine::with_processes(
            &spec,
            workers,
            &exe,
            &flashdiff_runtime::engine::state_dir(),
        )
    } else {
        Engine::load(&spec, workers, &device)
    };
    let engine = engine.map_err(|e| match spec.is_pipeline() {
        true => format!(
            "--model {} --weights {}: {e}",
            o.model,
            spec.weights.display()
        ),
        false => e.to_string(),
    })?;
    if spec.is_pipeline() {
        eprintln!("loaded in {:.1} s", t0.elapsed().as_secs_f64());
    }
    Ok(engine)
}

/// What `--model`, `--weights` and a pipeline's flags describe.
fn model_spec(o: &RunArgs) -> Result<ModelSpec, String> {
    let weights = weights_path(o);
    if !is_pipeline(&o.model) {
        return Ok(ModelSpec {
            name: o.model.clone(),
            ..ModelSpec::file(&weights)
        });
    }
    use flashdiff_runtime::models::pipeline;
    let opts = pipeline::PipelineOptions {
        // Wan2.1's default is its 480p (832x480); the image models' 1024x1024.
        size: o.size.unwrap_or(if o.model == pipeline::VIDEO {
            (480, 832)
        } else {
            (1024, 1024)
        }),
        guidance: o.guidance,
        dtype: pipeline::parse_dtype(o.dtype.as_deref().unwrap_or("f32"))
            .map_err(|e| format!("--dtype: {e}"))?,
        seconds: o.seconds,
        frames: o.frames,
    };
    Ok(ModelSpec::pipeline(&o.model, &weights, opts))
}

/// `flashdiff bench`.
fn bench(a: BenchArgs) -> Result<(), String> {
    let base = a.knobs.request(a.steps, None, 0);
    let cfg = flashdiff_bench::BenchConfig {
        prompts: a.prompts.unwrap_or(if a.quick { 8 } else { 64 }),
        seed: a.seed,
        steps: a.steps,
        patches: a.patches,
        base,
        exe: std::env::current_exe().ok().map(|e| {
            let args = vec![
                "--weights".to_string(),
                weights_path(&a.run).display().to_string(),
            ];
            (e, args)
        }),
        weights: weights_path(&a.run),
    };
    let out = a.out_dir;
    if is_pipeline(&a.run.model) {
        return Err(format!(
            "bench --model {}: the bench's prompts, checkers and baselines are the built-in \
             models'; time a pipeline with generate --compare",
            a.run.model
        ));
    }
    let mut engine = make_engine(&a.run, cores())?;
    let cfg = flashdiff_bench::BenchConfig {
        base: with_model_warmup(cfg.base, a.knobs.warmup, engine.model()),
        ..cfg
    };
    engine
        .validate(&RequestConfig {
            steps: cfg.steps,
            patches: Some(cfg.patches),
            ..cfg.base.clone()
        })
        .map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    let mut progress = |m: &str| eprintln!("[{:>5.0}s] {m}", t0.elapsed().as_secs_f64());
    let report = match engine.model().kind() {
        kind if a.study.is_some() => {
            let prompts = match (a.prompts, a.quick, kind) {
                (Some(n), _, _) => n,
                (None, true, _) => 8,
                (None, false, Kind::Video) => 32,
                (None, false, _) => 64,
            };
            let cfg = flashdiff_bench::BenchConfig { prompts, ..cfg };
            flashdiff_bench::curve::run(&mut engine, &cfg, &out, &mut progress)
        }
        Kind::Image if a.only.is_some() => {
            flashdiff_bench::wall_time(&engine, &cfg, &out, &mut progress)
        }
        _ if a.only.is_some() => {
            return Err("--only wall-time: the wall-time study runs on image models only".into())
        }
        Kind::Image => flashdiff_bench::run(&mut engine, &cfg, &out, &mut progress),
        _ => flashdiff_bench::media::run(&mut engine, &cfg, &out, &mut progress),
    }
    .map_err(|e| e.to_string())?;
    println!("{report}");
    let wrote = if a.study.is_some() {
        format!(
            "{}/curve.json, {}/report.md and {}/quality_vs_work.svg",
            out.display(),
            out.display(),
            out.display()
        )
    } else if a.only.is_some() {
        format!("{}/report.md", out.display())
    } else {
        format!(
            "{}/bench.json and {}/report.md",
            out.display(),
            out.display()
        )
    };
    println!("wrote {wrote} in {:.0} s", t0.elapsed().as_secs_f64());
    Ok(())
}
