use crate::PartitionError;

/// Most tokens a grid may have (2^24: a 4096 x 4096 latent, far above any model served;
/// bounded so that a layout's per-token arrays are always allocatable).
pub const MAX_TOKENS: u32 = 1 << 24;

/// A latent grid of `frames x height x width` tokens in raster order (frame, row, column).
/// An image has `frames == 1`; audio has `frames == height == 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grid {
    frames: u32,
    height: u32,
    width: u32,
}

impl Grid {
    /// A grid, refusing zero dimensions and grids of more than [`MAX_TOKENS`] tokens.
    pub fn new(frames: u32, height: u32, width: u32) -> Result<Self, PartitionError> {
        let tokens = frames as u64 * height as u64 * width as u64;
        if frames == 0 || height == 0 || width == 0 || tokens > MAX_TOKENS as u64 {
            return Err(PartitionError::BadGrid {
                dims: [frames as u64, height as u64, width as u64],
            });
        }
        Ok(Self {
            frames,
            height,
            width,
        })
    }

    /// An image grid (`frames == 1`).
    pub fn image(height: u32, width: u32) -> Result<Self, PartitionError> {
        Self::new(1, height, width)
    }

    /// Frames.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Rows per frame.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Columns per row.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Total tokens, `F * H * W`.
    pub fn tokens(&self) -> u32 {
        self.frames * self.height * self.width
    }

    /// Dimensions as `[frames, height, width]`.
    pub fn dims(&self) -> [u32; 3] {
        [self.frames, self.height, self.width]
    }

    /// `[frame, row, column]` of a raster index; `token < tokens()`.
    #[inline]
    pub fn coords(&self, token: u32) -> [u32; 3] {
        let plane = self.height * self.width;
        let f = token / plane;
        let rem = token - f * plane;
        let y = rem / self.width;
        [f, y, rem - y * self.width]
    }

    /// Raster index of `[frame, row, column]`.
    #[inline]
    pub fn index(&self, c: [u32; 3]) -> u32 {
        (c[0] * self.height + c[1]) * self.width + c[2]
    }

    /// Face neighbours (up to 6) of a token, in a fixed order.
    pub fn neighbours(&self, token: u32, out: &mut Vec<u32>) {
        out.clear();
        let c = self.coords(token);
        let dims = self.dims();
        for axis in 0..3 {
            if c[axis] > 0 {
                let mut n = c;
                n[axis] -= 1;
                out.push(self.index(n));
            }
            if c[axis] + 1 < dims[axis] {
                let mut n = c;
                n[axis] += 1;
                out.push(self.index(n));
            }
        }
    }
}
