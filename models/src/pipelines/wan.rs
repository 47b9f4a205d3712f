//! Wan2.1 text-to-video from a diffusers folder:
//!
//! ```text
//! DIR/transformer/    WanTransformer3DModel (config.json, shards), or Wan-AI's file there
//! DIR/text_encoder/   umT5-XXL encoder (config.json, shards)
//! DIR/tokenizer/      its tokenizer (tokenizer.json)
//! DIR/vae/            AutoencoderKLWan (config.json, diffusion_pytorch_model.safetensors)
//! DIR/scheduler/      scheduler_config.json (flow_shift; optional, default 3.0)
//! ```
//!
//! As diffusers' `WanPipeline` conditions it: umT5 on the prompt's tokens with the padding
//! masked (its rows zero) up to 512 tokens, classifier-free guidance (5.0) against the empty
//! prompt, flow matching on times shifted by `flow_shift`; the VAE's decoder
//! ([`crate::decoders::wan_vae`]) makes `1 + 4 (T - 1)` RGB frames of `T` latent frames. Without a
//! `vae/` folder the output is the latent preview (latent channels 0-2 of each latent frame
//! as RGB). diffusers' default sampler is UniPC; the engine steps Euler on the same times.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::TextTokenizer;
use crate::encoders::umt5::Umt5Encoder;
use crate::families::joint::denoiser::{EncodedPrompt, PromptEncoder, Schedule};
use crate::families::wan::WanCheckpoint;
use crate::families::wan::WanDenoiser;
use crate::io::folder::config;
use crate::ModelError;

/// umT5 tokens per prompt (`max_sequence_length` in diffusers' pipeline).
pub const WAN_TOKENS: usize = 512;

/// Video frames a request makes by default (diffusers' `num_frames`).
pub const DEFAULT_FRAMES: usize = 81;

/// Frames the VAE packs into one latent frame after the first (4).
pub const FRAMES_PER_LATENT: usize = 4;

/// Wan's prompt encoder: umT5's states with the padding masked.
#[derive(Debug)]
pub struct WanText {
    encoder: Arc<Umt5Encoder>,
    tokenizer: TextTokenizer,
}

impl WanText {
    /// `dir/text_encoder/` and `dir/tokenizer/`, linear layers in `dtype`.
    pub fn load(dir: &Path, dtype: DType, dev: &Device) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Umt5Encoder::open(&dir.join("text_encoder"), dtype, dev)?,
            tokenizer: TextTokenizer::open(&dir.join("tokenizer"), WAN_TOKENS, "<pad>")?,
        })
    }

    /// Width of the states.
    pub fn width(&self) -> usize {
        self.encoder.config().d_model
    }
}

impl PromptEncoder for WanText {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let (ids, mut pieces) = self.tokenizer.encode_unpadded(prompt)?;
        let n = ids.len();
        pieces.resize(WAN_TOKENS, self.tokenizer.pad().to_string());
        let dev = self.encoder.device().clone();
        let states = if n == 0 {
            Tensor::zeros((WAN_TOKENS, self.width()), DType::F32, &dev)?
        } else {
            self.encoder
                .forward(&ids)?
                .pad_with_zeros(0, 0, WAN_TOKENS - n)?
        };
        Ok(EncodedPrompt {
            pieces,
            states,
            pooled: Tensor::zeros(0, DType::F32, &dev)?,
        })
    }

    fn tokens(&self) -> usize {
        WAN_TOKENS
    }
}

/// What we read of `scheduler/scheduler_config.json`.
#[derive(Debug, serde::Deserialize)]
struct SchedulerJson {
    #[serde(default = "three")]
    flow_shift: f32,
}

fn three() -> f32 {
    3.0
}

/// `num_attention_heads` of `transformer/config.json`, if there is one.
#[derive(Debug, serde::Deserialize)]
struct TransformerJson {
    num_attention_heads: Option<usize>,
}

/// Wan2.1 from `dir` making `frames` video frames (1 + 4k) of `(height, width)` pixels
/// (multiples of 16), guided at `guidance`.
pub fn load(
    dir: &Path,
    (height, width): (usize, usize),
    frames: usize,
    guidance: f32,
    dtype: DType,
    dev: &Device,
) -> Result<WanDenoiser, ModelError> {
    if frames == 0 || (frames - 1) % FRAMES_PER_LATENT != 0 {
        return Err(ModelError::Input(format!(
            "{frames} frames: Wan2.1 makes 1 + 4k frames (the VAE packs 4 frames a latent \
             frame after the first), e.g. 81"
        )));
    }
    let tdir = dir.join("transformer");
    let heads = if tdir.join("config.json").is_file() {
        config::<TransformerJson>(&tdir)?.num_attention_heads
    } else {
        None
    };
    let wan = WanCheckpoint::open(&tdir)?.load_in(heads, dtype, dev)?;
    let cfg = wan.config().clone();
    if cfg.patch != [1, 2, 2] {
        return Err(ModelError::Input(format!(
            "{}: patches of {:?} latent pixels; Wan2.1's are [1, 2, 2]",
            tdir.display(),
            cfg.patch
        )));
    }
    let text = WanText::load(dir, dtype, dev)?;
    if text.width() != cfg.text_dim {
        return Err(ModelError::Input(format!(
            "{}: umT5's states are {} wide; the transformer reads {}",
            dir.display(),
            text.width(),
            cfg.text_dim
        )));
    }
    let sched = dir.join("scheduler");
    let s: SchedulerJson = crate::io::folder::scheduler_config(dir)?;
    if !(s.flow_shift.is_finite() && s.flow_shift > 0.0) {
        return Err(ModelError::Input(format!(
            "{}: flow_shift {} must be positive",
            sched.display(),
            s.flow_shift
        )));
    }
    let grid = (
        1 + (frames - 1) / FRAMES_PER_LATENT,
        height / super::PIXELS_PER_TOKEN,
        width / super::PIXELS_PER_TOKEN,
    );
    let mut m = WanDenoiser::new_video(wan, Box::new(text), grid, 0.0, dev.clone())?
        .with_schedule(Schedule::Shift(s.flow_shift));
    if let Some(vae) = crate::decoders::wan_vae::WanVae::open(dir, dev)? {
        if vae.config().z_dim != cfg.in_channels {
            return Err(ModelError::Input(format!(
                "{}: the VAE has {} latent channels; the transformer makes {}",
                dir.display(),
                vae.config().z_dim,
                cfg.in_channels
            )));
        }
        m = m.with_video_vae(vae);
    }
    if guidance > 1.0 {
        m.with_cfg(guidance)
    } else {
        Ok(m)
    }
}
