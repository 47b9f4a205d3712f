//! Stable Audio Open 1.0 from a diffusers folder:
//!
//! ```text
//! DIR/transformer/        StableAudioDiTModel (config.json, diffusion_pytorch_model.safetensors)
//! DIR/text_encoder/       T5-base encoder (config.json, model.safetensors)
//! DIR/tokenizer/          its tokenizer (tokenizer.json)
//! DIR/projection_model/   StableAudioProjectionModel: the seconds' number embedders
//! DIR/vae/                AutoencoderOobleck (config.json, diffusion_pytorch_model.safetensors)
//! DIR/scheduler/          scheduler_config.json (sigma_min, sigma_max; optional)
//! ```
//!
//! Or stable-audio-tools' release as it is published: `DIR/model.safetensors` (the DiT
//! under `model.model.*`, the seconds' embedders under `conditioner.conditioners.*`, the
//! VAE under `pretransform.model.*`) with `DIR/model_config.json`, plus T5-base in
//! `DIR/text_encoder/` and `DIR/tokenizer/` (the release names it, `t5-base`, and does not
//! include it). The single file wins where both are present.
//!
//! As diffusers' `StableAudioPipeline` runs it: T5's states with the padding masked, then
//! the start and end seconds' embeddings as two more rows of the cross-attention input and,
//! side by side, as the global vector; classifier-free guidance (7.0) against all-zero text
//! rows; the whole window of `sample_size` latent frames is generated and the asked
//! duration cut from the decoded audio. Sampling is the engine's Euler on the cosine
//! schedule's times (diffusers' default sampler is a second-order DPM-Solver SDE).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::decoders::oobleck::Oobleck;
use crate::encoders::text::T5Text;
use crate::families::joint::denoiser::{EncodedPrompt, PromptEncoder, Schedule};
use crate::families::joint::{lin, Lin};
use crate::families::sao::SaoCheckpoint;
use crate::families::sao::SaoDenoiser;
use crate::io::folder::config;
use crate::io::shards::{f32_builder, getter, Shards, Source};
use crate::ModelError;

/// Marks the two seconds rows among the text pieces (not words).
pub const SECONDS_PIECE: &str = "<|seconds|>";

/// T5 tokens per prompt (the released tokenizer's `model_max_length`).
pub const T5_TOKENS: usize = 128;

/// What we read of `projection_model/config.json`.
#[derive(Debug, serde::Deserialize)]
struct ProjectionJson {
    text_encoder_dim: usize,
    conditioning_dim: usize,
    min_value: f32,
    max_value: f32,
}

/// A number's embedding: `[n, sin(2 pi n w), cos(2 pi n w)]` of the value normalised to
/// [0, 1], through a linear layer.
#[derive(Debug)]
struct NumberEmbedder {
    freqs: Tensor,
    proj: Lin,
    min: f32,
    max: f32,
}

impl NumberEmbedder {
    fn embed(&self, v: f32) -> Result<Tensor, ModelError> {
        let n = (v.clamp(self.min, self.max) - self.min) / (self.max - self.min);
        let f = (&self.freqs * (n as f64 * 2.0 * std::f64::consts::PI))?.unsqueeze(0)?;
        let one = Tensor::full(n, (1, 1), self.freqs.device())?;
        let x = Tensor::cat(&[one, f.sin()?, f.cos()?], 1)?;
        Ok(self.proj.forward(&x)?)
    }
}

/// Stable Audio Open's conditioning: T5 states and the seconds' embeddings.
#[derive(Debug)]
pub struct SaoText {
    t5: T5Text,
    text_proj: Option<Lin>,
    start: NumberEmbedder,
    end: NumberEmbedder,
    width: usize,
    /// The start and end seconds every prompt is conditioned on.
    seconds: (f32, f32),
}

