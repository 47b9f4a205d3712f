//! Recursive load-aware partitioning (§4.1) and the uniform partitioner.
//!
//! Every patch gets `floor(J/R)` or `ceil(J/R)` tokens: patch `k` owns `P(k+1) - P(k)` tokens
//! with `P(k) = floor(k J / R)`, and each recursion node covers a contiguous range of patch
//! ids, so sizes are exact by construction (the balance bound: max - min <= 1 token).
//!
//! A node with `r > 1` patches is split either
//! - by saliency: Otsu's threshold splits its tokens into a focus and a context class; the
//!   focus gets `r_f = clamp(ceil(r n_f / n), 1, r - 1)` patches (the paper's allocation rule
//!   rounds; we take the ceiling so a salient object never spills into context patches) and
//!   exactly the tokens those patches hold: the most salient focus tokens when the class is
//!   too big, or the class grown outwards ring by ring (grid distance, then saliency) when it
//!   is too small, which keeps a small object and its surroundings in one coherent patch; or
//! - spatially, when the node's saliency is not bimodal (Otsu separability below
//!   [`MIN_SEPARABILITY`] or contrast below [`MIN_CONTRAST`] of the map's range): a balanced
//!   cut across the longest axis of the node's bounding box.
//!
//! The uniform partitioner is the spatial rule alone from the root: balanced recursive
//! bisection, the NaivePatch / DistriFusion layout.

use crate::otsu::{otsu_hist, BINS};
use crate::saliency::validate_map;
use crate::{Grid, PartitionError, PatchLayout};

/// Minimum Otsu separability (between-class / total variance) for a saliency split. Gaussian
/// noise scores about 0.64 and uniform noise 0.75, so 0.8 splits only on real structure
/// (our measurement on blob maps: 0.85-0.99).
pub const MIN_SEPARABILITY: f32 = 0.8;

/// Minimum saliency range inside a node, as a fraction of the whole map's range, for a
/// saliency split: below it the node's variation is noise relative to the map.
pub const MIN_CONTRAST: f32 = 0.2;

/// Tunables of the saliency partitioner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionConfig {
    /// See [`MIN_SEPARABILITY`].
    pub min_separability: f32,
    /// See [`MIN_CONTRAST`].
    pub min_contrast: f32,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        Self {
            min_separability: MIN_SEPARABILITY,
            min_contrast: MIN_CONTRAST,
        }
    }
}

fn check_r(grid: Grid, r: u32) -> Result<(), PartitionError> {
    if r == 0 || r > grid.tokens() {
        return Err(PartitionError::BadPatchCount {
            requested: r,
            tokens: grid.tokens(),
        });
    }
    Ok(())
}

/// Uniform layout: balanced recursive bisection of the grid into `r` patches.
pub fn partition_uniform(grid: Grid, r: u32) -> Result<PatchLayout, PartitionError> {
    check_r(grid, r)?;
    let mut ctx = Ctx::new(grid, r, None, PartitionConfig::default());
    let mut all: Vec<u32> = (0..grid.tokens()).collect();
    ctx.split(&mut all, 0, r);
    Ok(ctx.into_layout(all, r))
}

/// Saliency layout of §4.1 with the default configuration.
pub fn partition_saliency(
    grid: Grid,
    saliency: &[f32],
    r: u32,
) -> Result<PatchLayout, PartitionError> {
    partition_saliency_with(grid, saliency, r, PartitionConfig::default())
}

/// Saliency layout of §4.1: `saliency` has one finite, non-negative value per token.
pub fn partition_saliency_with(
    grid: Grid,
    saliency: &[f32],
    r: u32,
    cfg: PartitionConfig,
) -> Result<PatchLayout, PartitionError> {
    validate_map("saliency", saliency, grid.tokens() as usize)?;
    check_r(grid, r)?;
    if !(0.0..=1.0).contains(&cfg.min_separability) || !(0.0..=1.0).contains(&cfg.min_contrast) {
        return Err(PartitionError::BadConfig(format!(
            "min_separability {} and min_contrast {} must lie in [0, 1]",
            cfg.min_separability, cfg.min_contrast
        )));
    }
    let mut ctx = Ctx::new(grid, r, Some(saliency), cfg);
    let mut all: Vec<u32> = (0..grid.tokens()).collect();
    ctx.split(&mut all, 0, r);
    Ok(ctx.into_layout(all, r))
}

