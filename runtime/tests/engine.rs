//! Engine semantics: determinism across workers and packing, modes, request isolation, and
//! clear errors for bad requests.

use flashdiff_runtime::engine::{
    default_weights, noise, Engine, EngineError, Mode, RequestConfig, Reuse,
};
use flashdiff_runtime::models::{StepInput, Tensor};
use std::time::Duration;

const PROMPT: &str = "a red circle top left and a blue square bottom right on a white background";

fn cfg(mode: Mode) -> RequestConfig {
    RequestConfig {
        steps: 12,
        warmup: 3,
        patches: Some(6),
        // In 12 steps each step moves block 0's input by about 0.2: a budget of 0.3 skips.
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

#[test]
fn output_is_bit_identical_for_any_number_of_workers() {
    let mut outs = Vec::new();
    for workers in [1u32, 2, 3] {
        let mut e = Engine::new(&default_weights(), workers).unwrap();
        let o = e
            .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
            .unwrap();
        assert!(
            o.report.computed < o.report.patch_steps,
            "the gate skipped nothing: {:?}",
            o.report.active_per_step
        );
        outs.push(o);
    }
    for o in &outs[1..] {
        assert_eq!(
            o.latent, outs[0].latent,
            "latent differs between worker counts"
        );
        assert_eq!(o.report.active_per_step, outs[0].report.active_per_step);
    }
}

/// Worker threads under load: many requests of every mode at once, on three threads that
/// take their monotasks from lock-free hand-off queues with 1, 2 (the default) or 4
/// dispatched to each at once; each output bit-identical to the same request served alone
/// on the coordinator thread.
#[test]
fn worker_threads_under_concurrent_load_change_nothing() {
    let modes = [Mode::FlashDiff, Mode::NoSkip, Mode::Full, Mode::NaivePatch];
    let config = |i: u64| RequestConfig {
        seed: i,
        mode: modes[i as usize % modes.len()],
        ..cfg(Mode::FlashDiff)
    };
    let mut alone = Engine::new(&default_weights(), 1).unwrap();
    let want: Vec<_> = (0..12u64)
        .map(|i| alone.generate(PROMPT, config(i), &mut |_| {}).unwrap())
        .collect();
    for depth in [1, 2, 4] {
        let mut threaded = Engine::new(&default_weights(), 3).unwrap();
        threaded.set_dispatch_depth(depth).unwrap();
        for i in 0..12u64 {
            threaded.submit(i, PROMPT, config(i)).unwrap();
        }
        let mut got: Vec<_> = threaded
            .run(&mut |_| {})
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got.len(), 12);
        got.sort_by_key(|o| o.report.id);
        for (i, o) in got.iter().enumerate() {
            assert_eq!(
                o.latent, want[i].latent,
                "request {i} differs on worker threads at dispatch depth {depth}"
            );
        }
    }
}

#[test]
fn the_dispatch_depth_is_checked() {
    let mut e = Engine::new(&default_weights(), 2).unwrap();
    for bad in [0, 65] {
        let err = e.set_dispatch_depth(bad).unwrap_err().to_string();
        assert!(err.contains("must be in 1..=64"), "{err}");
    }
    e.submit(1, PROMPT, cfg(Mode::FlashDiff)).unwrap();
    let err = e.set_dispatch_depth(3).unwrap_err().to_string();
    assert!(err.contains("no request is in flight"), "{err}");
    assert_eq!(e.run(&mut |_| {}).len(), 1);
    e.set_dispatch_depth(3).unwrap();
}

#[test]
fn by_default_the_output_does_not_depend_on_the_workers() {
    let defaults = RequestConfig {
        monotasks: RequestConfig::default().monotasks,
        ..cfg(Mode::FlashDiff)
    };
    let mut one = Engine::new(&default_weights(), 1).unwrap();
    let mut two = Engine::new(&default_weights(), 2).unwrap();
    let want = one.generate(PROMPT, defaults.clone(), &mut |_| {}).unwrap();
    let got = two.generate(PROMPT, defaults.clone(), &mut |_| {}).unwrap();
    assert_eq!(got.latent, want.latent, "default output depends on workers");
    // `None` spreads a step over every worker: two monotasks on two workers.
    let spread = two
        .generate(
            PROMPT,
            RequestConfig {
                monotasks: None,
                ..defaults.clone()
            },
            &mut |_| {},
        )
        .unwrap();
    let as_two = one
        .generate(
            PROMPT,
            RequestConfig {
                monotasks: Some(2),
                ..defaults.clone()
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(spread.latent, as_two.latent, "None is not the worker count");
    assert_ne!(
        spread.latent, want.latent,
        "packing patches together changed nothing"
    );
}

#[test]
fn one_monotask_per_step_without_skipping_is_full_computation() {
    // Patches in one forward see each other's fresh K/V: with one monotask per step and no
    // skipping, nothing is displaced and the result is ordinary sampling, bit for bit.
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let full = e.generate(PROMPT, cfg(Mode::Full), &mut |_| {}).unwrap();
    let packed = e
        .generate(
            PROMPT,
            RequestConfig {
                monotasks: Some(1),
                ..cfg(Mode::NoSkip)
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(packed.report.patches, 6);
    assert_eq!(packed.latent, full.latent);
    let displaced = e
        .generate(
            PROMPT,
            RequestConfig {
                monotasks: Some(6),
                ..cfg(Mode::NoSkip)
            },
            &mut |_| {},
        )
        .unwrap();
    assert_ne!(
        displaced.latent, full.latent,
        "six monotasks displaced nothing"
    );
}

#[test]
fn concurrent_requests_do_not_change_each_others_output() {
    let mut alone = Engine::new(&default_weights(), 2).unwrap();
    let solo = alone
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    let mut e = Engine::new(&default_weights(), 2).unwrap();
    e.submit(
        1,
        "a green cross center on a black background",
        RequestConfig {
            priority: 5,
            ..cfg(Mode::NoSkip)
        },
    )
    .unwrap();
    e.submit(2, PROMPT, cfg(Mode::FlashDiff)).unwrap();
    e.submit(
        3,
        "a yellow triangle left on a purple background",
        cfg(Mode::Full),
    )
    .unwrap();
    let results = e.run(&mut |_| {});
    assert_eq!(results.len(), 3);
    let two = results
        .iter()
        .flatten()
        .find(|o| o.report.id == 2)
        .expect("request 2 finished");
    assert_eq!(two.latent, solo.latent);
}

#[test]
fn full_mode_is_ordinary_sampling() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let c = cfg(Mode::Full);
    let o = e.generate(PROMPT, c.clone(), &mut |_| {}).unwrap();
    assert_eq!(o.report.patches, 1);
    assert_eq!(o.report.computed, o.report.patch_steps);
    // Plain Euler sampling with the model directly, on its times.
    let m = e.model();
    let dims = m.dims().clone();
    let c0 = m.condition(PROMPT).unwrap();
    let context = Tensor::from_slice(&c0.context, c0.context.len(), m.device()).unwrap();
    let mut x = noise(c.seed, dims.grid.tokens() * dims.channels);
    for n in 0..c.steps {
        let (t, next) = (m.time(n, c.steps), m.time(n + 1, c.steps));
        let h = t - next;
        let cond = m.step_cond(&context, t).unwrap();
        let xt = Tensor::from_slice(&x, (dims.grid.tokens(), dims.channels), m.device()).unwrap();
        let step = StepInput {
            context: &context,
            cond: &cond,
        };
        let v: Vec<f32> = m
            .full_forward(&xt, step, false)
            .unwrap()
            .velocity
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (xi, v) in x.iter_mut().zip(&v) {
            *xi -= h * v;
        }
    }
    assert_eq!(o.latent, x);
}

#[test]
fn no_skip_runs_every_patch_and_flashdiff_skips() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let ns = e.generate(PROMPT, cfg(Mode::NoSkip), &mut |_| {}).unwrap();
    assert_eq!(ns.report.computed, ns.report.patch_steps);
    // Each step's active patches, as the engine reports them.
    let mut active: Vec<Vec<bool>> = Vec::new();
    let c = cfg(Mode::FlashDiff);
    let fd = e
        .generate(PROMPT, c.clone(), &mut |ev| {
            if ev.step > c.warmup {
                active.push(ev.active.to_vec());
            }
        })
        .unwrap();
    assert!(fd.report.computed < fd.report.patch_steps);
    assert_eq!(active.len(), fd.report.active_per_step.len());
    for (a, &n) in active.iter().zip(&fd.report.active_per_step) {
        assert_eq!(a.iter().filter(|&&x| x).count() as u32, n);
    }
    // The last step is always computed in full.
    assert!(active.last().unwrap().iter().all(|&x| x));
    // No patch is skipped more than K = max_skip steps in a row.
    for p in 0..fd.report.patches as usize {
        let mut run = 0;
        for a in &active {
            run = if a[p] { 0 } else { run + 1 };
            assert!(run <= c.max_skip, "patch {p} skipped {run} steps in a row");
        }
    }
    assert!(
        active.iter().any(|a| a.iter().any(|&x| !x)),
        "nothing was skipped, so K was not exercised"
    );
}

#[test]
fn bad_requests_fail_alone_with_clear_errors() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let err = e
        .submit(
            1,
            "a red dragon on a white background",
            cfg(Mode::FlashDiff),
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, EngineError::Prompt(_))
            && msg.contains("\"dragon\"")
            && msg.contains("circle"),
        "{msg}"
    );
    let bad = |c: RequestConfig, setting: &str| {
        let m = Engine::new(&default_weights(), 1)
            .unwrap()
            .submit(9, PROMPT, c)
            .unwrap_err()
            .to_string();
        assert!(m.contains(setting), "{m} does not name {setting}");
    };
    bad(
        RequestConfig {
            steps: 1,
            ..cfg(Mode::FlashDiff)
        },
        "\"steps\"",
    );
    bad(
        RequestConfig {
            warmup: 12,
            ..cfg(Mode::FlashDiff)
        },
        "\"warmup\"",
    );
    bad(
        RequestConfig {
            patches: Some(0),
            ..cfg(Mode::FlashDiff)
        },
        "\"patches\"",
    );
    bad(
        RequestConfig {
            patches: Some(65),
            ..cfg(Mode::FlashDiff)
        },
        "\"patches\"",
    );
    bad(
        RequestConfig {
            epsilon: f32::NAN,
            ..cfg(Mode::FlashDiff)
        },
        "\"epsilon\"",
    );
    bad(
        RequestConfig {
            priority: 9,
            ..cfg(Mode::FlashDiff)
        },
        "\"priority\"",
    );
    // A good request still runs after the bad ones.
    e.submit(2, PROMPT, cfg(Mode::FlashDiff)).unwrap();
    let r = e.run(&mut |_| {});
    assert!(r.len() == 1 && r[0].is_ok());
    assert!(
        Engine::new(std::path::Path::new("/nonexistent/w.safetensors"), 1)
            .unwrap_err()
            .to_string()
            .contains("cannot read weights")
    );
    assert!(Engine::new(&default_weights(), 0)
        .unwrap_err()
        .to_string()
        .contains("--workers"));
}

#[test]
fn baselines_run_and_behave_as_named() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    // NaivePatch: uniform patches, no skipping, patches blind to each other.
    let naive = e
        .generate(PROMPT, cfg(Mode::NaivePatch), &mut |_| {})
        .unwrap();
    assert_eq!(naive.report.computed, naive.report.patch_steps);
    let ds = e
        .generate(
            PROMPT,
            RequestConfig {
                layout: flashdiff_runtime::engine::LayoutKind::Uniform,
                ..cfg(Mode::NoSkip)
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        naive.layout, ds.layout,
        "both baselines use the uniform layout"
    );
    assert_ne!(
        naive.latent, ds.latent,
        "isolated patches must differ from displaced K/V"
    );
    // TeaCache: a huge threshold with no K bound skips every step it may; a zero threshold
    // skips none; K bounds a run of skips (a computed step every K + 1, FORA's interval).
    let all = e
        .generate(
            PROMPT,
            RequestConfig {
                cache_threshold: 0.0,
                ..cfg(Mode::TeaCache)
            },
            &mut |_| {},
        )
        .unwrap();
    assert!(all.report.active_per_step.iter().all(|&a| a == 1));
    let lazy = e
        .generate(
            PROMPT,
            RequestConfig {
                cache_threshold: 1e9,
                max_skip: 12,
                ..cfg(Mode::TeaCache)
            },
            &mut |_| {},
        )
        .unwrap();
    let capped = e
        .generate(
            PROMPT,
            RequestConfig {
                cache_threshold: 1e9,
                ..cfg(Mode::TeaCache)
            },
            &mut |_| {},
        )
        .unwrap();
    // After the warm-up (steps 0-2) step 3 has nothing to compare and is computed; then
    // skip, skip, compute, skip, skip, compute, skip, and the final step is computed.
    let runs: Vec<usize> = capped
        .report
        .active_per_step
        .split(|&a| a > 0)
        .map(<[u32]>::len)
        .filter(|&n| n > 0)
        .collect();
    assert_eq!(runs, vec![2, 2, 1], "{:?}", capped.report.active_per_step);
    let skipped = lazy
        .report
        .active_per_step
        .iter()
        .filter(|&&a| a == 0)
        .count();
    // The first patch step has no previous input to compare and the last is always computed.
    assert_eq!(
        skipped,
        lazy.report.active_per_step.len() - 2,
        "{:?}",
        lazy.report.active_per_step
    );
}

#[test]
fn ras_recomputes_half_the_regions_and_dense_steps_in_full() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let c = RequestConfig {
        steps: 20,
        warmup: 3,
        ..cfg(Mode::Ras)
    };
    let o = e.generate(PROMPT, c, &mut |_| {}).unwrap();
    assert_eq!(o.report.patches, 2);
    // Steps 3..19; dense at round(0.45*20) = 9, round(0.8*20) = 16 and the last step.
    let dense: Vec<usize> = o
        .report
        .active_per_step
        .iter()
        .enumerate()
        .filter(|(_, &a)| a == 2)
        .map(|(i, _)| i + 3)
        .collect();
    assert_eq!(dense, vec![9, 16, 19]);
    let share = o.report.computed_tokens as f64 / (17.0 * 64.0);
    assert!(share > 0.5 && share < 0.7, "computed share {share}");
}

