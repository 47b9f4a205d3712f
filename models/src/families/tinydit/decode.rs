//! The built-in models' decoders: image tokens to pixels, sound latents to a waveform by
//! additive synthesis (`models/tinyaudio/sounds.py`'s `decode`).

use super::AudioSpec;

/// `grid x grid` tokens of `patch x patch x 3` values (in [-1, 1]; row, column, channel
/// inside a patch) to an RGB image in [0, 1], row-major.
pub fn unpatchify(latent: &[f32], grid: usize, patch: usize) -> Vec<f32> {
    let side = grid * patch;
    let mut img = vec![0.0f32; side * side * 3];
    for gy in 0..grid {
        for gx in 0..grid {
            let tok = &latent
                [(gy * grid + gx) * patch * patch * 3..(gy * grid + gx + 1) * patch * patch * 3];
            for py in 0..patch {
                for px in 0..patch {
                    for c in 0..3 {
                        let v = tok[(py * patch + px) * 3 + c];
                        img[((gy * patch + py) * side + gx * patch + px) * 3 + c] =
                            ((v + 1.0) / 2.0).clamp(0.0, 1.0);
                    }
                }
            }
        }
    }
    img
}

/// TinyAudio's decoder: `frames x bands` latent values in [-1, 1] (log magnitude, dB over
/// `db_floor..0`) to a waveform in [-1, 1] by additive synthesis, as `sounds.py` does: band
/// `b` is a sine at its centre frequency (phase `b`), its amplitude interpolated linearly
/// between frame centres; the result is scaled to a 0.9 peak.
pub fn synthesize(latent: &[f32], a: &AudioSpec) -> Vec<f32> {
    let bands = a.centres.len();
    let frames = latent.len() / bands.max(1);
    let n = frames * a.hop;
    let mag = |t: usize, b: usize| -> f64 {
        let x = latent[t * bands + b].clamp(-1.0, 1.0) as f64;
        let db = (x + 1.0) / 2.0 * -a.db_floor + a.db_floor;
        if db <= a.db_floor + 1e-6 {
            0.0
        } else {
            10f64.powf(db / 20.0)
        }
    };
    let mut out = vec![0.0f64; n];
    let hop = a.hop as f64;
    for (b, &f) in a.centres.iter().enumerate() {
        let m: Vec<f64> = (0..frames).map(|t| mag(t, b)).collect();
        if m.iter().all(|&v| v <= 0.0) {
            continue;
        }
        let w = 2.0 * std::f64::consts::PI * f / a.rate as f64;
        for (i, o) in out.iter_mut().enumerate() {
            // Frame centres sit at (t + 0.5) hop; before the first and after the last the
            // amplitude holds (numpy's interp).
            let pos = (i as f64 / hop - 0.5).clamp(0.0, (frames - 1) as f64);
            let t0 = pos.floor() as usize;
            let t1 = (t0 + 1).min(frames - 1);
            let amp = m[t0] + (m[t1] - m[t0]) * (pos - t0 as f64);
            *o += amp * (w * i as f64 + b as f64).sin();
        }
    }
    let peak = out.iter().fold(0.0f64, |p, v| p.max(v.abs()));
    let scale = if peak > 0.0 { 0.9 / peak } else { 0.0 };
    out.iter().map(|&v| (v * scale) as f32).collect()
}
