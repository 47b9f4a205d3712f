//! The built-in audio model's language and its ground-truth checker: prompts such as "a high
//! beep then a low hum", and a checker that reads the waveform alone (short-time spectra).
//! Mirrors `models/tinyaudio/sounds.py` (its checker is the evaluation's); keep the two in
//! step.

use crate::scene::{self, PromptError};
use rustfft::{num_complex::Complex, FftPlanner};

/// Samples per second.
pub const RATE: u32 = 8000;
/// Samples per latent frame.
pub const HOP: usize = 256;
/// Latent frames of a clip.
pub const FRAMES: usize = 64;
/// Kinds of sound event.
pub const KINDS: [&str; 4] = ["beep", "hum", "click", "chirp"];
/// Pitch names and their base frequency, Hz.
pub const PITCHES: [(&str, f64); 3] = [("low", 250.0), ("middle", 600.0), ("high", 1400.0)];

/// One event a prompt asks for: indices into [`KINDS`] and [`PITCHES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Kind.
    pub kind: usize,
    /// Pitch.
    pub pitch: usize,
}

/// Parses "a P K [then a P K]...".
pub fn parse(prompt: &str) -> Result<Vec<Event>, PromptError> {
    let ws = scene::words(prompt);
    let g = |s: &str| PromptError::Grammar(s.to_string());
    let mut events = Vec::new();
    for part in ws.split(|w| w == "then") {
        let [a, p, k] = part else {
            return Err(g(
                "each event reads \"a <low|middle|high> <beep|hum|click|chirp>\"",
            ));
        };
        if a != "a" {
            return Err(g("each event starts with \"a\""));
        }
        let pitch = PITCHES
            .iter()
            .position(|x| x.0 == p)
            .ok_or_else(|| g("a pitch is low, middle or high"))?;
        let kind = KINDS
            .iter()
            .position(|x| x == k)
            .ok_or_else(|| g("a sound is a beep, a hum, a click or a chirp"))?;
        events.push(Event { kind, pitch });
    }
    Ok(events)
}

/// The prompt of a sequence of events, in the training data's words.
pub fn prompt_text(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| format!("a {} {}", PITCHES[e.pitch].0, KINDS[e.kind]))
        .collect::<Vec<_>>()
        .join(" then ")
}

/// Random events like the training data's (one or two), from a seed: held-out prompts for
/// the bench.
pub fn sample(seed: u64) -> Vec<Event> {
    let mut d = scene::Draw::new(seed);
    let n = 1 + d.below(2);
    (0..n)
        .map(|_| Event {
            kind: d.below(KINDS.len()),
            pitch: d.below(PITCHES.len()),
        })
        .collect()
}

/// Magnitude spectra (`n / 2 + 1` bins) of Hann-windowed (numpy's symmetric `hanning`)
/// `n`-sample frames, frame `i` centred on sample `centre(i)`, for `i` in `0..frames`;
/// samples outside the signal are zero.
pub fn magnitude_frames(
    x: &[f32],
    n: usize,
    frames: usize,
    centre: impl Fn(usize) -> usize,
) -> Vec<Vec<f64>> {
    let fft = FftPlanner::<f64>::new().plan_fft_forward(n);
    let win: Vec<f64> = (0..n)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (n - 1) as f64).cos())
        .collect();
    let mut buf = vec![Complex::new(0.0, 0.0); n];
    (0..frames)
        .map(|i| {
            let c = centre(i) as isize;
            for (j, b) in buf.iter_mut().enumerate() {
                let k = c - (n / 2) as isize + j as isize;
                let v = usize::try_from(k)
                    .ok()
                    .and_then(|k| x.get(k))
                    .map_or(0.0, |&v| v as f64);
                *b = Complex::new(v * win[j], 0.0);
            }
            fft.process(&mut buf);
            buf[..n / 2 + 1].iter().map(|c| c.norm()).collect()
        })
        .collect()
}

