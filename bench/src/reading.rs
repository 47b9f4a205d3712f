//! How a quality-against-work curve is read: each method's settings, the knob lines through
//! them, the curve's value at a work level, and FlashDiff's worst margin over another curve.

/// The knob lines a setting lies on, from its label: a label of several `name value` pairs
/// ("ε 0.1 K 3") lies on one line per name, the line along which that value changes and the
/// others stay ("ε at K 3" and "K at ε 0.1"); any other label (one value: "0.1", "F 0.3",
/// "20 steps") on the method's one line.
pub fn knob_lines(label: &str) -> Vec<String> {
    let words: Vec<&str> = label.split_whitespace().collect();
    if words.len() < 4 || words.len() % 2 != 0 {
        return vec![String::new()];
    }
    let pairs: Vec<(&str, &str)> = words.chunks(2).map(|p| (p[0], p[1])).collect();
    (0..pairs.len())
        .map(|i| {
            let fixed: Vec<String> = pairs
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, (n, v))| format!("{n} {v}"))
                .collect();
            format!("{} at {}", pairs[i].0, fixed.join(" "))
        })
        .collect()
}

/// A method's curve: its settings, and the knob lines through them. At a work level it
/// reads the better of its best setting at or below that work (what one setting reaches;
/// above its most work, its best) and the straight line between the two neighbouring
/// settings of one knob line on either side (the quality of the knob values between them,
/// interpolated; never across a setting measured between them). No line joins settings of
/// different knob lines, so adding a knob line, or a setting on a new one, never lowers the
/// curve, and the curve is never below a measured setting.
#[derive(Debug, Clone, Default)]
pub struct Curve {
    /// Every setting nothing cheaper beats ([`frontier`]), by work.
    pub points: Vec<(f64, f64)>,
    /// Each knob line's settings, by work (the better one where two share a work).
    pub lines: Vec<Vec<(f64, f64)>>,
}

impl Curve {
    /// From settings as (label, work, value).
    pub fn new(settings: &[(String, f64, f64)]) -> Self {
        let ok: Vec<&(String, f64, f64)> = settings
            .iter()
            .filter(|s| s.1.is_finite() && s.2.is_finite())
            .collect();
        let mut names: Vec<String> = ok.iter().flat_map(|s| knob_lines(&s.0)).collect();
        names.sort();
        names.dedup();
        let lines = names
            .iter()
            .map(|n| {
                by_work(
                    ok.iter()
                        .filter(|s| knob_lines(&s.0).contains(n))
                        .map(|s| (s.1, s.2))
                        .collect(),
                )
            })
            .filter(|l| l.len() > 1)
            .collect();
        Self {
            points: frontier(ok.iter().map(|s| (s.1, s.2)).collect()),
            lines,
        }
    }

    /// The curve at work `w`; `None` below its least work.
    pub fn at(&self, w: f64) -> Option<f64> {
        let best = self
            .points
            .iter()
            .take_while(|p| p.0 <= w + 1e-12)
            .map(|p| p.1)
            .last()?;
        Some(
            self.lines
                .iter()
                .filter_map(|l| interpolate(l, w))
                .fold(best, f64::max),
        )
    }

    /// The work levels where the curve changes slope or steps.
    fn corners(&self) -> impl Iterator<Item = f64> + '_ {
        self.points
            .iter()
            .chain(self.lines.iter().flatten())
            .map(|p| p.0)
    }
}

/// The points no other point beats with at most their work, by work.
pub fn frontier(mut c: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    c.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut best = f64::NEG_INFINITY;
    c.retain(|p| {
        let keep = p.1 > best;
        best = best.max(p.1);
        keep
    });
    c
}

/// Points by work, one per work (the better).
fn by_work(mut c: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    c.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    c.dedup_by(|later, kept| (later.0 - kept.0).abs() < 1e-12);
    c
}

