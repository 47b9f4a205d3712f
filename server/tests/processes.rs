//! Worker processes (`flashdiff worker`, this package's binary): the same output as in
//! process, and a killed worker loses nothing.

use flashdiff_runtime::engine::{default_weights, Engine, Mode, RequestConfig};

const PROMPT: &str = "a red circle top left and a blue square bottom right on a white background";

fn cfg(mode: Mode) -> RequestConfig {
    RequestConfig {
        steps: 12,
        warmup: 3,
        patches: Some(6),
        epsilon: 0.3,
        max_skip: 2,
        seed: 7,
        mode,
        priority: 0,
        // A fixed count, so that tests can compare engines with different worker counts.
        monotasks: Some(3),
        ..Default::default()
    }
}

fn exe() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_flashdiff"))
}

#[test]
fn worker_processes_give_the_same_output() {
    let mut here = Engine::new(&default_weights(), 1).unwrap();
    let want = here
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    let shm = std::env::temp_dir();
    let mut e = Engine::builder(&default_weights())
        .workers(2)
        .processes(&exe(), &shm)
        .build()
        .unwrap();
    assert_eq!(e.worker_pids().len(), 2);
    let got = e
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    assert_eq!(
        got.latent, want.latent,
        "worker processes changed the output"
    );
    assert_eq!(got.report.active_per_step, want.report.active_per_step);
}

#[test]
fn a_killed_worker_loses_nothing_and_changes_nothing() {
    let long = RequestConfig {
        steps: 30,
        warmup: 3,
        ..cfg(Mode::FlashDiff)
    };
    let mut here = Engine::new(&default_weights(), 1).unwrap();
    let want = here.generate(PROMPT, long.clone(), &mut |_| {}).unwrap();
    let mut e = Engine::builder(&default_weights())
        .workers(2)
        .processes(&exe(), &std::env::temp_dir())
        .build()
        .unwrap();
    let victim = e.worker_pids()[1].expect("worker 1 running");
    e.submit(1, PROMPT, long.clone()).unwrap();
    e.submit(
        2,
        "a green cross center on a black background",
        long.clone(),
    )
    .unwrap();
    let mut killed = false;
    let results = e.run(&mut |ev| {
        let step = ev.step;
        if step == 10 && !killed {
            // SAFETY: kill(2) with a pid we started and have not reaped; SIGKILL ends it.
            let rc = unsafe { libc::kill(victim as libc::pid_t, libc::SIGKILL) };
            assert_eq!(rc, 0, "kill failed");
            killed = true;
        }
    });
    assert!(killed);
    assert_eq!(results.len(), 2, "a request was lost");
    let one = results
        .iter()
        .flatten()
        .find(|o| o.report.id == 1)
        .expect("request 1 finished");
    assert_eq!(one.latent, want.latent, "the re-run changed the output");
    assert!(e.replacements() >= 1, "no replacement worker was started");
    assert_eq!(
        e.worker_pids().iter().filter(|p| p.is_some()).count(),
        2,
        "pool not back to 2 workers"
    );
}

/// Worker processes build their model from the engine's description of it, so a pipeline
/// read from a diffusers folder (the small random FLUX.1 dev) runs in them as it runs on
/// worker threads: the same latent, bit for bit. A built-in video model and the built-in
/// FLUX (a model folder) likewise.
#[test]
fn worker_processes_serve_a_pipeline_and_any_built_in_model() {
    use flashdiff_runtime::models::pipelines::registry::ModelSpec;
    use flashdiff_runtime::models::pipelines::{tiny, PipelineOptions};
    let dir = std::env::temp_dir().join(format!("flashdiff-proc-flux-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tiny::write_flux(&dir, true).unwrap();
    let flux = ModelSpec::pipeline("flux-dev", &dir, PipelineOptions::new((64, 48)));
    let video = ModelSpec::builtin("tinyvideo").unwrap();
    let tinyflux = ModelSpec::builtin("tinyflux").unwrap();
    let cases = [
        (flux, "a red dishwasher on the left of a blue table"),
        (
            video,
            "a red circle top left moving right on a blue background",
        ),
        (tinyflux, "a green triangle top right on a black background"),
    ];
    for (spec, prompt) in cases {
        // Random FLUX weights move block 0's input by more than any change budget each step:
        // the patch skipping of a pipeline in worker processes is exercised through the gate.
        let mode = if spec.name == "flux-dev" {
            Mode::PatchGate
        } else {
            Mode::FlashDiff
        };
        let c = RequestConfig {
            patches: Some(4),
            ..cfg(mode)
        };
        let device = flashdiff_runtime::models::Device::Cpu;
        let mut threads = Engine::builder(&spec)
            .workers(2)
            .device(&device)
            .build()
            .unwrap();
        let want = threads.generate(prompt, c.clone(), &mut |_| {}).unwrap();
        let mut procs = Engine::builder(&spec)
            .workers(2)
            .processes(&exe(), &std::env::temp_dir())
            .build()
            .unwrap();
        assert!(procs.worker_pids().iter().all(|p| p.is_some()));
        let got = procs.generate(prompt, c, &mut |_| {}).unwrap();
        assert_eq!(
            got.latent, want.latent,
            "{}: processes changed the output",
            spec.name
        );
        assert_eq!(got.report.active_per_step, want.report.active_per_step);
        assert!(
            got.report.computed < got.report.patch_steps,
            "{}: nothing skipped",
            spec.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
