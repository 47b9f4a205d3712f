//! FLUX and SD3 as [`Denoiser`]s: what the engine, the workers and the bench see.
//!
//! The text encoders come in through [`PromptEncoder`] (T5 + CLIP in the released
//! pipelines, [`crate::pipelines`]; a test supplies a small one). With a VAE
//! ([`JointDenoiser::with_vae`]) [`Denoiser::decode`] makes the image; without one it returns
//! a *latent preview* (see there).
//!
//! Context layout (f32, flat): the text states after the model's text projection
//! (`text_tokens x hidden`), then the pooled vector after its embedder (`hidden`), then the
//! word of each text token (`text_tokens` values, -1 for none): the saliency map's columns
//! are words ([`crate::families::joint::pieces`]). The text stream is computed in every forward (exact); the
//! engine's K/V cache holds the image tokens only.

use candle_core::{Device, Tensor};

use crate::families::joint::pieces::words_from_pieces;
use crate::families::joint::{JointOutput, Rows};
use crate::{
    Conditioning, Denoiser, Dims, FullOutput, Kind, KvCache, LatentGrid, ModelError, Patches,
    Sample, StepInput, SubsetOutput,
};

mod parts;
pub use parts::{EncodedPrompt, JointModel, LatentDecoder, PixelIndex, PromptEncoder, Schedule};

/// A joint-attention transformer with its text side, on a fixed latent grid.
#[derive(Debug)]
pub struct JointDenoiser<M: JointModel> {
    model: M,
    text: Box<dyn PromptEncoder>,
    dims: Dims,
    device: Device,
    guidance: f32,
    name: String,
    schedule: Schedule,
    /// What turns a finished latent into the output (none: the latent preview).
    decoder: Option<Decoder>,
    /// Classifier-free guidance scale (SD3): a second pass on the empty prompt.
    cfg: Option<f32>,
    /// The empty prompt's context rows, encoded once (with guidance).
    empty: std::sync::OnceLock<Vec<f32>>,
}

/// A pipeline's one decoder, by what it makes.
#[derive(Debug)]
enum Decoder {
    /// Images from a single-frame grid (a VAE, or TinyFLUX's pixels).
    Image(Box<dyn LatentDecoder>),
    /// Sound from a 1-D grid of latent frames, keeping the first `usize` samples of each
    /// channel (Stable Audio Open generates its whole window and cuts the asked duration).
    Sound(Box<dyn LatentDecoder>, usize),
    /// Video from every frame of the grid (Wan's VAE).
    Video(Box<dyn LatentDecoder>),
}

/// A request context's parts.
struct Parts {
    /// The prompt's rows, `(text_tokens + 1) x hidden`.
    ctx: Tensor,
    /// The empty prompt's rows, with classifier-free guidance.
    uncond: Option<Tensor>,
    /// Word of each text token (-1: none).
    word_of: Vec<f32>,
}

/// Most latent tokens a [`JointDenoiser`] takes (2^18).
pub const MAX_TOKENS: usize = 1 << 18;

impl<M: JointModel> JointDenoiser<M> {
    /// The model on a `height x width` grid of image tokens (16 x that in pixels for FLUX
    /// and SD3), with guidance `guidance` (FLUX.1 dev's default is 3.5; schnell and SD3,
    /// whose guidance is classifier-free, ignore it).
    pub fn new(
        flux: M,
        text: Box<dyn PromptEncoder>,
        (height, width): (usize, usize),
        guidance: f32,
        device: Device,
    ) -> Result<Self, ModelError> {
        Self::new_video(flux, text, (1, height, width), guidance, device)
    }

