//! The built-in models' text encoder (`TextLayer` of `models/tinydit/model.py`), shared by
//! TinyDiT and TinyFLUX.

use candle_core::{Module, Tensor};
use candle_nn::{LayerNorm, VarBuilder};
use flashdiff_kernels::ops::{self, AttnWants};

use super::load::Loader;
use super::Lin;
use crate::ModelError;

#[derive(Debug)]
struct TextLayer {
    ln1: LayerNorm,
    ln2: LayerNorm,
    qkv: Lin,
    proj: Lin,
    fc1: Lin,
    fc2: Lin,
}

/// Where a text tower's tensors are in a weights file: the token embedding, the positions,
/// the prefix of layer `i` (`{layers}.{i}`) and the final norm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextNames<'a> {
    pub tok_emb: &'a str,
    pub pos: &'a str,
    pub layers: &'a str,
    pub ln: &'a str,
}

/// The built-in models' text encoder (`TextLayer` of `models/tinydit/model.py`): word
/// embeddings plus learned positions, pre-norm transformer layers, a final layer norm.
/// TinyDiT and TinyFLUX share it.
#[derive(Debug)]
pub(crate) struct TextTower {
    tok_emb: Tensor,
    pos: Tensor,
    layers: Vec<TextLayer>,
    ln: LayerNorm,
    d: usize,
    heads: usize,
    vocab: usize,
    tokens: usize,
}

/// A text tower's sizes: width, heads, MLP width, layers, vocabulary, tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextSizes {
    pub d: usize,
    pub heads: usize,
    pub mlp: usize,
    pub layers: usize,
    pub vocab: usize,
    pub tokens: usize,
}

impl TextTower {
    /// Reads the tower named `n` from `vb`; a missing or mis-shaped tensor is an error naming
    /// it.
    pub(crate) fn load(
        vb: &VarBuilder,
        n: TextNames<'_>,
        s: TextSizes,
    ) -> Result<Self, ModelError> {
        let l = Loader { vb };
        let (d, h) = (s.d, s.mlp);
        let mut layers = Vec::new();
        for i in 0..s.layers {
            let p = format!("{}.{i}", n.layers);
            layers.push(TextLayer {
                ln1: l.ln(&format!("{p}.ln1"), d)?,
                ln2: l.ln(&format!("{p}.ln2"), d)?,
                qkv: l.lin(&format!("{p}.attn.qkv"), 3 * d, d)?,
                proj: l.lin(&format!("{p}.attn.proj"), d, d)?,
                fc1: l.lin(&format!("{p}.mlp.fc1"), h, d)?,
                fc2: l.lin(&format!("{p}.mlp.fc2"), d, h)?,
            });
        }
        Ok(Self {
            tok_emb: l.t(n.tok_emb, &[s.vocab, d])?,
            pos: l.t(n.pos, &[s.tokens, d])?,
            layers,
            ln: l.ln(n.ln, d)?,
            d,
            heads: s.heads,
            vocab: s.vocab,
            tokens: s.tokens,
        })
    }

    /// The states of `ids` (exactly the tower's token count, padded): `tokens x d`. Ids past
    /// the vocabulary read its last word.
    pub(crate) fn states(&self, ids: &[u32]) -> Result<Tensor, ModelError> {
        let (d, n) = (self.d, self.tokens);
        if ids.len() != n {
            return Err(ModelError::Input(format!(
                "{} token ids, the model takes {n} (padded)",
                ids.len()
            )));
        }
        let ids: Vec<u32> = ids.iter().map(|&i| i.min(self.vocab as u32 - 1)).collect();
        let ids = Tensor::from_vec(ids, n, self.tok_emb.device())?;
        let mut x = (self.tok_emb.index_select(&ids, 0)? + &self.pos)?;
        for l in &self.layers {
            let a = l.ln1.forward(&x)?;
            let qkv = l.qkv.forward(&a)?;
            let part = |i: usize| qkv.narrow(1, i * d, d);
            let o = ops::attention(
                &part(0)?,
                &part(1)?,
                &part(2)?,
                self.heads,
                AttnWants::default(),
            )?;
            x = (x + l.proj.forward(&o.out)?)?;
            let a = l.ln2.forward(&x)?;
            let hdn = ops::gelu_tanh_inplace(l.fc1.forward(&a)?)?;
            x = (x + l.fc2.forward(&hdn)?)?;
        }
        Ok(self.ln.forward(&x)?)
    }
}
