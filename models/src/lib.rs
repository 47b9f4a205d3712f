//! FlashDiff's models: the [`Denoiser`] contract the engine sees every model through, and the
//! models that implement it, on candle tensors (CPU by default, CUDA with the `cuda` feature).
//!
//! A denoiser predicts the flow-matching velocity of a latent: a grid of
//! `frames x height x width` tokens ([`LatentGrid`]) of [`Dims::channels`] values each. Besides
//! the ordinary full forward it runs a *token-subset forward*: only the active tokens compute
//! queries, MLPs and projections, and attention reads the keys and values of every other token
//! from a cache. That is what lets FlashDiff skip patches.
//!
//! ```
//! use flashdiff_models::families::tinydit::TinyDit;
//! use flashdiff_models::Denoiser;
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tinydit/tinydit.safetensors");
//! let model = TinyDit::load(std::path::Path::new(path), &candle_core::Device::Cpu)?;
//! let c = model.condition("a red circle left on a white background")?;
//! assert_eq!(c.words.len(), 8);
//! assert_eq!(model.dims().grid.tokens(), 64);
//! # Ok::<(), flashdiff_models::ModelError>(())
//! ```

use std::fmt;

pub use candle_core::{DType, Device, Tensor};

use families::tinydit::scene;
use io::weights::WeightsError;

pub mod decoders;
pub mod encoders;
pub mod families;
pub mod io;
pub mod pipelines;

/// The latent grid in tokens: an image has one frame, audio one frame of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatentGrid {
    /// Frames (1 for images and audio).
    pub frames: usize,
    /// Rows of tokens per frame.
    pub height: usize,
    /// Tokens per row.
    pub width: usize,
}

impl LatentGrid {
    /// Latent tokens.
    pub fn tokens(&self) -> usize {
        self.frames * self.height * self.width
    }
}

/// Sizes of everything the engine keeps for one request of a model (all f32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dims {
    /// The latent grid.
    pub grid: LatentGrid,
    /// Values per latent token.
    pub channels: usize,
    /// Layers with self-attention K/V to cache.
    pub kv_layers: usize,
    /// Width of one token's key (and value) row at one layer.
    pub kv_dim: usize,
    /// Columns of the saliency map: the most words a prompt may have.
    pub words: usize,
    /// Values of a request's conditioning ([`Conditioning::context`]).
    pub context_len: usize,
    /// Values of one step's conditioning ([`Denoiser::step_cond`]).
    pub cond_len: usize,
}

/// A model's FLOPs (2 per multiply-add of its matrix products, and 4 x width per query and
/// key of its attention, as PyTorch's `FlopCounterMode` counts them), split as the engine
/// runs them: what a step costs is `tokens x per_token + per_step` for the image tokens it
/// computes, plus `every_step` whether it computes or not, plus the signal where a method
/// reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flops {
    /// One image token computed in a step: its row through every layer, and its query
    /// against every key (the keys of the tokens not computed come from the cache).
    pub per_token: f64,
    /// A step that computes anything, whatever its tokens: the fixed rows (a joint model's
    /// text stream, through every block, and its queries against every key).
    pub per_step: f64,
    /// Every step, computed or not: the step's conditioning (time embedding, modulation),
    /// which the engine prepares for every step of a request.
    pub every_step: f64,
    /// One token of block 0's modulated input ([`Denoiser::first_block_input`]): the
    /// signal the whole-step rules read each step.
    pub signal_per_token: f64,
    /// `false` when these count rows, not FLOPs (a model whose layers are not counted).
    pub counted: bool,
}

impl Flops {
    /// A step computing `tokens` image tokens (without the signal).
    pub fn step(&self, tokens: usize) -> f64 {
        tokens as f64 * self.per_token + self.per_step + self.every_step
    }
}

