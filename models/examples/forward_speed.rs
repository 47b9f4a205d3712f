//! Times the engine's FLUX, MMDiT (SD3) or Wan forward on a diffusers checkpoint and given inputs: the whole
//! forward as a diffusers call computes it (text projection, step conditioning, every block)
//! and token subsets of it (25/50/75% of the image rows against the full forward's cached
//! image and text keys and values), the median of `--reps` runs after one warm-up.
//!
//! ```text
//! cargo run --release -p flashdiff-models --example forward_speed -- \
//!     --weights DIR --inputs inputs.safetensors [--family flux|mmdit|wan] [--frames F] \
//!     [--axes 8,12,12] [--reps 7] [--out velocity.safetensors]
//! ```
//!
//! `inputs.safetensors` holds `x` (`tokens x token width`, a square grid, or Wan's `--frames`
//! square grids; the MMDiT's tokens are 2x2 latent patches in (row, column, channel) order,
//! Wan's 1x2x2 patches in (frame, row, column, channel) order), `txt` (`text tokens x context
//! width`), `pooled` (not read by Wan), and `t` and `g` (one value each; `g`, FLUX's
//! guidance, is read by FLUX only). The velocity of the
//! full forward is written to `--out` for a parity check. Threads: `RAYON_NUM_THREADS`.
//! `studies/speed_study.py` runs it beside diffusers on the same weights and inputs.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};
use flashdiff_models::families::flux::{Flux, FluxCheckpoint, JointOutput, Rows};
use flashdiff_models::families::mmdit::{Mmdit, MmditCheckpoint};
use flashdiff_models::families::wan::{Wan, WanCheckpoint};
use flashdiff_models::ModelError;

/// The two joint families this example times, behind one set of calls.
enum Model {
    Flux(Flux),
    Mmdit(Mmdit),
    /// With its frame count.
    Wan(Wan, usize),
}

