//! `flashdiff bench`: the single-request comparison of FlashDiff against the other ways of
//! serving the same model, on held-out prompts, written as JSON and a markdown report.
//!
//! Every method runs in the same engine, on the same model and seeds: full computation (the
//! quality reference), fewer uniform steps at FlashDiff's compute, NaivePatch, DistriFusion-
//! style (uniform patches, displaced K/V, no skipping), whole-step caching (TeaCache-style),
//! FlashDiff, and two ablations (no gate; uniform patches).

pub mod crossover;
pub mod curve;
pub mod journal;
pub mod media;
mod ordering;
mod plots;
pub mod protocol;
mod scale;
mod serving;
pub mod serving_protocol;
pub mod study;
mod wall_time;

use anyhow::{anyhow, Context};
use plots::plots;
use scale::scale_section;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use flashdiff_models::families::tinydit::scene::{self, IMAGE};
use flashdiff_models::{euler_full_step, ModelError, Tensor};
use flashdiff_runtime::engine::{Engine, LayoutKind, Mode, Output, RequestConfig, Reuse};

/// Benchmark settings.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Held-out prompts.
    pub prompts: u32,
    /// First prompt seed (training uses Python's seed 1; these come from our own generator).
    pub seed: u64,
    /// Steps per request.
    pub steps: u32,
    /// Patches for the patch-based methods.
    pub patches: u32,
    /// FlashDiff's other settings (ε, K, warm-up, reuse, monotasks); `steps` and `patches`
    /// above override theirs. The baselines change only what makes them what they are.
    pub base: RequestConfig,
    /// The `flashdiff` executable and the arguments `generate` needs besides its own (e.g.
    /// a weights file), to time whole processes and run worker processes; `None` skips
    /// those parts.
    pub exe: Option<(std::path::PathBuf, Vec<String>)>,
    /// The model file (worker processes load it themselves).
    pub weights: std::path::PathBuf,
}

/// A method's request with the bench's work budget only where it applies: the budget is
/// FlashDiff's knob, and every other mode runs as it would without one (the engine refuses
/// a budget in another mode).
pub(crate) fn budget_for_mode(c: RequestConfig) -> RequestConfig {
    match c.mode {
        Mode::FlashDiff | Mode::Auto | Mode::PerPatch => c,
        _ => RequestConfig { budget: None, ..c },
    }
}

/// FlashDiff's setting as the reports name it: its work budget, or ε and K.
pub(crate) fn knob(c: &RequestConfig) -> String {
    match c.budget {
        Some(f) => format!("work budget {f} (floor({f} x {}) computed steps)", c.steps),
        None => format!("ε {}, K {}", c.epsilon, c.max_skip),
    }
}

/// One method: a name and how it configures a request.
struct Method {
    name: &'static str,
    what: &'static str,
    cfg: fn(&RequestConfig) -> RequestConfig,
}