/// A prompt, prepared once per request.
#[derive(Debug, Clone)]
pub struct Conditioning {
    /// The prompt's words, in order: column `i` of the saliency map is word `i` (a model
    /// with subword tokens reassembles them into words).
    pub words: Vec<String>,
    /// Whether each word is salient (content, not a function word): the words the
    /// saliency map is made of.
    pub salient: Vec<bool>,
    /// Everything the forwards need from the prompt (encoded text, pooled embedding,
    /// cross-attention keys and values), flat, [`Dims::context_len`] values. The engine
    /// keeps it in the request's shared state and hands it back as a 1-D tensor.
    pub context: Vec<f32>,
}

/// Per-step inputs shared by every token of a step: the request's context and the step's
/// conditioning, both 1-D f32 tensors on the model's device.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// [`Conditioning::context`].
    pub context: &'a Tensor,
    /// [`Denoiser::step_cond`] of the step's time.
    pub cond: &'a Tensor,
}

/// Self-attention keys and values of every latent token at every layer, `kv_layers x tokens
/// x kv_dim` each (f32). "Cached": as last computed (or extrapolated) by the engine, for the
/// tokens a subset forward does not compute.
#[derive(Debug, Clone, Copy)]
pub struct KvCache<'a> {
    /// Keys.
    pub k: &'a Tensor,
    /// Values.
    pub v: &'a Tensor,
}

/// Patch of every latent token (`tokens` values below `patches`), for the per-patch
/// self-attention statistics.
#[derive(Debug, Clone, Copy)]
pub struct Patches<'a> {
    /// Patch of each token.
    pub of_token: &'a [u32],
    /// Patch count.
    pub patches: usize,
}

/// Output of [`Denoiser::full_forward`].
#[derive(Debug)]
pub struct FullOutput {
    /// Velocity of every token, `tokens x channels`.
    pub velocity: Tensor,
    /// Fresh keys, `kv_layers x tokens x kv_dim`.
    pub k: Tensor,
    /// Fresh values, same shape.
    pub v: Tensor,
    /// When asked for: cross-attention of every token to each word column, averaged over
    /// heads and the model's saliency layers, `tokens x words`.
    pub saliency: Option<Tensor>,
}

/// Output of [`Denoiser::subset_forward`], rows in the order of the active ids.
#[derive(Debug)]
pub struct SubsetOutput {
    /// Velocity of the active tokens, `n x channels`.
    pub velocity: Tensor,
    /// Fresh keys of the active tokens, `kv_layers x n x kv_dim`.
    pub k: Tensor,
    /// Fresh values, same shape.
    pub v: Tensor,
    /// Each active token's self-attention probability mass into each patch, averaged over
    /// heads and layers, `n x patches`: what the gate's refinement importance is made of.
    pub patch_mass: Tensor,
}

/// What a model generates (for the built-in models, the weights' `kind` metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An image (TinyDiT).
    Image,
    /// Frames of images, frame-major: a 3-D grid (TinyVideo).
    Video,
    /// A sound: a 1-D grid over time (TinyAudio).
    Audio,
}

impl Kind {
    /// The metadata spelling.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Image => "image",
            Kind::Video => "video",
            Kind::Audio => "audio",
        }
    }
}

/// A decoded sample: an image, a video (frames of images) or a sound.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    /// RGB in [0, 1], row-major, `frames x height x width x 3` (empty for a sound).
    pub rgb: Vec<f32>,
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Frames: 1 for an image, 0 for a sound.
    pub frames: usize,
    /// Samples in [-1, 1], channels interleaved (empty unless a sound).
    pub audio: Vec<f32>,
    /// Samples per second of `audio` (0 unless a sound).
    pub sample_rate: u32,
    /// Interleaved channels of `audio`: 1 (mono, the built-in model) or more (Stable Audio
    /// Open: 2); 0 reads as 1.
    pub audio_channels: usize,
}

impl Sample {
    /// An image or a video: `frames x height x width x 3` RGB values.
    pub fn frames(rgb: Vec<f32>, width: usize, height: usize, frames: usize) -> Self {
        Self {
            rgb,
            width,
            height,
            frames,
            ..Self::default()
        }
    }