/// Load-adaptive ε: a lone request on one worker (load 1) runs at the request's ε, four at
/// once (load 4) at twice it, and with the flag off ε is never chosen per step.
#[test]
fn load_adaptive_epsilon_follows_the_requests_in_flight() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let c = RequestConfig {
        adaptive_epsilon: true,
        ..cfg(Mode::FlashDiff)
    };
    let alone = e.generate(PROMPT, c.clone(), &mut |_| {}).unwrap();
    let eps = alone.report.mean_epsilon().expect("ε was chosen per step");
    assert!(
        (eps - c.epsilon as f64).abs() < 1e-6,
        "lone request at load 1: ε {eps}"
    );
    for i in 0..4u64 {
        e.submit(
            i,
            PROMPT,
            RequestConfig {
                seed: i,
                ..c.clone()
            },
        )
        .unwrap();
    }
    let busy: Vec<f64> = e
        .run(&mut |_| {})
        .into_iter()
        .map(|r| r.unwrap().report.mean_epsilon().unwrap())
        .collect();
    // The first step of every request opens while all four are in flight (load 4: 2ε).
    assert!(
        busy.iter().any(|&x| x > 1.1 * c.epsilon as f64),
        "ε did not rise under load: {busy:?}"
    );
    let off = e
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    assert_eq!(off.report.mean_epsilon(), None);
}

