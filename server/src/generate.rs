//! `flashdiff generate`: one request, its file, its report and the comparison with full
//! computation.

use std::io::IsTerminal;
use std::path::PathBuf;

use flashdiff_eval::image::Verdict;
use flashdiff_runtime::engine::{Mode, Output, RequestConfig, StepEvent};
use flashdiff_runtime::media;
use flashdiff_runtime::models::{
    families::tinydit::clips, families::tinydit::scene, families::tinydit::sounds, Kind, Sample,
};

use crate::args::{is_pipeline, GenerateArgs};
use crate::setup::make_engine;

/// The built-in checker's verdict on a sample for its prompt, in words.
pub(crate) fn checker_note(prompt: &str, sample: &Sample, kind: Kind) -> String {
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
        Kind::Image => scene::parse(prompt).map(|s| {
            flashdiff_eval::image::check_sized(&sample.rgb, &s).map_or_else(
                || "not checked (the checker reads square images of 32x32 pixels or more)".into(),
                verdict_text,
            )
        }),
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

pub(crate) fn verdict_text(v: Verdict) -> String {
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

pub(crate) fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "WRONG"
    }
}

pub(crate) fn progress_bar() -> impl FnMut(&StepEvent) {
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

pub(crate) fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn describe(sample: &Sample, kind: Kind) -> String {
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
pub(crate) fn output_path(given: Option<PathBuf>, kind: Kind) -> Result<PathBuf, String> {
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
pub(crate) fn quality_vs(out: &Sample, full: &Sample, kind: Kind) -> Result<String, String> {
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
pub(crate) fn with_model_warmup(
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

pub(crate) fn generate(a: GenerateArgs) -> Result<(), String> {
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
    if let Some(p) = &a.patch_map {
        if kind != Kind::Image {
            return Err(format!(
                "--patch-map {}: a patch map is drawn over an image; this model does not make one",
                p.display()
            ));
        }
    }
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
    if let Some(p) = &a.patch_map {
        let g = engine.model().dims().grid;
        let png = media::patch_map(&out.sample, out.layout.patch_of(), (g.height, g.width))
            .map_err(|e| format!("--patch-map: {e}"))?;
        std::fs::write(p, png).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        println!(
            "wrote {} (the {} patches over the image)",
            p.display(),
            out.layout.patches()
        );
    }
    println!(
        "mode {:?}, {} steps ({} warm-up), {} patches, seed {}{}",
        cfg.mode,
        r.steps,
        r.warmup,
        r.patches,
        cfg.seed,
        match cfg.budget {
            Some(f) => format!(", work budget {f}"),
            None => String::new(),
        }
    );
    println!(
        "patch-steps computed {} of {} ({:.1}% skipped); model {} {:.3} of full computation's, \
         warm-up and signal included",
        r.computed,
        r.patch_steps,
        100.0 * r.skipped_share(),
        if r.flops.counted { "FLOPs" } else { "rows" },
        r.flops.fraction()
    );
    match r.choice {
        Some(c) => println!("execution: {}", c.explain()),
        None if cfg.mode == Mode::Auto => {
            println!("execution: whole-step (no step change after the warm-up to choose on)")
        }
        None => {}
    }
    let k = r.step_kinds();
    println!(
        "steps after the warm-up: {} whole (every patch computed), {} regional (some patches), {} forecast",
        k.whole, k.regional, k.forecast
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
            budget: None,
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