impl SaoText {
    /// The text encoder and the projection model of a diffusers Stable Audio folder (or, with
    /// `DIR/model.safetensors`, the release's seconds embedders), every prompt conditioned on
    /// the audio running from 0 to `seconds`.
    pub fn load(dir: &Path, seconds: f32, dtype: DType, dev: &Device) -> Result<Self, ModelError> {
        let t5 = T5Text::load(
            &dir.join("text_encoder"),
            &dir.join("tokenizer"),
            T5_TOKENS,
            dtype,
            dev,
        )?;
        if let Some(release) = Release::find(dir)? {
            return Self::from_release(t5, &release, seconds, dev);
        }
        let pdir = dir.join("projection_model");
        let pj: ProjectionJson = config(&pdir)?;
        let increasing = pj.max_value > pj.min_value;
        if !increasing || pj.text_encoder_dim != t5.width() {
            return Err(ModelError::Input(format!(
                "{}: seconds range {}..{} must be increasing and text_encoder_dim {} equal \
                 T5's width {}",
                pdir.join("config.json").display(),
                pj.min_value,
                pj.max_value,
                pj.text_encoder_dim,
                t5.width()
            )));
        }
        let files = Arc::new(Shards::open(&pdir)?);
        let vb = f32_builder(files.clone(), dev);
        let get = getter(&vb);
        let number = |p: &str| -> Result<NumberEmbedder, ModelError> {
            let e = format!("{p}.time_positional_embedding");
            let half = files.need(
                &Source::One(format!("{e}.0.weights")),
                p,
                1,
                "projection model",
            )?[0];
            Ok(NumberEmbedder {
                freqs: get(&format!("{e}.0.weights"), &[half])?,
                proj: lin(
                    &get,
                    &format!("{e}.1"),
                    2 * half + 1,
                    pj.conditioning_dim,
                    true,
                )?,
                min: pj.min_value,
                max: pj.max_value,
            })
        };
        let text_proj = if pj.conditioning_dim == pj.text_encoder_dim {
            None
        } else {
            Some(lin(
                &get,
                "text_projection",
                pj.text_encoder_dim,
                pj.conditioning_dim,
                true,
            )?)
        };
        Ok(Self {
            start: number("start_number_conditioner")?,
            end: number("end_number_conditioner")?,
            text_proj,
            width: pj.conditioning_dim,
            t5,
            seconds: (0.0, seconds),
        })
    }

    /// The seconds embedders of the release's single file (`conditioner.conditioners.
    /// seconds_start` / `seconds_total`), no text projection (the release feeds T5-base's
    /// 768-wide states as they are).
    fn from_release(
        t5: T5Text,
        r: &Release,
        seconds: f32,
        dev: &Device,
    ) -> Result<Self, ModelError> {
        let files = Arc::new(Shards::open(&r.file)?);
        let vb = f32_builder(files.clone(), dev);
        let get = getter(&vb);
        let number = |id: &str| -> Result<NumberEmbedder, ModelError> {
            let e = format!("conditioner.conditioners.{id}.embedder.embedding");
            let what = "Stable Audio release";
            let half = files.need(&Source::One(format!("{e}.0.weights")), id, 1, what)?[0];
            let width = files.need(&Source::One(format!("{e}.1.weight")), id, 2, what)?[0];
            Ok(NumberEmbedder {
                freqs: get(&format!("{e}.0.weights"), &[half])?,
                proj: lin(&get, &format!("{e}.1"), 2 * half + 1, width, true)?,
                min: r.seconds_range.0,
                max: r.seconds_range.1,
            })
        };
        let (start, end) = (number("seconds_start")?, number("seconds_total")?);
        let width = start.proj.w.dim(0)?;
        if width != t5.width() {
            return Err(ModelError::Input(format!(
                "{}: the seconds embed {width} wide, T5's states are {} (the release has no \
                 text projection)",
                r.file.display(),
                t5.width()
            )));
        }
        Ok(Self {
            t5,
            text_proj: None,
            start,
            end,
            width,
            seconds: (0.0, seconds),
        })
    }

    /// Widths of the cross-attention input rows and of the global vector.
    pub fn widths(&self) -> (usize, usize) {
        (self.width, 2 * self.width)
    }

    fn seconds_rows(&self) -> Result<(Tensor, Tensor), ModelError> {
        Ok((
            self.start.embed(self.seconds.0)?,
            self.end.embed(self.seconds.1)?,
        ))
    }
}

