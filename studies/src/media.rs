//! `flashdiff bench` for the video and sound models: every baseline a user could run instead
//! (full computation, fewer steps at FlashDiff's work, whole-step caching, RAS-style,
//! DistriFusion-style, NaivePatch) on held-out prompts, each measured against full
//! computation from the same seed: work, fidelity (video: PSNR over the clip, worst frame,
//! temporal consistency; sound: SNR and log-spectral distance), and the built-in checker.

use anyhow::bail;
use std::path::Path;

use serde_json::{json, Value};

use crate::{methods, ms, prepare, verdict, work, write_outputs, BenchConfig};
use flashdiff_models::families::tinydit::{clips, sounds};
use flashdiff_models::{Kind, Sample};
use flashdiff_runtime::engine::{Engine, Mode, Output, RequestConfig};

/// The baselines of the video and sound tables (besides fewer steps).
const METHODS: [&str; 6] = [
    "full",
    "flashdiff",
    "distrifusion",
    "naive-patch",
    "ras",
    "teacache",
];

struct Row {
    method: String,
    latency_ms: f64,
    work: f64,
    skipped: f64,
    /// Video: PSNR over the clip; sound: SNR (dB).
    fidelity: f64,
    /// Video: the worst frame's PSNR; sound: log-spectral distance (dB).
    second: f64,
    /// Video: PSNR of the frame differences; sound: unused.
    temporal: f64,
    all_correct: bool,
    agrees_with_full: bool,
    /// The prompt and seed, to name the worst one.
    prompt: String,
    seed: u64,
}

/// A held-out prompt of the model's language and its checker's verdict on a sample, as
/// (all correct, the parts).
pub(crate) type Checker = Box<dyn Fn(&Sample) -> (bool, Vec<bool>)>;

pub(crate) fn prompt_and_checker(kind: Kind, seed: u64) -> (String, Checker) {
    match kind {
        Kind::Video => {
            let c = clips::sample(seed);
            let p = clips::prompt_text(&c);
            (
                p,
                Box::new(move |s: &Sample| {
                    let v = flashdiff_eval::video::check(&s.rgb, &c);
                    (
                        v.all(),
                        vec![v.background, v.present, v.place, v.shape, v.motion],
                    )
                }),
            )
        }
        _ => {
            let e = sounds::sample(seed);
            let p = sounds::prompt_text(&e);
            (
                p,
                Box::new(move |s: &Sample| {
                    let v = flashdiff_eval::sound::check(&s.audio, &e);
                    (v.all(), vec![v.count, v.kinds, v.pitches])
                }),
            )
        }
    }
}

fn row(
    name: &str,
    (o, full): (&Output, &Output),
    kind: Kind,
    steps: u32,
    check: &Checker,
    (prompt, seed): (&str, u64),
) -> Row {
    let (fidelity, second, temporal) = match kind {
        Kind::Video => flashdiff_eval::metrics::video_quality(&o.sample, &full.sample)
            .map_or((f64::NAN, f64::NAN, f64::NAN), |q| {
                (q.clip_psnr, q.worst_frame_psnr, q.temporal_psnr)
            }),
        _ => flashdiff_eval::metrics::audio_quality(&o.sample, &full.sample)
            .map_or((f64::NAN, f64::NAN, f64::NAN), |q| (q.snr, q.lsd, f64::NAN)),
    };
    let (all, parts) = check(&o.sample);
    Row {
        method: name.to_string(),
        latency_ms: ms(o.report.latency),
        work: work(o, steps),
        skipped: 1.0 - o.report.computed as f64 / o.report.patch_steps.max(1) as f64,
        fidelity,
        second,
        temporal,
        all_correct: all,
        agrees_with_full: parts == check(&full.sample).1,
        prompt: prompt.to_string(),
        seed,
    }
}

/// Runs the video or sound bench on `engine`'s model, writes `bench.json` and `report.md`
/// into `out`, returns the report.
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let kind = engine.model().kind();
    if kind == Kind::Image {
        bail!("the media bench is for video and sound models; images have flashdiff_studies::run");
    }
    let base = prepare(cfg, out)?;
    let all = methods();
    let mut rows = Vec::new();
    for i in 0..cfg.prompts as u64 {
        let seed = cfg.seed + i;
        let (prompt, check) = prompt_and_checker(kind, seed);
        progress(&format!("prompt {}/{}: {prompt}", i + 1, cfg.prompts));
        let mut results: Vec<(String, Output)> = Vec::new();
        for name in METHODS {
            let m = all.iter().find(|m| m.name == name).expect("a known method");
            let c = RequestConfig {
                seed,
                ..(m.cfg)(&base)
            };
            let c = crate::budget_for_mode(c);
            results.push((name.to_string(), engine.generate(&prompt, c, &mut |_| {})?));
        }
        let steps = ((cfg.steps as f64 * work(&results[1].1, cfg.steps)).round() as u32).max(2);
        let c = RequestConfig {
            seed,
            steps,
            warmup: base.warmup.min(steps - 1),
            mode: Mode::Full,
            ..base.clone()
        };
        let fewer = engine.generate(&prompt, crate::budget_for_mode(c), &mut |_| {})?;
        results.push(("fewer-steps".to_string(), fewer));
        let full = &results[0].1;
        for (name, o) in &results {
            rows.push(row(
                name,
                (o, full),
                kind,
                cfg.steps,
                &check,
                (&prompt, seed),
            ));
        }
    }
    let (summary, md) = report(kind, cfg, &base, engine.model().name(), &rows);
    let doc = json!({
        "kind": kind.name(),
        "config": {"prompts": cfg.prompts, "seed": cfg.seed, "steps": cfg.steps, "patches": cfg.patches, "epsilon": base.epsilon, "max_skip": base.max_skip},
        "summary": summary,
        "rows": rows.iter().map(|r| json!({
            "seed": r.seed,
            "prompt": r.prompt,
            "method": r.method,
            "fidelity_db": r.fidelity,
            "skipped": r.skipped,
            "all_correct": r.all_correct,
        })).collect::<Vec<_>>(),
    });
    write_outputs(out, &doc, &md)?;
    Ok(md)
}

