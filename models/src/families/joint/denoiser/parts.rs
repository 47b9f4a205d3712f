//! What a joint-attention model plugs into [`super::JointDenoiser`]: its transformer
//! ([`JointModel`]), text encoders ([`PromptEncoder`]), decoder ([`LatentDecoder`]) and
//! sampling schedule ([`Schedule`]).

use std::fmt;

use candle_core::Tensor;

use crate::families::joint::{JointOutput, Rows};
use crate::ModelError;

/// A prompt as FLUX and SD3 read it.
#[derive(Debug, Clone)]
pub struct EncodedPrompt {
    /// The text tokens as strings (SentencePiece pieces, special tokens included), one per
    /// row of `states`.
    pub pieces: Vec<String>,
    /// The text encoder's states, `text_tokens x context_in_dim`.
    pub states: Tensor,
    /// The pooled vector, `vec_in_dim`.
    pub pooled: Tensor,
}

/// What turns a prompt into the transformer's text inputs (FLUX: T5 states and CLIP's
/// pooled vector; SD3: CLIP-L/G and T5 states joined, and both CLIPs' pooled vectors).
pub trait PromptEncoder: Send + Sync + fmt::Debug {
    /// Encodes a prompt; always [`PromptEncoder::tokens`] rows.
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError>;
    /// Text tokens per prompt (FLUX: T5's padded length, 512 for dev, 256 for schnell).
    fn tokens(&self) -> usize;
    /// What classifier-free guidance's second pass reads: `None` (the default) for the
    /// empty prompt encoded; Stable Audio's pipeline uses zero text states instead.
    fn unconditional(&self) -> Result<Option<EncodedPrompt>, ModelError> {
        Ok(None)
    }
}

/// Where latent channel `k` of pixel `(dy, dx)` is in a token's values, given the patch
/// side `p` and the latent channels `c`: `(k, dy, dx, p, c) -> index`.
pub type PixelIndex = fn(usize, usize, usize, usize, usize) -> usize;

/// A latent decoder (a VAE): what turns the denoised latent into pixels or sound. The
/// pipelines implement it for their decoders; this module names none of them.
pub trait LatentDecoder: Send + Sync + fmt::Debug {
    /// Decodes a latent: `channels x height x width` for an image, `channels x frames x
    /// height x width` for a video, `channels x frames` for a sound (which comes back as
    /// `audio channels x samples`).
    fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError>;
    /// Pixels per latent pixel side (images).
    fn scale(&self) -> usize {
        1
    }
    /// Samples per second (sound).
    fn sampling_rate(&self) -> u32 {
        0
    }
}

/// A joint-attention transformer the engine can run: FLUX, SD3's MMDiT, Wan2.1 or Stable
/// Audio's DiT (each implements it beside its own definition).
pub trait JointModel: Send + Sync + fmt::Debug {
    /// Report name ("flux-dev").
    fn name(&self) -> &str;
    /// Values per latent token.
    fn token_values(&self) -> usize;
    /// Layers with image K/V.
    fn kv_layers(&self) -> usize;
    /// Width of a K/V row.
    fn hidden(&self) -> usize;
    /// Rows of `hidden` in a step's conditioning.
    fn cond_rows(&self) -> usize;
    /// Width of the text states and of the pooled vector.
    fn text_widths(&self) -> (usize, usize);
    /// A request's context rows from the encoders' outputs.
    fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError>;
    /// A step's conditioning rows (`guidance` where the model embeds one).
    fn step_cond(&self, context: &Tensor, t: f32, guidance: f32) -> Result<Tensor, ModelError>;
    /// Forward of some latent rows of a grid of `frames` frames.
    fn forward(
        &self,
        rows: Rows<'_>,
        frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError>;
    /// The first block's modulated input of every token of `x` (`width` tokens a row).
    fn first_block_input(
        &self,
        x: &Tensor,
        width: usize,
        cond: &Tensor,
    ) -> Result<Tensor, ModelError>;
    /// Latent pixels per token side, and where latent channel `k` of pixel (dy, dx) is in
    /// a token's values.
    fn packing(&self) -> (usize, PixelIndex);
    /// Rows each forward computes besides the latent rows, given `text_tokens` text tokens
    /// (see [`crate::Denoiser::fixed_rows`]). The default is a joint stream: every text token is a
    /// row through every block, at a latent row's cost.
    fn fixed_rows(&self, text_tokens: usize) -> usize {
        text_tokens
    }
    /// FLOPs of a forward over `tokens` image tokens and `text_tokens` text tokens (see
    /// [`crate::Flops`]); `None` (the default) where the layers are not counted, and the
    /// engine counts rows.
    fn flops(&self, tokens: usize, text_tokens: usize) -> Option<crate::Flops> {
        let _ = (tokens, text_tokens);
        None
    }
}

/// How a model spaces its steps' times ([`crate::Denoiser::time`]), as its released scheduler
/// does (diffusers' `FlowMatchEulerDiscreteScheduler`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// `1 - n / steps` (FLUX.1 schnell).
    Uniform,
    /// The uniform time `u` shifted to `s u / (1 + (s - 1) u)` (SD3 and SD3.5: s = 3).
    Shift(f32),
    /// FLUX.1 dev's resolution-dependent shift: `e^mu / (e^mu + 1/u - 1)`, `mu` linear in
    /// the image tokens from 0.5 at 256 to 1.15 at 4096.
    Resolution,
    /// Stable Audio Open's: noise levels `sigma` spaced evenly in log from `max` to `min`
    /// over the steps, then 0 (diffusers' `CosineDPMSolverMultistepScheduler`, exponential
    /// schedule, 0.3 to 500), each as the time `atan(sigma) 2 / pi`.
    Cosine {
        /// Smallest noise level before the last step (0.3).
        min: f32,
        /// Largest, at step 0 (500).
        max: f32,
    },
}

impl Schedule {
    /// The time of step `n` of `steps` over `tokens` image tokens.
    pub fn time(self, n: u32, steps: u32, tokens: usize) -> f32 {
        let u = 1.0 - n.min(steps) as f64 / steps.max(1) as f64;
        if u <= 0.0 {
            return 0.0;
        }

        let t = match self {
            Self::Uniform => u,
            Self::Shift(s) => {
                let s = s as f64;
                s * u / (1.0 + (s - 1.0) * u)
            }
            Self::Resolution => {
                let mu = 0.5 + (1.15 - 0.5) * (tokens as f64 - 256.0) / (4096.0 - 256.0);
                let e = mu.exp();
                e / (e + (1.0 / u - 1.0))
            }
            Self::Cosine { min, max } => {
                let (lo, hi) = ((min as f64).ln(), (max as f64).ln());
                let f = if steps > 1 {
                    n as f64 / (steps - 1) as f64
                } else {
                    0.0
                };
                (hi + (lo - hi) * f).exp().atan() * 2.0 / std::f64::consts::PI
            }
        };
        t as f32
    }
}
