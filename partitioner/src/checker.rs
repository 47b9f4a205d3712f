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
            grid.neighbours(t, &mut nb);
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