struct Ctx<'a> {
    grid: Grid,
    j: u64,
    r_total: u64,
    saliency: Option<&'a [f32]>,
    cfg: PartitionConfig,
    /// Minimum node range in global histogram bins for a saliency split.
    min_bins: usize,
    /// Global 256-bin quantisation of the saliency map, computed once: a node's histogram is
    /// then one pass over bytes.
    bins: Vec<u8>,
    patch_of: Vec<u32>,
    /// Per-token stamp: which node / BFS pass last touched the token.
    mark: Vec<u32>,
    stamp: u32,
    scratch: Vec<u32>,
    /// Coordinates of every token, filled in raster order (no divisions on the hot path).
    xyz: Vec<[u32; 3]>,
    /// Reused buffer of `cut_order` (it borrows `self` immutably).
    second: std::cell::RefCell<Vec<u32>>,
    /// Reused BFS stack.
    stack: Vec<u32>,
}

impl<'a> Ctx<'a> {
    fn new(grid: Grid, r: u32, saliency: Option<&'a [f32]>, cfg: PartitionConfig) -> Self {
        let n = grid.tokens() as usize;
        let mut bins = Vec::new();
        if let Some(s) = saliency {
            let (lo, hi) = s
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            let scale = if hi > lo {
                BINS as f32 / (hi - lo)
            } else {
                0.0
            };
            bins = s
                .iter()
                .map(|&v| (((v - lo) * scale) as usize).min(BINS - 1) as u8)
                .collect();
        }
        let min_bins = (cfg.min_contrast * BINS as f32).ceil().max(1.0) as usize;
        Self {
            grid,
            j: n as u64,
            r_total: r as u64,
            saliency,
            cfg,
            min_bins,
            bins,
            patch_of: vec![0; n],
            mark: vec![0; n],
            stamp: 0,
            scratch: Vec::with_capacity(n),
            second: std::cell::RefCell::new(Vec::with_capacity(n)),
            stack: Vec::with_capacity(n),
            xyz: {
                let mut v = Vec::with_capacity(n);
                for f in 0..grid.frames() {
                    for y in 0..grid.height() {
                        for x in 0..grid.width() {
                            v.push([f, y, x]);
                        }
                    }
                }
                v
            },
        }
    }

    /// Face neighbours of `t`, written into `out` (cleared first).
    #[inline]
    fn neighbours(&self, t: u32, out: &mut Vec<u32>) {
        out.clear();
        let c = self.xyz[t as usize];
        let dims = self.grid.dims();
        let strides = [dims[1] * dims[2], dims[2], 1];
        for ax in 0..3 {
            if c[ax] > 0 {
                out.push(t - strides[ax]);
            }
            if c[ax] + 1 < dims[ax] {
                out.push(t + strides[ax]);
            }
        }
    }

    /// The finished layout: `split` leaves every node's tokens in patch order, ascending
    /// within each patch, so the CSR lists are `all` itself.
    fn into_layout(self, all: Vec<u32>, r: u32) -> PatchLayout {
        let offsets: Vec<u32> = (0..=r).map(|k| self.p(k) as u32).collect();
        PatchLayout::from_parts(self.grid, self.patch_of, offsets, all)
    }

    /// First token index owned by patch `k` in the balanced size sequence.
    fn p(&self, k: u32) -> usize {
        (k as u64 * self.j / self.r_total) as usize
    }

    /// Assigns the (ascending) tokens of a node to patches `a..a + r`.
    fn split(&mut self, tokens: &mut [u32], a: u32, r: u32) {
        if r == 1 {
            for &t in tokens.iter() {
                self.patch_of[t as usize] = a;
            }
            return;
        }
        if let Some(r_f) = self.saliency_split(tokens, a, r) {
            let k = self.p(a + r_f) - self.p(a);
            let (focus, context) = tokens.split_at_mut(k);
            self.split(focus, a, r_f);
            self.split(context, a + r_f, r - r_f);
            return;
        }
        let r1 = r / 2;
        let k = self.p(a + r1) - self.p(a);
        self.spatial_cut(tokens, k);
        let (first, second) = tokens.split_at_mut(k);
        self.split(first, a, r1);
        self.split(second, a + r1, r - r1);
    }