fn methods() -> Vec<Method> {
    vec![
        Method {
            name: "full",
            what: "full computation (reference)",
            cfg: |b| RequestConfig {
                mode: Mode::Full,
                ..b.clone()
            },
        },
        Method {
            name: "flashdiff",
            what: "FlashDiff: saliency patches, gate, a step's active patches in one forward",
            cfg: |b| b.clone(),
        },
        Method {
            name: "flashdiff-per-patch",
            what: "ablation: every patch its own monotask, displaced K/V between patches",
            cfg: |b| RequestConfig {
                monotasks: Some(u32::MAX),
                ..b.clone()
            },
        },
        Method {
            name: "flashdiff-no-gate",
            what: "ablation: saliency patches, no skipping",
            cfg: |b| RequestConfig {
                mode: Mode::NoSkip,
                ..b.clone()
            },
        },
        Method {
            name: "flashdiff-stale",
            what: "ablation: K/V and skipped velocities reused as last computed (the paper's rule)",
            cfg: |b| RequestConfig {
                reuse: Reuse::Stale,
                ..b.clone()
            },
        },
        Method {
            name: "flashdiff-uniform",
            what: "ablation: uniform patches, gate",
            cfg: |b| RequestConfig {
                layout: LayoutKind::Uniform,
                ..b.clone()
            },
        },
        Method {
            name: "distrifusion",
            what: "uniform patches, displaced K/V, no skipping",
            cfg: |b| RequestConfig {
                mode: Mode::NoSkip,
                layout: LayoutKind::Uniform,
                reuse: Reuse::Stale,
                monotasks: Some(u32::MAX),
                ..b.clone()
            },
        },
        Method {
            name: "naive-patch",
            what: "uniform patches denoised independently",
            cfg: |b| RequestConfig {
                mode: Mode::NaivePatch,
                ..b.clone()
            },
        },
        Method {
            name: "ras",
            what: "region skipping by velocity change, dense resets (RAS-style)",
            cfg: |b| RequestConfig {
                mode: Mode::Ras,
                ..b.clone()
            },
        },
        Method {
            name: "teacache",
            what: "whole-step caching on block 0's input change",
            cfg: |b| RequestConfig {
                mode: Mode::TeaCache,
                // The threshold alone, as TeaCache's authors run it.
                max_skip: b.steps,
                ..b.clone()
            },
        },
    ]
}

/// A target's verdict as the report prints it.
pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Share of the reference's model FLOPs (`steps` full steps) that a run did: the
/// report's FLOPs ([`flashdiff_runtime::engine::FlopsCount`]: warm-up steps in full, each
/// later step's computed tokens and fixed rows, every step's conditioning, the signal a
/// method reads, DBCache's first blocks) over full computation's; a run of fewer steps
/// is measured against the reference's steps.
pub(crate) fn work(o: &Output, steps: u32) -> f64 {
    o.report.flops.fraction() * o.report.steps as f64 / steps as f64
}

struct Row {
    method: String,
    prompt: usize,
    latency_ms: f64,
    work: f64,
    /// Share of patch-steps after the warm-up that were skipped (0 without patches).
    skipped: f64,
    psnr: f64,
    ssim: f64,
    all_correct: bool,
    agrees_with_full: bool,
}

/// The wall-time study alone (`flashdiff bench --only wall-time`): writes `report.md` into
/// `out` and returns it.
pub fn wall_time(
    engine: &Engine,
    cfg: &BenchConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let md = format!(
        "# FlashDiff bench: wall time\n{}",
        wall_time::section(engine, cfg, progress)?
    );
    std::fs::create_dir_all(out)
        .and_then(|()| std::fs::write(out.join("report.md"), &md))
        .with_context(|| format!("cannot write {}", out.display()))?;
    Ok(md)
}

