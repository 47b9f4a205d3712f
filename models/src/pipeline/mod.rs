//! Text-to-image pipelines from a model folder in diffusers' layout: FLUX.1 [dev] and
//! [schnell] with their T5 and CLIP text encoders, tokenizers and VAE decoder (#12 item 3).
//!
//! ```text
//! DIR/transformer/            FLUX transformer: diffusers' shards, or Black Forest Labs'
//!                             single file (flux1-dev.safetensors) placed here
//! DIR/text_encoder/           CLIP ViT-L/14 text model (config.json, model.safetensors)
//! DIR/tokenizer/              its tokenizer (tokenizer.json, or vocab.json + merges.txt)
//! DIR/text_encoder_2/         T5 v1.1 XXL encoder (config.json, shards)
//! DIR/tokenizer_2/            its tokenizer (tokenizer.json)
//! DIR/vae/                    AutoencoderKL (config.json, diffusion_pytorch_model.safetensors)
//!                             or DIR/ae.safetensors (Black Forest Labs' autoencoder)
//! ```
//!
//! Every tensor is read through our checkpoint reader (f32, f16 or bf16; shards; errors that
//! name the file, the key and both shapes) and computed in f32. The text encoders and the
//! VAE are candle-transformers' (T5, CLIP, `AutoEncoderKL` / FLUX's autoencoder); the
//! transformer is ours, with the token-subset forward.

use std::path::Path;

use candle_core::Device;

use crate::flux::FluxCheckpoint;
use crate::joint_denoiser::{FluxDenoiser, Schedule};
use crate::ModelError;

mod text;
pub mod tiny;
mod vae;

pub use text::{FluxText, TextTokenizer};
pub use vae::Vae;

/// The pipelines `flashdiff generate --model` knows besides the built-in models.
pub const PIPELINES: &[&str] = &["flux-dev", "flux-schnell"];

/// Pixels per image token side (8x VAE, 2x2 patches).
pub const PIXELS_PER_TOKEN: usize = 16;

/// Largest image side in pixels (128 x 128 image tokens).
pub const MAX_SIDE: usize = 2048;

/// What a pipeline is asked for besides its folder.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// Image size in pixels, `(height, width)`, each a multiple of 16 in 16..=2048.
    pub size: (usize, usize),
    /// FLUX.1 dev's embedded guidance (default 3.5); schnell has none.
    pub guidance: Option<f32>,
}

/// The default guidance of `name` (FLUX.1 dev: 3.5), `None` where it takes none.
pub fn default_guidance(name: &str) -> Option<f32> {
    (name == "flux-dev").then_some(3.5)
}

/// T5 tokens per prompt, as the released pipelines pad them.
fn t5_tokens(name: &str) -> usize {
    if name == "flux-schnell" {
        256
    } else {
        512
    }
}

/// Checks an image size for a pipeline; the error names what is wrong.
pub fn check_size((h, w): (usize, usize)) -> Result<(), ModelError> {
    for (side, what) in [(h, "height"), (w, "width")] {
        if side == 0 || side % PIXELS_PER_TOKEN != 0 || side > MAX_SIDE {
            return Err(ModelError::Input(format!(
                "image {what} {side}: must be a multiple of {PIXELS_PER_TOKEN} in \
                 {PIXELS_PER_TOKEN}..={MAX_SIDE} pixels"
            )));
        }
    }
    Ok(())
}

/// Loads pipeline `name` (one of [`PIPELINES`]) from `dir` on `dev`.
pub fn load(
    name: &str,
    dir: &Path,
    opts: &PipelineOptions,
    dev: &Device,
) -> Result<FluxDenoiser, ModelError> {
    if !PIPELINES.contains(&name) {
        return Err(ModelError::Input(format!(
            "unknown pipeline {name:?}; known: {}",
            PIPELINES.join(", ")
        )));
    }
    check_size(opts.size)?;
    if !dir.is_dir() {
        return Err(ModelError::Input(format!(
            "{} is not a folder; {name} reads a diffusers folder (transformer/, text_encoder/, \
             text_encoder_2/, tokenizer/, tokenizer_2/, vae/)",
            dir.display()
        )));
    }
    let transformer = dir.join("transformer");
    let ckpt = FluxCheckpoint::open(&transformer)?;
    let axes = axes_dim(&transformer)?;
    let flux = ckpt.load(axes, dev)?;
    let dev_model = flux.config().guidance_embed;
    if dev_model != (name == "flux-dev") {
        return Err(ModelError::Input(format!(
            "{}: this transformer {} a guidance embedding, so it is {}, not {name}",
            transformer.display(),
            if dev_model { "has" } else { "has no" },
            if dev_model {
                "flux-dev"
            } else {
                "flux-schnell"
            }
        )));
    }
    let guidance = match (opts.guidance, default_guidance(name)) {
        (Some(g), Some(_)) => g,
        (Some(_), None) => {
            return Err(ModelError::Input(format!(
                "{name} takes no guidance (it was distilled without it)"
            )))
        }
        (None, d) => d.unwrap_or(0.0),
    };
    let text = FluxText::load(dir, t5_tokens(name), dev)?;
    let cfg = flux.config();
    if text.widths() != (cfg.context_in_dim, cfg.vec_in_dim) {
        return Err(ModelError::Input(format!(
            "{}: the text encoders give widths {:?} (T5, CLIP); the transformer reads {:?}",
            dir.display(),
            text.widths(),
            (cfg.context_in_dim, cfg.vec_in_dim)
        )));
    }
    let vae = Vae::load(dir, dev)?;
    if vae.channels() * 4 != cfg.in_channels {
        return Err(ModelError::Input(format!(
            "{}: the VAE has {} latent channels; the transformer packs {} values a token (4 x channels)",
            dir.display(),
            vae.channels(),
            cfg.in_channels
        )));
    }
    let (h, w) = opts.size;
    let grid = (h / PIXELS_PER_TOKEN, w / PIXELS_PER_TOKEN);
    let schedule = if name == "flux-dev" {
        Schedule::Resolution
    } else {
        Schedule::Uniform
    };
    Ok(
        FluxDenoiser::new(flux, Box::new(text), grid, guidance, dev.clone())?
            .with_schedule(schedule)
            .with_vae(vae),
    )
}

/// `axes_dims_rope` of a diffusers `transformer/config.json`, if there is one.
fn axes_dim(transformer: &Path) -> Result<Option<[usize; 3]>, ModelError> {
    #[derive(serde::Deserialize)]
    struct Json {
        axes_dims_rope: Option<[usize; 3]>,
    }
    if !transformer.join("config.json").is_file() {
        return Ok(None);
    }
    Ok(text::config::<Json>(transformer)?.axes_dims_rope)
}
