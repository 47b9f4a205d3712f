//! FLUX as a [`Denoiser`]: what the engine, the workers and the bench see.
//!
//! The text encoders come in through [`FluxText`] (T5 + CLIP in the released pipelines; a
//! test supplies a small one), so that the transformer's contract with the engine is
//! settled and tested before the encoders and the VAE are wired in. Until the VAE is,
//! [`Denoiser::decode`] returns a *latent preview* (see there), not an image.
//!
//! Context layout (f32, flat): `txt_in(T5 states)` (`text_tokens x hidden`), then
//! `vector_in(CLIP pooled)` (`hidden`), then the word of each text token (`text_tokens`
//! values, -1 for none): the saliency map's columns are words ([`crate::pieces`]).
//! The text stream is computed in every forward (exact); the engine's K/V cache holds the
//! image tokens only.

use std::fmt;

use candle_core::{Device, Tensor};

use super::Flux;
use crate::joint::Rows;
use crate::pieces::words_from_pieces;
use crate::{
    Conditioning, Denoiser, Dims, FullOutput, KvCache, LatentGrid, ModelError, Patches, Sample,
    StepInput, SubsetOutput,
};

/// A prompt as FLUX reads it.
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

/// What turns a prompt into FLUX's text inputs.
pub trait FluxText: Send + Sync + fmt::Debug {
    /// Encodes a prompt; always [`FluxText::tokens`] rows.
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError>;
    /// Text tokens per prompt (T5's padded length: 512 for dev, 256 for schnell).
    fn tokens(&self) -> usize;
}

/// FLUX with its text side, on a fixed latent grid.
#[derive(Debug)]
pub struct FluxDenoiser {
    flux: Flux,
    text: Box<dyn FluxText>,
    dims: Dims,
    device: Device,
    guidance: f32,
    name: String,
}

impl FluxDenoiser {
    /// FLUX on a `height x width` grid of image tokens (an image of 16 x that in pixels),
    /// with guidance `guidance` (FLUX.1 dev's default is 3.5; schnell ignores it).
    pub fn new(
        flux: Flux,
        text: Box<dyn FluxText>,
        (height, width): (usize, usize),
        guidance: f32,
        device: Device,
    ) -> Result<Self, ModelError> {
        if height == 0 || width == 0 || !guidance.is_finite() {
            return Err(ModelError::Input(format!(
                "FLUX needs a non-empty token grid and a finite guidance; got {height} x {width}, {guidance}"
            )));
        }
        let cfg = flux.config().clone();
        let nt = text.tokens();
        let dims = Dims {
            grid: LatentGrid {
                frames: 1,
                height,
                width,
            },
            channels: cfg.in_channels,
            kv_layers: cfg.kv_layers(),
            kv_dim: cfg.hidden,
            words: nt,
            context_len: (nt + 1) * cfg.hidden + nt,
            cond_len: cfg.cond_rows() * cfg.hidden,
        };
        let name = if cfg.guidance_embed {
            "flux-dev"
        } else {
            "flux-schnell"
        };
        Ok(Self {
            flux,
            text,
            dims,
            device,
            guidance,
            name: name.into(),
        })
    }

    /// The request context's parts: `(text_tokens + 1) x hidden` and the `text_tokens x
    /// words` piece-to-word matrix.
    fn context_parts(&self, context: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let (nt, h) = (self.text.tokens(), self.flux.config().hidden);
        if context.elem_count() != self.dims.context_len {
            return Err(ModelError::Input(format!(
                "context of {} values, FLUX takes {}",
                context.elem_count(),
                self.dims.context_len
            )));
        }
        let flat = context.flatten_all()?;
        let ctx = flat.narrow(0, 0, (nt + 1) * h)?.reshape((nt + 1, h))?;
        let word_of = flat.narrow(0, (nt + 1) * h, nt)?.to_vec1::<f32>()?;
        let mut m = vec![0f32; nt * nt];
        for (i, &w) in word_of.iter().enumerate() {
            if w >= 0.0 && (w as usize) < nt {
                m[i * nt + w as usize] = 1.0;
            }
        }
        Ok((ctx, Tensor::from_vec(m, (nt, nt), &self.device)?))
    }

    fn cond(&self, step: &StepInput<'_>) -> Result<Tensor, ModelError> {
        let cfg = self.flux.config();
        if step.cond.elem_count() != self.dims.cond_len {
            return Err(ModelError::Input(format!(
                "step conditioning of {} values, FLUX takes {}",
                step.cond.elem_count(),
                self.dims.cond_len
            )));
        }
        Ok(step.cond.reshape((cfg.cond_rows(), cfg.hidden))?)
    }
}

impl Denoiser for FluxDenoiser {
    fn name(&self) -> &str {
        &self.name
    }

