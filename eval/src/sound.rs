//! The sound checker of the built-in audio model: how many events, their kinds, their pitches,
//! in order, from short-time spectra. Held to `models/tinyaudio/sounds.py`'s `check`.

use flashdiff_models::families::tinydit::sounds::{Event, FRAMES, HOP, KINDS, PITCHES, RATE};
use rustfft::{num_complex::Complex, FftPlanner};

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
