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
//!
//! Cost: a node is a list of row runs, so bounding boxes, per-line counts, cuts and the
//! connectivity check are O(runs); tokens are touched by the one-time quantisation of the
//! map, a byte histogram per node whose ancestors were not flat, the focus selection of a
//! saliency split, and the leaves. 128x128 at R = 16: about 145 us on one core (criterion,
//! `cargo bench -p flashdiff-partitioner`), against about 1.1 ms for the token-list version
//! this replaced (same layouts, compared on 20 000 random maps before it was removed).

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
    ctx.split(Ctx::root(grid), grid.tokens() as usize, 0, r);
    Ok(ctx.into_layout(r))
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
    ctx.split(Ctx::root(grid), grid.tokens() as usize, 0, r);
    Ok(ctx.into_layout(r))
}

/// A maximal run of consecutive tokens inside one row of the grid: `len` tokens from
/// `[f, y, x]`. A recursion node is a list of runs in raster order, so every spatial step
/// (bounding box, per-line counts, cuts, connectivity) costs O(runs), not O(tokens); only
/// saliency histograms and leaves touch single tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    f: u32,
    y: u32,
    x: u32,
    len: u32,
}

impl Run {
    fn row(&self) -> (u32, u32) {
        (self.f, self.y)
    }

    fn end(&self) -> u32 {
        self.x + self.len
    }
}

/// Appends a run, merging it into the previous one when they touch in the same row; empty
/// runs are dropped. Keeps runs maximal, which the connectivity count relies on only for
/// speed (touching runs are also joined there).
fn push_run(v: &mut Vec<Run>, r: Run) {
    if r.len == 0 {
        return;
    }
    if let Some(last) = v.last_mut() {
        if last.row() == r.row() && last.end() == r.x {
            last.len += r.len;
            return;
        }
    }
    v.push(r);
}

/// Outcome of a saliency split attempt.
enum Split {
    /// Focus patch count, focus runs, context runs.
    Done(u32, Vec<Run>, Vec<Run>),
    /// The node's saliency range is below the contrast bar (so is every sub-node's).
    Flat,
    /// Not bimodal enough here; sub-nodes may still be.
    No,
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
    /// Tokens grouped by patch, ascending within a patch: the CSR lists of the layout.
    out: Vec<u32>,
    /// Per-token stamp: which node / BFS pass last touched the token.
    mark: Vec<u32>,
    stamp: u32,
    /// Reused per-line counts and neighbour list.
    count: Vec<i64>,
    nb: Vec<u32>,
}

impl<'a> Ctx<'a> {
    fn new(grid: Grid, r: u32, saliency: Option<&'a [f32]>, cfg: PartitionConfig) -> Self {
        let n = grid.tokens() as usize;
        let mut bins = Vec::new();
        if let Some(s) = saliency {
            // The map is validated finite and non-negative, where the order of the bit
            // patterns is the order of the values once -0.0 (which passes `>= 0.0`) has its
            // sign cleared: integer min/max vectorises.
            let (lo, hi) = s.iter().fold((u32::MAX, 0u32), |(a, b), v| {
                let bits = v.to_bits() & 0x7FFF_FFFF;
                (a.min(bits), b.max(bits))
            });
            let (lo, hi) = (f32::from_bits(lo), f32::from_bits(hi));
            let scale = if hi > lo {
                BINS as f32 / (hi - lo)
            } else {
                0.0
            };
            bins = s
                .iter()
                .map(|&v| (((v - lo) * scale) as i32).min(BINS as i32 - 1) as u8)
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
            out: vec![0; n],
            mark: Vec::new(),
            stamp: 0,
            count: Vec::new(),
            nb: Vec::with_capacity(6),
        }
    }

    /// The whole grid as runs: one per row.
    fn root(grid: Grid) -> Vec<Run> {
        let mut runs = Vec::with_capacity((grid.frames() * grid.height()) as usize);
        for f in 0..grid.frames() {
            for y in 0..grid.height() {
                runs.push(Run {
                    f,
                    y,
                    x: 0,
                    len: grid.width(),
                });
            }
        }
        runs
    }

