//! PNG output and the quality metrics (PSNR, SSIM).

use std::io::Write;

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// Encodes an RGB image in [0, 1] (`width x height x 3`) as PNG, scaled up `scale` times
/// (nearest neighbour) so a 32x32 sample is visible. Uncompressed deflate: the files are tiny.
pub fn png(rgb: &[f32], width: usize, height: usize, scale: usize) -> Vec<u8> {
    let (w, h) = (width * scale, height * scale);
    let mut raw = Vec::with_capacity(h * (1 + w * 3));
    for y in 0..h {
        raw.push(0u8);
        for x in 0..w {
            let i = ((y / scale) * width + x / scale) * 3;
            for c in 0..3 {
                raw.push((rgb[i + c].clamp(0.0, 1.0) * 255.0).round() as u8);
            }
        }
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, blk) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        let n = blk.len() as u16;
        z.extend_from_slice(&n.to_le_bytes());
        z.extend_from_slice(&(!n).to_le_bytes());
        z.extend_from_slice(blk);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        out.write_all(&(data.len() as u32).to_be_bytes())
            .expect("vec write");
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.write_all(&body).expect("vec write");
        out.write_all(&crc32(&body).to_be_bytes())
            .expect("vec write");
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &z);
    chunk(b"IEND", &[]);
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn png_has_valid_structure() {
        let img = vec![0.5f32; 2 * 2 * 3];
        let p = png(&img, 2, 2, 2);
        assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&p[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(p[16..20].try_into().unwrap()), 4);
        assert_eq!(&p[p.len() - 8..p.len() - 4], b"IEND");
    }
}
