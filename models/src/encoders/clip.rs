//! CLIP's text transformer with its projection (transformers' `CLIPTextModelWithProjection`),
//! as SD3 reads it: the penultimate layer's states and the projected pooled vector.
//!
//! Written here rather than taken from candle-transformers because candle's configurable
//! CLIP (`clip::text_model`) runs quick-GELU only and exposes neither the penultimate layer
//! nor the projection, and its SD3-capable one (`stable_diffusion::clip`) comes only as
//! fixed full-size presets (private config fields). Checked against transformers' own model
//! through a golden file (`models/reference/clip_golden.py`).

use std::path::Path;

use candle_core::{Device, Tensor, D};
use candle_nn::{Embedding, LayerNorm, Linear, Module, VarBuilder};

use super::text::{ClipJson, TextTokenizer};
use crate::io::folder::{config, weights};
use crate::ModelError;

fn input(msg: String) -> ModelError {
    ModelError::Input(msg)
}

struct Layer {
    ln1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The network.
pub(crate) struct Net {
    token: Embedding,
    position: Tensor,
    layers: Vec<Layer>,
    final_ln: LayerNorm,
    projection: Linear,
    quick: bool,
    heads: usize,
}

/// A CLIP text encoder with projection (transformers' `CLIPTextModelWithProjection`) and its
/// tokenizer.
pub struct ClipWithProjection {
    net: Net,
    tokenizer: TextTokenizer,
    device: Device,
    width: usize,
    projected: usize,
}

impl std::fmt::Debug for ClipWithProjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipWithProjection")
            .field("width", &self.width)
            .field("projected", &self.projected)
            .field("layers", &self.net.layers.len())
            .finish()
    }
}

impl Net {
    /// `from`: where the weights are, for errors.
    pub(crate) fn new(root: VarBuilder, c: &ClipJson, from: &Path) -> Result<Self, ModelError> {
        let quick = match c.hidden_act.as_str() {
            "quick_gelu" => true,
            "gelu" => false,
            a => {
                return Err(input(format!(
                    "{}: hidden_act {a:?}; CLIP text models use quick_gelu or gelu",
                    from.display()
                )))
            }
        };
        if c.num_attention_heads == 0 || c.hidden_size % c.num_attention_heads != 0 {
            return Err(input(format!(
                "{}: width {} is not a multiple of {} heads",
                from.display(),
                c.hidden_size,
                c.num_attention_heads
            )));
        }
        let fail =
            |e: candle_core::Error| input(format!("CLIP text encoder in {}: {e}", from.display()));
        let vb = root.pp("text_model");
        let (d, eps) = (c.hidden_size, c.layer_norm_eps);
        let ln = |vb: VarBuilder| candle_nn::layer_norm(d, eps, vb);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layers.{i}"));
                Ok(Layer {
                    ln1: ln(l.pp("layer_norm1"))?,
                    q: candle_nn::linear(d, d, l.pp("self_attn.q_proj"))?,
                    k: candle_nn::linear(d, d, l.pp("self_attn.k_proj"))?,
                    v: candle_nn::linear(d, d, l.pp("self_attn.v_proj"))?,
                    out: candle_nn::linear(d, d, l.pp("self_attn.out_proj"))?,
                    ln2: ln(l.pp("layer_norm2"))?,
                    fc1: candle_nn::linear(d, c.intermediate_size, l.pp("mlp.fc1"))?,
                    fc2: candle_nn::linear(c.intermediate_size, d, l.pp("mlp.fc2"))?,
                })
            })
            .collect::<Result<Vec<_>, candle_core::Error>>()
            .map_err(fail)?;
        Ok(Self {
            token: candle_nn::embedding(c.vocab_size, d, vb.pp("embeddings.token_embedding"))
                .map_err(fail)?,
            position: vb
                .get(
                    (c.max_position_embeddings, d),
                    "embeddings.position_embedding.weight",
                )
                .map_err(fail)?,
            layers,
            final_ln: ln(vb.pp("final_layer_norm")).map_err(fail)?,
            projection: candle_nn::linear_no_bias(d, projected(c), root.pp("text_projection"))
                .map_err(fail)?,
            quick,
            heads: c.num_attention_heads,
        })
    }

    fn forward(&self, ids: &[u32], device: &Device) -> Result<(Tensor, Tensor), ModelError> {
        let n = ids.len();
        if n == 0 || n > self.position.dim(0)? {
            return Err(input(format!(
                "{n} CLIP tokens; 1..={} fit",
                self.position.dim(0)?
            )));
        }
        // The pooled row: the first position of the largest id (the end-of-text token).
        let eos = ids
            .iter()
            .enumerate()
            .fold(0, |b, (i, &id)| if id > ids[b] { i } else { b });
        let t = Tensor::from_slice(ids, n, device)?;
        let mut x = (self.token.forward(&t)? + self.position.narrow(0, 0, n)?)?;
        let mask: Vec<f32> = (0..n * n)
            .map(|i| {
                if i % n > i / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (n, n), device)?;
        let mut penultimate = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            if i + 1 == self.layers.len() {
                penultimate = x.clone();
            }
            x = (&x + self.attention(l, &l.ln1.forward(&x)?, &mask)?)?;
            let h = l.fc1.forward(&l.ln2.forward(&x)?)?;
            let h = if self.quick {
                (&h * candle_nn::ops::sigmoid(&(&h * 1.702)?)?)?
            } else {
                h.gelu_erf()?
            };
            x = (&x + l.fc2.forward(&h)?)?;
        }
        let last = self.final_ln.forward(&x)?;
        let pooled = self
            .projection
            .forward(&last.narrow(0, eos, 1)?)?
            .squeeze(0)?;
        Ok((penultimate, pooled))
    }

    fn attention(&self, l: &Layer, x: &Tensor, mask: &Tensor) -> Result<Tensor, ModelError> {
        let (n, d) = x.dims2()?;
        let hd = d / self.heads;
        let split = |t: Tensor| -> Result<Tensor, candle_core::Error> {
            t.reshape((n, self.heads, hd))?
                .transpose(0, 1)?
                .contiguous()
        };
        let q = split((l.q.forward(x)? * (1.0 / (hd as f64).sqrt()))?)?;
        let k = split(l.k.forward(x)?)?;
        let v = split(l.v.forward(x)?)?;
        let s = q
            .matmul(&k.transpose(1, 2)?.contiguous()?)?
            .broadcast_add(mask)?;
        let p = candle_nn::ops::softmax(&s, D::Minus1)?;
        let o = p.matmul(&v)?.transpose(0, 1)?.reshape((n, d))?;
        Ok(l.out.forward(&o)?)
    }
}