/// Runs the benchmark, writes `bench.json` and `report.md` into `out`, returns the report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let base = prepare(cfg, out)?;
    let ms_list = methods();
    let rows = per_prompt_rows(engine, cfg, &base, &ms_list, progress)?;
    let (summary, mut md) = summary_table(engine, cfg, &base, &ms_list, &rows);
    let get = |name: &str, key: &str| {
        summary
            .iter()
            .find(|a| a["method"] == name)
            .and_then(|a| a[key].as_f64())
            .unwrap_or(f64::NAN)
    };
    md.push_str(&default_targets(&get));
    let scale = scale_section(cfg, &base, &get, &mut md);
    let distrifusion = ms_list
        .iter()
        .find(|m| m.name == "distrifusion")
        .map(|m| (m.cfg)(&base))
        .expect("distrifusion is in methods()");
    let quality = |m: &str| get(m, "psnr_db");
    let serving = serving::study(
        engine,
        cfg,
        &base,
        &distrifusion,
        &quality,
        &mut md,
        progress,
    )?;
    let ordering = ordering::ordering(engine, cfg, &base, &mut md, progress)?;
    md.push_str(&wall_time::section(engine, cfg, progress)?);
    progress("final-step profile");
    let jump = final_step_profile(engine, cfg.seed, cfg.prompts.min(8), cfg.steps)?;
    md.push_str(&jump.0);
    let (sweeps, full_ms) = sweeps(engine, cfg, &base, &mut md, progress)?;
    md.push_str(&operating_points(&sweeps, full_ms));
    plots(out, &summary, &sweeps, &serving, &scale).map_err(|e| anyhow!("plotting: {e}"))?;
    md.push_str("\nPlots: `quality_vs_work.svg`, `completion_cdf.svg`, `scale.svg`.\n");
    let per_run: Vec<Value> = rows
        .iter()
        .map(|r| json!({"method": r.method, "prompt": r.prompt, "latency_ms": r.latency_ms, "work": r.work, "patch_steps_skipped": r.skipped, "psnr_db": if r.psnr.is_finite() { r.psnr } else { 99.0 }, "ssim": r.ssim, "all_correct": r.all_correct, "agrees_with_full": r.agrees_with_full}))
        .collect();
    let doc = json!({"config": {"prompts": cfg.prompts, "seed": cfg.seed, "steps": cfg.steps, "patches": cfg.patches, "epsilon": base.epsilon, "max_skip": base.max_skip, "reuse": base.reuse.name(), "monotasks": base.monotasks, "workers": engine.workers()}, "summary": summary, "runs": per_run, "scale_simulated": scale, "serving": serving, "ordering": ordering, "sweeps": sweeps, "final_step": jump.1});
    write_outputs(out, &doc, &md)?;
    Ok(md)
}

/// Creates `out`; returns FlashDiff's request settings (the base with the bench's steps and
/// patches).
pub(crate) fn prepare(cfg: &BenchConfig, out: &Path) -> anyhow::Result<RequestConfig> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    Ok(RequestConfig {
        steps: cfg.steps,
        patches: Some(cfg.patches),
        ..cfg.base.clone()
    })
}

/// Writes `bench.json` (`doc`) and `report.md` (`md`) into `out`.
pub(crate) fn write_outputs(out: &Path, doc: &Value, md: &str) -> anyhow::Result<()> {
    let write = |name: &str, body: &str| {
        std::fs::write(out.join(name), body)
            .with_context(|| format!("cannot write {}", out.join(name).display()))
    };
    write(
        "bench.json",
        &serde_json::to_string_pretty(doc).unwrap_or_default(),
    )?;
    write("report.md", md)
}

/// The targets at the default settings, judged from the summary table.
fn default_targets(get: &dyn Fn(&str, &str) -> f64) -> String {
    let fd_skipped = 1.0 - get("flashdiff", "work");
    let targets = [
        (
            "work skipped at PSNR >= 30 dB",
            format!(
                "{:.0}% skipped at {:.1} dB",
                100.0 * fd_skipped,
                get("flashdiff", "psnr_db")
            ),
            fd_skipped >= 0.5 && get("flashdiff", "psnr_db") >= 30.0,
            ">= 50%",
        ),
        (
            "PSNR vs fewer uniform steps at equal compute",
            format!(
                "{:+.2} dB",
                get("flashdiff", "psnr_db") - get("fewer-steps", "psnr_db")
            ),
            get("flashdiff", "psnr_db") - get("fewer-steps", "psnr_db") >= 2.0,
            ">= +2 dB",
        ),
        (
            "single-request speed-up vs full",
            format!(
                "{:.2}x",
                get("full", "latency_ms") / get("flashdiff", "latency_ms")
            ),
            get("full", "latency_ms") / get("flashdiff", "latency_ms") >= 1.8,
            ">= 1.8x",
        ),
    ];
    let mut md = String::from("\n## Targets at the default settings\n\n| target | measured | wanted | verdict |\n| --- | --- | --- | --- |\n");
    for (t, m, ok, want) in &targets {
        md.push_str(&format!("| {t} | {m} | {want} | {} |\n", verdict(*ok)));
    }
    md
}

