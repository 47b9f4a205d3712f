//! TinyDiT's forward in three parts: the token embedding, any range of the block stack and the
//! output layer. The ordinary forwards run all three; a method that watches the first blocks
//! (DBCache) runs the first blocks alone and decides whether the rest run.

use std::ops::Range;

use candle_core::Tensor;
use flashdiff_kernels::ops::{self, AttnWants};

use super::{TinyDit, EPS};
use crate::{KvCache, ModelError, Patches, StepInput};

/// Where a forward's keys and values come from.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a> {
    /// The active tokens' own only.
    Own,
    /// Every token: the active tokens' fresh rows over the cache.
    Cached(KvCache<'a>),
}

pub(super) struct Rows {
    pub(super) velocity: Tensor,
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    pub(super) mass: Option<Tensor>,
    pub(super) cross: Option<Tensor>,
}

/// What the blocks hand back besides the hidden rows: each block's K/V, the attention mass
/// per key group and the saliency layers' cross-attention, summed.
#[derive(Default)]
pub(super) struct Collected {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    mass: Option<Tensor>,
    cross: Option<Tensor>,
}

/// What the blocks attend to: the keys, how keys are grouped for the attention mass, and
/// whether the saliency layers return their cross-attention.
#[derive(Clone, Copy)]
pub(super) struct Attending<'a> {
    pub(super) keys: Keys<'a>,
    pub(super) key_groups: Option<(&'a [u32], usize)>,
    pub(super) saliency: bool,
}

impl Attending<'_> {
    /// The whole latent attending to itself, nothing collected beyond the K/V.
    pub(super) const PLAIN: Attending<'static> = Attending {
        keys: Keys::Own,
        key_groups: None,
        saliency: false,
    };
}

fn add(acc: Option<Tensor>, t: Tensor) -> candle_core::Result<Option<Tensor>> {
    Ok(Some(match acc {
        None => t,
        Some(a) => (a + t)?,
    }))
}

impl TinyDit {
    /// The hidden rows the blocks start from: the active tokens' embedding plus their
    /// positions.
    pub(super) fn embed(&self, x_active: &Tensor, active: &[u32]) -> Result<Tensor, ModelError> {
        let x = self.x_embed.forward(x_active)?;
        let pos = if active.len() == self.cfg.tokens() {
            self.pos.clone()
        } else {
            let ids = Tensor::from_slice(active, active.len(), &self.device)?;
            self.pos.index_select(&ids, 0)?
        };
        Ok((x + pos)?)
    }

    /// Runs `blocks` of the stack over hidden rows `x` of the tokens `active`.
    pub(super) fn run_blocks(
        &self,
        mut x: Tensor,
        blocks: Range<usize>,
        active: &[u32],
        step: StepInput<'_>,
        how: Attending<'_>,
        out: &mut Collected,
    ) -> Result<Tensor, ModelError> {
        let (d, heads) = (self.cfg.d, self.cfg.heads);
        let m = |li: usize, j: usize| step.cond.narrow(0, (li * 6 + j) * d, d);
        for li in blocks {
            let b = &self.blocks[li];
            let a = ops::norm_modulate(&x, &m(li, 0)?, &m(li, 1)?, EPS)?;
            let (q, k, v) = (b.q.forward(&a)?, b.k.forward(&a)?, b.v.forward(&a)?);
            let (kk, vv) = match how.keys {
                Keys::Own => (k.clone(), v.clone()),
                Keys::Cached(c) => (
                    ops::scatter_rows(&c.k.get(li)?, &k, active)?,
                    ops::scatter_rows(&c.v.get(li)?, &v, active)?,
                ),
            };
            let att = ops::attention(
                &q,
                &kk,
                &vv,
                heads,
                AttnWants {
                    probs: false,
                    key_groups: how.key_groups,
                },
            )?;
            if let Some(g) = att.group_mass {
                out.mass = add(out.mass.take(), g)?;
            }
            x = (x + b.proj.forward(&att.out)?.broadcast_mul(&m(li, 2)?)?)?;
            out.k.push(k);
            out.v.push(v);
            let a = ops::norm_modulate(&x, &self.zeros, &self.zeros, EPS)?;
            let want = how.saliency && self.saliency_layers.contains(&li);
            let att = ops::attention(
                &b.cq.forward(&a)?,
                &self.context_part(step.context, li)?,
                &self.context_part(step.context, self.cfg.depth + li)?,
                heads,
                AttnWants {
                    probs: want,
                    key_groups: None,
                },
            )?;
            if let Some(p) = att.probs {
                out.cross = add(out.cross.take(), p)?;
            }
            x = (x + b.cproj.forward(&att.out)?)?;
            let a = ops::norm_modulate(&x, &m(li, 3)?, &m(li, 4)?, EPS)?;
            let hdn = ops::gelu_tanh_inplace(b.fc1.forward(&a)?)?;
            x = (x + b.fc2.forward(&hdn)?.broadcast_mul(&m(li, 5)?)?)?;
        }
        Ok(x)
    }

    /// The output layer: the velocity of hidden rows that went through every block.
    pub(super) fn output_layer(
        &self,
        x: &Tensor,
        step: StepInput<'_>,
    ) -> Result<Tensor, ModelError> {
        let (d, depth) = (self.cfg.d, self.cfg.depth);
        let fm = |j: usize| step.cond.narrow(0, (depth * 6 + j) * d, d);
        let x = ops::norm_modulate(x, &fm(0)?, &fm(1)?, EPS)?;
        Ok(self.final_.forward(&x)?)
    }

    /// The forward of the tokens `active` (ascending): the body of both forwards.
    pub(super) fn forward_rows(
        &self,
        x_active: &Tensor,
        active: &[u32],
        step: StepInput<'_>,
        keys: Keys<'_>,
        mass_groups: Option<Patches<'_>>,
        saliency: bool,
    ) -> Result<Rows, ModelError> {
        let x = self.embed(x_active, active)?;
        // Isolated: keys are the active tokens only, grouped as the caller grouped them.
        let own_groups: Option<Vec<u32>> = match (&keys, mass_groups) {
            (Keys::Own, Some(p)) => Some(active.iter().map(|&t| p.of_token[t as usize]).collect()),
            _ => None,
        };
        let how = Attending {
            keys,
            key_groups: mass_groups
                .map(|p| (own_groups.as_deref().unwrap_or(p.of_token), p.patches)),
            saliency,
        };
        let mut got = Collected::default();
        let x = self.run_blocks(x, 0..self.cfg.depth, active, step, how, &mut got)?;
        Ok(Rows {
            velocity: self.output_layer(&x, step)?,
            k: Tensor::stack(&got.k, 0)?,
            v: Tensor::stack(&got.v, 0)?,
            mass: match got.mass {
                Some(m) => Some((m / self.cfg.depth as f64)?),
                None => None,
            },
            cross: match got.cross {
                Some(c) => Some((c / self.saliency_layers.len() as f64)?),
                None => None,
            },
        })
    }
}
