//! The verdict protocol every comparison of methods uses.
//!
//! - Each method has its own candidate settings, the same number for every method (at most
//!   [`MAX_CANDIDATES`]), drawn from the same knob kinds where they apply.
//! - Each runs on **validation prompts**, a seed range no report shows. For each target work
//!   level a method's setting is the one whose validation work is at or under the target
//!   with the highest validation mean; of equal means, the cheaper ([`choose`]).
//! - The chosen settings run once on **test prompts**, a seed range that does not meet the
//!   validation range ([`Split`]).
//! - Two methods at a target are compared prompt by prompt ([`compare`]): the mean paired
//!   difference with a seeded 95% bootstrap interval ([`RESAMPLES`] resamples) and the
//!   difference of their worst prompts. "ahead" only when the interval lies above
//!   [`MARGIN_DB`] and the worst prompt is higher; "behind" symmetrically; otherwise
//!   "level". Two methods whose mean test work differs by more than [`WORK_MATCH`] are "not
//!   matched", unless the one with less work is ahead anyway.
//!
//! Ways of serving the same trace are compared request by request in the same way
//! ([`latency`]): what one saves over the other, mean and p99, with block-bootstrap intervals.
//!
//! Nothing here runs a model: the studies measure, this module decides, so its rules can be
//! tested apart from any model.

use std::fmt;
use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub mod latency;

/// The work levels an image or TinyFLUX comparison is judged at.
pub const IMAGE_TARGETS: [f64; 4] = [0.2, 0.25, 0.33, 0.5];

/// The work levels a sound or video comparison is judged at.
pub const MEDIA_TARGETS: [f64; 3] = [0.3, 0.4, 0.5];

/// The most candidate settings a method may have.
pub const MAX_CANDIDATES: usize = 32;

/// Bootstrap resamples behind an interval.
pub const RESAMPLES: usize = 10_000;

/// How far above zero (dB) a paired interval must lie for "ahead".
pub const MARGIN_DB: f64 = 0.1;

/// The largest difference of mean test work at which two methods are compared as equals
/// (a difference within 1e-9 of it counts as equal to it: 0.32 - 0.30 is 0.02 in the
/// protocol, though not in binary floating point).
pub const WORK_MATCH: f64 = 0.02;

/// The prompts' seeds: validation (choosing settings) and test (reporting), never the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    validation: Range<u64>,
    test: Range<u64>,
}

impl Split {
    /// The error says which range is empty or where the two meet.
    pub fn new(validation: Range<u64>, test: Range<u64>) -> Result<Split, String> {
        for (name, r) in [("validation", &validation), ("test", &test)] {
            if r.is_empty() {
                return Err(format!("the {name} seeds {r:?} are empty"));
            }
        }
        if validation.start < test.end && test.start < validation.end {
            return Err(format!(
                "the validation seeds {validation:?} and the test seeds {test:?} overlap: a \
                 setting chosen on a prompt would be judged on it"
            ));
        }
        Ok(Split { validation, test })
    }

    /// `validation` prompts from `seed`, then `test` prompts right after them.
    pub fn consecutive(seed: u64, validation: u32, test: u32) -> Result<Split, String> {
        let v_end = seed
            .checked_add(validation as u64)
            .ok_or("the seeds run past u64::MAX")?;
        let t_end = v_end
            .checked_add(test as u64)
            .ok_or("the seeds run past u64::MAX")?;
        Split::new(seed..v_end, v_end..t_end)
    }

    /// The seeds that choose each method's settings.
    pub fn validation(&self) -> Range<u64> {
        self.validation.clone()
    }

    /// The seeds the chosen settings are judged on.
    pub fn test(&self) -> Range<u64> {
        self.test.clone()
    }
}

/// Checks that every method has the same number of candidates, at most [`MAX_CANDIDATES`];
/// returns that number. `grids`: each method's name and candidate count.
pub fn equal_tries(grids: &[(&str, usize)]) -> Result<usize, String> {
    let Some(&(first, n)) = grids.first() else {
        return Err("no methods".into());
    };
    if n == 0 || n > MAX_CANDIDATES {
        return Err(format!(
            "{first} has {n} candidate settings: each method needs 1 to {MAX_CANDIDATES}"
        ));
    }
    match grids.iter().find(|&&(_, m)| m != n) {
        Some(&(other, m)) => Err(format!(
            "{first} has {n} candidate settings and {other} {m}: every method gets the same \
             number of tries"
        )),
        None => Ok(n),
    }
}