    /// A mono sound.
    pub fn audio(audio: Vec<f32>, sample_rate: u32) -> Self {
        Self::audio_channels(audio, sample_rate, 1)
    }

    /// A sound of `channels` interleaved channels.
    pub fn audio_channels(audio: Vec<f32>, sample_rate: u32, channels: usize) -> Self {
        Self {
            audio,
            sample_rate,
            audio_channels: channels,
            ..Self::default()
        }
    }

    /// Frame `i` of an image or video (`height x width x 3`).
    pub fn frame(&self, i: usize) -> &[f32] {
        let n = self.width * self.height * 3;
        &self.rgb[i * n..(i + 1) * n]
    }
}

/// The contract between the engine and a model. Every tensor is f32 on [`Denoiser::device`];
/// the model may compute in another dtype inside. Implementations are read-only after
/// loading and are shared by every worker thread.
pub trait Denoiser: Send + Sync + fmt::Debug {
    /// Short name for reports ("tinydit").
    fn name(&self) -> &str;
    /// What [`Denoiser::decode`] makes: an image (the default), a video or a sound.
    fn kind(&self) -> Kind {
        Kind::Image
    }
    /// Sizes of the latent and of what the engine stores per request.
    fn dims(&self) -> &Dims;
    /// Where the model's tensors live.
    fn device(&self) -> &Device;
    /// Prepares a prompt, once per request. A prompt the model cannot take is an error that
    /// says why.
    fn condition(&self, prompt: &str) -> Result<Conditioning, ModelError>;
    /// The time of step `n` of `steps` (1 = noise at `n = 0`, 0 = data at `n = steps`,
    /// decreasing): step `n` is taken at `time(n)` and moves the latent by
    /// `(time(n) - time(n + 1)) x velocity`. The default is uniform, `1 - n / steps`; FLUX.1
    /// dev and SD3 shift it as their released schedulers do.
    fn time(&self, n: u32, steps: u32) -> f32 {
        1.0 - n.min(steps) as f32 * (1.0 / steps.max(1) as f32)
    }
    /// The conditioning of time `t` (1 = noise, 0 = data), shared by every token of a step;
    /// `context` is [`Conditioning::context`] as a tensor. Returns [`Dims::cond_len`] values.
    fn step_cond(&self, context: &Tensor, t: f32) -> Result<Tensor, ModelError>;
    /// [`Denoiser::step_cond`] of every time in `ts` at once, `ts.len() x cond_len`; row i
    /// equals `step_cond(context, ts[i])` exactly. The engine asks once per request, so a
    /// model whose conditioning network is weight-bound reads its weights once, not per
    /// step. The default stacks single calls.
    fn step_conds(&self, context: &Tensor, ts: &[f32]) -> Result<Tensor, ModelError> {
        let rows = ts
            .iter()
            .map(|&t| self.step_cond(context, t))
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            return Err(ModelError::Input("no times to condition on".into()));
        }
        Ok(Tensor::stack(&rows, 0)?)
    }
    /// The ordinary forward of the whole latent `x` (`tokens x channels`): velocity, every
    /// layer's K/V, and with `saliency` the cross-attention map the partitioner needs.
    fn full_forward(
        &self,
        x: &Tensor,
        step: StepInput<'_>,
        saliency: bool,
    ) -> Result<FullOutput, ModelError>;
    /// The token-subset forward: tokens `active` (ascending ids, at least one) whose noisy
    /// values are `x_active` (`n x channels`). Their own K/V are fresh (computed here and
    /// seen by each other); every other token's K/V come from `cache`. With `cache` `None`
    /// the active tokens attend only to each other, as if the rest of the latent did not
    /// exist (the NaivePatch baseline). With every token active and a cache, the result
    /// equals [`Denoiser::full_forward`]'s.
    fn subset_forward(
        &self,
        x_active: &Tensor,
        active: &[u32],
        step: StepInput<'_>,
        cache: Option<KvCache<'_>>,
        patches: Patches<'_>,
    ) -> Result<SubsetOutput, ModelError>;
    /// Rows every forward computes besides the latent tokens it is asked for, in units of a
    /// latent token's work: the text stream of a joint-attention model (FLUX, SD3), which
    /// costs a latent row's work per text token in every block, and Stable Audio's global
    /// token. Work accounting counts them once for each step that computes anything. The
    /// default: none (the built-in models' text is encoded once per request).
    fn fixed_rows(&self) -> usize {
        0
    }
    /// The model's FLOPs as the engine's work accounting counts them ([`Flops`]). The
    /// default counts rows instead (a token 1, a step's fixed rows [`Denoiser::fixed_rows`]),
    /// for a model whose layers are not counted.
    fn flops(&self) -> Flops {
        Flops {
            per_token: 1.0,
            per_step: self.fixed_rows() as f64,
            every_step: 0.0,
            signal_per_token: 0.0,
            counted: false,
        }
    }
    /// The first layer's modulated input for the whole latent: the cheap signal whole-step
    /// caching (TeaCache / first-block cache) watches, `tokens x width`.
    fn first_block_input(&self, x: &Tensor, step: StepInput<'_>) -> Result<Tensor, ModelError>;
    /// Blocks of the transformer stack that [`Denoiser::front`] and [`Denoiser::rest`] run
    /// apart (DBCache's split forward); 0, the default: the model runs its forward whole only.
    fn depth(&self) -> usize {
        0
    }
    /// The whole latent `x` (`tokens x channels`) through the embedding and the first
    /// `blocks` blocks alone: hidden rows, `tokens x width` (`blocks` 0: the embedded tokens).
    fn front(
        &self,
        _x: &Tensor,
        _step: StepInput<'_>,
        _blocks: usize,
    ) -> Result<Tensor, ModelError> {
        Err(unsplit(self.name()))
    }
    /// Hidden rows after the first `from` blocks ([`Denoiser::front`]) through the remaining
    /// blocks: the hidden rows after the last block.
    fn rest(&self, _h: &Tensor, _step: StepInput<'_>, _from: usize) -> Result<Tensor, ModelError> {
        Err(unsplit(self.name()))
    }
    /// The output layer: the velocity (`tokens x channels`) of hidden rows after the last
    /// block. `output(rest(front(x, n), n))` is [`Denoiser::full_forward`]'s velocity.
    fn output(&self, _h: &Tensor, _step: StepInput<'_>) -> Result<Tensor, ModelError> {
        Err(unsplit(self.name()))
    }
    /// Decodes a final latent (`tokens x channels`, flat) into a sample.
    fn decode(&self, latent: &[f32]) -> Result<Sample, ModelError>;
    /// Warm-up steps this model needs before its layout is settled enough to partition and
    /// gate: what a request gets when it does not say. The paper's five (§4.1) unless a
    /// model's measurement says otherwise.
    fn default_warmup(&self) -> u32 {
        5
    }
    /// `(width, height)` of the images [`Denoiser::decode`] makes, where the model says (a
    /// pipeline with a VAE); `None` leaves it to the caller's knowledge of the model.
    fn image_size(&self) -> Option<(usize, usize)> {
        None
    }
}