/// The settings the sweeps try: FlashDiff's knobs one at a time, and the other ways to
/// save work at several strengths.
fn sweep_variants(
    cfg: &BenchConfig,
    base: &RequestConfig,
) -> Vec<(&'static str, String, RequestConfig)> {
    let with = |knob: &'static str, value: String, c: RequestConfig| (knob, value, c);
    let mut v = Vec::new();
    for e in [0.02f32, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0] {
        v.push(with(
            "epsilon",
            format!("{e}"),
            RequestConfig {
                epsilon: e,
                ..base.clone()
            },
        ));
    }
    for r in [4u32, 8, 16] {
        v.push(with(
            "patches",
            format!("{r}"),
            RequestConfig {
                patches: Some(r),
                ..base.clone()
            },
        ));
    }
    for w in [2u32, 5, 10] {
        let c = RequestConfig {
            warmup: w.min(cfg.steps - 1),
            ..base.clone()
        };
        v.push(with("warmup", format!("{w}"), c));
    }
    for t in [0.05f32, 0.1, 0.2, 0.4] {
        let c = RequestConfig {
            mode: Mode::TeaCache,
            cache_threshold: t,
            max_skip: base.steps,
            ..base.clone()
        };
        v.push(with("teacache", format!("{t}"), c));
    }
    for q in [0.25f32, 0.5, 0.75] {
        let c = RequestConfig {
            mode: Mode::Ras,
            ras_ratio: q,
            ..base.clone()
        };
        v.push(with("ras", format!("{q}"), c));
    }
    for n in [10u32, 20, 30, 40] {
        let c = RequestConfig {
            mode: Mode::Full,
            steps: n,
            warmup: base.warmup.min(n - 1),
            ..base.clone()
        };
        v.push(with("fewer-steps", format!("{n}"), c));
    }
    v
}

/// Quality against work for every sweep setting, against full computation on the first
/// prompts; appends its table to `md`. Returns the rows and full computation's mean latency.
fn sweeps(
    engine: &mut Engine,
    cfg: &BenchConfig,
    base: &RequestConfig,
    md: &mut String,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<(Vec<Value>, f64)> {
    let sweep_prompts = cfg.prompts.min(if cfg.prompts <= 8 { 4 } else { 16 }) as u64;
    let variants = sweep_variants(cfg, base);
    progress(&format!(
        "sweeps: {} settings x {sweep_prompts} prompts",
        variants.len()
    ));
    let mut refs = Vec::new();
    let mut full_ms = 0.0;
    for i in 0..sweep_prompts {
        let scene = scene::sample(cfg.seed + i);
        let c = RequestConfig {
            mode: Mode::Full,
            seed: cfg.seed + i,
            ..base.clone()
        };
        let o = engine.generate(&scene::prompt_text(&scene), budget_for_mode(c), &mut |_| {})?;
        full_ms += o.report.latency.as_secs_f64() * 1e3 / sweep_prompts as f64;
        refs.push((scene.clone(), o.sample.rgb));
    }
    let mut sweeps: Vec<Value> = Vec::new();
    for (knob, value, c) in &variants {
        let (mut w, mut q, mut worst, mut ms) = (0.0, 0.0, f64::INFINITY, 0.0);
        for (i, (scene, full)) in refs.iter().enumerate() {
            let o = engine.generate(
                &scene::prompt_text(scene),
                budget_for_mode(RequestConfig {
                    seed: cfg.seed + i as u64,
                    ..c.clone()
                }),
                &mut |_| {},
            )?;
            w += work(&o, cfg.steps);
            let p = flashdiff_eval::metrics::psnr(&o.sample.rgb, full).min(99.0);
            q += p;
            worst = worst.min(p);
            ms += o.report.latency.as_secs_f64() * 1e3;
        }
        let n = refs.len() as f64;
        sweeps.push(json!({"knob": knob, "value": value, "work": w / n, "psnr_db": q / n, "worst_psnr_db": worst, "latency_ms": ms / n}));
    }
    md.push_str(&format!("\n## Sweeps: quality against work\n\nPSNR against full computation at the benchmark's steps, mean and worst over the first {sweep_prompts} prompts; work as above; latency mean per request (full computation: {full_ms:.0} ms). `epsilon`, `patches`, `warmup` vary one FlashDiff setting; `teacache` varies the caching threshold; `ras` the share of regions RAS-style recomputes; `fewer-steps` is full computation with fewer steps.\n\n| knob | value | work | PSNR dB | worst PSNR dB | latency ms |\n| --- | --- | --- | --- | --- | --- |\n"));
    for v in &sweeps {
        md.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.0} |\n",
            v["knob"].as_str().unwrap_or(""),
            v["value"].as_str().unwrap_or(""),
            v["work"].as_f64().unwrap_or(0.0),
            v["psnr_db"].as_f64().unwrap_or(0.0),
            v["worst_psnr_db"].as_f64().unwrap_or(0.0),
            v["latency_ms"].as_f64().unwrap_or(0.0)
        ));
    }
    Ok((sweeps, full_ms))
}

