//! A vector computed as a whole at some steps and forecast at the others: what DBCache keeps
//! of the blocks it skips (their residual), at order 0 (reused as last computed), 1 or 2
//! (TaylorSeer's orders, in Newton's divided-difference form so that uneven gaps between
//! computations are exact for a line or a parabola).

use super::newton;

/// The last computed value, its first and second divided differences per step, the gap
/// between the last two computations and the step of the last.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Series {
    pub(super) base: Vec<f32>,
    /// First divided difference (empty at order 0).
    pub(super) slope: Vec<f32>,
    /// Second divided difference (empty below order 2).
    pub(super) curve: Vec<f32>,
    /// Steps between the last two computations (0: one computation so far).
    pub(super) gap: u32,
    pub(super) last: u32,
}

impl Series {
    /// A series computed once, at step `at`, forecast to `order` 0, 1 or 2.
    pub(super) fn start(values: Vec<f32>, at: u32, order: u8) -> Self {
        let n = values.len();
        Self {
            base: values,
            slope: if order >= 1 { vec![0.0; n] } else { Vec::new() },
            curve: if order >= 2 { vec![0.0; n] } else { Vec::new() },
            gap: 0,
            last: at,
        }
    }

    /// The order the series forecasts to.
    pub(super) fn order(&self) -> u8 {
        u8::from(!self.slope.is_empty()) + u8::from(!self.curve.is_empty())
    }

    /// Whether the series' parts agree with each other for an order and a width.
    pub(super) fn well_formed(&self, order: u8) -> bool {
        let n = self.base.len();
        self.order() == order
            && (self.slope.is_empty() || self.slope.len() == n)
            && (self.curve.is_empty() || self.curve.len() == n)
    }

    /// Takes the value computed at step `n` (after `last`).
    pub(super) fn update(&mut self, values: &[f32], n: u32) {
        let gap = n.saturating_sub(self.last).max(1) as f32;
        let before = self.gap as f32;
        newton::update(
            &mut self.base,
            &mut self.slope,
            &mut self.curve,
            values,
            gap,
            before,
        );
        self.gap = gap as u32;
        self.last = n;
    }

    /// Writes the forecast for step `n` (at or after `last`) into `out`.
    pub(super) fn predict(&self, n: u32, out: &mut [f32]) {
        let ahead = n.saturating_sub(self.last) as f32;
        newton::predict(
            out,
            &self.base,
            &self.slope,
            &self.curve,
            ahead,
            self.gap as f32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(series: &Series, n: u32) -> Vec<f32> {
        let mut out = vec![0.0; series.base.len()];
        series.predict(n, &mut out);
        out
    }

    /// A parabola in the step, computed at uneven gaps: order 2 follows it exactly from the
    /// third computation on, order 1 does not, order 0 stays at the last computed value.
    #[test]
    fn orders_follow_a_parabola_through_uneven_gaps() {
        let f = |n: u32| {
            let t = n as f32;
            vec![0.5 * t * t - 3.0 * t + 2.0, -0.25 * t * t + t]
        };
        let computed = [5u32, 7, 8, 12];
        let mut s: Vec<Series> = (0..3).map(|o| Series::start(f(5), 5, o)).collect();
        for &n in &computed[1..] {
            for x in &mut s {
                x.update(&f(n), n);
            }
        }
        for n in [13u32, 15, 20] {
            let (want, second, first, stale) = (f(n), at(&s[2], n), at(&s[1], n), at(&s[0], n));
            for i in 0..2 {
                assert!(
                    (second[i] - want[i]).abs() < 1e-2,
                    "order 2 at {n}: {second:?} vs {want:?}"
                );
            }
            assert!(
                (first[0] - want[0]).abs() > 0.5,
                "order 1 at {n} cannot bend"
            );
            assert_eq!(stale, f(12), "order 0 reuses the last computation");
        }
        assert_eq!(
            at(&s[2], 12),
            f(12),
            "at its last computation a forecast is that value"
        );
    }

    /// A line through uneven gaps is exact at order 1 after two computations.
    #[test]
    fn order_one_follows_a_line() {
        let f = |n: u32| vec![2.0 * n as f32 - 1.0];
        let mut s = Series::start(f(3), 3, 1);
        s.update(&f(7), 7);
        assert_eq!(at(&s, 10), f(10));
        assert!(s.well_formed(1) && !s.well_formed(2));
    }

    proptest::proptest! {
        /// For any polynomial of degree at most the order, computed at any increasing steps
        /// (at least order + 1 of them), the forecast at any later step is the polynomial's
        /// value; order 0 always gives the last computation.
        #[test]
        fn a_polynomial_of_the_order_is_forecast_exactly(
            order in 0u8..3,
            coef in proptest::collection::vec(-2.0f64..2.0, 3),
            gaps in proptest::collection::vec(1u32..5, 3..6),
            ahead in 1u32..6,
        ) {
            let f = |n: u32| {
                let t = n as f64 / 10.0;
                let mut v = coef[0];
                if order >= 1 { v += coef[1] * t; }
                if order >= 2 { v += coef[2] * t * t; }
                vec![v as f32]
            };
            let mut n = 2u32;
            let mut s = Series::start(f(n), n, order);
            for g in &gaps {
                n += g;
                s.update(&f(n), n);
            }
            proptest::prop_assert!(s.well_formed(order));
            let got = at(&s, n + ahead)[0];
            let want = if order == 0 { f(n)[0] } else { f(n + ahead)[0] };
            proptest::prop_assert!(
                (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "order {} at {}: {} against {}", order, n + ahead, got, want
            );
        }
    }
}
