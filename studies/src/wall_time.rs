//! Whether skipped work turns into wall time: `generate`'s defaults against full computation,
//! side by side on the same prompts, in the engine and as whole `flashdiff generate`
//! processes (start-up, model load, PNG included).
//!
//! Efficiency = speed-up / (1 / work): 1.0 when the time saved is exactly the work saved.

use anyhow::{bail, Context};
use std::process::Command;
use std::time::Instant;

use flashdiff_models::families::tinydit::scene;
use flashdiff_runtime::engine::{Engine, Mode, RequestConfig, DEFAULT_PATCHES};

use crate::{verdict, work, BenchConfig};

/// `generate`'s defaults.
fn defaults(steps: u32) -> RequestConfig {
    RequestConfig {
        steps,
        patches: Some(DEFAULT_PATCHES),
        ..RequestConfig::default()
    }
}

/// The section of the report.
pub(crate) fn section(
    engine: &Engine,
    cfg: &BenchConfig,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let (prompts, reps) = match cfg.prompts {
        0..=2 => (1, 1),
        3..=8 => (4, 3),
        _ => (16, 5),
    };
    progress(&format!(
        "wall time: {prompts} prompts x {reps}, full and generate's defaults interleaved"
    ));
    let fd = defaults(cfg.steps);
    let full = RequestConfig {
        mode: Mode::Full,
        ..fd.clone()
    };
    // In the engine as `generate` runs it (one in-process worker, the bench's model): per
    // prompt, the best of `reps` alternating runs of each (the least disturbed by the
    // machine); work and quality from the FlashDiff run.
    let mut engine = Engine::builder_with(engine.shared_model())
        .workers(1)
        .build()?;
    let (mut t_full, mut t_fd, mut w, mut q, mut worst) = (0.0, 0.0, 0.0, 0.0, f64::INFINITY);
    for i in 0..prompts {
        let seed = cfg.seed + 5000 + i as u64;
        let prompt = scene::prompt_text(&scene::sample(seed));
        let (mut bf, mut bd) = (f64::INFINITY, f64::INFINITY);
        let (mut of, mut od) = (None, None);
        for _ in 0..reps {
            let o = engine.generate(
                &prompt,
                RequestConfig {
                    seed,
                    ..full.clone()
                },
                &mut |_| {},
            )?;
            bf = bf.min(o.report.latency.as_secs_f64());
            of = Some(o);
            let o = engine.generate(&prompt, RequestConfig { seed, ..fd.clone() }, &mut |_| {})?;
            bd = bd.min(o.report.latency.as_secs_f64());
            od = Some(o);
        }
        let (of, od) = (of.expect("reps >= 1"), od.expect("reps >= 1"));
        t_full += bf;
        t_fd += bd;
        w += work(&od, cfg.steps);
        let p = flashdiff_eval::metrics::psnr(&od.sample.rgb, &of.sample.rgb).min(99.0);
        q += p;
        worst = worst.min(p);
    }
    let n = prompts as f64;
    let (work_ratio, psnr) = (w / n, q / n);
    let speed = t_full / t_fd;
    let eff = speed * work_ratio;
    let mut md = format!(
        "\n## Wall time follows work\n\n`generate`'s defaults (R = {DEFAULT_PATCHES}, ε {}, K {}, one in-process worker) against full computation on {prompts} held-out prompts (seeds from {}), alternating, best of {reps} each. Efficiency = speed-up x work: 1.0 when the time saved is the work saved.\n\n| measure | full | FlashDiff | speed-up | work | efficiency | wanted | verdict |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n| in-engine latency (mean of per-prompt best) | {:.0} ms | {:.0} ms | {speed:.2}x | {work_ratio:.3} | {eff:.2} | >= 0.90 | {} |\n",
        fd.epsilon,
        fd.max_skip,
        cfg.seed + 5000,
        1e3 * t_full / n,
        1e3 * t_fd / n,
        verdict(eff >= 0.9),
    );
    md.push_str(&whole_processes(cfg, prompts, reps, work_ratio, progress)?);
    let skipped = 1.0 - work_ratio;
    md.push_str(&format!(
        "\n`generate`'s defaults on these prompts: {:.0}% of full computation's work skipped at {psnr:.1} dB mean PSNR against it (worst {worst:.1} dB): target >= 50% at >= 50 dB mean: {}.\n",
        100.0 * skipped,
        verdict(skipped >= 0.5 && psnr >= 50.0),
    ));
    Ok(md)
}

/// The table row of whole `flashdiff generate` processes (start-up, load, PNG included),
/// alternating full and FlashDiff, best of `reps` per prompt.
fn whole_processes(
    cfg: &BenchConfig,
    prompts: usize,
    reps: usize,
    work_ratio: f64,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<String> {
    let Some((exe, args)) = &cfg.exe else {
        return Ok("| whole process | not measured (no executable given) | | | | | >= 0.85 | not measured |\n".into());
    };
    let n = prompts as f64;

    progress("wall time: whole processes");
    let dir = std::env::temp_dir().join(format!("flashdiff-wall-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let run = |prompt: &str, seed: u64, mode: &str| -> anyhow::Result<f64> {
        let t0 = Instant::now();
        let st = Command::new(exe)
            .args([
                "generate",
                prompt,
                "--seed",
                &seed.to_string(),
                "--mode",
                mode,
            ])
            .args(["--steps", &cfg.steps.to_string()])
            .args(args)
            .arg("-o")
            .arg(dir.join("wall.png"))
            .output()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        if !st.status.success() {
            bail!(
                "{} generate failed: {}",
                exe.display(),
                String::from_utf8_lossy(&st.stderr)
            );
        }
        Ok(t0.elapsed().as_secs_f64())
    };
    let (mut pf, mut pd) = (0.0, 0.0);
    for i in 0..prompts {
        let seed = cfg.seed + 5000 + i as u64;
        let prompt = scene::prompt_text(&scene::sample(seed));
        let (mut bf, mut bd) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            bf = bf.min(run(&prompt, seed, "full")?);
            bd = bd.min(run(&prompt, seed, "flashdiff")?);
        }
        pf += bf;
        pd += bd;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let s = pf / pd;
    let e = s * work_ratio;
    Ok(format!(
        "| whole `flashdiff generate` process (mean of per-prompt best) | {:.0} ms | {:.0} ms | {s:.2}x | {work_ratio:.3} | {e:.2} | >= 0.85 | {} |\n",
        1e3 * pf / n,
        1e3 * pd / n,
        verdict(e >= 0.85),
    ))
}
