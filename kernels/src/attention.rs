use gemm::{gemm, Parallelism};

/// Attention statistics accumulated inside the attention pass (no second pass over the
/// probability matrix). Each accumulates `weight / heads` times the head sum, so feeding
/// several layers with `weight = 1 / layers` gives the head- and layer-average.
#[derive(Debug, Default)]
pub struct AttnStats<'a> {
    /// `[nq x nk]`: the probabilities themselves (cross-attention maps for saliency).
    pub probs: Option<(&'a mut [f32], f32)>,
    /// Per-query probability mass into each key group (self-attention mass per patch, for the
    /// gate's refinement importance).
    pub group_mass: Option<GroupMass<'a>>,
}

/// See [`AttnStats::group_mass`].
#[derive(Debug)]
pub struct GroupMass<'a> {
    /// Group of every key (`nk` entries, each `< groups`).
    pub key_group: &'a [u32],
    /// Number of groups.
    pub groups: usize,
    /// `[nq x groups]` accumulator.
    pub out: &'a mut [f32],
    /// Weight of this call.
    pub weight: f32,
}

/// Multi-head scaled dot-product attention, `heads` heads of width `d / heads` interleaved in
/// the columns of `q [nq x d]`, `k`, `v [nk x d]`; writes `out [nq x d]`. The queries may be a
/// subset of the tokens whose keys are given (regional execution). Panics on bad shapes.
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(
    q: &[f32],
    nq: usize,
    k: &[f32],
    v: &[f32],
    nk: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    stats: &mut AttnStats<'_>,
) {
    check_shapes("attention_f32", (q, nq), (k, v, nk), d, heads, out);
    if let Some((p, _)) = &stats.probs {
        assert_eq!(
            p.len(),
            nq * nk,
            "attention_f32: probs accumulator is not nq x nk"
        );
    }
    if let Some(g) = &stats.group_mass {
        assert_eq!(
            g.key_group.len(),
            nk,
            "attention_f32: key_group is not nk long"
        );
        assert_eq!(
            g.out.len(),
            nq * g.groups,
            "attention_f32: group accumulator is not nq x groups"
        );
        assert!(
            g.key_group.iter().all(|&x| (x as usize) < g.groups),
            "attention_f32: key group out of range"
        );
    }
    if nq == 0 || nk == 0 {
        out.fill(0.0);
        return;
    }
    // Queries in blocks, so the score matrix never exceeds QUERY_BLOCK x nk per head (4096
    // tokens would otherwise hold a 64 MiB matrix per head).
    for start in (0..nq).step_by(QUERY_BLOCK) {
        let n = QUERY_BLOCK.min(nq - start);
        let mut st = AttnStats {
            probs: stats
                .probs
                .as_mut()
                .map(|(p, w)| (&mut p[start * nk..(start + n) * nk], *w)),
            group_mass: stats.group_mass.as_mut().map(|g| GroupMass {
                key_group: g.key_group,
                groups: g.groups,
                out: &mut g.out[start * g.groups..(start + n) * g.groups],
                weight: g.weight,
            }),
        };
        attention_block(
            &q[start * d..(start + n) * d],
            n,
            k,
            v,
            nk,
            d,
            heads,
            &mut out[start * d..(start + n) * d],
            &mut st,
        );
    }
}

/// The shape checks both attention kernels make: `heads` divides `d`, `q` and `out` hold
/// `nq x d` values, `k` and `v` `nk x d`. Panics naming `kernel` otherwise.
pub(crate) fn check_shapes(
    kernel: &str,
    (q, nq): (&[f32], usize),
    (k, v, nk): (&[f32], &[f32], usize),
    d: usize,
    heads: usize,
    out: &[f32],
) {
    assert!(
        heads > 0 && d % heads == 0,
        "{kernel}: d not divisible by heads"
    );
    assert_eq!(q.len(), nq * d, "{kernel}: q is not nq x d");
    assert_eq!(k.len(), nk * d, "{kernel}: k is not nk x d");
    assert_eq!(v.len(), nk * d, "{kernel}: v is not nk x d");
    assert_eq!(out.len(), nq * d, "{kernel}: out is not nq x d");
}

/// Queries per block of [`attention_f32`].
pub const QUERY_BLOCK: usize = 256;

#[allow(clippy::too_many_arguments)]
fn attention_block(
    q: &[f32],
    nq: usize,
    k: &[f32],
    v: &[f32],
    nk: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    stats: &mut AttnStats<'_>,
) {
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut scores = vec![0.0f32; nq * nk];
    for h in 0..heads {
        // scores[nq x nk] = scale * q_h[nq x dh] · k_h^T; k_h^T element (c, j) = k[j*d + h*dh + c].
        // SAFETY: q, k hold nq*d and nk*d floats (asserted); with offset h*dh < d, row stride d
        // and dh columns, the last element read is (n-1)*d + h*dh + dh-1 < n*d. scores holds
        // nq*nk floats written with row stride nk. No output aliases an input.
        unsafe {
            gemm(
                nq,
                nk,
                dh,
                scores.as_mut_ptr(),
                1,
                nk as isize,
                false,
                q.as_ptr().add(h * dh),
                1,
                d as isize,
                k.as_ptr().add(h * dh),
                d as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
        for row in scores.chunks_exact_mut(nk) {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0.0;
            for s in row.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            for s in row.iter_mut() {
                *s *= inv;
            }
        }
        if let Some((acc, w)) = &mut stats.probs {
            let w = *w / heads as f32;
            for (a, s) in acc.iter_mut().zip(&scores) {
                *a += w * s;
            }
        }
        if let Some(g) = &mut stats.group_mass {
            let w = g.weight / heads as f32;
            for (qi, row) in scores.chunks_exact(nk).enumerate() {
                let dst = &mut g.out[qi * g.groups..(qi + 1) * g.groups];
                for (j, &p) in row.iter().enumerate() {
                    dst[g.key_group[j] as usize] += w * p;
                }
            }
        }
        // out_h[nq x dh] = P[nq x nk] · v_h[nk x dh]; v_h element (j, c) = v[j*d + h*dh + c].
        // SAFETY: as above for v; out holds nq*d floats written at offset h*dh with row stride
        // d and dh columns, inside its bounds; scores is read with row stride nk.
        unsafe {
            gemm(
                nq,
                dh,
                nk,
                out.as_mut_ptr().add(h * dh),
                1,
                d as isize,
                false,
                scores.as_ptr(),
                1,
                nk as isize,
                v.as_ptr().add(h * dh),
                1,
                d as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    }
}
