//! Independent checker for patch layouts: re-derives every property from the raw token -> patch
//! map with its own code, sharing nothing with the partitioner but the types.

use crate::{Grid, PatchLayout};

/// Checks that `layout` is a valid `r`-patch layout of its grid: every token in exactly one
/// patch, CSR lists consistent with the map and ascending, no empty patch, and balanced sizes
/// (every patch holds `floor(J/R)` or `ceil(J/R)` tokens).
pub fn check_layout(layout: &PatchLayout, r: u32) -> Result<(), String> {
    let grid = layout.grid();
    let j = grid.tokens() as usize;
    if layout.patches() != r {
        return Err(format!("{} patches, expected {r}", layout.patches()));
    }
    if layout.patch_of().len() != j || layout.tokens().len() != j {
        return Err(format!("map or lists do not have {j} tokens"));
    }
    let mut seen = vec![false; j];
    let offsets = layout.offsets();
    if offsets.len() != r as usize + 1 || offsets[0] != 0 || offsets[r as usize] as usize != j {
        return Err("offsets do not span the token list".into());
    }
    let lo = j / r as usize;
    let hi = j.div_ceil(r as usize);
    for p in 0..r as usize {
        let (a, b) = (offsets[p] as usize, offsets[p + 1] as usize);
        if b < a {
            return Err(format!("offsets decrease at patch {p}"));
        }
        let size = b - a;
        if size < lo || size > hi {
            return Err(format!(
                "patch {p} has {size} tokens, balance needs {lo}..={hi}"
            ));
        }
        let list = &layout.tokens()[a..b];
        for w in list.windows(2) {
            if w[0] >= w[1] {
                return Err(format!("patch {p} list is not strictly ascending"));
            }
        }
        for &t in list {
            let t = t as usize;
            if t >= j {
                return Err(format!("patch {p} lists token {t} outside the grid"));
            }
            if seen[t] {
                return Err(format!("token {t} appears twice"));
            }
            seen[t] = true;
            if layout.patch_of()[t] as usize != p {
                return Err(format!(
                    "token {t} listed in patch {p} but mapped to {}",
                    layout.patch_of()[t]
                ));
            }
        }
    }
    if let Some(t) = seen.iter().position(|&s| !s) {
        return Err(format!("token {t} is in no patch"));
    }
    Ok(())
}

/// The tokens sharing a face with `t` (frame, row or column one apart), from the raster
/// order `t = (f * height + y) * width + x` alone: the checker does not trust the grid's own
/// neighbour walk, which the partitioner uses.
fn face_neighbours(grid: Grid, t: u32, out: &mut Vec<u32>) {
    let (h, w) = (grid.height(), grid.width());
    let (f, y, x) = (t / (h * w), (t / w) % h, t % w);
    let at = |f: u32, y: u32, x: u32| (f * h + y) * w + x;
    out.clear();
    for (ok, u) in [(f > 0, f.wrapping_sub(1)), (f + 1 < grid.frames(), f + 1)] {
        if ok {
            out.push(at(u, y, x));
        }
    }
    for (ok, u) in [(y > 0, y.wrapping_sub(1)), (y + 1 < h, y + 1)] {
        if ok {
            out.push(at(f, u, x));
        }
    }
    for (ok, u) in [(x > 0, x.wrapping_sub(1)), (x + 1 < w, x + 1)] {
        if ok {
            out.push(at(f, y, u));
        }
    }
}

/// Number of face-connected components of patch `p` (flood fill over the grid).
pub fn components(layout: &PatchLayout, p: u32) -> usize {
    let grid: Grid = layout.grid();
    let map = layout.patch_of();
    let mut seen = vec![false; map.len()];
    let mut stack = Vec::new();
    let mut nb = Vec::new();
    let mut count = 0;
    for &start in layout.patch_tokens(p) {
        if seen[start as usize] {
            continue;
        }
        count += 1;
        seen[start as usize] = true;
        stack.push(start);
        while let Some(t) = stack.pop() {
            face_neighbours(grid, t, &mut nb);
            for &u in &nb {
                if map[u as usize] == p && !seen[u as usize] {
                    seen[u as usize] = true;
                    stack.push(u);
                }
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens two apart in a row are not face neighbours, whatever the grid's own walk says:
    /// a patch of the first and third tokens of a row is in two pieces.
    #[test]
    fn components_count_face_connectivity_only() {
        let grid = Grid::new(2, 1, 3).unwrap();
        let layout = PatchLayout::from_assignment(grid, vec![0, 1, 0, 1, 1, 1], 2).unwrap();
        assert_eq!(components(&layout, 0), 2);
        assert_eq!(components(&layout, 1), 1);
        let mut nb = Vec::new();
        face_neighbours(grid, 4, &mut nb);
        nb.sort_unstable();
        assert_eq!(
            nb,
            [1, 3, 5],
            "token (1, 0, 1): the frame before, its row's two ends"
        );
    }
}
