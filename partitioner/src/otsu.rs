//! Otsu's threshold on a continuous map, through a fixed-size histogram.

/// Histogram bins: 256 as in Otsu's grey-level formulation; fine enough that the threshold
/// error (range / 256) is far below the focus/context contrast we act on.
pub const BINS: usize = 256;

/// Result of Otsu's method on a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Otsu {
    /// Values `>= threshold` form the focus class, the rest the context class.
    pub threshold: f32,
    /// Between-class variance over total variance, in `[0, 1]` (Otsu's eta): about 0.64 for
    /// Gaussian noise, 0.75 for uniform noise, near 1 for two well-separated modes.
    pub separability: f32,
}

/// Otsu's threshold over `values[i]` for `i` in `subset` (or all values when `subset` is
/// `None`): the cut that maximises between-class variance. `None` when all values are equal.
pub fn otsu(values: &[f32], subset: Option<&[u32]>) -> Option<Otsu> {
    match subset {
        Some(idx) => otsu_of(|| idx.iter().map(|&i| values[i as usize])),
        None => otsu_of(|| values.iter().copied()),
    }
}

fn otsu_of<I: Iterator<Item = f32>>(values: impl Fn() -> I) -> Option<Otsu> {
    let (lo, hi) = values().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let scale = BINS as f32 / (hi - lo);
    let mut hist = [0u32; BINS];
    for v in values() {
        hist[(((v - lo) * scale) as usize).min(BINS - 1)] += 1;
    }
    let (k, separability) = otsu_hist(&hist)?;
    Some(Otsu {
        threshold: lo + k as f32 / scale,
        separability,
    })
}

/// Otsu on a histogram: the first bin of the upper class (values in bins `>= k` form the
/// focus) and the separability. `None` when fewer than two bins are occupied.
pub(crate) fn otsu_hist(hist: &[u32; BINS]) -> Option<(usize, f32)> {
    let total: f64 = hist.iter().map(|&c| c as f64).sum();
    let sum_all: f64 = hist
        .iter()
        .enumerate()
        .map(|(b, &c)| b as f64 * c as f64)
        .sum();
    // Cut between bin k-1 and bin k: class C = bins < k, class F = bins >= k.
    let (mut best_k, mut best) = (0usize, -1.0f64);
    let (mut w_c, mut sum_c) = (0.0f64, 0.0f64);
    for k in 1..BINS {
        if hist[k - 1] == 0 {
            continue; // same classes as cut k - 1: never strictly better
        }
        w_c += hist[k - 1] as f64;
        sum_c += (k - 1) as f64 * hist[k - 1] as f64;
        let w_f = total - w_c;
        if w_c == 0.0 || w_f == 0.0 {
            continue;
        }
        let mu_c = sum_c / w_c;
        let mu_f = (sum_all - sum_c) / w_f;
        let between = w_c * w_f * (mu_c - mu_f).powi(2) / (total * total);
        if between > best {
            best = between;
            best_k = k;
        }
    }
    if best_k == 0 {
        return None;
    }
    let mean = sum_all / total;
    let var_total: f64 = hist
        .iter()
        .enumerate()
        .map(|(b, &c)| c as f64 * (b as f64 - mean).powi(2))
        .sum::<f64>()
        / total;
    let sep = if var_total > 0.0 {
        (best / var_total).clamp(0.0, 1.0) as f32
    } else {
        0.0
    };
    Some((best_k, sep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separates_two_modes() {
        let mut v = vec![0.1f32; 90];
        v.extend([0.9f32; 10]);
        let o = otsu(&v, None).unwrap();
        assert!(o.threshold > 0.1 && o.threshold <= 0.9, "{o:?}");
        assert!(o.separability > 0.99, "{o:?}");
        assert_eq!(v.iter().filter(|&&x| x >= o.threshold).count(), 10);
    }

    #[test]
    fn constant_has_no_threshold() {
        assert_eq!(otsu(&[0.3; 7], None), None);
        assert_eq!(otsu(&[0.3, 1.0, 0.3], Some(&[0, 2])), None);
    }

    #[test]
    fn uniform_noise_separability_is_about_three_quarters() {
        let v: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
        let o = otsu(&v, None).unwrap();
        assert!((o.separability - 0.75).abs() < 0.01, "{o:?}");
    }
}