/// The adaptive R controller's quality signal: zero when nothing was skipped, positive and
/// finite when skipped patches resumed from extrapolated stand-ins.
#[test]
fn reuse_error_is_measured_when_skipped_patches_resume() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let ns = e.generate(PROMPT, cfg(Mode::NoSkip), &mut |_| {}).unwrap();
    assert_eq!(ns.report.reuse_error(), 0.0);
    let fd = e
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    let err = fd.report.reuse_error();
    assert!(err > 0.0 && err < 1.0, "reuse error {err}");
}

/// Every part of a lone request's time is accounted for: what is left as "queue" (waiting
/// behind other requests) is a small share of its latency.
#[test]
fn a_lone_request_spends_almost_no_time_queued() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let o = e
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    let t = o.report.time;
    assert!(
        t.queue.as_secs_f64() <= 0.05 * o.report.latency.as_secs_f64(),
        "queue {:?} of {:?}: {t:?}",
        t.queue,
        o.report.latency
    );
    assert!(t.io > std::time::Duration::ZERO);
}

/// A request continued from the checkpoint of any step, in a fresh engine (as after a
/// crash), ends bit-identical to the uninterrupted run, in every mode; the checkpoint is
/// gone once the request ends.
/// A work budget counts the model's FLOPs: the run's FLOPs (recomputed here from the
/// model's counts and the steps the report says were computed) stay within F of full
/// computation's, and one more computed step would not.
#[test]
fn a_work_budget_computes_the_most_steps_its_flops_allow() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let f = e.model().flops();
    assert!(
        f.counted && f.signal_per_token > 0.0 && f.every_step > 0.0,
        "{f:?}"
    );
    let tokens = e.model().dims().grid.tokens() as f64;
    for (steps, warmup, budget) in [
        (12u32, 3u32, 0.5f32),
        (20, 3, 0.33),
        (20, 3, 0.35),
        (20, 3, 0.25),
        (12, 3, 1.0),
    ] {
        let c = RequestConfig {
            steps,
            warmup,
            budget: Some(budget),
            ..cfg(Mode::FlashDiff)
        };
        let out = e.generate(PROMPT, c, &mut |_| {}).unwrap();
        let r = &out.report;
        let computed = warmup as usize + r.active_per_step.iter().filter(|&&a| a > 0).count();
        assert!(
            r.active_per_step.iter().all(|&a| a == 0 || a == r.patches),
            "a computed step left patches out: {:?}",
            r.active_per_step
        );
        // Every step's conditioning, the signal on every step after the warm-up, and each
        // computed step's layers.
        let n = steps as f64;
        let step = tokens * f.per_token + f.per_step;
        let run = |k: usize| {
            k as f64 * step + n * f.every_step + (n - warmup as f64) * tokens * f.signal_per_token
        };
        let full = n * (step + f.every_step);
        let limit = budget as f64 * full;
        assert!(
            run(computed) <= limit * (1.0 + 1e-9),
            "F {budget} of {steps} steps: {computed} steps run {} of full",
            run(computed) / full
        );
        if computed < steps as usize {
            assert!(
                run(computed + 1) > limit,
                "F {budget} of {steps} steps: {} steps would fit",
                computed + 1
            );
        }
        assert!(
            (r.flops.fraction() - run(computed) / full).abs() < 1e-9,
            "the report's FLOPs {} against {}",
            r.flops.fraction(),
            run(computed) / full
        );
        assert_eq!(
            *r.active_per_step.last().unwrap(),
            r.patches,
            "the final step"
        );
    }
}

