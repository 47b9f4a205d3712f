/// `e^x` for f32 without a libm call, so loops over slices vectorise: Cody-Waite reduction
/// `x = n ln2 + r` with `|r| <= ln2 / 2`, a degree-6 Taylor polynomial for `e^r` (truncation
/// below 2e-7 relative there), and `2^n` built in the exponent bits. Inputs are clamped to
/// [-87, 88] (results stay normal and finite).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by adding and subtracting 1.5 * 2^23 (valid for |t| < 2^22; here
    // |t| < 128): baseline x86-64 has no SSE4.1 round, and a libm call would stop the loops
    // from vectorising.
    const MAGIC: f32 = 12_582_912.0;
    let t = x * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n from t's bits: t = 1.5 * 2^23 + n with |n| < 128 lies in one binade of unit step, so
    // its bits are those of 1.5 * 2^23 plus n. Integer lane ops only (a float-to-int `as`
    // saturates lane by lane in scalar code and stopped the loops from vectorising).
    let biased = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// GELU, tanh approximation (PyTorch `approximate="tanh"`), in place, computed as
/// `u * sigmoid(2 z)` with `z = sqrt(2/pi) (u + 0.044715 u^3)`, which equals
/// `0.5 u (1 + tanh z)` and needs one exponential.
pub fn gelu_tanh_f32(x: &mut [f32]) {
    gelu_body(x)
}

crate::simd::simd_fn! {
    fn gelu_body(x: &mut [f32]) {
        const C: f32 = 0.797_884_6; // sqrt(2 / pi)
        for v in x {
            let u = *v;
            let z = C * (u + 0.044_715 * u * u * u);
            *v = u / (1.0 + exp_f32(-2.0 * z));
        }
    }
}

/// SiLU, `x * sigmoid(x)`, in place.
pub fn silu_f32(x: &mut [f32]) {
    silu_body(x)
}

crate::simd::simd_fn! {
    fn silu_body(x: &mut [f32]) {
        for v in x {
            *v /= 1.0 + exp_f32(-*v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0.0f32;
        for i in -87_000..88_000 {
            let x = i as f32 / 1000.0;
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max((a - b).abs() / b);
        }
        assert!(worst < 5e-7, "exp_f32 relative error {worst}");
        assert!(exp_f32(1000.0).is_finite() && exp_f32(-1000.0) > 0.0);
    }

    #[test]
    fn exp_scale_from_bits_is_two_to_the_n() {
        // Every n the clamped range reaches, from both rounding sides: the scale read from the
        // rounding constant's bits is 2^n exactly, so exp_f32 equals p * 2^n built by a cast.
        const MAGIC: f32 = 12_582_912.0;
        for i in -8_700..=8_800 {
            let x = (i as f32 / 100.0).clamp(-87.0, 88.0);
            let t = x * std::f32::consts::LOG2_E + MAGIC;
            let n = (t - MAGIC) as i32;
            let biased = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127);
            assert_eq!(biased, (n + 127) as u32, "x {x}");
            assert_eq!(f32::from_bits(biased << 23), 2f32.powi(n), "x {x}");
        }
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
