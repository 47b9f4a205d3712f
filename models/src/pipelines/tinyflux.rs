//! TinyFLUX, the built-in FLUX: diffusers' `FluxTransformer2DModel` at a small size, trained
//! on the built-in shapes (`models/tinyflux/`), run by the same FLUX transformer and
//! [`JointDenoiser`] as FLUX.1. What differs from the released pipeline is around the
//! transformer: the built-in text encoder (TinyDiT's text tower; its states are the
//! transformer's text input, their mean the pooled vector) stands in for T5 and CLIP, and the
//! tokens are 4 x 4 cells of RGB pixels instead of packed VAE latents, so decoding is
//! unpatchifying.
//!
//! The model folder is diffusers' layout: `transformer/` (config.json and safetensors) and
//! `text_encoder/model.safetensors` (format `flashdiff-tinyflux-text`, with the model's
//! config and vocabulary in its metadata), as `models/tinyflux/export.py` writes them.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::families::flux::{FluxCheckpoint, FluxDenoiser};
use crate::families::joint::denoiser::{
    EncodedPrompt, JointDenoiser, LatentDecoder, PromptEncoder,
};
use crate::families::tinydit::scene;
use crate::families::tinydit::{TextNames, TextSizes, TextTower};
use crate::io::shards::{f32_builder, Shards};
use crate::io::weights::{Weights, WeightsError};
use crate::ModelError;

/// The report name of the built-in FLUX.
pub const NAME: &str = "tinyflux";

/// The text encoder file's `format` metadata.
const FORMAT: &str = "flashdiff-tinyflux-text";

/// The model's sizes around the transformer (`FluxConfig` of `models/tinyflux/flux_model.py`).
#[derive(Debug, Clone, Deserialize)]
struct Sizes {
    image: usize,
    patch: usize,
    channels: usize,
    text_d: usize,
    text_layers: usize,
    vocab: usize,
    max_tokens: usize,
}

/// The built-in text encoder: prompt words to `max_tokens x text_d` states and their mean.
#[derive(Debug)]
pub struct TinyFluxText {
    tower: TextTower,
    vocab: Vec<String>,
    tokens: usize,
}

impl TinyFluxText {
    /// Reads `text_encoder/model.safetensors` of a TinyFLUX folder.
    fn load(path: &Path, device: &Device) -> Result<(Self, Sizes), ModelError> {
        let w = Weights::open(path)?;
        let format = w.meta("format")?;
        if format != FORMAT {
            return Err(WeightsError::Metadata(format!(
                "{}: format {format:?}, expected {FORMAT:?}",
                path.display()
            ))
            .into());
        }
        let json = |key: &str| -> Result<serde_json::Value, WeightsError> {
            serde_json::from_str(w.meta(key)?)
                .map_err(|e| WeightsError::Metadata(format!("{key}: {e}")))
        };
        let bad = |key: &str, e: serde_json::Error| WeightsError::Metadata(format!("{key}: {e}"));
        let sizes: Sizes = serde_json::from_value(json("config")?).map_err(|e| bad("config", e))?;
        let vocab: Vec<String> =
            serde_json::from_value(json("vocab")?).map_err(|e| bad("vocab", e))?;
        let heads: usize =
            serde_json::from_value(json("text_heads")?).map_err(|e| bad("text_heads", e))?;
        let s = &sizes;
        if vocab.len() != s.vocab
            || s.vocab < 2
            || s.max_tokens == 0
            || heads == 0
            || s.text_d % heads != 0
            || s.patch == 0
            || s.image % s.patch != 0
            || s.channels == 0
        {
            return Err(WeightsError::Metadata(format!(
                "{}: vocab of {} words (config: {}, at least 2), {} tokens, width {} over {heads} \
                 heads, image {} in patches of {} with {} channels do not fit together",
                path.display(),
                vocab.len(),
                s.vocab,
                s.max_tokens,
                s.text_d,
                s.image,
                s.patch,
                s.channels
            ))
            .into());
        }
        let vb = f32_builder(Arc::new(Shards::one(w)), device);
        let tower = TextTower::load(
            &vb,
            TextNames {
                tok_emb: "tok_emb.weight",
                pos: "txt_pos",
                layers: "layers",
                ln: "ln",
            },
            TextSizes {
                d: s.text_d,
                heads,
                mlp: 4 * s.text_d,
                layers: s.text_layers,
                vocab: s.vocab,
                tokens: s.max_tokens,
            },
        )?;
        let tokens = s.max_tokens;
        Ok((
            Self {
                tower,
                vocab,
                tokens,
            },
            sizes,
        ))
    }
}

