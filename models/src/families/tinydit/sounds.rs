//! The built-in audio model's language and its ground-truth checker: prompts such as "a high
//! beep then a low hum", and a checker that reads the waveform alone (short-time spectra).
//! Mirrors `models/tinyaudio/sounds.py` (its checker is the evaluation's); keep the two in
//! step.

use crate::families::tinydit::scene::{self, PromptError};

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
}
