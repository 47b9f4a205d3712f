//! The curve study's tests: reading a study again, FlashDiff's share-1 settings, the short
//! warm-up, the knob lines and the methods a study runs.

use super::*;

#[test]
fn a_study_is_read_again_from_its_json() {
    let dir = std::env::temp_dir().join(format!("fd-curve-reread-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let point = |m: &str, w: f64, db: f64| {
        json!({"method": m, "setting": "-", "work": w, "db": db, "worst_db": db - 5.0,
               "ssim": 1.0, "agreement": 1.0, "patch_steps_skipped": 0.0, "latency_ms": 1.0})
    };
    let doc = json!({
        "config": {"model_kind": "Image", "prompts": 2, "seed": 7, "steps": 50, "patches": 16, "workers": 1},
        "points": [point("full", 1.0, 99.0), point("flashdiff", 0.2, 40.0), point("flashdiff", 0.6, 60.0),
                   point("teacache", 0.2, 30.0), point("teacache", 0.6, 62.0)],
    });
    std::fs::write(dir.join("curve.json"), doc.to_string()).unwrap();
    let md = reread(&dir).unwrap();
    // Behind whole-step caching at 0.6 by 2 dB on the mean and the worst prompt.
    assert!(md.contains("| teacache | 0.250-0.600 | -2.00 dB at work 0.600 | -2.00 dB at work 0.600 | **behind** |"), "{md}");
    assert!(std::fs::read_to_string(dir.join("report.md")).unwrap() == md);
    std::fs::write(
        dir.join("curve.json"),
        "{\"config\": {\"model_kind\": \"Photo\"}}",
    )
    .unwrap();
    let e = reread(&dir).unwrap_err();
    assert!(e.contains("model_kind") && e.contains("curve.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_worst_where_full_is_right_skips_the_prompts_full_gets_wrong() {
    let mut a = Acc::default();
    a.quality(40.0, 1, true);
    a.quality(20.0, 2, false);
    a.quality(35.0, 3, true);
    assert_eq!((a.worst_db, a.worst_prompt), (Some(20.0), 2));
    assert_eq!((a.worst_right, a.right), (Some(35.0), 2));
    // The report prints the column, and says how many prompts it reads.
    let point = |m: &str, w: f64, right: Value| {
        json!({"method": m, "setting": "-", "work": w, "db": 50.0, "worst_db": 20.0,
               "worst_db_full_right": right, "full_right_prompts": 2,
               "agreement": 1.0, "patch_steps_skipped": 0.0, "latency_ms": 1.0})
    };
    let head = Header {
        prompts: 3,
        seed: 1,
        steps: 50,
        patches: 16,
        workers: 1,
    };
    let md = report(
        Kind::Image,
        &head,
        &[
            point("full", 1.0, json!(99.0)),
            point("flashdiff", 0.3, json!(35.0)),
        ],
    );
    assert!(md.contains("among the 2 of 3 whose full"), "{md}");
    assert!(
        md.contains("| flashdiff | - | 0.300 | 50.00 | 20.00 | 35.00 |"),
        "{md}"
    );
    // A study written before the column (or a model with no checker) shows none.
    let md = report(
        Kind::Image,
        &head,
        &[
            json!({"method": "flashdiff", "setting": "-", "work": 0.3, "db": 50.0, "worst_db": 20.0}),
        ],
    );
    assert!(
        !md.contains("among the") && md.contains("| 20.00 | - |"),
        "{md}"
    );
}

#[test]
fn flashdiff_reads_its_per_patch_settings_on_lines_of_their_own() {
    let point = |m: &str, label: &str, w: f64, db: f64| json!({"method": m, "setting": label, "work": w, "db": db, "worst_db": db});
    let points = [
        point("flashdiff", "ε 0.1 K 3", 0.3, 40.0),
        point("flashdiff", "ε 0.1 K 3 order 2 warm-up 3", 0.3, 45.0),
        point("per-patch", "ε 0.1 K 3", 0.2, 38.0),
        point("per-patch", "ε 0.2 K 3", 0.1, 20.0),
        point("teacache", "threshold 0.1", 0.1, 30.0),
    ];
    let labels = |m| -> Vec<String> {
        of_method(&points, m)
            .map(|(p, s)| format!("{}{s}", p["setting"].as_str().unwrap()))
            .collect()
    };
    assert_eq!(
        labels("flashdiff"),
        [
            "ε 0.1 K 3",
            "ε 0.1 K 3 order 2 warm-up 3",
            "ε 0.1 K 3 share 1",
            "ε 0.2 K 3 share 1"
        ]
    );
    // A second-order label is one whatever follows it.
    assert_eq!(
        labels("flashdiff-order1"),
        ["ε 0.1 K 3", "ε 0.1 K 3 share 1", "ε 0.2 K 3 share 1"]
    );
    assert_eq!(labels("per-patch"), ["ε 0.1 K 3", "ε 0.2 K 3"]);
    // FlashDiff's curve reaches per-patch's cheaper settings, and the line between
    // them is per-patch's own, not one through FlashDiff's setting of the same label.
    let c = curve(&points, "flashdiff", "db");
    assert_eq!(c.at(0.1), Some(20.0));
    assert_eq!(c.at(0.15), Some(29.0));
    assert_eq!(c.at(0.25), Some(38.0));
}

#[test]
fn every_setting_that_skips_also_runs_at_the_short_warm_up_where_the_model_warms_longer() {
    let base = |warmup| RequestConfig {
        warmup,
        patches: Some(16),
        ..RequestConfig::default()
    };
    let long = settings(&base(12), 2, true);
    let own = settings(&base(DEFAULT_WARMUP), 2, true);
    let short: Vec<&Setting> = long
        .iter()
        .filter(|s| s.cfg.warmup == SHORT_WARMUP)
        .collect();
    let skipping = |v: &[Setting]| v.iter().filter(|s| s.cfg.mode != Mode::Full).count();
    assert!(!short.is_empty());
    assert_eq!(short.len() * 2, skipping(&long));
    for s in &short {
        let twin = long
            .iter()
            .find(|t| {
                t.method == s.method && format!("{} warm-up {SHORT_WARMUP}", t.label) == s.label
            })
            .expect("a setting at the model's warm-up");
        assert_eq!(twin.cfg.warmup, 12);
        assert!(knob_lines(&s.label)
            .iter()
            .all(|l| !knob_lines(&twin.label).contains(l)));
    }
    assert!(own.iter().all(|s| !s.label.contains("warm-up")));
    // Full computation's warm-up is a full step like any other: nothing to vary.
    assert!(long
        .iter()
        .all(|s| s.cfg.mode != Mode::Full || !s.label.contains("warm-up")));
}

#[test]
fn per_patch_runs_with_flashdiff_and_full_computation_always() {
    let only = |m: &[&str]| -> Vec<String> { m.iter().map(|s| s.to_string()).collect() };
    let fd = only(&["flashdiff"]);
    assert!(runs(&fd, "flashdiff") && runs(&fd, "per-patch") && runs(&fd, "full"));
    assert!(!runs(&fd, "random-patches") && !runs(&fd, "teacache"));
    let tc = only(&["teacache"]);
    assert!(runs(&tc, "teacache") && runs(&tc, "full") && !runs(&tc, "per-patch"));
}

#[test]
fn a_study_of_per_patch_alone_did_not_run_flashdiff() {
    let points = [json!({"method": "per-patch", "setting": "ε 0.1 K 3", "work": 0.3, "db": 40.0})];
    assert!(ran(&points, "per-patch"));
    assert!(!ran(&points, "flashdiff") && !ran(&points, "flashdiff-order1"));
}

#[test]
fn the_k_line_reaches_below_the_default_k() {
    let base = RequestConfig {
        patches: Some(16),
        ..RequestConfig::default()
    };
    let k = base.max_skip;
    assert!(k >= 3, "the default K leaves room for two values below it");
    let all = settings(&base, 2, true);
    for method in [
        "flashdiff",
        "per-patch",
        "random-patches",
        "flashdiff-uniform",
    ] {
        let on_line: Vec<u32> = all
            .iter()
            .filter(|s| s.method == method && s.cfg.epsilon == 1.0 && s.cfg.reuse == base.reuse)
            .map(|s| s.cfg.max_skip)
            .filter(|&m| m < base.steps)
            .collect();
        for below in [k - 2, k - 1] {
            assert!(
                on_line.contains(&below),
                "{method}: no ε 1 K {below} in {on_line:?}"
            );
        }
        // Each K once per order: one knob line, no repeated setting.
        let mut sorted = on_line.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), on_line.len(), "{method}: {on_line:?}");
    }
}

/// Every label of more than one knob is made of (name, value) pairs, so that its settings
/// fall on the knob lines they belong to (an odd word would put them all on one line).
#[test]
fn every_label_names_its_knobs_in_pairs() {
    for reuse in [Reuse::Extrapolate, Reuse::Corrected, Reuse::Stale] {
        for warmup in [DEFAULT_WARMUP, 12] {
            let base = RequestConfig {
                warmup,
                reuse,
                patches: Some(16),
                ..RequestConfig::default()
            };
            for s in settings(&base, 2, true) {
                let words = s.label.split_whitespace().count();
                assert!(
                    words <= 2 || words % 2 == 0,
                    "{} {:?}: not in pairs",
                    s.method,
                    s.label
                );
            }
        }
    }
}