/// One setting's results, prompt by prompt in seed order: its work (share of full
/// computation's model work) and its fidelity to full computation (dB).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerPrompt {
    /// Work per prompt.
    pub work: Vec<f64>,
    /// Fidelity per prompt (dB).
    pub db: Vec<f64>,
}

impl PerPrompt {
    /// Adds the next prompt's result.
    pub fn push(&mut self, work: f64, db: f64) {
        self.work.push(work);
        self.db.push(db);
    }

    /// Mean work over the prompts.
    pub fn mean_work(&self) -> f64 {
        mean(&self.work)
    }

    /// The most work of one prompt.
    pub fn max_work(&self) -> f64 {
        self.work.iter().copied().fold(f64::NAN, f64::max)
    }

    /// Mean fidelity over the prompts.
    pub fn mean_db(&self) -> f64 {
        mean(&self.db)
    }

    /// The worst prompt's fidelity.
    pub fn worst_db(&self) -> f64 {
        self.db.iter().copied().fold(f64::NAN, f64::min)
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The candidate a method runs at `target`: among those whose mean validation work is at
/// or under the target, the highest mean validation fidelity; of equal means, the least
/// work; of equal work too, the first. `None` when no candidate is that cheap. A candidate
/// with a non-finite work or mean is never chosen.
pub fn choose(validation: &[PerPrompt], target: f64) -> Option<usize> {
    validation
        .iter()
        .enumerate()
        .map(|(i, c)| (i, c.mean_work(), c.mean_db()))
        .filter(|&(_, w, m)| w.is_finite() && m.is_finite() && w <= target)
        .min_by(|a, b| b.2.total_cmp(&a.2).then(a.1.total_cmp(&b.1)))
        .map(|(i, _, _)| i)
}

/// A paired comparison of method A against method B on the same prompts (A minus B).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// The mean per-prompt difference (dB).
    pub mean: f64,
    /// The low end of its 95% bootstrap interval.
    pub lo: f64,
    /// The high end of that interval.
    pub hi: f64,
    /// A's worst prompt minus B's worst prompt (dB).
    pub worst: f64,
}

/// The paired difference of `a` and `b` (the same prompts in the same order) with its 95%
/// bootstrap interval from [`RESAMPLES`] resamples drawn from `seed` (percentile method).
/// The error says why the two cannot be paired.
pub fn paired(a: &[f64], b: &[f64], seed: u64) -> Result<Paired, String> {
    if a.len() != b.len() {
        return Err(format!(
            "{} prompts against {}: a paired comparison needs the same prompts",
            a.len(),
            b.len()
        ));
    }
    if a.is_empty() {
        return Err("no prompts to compare".into());
    }
    if let Some(x) = a.iter().chain(b).find(|x| !x.is_finite()) {
        return Err(format!(
            "a fidelity of {x}: every prompt needs a finite value"
        ));
    }
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let n = d.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| d[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    let worst = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Paired {
        mean: mean(&d),
        lo: at(0.025),
        hi: at(0.975),
        worst: worst(a) - worst(b),
    })
}

/// What a comparison says of A against B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A's interval lies above the margin and its worst prompt is higher.
    Ahead,
    /// B is ahead of A.
    Behind,
    /// Neither is ahead.
    Level,
    /// Their work differs by more than [`WORK_MATCH`] and the cheaper one is not ahead.
    NotMatched,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ahead => "ahead",
            Verdict::Behind => "behind",
            Verdict::Level => "level",
            Verdict::NotMatched => "not matched",
        })
    }
}

/// The quality verdict of a paired comparison, work aside: "ahead" when the interval lies
/// above [`MARGIN_DB`] and the worst prompt is higher, "behind" symmetrically, else "level".
pub fn quality_verdict(p: &Paired) -> Verdict {
    if p.lo > MARGIN_DB && p.worst > 0.0 {
        Verdict::Ahead
    } else if p.hi < -MARGIN_DB && p.worst < 0.0 {
        Verdict::Behind
    } else {
        Verdict::Level
    }
}