#[test]
fn a_work_budget_is_refused_where_it_cannot_hold() {
    let e = Engine::new(&default_weights(), 1).unwrap();
    let check = |c: RequestConfig, says: &str| match e.validate(&c) {
        Err(EngineError::Invalid { field, reason }) => {
            assert_eq!(field, "budget");
            assert!(reason.contains(says), "{reason}");
        }
        other => panic!("budget {:?} in {:?}: {other:?}", c.budget, c.mode),
    };
    for bad in [0.0, -0.5, 1.5, f32::NAN] {
        check(
            RequestConfig {
                budget: Some(bad),
                ..cfg(Mode::FlashDiff)
            },
            "(0, 1]",
        );
    }
    // 12 steps, a warm-up of 3 and the final step: at least 4 of 12 and the signal, more
    // than 4/12 of the FLOPs. The least budget named is one that is accepted, and a
    // thousandth less is refused with the same number.
    let at = |f: f32| RequestConfig {
        budget: Some(f),
        ..cfg(Mode::FlashDiff)
    };
    let least = match e.validate(&at(0.3)) {
        Err(EngineError::Invalid { field, reason }) => {
            assert_eq!(field, "budget");
            let n = reason.rsplit("at least ").next().unwrap();
            n.parse::<f32>().unwrap_or_else(|_| panic!("{reason}"))
        }
        other => panic!("budget 0.3 of 12 steps: {other:?}"),
    };
    assert!(least > 4.0 / 12.0 && least < 0.4, "least {least}");
    e.validate(&at(least)).unwrap();
    check(at(least - 0.001), &format!("at least {least:.3}"));
    check(at(1.0 / 3.0), &format!("at least {least:.3}"));
    check(
        RequestConfig {
            budget: Some(0.5),
            ..cfg(Mode::TeaCache)
        },
        "modes flashdiff, auto and per-patch only",
    );
    for mode in [Mode::Auto, Mode::PerPatch] {
        e.validate(&RequestConfig {
            budget: Some(least),
            ..cfg(mode)
        })
        .unwrap();
    }
    // Two steps, one of them warm-up: both are always computed, and the signal of the second
    // makes them cost more than full computation, so no budget can hold them.
    check(
        RequestConfig {
            steps: 2,
            warmup: 1,
            budget: Some(1.0),
            ..cfg(Mode::FlashDiff)
        },
        "no work budget holds them",
    );
}

