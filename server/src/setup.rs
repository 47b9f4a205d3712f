//! The engine a command runs: its model (built-in or a pipeline folder), device and workers.

use std::path::PathBuf;

use flashdiff_runtime::engine::{builtin_weights, default_weights, Engine};
use flashdiff_runtime::models::pipelines::registry::ModelSpec;

use crate::args::{check_run_args, is_pipeline, RunArgs};

/// CPU cores available to this process (the default worker count of serve and bench).
pub(crate) fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(1024) as u32)
}

/// `--weights`, else the built-in `--model`'s (TinyDiT's honours `$FLASHDIFF_WEIGHTS`).
pub(crate) fn weights_path(o: &RunArgs) -> PathBuf {
    match &o.weights {
        Some(w) => w.clone(),
        None if o.model == "tinydit" => default_weights(),
        None => builtin_weights(&o.model).unwrap_or_else(default_weights),
    }
}

pub(crate) fn make_engine(o: &RunArgs, default_workers: u32) -> Result<Engine, String> {
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
        Engine::builder(&spec)
            .workers(workers)
            .processes(&exe, &flashdiff_runtime::engine::state_dir())
            .build()
    } else {
        Engine::builder(&spec)
            .workers(workers)
            .device(&device)
            .build()
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
pub(crate) fn model_spec(o: &RunArgs) -> Result<ModelSpec, String> {
    let weights = weights_path(o);
    if !is_pipeline(&o.model) {
        // `--weights` alone: the file or folder says which built-in family it is.
        let file = ModelSpec::file(&weights);
        return Ok(match o.model_given {
            true => ModelSpec {
                name: o.model.clone(),
                ..file
            },
            false => file,
        });
    }
    use flashdiff_runtime::models::pipelines;
    let opts = pipelines::PipelineOptions {
        size: o
            .size
            .or_else(|| pipelines::pipeline(&o.model).map(|p| p.size))
            .unwrap_or((1024, 1024)),
        guidance: o.guidance,
        dtype: pipelines::parse_dtype(o.dtype.as_deref().unwrap_or("f32"))
            .map_err(|e| format!("--dtype: {e}"))?,
        seconds: o.seconds,
        frames: o.frames,
    };
    Ok(ModelSpec::pipeline(&o.model, &weights, opts))
}