impl PromptEncoder for SaoText {
    fn encode(&self, prompt: &str) -> Result<EncodedPrompt, ModelError> {
        let (mut pieces, states) = self.t5.encode_masked(prompt)?;
        let states = match &self.text_proj {
            Some(p) => p.forward(&states)?,
            None => states,
        };
        let (s, e) = self.seconds_rows()?;
        pieces.extend([SECONDS_PIECE.to_string(), SECONDS_PIECE.to_string()]);
        Ok(EncodedPrompt {
            pieces,
            states: Tensor::cat(&[&states, &s, &e], 0)?,
            pooled: Tensor::cat(&[s, e], 1)?.squeeze(0)?,
        })
    }

    fn tokens(&self) -> usize {
        self.t5.tokens() + 2
    }

    /// The pipeline's unconditional input: every cross-attention row zero (the seconds'
    /// too), the global vector the same as the prompt's.
    fn unconditional(&self) -> Result<Option<EncodedPrompt>, ModelError> {
        let (s, e) = self.seconds_rows()?;
        let n = self.tokens();
        Ok(Some(EncodedPrompt {
            pieces: vec![SECONDS_PIECE.to_string(); n],
            states: Tensor::zeros((n, self.width), DType::F32, s.device())?,
            pooled: Tensor::cat(&[s, e], 1)?.squeeze(0)?,
        }))
    }
}

/// What we read of `transformer/config.json` (`StableAudioDiTModel`); the other sizes come
/// from the tensors' shapes.
#[derive(Debug, serde::Deserialize)]
struct DitJson {
    sample_size: usize,
    attention_head_dim: usize,
}

/// stable-audio-tools' release in a folder: `model.safetensors` and what
/// `model_config.json` says (the released model's values where it is absent).
#[derive(Debug)]
struct Release {
    file: std::path::PathBuf,
    head_dim: usize,
    /// Latent frames a window (sample_size / the VAE's downsampling ratio: 1,024).
    latent_frames: usize,
    /// The seconds embedders' range (0..512).
    seconds_range: (f32, f32),
}

impl Release {
    /// The release in `dir`, if `dir/model.safetensors` is there.
    fn find(dir: &Path) -> Result<Option<Self>, ModelError> {
        let file = dir.join("model.safetensors");
        if !file.is_file() {
            return Ok(None);
        }
        let p = dir.join("model_config.json");
        let v: serde_json::Value = if p.is_file() {
            let t = std::fs::read_to_string(&p)
                .map_err(|e| ModelError::Input(format!("{}: {e}", p.display())))?;
            serde_json::from_str(&t)
                .map_err(|e| ModelError::Input(format!("{}: {e}", p.display())))?
        } else {
            serde_json::Value::Null
        };
        let num = |x: &serde_json::Value| x.as_f64();
        let dit = &v["model"]["diffusion"]["config"];
        let head_dim = match (num(&dit["embed_dim"]), num(&dit["num_heads"])) {
            (Some(w), Some(h)) if h >= 1.0 => (w / h) as usize,
            _ => crate::families::sao::SAO_HEAD_DIM,
        };
        let ratio = num(&v["model"]["pretransform"]["config"]["downsampling_ratio"]);
        let latent_frames = match (num(&v["sample_size"]), ratio) {
            (Some(s), Some(r)) if r >= 1.0 => (s / r) as usize,
            _ => 1024,
        };
        let seconds = v["model"]["conditioning"]["configs"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["id"] == "seconds_start"))
            .map(|c| &c["config"]);
        let seconds_range = match seconds.map(|c| (num(&c["min_val"]), num(&c["max_val"]))) {
            Some((Some(a), Some(b))) => (a as f32, b as f32),
            _ => (0.0, 512.0),
        };
        if latent_frames == 0 || seconds_range.1 <= seconds_range.0 {
            return Err(ModelError::Input(format!(
                "{}: a window of {latent_frames} latent frames and seconds {:?}",
                p.display(),
                seconds_range
            )));
        }
        Ok(Some(Self {
            file,
            head_dim,
            latent_frames,
            seconds_range,
        }))
    }
}