    fn start(&self, r: &Run) -> u32 {
        self.grid.index([r.f, r.y, r.x])
    }

    /// The tokens of a node, ascending.
    fn tokens_of(&self, runs: &[Run]) -> Vec<u32> {
        let mut v = Vec::new();
        for r in runs {
            let s = self.start(r);
            v.extend(s..s + r.len);
        }
        v
    }

    /// Maximal runs of ascending tokens.
    fn runs_of(&self, tokens: impl Iterator<Item = u32>) -> Vec<Run> {
        let mut v = Vec::new();
        for t in tokens {
            let [f, y, x] = self.grid.coords(t);
            push_run(&mut v, Run { f, y, x, len: 1 });
        }
        v
    }

    /// The finished layout: leaves wrote their tokens at their patches' offsets.
    fn into_layout(self, r: u32) -> PatchLayout {
        let offsets: Vec<u32> = (0..=r).map(|k| self.p(k) as u32).collect();
        PatchLayout::from_parts(self.grid, self.patch_of, offsets, self.out)
    }

    /// First token index owned by patch `k` in the balanced size sequence.
    fn p(&self, k: u32) -> usize {
        (k as u64 * self.j / self.r_total) as usize
    }

    /// Assigns the `n` tokens of a node (runs in raster order) to patches `a..a + r`.
    fn split(&mut self, node: Vec<Run>, n: usize, a: u32, r: u32) {
        self.split_node(node, n, a, r, false);
    }

    /// `flat`: an ancestor's saliency range was below the contrast bar, so this node's is
    /// too (a subset's range never grows) and no saliency split is tried.
    fn split_node(&mut self, node: Vec<Run>, n: usize, a: u32, r: u32, flat: bool) {
        if r == 1 {
            let mut at = self.p(a);
            for run in &node {
                let s = self.start(run);
                for t in s..s + run.len {
                    self.patch_of[t as usize] = a;
                    self.out[at] = t;
                    at += 1;
                }
            }
            debug_assert_eq!(at, self.p(a + 1));
            return;
        }
        let mut flat = flat;
        if !flat {
            match self.saliency_split(&node, n, a, r) {
                Split::Done(r_f, focus, context) => {
                    drop(node);
                    let k = self.p(a + r_f) - self.p(a);
                    self.split_node(focus, k, a, r_f, false);
                    self.split_node(context, n - k, a + r_f, r - r_f, false);
                    return;
                }
                Split::Flat => flat = true,
                Split::No => {}
            }
        }
        let r1 = r / 2;
        let k = self.p(a + r1) - self.p(a);
        let (first, second) = self.spatial_cut(&node, n, k);
        drop(node);
        self.split_node(first, k, a, r1, flat);
        self.split_node(second, n - k, a + r1, r - r1, flat);
    }