    /// The model on a `frames x height x width` grid of tokens (a video for Wan).
    pub fn new_video(
        flux: M,
        text: Box<dyn PromptEncoder>,
        (frames, height, width): (usize, usize, usize),
        guidance: f32,
        device: Device,
    ) -> Result<Self, ModelError> {
        let tokens = frames
            .checked_mul(height)
            .and_then(|n| n.checked_mul(width));
        if frames == 0 || height == 0 || width == 0 || !guidance.is_finite() {
            return Err(ModelError::Input(format!(
                "{} needs a non-empty token grid and a finite guidance; got {frames} x {height} x {width}, {guidance}",
                flux.name()
            )));
        }
        if tokens.is_none_or(|n| n > MAX_TOKENS) {
            return Err(ModelError::Input(format!(
                "{}: a grid of {frames} x {height} x {width} tokens; at most {MAX_TOKENS} tokens \
                 (Wan2.1 14B at 720p, 81 frames, is 75,600)",
                flux.name()
            )));
        }
        let (hidden, nt) = (flux.hidden(), text.tokens());
        let dims = Dims {
            grid: LatentGrid {
                frames,
                height,
                width,
            },
            channels: flux.token_values(),
            kv_layers: flux.kv_layers(),
            kv_dim: hidden,
            words: nt,
            context_len: (nt + 1) * hidden + nt,
            cond_len: flux.cond_rows() * hidden,
        };
        let name = flux.name().to_string();
        Ok(Self {
            model: flux,
            text,
            dims,
            device,
            guidance,
            name,
            schedule: Schedule::Uniform,
            decoder: None,
            cfg: None,
            empty: std::sync::OnceLock::new(),
        })
    }

    /// The same model with classifier-free guidance of scale `scale` (SD3 / SD3.5: 7.0 in
    /// diffusers' pipeline): every forward runs twice, on the prompt and on the empty
    /// prompt, and returns `u + scale (c - u)`. The context and the step conditioning hold
    /// both; a K/V row holds both passes' (`2 hidden` wide); the patch mass is their mean,
    /// the saliency the prompt's.
    pub fn with_cfg(mut self, scale: f32) -> Result<Self, ModelError> {
        if !scale.is_finite() {
            return Err(ModelError::Input(format!(
                "guidance scale {scale} is not finite"
            )));
        }
        if self.cfg.is_none() {
            let (h, nt) = (self.model.hidden(), self.text.tokens());
            self.dims.context_len += (nt + 1) * h;
            self.dims.cond_len *= 2;
            self.dims.kv_dim *= 2;
        }
        self.cfg = Some(scale);
        Ok(self)
    }

    /// The same model stepping on `schedule` (default: uniform).
    pub fn with_schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// The same model decoding its latents to images with `vae` (default: the latent
    /// preview). A VAE decodes single frames: a video grid keeps the preview.
    pub fn with_vae(mut self, vae: impl LatentDecoder + 'static) -> Self {
        self.decoder = Some(Decoder::Image(Box::new(vae)));
        self
    }

    /// The same model, a 1-D grid of latent frames, decoding them to sound with `vae` and
    /// keeping the first `samples` samples of each channel (Stable Audio Open generates its
    /// whole window and cuts the asked duration).
    pub fn with_audio(mut self, vae: impl LatentDecoder + 'static, samples: usize) -> Self {
        self.decoder = Some(Decoder::Sound(Box::new(vae), samples));
        self
    }

    /// The same model decoding its video latents with Wan's VAE (default: the latent
    /// preview).
    pub fn with_video_vae(mut self, vae: impl LatentDecoder + 'static) -> Self {
        self.decoder = Some(Decoder::Video(Box::new(vae)));
        self
    }

    /// The request context's parts: the prompt's `(text_tokens + 1) x hidden` rows, the
    /// word of each text token, then (with guidance) the empty prompt's rows.
    fn context_parts(&self, context: &Tensor) -> Result<Parts, ModelError> {
        let (nt, h) = (self.text.tokens(), self.model.hidden());
        if context.elem_count() != self.dims.context_len {
            return Err(ModelError::Input(format!(
                "context of {} values, {} takes {}",
                context.elem_count(),
                self.name,
                self.dims.context_len
            )));
        }
        let flat = context.flatten_all()?;
        let rows = |at: usize| flat.narrow(0, at, (nt + 1) * h)?.reshape((nt + 1, h));
        let uncond = match self.cfg {
            Some(_) => Some(rows((nt + 1) * h + nt)?),
            None => None,
        };
        Ok(Parts {
            ctx: rows(0)?,
            uncond,
            word_of: flat.narrow(0, (nt + 1) * h, nt)?.to_vec1::<f32>()?,
        })
    }

    /// The `text_tokens x words` piece-to-word matrix.
    fn word_matrix(&self, word_of: &[f32]) -> Result<Tensor, ModelError> {
        let nt = word_of.len();
        let mut m = vec![0f32; nt * nt];
        for (i, &w) in word_of.iter().enumerate() {
            if w >= 0.0 && (w as usize) < nt {
                m[i * nt + w as usize] = 1.0;
            }
        }
        Ok(Tensor::from_vec(m, (nt, nt), &self.device)?)
    }