/// What we read of `scheduler/scheduler_config.json`.
#[derive(Debug, serde::Deserialize)]
struct SchedulerJson {
    #[serde(default = "sigma_min")]
    sigma_min: f32,
    #[serde(default = "sigma_max")]
    sigma_max: f32,
    #[serde(default = "one")]
    sigma_data: f32,
}

fn sigma_min() -> f32 {
    0.3
}

fn sigma_max() -> f32 {
    500.0
}

fn one() -> f32 {
    1.0
}

/// Stable Audio Open from the folder `dir` as a [`SaoDenoiser`] making `seconds` of audio
/// (at most the model's window; `None`: the whole window), guided at `guidance`.
pub fn load(
    dir: &Path,
    seconds: Option<f32>,
    guidance: f32,
    dtype: DType,
    dev: &Device,
) -> Result<SaoDenoiser, ModelError> {
    let (ck, head_dim, frames) = match Release::find(dir)? {
        Some(r) => (SaoCheckpoint::open(&r.file)?, r.head_dim, r.latent_frames),
        None => {
            let tdir = dir.join("transformer");
            let j: DitJson = config(&tdir)?;
            (
                SaoCheckpoint::open(&tdir)?,
                j.attention_head_dim,
                j.sample_size,
            )
        }
    };
    let cfg = ck.config(head_dim)?;
    if frames == 0 || cfg.in_channels != cfg.out_channels {
        return Err(ModelError::Input(format!(
            "{}: a window of {frames} latent frames and {} -> {} channels; Stable Audio \
             needs a window and as many channels out as in",
            dir.display(),
            cfg.in_channels,
            cfg.out_channels
        )));
    }
    let dit = ck.load(head_dim, dtype, dev)?;
    let vae = Oobleck::open(dir, dev)?;
    let v = vae.config();
    if v.decoder_input_channels != cfg.in_channels {
        return Err(ModelError::Input(format!(
            "{}: the VAE reads {} latent channels; the transformer makes {}",
            dir.display(),
            v.decoder_input_channels,
            cfg.in_channels
        )));
    }
    let window = (frames * v.hop()) as f64 / v.sampling_rate as f64;
    let seconds = seconds.map_or(window, f64::from);
    let fits = seconds > 0.0 && seconds <= window + 1e-6;
    if !fits {
        return Err(ModelError::Input(format!(
            "{seconds} s of audio: this model makes at most {window:.2} s ({} latent frames of \
             {} samples at {} Hz)",
            frames,
            v.hop(),
            v.sampling_rate
        )));
    }
    let text = SaoText::load(dir, seconds as f32, dtype, dev)?;
    if text.widths() != (cfg.cross_in, cfg.global_in) {
        return Err(ModelError::Input(format!(
            "{}: the conditioning gives widths {:?} (text rows, global vector); the \
             transformer reads {:?}",
            dir.display(),
            text.widths(),
            (cfg.cross_in, cfg.global_in)
        )));
    }
    let sched = dir.join("scheduler");
    let s: SchedulerJson = crate::io::folder::scheduler_config(dir)?;
    let sigmas = s.sigma_min > 0.0 && s.sigma_max > s.sigma_min;
    if s.sigma_data != 1.0 || !sigmas {
        return Err(ModelError::Input(format!(
            "{}: sigma_data {} (only 1.0 maps onto the cosine schedule) and sigmas {}..{}",
            sched.display(),
            s.sigma_data,
            s.sigma_min,
            s.sigma_max
        )));
    }
    let samples = (seconds * v.sampling_rate as f64).round() as usize;
    let m = SaoDenoiser::new_video(dit, Box::new(text), (1, 1, frames), 0.0, dev.clone())?
        .with_schedule(Schedule::Cosine {
            min: s.sigma_min,
            max: s.sigma_max,
        })
        .with_audio(vae, samples);
    // As diffusers: guidance only above 1 (at 1 it would give the prompt's pass alone).
    if guidance > 1.0 {
        m.with_cfg(guidance)
    } else {
        Ok(m)
    }
}