impl Model {
    fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        match self {
            Model::Flux(m) => m.context(txt, pooled),
            Model::Mmdit(m) => m.context(txt, pooled),
            Model::Wan(m, _) => m.context(txt),
        }
    }
    fn step_cond(&self, ctx: &Tensor, t: f32, g: f32) -> Result<Tensor, ModelError> {
        match self {
            Model::Flux(m) => m.step_cond(ctx, t, g),
            Model::Mmdit(m) => m.step_cond(ctx, t),
            Model::Wan(m, _) => m.step_cond(t, ctx.device()),
        }
    }
    fn forward(
        &self,
        rows: Rows<'_>,
        ctx: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        match self {
            Model::Flux(m) => m.forward(rows, ctx, cond),
            Model::Mmdit(m) => m.forward(rows, ctx, cond),
            Model::Wan(m, frames) => m.forward(rows, *frames, ctx, cond),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run() -> Result<(), String> {
    let mut weights = None;
    let mut inputs = None;
    let mut axes = None;
    let mut reps = 7usize;
    let mut out = None;
    let mut family = "flux".to_string();
    let mut frames = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--weights" => weights = Some(PathBuf::from(value()?)),
            "--inputs" => inputs = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--family" => family = value()?,
            "--frames" => {
                frames = value()?.parse().map_err(|e| format!("--frames: {e}"))?;
                if frames == 0 {
                    return Err("--frames must be at least 1".into());
                }
            }
            "--reps" => {
                reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?;
                if reps == 0 {
                    return Err("--reps must be at least 1".into());
                }
            }
            "--axes" => {
                let v: Vec<usize> = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--axes: {e}"))?;
                axes = Some(
                    <[usize; 3]>::try_from(v)
                        .map_err(|_| "--axes takes three sizes".to_string())?,
                );
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let weights = weights.ok_or("--weights DIR is required")?;
    let inputs = inputs.ok_or("--inputs FILE is required")?;
    let dev = Device::Cpu;
    let m = match family.as_str() {
        "flux" => Model::Flux(
            FluxCheckpoint::open(&weights)
                .and_then(|ck| ck.load(axes, &dev))
                .map_err(|e| e.to_string())?,
        ),
        "mmdit" => Model::Mmdit(
            MmditCheckpoint::open(&weights)
                .and_then(|ck| ck.load(None, &dev))
                .map_err(|e| e.to_string())?,
        ),
        "wan" => Model::Wan(
            WanCheckpoint::open(&weights)
                .and_then(|ck| ck.load(None, &dev))
                .map_err(|e| e.to_string())?,
            frames,
        ),
        other => return Err(format!("--family {other}: expected flux, mmdit or wan")),
    };
    let t = candle_core::safetensors::load(&inputs, &dev).map_err(|e| e.to_string())?;
    let get = |n: &str| {
        t.get(n)
            .ok_or(format!("{}: no tensor {n}", inputs.display()))
    };
    let (x, txt, pooled) = (get("x")?, get("txt")?, get("pooled")?);
    let scalar = |n: &str| -> Result<f32, String> {
        get(n)?
            .flatten_all()
            .and_then(|v| v.to_vec1::<f32>())
            .map_err(|e| e.to_string())?
            .first()
            .copied()
            .ok_or(format!("{n} is empty"))
    };
    let (tv, gv) = (scalar("t")?, scalar("g")?);
    let tokens = x.dim(0).map_err(|e| e.to_string())?;
    let per_frame = tokens / frames;
    let width = (per_frame as f64).sqrt().round() as usize;
    if width * width * frames != tokens {
        return Err(format!(
            "{tokens} image tokens are not {frames} square grids"
        ));
    }
    let all: Vec<u32> = (0..tokens as u32).collect();
    let e = |e: flashdiff_models::ModelError| e.to_string();
    let full = |x: &Tensor| -> Result<_, String> {
        let ctx = m.context(txt, pooled).map_err(e)?;
        let cond = m.step_cond(&ctx, tv, gv).map_err(e)?;
        let rows = Rows {
            x,
            ids: &all,
            width,
            tokens,
            cache: None,
            patches: None,
            saliency: false,
            text_cache: None,
        };
        m.forward(rows, &ctx, &cond).map_err(e)
    };
    let first = full(x)?;
    if let Some(p) = &out {
        let v = first.velocity.clone();
        candle_core::safetensors::save(&[("velocity", v)].into_iter().collect(), p)
            .map_err(|e| e.to_string())?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let s = Instant::now();
        std::hint::black_box(full(x)?);
        times.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let full_ms = median(times);
    let ctx = m.context(txt, pooled).map_err(e)?;
    // (Wan attends to the text without joint K/V: it has none to cache.)
    let text_kv = first.text_kv.clone();
    if text_kv.is_none() && !matches!(m, Model::Wan(..)) {
        return Err("the full forward gave no text K/V".into());
    }
    let mut subsets = Vec::new();
    for pct in [25usize, 50, 75] {
        let n = (tokens * pct / 100).max(1);
        let ids: Vec<u32> = (0..n).map(|i| (i * tokens / n) as u32).collect();
        let at = Tensor::new(ids.as_slice(), &dev).map_err(|e| e.to_string())?;
        let xs = x.index_select(&at, 0).map_err(|e| e.to_string())?;
        let rows = Rows {
            x: &xs,
            ids: &ids,
            width,
            tokens,
            cache: Some((&first.k, &first.v)),
            patches: None,
            saliency: false,
            text_cache: text_kv.as_ref().map(|(k, v)| (k, v)),
        };
        let once = || -> Result<(), String> {
            let cond = m.step_cond(&ctx, tv, gv).map_err(e)?;
            std::hint::black_box(m.forward(rows, &ctx, &cond).map_err(e)?);
            Ok(())
        };
        once()?;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let s = Instant::now();
            once()?;
            times.push(s.elapsed().as_secs_f64() * 1e3);
        }
        subsets.push(format!("\"{pct}\": {:.3}", median(times)));
    }
    println!(
        "{{\"tokens\": {tokens}, \"threads\": {}, \"reps\": {reps}, \"full_ms\": {full_ms:.3}, \
         \"subset_ms\": {{{}}}}}",
        candle_core::utils::get_num_threads(),
        subsets.join(", ")
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("forward_speed: {e}");
        std::process::exit(2);
    }
}