    /// Tries a saliency split; on success reorders `tokens` as (focus, context), each part
    /// ascending, and returns the focus's patch count.
    fn saliency_split(&mut self, tokens: &mut [u32], a: u32, r: u32) -> Option<u32> {
        let s = self.saliency?;
        let mut hist = [0u32; BINS];
        for &t in tokens.iter() {
            hist[self.bins[t as usize] as usize] += 1;
        }
        let lo_bin = hist.iter().position(|&c| c > 0)?;
        let hi_bin = hist.iter().rposition(|&c| c > 0)?;
        // Flat nodes (most below the top) are split spatially without running Otsu.
        if hi_bin - lo_bin < self.min_bins {
            return None;
        }
        let (cut, separability) = otsu_hist(&hist)?;
        if separability < self.cfg.min_separability {
            return None;
        }
        let n = tokens.len() as u64;
        let n_f = hist[cut..].iter().map(|&c| c as u64).sum::<u64>();
        if n_f == 0 || n_f == n {
            return None;
        }
        let in_focus = |t: u32| self.bins[t as usize] as usize >= cut;
        let r_f = (r as u64 * n_f).div_ceil(n).clamp(1, r as u64 - 1) as u32;
        let k = self.p(a + r_f) - self.p(a);

        self.stamp += 1;
        let chosen = self.stamp;
        let mut focus: Vec<u32> = tokens.iter().copied().filter(|&t| in_focus(t)).collect();
        if focus.len() > k {
            // Keep the k most salient (ties: lower index), deterministic.
            focus.select_nth_unstable_by(k, |&x, &y| {
                s[y as usize].total_cmp(&s[x as usize]).then(x.cmp(&y))
            });
            focus.truncate(k);
        }
        for &t in &focus {
            self.mark[t as usize] = chosen;
        }
        if focus.len() < k {
            self.grow(tokens, &mut focus, k, chosen, s);
        }
        // Stable reorder: chosen tokens first, both parts stay ascending.
        self.scratch.clear();
        self.scratch.extend(
            tokens
                .iter()
                .copied()
                .filter(|&t| self.mark[t as usize] == chosen),
        );
        self.scratch.extend(
            tokens
                .iter()
                .copied()
                .filter(|&t| self.mark[t as usize] != chosen),
        );
        tokens.copy_from_slice(&self.scratch);
        Some(r_f)
    }

    /// Grows `focus` (tokens marked `chosen`) to `k` tokens inside the node, ring by ring in
    /// grid distance, the most salient first within a ring.
    fn grow(&mut self, node: &[u32], focus: &mut Vec<u32>, k: usize, chosen: u32, s: &[f32]) {
        self.stamp += 1;
        let in_node = self.stamp;
        for &t in node {
            if self.mark[t as usize] != chosen {
                self.mark[t as usize] = in_node;
            }
        }
        let mut ring: Vec<u32> = focus.clone();
        let mut next = Vec::new();
        let mut nb = Vec::with_capacity(6);
        while focus.len() < k && !ring.is_empty() {
            next.clear();
            for &t in &ring {
                self.neighbours(t, &mut nb);
                for &u in &nb {
                    if self.mark[u as usize] == in_node {
                        self.mark[u as usize] = in_node + 1; // queued, not yet chosen
                        next.push(u);
                    }
                }
            }
            next.sort_unstable_by(|&x, &y| s[y as usize].total_cmp(&s[x as usize]).then(x.cmp(&y)));
            for (i, &u) in next.iter().enumerate() {
                if focus.len() < k {
                    self.mark[u as usize] = chosen;
                    focus.push(u);
                } else {
                    // Not taken: back to plain node membership.
                    for &v in &next[i..] {
                        self.mark[v as usize] = in_node;
                    }
                    break;
                }
            }
            std::mem::swap(&mut ring, &mut next);
        }
        self.stamp += 1; // in_node + 1 was used as the "queued" mark
        if focus.len() < k {
            // The node is not connected to the focus everywhere: take the most salient rest.
            let mut rest: Vec<u32> = node
                .iter()
                .copied()
                .filter(|&t| self.mark[t as usize] != chosen)
                .collect();
            rest.sort_unstable_by(|&x, &y| s[y as usize].total_cmp(&s[x as usize]).then(x.cmp(&y)));
            for &u in rest.iter().take(k - focus.len()) {
                self.mark[u as usize] = chosen;
                focus.push(u);
            }
        }
    }

