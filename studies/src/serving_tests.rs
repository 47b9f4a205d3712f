//! The serving study's tests: which way sets the loads, the per-level table, the median run
//! and run-by-run ratios, and who runs again.

use super::*;

#[test]
fn loads_follow_the_fastest_other_way_that_meets_the_quality_bar() {
    let base = RequestConfig::default();
    let list = servers(&base, &base);
    let names: Vec<&str> = list.iter().map(|s| s.name).collect();
    // `fast` at 9 req/s, every other at 1 plus a little that differs by name.
    let cap = |fast: &str| -> Vec<f64> {
        names
            .iter()
            .map(|&n| {
                if n == fast {
                    9.0
                } else {
                    1.0 + n.len() as f64 / 100.0
                }
            })
            .collect()
    };
    let good = |_: &str| 40.0;
    // The fastest other way sets the loads, whichever it is.
    assert_eq!(
        load_base(&list, &cap("teacache-fifo"), &good),
        Some(("teacache-fifo", 9.0))
    );
    assert_eq!(
        load_base(&list, &cap("distrifusion"), &good),
        Some(("distrifusion", 9.0))
    );
    // FlashDiff's own rows never do.
    assert_ne!(
        load_base(&list, &cap("flashdiff-fifo"), &good).map(|b| b.0),
        Some("flashdiff-fifo")
    );
    // A faster way under the bar does not (nor the same method on processes): the
    // fastest one at the bar does, whole-step caching at 1.13 here.
    let df_blurry = |m: &str| if m == "distrifusion" { 25.0 } else { 40.0 };
    let got = load_base(&list, &cap("distrifusion"), &df_blurry).unwrap();
    assert_eq!(got.0, "teacache-fifo");
    // Nothing at the bar: no base.
    assert_eq!(load_base(&list, &cap("full-fifo"), &|_| 10.0), None);
}

#[test]
fn the_level_table_reads_each_levels_own_requests() {
    let base = RequestConfig::default();
    let list = servers(&base, &base);
    // Eight requests: levels 0-3 cycling; request i took i + 1 s (one not finished).
    let mut lat: Vec<Value> = (0..8).map(|i| json!(i as f64 + 1.0)).collect();
    lat[7] = Value::Null;
    let row = json!({"method": "flashdiff", "load": TARGET_LOAD, "latency_of_request_s": lat});
    assert_eq!(level_latencies(&row, 1), vec![2.0, 6.0]);
    assert_eq!(level_latencies(&row, 3), vec![4.0]);
    let mut md = String::new();
    by_level(&[row], &list, &mut md);
    // Median (upper of two) / slowest per level; the one-level row did not run here.
    assert!(
        md.contains("| flashdiff | 5.00 / 5.00 | 6.00 / 6.00 | 7.00 / 7.00 | 4.00 / 4.00 |"),
        "{md}"
    );
    assert!(!md.contains("flashdiff-one-level"), "{md}");
    // The one-level server is FlashDiff's scheduler at one level, the others keep theirs.
    let one: Vec<&str> = list
        .iter()
        .filter(|s| s.one_level)
        .map(|s| s.name)
        .collect();
    assert_eq!(one, ["flashdiff-one-level"]);
    let windowed: Vec<&str> = list.iter().filter(|s| s.window).map(|s| s.name).collect();
    assert_eq!(windowed, ["flashdiff-window"]);
}

#[test]
fn repeated_runs_give_the_median_run_and_pair_ratios_run_by_run() {
    let run = |p99: f64, p50: f64| json!({"p99_s": p99, "p50_s": p50});
    // The row is the run with the median p99, every number its own, and every run's p99
    // kept in the order they ran.
    let by_p99 = |runs| median_run(runs, "p99_s", "p99_rounds_s");
    let fd = by_p99(vec![run(3.0, 1.0), run(2.0, 0.5), run(4.0, 1.5)]);
    assert_eq!(fd["p99_s"], json!(3.0));
    assert_eq!(fd["p50_s"], json!(1.0));
    assert_eq!(fd["p99_rounds_s"], json!([3.0, 2.0, 4.0]));
    // Ratios pair run i with run i: 2.4/3, 3/2, 6/4 -> 0.8, 1.5, 1.5.
    let other = by_p99(vec![run(2.4, 1.0), run(3.0, 1.0), run(6.0, 1.0)]);
    let (median, worst, n) = p99_ratios(&other, &fd).unwrap();
    assert_eq!(n, 3);
    assert!((median - 1.5).abs() < 1e-9, "{median}");
    assert!((worst - 0.8).abs() < 1e-9, "{worst}");
    // One run of the other: only the first of FlashDiff's is its pair.
    let once = by_p99(vec![run(6.0, 1.0)]);
    let (median, worst, n) = p99_ratios(&once, &fd).unwrap();
    assert_eq!(n, 1);
    assert!((median - 2.0).abs() < 1e-9 && (worst - 2.0).abs() < 1e-9);
    // A row without runs (a run that did not finish) gives no ratio.
    assert!(p99_ratios(&Value::Null, &fd).is_none());
    // The cell names the worst run beside the median.
    assert_eq!(
        ratio_cell(1.5, 0.8, 3, false),
        "1.50x (worst of 3 runs 0.80x)"
    );
    // Capacity takes the run with the median throughput the same way.
    let thr = |x: f64| json!({"throughput_rps": x});
    let cap = median_run(
        vec![thr(12.0), thr(10.0), thr(14.0)],
        "throughput_rps",
        "throughput_rounds_rps",
    );
    assert_eq!(cap["throughput_rps"], json!(12.0));
    assert_eq!(cap["throughput_rounds_rps"], json!([12.0, 10.0, 14.0]));
    // The load table shows every run's p99.
    let line = load_row(TARGET_LOAD, "flashdiff", 10.0, 12.0, 200, &fd);
    assert!(
        line.contains("| 3.00 (runs: 3.00 / 2.00 / 4.00) |"),
        "{line}"
    );
}

#[test]
fn every_flashdiff_row_and_the_close_others_run_again() {
    let base = RequestConfig::default();
    let list = servers(&base, &base);
    let by = |n: &str| list.iter().find(|s| s.name == n).unwrap();
    assert!(is_contender(by("flashdiff-one-level"), 1.0, 10.0));
    assert!(is_contender(by("teacache-fifo"), 10.0, 10.0));
    assert!(is_contender(by("full-fifo"), 7.5, 10.0));
    assert!(!is_contender(by("full-fifo"), 7.4, 10.0));
    assert!(!is_contender(by("distrifusion"), 4.0, 10.0));
}
