//! Property tests: every layout passes the independent checker; structured maps give coherent
//! layouts; bad input gives the error that names it.

use flashdiff_partitioner::checker::{check_layout, components};
use flashdiff_partitioner::{
    partition_saliency, partition_uniform, salient_mask, split_words, GranularityConfig,
    GranularityController, Grid, PartitionError,
};
use proptest::prelude::*;

fn grid_and_r() -> impl Strategy<Value = (Grid, u32)> {
    (1u32..=3, 1u32..=20, 1u32..=20).prop_flat_map(|(f, h, w)| {
        let g = Grid::new(f, h, w).unwrap();
        (Just(g), 1..=g.tokens())
    })
}

/// A map with one rectangular object of `bh x bw` at (y, x) on a flat background.
fn object_map(g: Grid, y: u32, x: u32, bh: u32, bw: u32, hi: f32) -> Vec<f32> {
    (0..g.tokens())
        .map(|t| {
            let c = g.coords(t);
            let inside = c[1] >= y && c[1] < y + bh && c[2] >= x && c[2] < x + bw;
            if inside {
                hi
            } else {
                0.05
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_map_gives_a_checked_deterministic_layout(
        (grid, r) in grid_and_r(),
        seed in any::<u64>(),
    ) {
        let mut x = seed | 1;
        let map: Vec<f32> = (0..grid.tokens()).map(|_| {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            (x % 1000) as f32 / 1000.0
        }).collect();
        let l = partition_saliency(grid, &map, r).unwrap();
        prop_assert_eq!(check_layout(&l, r), Ok(()));
        prop_assert_eq!(&l, &partition_saliency(grid, &map, r).unwrap());
        let u = partition_uniform(grid, r).unwrap();
        prop_assert_eq!(check_layout(&u, r), Ok(()));
    }

    /// Balanced cuts may end mid-line, so a patch can be an L or a staircase; a later cut of
    /// such a piece can leave a corner apart. Bound: at most two components per patch, and
    /// exactly one whenever R divides the grid into whole rectangles (checked below).
    #[test]
    fn uniform_patches_are_coherent((grid, r) in grid_and_r()) {
        let u = partition_uniform(grid, r).unwrap();
        for p in 0..r {
            prop_assert!(components(&u, p) <= 2, "patch {} of {:?} R={}", p, grid, r);
        }
    }

    #[test]
    fn uniform_power_of_two_grids_give_rectangles(h in 0u32..=6, w in 0u32..=6, k in 0u32..=6) {
        let g = Grid::image(1 << h, 1 << w).unwrap();
        let r = 1u32 << k.min(h + w);
        let u = partition_uniform(g, r).unwrap();
        for p in 0..r {
            prop_assert_eq!(components(&u, p), 1);
            let ts = u.patch_tokens(p);
            let (a, b) = (g.coords(ts[0]), g.coords(*ts.last().unwrap()));
            prop_assert_eq!(((b[1] - a[1] + 1) * (b[2] - a[2] + 1)) as usize, ts.len(), "patch {} is not a rectangle", p);
        }
    }

    /// An object smaller than one patch stays whole in one connected patch; a bigger one is
    /// spread over no more patches than its size needs (ceil(size / (J/R)), plus one for the
    /// ragged edge of balanced cuts).
    #[test]
    fn an_object_stays_in_as_few_patches_as_its_size_allows(
        h in 8u32..=32, w in 8u32..=32, r in 2u32..=16,
        fy in 0.0f32..1.0, fx in 0.0f32..1.0, fh in 0.05f32..0.5, fw in 0.05f32..0.5,
    ) {
        let g = Grid::image(h, w).unwrap();
        let (bh, bw) = (((h as f32 * fh) as u32).max(1), ((w as f32 * fw) as u32).max(1));
        let (y, x) = (((h - bh) as f32 * fy) as u32, ((w - bw) as f32 * fx) as u32);
        let map = object_map(g, y, x, bh, bw, 1.0);
        let l = partition_saliency(g, &map, r).unwrap();
        prop_assert_eq!(check_layout(&l, r), Ok(()));
        let mut touched: Vec<u32> = (0..g.tokens())
            .filter(|&t| map[t as usize] > 0.5)
            .map(|t| l.patch_of()[t as usize])
            .collect();
        touched.sort_unstable();
        touched.dedup();
        let per_patch = (g.tokens() / r) as usize;
        let size = (bh * bw) as usize;
        let needed = size.div_ceil(per_patch);
        if size <= per_patch {
            prop_assert_eq!(touched.len(), 1, "object of {} tokens split over {:?}", size, touched);
            prop_assert_eq!(components(&l, touched[0]), 1);
        } else {
            prop_assert!(touched.len() <= needed + 1, "{} tokens over {} patches", size, touched.len());
        }
    }

    #[test]
    fn bad_r_and_bad_values_are_named((grid, _r) in grid_and_r(), bad in prop_oneof![Just(f32::NAN), Just(f32::INFINITY), Just(-1.0f32)], at in any::<prop::sample::Index>()) {
        let j = grid.tokens();
        let mut map = vec![0.5f32; j as usize];
        prop_assert!(matches!(partition_saliency(grid, &map, 0), Err(PartitionError::BadPatchCount { requested: 0, .. })), "R = 0 accepted");
        prop_assert!(matches!(partition_saliency(grid, &map, j + 1), Err(PartitionError::BadPatchCount { .. })), "R > J accepted");
        let i = at.index(j as usize);
        map[i] = bad;
        let is_bad_value = matches!(partition_saliency(grid, &map, 1), Err(PartitionError::BadValue { what: "saliency", index, .. }) if index == i);
        prop_assert!(is_bad_value);
        let is_mismatch = matches!(partition_saliency(grid, &map[1..], 1), Err(PartitionError::LengthMismatch { .. }));
        prop_assert!(is_mismatch);
    }

    #[test]
    fn controller_stays_in_bounds_and_converges(opt in 2u32..=16, scale in 0.1f64..10.0) {
        let mut c = GranularityController::new(GranularityConfig::default()).unwrap();
        for _ in 0..40 {
            let r = c.current();
            prop_assert!((2..=16).contains(&r));
            c.observe(r, scale * (1.0 + (r as f64 - opt as f64).abs())).unwrap();
        }
        prop_assert!(c.converged());
        prop_assert_eq!(c.current(), opt);
    }
}

#[test]
fn degenerate_maps_give_sensible_layouts() {
    let g = Grid::image(8, 8).unwrap();
    // Constant map: identical to the uniform layout (spatial cuts only).
    let flat = vec![0.3f32; 64];
    assert_eq!(
        partition_saliency(g, &flat, 4).unwrap(),
        partition_uniform(g, 4).unwrap()
    );
    // One hot token: it lands in a connected patch of 16 tokens around it.
    let mut hot = vec![0.0f32; 64];
    hot[27] = 1.0;
    let l = partition_saliency(g, &hot, 4).unwrap();
    let p = l.patch_of()[27];
    assert_eq!(components(&l, p), 1);
    for n in [19u32, 26, 28, 35] {
        assert_eq!(
            l.patch_of()[n as usize],
            p,
            "neighbour {n} of the hot token"
        );
    }
    // R = 1 and R = J.
    assert_eq!(partition_saliency(g, &hot, 1).unwrap().sizes(), vec![64]);
    let all = partition_saliency(g, &hot, 64).unwrap();
    assert_eq!(check_layout(&all, 64), Ok(()));
}

#[test]
fn moving_optimum_is_found_again() {
    let mut c = GranularityController::new(GranularityConfig::default()).unwrap();
    for _ in 0..40 {
        let r = c.current();
        c.observe(r, 1.0 + (r as f64 - 4.0).powi(2)).unwrap();
    }
    assert_eq!(c.current(), 4);
    // The workload changes: the optimum moves to 12 and costs rise at R = 4.
    for _ in 0..80 {
        let r = c.current();
        c.observe(r, 1.0 + (r as f64 - 12.0).powi(2)).unwrap();
    }
    assert!(c.searches() >= 2);
    assert_eq!(c.current(), 12);
}

#[test]
fn drawbench_prompts_keep_content_words() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/data/prompts/drawbench200.txt"
    );
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipped: {path} not found (the shared data folder sits beside the checkout)");
        return;
    };
    let mut prompts = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let words = split_words(line);
        let mask = salient_mask(&words);
        prompts += 1;
        for (w, m) in words.iter().zip(&mask) {
            let lw = w.to_lowercase();
            let lw = lw.trim_matches(|c: char| !c.is_alphanumeric());
            if ["a", "an", "the", "on", "of", "and", "with", "in", "is"].contains(&lw) {
                assert!(!m, "function word {w:?} marked salient in {line:?}");
            }
        }
        // Every real prompt has something to look at.
        assert!(mask.iter().any(|&m| m), "no salient word in {line:?}");
    }
    assert!(prompts >= 190, "read only {prompts} prompts");
    let words = split_words("A black colored dog.");
    assert_eq!(salient_mask(&words), [false, true, true, true]);
}

#[test]
fn grids_have_a_token_bound() {
    use flashdiff_partitioner::MAX_TOKENS;
    assert!(Grid::new(1, 4096, 4096).is_ok());
    assert_eq!(4096 * 4096, MAX_TOKENS);
    for (f, h, w) in [
        (1, 4096, 4097),
        (2, 4096, 4096),
        (1, 65535, 65535),
        (u32::MAX, u32::MAX, 1),
    ] {
        assert!(
            matches!(Grid::new(f, h, w), Err(PartitionError::BadGrid { .. })),
            "{f}x{h}x{w}"
        );
    }
}
