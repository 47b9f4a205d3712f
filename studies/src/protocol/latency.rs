//! The protocol's comparison of two ways of serving the same trace: per-request latency,
//! paired request by request.
//!
//! Both ways serve the same arrivals and the same requests, in the same rounds (a round is one
//! pass over the trace, and the rounds of different ways alternate, so the machine's drift
//! falls on both). What A saves is B's latency minus A's, request by request. Its mean, and
//! the difference of the two p99s, get 95% intervals from a **circular block bootstrap**:
//! requests queued behind the same burst wait together, so their latencies are not
//! independent, and resampling single requests would give intervals too narrow. Blocks of
//! [`block_len`] consecutive requests are drawn within each round (with wrap-around), every
//! round contributing its own length, and both statistics are computed on the same resample.
//!
//! A is "ahead" when both intervals lie above zero (faster on average and at the tail, the
//! latency form of "a paired interval above zero and a higher worst prompt"), "behind"
//! symmetrically, and "level" otherwise.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Verdict, RESAMPLES};

/// A against B on the same trace: what A saves (B minus A, seconds), with 95% intervals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyPaired {
    /// Mean over the requests of B's latency minus A's.
    pub mean: f64,
    /// The low end of its interval.
    pub lo: f64,
    /// The high end of its interval.
    pub hi: f64,
    /// B's p99 minus A's p99, over every request of every round.
    pub p99: f64,
    /// The low end of its interval.
    pub p99_lo: f64,
    /// The high end of its interval.
    pub p99_hi: f64,
}

/// The blocks' length for a round of `n` requests: the square root, rounded, at least 1.
pub fn block_len(n: usize) -> usize {
    ((n as f64).sqrt().round() as usize).max(1)
}

/// The `q` quantile of `v` by nearest rank (q 0.99: the p99 the serving reports print).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() as f64 * q) as usize).min(s.len() - 1)]
}

/// A's and B's per-request latencies, round by round (`a[r][i]`: request i of round r),
/// compared (see the module docs); the resamples are drawn from `seed`. The error says why
/// the two cannot be paired.
pub fn paired_latency(a: &[Vec<f64>], b: &[Vec<f64>], seed: u64) -> Result<LatencyPaired, String> {
    if a.len() != b.len() {
        return Err(format!(
            "{} rounds against {}: a paired comparison needs the same rounds",
            a.len(),
            b.len()
        ));
    }
    if a.is_empty() || a.iter().all(Vec::is_empty) {
        return Err("no requests to compare".into());
    }
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        if x.len() != y.len() {
            return Err(format!(
                "round {r}: {} requests against {}: a paired comparison needs the same trace",
                x.len(),
                y.len()
            ));
        }
        if let Some(v) = x.iter().chain(y).find(|v| !v.is_finite() || **v < 0.0) {
            return Err(format!(
                "round {r}: a latency of {v}: every request needs a finite, non-negative time"
            ));
        }
    }
    let stats = |idx: &[(usize, usize)]| {
        let pa: Vec<f64> = idx.iter().map(|&(r, i)| a[r][i]).collect();
        let pb: Vec<f64> = idx.iter().map(|&(r, i)| b[r][i]).collect();
        let saved = pb.iter().zip(&pa).map(|(y, x)| y - x).sum::<f64>() / idx.len() as f64;
        (saved, quantile(&pb, 0.99) - quantile(&pa, 0.99))
    };
    let every: Vec<(usize, usize)> = a
        .iter()
        .enumerate()
        .flat_map(|(r, x)| (0..x.len()).map(move |i| (r, i)))
        .collect();
    let (mean, p99) = stats(&every);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means = Vec::with_capacity(RESAMPLES);
    let mut p99s = Vec::with_capacity(RESAMPLES);
    let mut idx = Vec::with_capacity(every.len());
    for _ in 0..RESAMPLES {
        idx.clear();
        for (r, x) in a.iter().enumerate() {
            let n = x.len();
            if n == 0 {
                continue;
            }
            let len = block_len(n);
            let mut drawn = 0;
            while drawn < n {
                let start = rng.random_range(0..n);
                for k in 0..len.min(n - drawn) {
                    idx.push((r, (start + k) % n));
                }
                drawn += len.min(n - drawn);
            }
        }
        let (m, p) = stats(&idx);
        means.push(m);
        p99s.push(p);
    }
    let interval = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
        (at(0.025), at(0.975))
    };
    let (lo, hi) = interval(&mut means);
    let (p99_lo, p99_hi) = interval(&mut p99s);
    Ok(LatencyPaired {
        mean,
        lo,
        hi,
        p99,
        p99_lo,
        p99_hi,
    })
}