fn projected(c: &ClipJson) -> usize {
    if c.projection_dim == 0 {
        c.hidden_size
    } else {
        c.projection_dim
    }
}

impl ClipWithProjection {
    /// The model in `weights_dir` (`config.json`, safetensors) and the tokenizer in
    /// `tokenizer_dir`, padding with `pad` unless its `tokenizer_config.json` names another
    /// (SD3: `<|endoftext|>` for CLIP-L, `!` for CLIP-G).
    pub fn load(
        weights_dir: &Path,
        tokenizer_dir: &Path,
        pad: &str,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        let c: ClipJson = config(weights_dir)?;
        let net = Net::new(weights(weights_dir, dev)?, &c, weights_dir)?;
        Ok(Self {
            net,
            tokenizer: TextTokenizer::open(tokenizer_dir, c.max_position_embeddings, pad)?,
            device: dev.clone(),
            width: c.hidden_size,
            projected: projected(&c),
        })
    }

    /// Widths of the states and of the projected pooled vector.
    pub fn widths(&self) -> (usize, usize) {
        (self.width, self.projected)
    }

    /// Tokens per prompt.
    pub fn tokens(&self) -> usize {
        self.tokenizer.len()
    }

    /// `prompt`'s penultimate-layer states (`tokens x width`) and projected pooled vector.
    pub fn encode(&self, prompt: &str) -> Result<(Tensor, Tensor), ModelError> {
        let (ids, _) = self.tokenizer.encode(prompt)?;
        self.forward(&ids)
    }

    /// [`ClipWithProjection::encode`] of token ids (at most the position table's length).
    pub fn forward(&self, ids: &[u32]) -> Result<(Tensor, Tensor), ModelError> {
        self.net.forward(ids, &self.device)
    }
}
