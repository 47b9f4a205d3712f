//! Loading TinyDiT and its family (TinyVideo, TinyAudio) from the safetensors file
//! `models/tinydit/export.py` writes: the config and vocabulary from its metadata, the layers
//! from its tensors, each checked against the config.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::{LayerNorm, VarBuilder};

use super::{AudioSpec, Block, Config, Lin, TextNames, TextSizes, TextTower, TinyDit, EPS};
use crate::io::shards::{f32_builder, read_error, Shards};
use crate::io::weights::{Weights, WeightsError};
use crate::{Dims, Kind, ModelError};

impl TinyDit {
    /// Loads the model from a safetensors file written by `models/tinydit/export.py` (f32,
    /// f16 or bf16) onto `device`. A missing or mis-shaped tensor is an error naming it.
    pub fn load(path: &Path, device: &Device) -> Result<Self, ModelError> {
        let w = Weights::open(path)?;
        let format = w.meta("format")?;
        if format != "flashdiff-tinydit" {
            return Err(WeightsError::Metadata(format!(
                "format {format:?}, expected \"flashdiff-tinydit\""
            ))
            .into());
        }
        let cfg = parse_config(&w)?;
        let vocab: Vec<String> = meta_json(&w, "vocab")?;
        if vocab.len() != cfg.vocab {
            return Err(WeightsError::Metadata(format!(
                "vocab has {} words, config says {}",
                vocab.len(),
                cfg.vocab
            ))
            .into());
        }
        let saliency_layers: Vec<usize> = meta_json(&w, "saliency_layers")?;
        if saliency_layers.is_empty() || saliency_layers.iter().any(|&l| l >= cfg.depth) {
            return Err(WeightsError::Metadata(format!(
                "saliency_layers {saliency_layers:?} must name blocks below {}",
                cfg.depth
            ))
            .into());
        }
        // Older image files carry no list: the general function words then decide alone.
        let function_words: Vec<String> = if w.meta("function_words").is_ok() {
            meta_json(&w, "function_words")?
        } else {
            Vec::new()
        };
        // Files without the entry sample at uniform times, as every file did before it.
        let sample_shift: f32 = if w.meta("sample_shift").is_ok() {
            meta_json(&w, "sample_shift")?
        } else {
            1.0
        };
        if !(0.01..=100.0).contains(&sample_shift) {
            return Err(WeightsError::Metadata(format!(
                "sample_shift {sample_shift} must be in [0.01, 100]"
            ))
            .into());
        }
        let audio = match cfg.kind {
            Kind::Audio => Some(parse_audio(&w, cfg.channels)?),
            _ => None,
        };
        let vb = f32_builder(Arc::new(Shards::one(w)), device);
        let l = Loader { vb: &vb };
        let (d, h) = (cfg.d, cfg.d * cfg.mlp_ratio);
        let text = TextTower::load(
            &vb,
            TextNames {
                tok_emb: "tok_emb.weight",
                pos: "txt_pos",
                layers: "text",
                ln: "txt_ln",
            },
            TextSizes {
                d,
                heads: cfg.heads,
                mlp: h,
                layers: cfg.text_layers,
                vocab: cfg.vocab,
                tokens: cfg.max_tokens,
            },
        )?;
        let mut blocks = Vec::new();
        for i in 0..cfg.depth {
            let p = format!("blocks.{i}");
            let qkv = format!("{p}.attn.qkv");
            blocks.push(Block {
                ada: l.lin(&format!("{p}.ada"), 6 * d, d)?,
                q: l.lin_rows(&qkv, 3 * d, d, 0, d)?,
                k: l.lin_rows(&qkv, 3 * d, d, d, d)?,
                v: l.lin_rows(&qkv, 3 * d, d, 2 * d, d)?,
                proj: l.lin(&format!("{p}.attn.proj"), d, d)?,
                cq: l.lin(&format!("{p}.cross.q"), d, d)?,
                ckv: l.lin(&format!("{p}.cross.kv"), 2 * d, d)?,
                cproj: l.lin(&format!("{p}.cross.proj"), d, d)?,
                fc1: l.lin(&format!("{p}.mlp.fc1"), h, d)?,
                fc2: l.lin(&format!("{p}.mlp.fc2"), d, h)?,
            });
        }
        let dims = Dims {
            grid: cfg.latent_grid(),
            channels: cfg.patch_dim(),
            kv_layers: cfg.depth,
            kv_dim: d,
            words: cfg.max_tokens,
            context_len: d + 2 * cfg.depth * cfg.max_tokens * d,
            cond_len: cfg.depth * 6 * d + 2 * d,
        };
        Ok(Self {
            text,
            t1: l.lin("t_mlp1", d, 256)?,
            t2: l.lin("t_mlp2", d, d)?,
            pool: l.lin("pool", d, d)?,
            x_embed: l.lin("x_embed", d, cfg.patch_dim())?,
            pos: l.t("pos_embed", &[cfg.tokens(), d])?,
            blocks,
            final_ada: l.lin("final_ada", 2 * d, d)?,
            final_: l.lin("final", cfg.patch_dim(), d)?,
            zeros: Tensor::zeros(d, DType::F32, device)?,
            cfg,
            dims,
            device: device.clone(),
            path: path.into(),
            vocab,
            function_words,
            audio,
            saliency_layers,
            sample_shift,
        })
    }
}

