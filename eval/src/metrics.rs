//! Quality of an output against a reference (full computation's, from the same seed): PSNR
//! and SSIM of images, per-frame and temporal PSNR of clips, SNR and spectral distance of
//! sounds.

use flashdiff_models::Sample;

use crate::sound::magnitude_frames;

/// Why two samples cannot be compared.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricError(pub String);

impl std::fmt::Display for MetricError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MetricError {}

/// PSNR in dB between two images in [0, 1]; infinite when identical.
pub fn psnr(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (1.0 / mse).log10()
    }
}

/// SSIM (Wang et al. 2004) between two RGB images in [0, 1]: 11x11 Gaussian window, sigma 1.5,
/// K1 = 0.01, K2 = 0.03, averaged over channels and valid window positions.
pub fn ssim(a: &[f32], b: &[f32], width: usize, height: usize) -> f64 {
    assert_eq!(a.len(), width * height * 3);
    assert_eq!(b.len(), a.len());
    const R: usize = 5;
    let win: Vec<f64> = {
        let g: Vec<f64> = (0..=2 * R)
            .map(|i| (-((i as f64 - R as f64).powi(2)) / (2.0 * 1.5f64.powi(2))).exp())
            .collect();
        let s: f64 = g.iter().sum();
        g.iter().map(|v| v / s).collect()
    };
    let (c1, c2) = (0.01f64.powi(2), 0.03f64.powi(2));
    let (mut total, mut n) = (0.0, 0usize);
    for c in 0..3 {
        let px = |img: &[f32], x: usize, y: usize| img[(y * width + x) * 3 + c] as f64;
        for y in R..height.saturating_sub(R) {
            for x in R..width.saturating_sub(R) {
                let (mut ma, mut mb, mut saa, mut sbb, mut sab) = (0.0, 0.0, 0.0, 0.0, 0.0);
                for j in 0..=2 * R {
                    for i in 0..=2 * R {
                        let w = win[i] * win[j];
                        let (va, vb) = (px(a, x + i - R, y + j - R), px(b, x + i - R, y + j - R));
                        ma += w * va;
                        mb += w * vb;
                        saa += w * va * va;
                        sbb += w * vb * vb;
                        sab += w * va * vb;
                    }
                }
                let (va, vb, cov) = (saa - ma * ma, sbb - mb * mb, sab - ma * mb);
                total += ((2.0 * ma * mb + c1) * (2.0 * cov + c2))
                    / ((ma * ma + mb * mb + c1) * (va + vb + c2));
                n += 1;
            }
        }
    }
    if n == 0 {
        1.0
    } else {
        total / n as f64
    }
}

/// A video against a reference of the same shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoQuality {
    /// PSNR over every pixel of the clip, dB.
    pub clip_psnr: f64,
    /// The worst frame's PSNR, dB.
    pub worst_frame_psnr: f64,
    /// Temporal consistency: PSNR of the frame-to-frame differences against the
    /// reference's (in [-1, 1], so a peak of 2), dB; infinite for a single frame.
    pub temporal_psnr: f64,
}

/// Quality of video `a` against reference `b` (same width, height and frames).
pub fn video_quality(a: &Sample, b: &Sample) -> Result<VideoQuality, MetricError> {
    if (a.width, a.height, a.frames, a.rgb.len()) != (b.width, b.height, b.frames, b.rgb.len())
        || a.frames == 0
    {
        return Err(MetricError(format!(
            "videos differ in shape: {}x{}x{} and {}x{}x{}",
            a.frames, a.height, a.width, b.frames, b.height, b.width
        )));
    }
    let worst = (0..a.frames)
        .map(|f| psnr(a.frame(f), b.frame(f)))
        .fold(f64::INFINITY, f64::min);
    let diffs = |s: &Sample| -> Vec<f32> {
        (1..s.frames)
            .flat_map(|f| {
                s.frame(f)
                    .iter()
                    .zip(s.frame(f - 1))
                    .map(|(x, y)| (x - y + 1.0) / 2.0)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let temporal = if a.frames > 1 {
        psnr(&diffs(a), &diffs(b))
    } else {
        f64::INFINITY
    };
    Ok(VideoQuality {
        clip_psnr: psnr(&a.rgb, &b.rgb),
        worst_frame_psnr: worst,
        temporal_psnr: temporal,
    })
}

/// A sound against a reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioQuality {
    /// Signal-to-noise ratio, dB: reference energy over the energy of the difference
    /// (infinite when identical).
    pub snr: f64,
    /// Log-spectral distance, dB: root mean square over frames and bins of the difference
    /// of the two power spectra in dB (512-sample Hann frames, hop 256), each floored 80 dB
    /// below the reference's peak, so that exact silence in one and near silence in the
    /// other do not dominate.
    pub lsd: f64,
}

/// Quality of sound `a` against reference `b` (same length and rate).
pub fn audio_quality(a: &Sample, b: &Sample) -> Result<AudioQuality, MetricError> {
    if a.audio.len() != b.audio.len() || a.sample_rate != b.sample_rate || a.audio.is_empty() {
        return Err(MetricError(format!(
            "sounds differ: {} samples at {} Hz and {} at {} Hz",
            a.audio.len(),
            a.sample_rate,
            b.audio.len(),
            b.sample_rate
        )));
    }
    let signal: f64 = b.audio.iter().map(|&v| (v as f64).powi(2)).sum();
    let noise: f64 = a
        .audio
        .iter()
        .zip(&b.audio)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let snr = if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal.max(1e-30) / noise).log10()
    };
    let (sa, sb) = (
        power_frames(&a.audio, 512, 256),
        power_frames(&b.audio, 512, 256),
    );
    let peak = sb.iter().flatten().copied().fold(0.0f64, f64::max);
    let floor = (peak * 1e-8).max(1e-30);
    let mut sum = 0.0;
    let mut n = 0usize;
    for (fa, fb) in sa.iter().zip(&sb) {
        for (&pa, &pb) in fa.iter().zip(fb) {
            let d = 10.0 * (pa.max(floor).log10() - pb.max(floor).log10());
            sum += d * d;
            n += 1;
        }
    }
    Ok(AudioQuality {
        snr,
        lsd: (sum / n.max(1) as f64).sqrt(),
    })
}

