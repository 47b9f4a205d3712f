//! The automatic choice between regional and whole-step execution.
//!
//! Regional execution (computing only the patches whose own change reached their budget) can
//! pay only where the patches change unevenly: where they move together, a computed step
//! needs them all and whole steps do as well with less bookkeeping. After the warm-up, from
//! the first step whose change it observes, a request measures how unevenly its patches
//! changed: the [`dispersion`], the coefficient of variation of the patches' relative
//! changes, each patch weighted by its share of the signal (as the budget weighs them). At
//! or above a threshold the request runs regionally, below it in whole steps ([`choose`]).
//!
//! ```
//! use flashdiff_gate::choice::{choose, dispersion, Execution};
//!
//! // Two equal patches, one still changing and one settled: uneven.
//! let d = dispersion(&[0.4, 0.0], &[1.0, 1.0])?;
//! assert_eq!(d, 1.0);
//! assert_eq!(choose(d, 0.5), Execution::Regional);
//! // Every patch changing alike: whole steps.
//! assert_eq!(dispersion(&[0.2, 0.2, 0.2], &[1.0, 2.0, 3.0])?, 0.0);
//! assert_eq!(choose(0.0, 0.5), Execution::WholeStep);
//! # Ok::<(), flashdiff_gate::GateError>(())
//! ```

use std::fmt;

use crate::GateError;

/// How a request runs its computed steps after the warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    /// A computed step runs only the patches at their budget; the others are forecast.
    Regional,
    /// A computed step runs every patch.
    WholeStep,
}

impl fmt::Display for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Execution::Regional => "regional",
            Execution::WholeStep => "whole-step",
        })
    }
}

/// The coefficient of variation of `change` (each patch's relative change, finite and >= 0)
/// weighted by `signal` (each patch's share of the signal, finite and >= 0): with `w_i =
/// signal_i / sum signal` and `m = sum w_i change_i`, `sqrt(sum w_i (change_i - m)^2) / m`;
/// 0 where nothing changed or there is no signal. The error names a bad value or a length
/// mismatch.
pub fn dispersion(change: &[f32], signal: &[f32]) -> Result<f32, GateError> {
    if change.len() != signal.len() {
        return Err(GateError::BadBuffer {
            expected: change.len(),
            got: signal.len(),
        });
    }
    let bad = |v: f32| !v.is_finite() || v < 0.0;
    if let Some((patch, &value)) = change.iter().enumerate().find(|(_, &v)| bad(v)) {
        return Err(GateError::BadChange { patch, value });
    }
    if let Some((patch, &value)) = signal.iter().enumerate().find(|(_, &v)| bad(v)) {
        return Err(GateError::BadSignal { patch, value });
    }
    let total: f64 = signal.iter().map(|&s| s as f64).sum();
    if total <= 0.0 {
        return Ok(0.0);
    }
    let w = |i: usize| signal[i] as f64 / total;
    let m: f64 = (0..change.len()).map(|i| w(i) * change[i] as f64).sum();
    if m <= 0.0 {
        return Ok(0.0);
    }
    let var: f64 = (0..change.len())
        .map(|i| w(i) * (change[i] as f64 - m).powi(2))
        .sum();
    Ok((var.sqrt() / m) as f32)
}

/// Regional execution at or above `threshold`, whole steps below it.
pub fn choose(dispersion: f32, threshold: f32) -> Execution {
    if dispersion >= threshold {
        Execution::Regional
    } else {
        Execution::WholeStep
    }
}