    /// Reorders the (ascending) node so its first `k` tokens are the part before a balanced
    /// cut across the longest axis of its bounding box; both parts stay ascending. A cut that
    /// ends mid-line takes the first or the last tokens of that line (raster order); on a
    /// non-rectangular node, where that choice can strand a corner, every axis and both ends
    /// are tried and the first cut leaving both parts connected wins.
    fn spatial_cut(&mut self, tokens: &mut [u32], k: usize) {
        let (mut lo, mut hi) = ([u32::MAX; 3], [0u32; 3]);
        for &t in tokens.iter() {
            let c = self.xyz[t as usize];
            for ax in 0..3 {
                lo[ax] = lo[ax].min(c[ax]);
                hi[ax] = hi[ax].max(c[ax]);
            }
        }
        let area: u64 = (0..3).map(|ax| (hi[ax] - lo[ax] + 1) as u64).product();
        let rectangle = area == tokens.len() as u64;
        // Longest extent first; ties prefer columns, then rows, then frames.
        let mut axes = [2usize, 1, 0];
        axes.sort_by_key(|&ax| std::cmp::Reverse((hi[ax] - lo[ax], ax)));
        let mut best: Option<(usize, Vec<u32>)> = None;
        for &axis in axes
            .iter()
            .filter(|&&ax| hi[ax] > lo[ax] || tokens.len() == 1)
        {
            for from_end in [false, true] {
                let (order, partial) =
                    self.cut_order(tokens, k, axis, lo[axis], hi[axis], from_end);
                if rectangle || !partial {
                    tokens.copy_from_slice(&order);
                    return;
                }
                let comps = self.count_components(&order[..k]) + self.count_components(&order[k..]);
                if comps == 2 {
                    tokens.copy_from_slice(&order);
                    return;
                }
                if best.as_ref().is_none_or(|(c, _)| comps < *c) {
                    best = Some((comps, order));
                }
            }
        }
        if let Some((_, order)) = best {
            tokens.copy_from_slice(&order);
        }
    }

    /// The node reordered as (first part of `k` tokens, rest) for a cut along `axis`, and
    /// whether the cut line is split between the parts.
    fn cut_order(
        &self,
        tokens: &[u32],
        k: usize,
        axis: usize,
        lo: u32,
        hi: u32,
        from_end: bool,
    ) -> (Vec<u32>, bool) {
        let mut count = vec![0usize; (hi - lo + 1) as usize];
        for &t in tokens {
            count[(self.xyz[t as usize][axis] - lo) as usize] += 1;
        }
        let (mut c, mut before) = (0usize, 0usize);
        while before + count[c] < k {
            before += count[c];
            c += 1;
        }
        let extra = k - before;
        let on_line = count[c];
        let cut = lo + c as u32;
        // Of the tokens on the cut line (raster order), the first part takes indices
        // [0, extra) or [on_line - extra, on_line).
        let take = if from_end {
            on_line - extra..on_line
        } else {
            0..extra
        };
        let mut first = Vec::with_capacity(tokens.len());
        let mut second = std::mem::take(&mut *self.second.borrow_mut());
        second.clear();
        let mut seen_on_line = 0usize;
        for &t in tokens {
            let v = self.xyz[t as usize][axis];
            let in_first = if v == cut {
                seen_on_line += 1;
                take.contains(&(seen_on_line - 1))
            } else {
                v < cut
            };
            if in_first {
                first.push(t);
            } else {
                second.push(t);
            }
        }
        first.extend_from_slice(&second);
        *self.second.borrow_mut() = second;
        (first, extra > 0 && extra < on_line)
    }

    /// Face-connected components of a set of tokens.
    fn count_components(&mut self, part: &[u32]) -> usize {
        self.stamp += 2;
        let (member, visited) = (self.stamp - 1, self.stamp);
        for &t in part {
            self.mark[t as usize] = member;
        }
        let (mut comps, mut nb) = (0, Vec::with_capacity(6));
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        for &start in part {
            if self.mark[start as usize] != member {
                continue;
            }
            comps += 1;
            self.mark[start as usize] = visited;
            stack.push(start);
            while let Some(t) = stack.pop() {
                self.neighbours(t, &mut nb);
                for &u in &nb {
                    if self.mark[u as usize] == member {
                        self.mark[u as usize] = visited;
                        stack.push(u);
                    }
                }
            }
        }
        self.stack = stack;
        comps
    }
}