/// Every method (and fewer uniform steps at FlashDiff's measured work) on every held-out
/// prompt: one row each, measured against full computation from the same seed.
fn per_prompt_rows(
    engine: &mut Engine,
    cfg: &BenchConfig,
    base: &RequestConfig,
    ms_list: &[Method],
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    for i in 0..cfg.prompts as usize {
        let scene = scene::sample(cfg.seed + i as u64);
        let prompt = scene::prompt_text(&scene);
        let seed = cfg.seed + i as u64;
        progress(&format!("prompt {}/{}: {prompt}", i + 1, cfg.prompts));
        let mut results: Vec<(String, Output)> = Vec::new();
        for m in ms_list {
            let c = RequestConfig {
                seed,
                ..(m.cfg)(base)
            };
            let o = engine.generate(&prompt, budget_for_mode(c), &mut |_| {})?;
            results.push((m.name.to_string(), o));
        }
        // Fewer uniform steps at FlashDiff's measured compute.
        let fd_work = work(&results[1].1, cfg.steps);
        let steps = ((cfg.steps as f64 * fd_work).round() as u32).max(2);
        let c = RequestConfig {
            seed,
            steps,
            warmup: base.warmup.min(steps - 1),
            mode: Mode::Full,
            ..base.clone()
        };
        results.push((
            "fewer-steps".to_string(),
            engine.generate(&prompt, budget_for_mode(c), &mut |_| {})?,
        ));
        let full_rgb = results[0].1.sample.rgb.clone();
        let full_v = flashdiff_eval::image::check(&full_rgb, &scene);
        for (name, o) in &results {
            let v = flashdiff_eval::image::check(&o.sample.rgb, &scene);
            rows.push(Row {
                method: name.clone(),
                prompt: i,
                latency_ms: ms(o.report.latency),
                work: work(o, cfg.steps),
                skipped: 1.0 - o.report.computed as f64 / o.report.patch_steps.max(1) as f64,
                psnr: flashdiff_eval::metrics::psnr(&o.sample.rgb, &full_rgb),
                ssim: flashdiff_eval::metrics::ssim(&o.sample.rgb, &full_rgb, IMAGE, IMAGE),
                all_correct: v.all(),
                agrees_with_full: v == full_v,
            });
        }
    }
    Ok(rows)
}

