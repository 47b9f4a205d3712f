//! TinyDiT, the built-in image model, on candle: the embeddings, blocks and final layer read
//! like `models/tinydit/model.py`; the hot ops are `flashdiff_kernels::ops`.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use flashdiff_kernels::ops;

pub mod clips;
mod decode;
mod forward;
mod load;
pub mod scene;
pub mod sounds;
mod text;

pub use decode::{synthesize, unpatchify};
use forward::{Attending, Keys};
pub(crate) use text::{TextNames, TextSizes, TextTower};

use crate::families::joint::denoiser::Schedule;
use crate::{
    Conditioning, Denoiser, Dims, FullOutput, Kind, KvCache, LatentGrid, ModelError, Patches,
    Sample, StepInput, SubsetOutput,
};

const EPS: f32 = 1e-6;
/// Warm-up steps of the built-in sound model (see `default_warmup`).
pub const TINYAUDIO_WARMUP: u32 = 12;

/// Model hyper-parameters (from the weights file's metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Image side in pixels.
    pub image: usize,
    /// Patch side in pixels (one latent token per patch).
    pub patch: usize,
    /// Colour channels.
    pub channels: usize,
    /// Width.
    pub d: usize,
    /// Transformer blocks.
    pub depth: usize,
    /// Attention heads.
    pub heads: usize,
    /// Text encoder layers.
    pub text_layers: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Prompt length in tokens (padded).
    pub max_tokens: usize,
    /// MLP hidden = d * mlp_ratio.
    pub mlp_ratio: usize,
    /// Frames of a video, or time frames (tokens) of an audio clip; 1 for an image.
    pub frames: usize,
    /// What the latent is.
    pub kind: Kind,
}

/// The audio decoder's constants (the weights' `audio` metadata): band `b` is a sine at
/// `centres[b]` Hz whose amplitude is the band's magnitude, interpolated between frame
/// centres `hop` samples apart.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct AudioSpec {
    /// Samples per second.
    pub rate: u32,
    /// Samples per latent frame.
    pub hop: usize,
    /// Latent -1 is this many dB (and silence below it); latent 1 is 0 dB.
    pub db_floor: f64,
    /// Centre frequency of each band, Hz (f64: the phase of a 2-second sine needs it).
    pub centres: Vec<f64>,
}

impl Config {
    /// Latent grid side (tokens per row).
    pub fn grid(&self) -> usize {
        self.image / self.patch
    }
    /// Latent tokens.
    pub fn tokens(&self) -> usize {
        match self.kind {
            Kind::Image => self.grid() * self.grid(),
            Kind::Video => self.frames * self.grid() * self.grid(),
            Kind::Audio => self.frames,
        }
    }
    /// The latent grid in tokens.
    pub fn latent_grid(&self) -> LatentGrid {
        match self.kind {
            Kind::Image | Kind::Video => LatentGrid {
                frames: self.frames,
                height: self.grid(),
                width: self.grid(),
            },
            Kind::Audio => LatentGrid {
                frames: 1,
                height: 1,
                width: self.frames,
            },
        }
    }
    /// Values per latent token.
    pub fn patch_dim(&self) -> usize {
        self.patch * self.patch * self.channels
    }
}

/// A linear layer, weight stored `[out x in]` as PyTorch stores it.
#[derive(Debug, Clone)]
struct Lin {
    w: Tensor,
    b: Tensor,
}

impl Lin {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        ops::linear(x, &self.w, &self.b)
    }
}

#[derive(Debug)]
struct Block {
    ada: Lin,
    q: Lin,
    k: Lin,
    v: Lin,
    proj: Lin,
    cq: Lin,
    ckv: Lin,
    cproj: Lin,
    fc1: Lin,
    fc2: Lin,
}

/// The built-in models (see `models/tinydit/model.py`, the reference): a text-conditioned
/// Diffusion Transformer trained with rectified flow on procedural data. TinyDiT works over an
/// 8x8 grid of 4x4x3 pixel patches of shapes (`models/tinydit/MODEL_CARD.md`); the same blocks
/// run TinyVideo's 3-D grid (`models/tinyvideo`) and TinyAudio's 1-D one (`models/tinyaudio`),
/// chosen by the weights file's [`Kind`].
pub struct TinyDit {
    cfg: Config,
    dims: Dims,
    device: Device,
    path: PathBuf,
    vocab: Vec<String>,
    /// The model's own function words (its data's prompt grammar), never salient.
    function_words: Vec<String>,
    /// Audio models: the decoder's constants.
    audio: Option<AudioSpec>,
    saliency_layers: Vec<usize>,
    /// The sampling schedule's shift (the weights' `sample_shift`, 1 = uniform steps).
    sample_shift: f32,
    text: TextTower,
    t1: Lin,
    t2: Lin,
    pool: Lin,
    x_embed: Lin,
    pos: Tensor,
    blocks: Vec<Block>,
    final_ada: Lin,
    final_: Lin,
    /// `d` zeros: modulation by (0, 0) is the plain, affine-free layer norm.
    zeros: Tensor,
}