/// The error of a split forward asked of a model that runs its forward whole only.
fn unsplit(model: &str) -> ModelError {
    ModelError::Input(format!(
        "{model} runs its blocks only all together; a method that runs the first blocks alone \
         (dbcache) needs one of the built-in models TinyDiT, TinyVideo or TinyAudio"
    ))
}

/// Why a model call failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Weights could not be loaded.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The prompt cannot be taken.
    #[error(transparent)]
    Prompt(#[from] scene::PromptError),
    /// Bad arguments (shapes, ids) from the caller.
    #[error("model input: {0}")]
    Input(String),
    /// The tensor library failed.
    #[error("tensor op failed: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// One Euler step of ordinary sampling, `n` of `steps`: the full forward of the latent `x`
/// (`tokens x channels`, flat) at [`Denoiser::time`], then `x <- x - (time(n) - time(n + 1))
/// v`. Returns the forward's output.
pub fn euler_full_step(
    model: &dyn Denoiser,
    x: &mut [f32],
    context: &Tensor,
    n: u32,
    steps: u32,
    saliency: bool,
) -> Result<FullOutput, ModelError> {
    let dims = model.dims();
    let h = model.time(n, steps) - model.time(n + 1, steps);
    let cond = model.step_cond(context, model.time(n, steps))?;
    let xt = Tensor::from_slice(x, (dims.grid.tokens(), dims.channels), model.device())?;
    let out = model.full_forward(
        &xt,
        StepInput {
            context,
            cond: &cond,
        },
        saliency,
    )?;
    let v = out.velocity.flatten_all()?.to_vec1::<f32>()?;
    for (xi, vi) in x.iter_mut().zip(&v) {
        *xi -= h * vi;
    }
    Ok(out)
}

/// Picks the device: CUDA device 0 when `cuda` is asked for and this build has it, else an
/// error that says why; the CPU otherwise.
pub fn device(cuda: bool) -> Result<Device, ModelError> {
    if !cuda {
        return Ok(Device::Cpu);
    }
    if !candle_core::utils::cuda_is_available() {
        return Err(ModelError::Input(
            "CUDA was asked for, but this build has no CUDA support (build with --features cuda)"
                .into(),
        ));
    }
    // The first line only: candle appends a backtrace when RUST_BACKTRACE is set.
    let first_line = |e: &str| format!("no usable CUDA device: {}", e.lines().next().unwrap_or(""));
    match open_cuda() {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(e)) => Err(ModelError::Input(first_line(&e.to_string()))),
        Err(why) => Err(ModelError::Input(first_line(&why))),
    }
}