#[test]
fn a_request_resumed_from_any_checkpoint_ends_bit_identical() {
    use flashdiff_runtime::checkpoint;
    let dir = std::env::temp_dir().join(format!("fd-resume-{}", std::process::id()));
    for mode in [
        Mode::FlashDiff,
        Mode::NoSkip,
        Mode::TeaCache,
        Mode::Ras,
        Mode::Full,
        Mode::PatchGate,
    ] {
        let c = RequestConfig {
            adaptive_epsilon: mode == Mode::FlashDiff,
            ..cfg(mode)
        };
        // The work budget's pace is rebuilt from the report: a resumed request keeps it.
        let budgeted = RequestConfig {
            budget: Some(0.5),
            ..cfg(mode)
        };
        // Second-order forecasting keeps its curves and gaps across a resume.
        let second = RequestConfig {
            reuse: Reuse::Extrapolate2,
            ..cfg(mode)
        };
        // The resume correction needs no state of its own: the gaps and the schedule.
        let corrected = |reuse| RequestConfig {
            reuse,
            budget: Some(0.4).filter(|_| mode == Mode::FlashDiff),
            ..cfg(mode)
        };
        let extra = match mode {
            Mode::FlashDiff => vec![
                budgeted,
                second,
                corrected(Reuse::Corrected),
                corrected(Reuse::Corrected2),
            ],
            Mode::TeaCache => vec![second, corrected(Reuse::Corrected2)],
            _ => Vec::new(),
        };
        for c in std::iter::once(c).chain(extra) {
            let mut a = Engine::new(&default_weights(), 1).unwrap();
            a.set_checkpoint_dir(Some(dir.clone()), Duration::ZERO)
                .unwrap();
            let file = checkpoint::path(&dir, 5);
            let mut saved = Vec::new();
            a.submit(5, PROMPT, c.clone()).unwrap();
            let out = a.run(&mut |ev| {
                let step = ev.step;
                // The file holds the previous step boundary's checkpoint here.
                if let Ok(b) = std::fs::read(&file) {
                    saved.push((step, b));
                }
            });
            let want = out[0].as_ref().unwrap();
            assert!(
                !file.exists(),
                "{mode:?}: checkpoint left after the request ended"
            );
            assert!(
                saved.len() >= 6,
                "{mode:?}: only {} checkpoints",
                saved.len()
            );
            for (step, bytes) in &saved {
                let ck = checkpoint::decode(bytes).unwrap();
                // Only the paper's gate decides through one: it is the patch gate's memory
                // from its first decision on, and in no other method's checkpoint.
                let gated = mode == Mode::PatchGate && ck.step > ck.cfg.warmup;
                assert_eq!(
                    ck.memory.iter().any(|m| m.name == "gate.r_bar"),
                    gated,
                    "{mode:?}: gate state in the checkpoint of step {}",
                    ck.step
                );
                let mut b = Engine::new(&default_weights(), 1).unwrap();
                b.resume(ck).unwrap();
                let got = b.run(&mut |_| {});
                let got = got[0].as_ref().unwrap();
                assert_eq!(
                    got.latent, want.latent,
                    "{mode:?}: resumed before step {step}, the output changed"
                );
                assert_eq!(got.report.active_per_step, want.report.active_per_step);
                assert_eq!(got.report.computed, want.report.computed);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The resume correction moves the latent of a request that asks for it and of no other:
/// under one work budget (6 of 12 steps computed) the corrected runs end elsewhere than the uncorrected ones, and
/// two runs of each are identical.
#[test]
fn the_resume_correction_changes_the_output_of_requests_that_ask_for_it() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let mut latent = |reuse| {
        let c = RequestConfig {
            reuse,
            budget: Some(0.5),
            ..cfg(Mode::FlashDiff)
        };
        e.submit(1, PROMPT, c).unwrap();
        let out = e.run(&mut |_| {});
        let out = out[0].as_ref().unwrap();
        assert!(out.latent.iter().all(|v| v.is_finite()), "{reuse:?}");
        out.latent.clone()
    };
    for (plain, corrected) in [
        (Reuse::Extrapolate, Reuse::Corrected),
        (Reuse::Extrapolate2, Reuse::Corrected2),
    ] {
        let (a, b) = (latent(plain), latent(corrected));
        assert_ne!(a, b, "{corrected:?} changed nothing");
        assert_eq!(a, latent(plain));
        assert_eq!(b, latent(corrected));
    }
}

#[test]
fn a_damaged_or_foreign_checkpoint_is_refused() {
    use flashdiff_runtime::checkpoint;
    let dir = std::env::temp_dir().join(format!("fd-resume-bad-{}", std::process::id()));
    let mut a = Engine::new(&default_weights(), 1).unwrap();
    a.set_checkpoint_dir(Some(dir.clone()), Duration::ZERO)
        .unwrap();
    let file = checkpoint::path(&dir, 9);
    let mut bytes = None;
    a.submit(9, PROMPT, cfg(Mode::FlashDiff)).unwrap();
    a.run(&mut |ev| {
        let step = ev.step;
        if step == 6 {
            bytes = std::fs::read(&file).ok();
        }
    });
    let ck = checkpoint::decode(&bytes.unwrap()).unwrap();
    let mut b = Engine::new(&default_weights(), 1).unwrap();
    let mut wrong = ck.clone();
    wrong.dims[0] += 1;
    assert!(b
        .resume(wrong)
        .unwrap_err()
        .to_string()
        .contains("dimensions"));
    let mut wrong = ck.clone();
    wrong.patch_of.pop();
    assert!(b.resume(wrong).is_err());
    let mut wrong = ck.clone();
    wrong
        .memory
        .iter_mut()
        .find(|m| m.name == "budget.accumulated")
        .expect("FlashDiff's budget")
        .floats[0] = f32::NAN;
    assert!(b.resume(wrong).is_err());
    let mut wrong = ck.clone();
    wrong.memory.retain(|m| m.name != "budget.skipped_run");
    assert!(b.resume(wrong).is_err(), "an incomplete budget");
    // A damaged gate, in the checkpoint of a method that decides through it.
    a.submit(10, PROMPT, cfg(Mode::PatchGate)).unwrap();
    let gated = checkpoint::path(&dir, 10);
    let mut gated_bytes = None;
    a.run(&mut |ev| {
        if ev.step == 6 {
            gated_bytes = std::fs::read(&gated).ok();
        }
    });
    let gated = checkpoint::decode(&gated_bytes.unwrap()).unwrap();
    let mut wrong = gated.clone();
    wrong
        .memory
        .iter_mut()
        .find(|m| m.name == "gate.r_bar")
        .expect("the gate's record")
        .floats[0] = f32::NAN;
    assert!(b.resume(wrong).is_err());
    let mut wrong = gated.clone();
    wrong.memory.retain(|m| m.name != "gate.delta");
    assert!(b.resume(wrong).is_err(), "an incomplete gate");
    let mut wrong = gated.clone();
    for m in wrong.memory.iter_mut().filter(|m| m.name == "gate.active") {
        m.counts[0] = 2;
    }
    assert!(b.resume(wrong).is_err(), "an active flag of 2");
    let mut wrong = ck.clone();
    wrong.regions[1].truncate(3);
    assert!(b.resume(wrong).unwrap_err().to_string().contains("region"));
    let mut wrong = ck.clone();
    wrong.cfg.mode = "bogus".into();
    assert!(b.resume(wrong).is_err());
    let mut wrong = ck.clone();
    wrong.step = 1;
    assert!(b.resume(wrong).unwrap_err().to_string().contains("step"));
    // Second-order state that does not match the request's forecast order.
    let mut wrong = ck.clone();
    wrong.track.as_mut().expect("forecasting").v_curve = vec![0.0; 3];
    assert!(b.resume(wrong).is_err());
    let mut wrong = ck.clone();
    wrong.cfg.reuse = 2;
    assert!(b
        .resume(wrong)
        .unwrap_err()
        .to_string()
        .contains("extrapolation"));
    let mut wrong = ck.clone();
    wrong.cfg.reuse = 7;
    assert!(b.resume(wrong).unwrap_err().to_string().contains("reuse"));
    // The real one still resumes after all those refusals.
    b.resume(ck).unwrap();
    assert!(b.run(&mut |_| {})[0].is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The video model: a 3-D grid (8 frames of 4x4 tokens) partitioned into patches that may
/// span frames, gated and scheduled like an image; the output is 8 frames, bit-identical for
/// any worker count, and FlashDiff skips work.
#[test]
fn video_runs_on_its_3d_grid_and_is_identical_for_any_worker_count() {
    use flashdiff_runtime::engine::builtin_weights;
    use flashdiff_runtime::models::Kind;
    let weights = builtin_weights("tinyvideo").unwrap();
    let prompt = "a red circle top left moving right on a blue background";
    let mut outs = Vec::new();
    for workers in [1u32, 2] {
        let mut e = Engine::new(&weights, workers).unwrap();
        assert_eq!(e.model().kind(), Kind::Video);
        let g = e.model().dims().grid;
        assert_eq!((g.frames, g.height, g.width), (8, 4, 4));
        outs.push(
            e.generate(prompt, cfg(Mode::FlashDiff), &mut |_| {})
                .unwrap(),
        );
    }
    let o = &outs[0];
    assert_eq!(
        o.latent, outs[1].latent,
        "latent differs between worker counts"
    );
    assert_eq!(
        (o.sample.frames, o.sample.width, o.sample.height),
        (8, 32, 32)
    );
    assert_eq!(o.sample.rgb.len(), 8 * 32 * 32 * 3);
    assert!(o.report.computed < o.report.patch_steps, "nothing skipped");
    // The layout is a 3-D partition of the 8 x 4 x 4 token grid: every patch is connected
    // through faces in (frame, row, column), some patch spans several frames (time is cut
    // only where saliency says so, not at every frame) and some patch does not span them
    // all (time is cut somewhere, not only space).
    let of = o.layout.patch_of();
    assert_eq!(of.len(), 128);
    let at = |f: usize, y: usize, x: usize| of[f * 16 + y * 4 + x];
    let mut spans = Vec::new();
    for p in 0..o.layout.patches() {
        let members: Vec<usize> = (0..128).filter(|&t| of[t] == p).collect();
        assert!(!members.is_empty(), "patch {p} is empty");
        let mut seen = vec![members[0]];
        let mut i = 0;
        while i < seen.len() {
            let t = seen[i];
            let (f, y, x) = (t / 16, (t / 4) % 4, t % 4);
            let mut next = Vec::new();
            if f > 0 {
                next.push((f - 1, y, x));
            }
            if f < 7 {
                next.push((f + 1, y, x));
            }
            if y > 0 {
                next.push((f, y - 1, x));
            }
            if y < 3 {
                next.push((f, y + 1, x));
            }
            if x > 0 {
                next.push((f, y, x - 1));
            }
            if x < 3 {
                next.push((f, y, x + 1));
            }
            for (f, y, x) in next {
                let u = f * 16 + y * 4 + x;
                if at(f, y, x) == p && !seen.contains(&u) {
                    seen.push(u);
                }
            }
            i += 1;
        }
        assert_eq!(
            seen.len(),
            members.len(),
            "patch {p} is not connected in 3-D"
        );
        let mut frames: Vec<usize> = members.iter().map(|t| t / 16).collect();
        frames.dedup();
        spans.push(frames.len());
    }
    assert!(
        spans.iter().any(|&n| n > 1),
        "every patch lies in one frame: {spans:?}"
    );
    assert!(
        spans.iter().any(|&n| n < 8),
        "every patch spans all frames: {spans:?}"
    );
}

/// A caller that conditioned the prompt itself (a server checking it before queueing) gets
/// the output `submit` gives; a conditioning that does not fit the model is refused.
#[test]
fn a_request_conditioned_by_its_caller_runs_as_submitted() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let want = e
        .generate(PROMPT, cfg(Mode::FlashDiff), &mut |_| {})
        .unwrap();
    let c = e.model().condition(PROMPT).unwrap();
    e.submit_conditioned(5, PROMPT, c.clone(), cfg(Mode::FlashDiff))
        .unwrap();
    let got = e.run(&mut |_| {}).pop().unwrap().unwrap();
    assert_eq!(got.latent, want.latent);
    let mut short = c;
    short.context.pop();
    let err = e
        .submit_conditioned(6, PROMPT, short, cfg(Mode::FlashDiff))
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Invalid {
                field: "prompt",
                ..
            }
        ),
        "{err}"
    );
}

/// The report counts the steps after the warm-up by what they computed: the default rule
/// computes whole steps or none, per-patch also computes some patches alone (at some budget
/// and skip cap), and the counts add up to the steps after the warm-up.
#[test]
fn the_report_says_which_steps_were_whole_and_which_regional() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    for (mode, regional) in [(Mode::FlashDiff, false), (Mode::PerPatch, true)] {
        let mut any_regional = false;
        for (epsilon, max_skip) in [(0.05, 1), (0.1, 2), (0.2, 3), (0.3, 2), (0.5, 4)] {
            let c = RequestConfig {
                steps: 30,
                patches: Some(16),
                epsilon,
                max_skip,
                ..cfg(mode)
            };
            let o = e.generate(PROMPT, c.clone(), &mut |_| {}).unwrap();
            let k = o.report.step_kinds();
            assert_eq!(
                k.whole + k.regional + k.forecast,
                c.steps - c.warmup,
                "{k:?}"
            );
            assert!(k.whole > 0, "{mode:?}: {k:?}");
            any_regional |= k.regional > 0;
            let json = flashdiff_runtime::engine::report_json(&o);
            assert_eq!(json["regional_steps"], k.regional);
            assert_eq!(json["whole_steps"], k.whole);
        }
        assert_eq!(any_regional, regional, "{mode:?}");
    }
}

/// `--mode auto` runs as the default rule when its patches change together and as per-patch
/// when they do not, bit for bit, and its report says which on what dispersion; a threshold
/// of 0 makes every request regional, infinity none.
#[test]
fn the_automatic_choice_runs_one_of_the_two_modes_and_says_which() {
    use flashdiff_gate::choice::Execution;
    use flashdiff_runtime::engine::AUTO_DISPERSION;
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    let at = |mode, auto_dispersion, (epsilon, max_skip): (f32, u32)| RequestConfig {
        steps: 30,
        patches: Some(16),
        epsilon,
        max_skip,
        auto_dispersion,
        ..cfg(mode)
    };
    let mut run = |c: RequestConfig| e.generate(PROMPT, c, &mut |_| {}).unwrap();
    // A setting at which the two modes differ (per-patch computes some steps regionally).
    let (knobs, whole, regional) = [(0.05, 1), (0.1, 2), (0.2, 3), (0.3, 2), (0.5, 4)]
        .into_iter()
        .map(|k| {
            let w = run(at(Mode::FlashDiff, AUTO_DISPERSION, k));
            let r = run(at(Mode::PerPatch, AUTO_DISPERSION, k));
            (k, w, r)
        })
        .find(|(_, w, r)| w.latent != r.latent)
        .expect("per-patch differs from whole steps at some setting");
    for (bar, want, twin) in [
        (0.0f32, Execution::Regional, &regional),
        (f32::INFINITY, Execution::WholeStep, &whole),
    ] {
        let o = run(at(Mode::Auto, bar, knobs));
        let c = o.report.choice.expect("auto reports its choice");
        assert_eq!(c.execution, want);
        assert!(c.dispersion.is_finite() && c.dispersion >= 0.0);
        assert_eq!(c.threshold, bar);
        assert!(o.latent == twin.latent, "auto at {bar} is not {want}'s run");
        assert!(
            c.explain().starts_with(&want.to_string()),
            "{}",
            c.explain()
        );
    }
    assert!(whole.report.choice.is_none() && regional.report.choice.is_none());
    let bad = e
        .validate(&at(Mode::Auto, f32::NAN, knobs))
        .unwrap_err()
        .to_string();
    assert!(bad.contains("auto_dispersion"), "{bad}");
}

/// A work budget bounds the regional modes as it bounds whole steps: per-patch and auto under
/// `budget: F` run at most F of full computation's FLOPs, and per-patch's computed steps may
/// run only the patches at their budget.
#[test]
fn a_work_budget_bounds_the_regional_modes_too() {
    let mut e = Engine::new(&default_weights(), 1).unwrap();
    for mode in [Mode::PerPatch, Mode::Auto] {
        let c = RequestConfig {
            steps: 30,
            patches: Some(16),
            budget: Some(0.4),
            ..cfg(mode)
        };
        let o = e.generate(PROMPT, c, &mut |_| {}).unwrap();
        let work = o.report.flops.fraction();
        assert!(
            work <= 0.4 + 1e-9,
            "{mode:?}: FLOPs {work} of full computation's, over the budget 0.4"
        );
        let k = o.report.step_kinds();
        assert!(k.whole > 0, "{mode:?}: {k:?}");
    }
}