impl std::fmt::Debug for TinyDit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinyDit")
            .field("cfg", &self.cfg)
            .field("weights", &self.path)
            .field("device", &self.device)
            .field("sample_shift", &self.sample_shift)
            .finish()
    }
}

impl TinyDit {
    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The vocabulary (index 0 is the padding token).
    pub fn vocab(&self) -> &[String] {
        &self.vocab
    }

    /// Blocks whose cross-attention makes the saliency map.
    pub fn saliency_layers(&self) -> &[usize] {
        &self.saliency_layers
    }

    /// Encodes token ids (padded to `max_tokens`) into the flat context: pooled embedding,
    /// then every block's cross-attention keys, then its values.
    pub fn encode_ids(&self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let d = self.cfg.d;
        let x = self.text.states(ids)?;
        let pooled = self.pool.forward(&x.mean_keepdim(0)?)?.flatten_all()?;
        let mut parts = vec![pooled];
        let kvs = self
            .blocks
            .iter()
            .map(|b| b.ckv.forward(&x))
            .collect::<candle_core::Result<Vec<_>>>()?;
        for half in 0..2 {
            for kv in &kvs {
                parts.push(kv.narrow(1, half * d, d)?.flatten_all()?);
            }
        }
        Ok(Tensor::cat(&parts, 0)?.to_vec1::<f32>()?)
    }

    fn context_part(&self, context: &Tensor, i: usize) -> candle_core::Result<Tensor> {
        // Pooled (d), then depth blocks of cross K, then depth blocks of cross V.
        let (d, mt) = (self.cfg.d, self.cfg.max_tokens);
        context.narrow(0, d + i * mt * d, mt * d)?.reshape((mt, d))
    }

    fn check_step(&self, step: StepInput<'_>) -> Result<(), ModelError> {
        let (c, s) = (step.context.elem_count(), step.cond.elem_count());
        if c != self.dims.context_len || s != self.dims.cond_len {
            return Err(ModelError::Input(format!(
                "context of {c} and step conditioning of {s} values; the model takes {} and {}",
                self.dims.context_len, self.dims.cond_len
            )));
        }
        Ok(())
    }

    fn check_hidden(&self, h: &Tensor) -> Result<(), ModelError> {
        let want = [self.cfg.tokens(), self.cfg.d];
        if h.dims() != want || h.dtype() != DType::F32 {
            return Err(ModelError::Input(format!(
                "hidden rows are {:?} {:?}, expected f32 {want:?}",
                h.dtype(),
                h.dims()
            )));
        }
        Ok(())
    }

    fn check_rows(&self, x: &Tensor, n: usize, what: &str) -> Result<(), ModelError> {
        if x.dims() != [n, self.dims.channels] || x.dtype() != DType::F32 {
            return Err(ModelError::Input(format!(
                "{what} is {:?} {:?}, expected f32 [{n}, {}]",
                x.dtype(),
                x.dims(),
                self.dims.channels
            )));
        }
        Ok(())
    }
}

impl Denoiser for TinyDit {
    /// Per image token: the patch embedding, every block's Q/K/V and output projections,
    /// its cross-attention query and output, its MLP, self-attention over all N tokens and
    /// cross-attention over the prompt's padded tokens, and the output layer. Every step:
    /// the time MLP and the modulation linears. The text tower and the cross-attention
    /// keys and values run once per request.
    fn flops(&self) -> crate::Flops {
        let lin = |l: &Lin| {
            let (o, i) = l.w.dims2().unwrap_or((0, 0));
            2.0 * (o * i) as f64
        };
        let (d, n, t) = (
            self.cfg.d as f64,
            self.cfg.tokens() as f64,
            self.cfg.max_tokens as f64,
        );
        let blocks: f64 = self
            .blocks
            .iter()
            .map(|b| {
                lin(&b.q)
                    + lin(&b.k)
                    + lin(&b.v)
                    + lin(&b.proj)
                    + lin(&b.cq)
                    + lin(&b.cproj)
                    + lin(&b.fc1)
                    + lin(&b.fc2)
                    + 4.0 * d * n
                    + 4.0 * d * t
            })
            .sum();
        let every = lin(&self.t1)
            + lin(&self.t2)
            + self.blocks.iter().map(|b| lin(&b.ada)).sum::<f64>()
            + lin(&self.final_ada);
        crate::Flops {
            per_token: lin(&self.x_embed) + blocks + lin(&self.final_),
            per_step: 0.0,
            every_step: every,
            signal_per_token: lin(&self.x_embed),
            counted: true,
        }
    }

