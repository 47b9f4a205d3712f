//! Text-to-image pipelines from a model folder in diffusers' layout: FLUX.1 \[dev\] and
//! \[schnell\] with their T5 and CLIP text encoders, tokenizers and VAE decoder, and SD3 /
//! SD3.5 with CLIP-L, CLIP-G and T5 and classifier-free guidance.
//!
//! FLUX:
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
//! SD3 / SD3.5: `transformer/` (diffusers' `SD3Transformer2DModel`, or Stability's single
//! file placed there), `text_encoder/` + `tokenizer/` (CLIP-L with projection),
//! `text_encoder_2/` + `tokenizer_2/` (CLIP-G with projection), `text_encoder_3/` +
//! `tokenizer_3/` (T5 v1.1 XXL), `vae/`.
//!
//! Every tensor is read through our checkpoint reader (f32, f16 or bf16; shards; errors that
//! name the file, the key and both shapes) and computed in f32. The text encoders and the
//! VAE are candle-transformers' (T5, CLIP, `AutoEncoderKL` / FLUX's autoencoder); the
//! transformer is ours, with the token-subset forward.

use std::path::Path;

use candle_core::{DType, Device};

use crate::families::flux::{FluxCheckpoint, FluxDenoiser};
use crate::families::joint::denoiser::Schedule;
use crate::families::mmdit::MmditCheckpoint;
use crate::families::mmdit::Sd3Denoiser;
use crate::{Denoiser, Kind, ModelError};

pub mod audio;
pub mod registry;
#[cfg(feature = "fixtures")]
pub mod tiny;
pub mod tinyflux;
pub mod wan;

use crate::decoders::vae::Vae;
use crate::encoders::sd3::Sd3Text;
use crate::encoders::text::{FluxText, TextTokenizer};

/// The model family a pipeline's folder holds, which says how it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// FLUX.1: T5 + CLIP, the FLUX transformer, a VAE.
    Flux,
    /// SD3 / SD3.5: CLIP-L, CLIP-G, T5, the MMDiT, a VAE, classifier-free guidance.
    Sd3,
    /// Wan2.1 text-to-video: UMT5, the Wan transformer, the video VAE.
    Wan,
    /// Stable Audio Open: T5, the DiT, the audio autoencoder.
    StableAudio,
    /// The built-in TinyDiT family: one safetensors file (the file says whether it makes
    /// images, video or sound) with its own prompt language.
    TinyDit,
    /// The built-in TinyFLUX family: diffusers' FLUX transformer over pixel cells with the
    /// built-in text encoder, a model folder ([`tinyflux`]).
    TinyFlux,
}

/// One model by name, built in or read from a diffusers folder: what the loader, the CLI and
/// the servers need to know about it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pipeline {
    /// Its `--model` name.
    pub name: &'static str,
    /// How its folder is loaded.
    pub family: Family,
    /// What it makes.
    pub kind: Kind,
    /// Its default guidance, as diffusers' pipelines default it (FLUX.1 dev's embedded
    /// guidance, the others' classifier-free scale); `None`: it takes none (distilled).
    pub guidance: Option<f32>,
    /// T5 tokens per prompt, as the released pipeline pads them (FLUX and SD3).
    pub text_tokens: usize,
    /// The variant the transformer's weights must show: FLUX.1 dev's guidance embedding,
    /// SD3.5's Q/K norms (`false`: schnell, SD3).
    pub variant: bool,
    /// Its default size in pixels, `(height, width)` (the sound models take none; a built-in
    /// model's is its only size).
    pub size: (usize, usize),
    /// A built-in model's shipped weights, a file or folder under
    /// [`registry::models_dir`]; `None` for a pipeline read from a folder the caller names.
    pub shipped: Option<&'static str>,
}

impl Pipeline {
    /// Whether it is one of the built-in models (its weights ship with this crate).
    pub const fn is_builtin(&self) -> bool {
        self.shipped.is_some()
    }
}

/// A built-in model's row: no guidance, no variant.
const fn builtin(
    name: &'static str,
    family: Family,
    kind: Kind,
    text_tokens: usize,
    size: (usize, usize),
    shipped: &'static str,
) -> Pipeline {
    Pipeline {
        name,
        family,
        kind,
        guidance: None,
        text_tokens,
        variant: false,
        size,
        shipped: Some(shipped),
    }
}

