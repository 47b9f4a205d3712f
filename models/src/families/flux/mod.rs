//! FLUX.1's transformer (double-stream and single-stream blocks, 3-axis RoPE, guidance
//! embedding) with FlashDiff's token-subset forward, written from Black Forest Labs' model
//! description and weight layout (`double_blocks.N.img_attn.qkv.weight`, ...).
//!
//! The patchable grid is the image tokens (2x2-packed VAE latents, `in_channels` values each).
//! Text tokens are not part of the grid: every forward computes them (they are few next to
//! the image at the sizes FLUX serves, and this keeps the subset forward exact: a subset
//! forward whose cached image K/V are current equals the full forward on its rows). Their
//! queries attend over every image token, fresh or cached, as in the full forward.
//!
//! Layout of what the engine keeps (all f32, see [`crate::Denoiser`]):
//! - context: `txt_in(T5 states)` (`text_tokens x hidden`) then `vector_in(CLIP pooled)`
//!   (`hidden`), once per request;
//! - step conditioning: every block's modulation vectors of that time and guidance,
//!   [`FluxConfig::cond_rows`] rows of `hidden`;
//! - K/V cache: one layer per block (double then single), image tokens only, keys after
//!   QK-norm and RoPE, `hidden` wide.

use candle_core::{Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use flashdiff_kernels::ops::{add_gated, gelu_tanh, gelu_tanh_inplace, norm_modulate, rms_rope};

use crate::families::joint::denoiser::{JointDenoiser, JointModel, PixelIndex};
use crate::families::joint::TensorSource;
use crate::families::joint::{
    check_rows, check_text_cache, lin, modulate, rope_table, rotation, text_context, Attention,
    Embedder, Lin, Pass,
};
pub use crate::families::joint::{JointOutput, Rows};
use crate::ModelError;

mod load;
pub use crate::families::joint::denoiser::{EncodedPrompt, PromptEncoder};
pub use load::{FluxCheckpoint, FluxLayout};

/// The architecture's sizes (Black Forest Labs' `FluxParams`).
#[derive(Debug, Clone, PartialEq)]
pub struct FluxConfig {
    /// Values per image token (16 latent channels x 2 x 2 = 64).
    pub in_channels: usize,
    /// Width of the pooled text vector (CLIP-L: 768).
    pub vec_in_dim: usize,
    /// Width of the text encoder's states (T5-XXL: 4096).
    pub context_in_dim: usize,
    /// Transformer width.
    pub hidden: usize,
    /// MLP width over `hidden`.
    pub mlp_ratio: f64,
    /// Attention heads.
    pub heads: usize,
    /// Double-stream blocks.
    pub depth: usize,
    /// Single-stream blocks.
    pub depth_single: usize,
    /// RoPE widths of the three position axes (sum = head width).
    pub axes_dim: [usize; 3],
    /// RoPE base.
    pub theta: f64,
    /// Whether the QKV projections have a bias.
    pub qkv_bias: bool,
    /// Whether the model embeds a guidance scale (FLUX.1 dev: yes; schnell: no).
    pub guidance_embed: bool,
}

impl FluxConfig {
    /// FLUX.1 \[dev\].
    pub fn dev() -> Self {
        Self {
            in_channels: 64,
            vec_in_dim: 768,
            context_in_dim: 4096,
            hidden: 3072,
            mlp_ratio: 4.0,
            heads: 24,
            depth: 19,
            depth_single: 38,
            axes_dim: [16, 56, 56],
            theta: 10_000.0,
            qkv_bias: true,
            guidance_embed: true,
        }
    }

    /// FLUX.1 \[schnell\]: dev without the guidance embedding.
    pub fn schnell() -> Self {
        Self {
            guidance_embed: false,
            ..Self::dev()
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of the MLPs.
    pub fn mlp_hidden(&self) -> usize {
        (self.hidden as f64 * self.mlp_ratio) as usize
    }

    /// Layers with K/V: every block.
    pub fn kv_layers(&self) -> usize {
        self.depth + self.depth_single
    }

    /// Rows of `hidden` in a step's conditioning: 6 + 6 per double block (image and text
    /// streams), 3 per single block, 2 for the final layer.
    pub fn cond_rows(&self) -> usize {
        12 * self.depth + 3 * self.depth_single + 2
    }

    /// Checks what the forward relies on, with the reason.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Input(format!("FLUX config: {m}")));
        if self.heads == 0 || self.hidden == 0 || self.hidden % self.heads != 0 {
            return bad(format!(
                "hidden {} is not a positive multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        let hd = self.head_dim();
        if self.axes_dim.iter().sum::<usize>() != hd || self.axes_dim.iter().any(|a| a % 2 != 0) {
            return bad(format!(
                "RoPE axes {:?} must be even and sum to the head width {hd}",
                self.axes_dim
            ));
        }
        if self.in_channels == 0 || self.vec_in_dim == 0 || self.context_in_dim == 0 {
            return bad("in_channels, vec_in_dim and context_in_dim must be positive".into());
        }
        if self.mlp_hidden() == 0 {
            return bad(format!("mlp_ratio {} gives no MLP", self.mlp_ratio));
        }
        Ok(())
    }
}

/// One stream's attention weights: QKV, per-head RMS norms of Q and K, output projection.
#[derive(Debug, Clone)]
struct Attn {
    qkv: Lin,
    q_norm: Tensor,
    k_norm: Tensor,
    proj: Lin,
}

impl Attn {
    fn load(get: &TensorSource, name: &str, cfg: &FluxConfig) -> Result<Self, ModelError> {
        let (h, hd) = (cfg.hidden, cfg.head_dim());
        Ok(Self {
            qkv: lin(get, &format!("{name}.qkv"), h, 3 * h, cfg.qkv_bias)?,
            q_norm: get(&format!("{name}.norm.query_norm.scale"), &[hd])?,
            k_norm: get(&format!("{name}.norm.key_norm.scale"), &[hd])?,
            proj: lin(get, &format!("{name}.proj"), h, h, true)?,
        })
    }
}

/// One stream of a double block.
#[derive(Debug, Clone)]
struct Stream {
    modulation: Lin,
    attn: Attn,
    mlp_in: Lin,
    mlp_out: Lin,
}

#[derive(Debug, Clone)]
struct DoubleBlock {
    img: Stream,
    txt: Stream,
}

#[derive(Debug, Clone)]
struct SingleBlock {
    modulation: Lin,
    linear1: Lin,
    linear2: Lin,
    q_norm: Tensor,
    k_norm: Tensor,
}

/// FLUX.1's transformer.
#[derive(Debug, Clone)]
pub struct Flux {
    cfg: FluxConfig,
    img_in: Lin,
    txt_in: Lin,
    time_in: Embedder,
    vector_in: Embedder,
    guidance_in: Option<Embedder>,
    double: Vec<DoubleBlock>,
    single: Vec<SingleBlock>,
    final_mod: Lin,
    final_linear: Lin,
    /// Pixels per token side and where pixel values sit in a token (see [`Flux::over_pixels`]).
    packing: (usize, PixelIndex),
    /// The report name, when not FLUX.1's own.
    name: Option<String>,
}

/// FLUX.1's packing: 2 x 2 latent pixels as (channel, dy, dx), the channel slowest.
const LATENT_2X2: (usize, PixelIndex) = (2, |k, dy, dx, p, _| (k * p + dy) * p + dx);

impl Flux {
    /// Loads the transformer from tensors named as in Black Forest Labs' checkpoints. A
    /// missing or mis-shaped tensor is the source's error (it names the key and shapes).
    pub fn load(cfg: FluxConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        cfg.validate()?;
        let (h, m) = (cfg.hidden, cfg.mlp_hidden());
        let stream = |p: &str| -> Result<Stream, ModelError> {
            Ok(Stream {
                modulation: lin(get, &format!("{p}_mod.lin"), h, 6 * h, true)?,
                attn: Attn::load(get, &format!("{p}_attn"), &cfg)?,
                mlp_in: lin(get, &format!("{p}_mlp.0"), h, m, true)?,
                mlp_out: lin(get, &format!("{p}_mlp.2"), m, h, true)?,
            })
        };
        let double = (0..cfg.depth)
            .map(|i| {
                Ok(DoubleBlock {
                    img: stream(&format!("double_blocks.{i}.img"))?,
                    txt: stream(&format!("double_blocks.{i}.txt"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let single = (0..cfg.depth_single)
            .map(|i| {
                let p = format!("single_blocks.{i}");
                let hd = cfg.head_dim();
                Ok(SingleBlock {
                    modulation: lin(get, &format!("{p}.modulation.lin"), h, 3 * h, true)?,
                    linear1: lin(get, &format!("{p}.linear1"), h, 3 * h + m, true)?,
                    linear2: lin(get, &format!("{p}.linear2"), h + m, h, true)?,
                    q_norm: get(&format!("{p}.norm.query_norm.scale"), &[hd])?,
                    k_norm: get(&format!("{p}.norm.key_norm.scale"), &[hd])?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            img_in: lin(get, "img_in", cfg.in_channels, h, true)?,
            txt_in: lin(get, "txt_in", cfg.context_in_dim, h, true)?,
            time_in: Embedder::load(get, ("time_in.in_layer", "time_in.out_layer"), 256, h)?,
            vector_in: Embedder::load(
                get,
                ("vector_in.in_layer", "vector_in.out_layer"),
                cfg.vec_in_dim,
                h,
            )?,
            guidance_in: if cfg.guidance_embed {
                Some(Embedder::load(
                    get,
                    ("guidance_in.in_layer", "guidance_in.out_layer"),
                    256,
                    h,
                )?)
            } else {
                None
            },
            double,
            single,
            final_mod: lin(get, "final_layer.adaLN_modulation.1", h, 2 * h, true)?,
            final_linear: lin(get, "final_layer.linear", h, cfg.in_channels, true)?,
            cfg,
            packing: LATENT_2X2,
            name: None,
        })
    }

    /// The same transformer working on pixels instead of VAE latents, named `name`: a token
    /// holds a `patch x patch` cell of pixels as (row, column, channel), the channel fastest
    /// (TinyFLUX's patchify). `in_channels` must be `patch^2` times the pixel channels.
    pub fn over_pixels(mut self, patch: usize, name: &str) -> Result<Self, ModelError> {
        let c = self.cfg.in_channels;
        if patch == 0 || c % (patch * patch) != 0 {
            return Err(ModelError::Input(format!(
                "a FLUX with {c} values a token cannot hold {patch} x {patch} pixel cells"
            )));
        }
        self.packing = (patch, |k, dy, dx, p, c| (dy * p + dx) * c + k);
        self.name = Some(name.to_string());
        Ok(self)
    }

    /// The architecture.
    pub fn config(&self) -> &FluxConfig {
        &self.cfg
    }

    /// The dtype its linear layers multiply in (F32 unless loaded with
    /// [`FluxCheckpoint::load_in`]).
    pub fn compute_dtype(&self) -> candle_core::DType {
        self.final_linear.w.dtype()
    }

    /// A request's context from the text encoders' outputs: `txt_in(txt)` (`text_tokens x
    /// hidden`) with `vector_in(pooled)` as one more row, `(text_tokens + 1) x hidden`.
    pub fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        text_context(
            "FLUX",
            (txt, pooled),
            (&self.txt_in, &self.vector_in),
            (self.cfg.context_in_dim, self.cfg.vec_in_dim),
        )
    }

    /// The conditioning of time `t` (1 = noise) and guidance `g` (ignored by schnell):
    /// every block's modulation vectors, [`FluxConfig::cond_rows`] x hidden.
    pub fn step_cond(&self, context: &Tensor, t: f32, g: f32) -> Result<Tensor, ModelError> {
        let dev = context.device();
        let rows = context.dim(0)?;
        // In the reference's order: time, then guidance, then the pooled text.
        let mut vec = self.time_in.forward(&timestep_embedding(t, 256, dev)?)?;
        if let Some(gi) = &self.guidance_in {
            vec = vec.add(&gi.forward(&timestep_embedding(g, 256, dev)?)?)?;
        }
        let vec = vec.add(&context.narrow(0, rows - 1, 1)?)?;
        let s = vec.silu()?;
        let h = self.cfg.hidden;
        let mut parts = Vec::with_capacity(2 * self.double.len() + self.single.len() + 1);
        for b in &self.double {
            parts.push(b.img.modulation.forward(&s)?.reshape((6, h))?);
            parts.push(b.txt.modulation.forward(&s)?.reshape((6, h))?);
        }
        for b in &self.single {
            parts.push(b.modulation.forward(&s)?.reshape((3, h))?);
        }
        parts.push(self.final_mod.forward(&s)?.reshape((2, h))?);
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// The first block's modulated image input for every token of `x` (`tokens x hidden`):
    /// what whole-step caching watches.
    pub fn first_block_input(&self, x: &Tensor, cond: &Tensor) -> Result<Tensor, ModelError> {
        let im = cond.narrow(0, 0, 6)?;
        Ok(modulate(&self.img_in.forward(x)?, &im, 0)?)
    }

    /// Forward of the image tokens in `rows` (every image token for the full forward) with
    /// the text stream, given a request's `context` and a step's `cond`.
    pub fn forward(
        &self,
        rows: Rows<'_>,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let cfg = &self.cfg;
        let n = rows.ids.len();
        let dev = rows.x.device().clone();
        check_rows(&rows, "FLUX", cfg.in_channels, cfg.kv_layers(), cfg.hidden)?;
        let nt = context.dim(0)? - 1;
        check_text_cache(&rows, nt, cfg.kv_layers(), cfg.hidden)?;
        if cond.dims() != [cfg.cond_rows(), cfg.hidden] {
            return Err(ModelError::Input(format!(
                "FLUX step conditioning must be {} x {}, got {:?}",
                cfg.cond_rows(),
                cfg.hidden,
                cond.dims()
            )));
        }
        let img_pe = rope_table(
            cfg.axes_dim,
            cfg.theta,
            rows.ids.iter().map(|&t| {
                [
                    0.0,
                    (t as usize / rows.width) as f32,
                    (t as usize % rows.width) as f32,
                ]
            }),
            &dev,
        )?;
        let txt_pe = rope_table(cfg.axes_dim, cfg.theta, (0..nt).map(|_| [0.0f32; 3]), &dev)?;
        // The same angles as one `rows x head_dim` table (cosines, then sines) for the fused
        // norm + rotation.
        let (img_rot, txt_rot) = (rotation(&img_pe)?, rotation(&txt_pe)?);
        // With a text cache the text stream is not computed: its keys and values at every
        // layer come from the cache, and only image rows make queries.
        let cached = rows.text_cache;
        let qt = if cached.is_some() { 0 } else { nt };
        let text_kv = |layer: usize| -> candle_core::Result<Option<(Tensor, Tensor)>> {
            let shape = (nt, cfg.heads, cfg.head_dim());
            cached
                .map(|(k, v)| Ok((k.i(layer)?.reshape(shape)?, v.i(layer)?.reshape(shape)?)))
                .transpose()
        };
        let mut pass = Pass::new(rows, cfg.heads, cfg.head_dim())?;
        let mut ks = Vec::with_capacity(cfg.kv_layers());
        let mut vs = Vec::with_capacity(cfg.kv_layers());
        let (mut tks, mut tvs) = (Vec::new(), Vec::new());
        let mut img = self.img_in.forward(rows.x)?;
        let mut txt = context.narrow(0, 0, nt)?;
        let mut layer = 0;
        let mut c = 0;
        for b in &self.double {
            let im = cond.narrow(0, c, 6)?;
            let tm = cond.narrow(0, c + 6, 6)?;
            c += 12;
            let (iq, ik, iv) = qkv(&b.img.attn, &modulate(&img, &im, 0)?, &img_rot, cfg)?;
            let (q, tk, tv) = match text_kv(layer)? {
                Some((tk, tv)) => (iq, tk, tv),
                None => {
                    let (tq, tk, tv) = qkv(&b.txt.attn, &modulate(&txt, &tm, 0)?, &txt_rot, cfg)?;
                    (Tensor::cat(&[&tq, &iq], 0)?, tk, tv)
                }
            };
            let out = pass.attend(Attention {
                q: &q,
                k: &Tensor::cat(&[&tk, &ik], 0)?,
                v: &Tensor::cat(&[&tv, &iv], 0)?,
                nt,
                qt,
                layer,
                saliency: true,
            })?;
            img = stream_rest(&b.img, &img, &out.narrow(0, qt, n)?, &im)?;
            if cached.is_none() {
                txt = stream_rest(&b.txt, &txt, &out.narrow(0, 0, nt)?, &tm)?;
            }
            ks.push(ik);
            vs.push(iv);
            tks.push(tk);
            tvs.push(tv);
            layer += 1;
        }
        let mut x = if cached.is_some() {
            img
        } else {
            Tensor::cat(&[&txt, &img], 0)?
        };
        let rot = if cached.is_some() {
            img_rot
        } else {
            Tensor::cat(&[&txt_rot, &img_rot], 0)?
        };
        let (h, m) = (cfg.hidden, cfg.mlp_hidden());
        for b in &self.single {
            let md = cond.narrow(0, c, 3)?;
            c += 3;
            let y = b.linear1.forward(&modulate(&x, &md, 0)?)?;
            let rows_all = qt + n;
            let shape = (rows_all, cfg.heads, cfg.head_dim());
            let normed = |i: usize, scale: &Tensor| {
                rms_rope(&y.narrow(1, i * h, h)?, scale, &rot, cfg.heads, 1e-6)?.reshape(shape)
            };
            let q = normed(0, &b.q_norm)?;
            let k = normed(1, &b.k_norm)?;
            let v = y.narrow(1, 2 * h, h)?.reshape(shape)?;
            let (ik, iv) = (k.narrow(0, qt, n)?, v.narrow(0, qt, n)?);
            let (tk, tv) = match text_kv(layer)? {
                Some(t) => t,
                None => (k.narrow(0, 0, nt)?, v.narrow(0, 0, nt)?),
            };
            let out = pass.attend(Attention {
                q: &q,
                k: &Tensor::cat(&[&tk, &ik], 0)?,
                v: &Tensor::cat(&[&tv, &iv], 0)?,
                nt,
                qt,
                layer,
                saliency: false,
            })?;
            let mlp = gelu_tanh(&y.narrow(1, 3 * h, m)?)?;
            let o = b.linear2.forward(&Tensor::cat(&[&out, &mlp], 1)?)?;
            x = add_gated(&x, &o, &md.i(2)?)?;
            ks.push(ik);
            vs.push(iv);
            tks.push(tk);
            tvs.push(tv);
            layer += 1;
        }
        let img = x.narrow(0, qt, n)?;
        let fm = cond.narrow(0, c, 2)?;
        // The final layer's chunks are (shift, scale).
        let y = norm_modulate(&img, &fm.i(0)?, &fm.i(1)?, 1e-6)?;
        let velocity = self.final_linear.forward(&y)?;
        let text = if cached.is_some() {
            None
        } else {
            Some((tks, tvs))
        };
        Ok(pass.finish(velocity, (ks, vs), text, self.double.len())?)
    }
}

/// Q and K (normed and rotated by `rot`, see [`rotation`]) and V of one stream, each `rows x
/// heads x head_dim`.
fn qkv(
    a: &Attn,
    x: &Tensor,
    rot: &Tensor,
    cfg: &FluxConfig,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let y = a.qkv.forward(x)?;
    let shape = (y.dim(0)?, cfg.heads, cfg.head_dim());
    let h = cfg.hidden;
    let normed = |i: usize, scale: &Tensor| {
        rms_rope(&y.narrow(1, i * h, h)?, scale, rot, cfg.heads, 1e-6)?.reshape(shape)
    };
    Ok((
        normed(0, &a.q_norm)?,
        normed(1, &a.k_norm)?,
        y.narrow(1, 2 * h, h)?.reshape(shape)?,
    ))
}

/// The rest of a double block's stream after attention: projection, gate, MLP.
fn stream_rest(s: &Stream, x: &Tensor, attn: &Tensor, m: &Tensor) -> candle_core::Result<Tensor> {
    let x = add_gated(x, &s.attn.proj.forward(attn)?, &m.i(2)?)?;
    let h = s
        .mlp_out
        .forward(&gelu_tanh_inplace(s.mlp_in.forward(&modulate(&x, m, 3)?)?)?)?;
    add_gated(&x, &h, &m.i(5)?)
}

/// The sinusoidal embedding of a time or guidance value (x 1000), `1 x dim`: cosines then
/// sines.
fn timestep_embedding(t: f32, dim: usize, dev: &Device) -> candle_core::Result<Tensor> {
    // f32 throughout, as the reference computes it.
    let half = dim / 2;
    let t = t * 1000.0;
    let c = (-(10_000f64.ln()) / half as f64) as f32;
    let mut v = vec![0f32; dim];
    for i in 0..half {
        let a = t * (i as f32 * c).exp();
        v[i] = a.cos();
        v[half + i] = a.sin();
    }
    Tensor::from_vec(v, (1, dim), dev)
}

impl JointModel for Flux {
    fn name(&self) -> &str {
        if let Some(name) = &self.name {
            name
        } else if self.config().guidance_embed {
            "flux-dev"
        } else {
            "flux-schnell"
        }
    }
    fn token_values(&self) -> usize {
        self.config().in_channels
    }
    fn kv_layers(&self) -> usize {
        self.config().kv_layers()
    }
    fn hidden(&self) -> usize {
        self.config().hidden
    }
    fn cond_rows(&self) -> usize {
        self.config().cond_rows()
    }
    fn text_widths(&self) -> (usize, usize) {
        (self.config().context_in_dim, self.config().vec_in_dim)
    }
    fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        Flux::context(self, txt, pooled)
    }
    fn step_cond(&self, context: &Tensor, t: f32, guidance: f32) -> Result<Tensor, ModelError> {
        Flux::step_cond(self, context, t, guidance)
    }
    fn forward(
        &self,
        rows: Rows<'_>,
        _frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        Flux::forward(self, rows, context, cond)
    }
    fn first_block_input(&self, x: &Tensor, _: usize, cond: &Tensor) -> Result<Tensor, ModelError> {
        Flux::first_block_input(self, x, cond)
    }
    /// Per image token: `img_in`, every double block's image stream and every single block
    /// (QKV and output projections, the MLP: 8 D^2 + 4 D M each, D the width and M the MLP
    /// width) with its attention over all N + T keys, and `proj_out`. Per step: the text
    /// stream's T rows through the same blocks. Every step: the modulation linears and
    /// the time and guidance embedders. The text and pooled-text embedders run once per
    /// request (the context), not per step.
    fn flops(&self, tokens: usize, text_tokens: usize) -> Option<crate::Flops> {
        let c = self.config();
        let (d, m) = (c.hidden as f64, (c.hidden as f64 * c.mlp_ratio).round());
        let keys = (tokens + text_tokens) as f64;
        let row = 8.0 * d * d + 4.0 * d * m + 4.0 * d * keys;
        let blocks = (c.depth + c.depth_single) as f64;
        let io = 2.0 * c.in_channels as f64 * d;
        let embed = |i: f64| 2.0 * i * d + 2.0 * d * d;
        let every = c.depth as f64 * 2.0 * (2.0 * d * 6.0 * d)
            + c.depth_single as f64 * 2.0 * d * 3.0 * d
            + 2.0 * d * 2.0 * d
            + embed(256.0)
            + if c.guidance_embed { embed(256.0) } else { 0.0 };
        Some(crate::Flops {
            per_token: 2.0 * io + blocks * row,
            per_step: text_tokens as f64 * (c.depth + c.depth_single) as f64 * row,
            every_step: every,
            signal_per_token: io,
            counted: true,
        })
    }
    fn packing(&self) -> (usize, PixelIndex) {
        self.packing
    }
}

/// FLUX behind the `Denoiser` contract.
pub type FluxDenoiser = JointDenoiser<Flux>;