    fn dims(&self) -> &Dims {
        &self.dims
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn condition(&self, prompt: &str) -> Result<Conditioning, ModelError> {
        let e = self.text.encode(prompt)?;
        let (nt, cfg) = (self.text.tokens(), self.flux.config());
        if e.pieces.len() != nt || e.states.dims() != [nt, cfg.context_in_dim] {
            return Err(ModelError::Input(format!(
                "the text encoder gave {} pieces and states {:?}; FLUX takes {nt} and [{nt}, {}]",
                e.pieces.len(),
                e.states.dims(),
                cfg.context_in_dim
            )));
        }
        let pw = words_from_pieces(&e.pieces);
        if pw.words.is_empty() {
            return Err(ModelError::Input(format!("prompt {prompt:?} has no words")));
        }
        let ctx = self.flux.context(&e.states, &e.pooled)?;
        let mut context = ctx.flatten_all()?.to_vec1::<f32>()?;
        context.extend(pw.word_of.iter().map(|w| w.map_or(-1.0, |w| w as f32)));
        Ok(Conditioning {
            salient: pw.salient(),
            words: pw.words,
            context,
        })
    }

    fn step_cond(&self, context: &Tensor, t: f32) -> Result<Tensor, ModelError> {
        if !t.is_finite() {
            return Err(ModelError::Input(format!("step time {t} is not finite")));
        }
        let (ctx, _) = self.context_parts(context)?;
        Ok(self.flux.step_cond(&ctx, t, self.guidance)?.flatten_all()?)
    }

    fn full_forward(
        &self,
        x: &Tensor,
        step: StepInput<'_>,
        saliency: bool,
    ) -> Result<FullOutput, ModelError> {
        let (ctx, words) = self.context_parts(step.context)?;
        let cond = self.cond(&step)?;
        let ids: Vec<u32> = (0..self.dims.grid.tokens() as u32).collect();
        let out = self.flux.forward(
            Rows {
                x,
                ids: &ids,
                width: self.dims.grid.width,
                tokens: self.dims.grid.tokens(),
                cache: None,
                patches: None,
                saliency,
                text_cache: None,
            },
            &ctx,
            &cond,
        )?;
        let saliency = match out.saliency {
            Some(s) => Some(s.matmul(&words)?),
            None => None,
        };
        Ok(FullOutput {
            velocity: out.velocity,
            k: out.k,
            v: out.v,
            saliency,
        })
    }

    fn subset_forward(
        &self,
        x_active: &Tensor,
        active: &[u32],
        step: StepInput<'_>,
        cache: Option<KvCache<'_>>,
        patches: Patches<'_>,
    ) -> Result<SubsetOutput, ModelError> {
        let (ctx, _) = self.context_parts(step.context)?;
        let cond = self.cond(&step)?;
        let out = self.flux.forward(
            Rows {
                x: x_active,
                ids: active,
                width: self.dims.grid.width,
                tokens: self.dims.grid.tokens(),
                cache: cache.map(|c| (c.k, c.v)),
                patches: Some((patches.of_token, patches.patches)),
                saliency: false,
                text_cache: None,
            },
            &ctx,
            &cond,
        )?;
        // Without a cache (NaivePatch) the rows see only each other: no mass over the
        // whole latent's patches is defined, and none is reported.
        let patch_mass = match out.patch_mass {
            Some(m) => m,
            None => Tensor::zeros(
                (active.len(), patches.patches),
                candle_core::DType::F32,
                &self.device,
            )?,
        };
        Ok(SubsetOutput {
            velocity: out.velocity,
            k: out.k,
            v: out.v,
            patch_mass,
        })
    }

    fn first_block_input(&self, x: &Tensor, step: StepInput<'_>) -> Result<Tensor, ModelError> {
        let cond = self.cond(&step)?;
        self.flux.first_block_input(x, &cond)
    }

    /// No VAE is wired in yet: the *latent preview*, each token's 2 x 2 cell of latent
    /// pixels (16 channels each, packed as FLUX packs them) shown as RGB from channels 0-2,
    /// squashed to [0, 1] by `0.5 + 0.5 tanh`. An image of `2 height x 2 width` pixels.
    fn decode(&self, latent: &[f32]) -> Result<Sample, ModelError> {
        let (h, w, c) = (
            self.dims.grid.height,
            self.dims.grid.width,
            self.dims.channels,
        );
        if latent.len() != h * w * c || c % 4 != 0 {
            return Err(ModelError::Input(format!(
                "latent of {} values, expected {}",
                latent.len(),
                h * w * c
            )));
        }
        let ch = c / 4;
        let (pw, ph) = (2 * w, 2 * h);
        let mut rgb = vec![0f32; ph * pw * 3];
        for ty in 0..h {
            for tx in 0..w {
                let tok = &latent[(ty * w + tx) * c..(ty * w + tx + 1) * c];
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    // FLUX packs (channel, dy, dx) with the channel slowest.
                    let px = ((2 * ty + dy) * pw + 2 * tx + dx) * 3;
                    for k in 0..3.min(ch) {
                        let v = tok[k * 4 + dy * 2 + dx];
                        rgb[px + k] = 0.5 + 0.5 * v.tanh();
                    }
                }
            }
        }
        Ok(Sample::frames(rgb, pw, ph, 1))
    }
}
