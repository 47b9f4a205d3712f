//! Video and sound output: animated GIF and WAV. Images are in [`crate::image`]; quality
//! metrics in `flashdiff-eval`.

use std::io::Cursor;

use crate::models::{Kind, Sample};

/// Why a sample could not be encoded.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MediaError(pub String);

/// The file extension a kind of sample is written as.
pub fn extension(kind: Kind) -> &'static str {
    match kind {
        Kind::Image => "png",
        Kind::Video => "gif",
        Kind::Audio => "wav",
    }
}

/// A sample as the bytes of its file, as `flashdiff generate` writes it: PNG or animated GIF
/// (8 frames a second), small ones enlarged ([`zoom`]), or WAV.
pub fn encode(sample: &Sample, kind: Kind) -> Result<Vec<u8>, MediaError> {
    match kind {
        Kind::Image => Ok(crate::image::png(
            &sample.rgb,
            sample.width,
            sample.height,
            zoom(sample),
        )),
        Kind::Video => gif(sample, zoom(sample), 12),
        Kind::Audio => wav(sample),
    }
}

/// The patch map of an image: the image as [`encode`] writes it, with the border between
/// every two patches drawn (pixels on a border inverted, so it shows on any colour), as PNG.
/// `patch_of` gives each latent token's patch on a `rows x cols` token grid that tiles the
/// image evenly.
pub fn patch_map(
    sample: &Sample,
    patch_of: &[u32],
    (rows, cols): (usize, usize),
) -> Result<Vec<u8>, MediaError> {
    let (w, h) = (sample.width, sample.height);
    if sample.frames != 1
        || rows == 0
        || cols == 0
        || patch_of.len() != rows * cols
        || w % cols != 0
        || h % rows != 0
        || sample.rgb.len() != w * h * 3
    {
        return Err(MediaError(format!(
            "a patch map needs one image whose {w}x{h} pixels a {rows}x{cols} token grid              tiles ({} patch ids given, {} frames)",
            patch_of.len(),
            sample.frames
        )));
    }
    let z = zoom(sample);
    let (zw, zh) = (w * z, h * z);
    let (cw, ch) = (zw / cols, zh / rows);
    let patch = |x: usize, y: usize| patch_of[(y / ch) * cols + x / cw];
    let mut rgb = vec![0f32; zw * zh * 3];
    for y in 0..zh {
        for x in 0..zw {
            let src = ((y / z) * w + x / z) * 3;
            let p = patch(x, y);
            // A pixel within 1 of a token edge whose neighbour across it is another patch.
            let border = (x % cw == 0 && x > 0 && patch(x - 1, y) != p)
                || (x % cw == cw - 1 && x + 1 < zw && patch(x + 1, y) != p)
                || (y % ch == 0 && y > 0 && patch(x, y - 1) != p)
                || (y % ch == ch - 1 && y + 1 < zh && patch(x, y + 1) != p);
            for c in 0..3 {
                let v = sample.rgb[src + c];
                rgb[(y * zw + x) * 3 + c] = if border { 1.0 - v } else { v };
            }
        }
    }
    Ok(crate::image::png(&rgb, zw, zh, 1))
}

/// How many times an image or a video frame is enlarged in its file: the built-in models'
/// 32-pixel ones 8x, none from 256 pixels on.
pub fn zoom(sample: &Sample) -> usize {
    (256 / sample.width.max(1)).clamp(1, 8)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The pixels of an uncompressed RGB PNG written by [`crate::image::png`] (stored deflate
    /// blocks after the 2-byte zlib header; one filter byte per row).
    fn pixels(png: &[u8], w: usize, h: usize) -> Vec<u8> {
        let idat = png.windows(4).position(|k| k == b"IDAT").unwrap() + 4;
        let mut raw = Vec::new();
        let mut at = idat + 2;
        while raw.len() < h * (1 + 3 * w) {
            let n = u16::from_le_bytes([png[at + 1], png[at + 2]]) as usize;
            raw.extend_from_slice(&png[at + 5..at + 5 + n]);
            at += 5 + n;
        }
        raw.chunks(1 + 3 * w)
            .flat_map(|r| r[1..].to_vec())
            .collect()
    }

    #[test]
    fn a_patch_map_inverts_exactly_the_pixels_along_patch_borders() {
        // 256x256 pixels (zoom 1) on a 2x2 token grid: the left column is patch 0, the right
        // patch 1, so only the two pixel columns either side of x = 128 are a border.
        let (w, h) = (256, 256);
        let img = Sample::frames(vec![0.25; w * h * 3], w, h, 1);
        let png = patch_map(&img, &[0, 1, 0, 1], (2, 2)).unwrap();
        let px = pixels(&png, w, h);
        for y in [0, 100, 255] {
            for x in 0..w {
                let want = if x == 127 || x == 128 { 191 } else { 64 };
                assert_eq!(px[(y * w + x) * 3], want, "pixel ({x}, {y})");
            }
        }
        // One patch: no border anywhere.
        let px = pixels(&patch_map(&img, &[3, 3, 3, 3], (2, 2)).unwrap(), w, h);
        assert!(px.iter().all(|&v| v == 64));
        // A grid that does not tile the image, or ids for another grid, are refused.
        assert!(patch_map(&img, &[0, 1, 0], (2, 2)).is_err());
        assert!(patch_map(&img, &[0; 9], (3, 3)).is_err());
    }

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
}