impl PromptEncoder for TinyFluxText {
    /// The prompt in the built-in grammar (an unknown word or too many are errors that list
    /// the vocabulary or the limit); pieces are `▁word` per word and `<pad>` after.
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let ids = scene::tokenize(prompt, &self.vocab, self.tokens)?;
        let states = self.tower.states(&ids)?;
        let pooled = states.mean(0)?;
        let pieces = ids
            .iter()
            .map(|&i| match i {
                0 => "<pad>".to_string(),
                i => format!("\u{2581}{}", self.vocab[i as usize]),
            })
            .collect();
        Ok(EncodedPrompt {
            pieces,
            states,
            pooled,
        })
    }

    fn tokens(&self) -> usize {
        self.tokens
    }
}

/// The "decoder" of a model over pixels: values in [-1, 1] to [0, 1], clamped.
#[derive(Debug)]
struct Pixels;

impl LatentDecoder for Pixels {
    fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        Ok(((z + 1.0)? * 0.5)?.clamp(0f32, 1f32)?)
    }
}

/// Whether `dir` looks like a TinyFLUX folder (what [`load`] reads).
pub fn is_folder(dir: &Path) -> bool {
    dir.join("transformer").is_dir() && dir.join("text_encoder/model.safetensors").is_file()
}

/// Loads TinyFLUX from its model folder (`models/tinyflux`) onto `device`, in f32.
pub fn load(dir: &Path, device: &Device) -> Result<FluxDenoiser, ModelError> {
    load_named(dir, NAME, device)
}

/// Loads a model of the TinyFLUX family (any canvas side its folder's config gives) under the
/// report name `name` (`tinyflux-l`, say).
pub fn load_named(dir: &Path, name: &str, device: &Device) -> Result<FluxDenoiser, ModelError> {
    let transformer = dir.join("transformer");
    let text_file = dir.join("text_encoder").join("model.safetensors");
    if !is_folder(dir) {
        return Err(ModelError::Input(format!(
            "{}: a TinyFLUX folder holds transformer/ and text_encoder/model.safetensors \
             (models/tinyflux/export.py writes them)",
            dir.display()
        )));
    }
    let (text, s) = TinyFluxText::load(&text_file, device)?;
    let ckpt = FluxCheckpoint::open(&transformer)?;
    let axes = crate::pipelines::axes_dim(&transformer)?;
    let flux = ckpt
        .load_in(axes, DType::F32, device)?
        .over_pixels(s.patch, name)?;
    let cfg = flux.config();
    let cell = s.patch * s.patch * s.channels;
    if cfg.in_channels != cell || (cfg.context_in_dim, cfg.vec_in_dim) != (s.text_d, s.text_d) {
        return Err(ModelError::Input(format!(
            "{}: the transformer takes {} values a token and text widths ({}, {}); the text \
             encoder's config says {cell} ({} x {} x {}) and {}",
            dir.display(),
            cfg.in_channels,
            cfg.context_in_dim,
            cfg.vec_in_dim,
            s.patch,
            s.patch,
            s.channels,
            s.text_d
        )));
    }
    let grid = s.image / s.patch;
    Ok(
        JointDenoiser::new(flux, Box::new(text), (grid, grid), 0.0, device.clone())?
            .with_vae(Pixels),
    )
}
