//! `flashdiff bench`: the evaluation against every baseline (flashdiff-studies).

use flashdiff_runtime::engine::RequestConfig;
use flashdiff_runtime::models::Kind;

use crate::args::{is_pipeline, BenchArgs};
use crate::generate::with_model_warmup;
use crate::setup::{cores, make_engine, weights_path};

/// `flashdiff bench`.
pub(crate) fn bench(a: BenchArgs) -> Result<(), String> {
    let base = a.knobs.request(a.steps, None, 0);
    let cfg = flashdiff_studies::BenchConfig {
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
    if a.reread {
        if a.study.as_deref() == Some("curve") {
            println!("{}", flashdiff_studies::curve::reread(&out)?);
            println!(
                "rewrote {}/report.md and quality_vs_work.svg and .png",
                out.display()
            );
            return Ok(());
        }
        if a.study.as_deref() == Some("serving") {
            println!("{}", flashdiff_studies::serving_protocol::reread(&out)?);
            println!("rewrote {}/report.md", out.display());
            return Ok(());
        }
        let table = flashdiff_studies::crossover::reread(&out)?;
        println!("{table}");
        println!(
            "rewrote the reports, pictures and {}/crossover.md",
            out.display()
        );
        return Ok(());
    }
    if is_pipeline(&a.run.model) {
        return Err(format!(
            "bench --model {}: the bench's prompts, checkers and baselines are the built-in \
             models'; time a pipeline with generate --compare",
            a.run.model
        ));
    }
    let mut engine = make_engine(&a.run, cores())?;
    let cfg = flashdiff_studies::BenchConfig {
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
            let cfg = flashdiff_studies::BenchConfig { prompts, ..cfg };
            if a.study.as_deref() != Some("curve") && !a.methods.is_empty() {
                return Err(format!(
                    "--methods: the {} study runs all its methods",
                    a.study.as_deref().unwrap_or_default()
                ));
            }
            if a.study.as_deref() == Some("serving") {
                flashdiff_studies::serving_protocol::run(
                    &mut engine,
                    &cfg,
                    a.validation,
                    &out,
                    &mut progress,
                )
            } else if a.study.as_deref() == Some("crossover") {
                flashdiff_studies::crossover::run(
                    &mut engine,
                    &cfg,
                    a.validation,
                    &out,
                    &mut progress,
                )
            } else {
                let only = (!a.methods.is_empty()).then_some(&a.methods[..]);
                flashdiff_studies::curve::run(
                    &mut engine,
                    &cfg,
                    only,
                    a.validation,
                    &out,
                    &mut progress,
                )
            }
        }
        Kind::Image if a.only.is_some() => {
            flashdiff_studies::wall_time(&engine, &cfg, &out, &mut progress)
        }
        _ if a.only.is_some() => {
            return Err("--only wall-time: the wall-time study runs on image models only".into())
        }
        Kind::Image => flashdiff_studies::run(&mut engine, &cfg, &out, &mut progress),
        _ => flashdiff_studies::media::run(&mut engine, &cfg, &out, &mut progress),
    }
    .map_err(|e| format!("{e:#}"))?;
    println!("{report}");
    let wrote = if a.study.as_deref() == Some("crossover") {
        format!(
            "{}/{}/ (crossover.json, report.md, quality_vs_work.svg and .png) and {}/crossover.md",
            out.display(),
            engine.model().name(),
            out.display()
        )
    } else if a.study.as_deref() == Some("serving") {
        format!(
            "{}/serving.json and {}/report.md",
            out.display(),
            out.display()
        )
    } else if a.study.is_some() {
        format!(
            "{}/curve.json, {}/report.md and {}/quality_vs_work.svg and .png",
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