/// Opens CUDA device 0. A build whose CUDA libraries are opened at run time (cudarc's
/// `dynamic-loading`, as `scripts/gpu-build.sh` builds) panics inside cudarc when a library
/// is missing; that panic is caught here and returned as its message, and the default
/// panic report is held back meanwhile so the user sees one clear error, not a crash. (A
/// panic on another thread in that instant would lose its report; devices are opened
/// before any work starts.)
fn open_cuda() -> Result<candle_core::Result<Device>, String> {
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = HOOK.lock().unwrap_or_else(|p| p.into_inner());
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(|| Device::new_cuda(0));
    std::panic::set_hook(report);
    opened.map_err(|payload| {
        let said = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        missing_library(&said).unwrap_or(said)
    })
}

/// cudarc's report of a library it could not open, said briefly: which library, and where
/// the loader looks.
fn missing_library(said: &str) -> Option<String> {
    let rest = said.strip_prefix("Unable to dynamically load the \"")?;
    let name = &rest[..rest.find('"')?];
    Some(format!(
        "the CUDA library lib{name}.so could not be opened (no NVIDIA driver or CUDA 13 \
         libraries found; the loader searches LD_LIBRARY_PATH and the system's library path)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cuda_library_is_named_briefly() {
        let said = "Unable to dynamically load the \"cublas\" shared library - searched for \
                    library names: [\"libcublas.so\"]. Ensure that `LD_LIBRARY_PATH` ...";
        let e = missing_library(said).unwrap();
        assert!(
            e.starts_with("the CUDA library libcublas.so could not be opened"),
            "{e}"
        );
        assert_eq!(missing_library("out of memory"), None);
    }

    #[test]
    fn device_is_the_cpu_or_a_clear_error() {
        assert!(device(false).unwrap().is_cpu());
        if !candle_core::utils::cuda_is_available() {
            let e = device(true).unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
    }
}

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
