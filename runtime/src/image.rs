//! PNG output (quality metrics are in `flashdiff-eval`).

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

#[cfg(test)]
mod tests {
    use super::*;

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
