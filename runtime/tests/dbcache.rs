//! DBCache on the built-in image model: the split forward it runs is the model's forward, its
//! skipped steps forecast the skipped blocks' residual and cost the first block's work, and a
//! request resumes from any checkpoint bit for bit.

use std::time::Duration;

use flashdiff_runtime::checkpoint;
use flashdiff_runtime::engine::{
    default_weights, Engine, Mode, Output, RequestConfig, Reuse, DBCACHE_FRONT_BLOCKS,
};

const PROMPT: &str = "a red circle top left and a blue square bottom right on a white background";

fn cfg(threshold: f32, reuse: Reuse) -> RequestConfig {
    RequestConfig {
        steps: 12,
        warmup: 3,
        seed: 7,
        mode: Mode::DbCache,
        cache_threshold: threshold,
        // No skip cap: the threshold alone decides (the cap has a test of its own).
        max_skip: 12,
        reuse,
        ..Default::default()
    }
}

fn run(e: &mut Engine, c: RequestConfig) -> Output {
    e.generate(PROMPT, c, &mut |_| {}).unwrap()
}

fn skipped(o: &Output) -> usize {
    o.report.active_per_step.iter().filter(|&&a| a == 0).count()
}

/// A threshold of 0 computes every step through the first block, the rest and the output
/// layer: full computation's latent, bit for bit.
#[test]
fn computing_every_step_is_full_computation() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let every = run(&mut e, cfg(0.0, Reuse::Extrapolate));
    assert_eq!(skipped(&every), 0);
    let full = run(
        &mut e,
        RequestConfig {
            mode: Mode::Full,
            ..cfg(0.0, Reuse::Extrapolate)
        },
    );
    assert!(every.latent == full.latent, "not full computation's latent");
    assert_eq!(every.report.work_skipped, 0.0);
}

/// Work recomputed from the steps: the warm-up and computed steps whole, every skipped step
/// the first block's share of one.
#[test]
fn a_skipped_step_costs_the_first_block_and_is_forecast() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let depth = e.model().depth();
    assert!(depth > DBCACHE_FRONT_BLOCKS);
    let c = cfg(1e9, Reuse::Extrapolate);
    let lazy = run(&mut e, c.clone());
    // The first step after the warm-up has nothing to compare, the last is always computed.
    let after = (c.steps - c.warmup) as usize;
    assert_eq!(lazy.report.active_per_step.len(), after);
    assert_eq!(
        skipped(&lazy),
        after - 2,
        "{:?}",
        lazy.report.active_per_step
    );
    let front = DBCACHE_FRONT_BLOCKS as f64 / depth as f64;
    let done = c.warmup as f64 + 2.0 + (after - 2) as f64 * front;
    let want = 1.0 - done / c.steps as f64;
    assert!(
        (lazy.report.work_skipped - want).abs() < 1e-9,
        "work skipped {} against {want} recomputed",
        lazy.report.work_skipped
    );
    assert_eq!(run(&mut e, c).latent, lazy.latent, "the same request twice");
    // The skipped blocks' residual is forecast at the order asked for (with one computation
    // after the warm-up every order reuses it; at a threshold that computes a few, they
    // differ).
    let c = middle(&mut e, Reuse::Extrapolate2);
    let outs: Vec<Vec<f32>> = [Reuse::Stale, Reuse::Extrapolate, Reuse::Extrapolate2]
        .into_iter()
        .map(|reuse| run(&mut e, RequestConfig { reuse, ..c.clone() }).latent)
        .collect();
    assert!(
        outs[0] != outs[1],
        "order 1 gave the stale residual's output"
    );
    assert!(outs[1] != outs[2], "order 2 gave order 1's output");
}

/// The skip cap K (cache-dit's `max_continuous_cached_steps`): at a threshold that would skip
/// every step it may, no more than K steps in a row are skipped.
#[test]
fn the_skip_cap_bounds_a_run_of_skipped_steps() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let capped = run(
        &mut e,
        RequestConfig {
            max_skip: 2,
            ..cfg(1e9, Reuse::Extrapolate)
        },
    );
    let runs: Vec<usize> = capped
        .report
        .active_per_step
        .split(|&a| a > 0)
        .map(<[u32]>::len)
        .filter(|&n| n > 0)
        .collect();
    // Steps 3..=11 after the warm-up: step 3 has nothing to compare and is computed, then
    // skip, skip, compute, skip, skip, compute, skip, and the final step is computed.
    assert_eq!(runs, vec![2, 2, 1], "{:?}", capped.report.active_per_step);
}

