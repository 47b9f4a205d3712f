//! umT5's encoder (Wan2.1's text encoder, `google/umt5-xxl`), written from transformers'
//! `UMT5EncoderModel` description. It is T5's encoder except that every layer has its own
//! relative position bias (T5 shares layer 0's), which is why candle-transformers' T5
//! cannot load it: RMS norms without mean or bias, unscaled attention logits plus the
//! layer's bucketed bias, a gated-GELU (tanh form) feed-forward, residuals around both.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;

use crate::families::joint::{lin, Lin};
use crate::ModelError;

/// What we read of `text_encoder/config.json` (`UMT5Config`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Umt5Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width.
    pub d_model: usize,
    /// Width of a head.
    pub d_kv: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Layers.
    pub num_layers: usize,
    /// Heads.
    pub num_heads: usize,
    /// Relative position buckets (both directions together).
    #[serde(default = "buckets")]
    pub relative_attention_num_buckets: usize,
    /// Distance from which every position shares the last bucket.
    #[serde(default = "distance")]
    pub relative_attention_max_distance: usize,
    /// RMS norm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_epsilon: f64,
    /// `gated-gelu` (umT5) or `relu`.
    #[serde(default = "gated_gelu")]
    pub feed_forward_proj: String,
}

fn buckets() -> usize {
    32
}

fn distance() -> usize {
    128
}

fn eps() -> f64 {
    1e-6
}

fn gated_gelu() -> String {
    "gated-gelu".into()
}

#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    bias: Tensor,
    ff_norm: Tensor,
    wi_0: Lin,
    wi_1: Option<Lin>,
    wo: Lin,
}

/// The encoder.
#[derive(Debug)]
pub struct Umt5Encoder {
    cfg: Umt5Config,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    device: Device,
}