/// Runs `[start, end)` of frames with `energy >= threshold`, runs split by at most `max_gap`
/// quiet frames joined.
fn segments(energy: &[f64], threshold: f64, max_gap: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut start = None;
    for (i, &e) in energy.iter().chain([&f64::NEG_INFINITY]).enumerate() {
        match (e >= threshold, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for r in runs {
        match merged.last_mut() {
            Some(m) if r.0 - m.1 <= max_gap => m.1 = r.1,
            _ => merged.push(r),
        }
    }
    merged
}

fn nearest_pitch(freq: f64) -> usize {
    let d = |p: usize| (freq / PITCHES[p].1).log2().abs();
    (0..PITCHES.len())
        .rev()
        .min_by(|&a, &b| d(a).total_cmp(&d(b)).then(a.cmp(&b)))
        .unwrap_or(0)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// (kind, pitch) of frames `a..b` of the spectra; `None` when no frame of it is loud (only
/// for non-finite input).
fn classify(spec: &[Vec<f64>], a: usize, b: usize) -> Option<Event> {
    let bins = spec[0].len();
    let freq = |k: usize| k as f64 * RATE as f64 / (2 * (bins - 1)) as f64;
    let seg = &spec[a..b];
    let energy: Vec<f64> = seg.iter().map(|s| s.iter().map(|v| v * v).sum()).collect();
    let top = energy.iter().copied().fold(0.0, f64::max);
    let loud: Vec<&Vec<f64>> = seg
        .iter()
        .zip(&energy)
        .filter(|(_, &e)| e >= 0.1 * top)
        .map(|(s, _)| s)
        .collect();
    if loud.is_empty() {
        return None;
    }
    let kind = |name: &str| KINDS.iter().position(|k| *k == name).unwrap_or(0);
    // Clicks: most frames of the span are quiet between bursts.
    if (loud.len() as f64) < 0.6 * seg.len() as f64 && b - a >= 6 {
        let logs: Vec<f64> = loud
            .iter()
            .map(|s| {
                let p: f64 = s.iter().map(|v| v * v).sum();
                let c: f64 = s.iter().enumerate().map(|(k, v)| freq(k) * v * v).sum();
                (c / p).ln()
            })
            .collect();
        let mean = logs.iter().sum::<f64>() / logs.len().max(1) as f64;
        return Some(Event {
            kind: kind("click"),
            pitch: nearest_pitch(mean.exp()),
        });
    }
    let peaks: Vec<f64> = loud
        .iter()
        .map(|s| {
            // The first of the largest (numpy's argmax).
            let k = (0..s.len())
                .rev()
                .max_by(|&i, &j| s[i].total_cmp(&s[j]))
                .unwrap_or(0);
            freq(k)
        })
        .collect();
    let q = (peaks.len() / 4).max(1);
    let (first, last) = (median(&peaks[..q]), median(&peaks[peaks.len() - q..]));
    if last / first > 1.35 {
        return Some(Event {
            kind: kind("chirp"),
            pitch: nearest_pitch(first),
        });
    }
    let f0 = median(&peaks);
    let total: Vec<f64> = (0..bins)
        .map(|k| loud.iter().map(|s| s[k] * s[k]).sum())
        .collect();
    let near = |f: f64| -> f64 {
        (0..bins)
            .filter(|&k| (freq(k) - f).abs() <= 24f64.max(0.04 * f))
            .map(|k| total[k])
            .sum()
    };
    let harm = (near(2.0 * f0) + near(3.0 * f0)) / near(f0).max(1e-12);
    Some(Event {
        kind: kind(if harm > 0.15 { "hum" } else { "beep" }),
        pitch: nearest_pitch(f0),
    })
}

/// The checker's verdict on one sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoundVerdict {
    /// As many events as the prompt names.
    pub count: bool,
    /// Each of its kind, in order.
    pub kinds: bool,
    /// Each at its pitch, in order.
    pub pitches: bool,
}

impl SoundVerdict {
    /// Everything right.
    pub fn all(&self) -> bool {
        self.count && self.kinds && self.pitches
    }
}

/// Checks a waveform (`FRAMES * HOP` samples at [`RATE`]) against a prompt's events: as many
/// sound events as named (runs of frames within 30 dB of the loudest, at least 3 frames,
/// bursts at most 8 frames apart joined), in order, each of its kind and pitch.
pub fn check(wave: &[f32], events: &[Event]) -> SoundVerdict {
    let wrong = SoundVerdict {
        count: false,
        kinds: false,
        pitches: false,
    };
    if wave.len() != FRAMES * HOP {
        return wrong;
    }
    let spec = magnitude_frames(wave, 512, FRAMES, |f| f * HOP + HOP / 2);
    let energy: Vec<f64> = spec.iter().map(|s| s.iter().map(|v| v * v).sum()).collect();
    let top = energy.iter().copied().fold(0.0, f64::max);
    if top <= 0.0 {
        return wrong;
    }
    let runs: Vec<(usize, usize)> = segments(&energy, top * 1e-3, 8)
        .into_iter()
        .filter(|r| r.1 - r.0 >= 3)
        .collect();
    if runs.len() != events.len() {
        return wrong;
    }
    let mut v = SoundVerdict {
        count: true,
        kinds: true,
        pitches: true,
    };
    for (e, &(a, b)) in events.iter().zip(&runs) {
        let got = classify(&spec, a, b);
        v.kinds &= got.is_some_and(|g| g.kind == e.kind);
        v.pitches &= got.is_some_and(|g| g.pitch == e.pitch);
    }
    v
}

/// A pure tone event for tests: `kind` rendered simply (beep a sine, hum with two
/// harmonics, chirp an octave sweep, click bursts 4 a second) at `pitch`, frames `a..b`.
pub fn render(events: &[(Event, usize, usize)]) -> Vec<f32> {
    let mut out = vec![0.0f32; FRAMES * HOP];
    for &(e, a, b) in events {
        let f0 = PITCHES[e.pitch].1;
        let mut phase = 0.0f64;
        for (i, o) in out.iter_mut().enumerate().take(b * HOP).skip(a * HOP) {
            let t = (i - a * HOP) as f64 / ((b - a) * HOP) as f64;
            let f = if KINDS[e.kind] == "chirp" {
                f0 * 2f64.powf(t)
            } else {
                f0
            };
            phase += 2.0 * std::f64::consts::PI * f / RATE as f64;
            let mut v = phase.sin();
            if KINDS[e.kind] == "hum" {
                v += 0.6 * (2.0 * phase).sin() + 0.4 * (3.0 * phase).sin();
            }
            if KINDS[e.kind] == "click" {
                let burst = (i - a * HOP) as f64 * 4.0 / RATE as f64;
                if burst - burst.floor() >= HOP as f64 * 4.0 / RATE as f64 {
                    v = 0.0;
                }
            }
            *o += 0.3 * v as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_and_refuses_the_rest() {
        let e = parse("a high beep then a low hum").unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((KINDS[e[0].kind], PITCHES[e[0].pitch].0), ("beep", "high"));
        assert_eq!((KINDS[e[1].kind], PITCHES[e[1].pitch].0), ("hum", "low"));
        for bad in [
            "a high",
            "a loud beep",
            "a high boop",
            "the high beep",
            "a high beep then",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sampled_events_round_trip_through_their_prompts() {
        for seed in 0..100 {
            let e = sample(seed);
            assert!((1..=2).contains(&e.len()));
            assert_eq!(parse(&prompt_text(&e)).unwrap(), e, "seed {seed}");
        }
    }

    #[test]
    fn the_checker_hears_each_kind_and_pitch_and_the_order() {
        let ev = |k: &str, p: &str| Event {
            kind: KINDS.iter().position(|x| *x == k).unwrap(),
            pitch: PITCHES.iter().position(|x| x.0 == p).unwrap(),
        };
        for k in KINDS {
            for (p, _) in PITCHES {
                let e = ev(k, p);
                let wave = render(&[(e, 10, 30)]);
                assert!(
                    check(&wave, &[e]).all(),
                    "{k} {p}: {:?}",
                    check(&wave, &[e])
                );
            }
        }
        let (a, b) = (ev("beep", "high"), ev("hum", "low"));
        let wave = render(&[(a, 4, 22), (b, 36, 56)]);
        assert!(check(&wave, &[a, b]).all());
        let swapped = check(&wave, &[b, a]);
        assert!(!swapped.all() && swapped.count, "{swapped:?}");
        assert!(!check(&wave, &[a]).count);
        assert!(!check(&[0.0; 16], &[a]).all());
        assert!(!check(&vec![0.0; FRAMES * HOP], &[a]).all());
    }
}