/// Per-method means (JSON) and the report's opening table (markdown).
fn summary_table(
    engine: &Engine,
    cfg: &BenchConfig,
    base: &RequestConfig,
    ms_list: &[Method],
    rows: &[Row],
) -> (Vec<Value>, String) {
    let mut names: Vec<String> = ms_list.iter().map(|m| m.name.to_string()).collect();
    names.push("fewer-steps".into());
    let mut summary = Vec::new();
    let mut md = format!(
        "# flashdiff bench\n\nThe paper's targets at FlashDiff's default settings, each method at one setting on the prompts reported. Nothing here is a verdict between methods: those come from the verdict protocol (settings chosen on validation prompts, judged on test prompts, paired intervals), `flashdiff bench --study curve`, `crossover` and `serving`.\n\n{} held-out prompts (seeds {}..{}), {} steps, {} patches, FlashDiff at {}, {} reuse, {} monotask(s) per step; one request at a time, {} worker(s).\nPSNR/SSIM against full computation from the same seed (identical: PSNR = inf, shown as 99). Work: share of the full model compute actually done (warm-up included).\n\n| method | what | latency ms | work | patch-steps skipped | PSNR dB | worst PSNR dB | SSIM | checker all-correct | agrees with full |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        cfg.prompts,
        cfg.seed,
        cfg.seed + cfg.prompts as u64,
        cfg.steps,
        cfg.patches,
        knob(base),
        base.reuse.name(),
        match base.monotasks {
            None => engine.workers().to_string(),
            Some(m) if m >= cfg.patches => "per-patch".to_string(),
            Some(m) => m.to_string(),
        },
        engine.workers()
    );
    for name in &names {
        let rs: Vec<&Row> = rows.iter().filter(|r| &r.method == name).collect();
        let n = rs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Row) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
        let psnr = mean(&|r| r.psnr.min(99.0));
        let agg = json!({
            "method": name,
            "latency_ms": mean(&|r| r.latency_ms),
            "work": mean(&|r| r.work),
            "patch_steps_skipped": mean(&|r| r.skipped),
            "psnr_db": psnr,
            "worst_psnr_db": rs.iter().map(|r| r.psnr.min(99.0)).fold(f64::INFINITY, f64::min),
            "ssim": mean(&|r| r.ssim),
            "all_correct": mean(&|r| r.all_correct as u8 as f64),
            "agrees_with_full": mean(&|r| r.agrees_with_full as u8 as f64),
        });
        let what = ms_list.iter().find(|m| m.name == name).map_or(
            "full computation with fewer steps, at FlashDiff's compute",
            |m| m.what,
        );
        md.push_str(&format!(
            "| {name} | {what} | {:.0} | {:.2} | {:.0}% | {:.2} | {:.2} | {:.4} | {:.0}% | {:.0}% |\n",
            agg["latency_ms"].as_f64().unwrap_or(0.0),
            agg["work"].as_f64().unwrap_or(0.0),
            100.0 * agg["patch_steps_skipped"].as_f64().unwrap_or(0.0),
            psnr,
            agg["worst_psnr_db"].as_f64().unwrap_or(0.0),
            agg["ssim"].as_f64().unwrap_or(0.0),
            100.0 * agg["all_correct"].as_f64().unwrap_or(0.0),
            100.0 * agg["agrees_with_full"].as_f64().unwrap_or(0.0),
        ));
        summary.push(agg);
    }
    (summary, md)
}