/// The line's value at work `w`, linear between its neighbouring points; `None` outside it.
pub fn interpolate(c: &[(f64, f64)], w: f64) -> Option<f64> {
    if c.len() == 1 {
        return ((c[0].0 - w).abs() < 1e-9).then_some(c[0].1);
    }
    c.windows(2).find(|p| p[0].0 <= w && w <= p[1].0).map(|p| {
        let span = p[1].0 - p[0].0;
        if span <= 1e-12 {
            p[0].1.max(p[1].1)
        } else if w == p[1].0 {
            // Exactly at a setting, its own value (the blend would round it).
            p[1].1
        } else {
            p[0].1 + (p[1].1 - p[0].1) * (w - p[0].0) / span
        }
    })
}

/// FlashDiff's margin over `other` at every work level in `range` both curves reach (a grid
/// of 1/200 of the range, plus every corner of either curve): the worst margin and its work
/// level, and the part of the range compared (from the larger of the two least works to the
/// range's end); `None` when one of them reaches no work level in the range.
pub fn worst_margin(
    ours: &Curve,
    other: &Curve,
    range: (f64, f64),
) -> Option<(f64, f64, (f64, f64))> {
    let lo = range
        .0
        .max(ours.points.first()?.0)
        .max(other.points.first()?.0);
    let hi = range.1;
    if lo > hi {
        return None;
    }
    let mut levels: Vec<f64> = (0..=200)
        .map(|i| lo + (hi - lo) * i as f64 / 200.0)
        .collect();
    // Just below each corner too: a step is read at its lower side.
    levels.extend(
        ours.corners()
            .chain(other.corners())
            .flat_map(|w| [w, w - 1e-9])
            .filter(|&w| lo <= w && w <= hi),
    );
    levels
        .into_iter()
        .filter_map(|w| Some((ours.at(w)? - other.at(w)?, w)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(m, w)| (m, w, (lo, hi)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_is_linear_and_undefined_outside() {
        let c = [(0.2, 10.0), (0.4, 20.0), (0.8, 40.0)];
        let near = |w: f64, want: f64| {
            let got = interpolate(&c, w).expect("inside");
            assert!((got - want).abs() < 1e-9, "at {w}: {got}, want {want}");
        };
        near(0.3, 15.0);
        near(0.6, 30.0);
        near(0.2, 10.0);
        // At a setting the line reads its value exactly, not a rounded blend of two.
        let odd = [
            (0.2875, 7.862856523183915),
            (0.30000000000000004, 18.023571282121896),
        ];
        assert_eq!(
            interpolate(&odd, 0.30000000000000004),
            Some(18.023571282121896)
        );
        assert_eq!(interpolate(&c, 0.1), None);
        assert_eq!(interpolate(&c, 0.9), None);
    }

    #[test]
    fn a_curve_keeps_only_settings_nothing_cheaper_beats() {
        let c = frontier(vec![
            (0.5, 30.0),
            (0.3, 25.0),
            (0.3, 20.0),
            (0.4, 24.0),
            (0.6, 29.0),
            (0.2, 10.0),
        ]);
        assert_eq!(c, [(0.2, 10.0), (0.3, 25.0), (0.5, 30.0)]);
        assert!(frontier(Vec::new()).is_empty());
    }

    /// A curve from (label, work, value) settings.
    fn c(settings: &[(&str, f64, f64)]) -> Curve {
        Curve::new(
            &settings
                .iter()
                .map(|&(l, w, v)| (l.to_string(), w, v))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn the_worst_margin_is_found_between_points_and_inside_the_range() {
        // Ours is 5 dB above at the ends and 1 dB below at 0.5 (the other curve's kink).
        let ours = c(&[("0.5", 0.2, 15.0), ("0.1", 0.8, 45.0)]);
        let other = c(&[("0.5", 0.2, 10.0), ("0.3", 0.5, 31.0), ("0.1", 0.8, 40.0)]);
        let (m, w, range) = worst_margin(&ours, &other, (0.25, 0.6)).expect("overlap");
        assert!((m + 1.0).abs() < 1e-9, "margin {m}");
        assert!((w - 0.5).abs() < 1e-6, "at {w}");
        assert_eq!(range, (0.25, 0.6));
        // Outside the judged range the kink does not count.
        let (m, _, _) = worst_margin(&ours, &other, (0.6, 0.8)).expect("overlap");
        assert!(m > 0.0);
        // A method with no setting in the range is not compared.
        assert!(worst_margin(&ours, &c(&[("1", 0.7, 50.0)]), (0.25, 0.6)).is_none());
    }

    #[test]
    fn a_curve_is_straight_only_along_one_knob_line() {
        assert_eq!(knob_lines("ε 0.1 K 3"), ["ε at K 3", "K at ε 0.1"]);
        assert_eq!(knob_lines("0.1"), [""]);
        assert_eq!(knob_lines("20 steps"), [""]);
        // ε 0.1 at K 3 and K 12 at ε 1 share no line: between them the curve holds the
        // cheaper one's value; ε 0.2 at K 3 then draws a line from ε 0.1.
        let two = c(&[("ε 0.1 K 3", 0.2, 30.0), ("ε 1 K 12", 0.6, 50.0)]);
        assert_eq!(two.at(0.4), Some(30.0));
        assert_eq!(two.at(0.1), None);
        assert_eq!(two.at(0.9), Some(50.0));
        let line = c(&[("ε 0.2 K 3", 0.2, 30.0), ("ε 0.1 K 3", 0.6, 50.0)]);
        assert!((line.at(0.4).unwrap() - 40.0).abs() < 1e-9);
        // Never below a measured setting: a knob line that dips is floored by the best one.
        let dip = c(&[
            ("ε 0.5 K 3", 0.2, 30.0),
            ("ε 1 K 8", 0.3, 45.0),
            ("ε 0.1 K 3", 0.6, 50.0),
        ]);
        assert!((dip.at(0.4).unwrap() - 45.0).abs() < 1e-9);
        // A knob line is straight between neighbouring settings only: settings measured
        // worse in between are not skipped over on the way to a far one (a line from the
        // cheap setting to full computation's capped 99 dB would read 71 dB at work 0.6).
        let sag = c(&[
            ("ε 0.3 K 3", 0.34, 53.5),
            ("ε 0.2 K 3", 0.40, 31.0),
            ("ε 0.05 K 3", 0.64, 47.0),
            ("ε 0.02 K 3", 1.0, 99.0),
        ]);
        assert!(
            (sag.at(0.6).unwrap() - 53.5).abs() < 1e-9,
            "{:?}",
            sag.at(0.6)
        );
        assert!(
            (sag.at(0.82).unwrap() - 73.0).abs() < 1e-9,
            "{:?}",
            sag.at(0.82)
        );
    }

    #[test]
    fn adding_a_knob_line_never_lowers_a_curve() {
        // Settings from a small generator; the old reading (straight lines between any two
        // settings nothing cheaper beats) fails this, shown at the end.
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as f64 / (1u64 << 31) as f64
        };
        for _ in 0..300 {
            let n = 2 + (next() * 6.0) as usize;
            let set: Vec<(String, f64, f64)> = (0..n)
                .map(|i| (format!("ε {i} K 3"), next(), 60.0 * next()))
                .collect();
            let mut more = set.clone();
            for j in 0..1 + (next() * 3.0) as usize {
                more.push((format!("ε 1 K {j}"), next(), 60.0 * next()));
            }
            let (a, b) = (Curve::new(&set), Curve::new(&more));
            for i in 0..=100 {
                let w = i as f64 / 100.0;
                if let Some(before) = a.at(w) {
                    let after = b.at(w).expect("defined where it was");
                    assert!(after >= before - 1e-9, "at {w}: {before} -> {after}");
                }
                // Never below a measured setting at or below w.
                for s in set.iter().filter(|s| s.1 <= w) {
                    assert!(a.at(w).unwrap() >= s.2 - 1e-9);
                }
            }
        }
        let set = [(0.2, 10.0), (0.6, 50.0)];
        let lowered = frontier(vec![(0.2, 10.0), (0.5, 20.0), (0.6, 50.0)]);
        assert!(interpolate(&lowered, 0.4).unwrap() < interpolate(&set, 0.4).unwrap());
    }
}
