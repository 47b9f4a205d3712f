use crate::{check_epsilon, GateError};

/// Load-adaptive ε (§4.3: "under low serving loads, FlashDiff will automatically prioritize
/// quality"). `load` is demand over capacity (queued + running work / what the workers can do
/// in the same time; 1.0 = saturated). ε is `eps_min` up to `low`, rises linearly to
/// `eps_base` at load 1, and on to `eps_max` at `high`; it never leaves `[eps_min, eps_max]`
/// and never decreases as load grows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAdaptiveEpsilon {
    /// ε with slack (quality first).
    pub eps_min: f32,
    /// ε at exactly full load.
    pub eps_base: f32,
    /// ε under overload (throughput first).
    pub eps_max: f32,
    /// Load at and below which ε is `eps_min` (in `[0, 1)`).
    pub low: f32,
    /// Load at and above which ε is `eps_max` (> 1).
    pub high: f32,
}

impl Default for LoadAdaptiveEpsilon {
    fn default() -> Self {
        Self {
            eps_min: 0.01,
            eps_base: crate::DEFAULT_EPSILON,
            eps_max: 0.1,
            low: 0.5,
            high: 1.5,
        }
    }
}

impl LoadAdaptiveEpsilon {
    /// Validates the bounds: `0 <= eps_min <= eps_base <= eps_max <= 1`, `0 <= low < 1 < high`.
    pub fn validate(&self) -> Result<(), GateError> {
        for e in [self.eps_min, self.eps_base, self.eps_max] {
            check_epsilon(e)?;
        }
        if !(self.eps_min <= self.eps_base && self.eps_base <= self.eps_max) {
            return Err(GateError::BadEpsilon(self.eps_base));
        }
        if !(self.low >= 0.0 && self.low < 1.0 && self.high > 1.0 && self.high.is_finite()) {
            return Err(GateError::BadEpsilon(f32::NAN));
        }
        Ok(())
    }

    /// ε for a measured load, refusing a NaN, infinite or negative one.
    pub fn try_epsilon(&self, load: f32) -> Result<f32, GateError> {
        if !(load.is_finite() && load >= 0.0) {
            return Err(GateError::BadLoad(load));
        }
        Ok(self.epsilon(load))
    }

    /// ε for the given load; NaN or negative load counts as idle, +inf as overload.
    pub fn epsilon(&self, load: f32) -> f32 {
        let load = if load.is_nan() { 0.0 } else { load.max(0.0) };
        let lerp = |a: f32, b: f32, t: f32| a + (b - a) * t.clamp(0.0, 1.0);
        let e = if load <= self.low {
            self.eps_min
        } else if load <= 1.0 {
            lerp(
                self.eps_min,
                self.eps_base,
                (load - self.low) / (1.0 - self.low),
            )
        } else {
            lerp(
                self.eps_base,
                self.eps_max,
                (load - 1.0) / (self.high - 1.0),
            )
        };
        e.clamp(self.eps_min, self.eps_max)
    }
}
