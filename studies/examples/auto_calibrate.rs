//! Calibrates the threshold of the automatic choice (`--mode auto`, `AUTO_DISPERSION`) on
//! validation prompts: for each prompt, the dispersion its request measured after the warm-up
//! and its PSNR against full computation run regionally (per-patch) and in whole steps (the
//! default rule) at the same ε, K and forecast order; then, per setting and over all, the
//! threshold whose choice would have given the highest mean PSNR.
//!
//! `cargo run --release -p flashdiff-studies --example auto_calibrate -- MODEL [PROMPTS]`
//! (seeds from 10000: the studies' validation seeds, never their test seeds).

use flashdiff_models::families::tinydit::scene;
use flashdiff_runtime::engine::{builtin_weights, Engine, Mode, RequestConfig, Reuse};

/// The regional and whole-step settings the studies choose at work 0.25-0.5.
const SETTINGS: [(f32, u32); 3] = [(0.1, 2), (0.2, 4), (0.4, 8)];

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(model) = args.next() else {
        eprintln!("usage: auto_calibrate MODEL [PROMPTS]");
        std::process::exit(2);
    };
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let Some(weights) = builtin_weights(&model) else {
        eprintln!("auto_calibrate: {model:?} is not a built-in model");
        std::process::exit(2);
    };
    let mut e = Engine::new(&weights, 2).unwrap_or_else(|err| {
        eprintln!("auto_calibrate: {err}");
        std::process::exit(1);
    });
    let side = e.model().image_size().map_or(scene::IMAGE, |(w, _)| w);
    // (setting, dispersion, regional dB, whole-step dB) per prompt.
    let mut rows: Vec<(usize, f64, f64, f64)> = Vec::new();
    for seed in 10_000..10_000 + n {
        let prompt = scene::prompt_text(&scene::sample_sized(side, seed));
        let base = RequestConfig {
            seed,
            patches: Some(16),
            reuse: Reuse::Extrapolate2,
            ..RequestConfig::default()
        };
        let run = |e: &mut Engine, c: RequestConfig| {
            e.generate(&prompt, c, &mut |_| {}).unwrap_or_else(|err| {
                eprintln!("auto_calibrate: seed {seed}: {err}");
                std::process::exit(1);
            })
        };
        let full = run(
            &mut e,
            RequestConfig {
                mode: Mode::Full,
                ..base.clone()
            },
        );
        for (i, &(eps, k)) in SETTINGS.iter().enumerate() {
            let at = |mode| RequestConfig {
                mode,
                epsilon: eps,
                max_skip: k,
                ..base.clone()
            };
            let auto = run(&mut e, at(Mode::Auto));
            let d = auto.report.choice.map_or(f64::NAN, |c| c.dispersion as f64);
            let db = |o: &flashdiff_runtime::engine::Output| {
                flashdiff_eval::metrics::psnr(&o.sample.rgb, &full.sample.rgb).min(99.0)
            };
            let regional = db(&run(&mut e, at(Mode::PerPatch)));
            let whole = db(&run(&mut e, at(Mode::FlashDiff)));
            println!(
                "seed {seed} ε {eps} K {k}: dispersion {d:.4}, regional {regional:.2} dB, whole-step {whole:.2} dB"
            );
            rows.push((i, d, regional, whole));
        }
    }
    let best = |rows: &[&(usize, f64, f64, f64)]| -> (f64, f64, f64, f64) {
        // Candidate thresholds: each measured dispersion, and one above them all.
        let mut bars: Vec<f64> = rows.iter().map(|r| r.1).collect();
        bars.push(f64::INFINITY);
        let mean = |bar: f64| {
            rows.iter()
                .map(|r| if r.1 >= bar { r.2 } else { r.3 })
                .sum::<f64>()
                / rows.len() as f64
        };
        let whole = mean(f64::INFINITY);
        let regional = mean(f64::NEG_INFINITY);
        let (bar, m) = bars
            .iter()
            .map(|&b| (b, mean(b)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(a.0.total_cmp(&b.0)))
            .expect("at least the bar above all");
        (bar, m, regional, whole)
    };
    for (i, &(eps, k)) in SETTINGS.iter().enumerate() {
        let of: Vec<&(usize, f64, f64, f64)> = rows.iter().filter(|r| r.0 == i).collect();
        let (bar, m, r, w) = best(&of);
        println!("ε {eps} K {k}: best threshold {bar:.4} (mean {m:.2} dB; all regional {r:.2}, all whole-step {w:.2})");
    }
    let all: Vec<&(usize, f64, f64, f64)> = rows.iter().collect();
    let (bar, m, r, w) = best(&all);
    println!("all settings: best threshold {bar:.4} (mean {m:.2} dB; all regional {r:.2}, all whole-step {w:.2})");
}