/// Every model `flashdiff generate --model` knows: the built-in models (their weights ship
/// with this crate), then the pipelines read from a diffusers folder.
pub const TABLE: [Pipeline; 12] = [
    builtin(
        "tinydit",
        Family::TinyDit,
        Kind::Image,
        0,
        (32, 32),
        "tinydit/tinydit.safetensors",
    ),
    builtin(
        "tinyvideo",
        Family::TinyDit,
        Kind::Video,
        0,
        (32, 32),
        "tinyvideo/tinyvideo.safetensors",
    ),
    builtin(
        "tinyaudio",
        Family::TinyDit,
        Kind::Audio,
        0,
        (0, 0),
        "tinyaudio/tinyaudio.safetensors",
    ),
    builtin(
        tinyflux::NAME,
        Family::TinyFlux,
        Kind::Image,
        16,
        (32, 32),
        tinyflux::NAME,
    ),
    builtin(
        "tinyflux-l",
        Family::TinyFlux,
        Kind::Image,
        32,
        (64, 64),
        "tinyflux-l",
    ),
    builtin(
        "tinyflux-xl",
        Family::TinyFlux,
        Kind::Image,
        32,
        (128, 128),
        "tinyflux-xl",
    ),
    Pipeline {
        name: "flux-dev",
        family: Family::Flux,
        kind: Kind::Image,
        guidance: Some(3.5),
        text_tokens: 512,
        variant: true,
        size: (1024, 1024),
        shipped: None,
    },
    Pipeline {
        name: "flux-schnell",
        family: Family::Flux,
        kind: Kind::Image,
        guidance: None,
        text_tokens: 256,
        variant: false,
        size: (1024, 1024),
        shipped: None,
    },
    Pipeline {
        name: "sd3",
        family: Family::Sd3,
        kind: Kind::Image,
        guidance: Some(7.0),
        text_tokens: 256,
        variant: false,
        size: (1024, 1024),
        shipped: None,
    },
    Pipeline {
        name: "sd3.5",
        family: Family::Sd3,
        kind: Kind::Image,
        guidance: Some(7.0),
        text_tokens: 256,
        variant: true,
        size: (1024, 1024),
        shipped: None,
    },
    Pipeline {
        name: VIDEO,
        family: Family::Wan,
        kind: Kind::Video,
        guidance: Some(5.0),
        text_tokens: 0,
        variant: false,
        // Wan2.1's 480p.
        size: (480, 832),
        shipped: None,
    },
    Pipeline {
        name: AUDIO,
        family: Family::StableAudio,
        kind: Kind::Audio,
        guidance: Some(7.0),
        text_tokens: 0,
        variant: false,
        size: (0, 0),
        shipped: None,
    },
];

/// How many rows of [`TABLE`] are built in (`true`) or pipelines (`false`).
pub(crate) const fn count(builtin: bool) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < TABLE.len() {
        if TABLE[i].is_builtin() == builtin {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The names of [`TABLE`]'s built-in rows (`true`) or pipeline rows (`false`), in its order.
pub(crate) const fn names<const N: usize>(builtin: bool) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut j) = (0, 0);
    while i < TABLE.len() {
        if TABLE[i].is_builtin() == builtin {
            out[j] = TABLE[i].name;
            j += 1;
        }
        i += 1;
    }
    out
}

/// The pipelines' names (the models read from a diffusers folder), in [`TABLE`]'s order.
pub const PIPELINES: [&str; count(false)] = names(false);

/// The pipeline named `name` (read from a diffusers folder), if it is one.
pub fn pipeline(name: &str) -> Option<&'static Pipeline> {
    model(name).filter(|p| !p.is_builtin())
}

/// The model named `name`, built in or a pipeline, if it is one.
pub fn model(name: &str) -> Option<&'static Pipeline> {
    TABLE.iter().find(|p| p.name == name)
}

/// The text-to-video pipeline among [`PIPELINES`].
pub const VIDEO: &str = "wan2.1";

/// The text-to-audio pipeline among [`PIPELINES`] (the others make images).
pub const AUDIO: &str = "stable-audio-open";

/// Pixels per image token side (8x VAE, 2x2 patches).
pub const PIXELS_PER_TOKEN: usize = 16;