    /// Tries a saliency split; on success returns the focus's patch count and the node cut
    /// into (focus, context) runs.
    fn saliency_split(&mut self, node: &[Run], n: usize, a: u32, r: u32) -> Split {
        let Some(s) = self.saliency else {
            return Split::Flat;
        };
        // Four interleaved histograms: neighbouring tokens mostly share a bin, and one
        // histogram would serialise on that counter.
        let mut part = [[0u32; BINS]; 4];
        for run in node {
            let st = self.start(run) as usize;
            let bytes = &self.bins[st..st + run.len as usize];
            let mut quads = bytes.chunks_exact(4);
            for q in &mut quads {
                part[0][q[0] as usize] += 1;
                part[1][q[1] as usize] += 1;
                part[2][q[2] as usize] += 1;
                part[3][q[3] as usize] += 1;
            }
            for &b in quads.remainder() {
                part[0][b as usize] += 1;
            }
        }
        let mut hist = [0u32; BINS];
        for (b, h) in hist.iter_mut().enumerate() {
            *h = part[0][b] + part[1][b] + part[2][b] + part[3][b];
        }
        let lo_bin = hist.iter().position(|&c| c > 0).unwrap_or(0);
        let hi_bin = hist.iter().rposition(|&c| c > 0).unwrap_or(0);
        // Flat nodes (most below the top) are split spatially without running Otsu.
        if hi_bin - lo_bin < self.min_bins {
            return Split::Flat;
        }
        let Some((cut, separability)) = otsu_hist(&hist) else {
            return Split::No;
        };
        if separability < self.cfg.min_separability {
            return Split::No;
        }
        let n_f = hist[cut..].iter().map(|&c| c as u64).sum::<u64>();
        if n_f == 0 || n_f == n as u64 {
            return Split::No;
        }
        let r_f = (r as u64 * n_f).div_ceil(n as u64).clamp(1, r as u64 - 1) as u32;
        let k = self.p(a + r_f) - self.p(a);

        if self.mark.is_empty() {
            self.mark = vec![0; self.grid.tokens() as usize];
        }
        let tokens = self.tokens_of(node);
        self.stamp += 1;
        let chosen = self.stamp;
        let mut focus: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| self.bins[t as usize] as usize >= cut)
            .collect();
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
            self.grow(&tokens, &mut focus, k, chosen, s);
        }
        let mark = &self.mark;
        let first = self.runs_of(
            tokens
                .iter()
                .copied()
                .filter(|&t| mark[t as usize] == chosen),
        );
        let second = self.runs_of(
            tokens
                .iter()
                .copied()
                .filter(|&t| mark[t as usize] != chosen),
        );
        Split::Done(r_f, first, second)
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
        let mut nb = std::mem::take(&mut self.nb);
        while focus.len() < k && !ring.is_empty() {
            next.clear();
            for &t in &ring {
                self.grid.neighbours(t, &mut nb);
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
        self.nb = nb;
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

    /// Cuts a node of `n` tokens into a first part of `k` tokens and the rest, across the
    /// longest axis of its bounding box. A cut that ends mid-line gives the first part the
    /// first or the last tokens of that line (raster order); on a non-rectangular node, where
    /// that choice can strand a corner, every axis and both ends are tried and the first cut
    /// leaving both parts connected wins (else the one with the fewest components).
    fn spatial_cut(&mut self, node: &[Run], n: usize, k: usize) -> (Vec<Run>, Vec<Run>) {
        let (mut lo, mut hi) = ([u32::MAX; 3], [0u32; 3]);
        for r in node {
            for (ax, (a, b)) in [(r.f, r.f), (r.y, r.y), (r.x, r.end() - 1)]
                .into_iter()
                .enumerate()
            {
                lo[ax] = lo[ax].min(a);
                hi[ax] = hi[ax].max(b);
            }
        }
        let area: u64 = (0..3).map(|ax| (hi[ax] - lo[ax] + 1) as u64).product();
        let rectangle = area == n as u64;
        // Longest extent first; ties prefer columns, then rows, then frames.
        let mut axes = [2usize, 1, 0];
        axes.sort_by_key(|&ax| std::cmp::Reverse((hi[ax] - lo[ax], ax)));
        let mut best: Option<(usize, Vec<Run>, Vec<Run>)> = None;
        for &axis in axes.iter().filter(|&&ax| hi[ax] > lo[ax] || n == 1) {
            for from_end in [false, true] {
                let (first, second, partial) =
                    self.cut_runs(node, k, axis, lo[axis], hi[axis], from_end);
                if rectangle || !partial {
                    return (first, second);
                }
                let comps = self.components(&first) + self.components(&second);
                if comps == 2 {
                    return (first, second);
                }
                if best.as_ref().is_none_or(|(c, _, _)| comps < *c) {
                    best = Some((comps, first, second));
                }
            }
        }
        match best {
            Some((_, first, second)) => (first, second),
            None => unreachable!("a node of {n} tokens has an axis to cut"),
        }
    }

    /// The node cut along `axis` into (first `k` tokens, rest), and whether the cut line is
    /// split between the parts. Of the tokens on the cut line (raster order) the first part
    /// takes a prefix, or a suffix when `from_end`.
    fn cut_runs(
        &mut self,
        node: &[Run],
        k: usize,
        axis: usize,
        lo: u32,
        hi: u32,
        from_end: bool,
    ) -> (Vec<Run>, Vec<Run>, bool) {
        let lines = (hi - lo + 1) as usize;
        self.count.clear();
        self.count.resize(lines + 1, 0);
        for r in node {
            match axis {
                0 => self.count[(r.f - lo) as usize] += r.len as i64,
                1 => self.count[(r.y - lo) as usize] += r.len as i64,
                _ => {
                    // Difference array: +1 over the run's columns.
                    self.count[(r.x - lo) as usize] += 1;
                    self.count[(r.end() - lo) as usize] -= 1;
                }
            }
        }
        if axis == 2 {
            for c in 1..=lines {
                self.count[c] += self.count[c - 1];
            }
        }
        let (mut c, mut before) = (0usize, 0usize);
        while before + (self.count[c] as usize) < k {
            before += self.count[c] as usize;
            c += 1;
        }
        let extra = k - before;
        let on_line = self.count[c] as usize;
        let cut = lo + c as u32;
        let (take_lo, take_hi) = if from_end {
            (on_line - extra, on_line)
        } else {
            (0, extra)
        };
        let (mut first, mut second) = (Vec::new(), Vec::new());
        let mut seen = 0usize; // tokens of the cut line met so far, in raster order
        for &r in node {
            if axis == 2 {
                if r.end() <= cut {
                    push_run(&mut first, r);
                } else if r.x > cut {
                    push_run(&mut second, r);
                } else {
                    let left = cut - r.x;
                    push_run(&mut first, Run { len: left, ..r });
                    let on = Run {
                        x: cut,
                        len: 1,
                        ..r
                    };
                    if (take_lo..take_hi).contains(&seen) {
                        push_run(&mut first, on);
                    } else {
                        push_run(&mut second, on);
                    }
                    seen += 1;
                    push_run(
                        &mut second,
                        Run {
                            x: cut + 1,
                            len: r.end() - cut - 1,
                            ..r
                        },
                    );
                }
                continue;
            }
            let v = if axis == 0 { r.f } else { r.y };
            if v < cut {
                push_run(&mut first, r);
            } else if v > cut {
                push_run(&mut second, r);
            } else {
                // Ordinals seen..seen + len on the line; [take_lo, take_hi) go first.
                let (a, b) = (seen, seen + r.len as usize);
                let i0 = take_lo.clamp(a, b);
                let i1 = take_hi.clamp(a, b);
                let piece = |from: usize, to: usize| Run {
                    x: r.x + (from - a) as u32,
                    len: (to - from) as u32,
                    ..r
                };
                push_run(&mut second, piece(a, i0));
                push_run(&mut first, piece(i0, i1));
                push_run(&mut second, piece(i1, b));
                seen = b;
            }
        }
        (first, second, extra > 0 && extra < on_line)
    }

    /// Face-connected components of a set of runs (raster order), by union-find over runs
    /// that touch in a row, across neighbouring rows, or across neighbouring frames.
    fn components(&mut self, runs: &[Run]) -> usize {
        let mut parent: Vec<u32> = (0..runs.len() as u32).collect();
        fn find(p: &mut [u32], mut i: u32) -> u32 {
            while p[i as usize] != i {
                p[i as usize] = p[p[i as usize] as usize];
                i = p[i as usize];
            }
            i
        }
        let mut comps = runs.len();
        let mut union = |p: &mut Vec<u32>, a: usize, b: usize| {
            let (ra, rb) = (find(p, a as u32), find(p, b as u32));
            if ra != rb {
                p[ra.max(rb) as usize] = ra.min(rb);
                comps -= 1;
            }
        };
        // Rows: [begin, end) ranges of runs sharing (f, y), in raster order.
        let mut rows: Vec<(u32, u32, usize, usize)> = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            match rows.last_mut() {
                Some(last) if (last.0, last.1) == r.row() => last.3 = i + 1,
                _ => rows.push((r.f, r.y, i, i + 1)),
            }
        }
        for i in 1..runs.len() {
            let (a, b) = (&runs[i - 1], &runs[i]);
            if a.row() == b.row() && a.end() == b.x {
                union(&mut parent, i - 1, i);
            }
        }
        for (ri, &(f, y, b0, b1)) in rows.iter().enumerate() {
            // The row above in the same frame, and the same row in the frame before.
            let above = (y > 0)
                .then(|| {
                    rows[..ri]
                        .binary_search_by_key(&(f, y - 1), |r| (r.0, r.1))
                        .ok()
                })
                .flatten();
            let before = (f > 0)
                .then(|| {
                    rows[..ri]
                        .binary_search_by_key(&(f - 1, y), |r| (r.0, r.1))
                        .ok()
                })
                .flatten();
            for other in [above, before].into_iter().flatten() {
                let (_, _, a0, a1) = rows[other];
                let (mut i, mut j) = (a0, b0);
                while i < a1 && j < b1 {
                    let (p, q) = (&runs[i], &runs[j]);
                    if p.x < q.end() && q.x < p.end() {
                        union(&mut parent, i, j);
                    }
                    if p.end() <= q.end() {
                        i += 1;
                    } else {
                        j += 1;
                    }
                }
            }
        }
        comps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(grid: Grid) -> Ctx<'static> {
        Ctx::new(grid, 1, None, PartitionConfig::default())
    }

    #[test]
    fn components_of_runs_match_face_connectivity() {
        let grid = Grid::new(2, 4, 5).unwrap();
        let mut c = ctx(grid);
        // Frame 0: a ring around (1..3, 1..4) minus its centre row's middle; frame 1: one
        // token under the ring's corner (joins through frames) and one isolated token.
        let ring: Vec<u32> = [
            [0, 0, 1],
            [0, 0, 2],
            [0, 0, 3],
            [0, 1, 1],
            [0, 1, 3],
            [0, 2, 1],
            [0, 2, 2],
            [0, 2, 3],
        ]
        .iter()
        .map(|&p| grid.index(p))
        .collect();
        let runs = c.runs_of(ring.iter().copied());
        assert_eq!(runs.len(), 4);
        assert_eq!(c.components(&runs), 1);
        let mut more = ring.clone();
        more.extend([grid.index([1, 0, 1]), grid.index([1, 3, 4])]);
        more.sort_unstable();
        let runs = c.runs_of(more.iter().copied());
        assert_eq!(c.components(&runs), 2);
        // Diagonal neighbours are not face neighbours.
        let diag = c.runs_of([grid.index([0, 0, 0]), grid.index([0, 1, 1])].into_iter());
        assert_eq!(c.components(&diag), 2);
    }

    #[test]
    fn cuts_keep_raster_order_and_sizes() {
        let grid = Grid::image(6, 7).unwrap();
        let mut c = ctx(grid);
        let node = Ctx::root(grid);
        for axis in [1usize, 2] {
            for from_end in [false, true] {
                for k in 1..42 {
                    let hi = if axis == 1 { 5 } else { 6 };
                    let (a, b, partial) = c.cut_runs(&node, k, axis, 0, hi, from_end);
                    let (ta, tb) = (c.tokens_of(&a), c.tokens_of(&b));
                    assert_eq!(ta.len(), k);
                    assert_eq!(ta.len() + tb.len(), 42);
                    assert!(ta.windows(2).all(|w| w[0] < w[1]));
                    assert!(tb.windows(2).all(|w| w[0] < w[1]));
                    let line = if axis == 1 { 7 } else { 6 };
                    assert_eq!(partial, k % line != 0, "axis {axis} k {k}");
                }
            }
        }
    }

    #[test]
    fn negative_zero_is_zero() {
        let grid = Grid::image(6, 6).unwrap();
        let mut map: Vec<f32> = (0..36).map(|t| if t % 6 < 2 { 1.0 } else { 0.0 }).collect();
        let want = partition_saliency(grid, &map, 4).unwrap();
        for v in map.iter_mut().filter(|v| **v == 0.0) {
            *v = -0.0;
        }
        assert_eq!(partition_saliency(grid, &map, 4).unwrap(), want);
    }
}