/// What a latency comparison says of A against B: "ahead" when both intervals (mean saved,
/// p99 saved) lie above zero, "behind" when both lie below, else "level".
pub fn latency_verdict(p: &LatencyPaired) -> Verdict {
    if p.lo > 0.0 && p.p99_lo > 0.0 {
        Verdict::Ahead
    } else if p.hi < 0.0 && p.p99_hi < 0.0 {
        Verdict::Behind
    } else {
        Verdict::Level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A queue's latencies: bursts of slow requests among quick ones.
    fn trace(n: usize, phase: usize) -> Vec<f64> {
        (0..n)
            .map(|i| {
                0.2 + ((i + phase) % 17) as f64 * 0.05 + if (i / 20) % 3 == 0 { 0.8 } else { 0.0 }
            })
            .collect()
    }

    #[test]
    fn a_tie_is_level() {
        let a = vec![trace(100, 0), trace(100, 3)];
        let p = paired_latency(&a, &a, 1).unwrap();
        assert_eq!((p.mean, p.lo, p.hi, p.p99), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(latency_verdict(&p), Verdict::Level);
    }

    #[test]
    fn ahead_needs_both_the_mean_and_the_tail() {
        let b = vec![trace(120, 0), trace(120, 5)];
        let faster: Vec<Vec<f64>> = b
            .iter()
            .map(|r| r.iter().map(|x| x * 0.8).collect())
            .collect();
        let p = paired_latency(&faster, &b, 1).unwrap();
        assert!(p.lo > 0.0 && p.p99_lo > 0.0, "{p:?}");
        assert_eq!(latency_verdict(&p), Verdict::Ahead);
        assert_eq!(
            latency_verdict(&paired_latency(&b, &faster, 1).unwrap()),
            Verdict::Behind
        );
        // Faster on average, but a few requests far slower: the tail is worse, so level.
        let mut tail = faster.clone();
        for r in &mut tail {
            for x in r.iter_mut().step_by(25) {
                *x += 5.0;
            }
        }
        let p = paired_latency(&tail, &b, 1).unwrap();
        assert!(p.p99 < 0.0, "{p:?}");
        assert_eq!(latency_verdict(&p), Verdict::Level);
    }

    #[test]
    fn blocks_widen_the_interval_of_correlated_requests() {
        // The difference comes in long runs, as waits behind one burst do: resampling single
        // requests would call it precise; blocks must not.
        let b = vec![vec![1.0; 200]];
        let a = vec![(0..200)
            .map(|i| if (i / 40) % 2 == 0 { 0.7 } else { 1.25 })
            .collect::<Vec<f64>>()];
        let p = paired_latency(&a, &b, 3).unwrap();
        let iid_half_width = {
            let d: Vec<f64> = b[0].iter().zip(&a[0]).map(|(y, x)| y - x).collect();
            let m = d.iter().sum::<f64>() / d.len() as f64;
            let sd = (d.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (d.len() - 1) as f64).sqrt();
            1.96 * sd / (d.len() as f64).sqrt()
        };
        assert!(
            (p.hi - p.lo) / 2.0 > 1.5 * iid_half_width,
            "block interval {:?} against an iid half-width {iid_half_width}",
            (p.lo, p.hi)
        );
    }

    #[test]
    fn what_cannot_be_paired_is_refused() {
        let a = vec![trace(10, 0)];
        assert!(paired_latency(&a, &[trace(10, 0), trace(10, 0)], 1)
            .unwrap_err()
            .contains("same rounds"));
        assert!(paired_latency(&a, &[trace(9, 0)], 1)
            .unwrap_err()
            .contains("same trace"));
        assert!(paired_latency(&[vec![f64::NAN]], &[vec![1.0]], 1).is_err());
        assert!(paired_latency(&[vec![-1.0]], &[vec![1.0]], 1).is_err());
        assert!(paired_latency(&[], &[], 1).is_err());
        assert!(paired_latency(&[vec![]], &[vec![]], 1).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Swapping the two ways swaps the verdict and mirrors the intervals.
        #[test]
        fn the_verdict_is_antisymmetric(
            base in prop::collection::vec(0.05f64..3.0, 4..60),
            scale in 0.5f64..1.5,
            seed in 0u64..1000,
        ) {
            let a = vec![base.clone()];
            let b = vec![base.iter().enumerate().map(|(i, x)| x * scale + (i % 3) as f64 * 0.01).collect::<Vec<f64>>()];
            let p = paired_latency(&a, &b, seed).unwrap();
            let q = paired_latency(&b, &a, seed).unwrap();
            prop_assert!((p.mean + q.mean).abs() < 1e-9 && (p.p99 + q.p99).abs() < 1e-9);
            prop_assert!((p.lo + q.hi).abs() < 1e-9 && (p.hi + q.lo).abs() < 1e-9);
            let flipped = match latency_verdict(&p) {
                Verdict::Ahead => Verdict::Behind,
                Verdict::Behind => Verdict::Ahead,
                v => v,
            };
            prop_assert_eq!(latency_verdict(&q), flipped);
        }
    }
}
