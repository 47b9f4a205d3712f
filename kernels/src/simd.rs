//! Small pieces the fused kernels share: whether AVX2 is there, and reductions in a fixed
//! order of eight partial lanes (vectorisable, and the same result on every path).

/// Whether the CPU has AVX2 and FMA (detected once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_fma() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Sum of `x`: eight partial sums over consecutive lanes, then a fixed tree, then the tail.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut s = reduce8(&acc);
    for &v in chunks.remainder() {
        s += v;
    }
    s
}

/// Sum of the squares of `x`, in the order of [`sum`].
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l] * c[l];
        }
    }
    let mut s = reduce8(&acc);
    for &v in chunks.remainder() {
        s += v * v;
    }
    s
}

/// Largest value of `x` (NaN-free inputs), in eight lanes.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] = acc[l].max(c[l]);
        }
    }
    let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in chunks.remainder() {
        m = m.max(v);
    }
    m
}

#[inline(always)]
fn reduce8(a: &[f32; 8]) -> f32 {
    let s4 = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// Runs `$body` (an expression using only its arguments) compiled for AVX2 + FMA when the CPU
/// has them: `simd_fn!(name(args) { body })` defines `name` that dispatches between the two
/// compilations of the same body. Rust does not contract `a * b + c` into an FMA, so the two
/// give identical results.
macro_rules! simd_fn {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU supports AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                if $crate::simd::avx2_fma() {
                    // SAFETY: AVX2 and FMA were detected, the target features' only
                    // requirement.
                    unsafe { avx2($($arg),*) };
                    return;
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use simd_fn;

#[cfg(test)]
mod tests {
    #[test]
    fn reductions_match_plain_loops() {
        for n in [0usize, 1, 7, 8, 9, 100, 257] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32) - 5.0).collect();
            let plain: f32 = x.iter().sum();
            assert!((super::sum(&x) - plain).abs() < 1e-4, "sum of {n}");
            let top = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(super::max(&x), top, "max of {n}");
        }
    }
}
