//! Packing a step's active patches into monotasks.

/// Packs a step's active patches `(patch, tokens)` (ascending patch ids) into at most `most`
/// monotasks: consecutive patches (the partitioner numbers neighbours consecutively, so a
/// monotask holds patches that attend to each other most), balanced by tokens, each
/// monotask non-empty. Returns each patch's monotask, numbered from 0.
pub fn pack_monotasks(active: &[(u32, usize)], most: usize) -> Vec<u32> {
    if most >= active.len() {
        return (0..active.len() as u32).collect();
    }
    let total: usize = active.iter().map(|a| a.1).sum::<usize>().max(1);
    let g = most.max(1);
    let (mut cum, mut share, mut next) = (0usize, None, 0u32);
    let mut out = Vec::with_capacity(active.len());
    for &(_, n) in active {
        // The share of the tokens (of g equal shares) that holds this patch's midpoint; a
        // new share opens a new monotask, so monotasks are consecutive and never empty.
        let s = ((2 * cum + n) * g / (2 * total)).min(g - 1);
        cum += n;
        if share.is_some_and(|prev| s > prev) {
            next += 1;
        }
        share = Some(s);
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotasks_are_consecutive_balanced_and_never_more_than_asked() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..2000 {
            let n = 1 + rnd(20) as usize;
            let active: Vec<(u32, usize)> = (0..n)
                .map(|p| (p as u32 * 2, 1 + rnd(40) as usize))
                .collect();
            let most = 1 + rnd(24) as usize;
            let m = pack_monotasks(&active, most);
            assert_eq!(m.len(), n);
            assert_eq!(m[0], 0);
            assert!(m.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
            let count = m[n - 1] as usize + 1;
            assert!(count <= most, "{count} monotasks for at most {most}");
            if most >= n {
                assert_eq!(count, n, "every patch its own when allowed");
            }
            // Balance: a monotask holds at most a share plus one patch.
            let total: usize = active.iter().map(|a| a.1).sum();
            let biggest = active.iter().map(|a| a.1).max().unwrap();
            let mut load = vec![0usize; count];
            for (a, &k) in active.iter().zip(&m) {
                load[k as usize] += a.1;
            }
            let share = total.div_ceil(most.min(n));
            assert!(
                load.iter().all(|&l| l <= share + biggest),
                "loads {load:?}, share {share}, biggest patch {biggest}"
            );
            if most == 1 {
                assert!(m.iter().all(|&k| k == 0));
            }
        }
    }
}