/// Largest image side in pixels (128 x 128 image tokens).
pub const MAX_SIDE: usize = 2048;

/// What a pipeline is asked for besides its folder.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// Image size in pixels, `(height, width)`, each a multiple of 16 in 16..=2048.
    pub size: (usize, usize),
    /// FLUX.1 dev's embedded guidance (default 3.5), SD3's classifier-free guidance scale
    /// (default 7.0); schnell has none.
    pub guidance: Option<f32>,
    /// What the transformer's linear layers and the T5 encoder compute in: F32, or BF16 (the
    /// released weights' own dtype: half the memory of f32, native on a GPU; on the CPU
    /// candle widens each product's operands to f32). Everything else runs in f32.
    pub dtype: DType,
    /// Stable Audio Open: seconds of audio (default: the model's whole window, 47.55 s for
    /// the released model). Images take none.
    pub seconds: Option<f32>,
    /// Wan2.1: video frames, 1 + 4k (default 81).
    pub frames: Option<usize>,
}

impl PipelineOptions {
    /// `size` with the default guidance, in f32.
    pub fn new(size: (usize, usize)) -> Self {
        Self {
            size,
            guidance: None,
            dtype: DType::F32,
            seconds: None,
            frames: None,
        }
    }
}

/// The compute dtypes a pipeline takes, by name (`--dtype`).
pub const DTYPES: [(&str, DType); 2] = [("f32", DType::F32), ("bf16", DType::BF16)];

/// The compute dtype named `s` (one of [`DTYPES`]); the error lists them.
pub fn parse_dtype(s: &str) -> Result<DType, ModelError> {
    DTYPES
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            ModelError::Input(format!(
                "compute dtype {s:?}: expected one of {}",
                DTYPES.map(|(n, _)| n).join(", ")
            ))
        })
}

/// The default guidance of `name` ([`Pipeline::guidance`]), `None` where it takes none.
pub fn default_guidance(name: &str) -> Option<f32> {
    pipeline(name).and_then(|p| p.guidance)
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
) -> Result<Box<dyn Denoiser>, ModelError> {
    let Some(p) = pipeline(name) else {
        return Err(ModelError::Input(format!(
            "unknown pipeline {name:?}; known: {}",
            PIPELINES.join(", ")
        )));
    };
    let makes = |k: Kind| match k {
        Kind::Image => "images",
        Kind::Video => "video",
        Kind::Audio => "sound",
    };
    if p.kind != Kind::Audio {
        check_size(opts.size)?;
    }
    if opts.seconds.is_some() && p.kind != Kind::Audio {
        return Err(ModelError::Input(format!(
            "{name} makes {}: a duration in seconds applies to {AUDIO}",
            makes(p.kind)
        )));
    }
    if opts.frames.is_some() && p.kind != Kind::Video {
        return Err(ModelError::Input(format!(
            "a frame count applies to {VIDEO}; {name} makes {}",
            makes(p.kind)
        )));
    }
    if !dir.is_dir() {
        return Err(ModelError::Input(format!(
            "{} is not a folder; {name} reads a diffusers folder (transformer/, text_encoder*/, \
             tokenizer*/, vae/)",
            dir.display()
        )));
    }
    let guidance = match (opts.guidance, p.guidance) {
        (Some(g), Some(_)) => g,
        (Some(_), None) => {
            return Err(ModelError::Input(format!(
                "{name} takes no guidance (it was distilled without it)"
            )))
        }
        (None, d) => d.unwrap_or(0.0),
    };
    let (h, w) = opts.size;
    let grid = (h / PIXELS_PER_TOKEN, w / PIXELS_PER_TOKEN);
    if !DTYPES.iter().any(|(_, d)| *d == opts.dtype) {
        return Err(ModelError::Input(format!(
            "compute dtype {:?}: pipelines compute in {}",
            opts.dtype,
            DTYPES.map(|(n, _)| n).join(" or ")
        )));
    }
    Ok(match p.family {
        Family::Wan => Box::new(wan::load(
            dir,
            opts.size,
            opts.frames.unwrap_or(wan::DEFAULT_FRAMES),
            guidance,
            opts.dtype,
            dev,
        )?),
        Family::StableAudio => Box::new(audio::load(dir, opts.seconds, guidance, opts.dtype, dev)?),
        Family::Sd3 => Box::new(load_sd3(p, dir, grid, guidance, opts.dtype, dev)?),
        Family::Flux => Box::new(load_flux(p, dir, grid, guidance, opts.dtype, dev)?),
        Family::TinyDit | Family::TinyFlux => {
            return Err(ModelError::Input(format!(
                "{name} is a built-in model, not a pipeline read from a folder"
            )))
        }
    })
}

