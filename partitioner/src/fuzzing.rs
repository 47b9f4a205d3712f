//! Fuzz harness (feature `fuzzing`): arbitrary bytes become a grid, a saliency map and R; both
//! partitioners run, valid input must give a layout the checker accepts, invalid input must
//! give the matching error, and a second run must give the same layout.

use crate::checker::check_layout;
use crate::{partition_saliency, partition_uniform, Grid, PartitionError};

/// Runs one fuzz case. Panics on any violated property.
pub fn partition(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let (f, h, w) = (
        1 + (data[0] % 3) as u32,
        1 + (data[1] % 24) as u32,
        1 + (data[2] % 24) as u32,
    );
    let grid = Grid::new(f, h, w).expect("small dims are valid");
    let j = grid.tokens();
    let r = data[3] as u32 % (j + 2); // 0 and j + 1 are invalid on purpose
    let body = &data[4..];
    let saliency: Vec<f32> = (0..j as usize)
        .map(
            |i| match body.get(i % body.len().max(1)).copied().unwrap_or(0) {
                255 => f32::NAN,
                254 => f32::INFINITY,
                b => b as f32 / 253.0,
            },
        )
        .collect();
    let map_ok = saliency.iter().all(|v| v.is_finite());
    let r_ok = r >= 1 && r <= j;

    match partition_uniform(grid, r) {
        Ok(l) => {
            assert!(r_ok);
            check_layout(&l, r).unwrap_or_else(|e| panic!("uniform {grid:?} R={r}: {e}"));
        }
        Err(e) => assert!(!r_ok && matches!(e, PartitionError::BadPatchCount { .. })),
    }
    match partition_saliency(grid, &saliency, r) {
        Ok(l) => {
            assert!(r_ok && map_ok);
            check_layout(&l, r).unwrap_or_else(|e| panic!("saliency {grid:?} R={r}: {e}"));
            let again = partition_saliency(grid, &saliency, r).expect("same input");
            assert_eq!(l, again, "partition is not deterministic");
        }
        Err(PartitionError::BadValue { .. }) => assert!(!map_ok),
        Err(PartitionError::BadPatchCount { .. }) => assert!(!r_ok && map_ok),
        Err(e) => panic!("unexpected error {e}"),
    }
}