fn parse_config(w: &Weights) -> Result<Config, WeightsError> {
    let bad = |m: String| WeightsError::Metadata(m);
    // Files written before video and audio carry no kind: they are images.
    let kind = match w.meta("kind").unwrap_or("image") {
        "image" => Kind::Image,
        "video" => Kind::Video,
        "audio" => Kind::Audio,
        k => {
            return Err(bad(format!(
                "kind {k:?}: expected \"image\", \"video\" or \"audio\""
            )))
        }
    };
    let v: serde_json::Value = serde_json::from_str(w.meta("config")?)
        .map_err(|e| bad(format!("config is not JSON: {e}")))?;
    let get = |k: &str| -> Result<usize, WeightsError> {
        v.get(k)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| bad(format!("config has no integer {k:?}")))
    };
    let cfg = Config {
        image: get("image")?,
        patch: get("patch")?,
        channels: get("channels")?,
        d: get("d")?,
        depth: get("depth")?,
        heads: get("heads")?,
        text_layers: get("text_layers")?,
        vocab: get("vocab")?,
        max_tokens: get("max_tokens")?,
        mlp_ratio: get("mlp_ratio")?,
        frames: match kind {
            Kind::Image => 1,
            _ => get("frames")?,
        },
        kind,
    };
    // Bounds far above the built-in models keep every size product far from overflow.
    let sizes = [cfg.image, cfg.d, cfg.depth, cfg.heads, cfg.frames];
    if cfg.patch == 0
        || cfg.image % cfg.patch != 0
        || cfg.heads == 0
        || cfg.d % cfg.heads != 0
        || cfg.d % 4 != 0
        || cfg.depth == 0
        || cfg.frames == 0
        || sizes.iter().any(|&x| x > 1 << 14)
        || cfg.tokens() > 1 << 20
        || (kind == Kind::Audio && cfg.patch != 1)
    {
        return Err(bad(format!("inconsistent config {cfg:?}")));
    }
    Ok(cfg)
}

/// Reads the layers of a built-in model from its `VarBuilder`.
pub(super) struct Loader<'a> {
    pub(super) vb: &'a VarBuilder<'a>,
}

impl Loader<'_> {
    pub(super) fn t(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        self.vb.get(shape, name).map_err(read_error)
    }
    pub(super) fn lin(&self, name: &str, out: usize, inp: usize) -> Result<Lin, ModelError> {
        Ok(Lin {
            w: self.t(&format!("{name}.weight"), &[out, inp])?,
            b: self.t(&format!("{name}.bias"), &[out])?,
        })
    }
    /// Rows `[at, at + out)` of a stored linear layer: one of q, k, v out of a fused qkv.
    pub(super) fn lin_rows(
        &self,
        name: &str,
        rows: usize,
        inp: usize,
        at: usize,
        out: usize,
    ) -> Result<Lin, ModelError> {
        let bad = |e: candle_core::Error| WeightsError::Metadata(format!("{name}: {e}"));
        let w = self.t(&format!("{name}.weight"), &[rows, inp])?;
        let b = self.t(&format!("{name}.bias"), &[rows])?;
        Ok(Lin {
            w: w.narrow(0, at, out)
                .and_then(|t| t.contiguous())
                .map_err(bad)?,
            b: b.narrow(0, at, out)
                .and_then(|t| t.contiguous())
                .map_err(bad)?,
        })
    }
    pub(super) fn ln(&self, name: &str, d: usize) -> Result<LayerNorm, ModelError> {
        Ok(LayerNorm::new(
            self.t(&format!("{name}.weight"), &[d])?,
            self.t(&format!("{name}.bias"), &[d])?,
            EPS as f64,
        ))
    }
}

fn parse_audio(w: &Weights, bands: usize) -> Result<AudioSpec, WeightsError> {
    let a: AudioSpec = meta_json(w, "audio")?;
    if a.rate == 0
        || a.rate > 1_000_000
        || a.hop == 0
        || a.hop > 1 << 16
        || !(a.db_floor.is_finite() && a.db_floor < 0.0)
        || a.centres.len() != bands
        || a.centres.iter().any(|&c| !(c.is_finite() && c > 0.0))
    {
        return Err(WeightsError::Metadata(format!(
            "audio: rate {} (1..=1000000), hop {} (1..=65536), db_floor {} (< 0) and {} \
             positive centres (one per band, {bands})",
            a.rate,
            a.hop,
            a.db_floor,
            a.centres.len()
        )));
    }
    Ok(a)
}

fn meta_json<T: serde::de::DeserializeOwned>(w: &Weights, key: &str) -> Result<T, WeightsError> {
    serde_json::from_str(w.meta(key)?).map_err(|e| WeightsError::Metadata(format!("{key}: {e}")))
}