    fn name(&self) -> &str {
        match self.cfg.kind {
            Kind::Image => "tinydit",
            Kind::Video => "tinyvideo",
            Kind::Audio => "tinyaudio",
        }
    }

    fn dims(&self) -> &Dims {
        &self.dims
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn condition(&self, prompt: &str) -> Result<Conditioning, ModelError> {
        let ids = scene::tokenize(prompt, &self.vocab, self.cfg.max_tokens)?;
        let words = scene::words(prompt);
        Ok(Conditioning {
            salient: words
                .iter()
                .map(|w| scene::is_salient(w) && !self.function_words.contains(w))
                .collect(),
            words,
            context: self.encode_ids(&ids)?,
        })
    }

    fn step_cond(&self, context: &Tensor, t: f32) -> Result<Tensor, ModelError> {
        Ok(self.step_conds(context, &[t])?.flatten_all()?)
    }

    fn step_conds(&self, context: &Tensor, ts: &[f32]) -> Result<Tensor, ModelError> {
        if context.elem_count() != self.dims.context_len {
            return Err(ModelError::Input(format!(
                "context of {} values, the model takes {}",
                context.elem_count(),
                self.dims.context_len
            )));
        }
        if ts.is_empty() || ts.iter().any(|t| !t.is_finite()) {
            return Err(ModelError::Input(
                "step times must be finite and at least one".into(),
            ));
        }
        // Sinusoidal embedding of each time, then the conditioning MLP and every block's
        // modulation, batched over the times (rows are computed independently).
        let half = 128;
        let mut emb = vec![0.0f32; ts.len() * 2 * half];
        for (row, &t) in emb.chunks_exact_mut(2 * half).zip(ts) {
            for i in 0..half {
                let f = (-(10000f32).ln() * i as f32 / half as f32).exp();
                let a = 1000.0 * t * f;
                row[i] = a.cos();
                row[half + i] = a.sin();
            }
        }
        let emb = Tensor::from_vec(emb, (ts.len(), 2 * half), &self.device)?;
        let c = self.t1.forward(&emb)?.silu()?;
        let pooled = context.narrow(0, 0, self.cfg.d)?.unsqueeze(0)?;
        let c = self.t2.forward(&c)?.broadcast_add(&pooled)?.silu()?;
        let mut parts = Vec::with_capacity(self.blocks.len() + 1);
        for b in &self.blocks {
            parts.push(b.ada.forward(&c)?);
        }
        parts.push(self.final_ada.forward(&c)?);
        Ok(Tensor::cat(&parts, 1)?)
    }

    fn full_forward(
        &self,
        x: &Tensor,
        step: StepInput<'_>,
        saliency: bool,
    ) -> Result<FullOutput, ModelError> {
        self.check_step(step)?;
        let tokens = self.cfg.tokens();
        self.check_rows(x, tokens, "x")?;
        let all: Vec<u32> = (0..tokens as u32).collect();
        let r = self.forward_rows(x, &all, step, Keys::Own, None, saliency)?;
        Ok(FullOutput {
            velocity: r.velocity,
            k: r.k,
            v: r.v,
            saliency: r.cross,
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
        self.check_step(step)?;
        let tokens = self.cfg.tokens();
        if active.is_empty()
            || !active.windows(2).all(|w| w[0] < w[1])
            || active.last().is_some_and(|&t| t as usize >= tokens)
        {
            return Err(ModelError::Input(format!(
                "active ids must be ascending, non-empty and below {tokens}"
            )));
        }
        self.check_rows(x_active, active.len(), "x_active")?;
        if patches.of_token.len() != tokens
            || patches
                .of_token
                .iter()
                .any(|&p| p as usize >= patches.patches)
        {
            return Err(ModelError::Input(format!(
                "patch map must give {tokens} patches below {}",
                patches.patches
            )));
        }
        let keys = match cache {
            None => Keys::Own,
            Some(c) => {
                let want = [self.cfg.depth, tokens, self.cfg.d];
                if c.k.dims() != want || c.v.dims() != want {
                    return Err(ModelError::Input(format!(
                        "K/V cache is {:?} and {:?}, expected {want:?}",
                        c.k.dims(),
                        c.v.dims()
                    )));
                }
                Keys::Cached(c)
            }
        };
        let r = self.forward_rows(x_active, active, step, keys, Some(patches), false)?;
        Ok(SubsetOutput {
            velocity: r.velocity,
            k: r.k,
            v: r.v,
            patch_mass: r
                .mass
                .ok_or_else(|| ModelError::Input("no patch mass".into()))?,
        })
    }

    fn first_block_input(&self, x: &Tensor, step: StepInput<'_>) -> Result<Tensor, ModelError> {
        self.check_step(step)?;
        self.check_rows(x, self.cfg.tokens(), "x")?;
        let d = self.cfg.d;
        let h = (self.x_embed.forward(x)? + &self.pos)?;
        Ok(ops::norm_modulate(
            &h,
            &step.cond.narrow(0, 0, d)?,
            &step.cond.narrow(0, d, d)?,
            EPS,
        )?)
    }

    fn depth(&self) -> usize {
        self.cfg.depth
    }

    fn front(&self, x: &Tensor, step: StepInput<'_>, blocks: usize) -> Result<Tensor, ModelError> {
        self.check_step(step)?;
        let tokens = self.cfg.tokens();
        self.check_rows(x, tokens, "x")?;
        if blocks > self.cfg.depth {
            return Err(ModelError::Input(format!(
                "the first {blocks} blocks of a model of {}",
                self.cfg.depth
            )));
        }
        let all: Vec<u32> = (0..tokens as u32).collect();
        let h = self.embed(x, &all)?;
        let mut got = Default::default();
        self.run_blocks(h, 0..blocks, &all, step, Attending::PLAIN, &mut got)
    }

    fn rest(&self, h: &Tensor, step: StepInput<'_>, from: usize) -> Result<Tensor, ModelError> {
        self.check_step(step)?;
        self.check_hidden(h)?;
        if from > self.cfg.depth {
            return Err(ModelError::Input(format!(
                "blocks from {from} of a model of {}",
                self.cfg.depth
            )));
        }
        let all: Vec<u32> = (0..self.cfg.tokens() as u32).collect();
        let mut got = Default::default();
        let blocks = from..self.cfg.depth;
        self.run_blocks(h.clone(), blocks, &all, step, Attending::PLAIN, &mut got)
    }

    fn output(&self, h: &Tensor, step: StepInput<'_>) -> Result<Tensor, ModelError> {
        self.check_step(step)?;
        self.check_hidden(h)?;
        self.output_layer(h, step)
    }

    fn kind(&self) -> Kind {
        self.cfg.kind
    }

    /// The weights' schedule: uniform, or shifted by their `sample_shift` (TinyAudio: 0.5,
    /// so its events are decided inside the warm-up; `models/tinyaudio/README.md`).
    fn time(&self, n: u32, steps: u32) -> f32 {
        if self.sample_shift == 1.0 {
            1.0 - n.min(steps) as f32 * (1.0 / steps.max(1) as f32)
        } else {
            Schedule::Shift(self.sample_shift).time(n, steps, 0)
        }
    }

    /// TinyAudio places its events later in sampling than the image and video models lay
    /// theirs out: measured (`flashdiff bench --model tinyaudio`, 64 held-out prompts from
    /// seed 20000), warm-up 5 left 12 of 64 prompts under 30 dB SNR against full
    /// computation, 10 steps with at most 2 skips in a row 6, 12 steps 2, at 60% of the
    /// gated patch-steps skipped either way (uniform steps; with the shipped shift of 0.5
    /// warm-ups of 5 and 8 fail again, 12 does not).
    fn default_warmup(&self) -> u32 {
        if self.cfg.kind == Kind::Audio {
            TINYAUDIO_WARMUP
        } else {
            5
        }
    }

    fn decode(&self, latent: &[f32]) -> Result<Sample, ModelError> {
        let (grid, patch) = (self.cfg.grid(), self.cfg.patch);
        if latent.len() != self.cfg.tokens() * self.cfg.patch_dim() {
            return Err(ModelError::Input(format!(
                "latent of {} values, expected {}",
                latent.len(),
                self.cfg.tokens() * self.cfg.patch_dim()
            )));
        }
        if let Some(a) = &self.audio {
            return Ok(Sample::audio(synthesize(latent, a), a.rate));
        }
        let frame = latent.len() / self.cfg.frames;
        Ok(Sample::frames(
            latent
                .chunks_exact(frame)
                .flat_map(|f| unpatchify(f, grid, patch))
                .collect(),
            grid * patch,
            grid * patch,
            self.cfg.frames,
        ))
    }
}