/// Whether the final step's update jumps (the reason for [`flashdiff_runtime::engine::FINAL_FULL_STEPS`]):
/// full computation of `prompts` held-out prompts, recording each token's relative velocity
/// change `|v_n - v_{n-1}| / |v_{n-1}|` at every step. Reports the mean over tokens per step
/// for the last steps, the final step's mean over the median of the steps before it, and the
/// share of tokens whose final change is over 3x their own median change.
fn final_step_profile(
    engine: &Engine,
    seed: u64,
    prompts: u32,
    steps: u32,
) -> anyhow::Result<(String, Value)> {
    let model = engine.model();
    let dims = model.dims().clone();
    let (tokens, pd) = (dims.grid.tokens(), dims.channels);
    // change[n][token], summed over prompts; per-token jump counts.
    let mut mean_change = vec![0.0f64; steps as usize];
    let (mut jumped, mut counted) = (0usize, 0usize);
    for i in 0..prompts as u64 {
        let scene = scene::sample(seed + i);
        let c = model.condition(&scene::prompt_text(&scene))?;
        let context = Tensor::from_slice(&c.context, c.context.len(), model.device())
            .map_err(ModelError::from)?;
        let mut x = flashdiff_runtime::engine::noise(seed + i, tokens * pd);
        let mut prev: Option<Vec<f32>> = None;
        let mut per_token: Vec<Vec<f64>> = vec![Vec::new(); tokens];
        for n in 0..steps {
            let out = euler_full_step(model, &mut x, &context, n, steps, false)?;
            let velocity = out
                .velocity
                .flatten_all()
                .and_then(|v| v.to_vec1::<f32>())
                .map_err(ModelError::from)?;
            if let Some(p) = &prev {
                for (t, changes) in per_token.iter_mut().enumerate() {
                    let r = t * pd..(t + 1) * pd;
                    let num: f64 = velocity[r.clone()]
                        .iter()
                        .zip(&p[r.clone()])
                        .map(|(a, b)| ((a - b) as f64).powi(2))
                        .sum::<f64>()
                        .sqrt();
                    let den: f64 = p[r].iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
                    let c = num / den.max(1e-12);
                    changes.push(c);
                    mean_change[n as usize] += c / (tokens as f64 * prompts as f64);
                }
            }
            prev = Some(velocity);
        }
        for changes in &per_token {
            if let Some((last, before)) = changes.split_last() {
                let mut b = before.to_vec();
                b.sort_by(f64::total_cmp);
                if !b.is_empty() {
                    counted += 1;
                    jumped += (*last > 3.0 * b[b.len() / 2]) as usize;
                }
            }
        }
    }
    let mut before: Vec<f64> = mean_change[1..mean_change.len().saturating_sub(1)].to_vec();
    before.sort_by(f64::total_cmp);
    let median = before.get(before.len() / 2).copied().unwrap_or(f64::NAN);
    let last = mean_change.last().copied().unwrap_or(f64::NAN);
    let ratio = last / median;
    let share = jumped as f64 / counted.max(1) as f64;
    let mut md = format!(
        "\n## The final step\n\nFull computation of {prompts} held-out prompts, {steps} steps: relative velocity change per token and step, mean over tokens (step 1 is the first with a previous velocity).\n\n| step | mean relative change |\n| --- | --- |\n"
    );
    let first_shown = (steps as usize).saturating_sub(6).max(1);
    for (n, c) in mean_change.iter().enumerate().skip(first_shown) {
        md.push_str(&format!("| {n} | {c:.4} |\n"));
    }
    md.push_str(&format!(
        "\nFinal step: {ratio:.1}x the median step's change; {:.0}% of tokens change over 3x their own median. {}\n",
        100.0 * share,
        if ratio > 2.0 {
            "The jump holds, so the engine computes the final step with every patch active (FINAL_FULL_STEPS = 1)."
        } else {
            "No jump on this model: FINAL_FULL_STEPS = 1 costs one step of skipping and could be 0."
        }
    ));
    let json =
        json!({"mean_change": mean_change, "final_over_median": ratio, "tokens_jumping": share});
    Ok((md, json))
}