/// A threshold between: some steps skipped and some computed after skips, whose forecast
/// error is measured.
fn middle(e: &mut Engine, reuse: Reuse) -> RequestConfig {
    for t in [0.05f32, 0.1, 0.2, 0.3, 0.5] {
        let c = cfg(t, reuse);
        let o = run(e, c.clone());
        let n = skipped(&o);
        if n > 0 && n + 2 < o.report.active_per_step.len() {
            if reuse != Reuse::Stale {
                assert!(o.report.reuse_norm2 > 0.0, "no forecast error measured");
            }
            return c;
        }
    }
    panic!("no threshold both skips and computes");
}

#[test]
fn a_request_resumes_from_any_checkpoint_bit_identical() {
    let dir = std::env::temp_dir().join(format!("fd-dbcache-{}", std::process::id()));
    for reuse in [Reuse::Stale, Reuse::Extrapolate, Reuse::Extrapolate2] {
        let mut a = Engine::new(&default_weights(), 1).unwrap();
        let c = middle(&mut a, reuse);
        a.set_checkpoint_dir(Some(dir.clone()), Duration::ZERO)
            .unwrap();
        let file = checkpoint::path(&dir, 3);
        let mut saved = Vec::new();
        a.submit(3, PROMPT, c).unwrap();
        let out = a.run(&mut |ev| {
            if let Ok(b) = std::fs::read(&file) {
                saved.push((ev.step, b));
            }
        });
        let want = out[0].as_ref().unwrap();
        assert!(saved.len() >= 6, "only {} checkpoints", saved.len());
        for (step, bytes) in &saved {
            let ck = checkpoint::decode(bytes).unwrap();
            let mut b = Engine::new(&default_weights(), 1).unwrap();
            b.resume(ck).unwrap();
            let got = b.run(&mut |_| {});
            let got = got[0].as_ref().unwrap();
            assert!(
                got.latent == want.latent,
                "{reuse:?}: resumed before step {step}, the output changed"
            );
            assert_eq!(got.report.active_per_step, want.report.active_per_step);
            assert_eq!(got.report.work_skipped, want.report.work_skipped);
        }
        // Damaged forecast state is refused, the real one still resumes.
        let (_, bytes) = saved.last().unwrap();
        let ck = checkpoint::decode(bytes).unwrap();
        let slope = &record(&ck, "dbcache.rest.slope").floats;
        assert_eq!(slope.is_empty(), reuse == Reuse::Stale);
        let mut b = Engine::new(&default_weights(), 1).unwrap();
        let mut wrong = ck.clone();
        record_mut(&mut wrong, "dbcache.rest.base").floats.pop();
        assert!(b.resume(wrong).unwrap_err().to_string().contains("damaged"));
        let mut wrong = ck.clone();
        record_mut(&mut wrong, "dbcache.rest.steps").counts[1] = ck.step;
        assert!(b.resume(wrong).is_err());
        let mut wrong = ck.clone();
        wrong.memory.retain(|m| m.name != "dbcache.rest.curve");
        assert!(b.resume(wrong).is_err(), "an incomplete forecast");
        let mut wrong = ck.clone();
        wrong.cfg.reuse = (reuse.order() + 1) % 3;
        assert!(b.resume(wrong).is_err(), "a forecast of another order");
        // A forecast of another width (a whole number of rows per token, as a checkpoint of
        // another model's hidden size would be) is accepted on resume and refused by the
        // step that reads it, with what was wrong, instead of a panic.
        let mut other = ck.clone();
        let n = 64 * 3;
        for name in [
            "dbcache.rest.base",
            "dbcache.rest.slope",
            "dbcache.rest.curve",
            "dbcache.front_residual",
        ] {
            let m = record_mut(&mut other, name);
            if !m.floats.is_empty() {
                m.floats = vec![0.0; n];
            }
        }
        b.resume(other).unwrap();
        let out = b.run(&mut |_| {});
        let err = out[0].as_ref().unwrap_err().1.to_string();
        assert!(err.contains("hidden rows"), "{err}");
        b.resume(ck).unwrap();
        assert!(b.run(&mut |_| {})[0].is_ok());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The named array of a checkpoint's method memory.
fn record<'a>(ck: &'a checkpoint::Checkpoint, name: &str) -> &'a checkpoint::MemoryRecord {
    ck.memory
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name} in the checkpoint"))
}

fn record_mut<'a>(
    ck: &'a mut checkpoint::Checkpoint,
    name: &str,
) -> &'a mut checkpoint::MemoryRecord {
    ck.memory
        .iter_mut()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name} in the checkpoint"))
}