fn load_flux(
    p: &Pipeline,
    dir: &Path,
    grid: (usize, usize),
    guidance: f32,
    dtype: DType,
    dev: &Device,
) -> Result<FluxDenoiser, ModelError> {
    let transformer = dir.join("transformer");
    let ckpt = FluxCheckpoint::open(&transformer)?;
    let axes = axes_dim(&transformer)?;
    let flux = ckpt.load_in(axes, dtype, dev)?;
    let name = p.name;
    let dev_model = flux.config().guidance_embed;
    if dev_model != p.variant {
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
    let text = FluxText::load(dir, p.text_tokens, dtype, dev)?;
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
    // FLUX.1 dev shifts its schedule by resolution; schnell samples uniformly.
    let schedule = if p.variant {
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

fn load_sd3(
    p: &Pipeline,
    dir: &Path,
    grid: (usize, usize),
    guidance: f32,
    dtype: DType,
    dev: &Device,
) -> Result<Sd3Denoiser, ModelError> {
    let transformer = dir.join("transformer");
    let ckpt = MmditCheckpoint::open(&transformer)?;
    let mmdit = ckpt.load_in(heads(&transformer)?, dtype, dev)?;
    let cfg = mmdit.config().clone();
    let name = p.name;
    if cfg.qk_norm != p.variant {
        let is = if cfg.qk_norm { "sd3.5" } else { "sd3" };
        return Err(ModelError::Input(format!(
            "{}: this transformer {} Q/K norms, so it is {is}, not {name}",
            transformer.display(),
            if cfg.qk_norm { "has" } else { "has no" }
        )));
    }
    if cfg.patch != 2 || grid.0.max(grid.1) > cfg.pos_max {
        return Err(ModelError::Input(format!(
            "{}: patches of {} latent pixels and a position grid of {} tokens a side; the \
             image asks for {} x {} tokens of 2 x 2",
            transformer.display(),
            cfg.patch,
            cfg.pos_max,
            grid.0,
            grid.1
        )));
    }
    let text = Sd3Text::load(dir, p.text_tokens, dtype, dev)?;
    if text.widths() != (cfg.context_in_dim, cfg.pooled_dim) {
        return Err(ModelError::Input(format!(
            "{}: the text encoders give widths {:?} (joined states, pooled); the transformer \
             reads {:?}",
            dir.display(),
            text.widths(),
            (cfg.context_in_dim, cfg.pooled_dim)
        )));
    }
    let vae = Vae::load(dir, dev)?;
    if vae.channels() != cfg.in_channels {
        return Err(ModelError::Input(format!(
            "{}: the VAE has {} latent channels; the transformer reads {}",
            dir.display(),
            vae.channels(),
            cfg.in_channels
        )));
    }
    Sd3Denoiser::new(mmdit, Box::new(text), grid, 0.0, dev.clone())?
        .with_schedule(Schedule::Shift(3.0))
        .with_vae(vae)
        .with_cfg(guidance)
}

/// `num_attention_heads` of a diffusers `transformer/config.json`, if there is one.
fn heads(transformer: &Path) -> Result<Option<usize>, ModelError> {
    #[derive(serde::Deserialize)]
    struct Json {
        num_attention_heads: Option<usize>,
    }
    if !transformer.join("config.json").is_file() {
        return Ok(None);
    }
    Ok(crate::io::folder::config::<Json>(transformer)?.num_attention_heads)
}

/// `axes_dims_rope` of a diffusers `transformer/config.json`, if there is one.
pub(crate) fn axes_dim(transformer: &Path) -> Result<Option<[usize; 3]>, ModelError> {
    #[derive(serde::Deserialize)]
    struct Json {
        axes_dims_rope: Option<[usize; 3]>,
    }
    if !transformer.join("config.json").is_file() {
        return Ok(None);
    }
    Ok(crate::io::folder::config::<Json>(transformer)?.axes_dims_rope)
}
