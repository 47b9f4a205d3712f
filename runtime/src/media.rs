//! Video and sound output (animated GIF, WAV) and their quality metrics against a reference:
//! per-frame and clip PSNR and temporal consistency for video, SNR and log-spectral distance
//! for sound. Images are in [`crate::image`].

use std::io::Cursor;

use crate::image::psnr;
use crate::models::{sounds, Sample};

/// Why a sample could not be encoded.
#[derive(Debug)]
pub struct MediaError(pub String);

impl std::fmt::Display for MediaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MediaError {}

/// Encodes the frames of a video sample as a looping animated GIF, each frame scaled up
/// `scale` times (nearest neighbour) and shown `delay_cs` hundredths of a second. Colours
/// are quantised per frame (the gif crate's NeuQuant); the clips have a few flat colours.
pub fn gif(sample: &Sample, scale: usize, delay_cs: u16) -> Result<Vec<u8>, MediaError> {
    let (w, h) = (sample.width * scale, sample.height * scale);
    if sample.frames == 0 || w == 0 || h == 0 || w > u16::MAX as usize || h > u16::MAX as usize {
        return Err(MediaError(format!(
            "cannot encode {} frames of {w}x{h} pixels as GIF (1..=65535 a side, at least one frame)",
            sample.frames
        )));
    }
    let mut out = Vec::new();
    {
        let bad = |e: gif::EncodingError| MediaError(format!("GIF encoding failed: {e}"));
        let mut enc = gif::Encoder::new(&mut out, w as u16, h as u16, &[]).map_err(bad)?;
        enc.set_repeat(gif::Repeat::Infinite).map_err(bad)?;
        for f in 0..sample.frames {
            let src = sample.frame(f);
            let mut px = Vec::with_capacity(w * h * 3);
            for y in 0..h {
                for x in 0..w {
                    let i = ((y / scale) * sample.width + x / scale) * 3;
                    px.extend(src[i..i + 3].iter().map(|v| to_u8(*v)));
                }
            }
            let mut frame = gif::Frame::from_rgb_speed(w as u16, h as u16, &px, 10);
            frame.delay = delay_cs;
            enc.write_frame(&frame).map_err(bad)?;
        }
    }
    Ok(out)
}

fn to_u8(v: f32) -> u8 {
    (v.clamp(0.0, 1.0) * 255.0).round() as u8
}

/// Encodes a sound sample as a 16-bit PCM WAV file of its channels.
pub fn wav(sample: &Sample) -> Result<Vec<u8>, MediaError> {
    if sample.sample_rate == 0 {
        return Err(MediaError(
            "the sample is not a sound (no sample rate)".into(),
        ));
    }
    let channels = sample.audio_channels.max(1);
    if channels > 64 || sample.audio.len() % channels != 0 {
        return Err(MediaError(format!(
            "{} samples are not whole frames of {channels} channels (at most 64)",
            sample.audio.len()
        )));
    }
    let spec = hound::WavSpec {
        channels: channels as u16,
        sample_rate: sample.sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let bad = |e: hound::Error| MediaError(format!("WAV encoding failed: {e}"));
    let mut out = Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut out, spec).map_err(bad)?;
        for &s in &sample.audio {
            w.write_sample((s.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16)
                .map_err(bad)?;
        }
        w.finalize().map_err(bad)?;
    }
    Ok(out.into_inner())
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
pub fn video_quality(a: &Sample, b: &Sample) -> Result<VideoQuality, MediaError> {
    if (a.width, a.height, a.frames, a.rgb.len()) != (b.width, b.height, b.frames, b.rgb.len())
        || a.frames == 0
    {
        return Err(MediaError(format!(
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
pub fn audio_quality(a: &Sample, b: &Sample) -> Result<AudioQuality, MediaError> {
    if a.audio.len() != b.audio.len() || a.sample_rate != b.sample_rate || a.audio.is_empty() {
        return Err(MediaError(format!(
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
    sounds::magnitude_frames(x, n, x.len() / hop.max(1), |i| i * hop)
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
    fn gif_round_trips_frame_count_and_size() {
        let s = clip(3, 0.0);
        let bytes = gif(&s, 2, 12).unwrap();
        let mut opts = gif::DecodeOptions::new();
        opts.set_color_output(gif::ColorOutput::RGBA);
        let mut d = opts.read_info(&bytes[..]).unwrap();
        assert_eq!((d.width(), d.height()), (8, 6));
        let mut n = 0;
        while let Some(f) = d.read_next_frame().unwrap() {
            assert_eq!(f.delay, 12);
            n += 1;
        }
        assert_eq!(n, 3);
        assert!(gif(&Sample::audio(vec![0.0; 4], 8000), 1, 1).is_err());
    }

    #[test]
    fn wav_round_trips_samples() {
        let s = Sample::audio(vec![0.0, 0.5, -1.0, 2.0], 8000);
        let bytes = wav(&s).unwrap();
        let r = hound::WavReader::new(&bytes[..]).unwrap();
        assert_eq!(r.spec().sample_rate, 8000);
        let v: Vec<i16> = r.into_samples().map(|x| x.unwrap()).collect();
        assert_eq!(v, vec![0, 16384, -32767, 32767]);
        assert!(wav(&clip(1, 0.0)).is_err());
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