    /// The forward of `rows`: once, or with guidance once per context, combined.
    fn run(&self, rows: Rows<'_>, parts: &Parts, cond: &Tensor) -> Result<JointOutput, ModelError> {
        let frames = self.dims.grid.frames;
        let (Some(g), Some(uctx)) = (self.cfg, &parts.uncond) else {
            return self.model.forward(rows, frames, &parts.ctx, cond);
        };
        let (n, h) = (self.model.cond_rows(), self.model.hidden());
        let half = |t: &Tensor, i: usize| t.narrow(2, i * h, h);
        let caches = match rows.cache {
            Some((k, v)) => Some([(half(k, 0)?, half(v, 0)?), (half(k, 1)?, half(v, 1)?)]),
            None => None,
        };
        let cache = |i: usize| caches.as_ref().map(|c| (&c[i].0, &c[i].1));
        let c = self.model.forward(
            Rows {
                cache: cache(0),
                ..rows
            },
            frames,
            &parts.ctx,
            &cond.narrow(0, 0, n)?,
        )?;
        let u = self.model.forward(
            Rows {
                cache: cache(1),
                saliency: false,
                ..rows
            },
            frames,
            uctx,
            &cond.narrow(0, n, n)?,
        )?;
        let velocity = (&u.velocity + ((&c.velocity - &u.velocity)? * g as f64)?)?;
        let patch_mass = match (c.patch_mass, u.patch_mass) {
            (Some(a), Some(b)) => Some(((a + b)? * 0.5)?),
            _ => None,
        };
        Ok(JointOutput {
            velocity,
            k: Tensor::cat(&[&c.k, &u.k], 2)?,
            v: Tensor::cat(&[&c.v, &u.v], 2)?,
            saliency: c.saliency,
            patch_mass,
            text_kv: None,
        })
    }

    /// The step conditioning's rows (with guidance: the prompt's, then the empty prompt's).
    fn cond(&self, step: &StepInput<'_>) -> Result<Tensor, ModelError> {
        if step.cond.elem_count() != self.dims.cond_len {
            return Err(ModelError::Input(format!(
                "step conditioning of {} values, {} takes {}",
                step.cond.elem_count(),
                self.name,
                self.dims.cond_len
            )));
        }
        let n = self.model.cond_rows() * if self.cfg.is_some() { 2 } else { 1 };
        Ok(step.cond.reshape((n, self.model.hidden()))?)
    }
}