impl Umt5Encoder {
    /// The encoder from tensors named as transformers names them (`shared.weight`,
    /// `encoder.block.N.layer.0.SelfAttention.*`, ...).
    pub fn load(cfg: Umt5Config, vb: &VarBuilder, device: &Device) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        let gated = match cfg.feed_forward_proj.as_str() {
            "gated-gelu" => true,
            "relu" => false,
            other => {
                return Err(ModelError::Input(format!(
                    "umT5 feed_forward_proj {other:?}: gated-gelu or relu are supported"
                )))
            }
        };
        let (d, inner) = (cfg.d_model, cfg.num_heads * cfg.d_kv);
        if d == 0 || inner == 0 || cfg.relative_attention_num_buckets < 4 {
            return Err(ModelError::Input(format!(
                "umT5 config: width {d}, {} heads of {}, {} buckets",
                cfg.num_heads, cfg.d_kv, cfg.relative_attention_num_buckets
            )));
        }
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let a = format!("encoder.block.{i}.layer.0");
                let f = format!("encoder.block.{i}.layer.1");
                let l = |n: &str, inp: usize, out: usize| lin(get, n, inp, out, false);
                Ok(Layer {
                    attn_norm: get(&format!("{a}.layer_norm.weight"), &[d])?,
                    q: l(&format!("{a}.SelfAttention.q"), d, inner)?,
                    k: l(&format!("{a}.SelfAttention.k"), d, inner)?,
                    v: l(&format!("{a}.SelfAttention.v"), d, inner)?,
                    o: l(&format!("{a}.SelfAttention.o"), inner, d)?,
                    bias: get(
                        &format!("{a}.SelfAttention.relative_attention_bias.weight"),
                        &[cfg.relative_attention_num_buckets, cfg.num_heads],
                    )?,
                    ff_norm: get(&format!("{f}.layer_norm.weight"), &[d])?,
                    wi_0: l(
                        &format!("{f}.DenseReluDense.{}", if gated { "wi_0" } else { "wi" }),
                        d,
                        cfg.d_ff,
                    )?,
                    wi_1: if gated {
                        Some(l(&format!("{f}.DenseReluDense.wi_1"), d, cfg.d_ff)?)
                    } else {
                        None
                    },
                    wo: l(&format!("{f}.DenseReluDense.wo"), cfg.d_ff, d)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            embed: get("shared.weight", &[cfg.vocab_size, d])?,
            final_norm: get("encoder.final_layer_norm.weight", &[d])?,
            layers,
            device: device.clone(),
            cfg,
        })
    }

    /// The encoder of a transformers folder (`config.json`, `*.safetensors`), its linear
    /// layers in `dtype`.
    pub fn open(dir: &Path, dtype: DType, dev: &Device) -> Result<Arc<Self>, ModelError> {
        let cfg: Umt5Config = crate::io::folder::config(dir)?;
        let files = std::sync::Arc::new(crate::io::shards::Shards::open(dir)?);
        crate::io::shards::dtype_for("", &[], dtype)?;
        let vb = crate::io::shards::var_builder(
            files,
            crate::io::shards::same_names(),
            dtype,
            crate::io::shards::Dtypes::Linear,
            dev,
        );
        let enc = Self::load(cfg, &vb, dev)?;
        Ok(Arc::new(enc))
    }

    /// The architecture.
    pub fn config(&self) -> &Umt5Config {
        &self.cfg
    }

    /// Where it runs.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Final states of `ids` (`n x d_model`, f32): the whole sequence attends to itself.
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor, ModelError> {
        let n = ids.len();
        if n == 0 {
            return Err(ModelError::Input("umT5 needs at least one token".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Input(format!(
                "token id {bad} is outside umT5's vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let (h, dk) = (self.cfg.num_heads, self.cfg.d_kv);
        let idx = Tensor::from_vec(ids.to_vec(), n, &self.device)?;
        let mut x = self.embed.index_select(&idx, 0)?;
        let buckets = Tensor::from_vec(self.buckets(n), n * n, &self.device)?;
        for l in &self.layers {
            let a = self.norm(&x, &l.attn_norm)?;
            let heads = |t: Tensor| -> candle_core::Result<Tensor> {
                t.reshape((n, h, dk))?.transpose(0, 1)?.contiguous()
            };
            let (q, k, v) = (
                heads(l.q.forward(&a)?)?,
                heads(l.k.forward(&a)?)?,
                heads(l.v.forward(&a)?)?,
            );
            // This layer's bias: bucket -> one value per head, heads x n x n.
            let bias = l
                .bias
                .index_select(&buckets, 0)?
                .reshape((n, n, h))?
                .permute((2, 0, 1))?;
            let scores = (q.matmul(&k.t()?)? + bias)?;
            let p = candle_nn::ops::softmax_last_dim(&scores)?;
            let o = p.matmul(&v)?.transpose(0, 1)?.reshape((n, h * dk))?;
            x = (x + l.o.forward(&o)?)?;
            let f = self.norm(&x, &l.ff_norm)?;
            let g = match &l.wi_1 {
                Some(wi_1) => (l.wi_0.forward(&f)?.gelu()? * wi_1.forward(&f)?)?,
                None => l.wi_0.forward(&f)?.relu()?,
            };
            x = (x + l.wo.forward(&g)?)?;
        }
        Ok(self.norm(&x, &self.final_norm)?)
    }

    /// RMS norm without mean or bias.
    fn norm(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        x.broadcast_div(&(var + self.cfg.layer_norm_epsilon)?.sqrt()?)?
            .broadcast_mul(w)
    }

    /// The bucket of every (query, key) pair of `n` positions, row-major: the encoder's
    /// bidirectional bucketing (half the buckets for keys after the query; in each half,
    /// exact distances below a quarter of the buckets, then logarithmic bins up to the
    /// maximum distance).
    fn buckets(&self, n: usize) -> Vec<u32> {
        let half = self.cfg.relative_attention_num_buckets / 2;
        let exact = half / 2;
        let max_distance = self.cfg.relative_attention_max_distance.max(exact + 1) as f32;
        let scale = (max_distance / exact as f32).ln();
        let mut out = Vec::with_capacity(n * n);
        for q in 0..n as i64 {
            for k in 0..n as i64 {
                let rel = k - q;
                let mut b = if rel > 0 { half } else { 0 };
                let r = rel.unsigned_abs() as usize;
                b += if r < exact {
                    r
                } else {
                    let ratio = (r as f32 / exact as f32).ln() / scale;
                    let large = exact + (ratio * (half - exact) as f32) as usize;
                    large.min(half - 1)
                };
                out.push(b as u32);
            }
        }
        out
    }
}
