use crate::{Grid, PartitionError};

/// A partition of a grid's tokens into `R` patches: the token -> patch map plus the per-patch
/// token lists in CSR form (`tokens[offsets[p]..offsets[p + 1]]`, ascending). Plain `u32`
/// vectors, so archiving or handing it to C is a copy of three slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchLayout {
    grid: Grid,
    patch_of: Vec<u32>,
    offsets: Vec<u32>,
    tokens: Vec<u32>,
}

impl PatchLayout {
    /// Builds the layout from a token -> patch map, refusing out-of-range ids and empty patches.
    pub fn from_assignment(
        grid: Grid,
        patch_of: Vec<u32>,
        patches: u32,
    ) -> Result<Self, PartitionError> {
        let n = grid.tokens() as usize;
        if patch_of.len() != n {
            return Err(PartitionError::LengthMismatch {
                what: "patch_of",
                expected: n,
                got: patch_of.len(),
            });
        }
        if patches == 0 || patches > grid.tokens() {
            return Err(PartitionError::BadPatchCount {
                requested: patches,
                tokens: grid.tokens(),
            });
        }
        let mut counts = vec![0u32; patches as usize];
        for (t, &p) in patch_of.iter().enumerate() {
            if p >= patches {
                return Err(PartitionError::BadLayout(format!(
                    "token {t} is in patch {p}, but there are only {patches} patches"
                )));
            }
            counts[p as usize] += 1;
        }
        if let Some(p) = counts.iter().position(|&c| c == 0) {
            return Err(PartitionError::BadLayout(format!("patch {p} is empty")));
        }
        let mut offsets = Vec::with_capacity(patches as usize + 1);
        offsets.push(0u32);
        for &c in &counts {
            offsets.push(offsets.last().copied().unwrap_or(0) + c);
        }
        let mut fill: Vec<u32> = offsets[..patches as usize].to_vec();
        let mut tokens = vec![0u32; n];
        for (t, &p) in patch_of.iter().enumerate() {
            tokens[fill[p as usize] as usize] = t as u32;
            fill[p as usize] += 1;
        }
        Ok(Self {
            grid,
            patch_of,
            offsets,
            tokens,
        })
    }

    /// Builds a layout from parts the partitioner already holds: `tokens` grouped by patch
    /// (ascending within a patch) with patch `p` at `offsets[p]..offsets[p + 1]`, and the
    /// matching token -> patch map. Checked in debug builds; the independent checker covers
    /// release behaviour in the tests.
    pub(crate) fn from_parts(
        grid: Grid,
        patch_of: Vec<u32>,
        offsets: Vec<u32>,
        tokens: Vec<u32>,
    ) -> Self {
        debug_assert_eq!(tokens.len(), grid.tokens() as usize);
        debug_assert_eq!(offsets.last().copied(), Some(grid.tokens()));
        Self {
            grid,
            patch_of,
            offsets,
            tokens,
        }
    }

    /// The grid this layout partitions.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// Number of patches `R`.
    pub fn patches(&self) -> u32 {
        (self.offsets.len() - 1) as u32
    }

    /// Patch of every token, in raster order.
    pub fn patch_of(&self) -> &[u32] {
        &self.patch_of
    }

    /// CSR offsets, `R + 1` entries.
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// All tokens grouped by patch, ascending within a patch.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens of patch `p` (ascending). Panics if `p >= patches()`.
    pub fn patch_tokens(&self, p: u32) -> &[u32] {
        let (a, b) = (self.offsets[p as usize], self.offsets[p as usize + 1]);
        &self.tokens[a as usize..b as usize]
    }

    /// Token count of every patch.
    pub fn sizes(&self) -> Vec<u32> {
        self.offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }
}