/// Power spectra (`n / 2 + 1` bins) of Hann-windowed frames of `n` samples every `hop`
/// samples, frame `i` centred on sample `i * hop` (zero outside the signal).
pub fn power_frames(x: &[f32], n: usize, hop: usize) -> Vec<Vec<f64>> {
    magnitude_frames(x, n, x.len() / hop.max(1), |i| i * hop)
        .into_iter()
        .map(|f| f.into_iter().map(|m| m * m).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clip(frames: usize, shift: f32) -> Sample {
        let (w, h) = (4, 3);
        let rgb = (0..frames * w * h * 3)
            .map(|i| ((i as f32 * 0.37 + shift).sin() + 1.0) / 2.0)
            .collect();
        Sample::frames(rgb, w, h, frames)
    }

    #[test]
    fn metrics_behave() {
        let a: Vec<f32> = (0..32 * 32 * 3)
            .map(|i| ((i * 37) % 101) as f32 / 100.0)
            .collect();
        assert_eq!(psnr(&a, &a), f64::INFINITY);
        assert!((ssim(&a, &a, 32, 32) - 1.0).abs() < 1e-9);
        let b: Vec<f32> = a.iter().map(|v| (v + 0.1).min(1.0)).collect();
        let p = psnr(&a, &b);
        assert!(p > 15.0 && p < 25.0, "{p}");
        let noise: Vec<f32> = (0..a.len())
            .map(|i| ((i * 7919) % 97) as f32 / 96.0)
            .collect();
        assert!(ssim(&a, &noise, 32, 32) < ssim(&a, &b, 32, 32));
    }

    #[test]
    fn video_metrics_see_a_changed_frame_and_changed_motion() {
        let a = clip(4, 0.0);
        let q = video_quality(&a, &a).unwrap();
        assert_eq!(q.clip_psnr, f64::INFINITY);
        assert_eq!(q.temporal_psnr, f64::INFINITY);
        let mut b = a.clone();
        let n = a.width * a.height * 3;
        for v in &mut b.rgb[2 * n..3 * n] {
            *v = (*v + 0.2).min(1.0);
        }
        let q = video_quality(&b, &a).unwrap();
        assert!(q.worst_frame_psnr < q.clip_psnr, "{q:?}");
        assert!(q.temporal_psnr.is_finite());
        assert!(video_quality(&a, &clip(3, 0.0)).is_err());
    }

    #[test]
    fn audio_metrics_grow_with_the_error() {
        let tone: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.3).sin() * 0.5).collect();
        let a = Sample::audio(tone.clone(), 8000);
        let q = audio_quality(&a, &a).unwrap();
        assert_eq!(q.snr, f64::INFINITY);
        assert!(q.lsd < 1e-9);
        let near = Sample::audio(tone.iter().map(|v| v * 1.01).collect(), 8000);
        let far = Sample::audio(tone.iter().map(|v| v * 0.5).collect(), 8000);
        let (qn, qf) = (
            audio_quality(&near, &a).unwrap(),
            audio_quality(&far, &a).unwrap(),
        );
        assert!((qn.snr - 40.0).abs() < 0.5, "{qn:?}");
        assert!(qf.snr < qn.snr && qf.lsd > qn.lsd, "{qn:?} {qf:?}");
        assert!(audio_quality(&a, &Sample::audio(vec![0.0; 10], 8000)).is_err());
    }

    #[test]
    fn spectra_put_a_tone_in_its_bin() {
        // 1000 Hz at 8000 Hz: bin 1000 / (8000 / 512) = 64.
        let x: Vec<f32> = (0..2048)
            .map(|i| (2.0 * std::f32::consts::PI * 1000.0 * i as f32 / 8000.0).sin())
            .collect();
        let f = power_frames(&x, 512, 256);
        let mid = &f[4];
        let peak = (0..mid.len())
            .max_by(|&i, &j| mid[i].total_cmp(&mid[j]))
            .unwrap();
        assert_eq!(peak, 64);
    }
}
