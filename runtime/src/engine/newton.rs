//! Newton's divided-difference forecast of one row of values computed at uneven steps: the
//! one forecaster behind every series the engine forecasts (a skipped token's velocity, a
//! skipped block's residual). The slices say the order: no slope, order 0 (the last value
//! reused); a slope and no curve, order 1; both, order 2 (the parabola through the last three
//! computations, exact for uneven gaps).

/// Takes the row `fresh` computed `gap` steps after the last computation (`base`), which came
/// `before` steps after the one before it (0: none): updates the first (`slope`) and second
/// (`curve`) divided differences per step and the base.
pub(super) fn update(
    base: &mut [f32],
    slope: &mut [f32],
    curve: &mut [f32],
    fresh: &[f32],
    gap: f32,
    before: f32,
) {
    let inv_gap = 1.0 / gap;
    if slope.is_empty() {
        base.copy_from_slice(fresh);
    } else if curve.is_empty() {
        for ((b, sl), &f) in base.iter_mut().zip(slope).zip(fresh) {
            *sl = (f - *b) * inv_gap;
            *b = f;
        }
    } else {
        // Computations at `n - gap - before`, `n - gap` (the base) and `n`.
        let to_curve = if before > 0.0 {
            1.0 / (gap + before)
        } else {
            0.0
        };
        for (((b, sl), c), &f) in base.iter_mut().zip(slope).zip(curve).zip(fresh) {
            let measured = (f - *b) * inv_gap;
            *c = (measured - *sl) * to_curve;
            *sl = measured;
            *b = f;
        }
    }
}

/// Writes into `out` the forecast `ahead` steps after the last computation, which came `gap`
/// steps after the one before it: `base + ahead slope (+ ahead (ahead + gap) curve)`.
pub(super) fn predict(
    out: &mut [f32],
    base: &[f32],
    slope: &[f32],
    curve: &[f32],
    ahead: f32,
    gap: f32,
) {
    if slope.is_empty() {
        out.copy_from_slice(base);
    } else if curve.is_empty() {
        for ((o, &b), &sl) in out.iter_mut().zip(base).zip(slope) {
            *o = b + ahead * sl;
        }
    } else {
        let bend = ahead * (ahead + gap);
        for (((o, &b), &sl), &c) in out.iter_mut().zip(base).zip(slope).zip(curve) {
            *o = b + ahead * sl + bend * c;
        }
    }
}

/// The forecast error had the row been forecast `gap` steps ahead instead of computed as
/// `fresh`: the squared difference and `fresh`'s squared norm, added to `err2` and `norm2`
/// (before [`update`] moves the row on).
pub(super) fn miss(
    base: &[f32],
    slope: &[f32],
    curve: &[f32],
    fresh: &[f32],
    gap: f32,
    before: f32,
    (err2, norm2): (&mut f64, &mut f64),
) {
    if curve.is_empty() {
        for ((&b, &sl), &f) in base.iter().zip(slope).zip(fresh) {
            let predicted = b + gap * sl;
            *err2 += ((f - predicted) as f64).powi(2);
            *norm2 += (f as f64).powi(2);
        }
    } else {
        for (((&b, &sl), &c), &f) in base.iter().zip(slope).zip(curve).zip(fresh) {
            let predicted = b + gap * sl + gap * (gap + before) * c;
            *err2 += ((f - predicted) as f64).powi(2);
            *norm2 += (f as f64).powi(2);
        }
    }
}