/// Per-method means and worst cases (JSON) and the markdown report with the target.
fn report(
    kind: Kind,
    cfg: &BenchConfig,
    base: &RequestConfig,
    model: &str,
    rows: &[Row],
) -> (Vec<Value>, String) {
    let video = kind == Kind::Video;
    let mut md = format!(
        "# flashdiff bench: {model} ({})\n\nEach method at one setting on the prompts reported; nothing here is a verdict between methods (those come from the verdict protocol: `flashdiff bench --study curve`).\n\n{} held-out prompts (seeds {}..{}), {} steps, {} patches, FlashDiff at {}; one request at a time.\nFidelity against full computation from the same seed (identical: shown as 99 dB). Work: share of the full model compute actually done (warm-up included).\n\n",
        kind.name(),
        cfg.prompts,
        cfg.seed,
        cfg.seed + cfg.prompts as u64,
        cfg.steps,
        cfg.patches,
        crate::knob(base),
    );
    md.push_str(if video {
        "| method | latency ms | work | patch-steps skipped | PSNR over the clip dB | worst clip dB | worst frame PSNR dB | temporal PSNR dB | checker all-correct | agrees with full |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    } else {
        "| method | latency ms | work | patch-steps skipped | SNR dB | worst SNR dB | log-spectral distance dB | checker all-correct | agrees with full |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    });
    let mut names: Vec<&str> = METHODS.to_vec();
    names.push("fewer-steps");
    let mut summary = Vec::new();
    for name in names {
        let rs: Vec<&Row> = rows.iter().filter(|r| r.method == name).collect();
        let n = rs.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Row) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
        let cap = |x: f64| if x.is_nan() { x } else { x.min(99.0) };
        let worst = rs
            .iter()
            .min_by(|a, b| cap(a.fidelity).total_cmp(&cap(b.fidelity)));
        let agg = json!({
            "method": name,
            "latency_ms": mean(&|r| r.latency_ms),
            "work": mean(&|r| r.work),
            "patch_steps_skipped": mean(&|r| r.skipped),
            "fidelity_db": mean(&|r| cap(r.fidelity)),
            "worst_fidelity_db": rs.iter().map(|r| cap(r.fidelity)).fold(f64::INFINITY, f64::min),
            "worst_prompt": worst.map(|r| r.prompt.clone()),
            "worst_seed": worst.map(|r| r.seed),
            "second": mean(&|r| cap(r.second)),
            "temporal_db": mean(&|r| cap(r.temporal)),
            "all_correct": mean(&|r| r.all_correct as u8 as f64),
            "agrees_with_full": mean(&|r| r.agrees_with_full as u8 as f64),
        });
        let f = |k: &str| agg[k].as_f64().unwrap_or(f64::NAN);
        md.push_str(&format!(
            "| {name} | {:.0} | {:.2} | {:.0}% | {:.2} | {:.2} | {:.2} |{} {:.0}% | {:.0}% |\n",
            f("latency_ms"),
            f("work"),
            100.0 * f("patch_steps_skipped"),
            f("fidelity_db"),
            f("worst_fidelity_db"),
            f("second"),
            if video {
                format!(" {:.2} |", f("temporal_db"))
            } else {
                String::new()
            },
            100.0 * f("all_correct"),
            100.0 * f("agrees_with_full"),
        ));
        summary.push(agg);
    }
    let fd = &summary[1];
    let (skipped, mean_db, worst_db) = (
        fd["patch_steps_skipped"].as_f64().unwrap_or(0.0),
        fd["fidelity_db"].as_f64().unwrap_or(f64::NAN),
        fd["worst_fidelity_db"].as_f64().unwrap_or(f64::NAN),
    );
    md.push_str(&format!(
        "\nTarget: FlashDiff skips >= 50% of patch-steps at >= 30 dB {} against full computation: {:.0}% skipped at {mean_db:.2} dB mean, worst prompt {worst_db:.2} dB ({:?}, seed {}): on the mean {}; on every prompt {}.\n",
        if video { "PSNR" } else { "SNR" },
        100.0 * skipped,
        fd["worst_prompt"].as_str().unwrap_or(""),
        fd["worst_seed"],
        verdict(skipped >= 0.5 && mean_db >= 30.0),
        verdict(skipped >= 0.5 && worst_db >= 30.0)
    ));
    (summary, md)
}
