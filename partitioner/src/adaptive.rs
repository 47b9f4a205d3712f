//! Adaptive patch granularity (§4.1): a bounded binary search over R on observed cost.
//!
//! The paper observes a unimodal cost profile in R (more patches expose more skipping until
//! cross-patch overhead and fragmentation dominate). On a unimodal function the discrete
//! minimum lies left of `m + 1` when `cost(m) <= cost(m + 1)` and right of `m` otherwise, so
//! comparing neighbours halves the interval: `ceil(log2(R_max - R_min + 1))` comparisons.
//! Once converged the controller keeps an exponential average of the cost at its R and
//! searches again when it drifts (the workload changed) or after `recheck_every` requests.

use crate::PartitionError;

/// Controller settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GranularityConfig {
    /// Smallest R (the design: 2).
    pub r_min: u32,
    /// Largest R (the design: 16).
    pub r_max: u32,
    /// Observations averaged per probed R, against noise in single requests.
    pub samples_per_probe: u32,
    /// Converged observations after which the search restarts anyway.
    pub recheck_every: u32,
    /// Relative drift of the averaged cost from its converged value that restarts the search.
    pub drift: f64,
}

impl Default for GranularityConfig {
    fn default() -> Self {
        Self {
            r_min: 2,
            r_max: 16,
            samples_per_probe: 3,
            recheck_every: 256,
            drift: 0.25,
        }
    }
}

/// The cost the controller minimises for one request: latency inflated by quality loss,
/// `latency_s * (1 + weight * max(quality_drop, 0))` (quality drop e.g. in dB of PSNR).
pub fn objective(latency_s: f64, quality_drop: f64, weight: f64) -> f64 {
    latency_s * (1.0 + weight * quality_drop.max(0.0))
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Measuring `m` (first) then `m + 1` inside `[lo, hi]`.
    Search {
        lo: u32,
        hi: u32,
        second: bool,
        sum: [f64; 2],
        n: u32,
    },
    Converged {
        r: u32,
        baseline: f64,
        avg: f64,
        seen: u32,
    },
}

/// Online controller for the patch count R.
#[derive(Debug, Clone, PartialEq)]
pub struct GranularityController {
    cfg: GranularityConfig,
    phase: Phase,
    searches: u32,
}

impl GranularityController {
    /// A controller searching `[r_min, r_max]`.
    pub fn new(cfg: GranularityConfig) -> Result<Self, PartitionError> {
        if cfg.r_min == 0 || cfg.r_min > cfg.r_max {
            return Err(PartitionError::BadConfig(format!(
                "need 1 <= r_min <= r_max, got r_min {} r_max {}",
                cfg.r_min, cfg.r_max
            )));
        }
        if cfg.samples_per_probe == 0 || cfg.recheck_every == 0 {
            return Err(PartitionError::BadConfig(
                "samples_per_probe and recheck_every must be >= 1".into(),
            ));
        }
        if !(cfg.drift.is_finite() && cfg.drift > 0.0) {
            return Err(PartitionError::BadConfig(format!(
                "drift {} must be finite and > 0",
                cfg.drift
            )));
        }
        let mut c = Self {
            cfg,
            phase: Phase::Converged {
                r: cfg.r_min,
                baseline: 0.0,
                avg: 0.0,
                seen: 0,
            },
            searches: 0,
        };
        c.restart();
        Ok(c)
    }

    fn restart(&mut self) {
        self.searches += 1;
        self.phase = Phase::Search {
            lo: self.cfg.r_min,
            hi: self.cfg.r_max,
            second: false,
            sum: [0.0; 2],
            n: 0,
        };
        self.settle();
    }

    /// A search interval of one value has converged.
    fn settle(&mut self) {
        if let Phase::Search { lo, hi, .. } = self.phase {
            if lo == hi {
                self.phase = Phase::Converged {
                    r: lo,
                    baseline: f64::NAN,
                    avg: f64::NAN,
                    seen: 0,
                };
            }
        }
    }

    /// The R to use for the next request.
    pub fn current(&self) -> u32 {
        match self.phase {
            Phase::Search { lo, hi, second, .. } => {
                let m = lo + (hi - lo) / 2;
                m + second as u32
            }
            Phase::Converged { r, .. } => r,
        }
    }

    /// Whether the search has converged (the controller is exploiting one R).
    pub fn converged(&self) -> bool {
        matches!(self.phase, Phase::Converged { .. })
    }

    /// Searches started so far (1 after construction).
    pub fn searches(&self) -> u32 {
        self.searches
    }

    /// Feeds the cost (lower is better, see [`objective`]) of a request served with `r`
    /// patches. Observations for an R other than [`current`](Self::current) are ignored
    /// (requests still in flight from an earlier probe); returns whether it was used.
    pub fn observe(&mut self, r: u32, cost: f64) -> Result<bool, PartitionError> {
        if !cost.is_finite() || cost < 0.0 {
            return Err(PartitionError::BadConfig(format!(
                "cost {cost} must be finite and >= 0"
            )));
        }
        if r != self.current() {
            return Ok(false);
        }
        let samples = self.cfg.samples_per_probe;
        match &mut self.phase {
            Phase::Search {
                lo,
                hi,
                second,
                sum,
                n,
            } => {
                sum[*second as usize] += cost;
                *n += 1;
                if *n == samples {
                    *n = 0;
                    if !*second {
                        *second = true;
                    } else {
                        let m = *lo + (*hi - *lo) / 2;
                        if sum[0] <= sum[1] {
                            *hi = m;
                        } else {
                            *lo = m + 1;
                        }
                        *second = false;
                        *sum = [0.0; 2];
                    }
                }
                self.settle();
            }
            Phase::Converged {
                baseline,
                avg,
                seen,
                ..
            } => {
                *seen += 1;
                if baseline.is_nan() {
                    *baseline = cost;
                    *avg = cost;
                } else {
                    *avg = 0.8 * *avg + 0.2 * cost;
                }
                let drifted = (*avg - *baseline).abs() > self.cfg.drift * baseline.max(1e-12);
                if drifted || *seen >= self.cfg.recheck_every {
                    self.restart();
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: &mut GranularityController, f: impl Fn(u32) -> f64, n: usize) {
        for _ in 0..n {
            let r = c.current();
            c.observe(r, f(r)).unwrap();
        }
    }

    #[test]
    fn converges_to_the_minimum_of_a_unimodal_cost() {
        for opt in 2..=16u32 {
            let mut c = GranularityController::new(GranularityConfig::default()).unwrap();
            run(&mut c, |r| 1.0 + (r as f64 - opt as f64).powi(2), 30);
            assert!(c.converged());
            assert_eq!(c.current(), opt);
        }
    }

    #[test]
    fn refuses_bad_settings_and_costs() {
        let bad = GranularityConfig {
            r_min: 9,
            r_max: 4,
            ..Default::default()
        };
        assert!(GranularityController::new(bad).is_err());
        let mut c = GranularityController::new(GranularityConfig::default()).unwrap();
        assert!(c.observe(c.current(), f64::NAN).is_err());
        assert_eq!(c.observe(999, 1.0), Ok(false));
    }
}