/// The sweep targets: FlashDiff's best epsilon that keeps 30 dB,
/// and FlashDiff's curve against the fewer-steps and whole-step caching curves at equal
/// work (linear interpolation between their sweep points; no extrapolation), judged by the
/// worst margin over every epsilon where the curves overlap.
fn operating_points(sweeps: &[Value], full_ms: f64) -> String {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let curve = |knob: &str| -> Vec<(f64, f64)> {
        let mut c: Vec<(f64, f64)> = sweeps
            .iter()
            .filter(|v| v["knob"] == knob)
            .map(|v| (f(v, "work"), f(v, "psnr_db")))
            .collect();
        c.sort_by(|a, b| a.0.total_cmp(&b.0));
        c
    };
    let at = |c: &[(f64, f64)], w: f64| -> Option<f64> {
        c.windows(2).find(|p| p[0].0 <= w && w <= p[1].0).map(|p| {
            let span = (p[1].0 - p[0].0).max(1e-12);
            p[0].1 + (p[1].1 - p[0].1) * (w - p[0].0) / span
        })
    };
    let eps: Vec<&Value> = sweeps.iter().filter(|v| v["knob"] == "epsilon").collect();
    let mut md = String::from("\n## Operating points along the sweeps\n\nWork skipped counts the warm-up as full work, so it is below the share of patch-steps skipped.\n\n| target | measured | wanted | verdict |\n| --- | --- | --- | --- |\n");
    // 30 dB on every prompt of the sweep, not only on average.
    match eps
        .iter()
        .filter(|v| f(v, "psnr_db") >= 30.0 && f(v, "worst_psnr_db") >= 30.0)
        .max_by(|a, b| f(b, "work").total_cmp(&f(a, "work")))
    {
        Some(best) => {
            let skipped = 1.0 - f(best, "work");
            let speed = full_ms / f(best, "latency_ms");
            md.push_str(&format!(
                "| work skipped at PSNR >= 30 dB on every prompt (best epsilon) | {:.0}% at epsilon {} ({:.1} dB mean, {:.1} dB worst) | >= 50% | {} |\n",
                100.0 * skipped,
                best["value"].as_str().unwrap_or("?"),
                f(best, "psnr_db"),
                f(best, "worst_psnr_db"),
                verdict(skipped >= 0.5)
            ));
            md.push_str(&format!(
                "| single-request speed-up vs full at that point | {speed:.2}x | >= 1.8x | {} |\n",
                verdict(speed >= 1.8)
            ));
        }
        None => md.push_str(
            "| work skipped at PSNR >= 30 dB on every prompt | no epsilon keeps 30 dB | >= 50% | **missed** |\n",
        ),
    }
    for (knob, label, want) in [
        (
            "fewer-steps",
            "PSNR vs fewer uniform steps at equal work",
            2.0,
        ),
        ("teacache", "PSNR vs whole-step caching at equal work", 0.0),
        (
            "ras",
            "PSNR vs RAS-style region skipping at equal work",
            0.0,
        ),
    ] {
        let c = curve(knob);
        let margins: Vec<(String, f64)> = eps
            .iter()
            .filter_map(|v| {
                at(&c, f(v, "work")).map(|p| {
                    (
                        v["value"].as_str().unwrap_or("?").to_string(),
                        f(v, "psnr_db") - p,
                    )
                })
            })
            .collect();
        // The verdict holds along the curve only if it holds at every epsilon where the two
        // curves overlap in work: the worst margin decides.
        let outside: Vec<&str> = eps
            .iter()
            .filter(|v| at(&c, f(v, "work")).is_none())
            .map(|v| v["value"].as_str().unwrap_or("?"))
            .collect();
        match margins.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            Some((e, m)) => md.push_str(&format!(
                "| {label}, at every epsilon where the curves overlap | worst {m:+.2} dB (epsilon {e}); all: {}{} | >= {want:+.0} dB | {} |\n",
                margins
                    .iter()
                    .map(|(e, m)| format!("{e}: {m:+.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if outside.is_empty() {
                    String::new()
                } else {
                    format!("; not compared (outside its work range): {}", outside.join(", "))
                },
                verdict(*m >= want)
            )),
            None => md.push_str(&format!(
                "| {label} | the curves do not overlap in work | >= {want:+.0} dB | **missed** |\n"
            )),
        }
    }
    md
}

pub(crate) fn colours() -> [plotters::style::RGBColor; 12] {
    use plotters::style::colors::*;
    use plotters::style::RGBColor;
    [
        RED,
        BLUE,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(200, 120, 0),
        RGBColor(120, 120, 120),
        RGBColor(128, 0, 128),
        RGBColor(0, 128, 128),
        RGBColor(128, 128, 0),
        RGBColor(255, 105, 180),
    ]
}