impl<M: JointModel> Denoiser for JointDenoiser<M> {
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
        let (nt, (width, _)) = (self.text.tokens(), self.model.text_widths());
        if e.pieces.len() != nt || e.states.dims() != [nt, width] {
            return Err(ModelError::Input(format!(
                "the text encoder gave {} pieces and states {:?}; {} takes {nt} and [{nt}, {width}]",
                e.pieces.len(),
                e.states.dims(),
                self.name
            )));
        }
        let pw = words_from_pieces(&e.pieces);
        if pw.words.is_empty() {
            return Err(ModelError::Input(format!("prompt {prompt:?} has no words")));
        }
        let ctx = self.model.context(&e.states, &e.pooled)?;
        let mut context = ctx.flatten_all()?.to_vec1::<f32>()?;
        context.extend(pw.word_of.iter().map(|w| w.map_or(-1.0, |w| w as f32)));
        if self.cfg.is_some() {
            let empty = match self.empty.get() {
                Some(e) => e,
                None => {
                    let u = match self.text.unconditional()? {
                        Some(u) => u,
                        None => self.text.encode("")?,
                    };
                    let uctx = self.model.context(&u.states, &u.pooled)?;
                    let rows = uctx.flatten_all()?.to_vec1::<f32>()?;
                    self.empty.get_or_init(|| rows)
                }
            };
            context.extend_from_slice(empty);
        }
        Ok(Conditioning {
            salient: pw.salient(),
            words: pw.words,
            context,
        })
    }

    fn time(&self, n: u32, steps: u32) -> f32 {
        self.schedule.time(n, steps, self.dims.grid.tokens())
    }

    fn step_cond(&self, context: &Tensor, t: f32) -> Result<Tensor, ModelError> {
        if !t.is_finite() {
            return Err(ModelError::Input(format!("step time {t} is not finite")));
        }
        let parts = self.context_parts(context)?;
        let c = self.model.step_cond(&parts.ctx, t, self.guidance)?;
        let c = match &parts.uncond {
            Some(u) => Tensor::cat(&[c, self.model.step_cond(u, t, self.guidance)?], 0)?,
            None => c,
        };
        Ok(c.flatten_all()?)
    }

    fn full_forward(
        &self,
        x: &Tensor,
        step: StepInput<'_>,
        saliency: bool,
    ) -> Result<FullOutput, ModelError> {
        let parts = self.context_parts(step.context)?;
        let cond = self.cond(&step)?;
        let ids: Vec<u32> = (0..self.dims.grid.tokens() as u32).collect();
        let out = self.run(
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
            &parts,
            &cond,
        )?;
        let saliency = match out.saliency {
            Some(s) => Some(s.matmul(&self.word_matrix(&parts.word_of)?)?),
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
        let parts = self.context_parts(step.context)?;
        let cond = self.cond(&step)?;
        let out = self.run(
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
            &parts,
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

    fn fixed_rows(&self) -> usize {
        self.model.fixed_rows(self.text.tokens())
    }

    fn flops(&self) -> crate::Flops {
        let rows = crate::Flops {
            per_token: 1.0,
            per_step: self.fixed_rows() as f64,
            every_step: 0.0,
            signal_per_token: 0.0,
            counted: false,
        };
        let f = self
            .model
            .flops(self.dims.grid.tokens(), self.text.tokens())
            .unwrap_or(rows);
        // Classifier-free guidance runs every forward twice (the prompt's and the empty
        // prompt's pass), the signal once.
        let passes = if self.cfg.is_some() { 2.0 } else { 1.0 };
        crate::Flops {
            per_token: f.per_token * passes,
            per_step: f.per_step * passes,
            every_step: f.every_step * passes,
            ..f
        }
    }

    fn first_block_input(&self, x: &Tensor, step: StepInput<'_>) -> Result<Tensor, ModelError> {
        // With guidance, the prompt's pass: the signal whole-step caching watches.
        let cond = self.cond(&step)?.narrow(0, 0, self.model.cond_rows())?;
        self.model.first_block_input(x, self.dims.grid.width, &cond)
    }

    fn image_size(&self) -> Option<(usize, usize)> {
        let (p, _) = self.model.packing();
        let g = &self.dims.grid;
        match &self.decoder {
            Some(Decoder::Image(vae)) if g.frames == 1 => {
                Some((vae.scale() * p * g.width, vae.scale() * p * g.height))
            }
            _ => None,
        }
    }

    fn kind(&self) -> Kind {
        if matches!(self.decoder, Some(Decoder::Sound(..))) {
            Kind::Audio
        } else if self.dims.grid.frames > 1 {
            Kind::Video
        } else {
            Kind::Image
        }
    }

    /// With a VAE, the image it decodes. Without one (or for a video grid), the *latent
    /// preview*: each token's `p x p` cell of latent
    /// pixels shown as RGB from latent channels 0-2, squashed to [0, 1] by `0.5 + 0.5 tanh`.
    /// Frames of `p height x p width` pixels (p = 2 for FLUX, SD3 and Wan).
    fn decode(&self, latent: &[f32]) -> Result<Sample, ModelError> {
        let (f, h, w, c) = (
            self.dims.grid.frames,
            self.dims.grid.height,
            self.dims.grid.width,
            self.dims.channels,
        );
        let (p, at) = self.model.packing();
        if let (Some(Decoder::Sound(vae, keep)), true) =
            (&self.decoder, latent.len() == f * h * w * c)
        {
            // Frames x channels -> channels x frames -> audio channels x samples.
            let z = Tensor::from_slice(latent, (f * h * w, c), &self.device)?.t()?;
            let a = vae.decode(&z.contiguous()?)?;
            let (channels, n) = a.dims2()?;
            let a = a.narrow(1, 0, n.min(*keep))?.t()?;
            let interleaved = a.flatten_all()?.to_device(&Device::Cpu)?.to_vec1::<f32>()?;
            let rate = vae.sampling_rate();
            return Ok(Sample::audio_channels(interleaved, rate, channels));
        }
        if latent.len() != f * h * w * c || c % (p * p) != 0 {
            return Err(ModelError::Input(format!(
                "latent of {} values, expected {}",
                latent.len(),
                f * h * w * c
            )));
        }
        let ch = (c / (p * p)).min(c);
        match &self.decoder {
            Some(Decoder::Image(vae)) if f == 1 => {
                return self.vae_decode(&**vae, latent, (h, w, c, p, ch), at)
            }
            Some(Decoder::Video(vae)) => {
                return self.video_decode(&**vae, latent, (f, h, w, c, p, ch), at)
            }
            _ => {}
        }
        let (pw, ph) = (p * w, p * h);
        let mut rgb = vec![0f32; f * ph * pw * 3];
        for (frame, out) in latent.chunks(h * w * c).zip(rgb.chunks_mut(ph * pw * 3)) {
            Self::preview_frame(frame, out, (h, w, c, p, ch), at);
        }
        Ok(Sample::frames(rgb, pw, ph, f))
    }
}

impl<M: JointModel> JointDenoiser<M> {
    /// The latent (`tokens x values`) unpacked to `channels x ph x pw` latent pixels and
    /// decoded by the VAE to an RGB image of 8 pixels per latent pixel.
    fn vae_decode(
        &self,
        vae: &dyn LatentDecoder,
        latent: &[f32],
        (h, w, c, p, ch): (usize, usize, usize, usize, usize),
        at: PixelIndex,
    ) -> Result<Sample, ModelError> {
        let (ph, pw) = (p * h, p * w);
        let mut z = vec![0f32; ch * ph * pw];
        for ty in 0..h {
            for tx in 0..w {
                let tok = &latent[(ty * w + tx) * c..(ty * w + tx + 1) * c];
                for k in 0..ch {
                    for dy in 0..p {
                        for dx in 0..p {
                            z[(k * ph + p * ty + dy) * pw + p * tx + dx] =
                                tok[at(k, dy, dx, p, ch)];
                        }
                    }
                }
            }
        }
        let img = vae.decode(&Tensor::from_vec(z, (ch, ph, pw), &self.device)?)?;
        let (_, ih, iw) = img.dims3()?;
        let rgb = img
            .permute((1, 2, 0))?
            .flatten_all()?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        Ok(Sample::frames(rgb, iw, ih, 1))
    }

    /// The latent (`frames x tokens x values`) unpacked to `channels x frames x ph x pw`
    /// latent pixels and decoded by Wan's VAE: `1 + 4 (frames - 1)` RGB frames of 8 pixels
    /// per latent pixel.
    fn video_decode(
        &self,
        vae: &dyn LatentDecoder,
        latent: &[f32],
        (f, h, w, c, p, ch): (usize, usize, usize, usize, usize, usize),
        at: PixelIndex,
    ) -> Result<Sample, ModelError> {
        let (ph, pw) = (p * h, p * w);
        let mut z = vec![0f32; ch * f * ph * pw];
        for fr in 0..f {
            for ty in 0..h {
                for tx in 0..w {
                    let i = (fr * h + ty) * w + tx;
                    let tok = &latent[i * c..(i + 1) * c];
                    for k in 0..ch {
                        for dy in 0..p {
                            for dx in 0..p {
                                z[((k * f + fr) * ph + p * ty + dy) * pw + p * tx + dx] =
                                    tok[at(k, dy, dx, p, ch)];
                            }
                        }
                    }
                }
            }
        }
        let v = vae.decode(&Tensor::from_vec(z, (ch, f, ph, pw), &self.device)?)?;
        let (_, frames, vh, vw) = v.dims4()?;
        let rgb = ((v.permute((1, 2, 3, 0))? + 1.0)? * 0.5)?
            .flatten_all()?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        Ok(Sample::frames(rgb, vw, vh, frames))
    }

    /// One frame of the latent preview.
    fn preview_frame(
        latent: &[f32],
        rgb: &mut [f32],
        (h, w, c, p, ch): (usize, usize, usize, usize, usize),
        at: PixelIndex,
    ) {
        let pw = p * w;
        for ty in 0..h {
            for tx in 0..w {
                let tok = &latent[(ty * w + tx) * c..(ty * w + tx + 1) * c];
                for dy in 0..p {
                    for dx in 0..p {
                        let px = ((p * ty + dy) * pw + p * tx + dx) * 3;
                        for k in 0..3.min(ch) {
                            rgb[px + k] = 0.5 + 0.5 * tok[at(k, dy, dx, p, ch)].tanh();
                        }
                    }
                }
            }
        }
    }
}
