//! Worker faults: a monotask that kills every worker it runs on fails its own
//! request only; a worker executable that exits at once or cannot start is an error, not a
//! hang or a respawn storm; a hung (stopped) worker is killed and its monotask re-run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flashdiff_runtime::engine::{default_weights, Engine, HangPolicy, Mode, RequestConfig};

const PROMPT: &str = "a red circle top left and a blue square bottom right on a white background";
const OTHER: &str = "a green cross center on a black background";

fn cfg() -> RequestConfig {
    RequestConfig {
        steps: 16,
        warmup: 3,
        patches: Some(6),
        epsilon: 0.15,
        max_skip: 2,
        seed: 7,
        mode: Mode::FlashDiff,
        monotasks: Some(3),
        ..Default::default()
    }
}

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flashdiff"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flashdiff-faults-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A worker executable: a shell script that runs `body`.
fn script(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("worker.sh");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn a_monotask_that_kills_its_workers_fails_its_request_and_the_others_finish() {
    let mut here = Engine::new(&default_weights(), 1).unwrap();
    let want = here.generate(OTHER, cfg(), &mut |_| {}).unwrap();
    let dir = scratch("poison");
    // Every worker aborts when handed a monotask of request 1's step 3 (the first after the
    // warm-up, which every method computes).
    let exe = script(
        &dir,
        &format!(
            "FLASHDIFF_WORKER_FAULT=abort:1:3 exec '{}' \"$@\"",
            exe().display()
        ),
    );
    let mut e = Engine::builder(&default_weights())
        .workers(2)
        .processes(&exe, &dir)
        .build()
        .unwrap();
    e.submit(1, PROMPT, cfg()).unwrap();
    e.submit(2, OTHER, cfg()).unwrap();
    let t0 = Instant::now();
    let results = e.run(&mut |_| {});
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(results.len(), 2);
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err().filter(|(id, _)| *id == 1))
        .expect("request 1 failed")
        .1
        .to_string();
    assert!(err.contains("lost worker"), "{err}");
    let two = results
        .iter()
        .flatten()
        .find(|o| o.report.id == 2)
        .expect("request 2 finished");
    assert_eq!(
        two.latent, want.latent,
        "the other request's output changed"
    );
    // Each of the step's 3 monotasks may take a worker down; the first to do so for the
    // third time fails the request: between 3 and 3 x 3 - 2 losses, each replaced.
    assert!(
        (3..=7).contains(&e.replacements()),
        "{} replacements",
        e.replacements()
    );
    // The engine still serves.
    e.submit(3, OTHER, cfg()).unwrap();
    let again = e.run(&mut |_| {});
    assert_eq!(again[0].as_ref().unwrap().latent, want.latent);
}

#[test]
fn a_worker_that_exits_at_once_is_an_error_not_a_respawn_storm() {
    let dir = scratch("exits");
    let exe = script(&dir, "exit 3");
    let mut e = Engine::builder(&default_weights())
        .workers(2)
        .processes(&exe, &dir)
        .build()
        .unwrap();
    e.submit(1, PROMPT, cfg()).unwrap();
    let t0 = Instant::now();
    let results = e.run(&mut |_| {});
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    let err = results[0]
        .as_ref()
        .expect_err("the request failed")
        .1
        .to_string();
    assert!(err.contains("before they are ready"), "{err}");
    assert!(e.replacements() <= 4, "{} replacements", e.replacements());
    // A later request gets a fresh, bounded try.
    e.submit(2, PROMPT, cfg()).unwrap();
    let results = e.run(&mut |_| {});
    assert!(results[0].is_err());
    assert!(e.replacements() <= 10, "{} replacements", e.replacements());
}

#[test]
fn a_worker_executable_that_cannot_start_is_an_error() {
    let dir = scratch("missing");
    let err = Engine::builder(&default_weights())
        .workers(2)
        .processes(&dir.join("no-such-exe"), &dir)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot start worker process"), "{err}");
}

#[test]
fn a_hung_worker_is_killed_and_its_monotask_runs_again() {
    let mut here = Engine::new(&default_weights(), 1).unwrap();
    let long = RequestConfig { steps: 30, ..cfg() };
    let want = here.generate(PROMPT, long.clone(), &mut |_| {}).unwrap();
    let dir = scratch("hang");
    let mut e = Engine::builder(&default_weights())
        .workers(2)
        .processes(&exe(), &dir)
        .build()
        .unwrap();
    e.set_hang_policy(HangPolicy {
        floor: Duration::from_millis(500),
        factor: 20.0,
        first: Duration::from_secs(30),
    })
    .unwrap();
    for bad in [
        HangPolicy {
            factor: f64::INFINITY,
            ..HangPolicy::default()
        },
        HangPolicy {
            factor: 1e300,
            ..HangPolicy::default()
        },
        HangPolicy {
            first: Duration::MAX,
            ..HangPolicy::default()
        },
        HangPolicy {
            floor: Duration::ZERO,
            ..HangPolicy::default()
        },
    ] {
        assert!(e.set_hang_policy(bad).is_err(), "{bad:?} accepted");
    }
    let victim = e.worker_pids()[1].expect("worker 1 running");
    e.submit(1, PROMPT, long).unwrap();
    let mut stopped = false;
    let t0 = Instant::now();
    let results = e.run(&mut |ev| {
        let step = ev.step;
        if step == 8 && !stopped {
            // SAFETY: kill(2) with a pid we started and have not reaped; SIGSTOP freezes it
            // (a hang: alive, pipes open, silent).
            let rc = unsafe { libc::kill(victim as libc::pid_t, libc::SIGSTOP) };
            assert_eq!(rc, 0);
            stopped = true;
        }
    });
    assert!(stopped);
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
    let out = results[0].as_ref().expect("request finished");
    assert_eq!(out.latent, want.latent, "the re-run changed the output");
    assert!(e.replacements() >= 1, "the hung worker was not replaced");
    assert!(
        !e.worker_pids().contains(&Some(victim)),
        "the hung worker is still in the pool"
    );
}