/// A against B on the same test prompts: the paired difference and the verdict, work
/// included (see the module docs).
pub fn compare(a: &PerPrompt, b: &PerPrompt, seed: u64) -> Result<(Paired, Verdict), String> {
    let p = paired(&a.db, &b.db, seed)?;
    let q = quality_verdict(&p);
    let (wa, wb) = (a.mean_work(), b.mean_work());
    let v = if (wa - wb).abs() <= WORK_MATCH + 1e-9
        || (wa < wb && q == Verdict::Ahead)
        || (wb < wa && q == Verdict::Behind)
    {
        q
    } else {
        Verdict::NotMatched
    };
    Ok((p, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pp(work: f64, db: &[f64]) -> PerPrompt {
        PerPrompt {
            work: vec![work; db.len()],
            db: db.to_vec(),
        }
    }

    /// A spread of prompts: 40 dB give or take a few.
    fn spread(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| 40.0 + ((i * 7919) % 13) as f64 * 0.7)
            .collect()
    }

    #[test]
    fn a_tie_is_level() {
        let a = spread(32);
        let (p, v) = compare(&pp(0.3, &a), &pp(0.3, &a), 1).unwrap();
        assert_eq!((p.mean, p.lo, p.hi, p.worst), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(v, Verdict::Level);
        // A difference smaller than the margin, on every prompt, is level too.
        let b: Vec<f64> = a.iter().map(|x| x - 0.05).collect();
        assert_eq!(
            compare(&pp(0.3, &a), &pp(0.3, &b), 1).unwrap().1,
            Verdict::Level
        );
    }

    #[test]
    fn ahead_needs_the_interval_above_the_margin_and_a_higher_worst_prompt() {
        let b = spread(32);
        let a: Vec<f64> = b.iter().map(|x| x + 1.0).collect();
        assert_eq!(
            compare(&pp(0.3, &a), &pp(0.3, &b), 1).unwrap().1,
            Verdict::Ahead
        );
        assert_eq!(
            compare(&pp(0.3, &b), &pp(0.3, &a), 1).unwrap().1,
            Verdict::Behind
        );
        // Ahead on the mean, but its worst prompt is lower: level.
        let mut c = a.clone();
        let low = b.iter().copied().fold(f64::INFINITY, f64::min) - 0.5;
        c[3] = low;
        let (p, v) = compare(&pp(0.3, &c), &pp(0.3, &b), 1).unwrap();
        assert!(p.lo > MARGIN_DB, "{p:?}");
        assert!(p.worst < 0.0);
        assert_eq!(v, Verdict::Level);
        // Ahead on average, but the interval reaches below the margin: level.
        let d: Vec<f64> = b
            .iter()
            .enumerate()
            .map(|(i, x)| x + if i % 2 == 0 { 3.0 } else { -2.5 })
            .collect();
        let (p, v) = compare(&pp(0.3, &d), &pp(0.3, &b), 1).unwrap();
        assert!(p.mean > MARGIN_DB && p.lo <= MARGIN_DB, "{p:?}");
        assert_eq!(v, Verdict::Level);
    }

    #[test]
    fn unequal_work_is_not_matched_unless_the_cheaper_is_ahead() {
        let b = spread(16);
        let a: Vec<f64> = b.iter().map(|x| x + 1.0).collect();
        // The better one did more work: not matched.
        assert_eq!(
            compare(&pp(0.33, &a), &pp(0.30, &b), 1).unwrap().1,
            Verdict::NotMatched
        );
        assert_eq!(
            compare(&pp(0.30, &b), &pp(0.33, &a), 1).unwrap().1,
            Verdict::NotMatched
        );
        // The better one did less work: its verdict stands either way round.
        assert_eq!(
            compare(&pp(0.28, &a), &pp(0.33, &b), 1).unwrap().1,
            Verdict::Ahead
        );
        assert_eq!(
            compare(&pp(0.33, &b), &pp(0.28, &a), 1).unwrap().1,
            Verdict::Behind
        );
        // Within the match, the verdict is the quality's.
        assert_eq!(
            compare(&pp(0.315, &a), &pp(0.30, &b), 1).unwrap().1,
            Verdict::Ahead
        );
        // Level at unequal work is not matched.
        assert_eq!(
            compare(&pp(0.28, &b), &pp(0.33, &b), 1).unwrap().1,
            Verdict::NotMatched
        );
        // Work 0.30 against 0.32 differs by the limit itself (0.020000000000000018 in f64):
        // matched, either way round; a hair more is not.
        assert_eq!(
            compare(&pp(0.32, &a), &pp(0.30, &b), 1).unwrap().1,
            Verdict::Ahead
        );
        assert_eq!(
            compare(&pp(0.30, &b), &pp(0.32, &a), 1).unwrap().1,
            Verdict::Behind
        );
        assert_eq!(
            compare(&pp(0.3201, &a), &pp(0.30, &b), 1).unwrap().1,
            Verdict::NotMatched
        );
    }

    #[test]
    fn validation_and_test_seeds_never_overlap() {
        assert!(Split::new(0..10, 10..20).is_ok());
        assert!(Split::new(100..110, 0..64).is_ok());
        for (v, t) in [(0..10, 9..20), (5..6, 0..64), (0..64, 63..64), (3..9, 3..9)] {
            let e = Split::new(v, t).unwrap_err();
            assert!(e.contains("overlap"), "{e}");
        }
        assert!(Split::new(0..0, 1..2).unwrap_err().contains("empty"));
        let s = Split::consecutive(1000, 16, 64).unwrap();
        assert_eq!((s.validation(), s.test()), (1000..1016, 1016..1080));
        assert!(Split::consecutive(u64::MAX - 3, 2, 2).is_err());
    }

    #[test]
    fn every_method_gets_the_same_number_of_tries() {
        assert_eq!(equal_tries(&[("a", 24), ("b", 24), ("c", 24)]), Ok(24));
        let e = equal_tries(&[("a", 24), ("b", 23)]).unwrap_err();
        assert!(e.contains("b 23"), "{e}");
        assert!(equal_tries(&[("a", 33), ("b", 33)]).is_err());
        assert!(equal_tries(&[("a", 0)]).is_err());
        assert!(equal_tries(&[]).is_err());
    }

    #[test]
    fn the_choice_is_the_best_mean_at_or_under_the_target_and_cheaper_on_ties() {
        let c = [
            pp(0.19, &[30.0, 32.0]),
            pp(0.25, &[35.0, 35.0]),
            pp(0.24, &[35.0, 35.0]),
            pp(0.26, &[50.0, 50.0]),
            pp(0.20, &[f64::NAN, 60.0]),
        ];
        assert_eq!(choose(&c, 0.25), Some(2));
        assert_eq!(choose(&c, 0.2), Some(0));
        assert_eq!(choose(&c, 0.5), Some(3));
        assert_eq!(choose(&c, 0.1), None);
    }

    #[test]
    fn the_interval_is_seeded_and_holds_the_mean() {
        let b = spread(24);
        let a: Vec<f64> = b
            .iter()
            .enumerate()
            .map(|(i, x)| x + (i % 5) as f64 * 0.3 - 0.4)
            .collect();
        let p = paired(&a, &b, 7).unwrap();
        assert_eq!(p, paired(&a, &b, 7).unwrap());
        assert!(p.lo < p.mean && p.mean < p.hi, "{p:?}");
        assert!(paired(&a, &b[1..], 7).unwrap_err().contains("same prompts"));
        assert!(paired(&[f64::NAN], &[1.0], 7).is_err());
        assert!(paired(&[], &[], 7).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Swapping the two methods swaps the verdict: A ahead of B is B behind A.
        #[test]
        fn the_verdict_is_antisymmetric(
            a in prop::collection::vec(0.0f64..80.0, 2..24),
            shift in -3.0f64..3.0,
            wa in 0.1f64..0.6,
            wb in 0.1f64..0.6,
            seed in 0u64..1000,
        ) {
            let b: Vec<f64> = a.iter().enumerate().map(|(i, x)| x + shift + (i % 3) as f64 * 0.2).collect();
            let (p, v) = compare(&pp(wa, &a), &pp(wb, &b), seed).unwrap();
            let (q, w) = compare(&pp(wb, &b), &pp(wa, &a), seed).unwrap();
            prop_assert!((p.mean + q.mean).abs() < 1e-9);
            prop_assert!((p.lo + q.hi).abs() < 1e-9 && (p.hi + q.lo).abs() < 1e-9);
            let flipped = match v {
                Verdict::Ahead => Verdict::Behind,
                Verdict::Behind => Verdict::Ahead,
                other => other,
            };
            prop_assert_eq!(w, flipped);
            prop_assert!(v != Verdict::Ahead || (p.lo > MARGIN_DB && p.worst > 0.0));
        }

        /// The chosen setting is never over the target and no candidate under it is better.
        #[test]
        fn the_choice_is_within_the_target_and_best(
            c in prop::collection::vec((0.05f64..1.0, 10.0f64..60.0), 1..32),
            target in 0.05f64..1.0,
        ) {
            let cands: Vec<PerPrompt> = c.iter().map(|&(w, d)| pp(w, &[d])).collect();
            match choose(&cands, target) {
                Some(i) => {
                    prop_assert!(cands[i].mean_work() <= target);
                    for o in cands.iter().filter(|o| o.mean_work() <= target) {
                        prop_assert!(o.mean_db() <= cands[i].mean_db());
                    }
                }
                None => prop_assert!(cands.iter().all(|o| o.mean_work() > target)),
            }
        }
    }
}
