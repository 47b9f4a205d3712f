//! Stable Audio Open's DiT with FlashDiff's token-subset forward, written from diffusers'
//! `StableAudioDiTModel` description and weight names: a global token (projected global
//! conditioning plus the Gaussian-Fourier time embedding) prepended to the latent frames,
//! self-attention with rotary positions on the first half of each head, cross-attention to
//! the projected text states with grouped key/value heads, SwiGLU feed-forward, 1x1
//! convolutions around it.
//!
//! The patchable grid is the latent's frames (a 1-D grid). The global token is computed in
//! every forward, like the text stream of FLUX and SD3: it is one row. Its self-attention
//! keys and values are therefore always fresh; the frames' come fresh for the computed rows
//! and from the cache for the others (one layer per block, after the rotary encoding).

use candle_core::{Tensor, D};
use candle_nn::VarBuilder;

use crate::families::joint::denoiser::{JointDenoiser, JointModel, PixelIndex};
use crate::families::joint::TensorSource;
use crate::families::joint::{check_rows, lin, Attention, Lin, Pass};
pub use crate::families::joint::{JointOutput, Rows};
use crate::ModelError;

/// The architecture's sizes (diffusers' `StableAudioDiTModel` config).
#[derive(Debug, Clone, PartialEq)]
pub struct SaoConfig {
    /// Latent channels in (64 for Stable Audio Open's Oobleck VAE).
    pub in_channels: usize,
    /// Latent channels out.
    pub out_channels: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads of the cross-attention.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Blocks.
    pub depth: usize,
    /// Width of the projected text states.
    pub cross_dim: usize,
    /// Width of the text encoder's states (T5-base: 768).
    pub cross_in: usize,
    /// Width of the global conditioning (1536).
    pub global_in: usize,
    /// Width of the time embedding (256).
    pub time_proj_dim: usize,
}

impl SaoConfig {
    /// Stable Audio Open 1.0.
    pub fn open_1_0() -> Self {
        Self {
            in_channels: 64,
            out_channels: 64,
            heads: 24,
            kv_heads: 12,
            head_dim: 64,
            depth: 24,
            cross_dim: 768,
            cross_in: 768,
            global_in: 1536,
            time_proj_dim: 256,
        }
    }

    /// Transformer width.
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Checks what the forward relies on, with the reason.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Input(format!("Stable Audio DiT config: {m}")));
        if self.heads == 0 || self.kv_heads == 0 || self.heads % self.kv_heads != 0 {
            return bad(format!(
                "{} heads cannot share {} key/value heads",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim % 4 != 0 || self.head_dim == 0 {
            return bad(format!(
                "head width {} must be a positive multiple of 4 (rotary on its first half)",
                self.head_dim
            ));
        }
        if self.depth == 0 || self.time_proj_dim % 2 != 0 {
            return bad("depth must be positive and the time embedding even".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Norm {
    w: Tensor,
    b: Tensor,
}

impl Norm {
    fn load(get: &TensorSource, p: &str, h: usize) -> Result<Self, ModelError> {
        Ok(Self {
            w: get(&format!("{p}.weight"), &[h])?,
            b: get(&format!("{p}.bias"), &[h])?,
        })
    }

    /// LayerNorm with its affine parameters, eps 1e-5.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?
            .broadcast_mul(&self.w)?
            .broadcast_add(&self.b)
    }
}

#[derive(Debug, Clone)]
struct Block {
    norm1: Norm,
    q: Lin,
    k: Lin,
    v: Lin,
    out: Lin,
    norm2: Norm,
    cq: Lin,
    ck: Lin,
    cv: Lin,
    cout: Lin,
    norm3: Norm,
    ff_in: Lin,
    ff_out: Lin,
}

/// A request's conditioning: the projected text states and the projected global vector.
#[derive(Debug, Clone)]
pub struct SaoContext {
    /// `cross_attention_proj(text states)`, `text_tokens x cross_dim`.
    pub cross: Tensor,
    /// `global_proj(global states)`, `1 x hidden`.
    pub global: Tensor,
}

/// Stable Audio Open's DiT.
#[derive(Debug, Clone)]
pub struct Sao {
    cfg: SaoConfig,
    fourier: Tensor,
    time1: Lin,
    time2: Lin,
    global1: Lin,
    global2: Lin,
    cross1: Lin,
    cross2: Lin,
    pre: Lin,
    proj_in: Lin,
    blocks: Vec<Block>,
    proj_out: Lin,
    post: Lin,
}

impl Sao {
    /// Loads the DiT from tensors named as in diffusers' `StableAudioDiTModel`.
    pub fn load(cfg: SaoConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        cfg.validate()?;
        let (h, c, o) = (cfg.hidden(), cfg.in_channels, cfg.out_channels);
        let kv = cfg.kv_heads * cfg.head_dim;
        let conv = |n: &str, ch: usize| -> Result<Lin, ModelError> {
            Ok(Lin {
                w: get(n, &[ch, ch, 1])?.squeeze(2)?,
                b: None,
            })
        };
        let blocks = (0..cfg.depth)
            .map(|i| {
                let p = format!("transformer_blocks.{i}");
                let l = |n: &str, inp: usize, out: usize| {
                    lin(get, &format!("{p}.{n}"), inp, out, false)
                };
                Ok(Block {
                    norm1: Norm::load(get, &format!("{p}.norm1"), h)?,
                    q: l("attn1.to_q", h, h)?,
                    k: l("attn1.to_k", h, h)?,
                    v: l("attn1.to_v", h, h)?,
                    out: l("attn1.to_out.0", h, h)?,
                    norm2: Norm::load(get, &format!("{p}.norm2"), h)?,
                    cq: l("attn2.to_q", h, h)?,
                    ck: l("attn2.to_k", cfg.cross_dim, kv)?,
                    cv: l("attn2.to_v", cfg.cross_dim, kv)?,
                    cout: l("attn2.to_out.0", h, h)?,
                    norm3: Norm::load(get, &format!("{p}.norm3"), h)?,
                    ff_in: lin(get, &format!("{p}.ff.net.0.proj"), h, 8 * h, true)?,
                    ff_out: lin(get, &format!("{p}.ff.net.2"), 4 * h, h, true)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            fourier: get("time_proj.weight", &[cfg.time_proj_dim / 2])?,
            time1: lin(get, "timestep_proj.0", cfg.time_proj_dim, h, true)?,
            time2: lin(get, "timestep_proj.2", h, h, true)?,
            global1: lin(get, "global_proj.0", cfg.global_in, h, false)?,
            global2: lin(get, "global_proj.2", h, h, false)?,
            cross1: lin(
                get,
                "cross_attention_proj.0",
                cfg.cross_in,
                cfg.cross_dim,
                false,
            )?,
            cross2: lin(
                get,
                "cross_attention_proj.2",
                cfg.cross_dim,
                cfg.cross_dim,
                false,
            )?,
            pre: conv("preprocess_conv.weight", c)?,
            proj_in: lin(get, "proj_in", c, h, false)?,
            blocks,
            proj_out: lin(get, "proj_out", h, o, false)?,
            post: conv("postprocess_conv.weight", o)?,
            cfg,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &SaoConfig {
        &self.cfg
    }

    /// A request's conditioning from the text encoder's states (`n x cross_in`) and the
    /// global conditioning vector (`global_in`).
    pub fn context(&self, text: &Tensor, global: &Tensor) -> Result<SaoContext, ModelError> {
        let cfg = &self.cfg;
        if text.dims().len() != 2
            || text.dim(1)? != cfg.cross_in
            || global.dims() != [cfg.global_in]
        {
            return Err(ModelError::Input(format!(
                "Stable Audio text states must be n x {} and the global vector {} wide; got {:?} and {:?}",
                cfg.cross_in,
                cfg.global_in,
                text.dims(),
                global.dims()
            )));
        }
        let cross = self.cross2.forward(&self.cross1.forward(text)?.silu()?)?;
        let g = self
            .global2
            .forward(&self.global1.forward(&global.unsqueeze(0)?)?.silu()?)?;
        Ok(SaoContext { cross, global: g })
    }

    /// The global token of time `t` (what diffusers passes as `timestep`), `1 x hidden`.
    pub fn step_cond(&self, context: &SaoContext, t: f32) -> Result<Tensor, ModelError> {
        // Gaussian Fourier features 2 pi t w, cosines then sines.
        let a = (self.fourier.unsqueeze(0)? * (2.0 * std::f64::consts::PI * t as f64))?;
        let emb = Tensor::cat(&[a.cos()?, a.sin()?], 1)?;
        let time = self.time2.forward(&self.time1.forward(&emb)?.silu()?)?;
        Ok(context.global.add(&time)?)
    }

    /// The first block's normalised input of every frame of `x` (`frames x in_channels`):
    /// the signal whole-step caching watches. Without modulation in this DiT, it is the same
    /// at every step for the same latent; the time enters through the global token.
    pub fn first_block_input(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let x = x.add(&self.pre.forward(x)?)?;
        Ok(self.blocks[0].norm1.forward(&self.proj_in.forward(&x)?)?)
    }

    /// Forward of the latent frames in `rows` (every frame for the full forward): velocity
    /// rows (`n x out_channels`), fresh self-attention K/V of the frames, the cross-attention
    /// saliency (`n x text_tokens`, averaged over heads and blocks) and per-patch mass.
    pub fn forward(
        &self,
        rows: Rows<'_>,
        context: &SaoContext,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let cfg = &self.cfg;
        let (h, hd, heads) = (cfg.hidden(), cfg.head_dim, cfg.heads);
        check_rows(&rows, "Stable Audio DiT", cfg.in_channels, cfg.depth, h)?;
        if cond.dims() != [1, h] {
            return Err(ModelError::Input(format!(
                "Stable Audio step conditioning must be 1 x {h}, got {:?}",
                cond.dims()
            )));
        }
        let n = rows.ids.len();
        let dev = rows.x.device().clone();
        // Positions: the global token at 0, frame i at i + 1.
        let pos: Vec<f32> = std::iter::once(0.0)
            .chain(rows.ids.iter().map(|&t| t as f32 + 1.0))
            .collect();
        let (cos, sin) = rotary_table(&pos, hd / 2, &dev)?;
        let x = rows.x.add(&self.pre.forward(rows.x)?)?;
        let mut seq = Tensor::cat(&[cond, &self.proj_in.forward(&x)?], 0)?;
        let mut pass = Pass::new(rows, heads, hd)?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let ne = context.cross.dim(0)?;
        let group: Vec<u32> = (0..heads)
            .map(|i| (i / (heads / cfg.kv_heads)) as u32)
            .collect();
        let group = Tensor::from_vec(group, heads, &dev)?;
        let mut saliency: Option<Tensor> = None;
        for (layer, b) in self.blocks.iter().enumerate() {
            let r = n + 1;
            let a = b.norm1.forward(&seq)?;
            let split = |l: &Lin| l.forward(&a)?.reshape((r, heads, hd));
            let q = rotate(&split(&b.q)?, &cos, &sin)?;
            let k = rotate(&split(&b.k)?, &cos, &sin)?;
            let v = split(&b.v)?;
            let o = pass.attend(Attention {
                q: &q,
                k: &k,
                v: &v,
                nt: 1,
                qt: 1,
                layer,
                saliency: false,
            })?;
            ks.push(k.narrow(0, 1, n)?);
            vs.push(v.narrow(0, 1, n)?);
            seq = seq.add(&b.out.forward(&o)?)?;
            // Cross-attention: every row to the text, key/value heads shared by groups.
            let a = b.norm2.forward(&seq)?;
            let cq =
                b.cq.forward(&a)?
                    .reshape((r, heads, hd))?
                    .transpose(0, 1)?
                    .contiguous()?;
            let kv = |l: &Lin| -> candle_core::Result<Tensor> {
                l.forward(&context.cross)?
                    .reshape((ne, cfg.kv_heads, hd))?
                    .index_select(&group, 1)?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (ck, cv) = (kv(&b.ck)?, kv(&b.cv)?);
            let p = candle_nn::ops::softmax_last_dim(
                &(cq.matmul(&ck.t()?)? * (1.0 / (hd as f64).sqrt()))?,
            )?;
            if pass.rows.saliency {
                let s = p.mean(0)?.narrow(0, 1, n)?;
                saliency = Some(match saliency {
                    Some(acc) => acc.add(&s)?,
                    None => s,
                });
            }
            let o = p.matmul(&cv)?.transpose(0, 1)?.reshape((r, h))?;
            seq = seq.add(&b.cout.forward(&o)?)?;
            // SwiGLU feed-forward.
            let y = b.ff_in.forward(&b.norm3.forward(&seq)?)?;
            let f = y
                .narrow(1, 0, 4 * h)?
                .mul(&y.narrow(1, 4 * h, 4 * h)?.silu()?)?;
            seq = seq.add(&b.ff_out.forward(&f)?)?;
        }
        let y = self.proj_out.forward(&seq.narrow(0, 1, n)?)?;
        let velocity = y.add(&self.post.forward(&y)?)?;
        let mut out = pass.finish(velocity, (ks, vs), None, 1)?;
        out.saliency = match saliency {
            Some(s) => Some((s / self.blocks.len() as f64)?),
            None => None,
        };
        Ok(out)
    }
}

/// Cosines and sines for rotating `dim` values at each position: `rows x 1 x dim`, the
/// frequencies repeated over both halves (diffusers' non-interleaved real form).
fn rotary_table(
    pos: &[f32],
    dim: usize,
    dev: &candle_core::Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| 1.0 / 10_000f32.powf((2 * i) as f32 / dim as f32))
        .collect();
    let (mut c, mut s) = (
        Vec::with_capacity(pos.len() * dim),
        Vec::with_capacity(pos.len() * dim),
    );
    for &p in pos {
        for _ in 0..2 {
            for &f in &freqs {
                c.push((p * f).cos());
                s.push((p * f).sin());
            }
        }
    }
    Ok((
        Tensor::from_vec(c, (pos.len(), 1, dim), dev)?,
        Tensor::from_vec(s, (pos.len(), 1, dim), dev)?,
    ))
}

/// Rotates the first `dim` values of each head (`rows x heads x head_dim`) by the table,
/// halves as real and imaginary parts: `x cos + (-x_imag, x_real) sin`; the rest unchanged.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let dim = cos.dim(2)?;
    let hd = x.dim(2)?;
    let r = x.narrow(2, 0, dim)?;
    let (re, im) = (r.narrow(2, 0, dim / 2)?, r.narrow(2, dim / 2, dim / 2)?);
    let turned = Tensor::cat(&[&im.neg()?, &re], 2)?;
    let rot = r.broadcast_mul(cos)?.add(&turned.broadcast_mul(sin)?)?;
    if dim == hd {
        return Ok(rot);
    }
    Tensor::cat(&[&rot, &x.narrow(2, dim, hd - dim)?], 2)
}

/// How a Stable Audio checkpoint names the DiT's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaoLayout {
    /// diffusers' `StableAudioDiTModel` (`transformer/`).
    Diffusers,
    /// stable-audio-tools' single `model.safetensors` (`model.model.*`, fused Q/K/V and K/V
    /// projections, `gamma`/`beta` norms).
    Official,
}

/// The DiT of a Stable Audio checkpoint, in either layout.
pub type SaoCheckpoint = crate::io::shards::Checkpoint<SaoLayout>;

/// The released model's head width (1536 wide, 24 heads).
pub const SAO_HEAD_DIM: usize = 64;

impl crate::io::shards::Checkpoint<SaoLayout> {
    /// Opens a safetensors file or a folder of shards (diffusers' `transformer/`).
    pub fn open(path: &std::path::Path) -> Result<Self, ModelError> {
        let files = crate::io::shards::Shards::open(path)?;
        let layout = if files.has("proj_in.weight") {
            SaoLayout::Diffusers
        } else if files.has("model.model.transformer.project_in.weight") {
            SaoLayout::Official
        } else {
            return Err(ModelError::Input(format!(
                "{} is not a Stable Audio DiT checkpoint: it has neither `proj_in.weight` \
                 (diffusers) nor `model.model.transformer.project_in.weight` \
                 (stable-audio-tools)",
                path.display()
            )));
        };
        let named = layout.clone();
        Ok(Self::new(files, layout, move |name| {
            layout_source(&named, name)
        }))
    }

    /// The architecture, from the tensors' shapes; heads of `head_dim` (the released model:
    /// [`SAO_HEAD_DIM`]).
    pub fn config(&self, head_dim: usize) -> Result<SaoConfig, ModelError> {
        let what = format!("Stable Audio DiT, {:?} layout", self.layout());
        let need = |n: &str, rank: usize| self.weights().need(n, rank, &what);
        let c = need("preprocess_conv.weight", 3)?[0];
        let proj_in = need("proj_in.weight", 2)?;
        let h = proj_in[0];
        let kv = need("transformer_blocks.0.attn2.to_k.weight", 2)?;
        let cross = need("cross_attention_proj.0.weight", 2)?;
        let depth = (0..)
            .take_while(|i| {
                self.weights()
                    .shape(&format!("transformer_blocks.{i}.norm1.weight"))
                    .is_some()
            })
            .count();
        if head_dim == 0 || h % head_dim != 0 || kv[0] % head_dim != 0 {
            return Err(ModelError::Input(format!(
                "{what}: width {h} and key/value width {} are not whole heads of {head_dim}",
                kv[0]
            )));
        }
        let cfg = SaoConfig {
            in_channels: c,
            out_channels: need("proj_out.weight", 2)?[0],
            heads: h / head_dim,
            kv_heads: kv[0] / head_dim,
            head_dim,
            depth,
            cross_dim: kv[1],
            cross_in: cross[1],
            global_in: need("global_proj.0.weight", 2)?[1],
            time_proj_dim: 2 * need(
                "time_proj.weight",
                1 + usize::from(*self.layout() == SaoLayout::Official),
            )?[0],
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The DiT with heads of `head_dim`, its linear layers in `compute` (F32, BF16, F16).
    pub fn load(
        &self,
        head_dim: usize,
        compute: candle_core::DType,
        dev: &candle_core::Device,
    ) -> Result<Sao, ModelError> {
        crate::io::shards::dtype_for("", &[], compute)?;
        let vb = self.weights().var_builder(compute, dev);
        Sao::load(self.config(head_dim)?, &vb)
    }
}

/// Where a checkpoint of `layout` keeps diffusers' tensor `name` (stable-audio-tools keeps
/// the Fourier frequencies as an `n x 1` matrix).
fn layout_source(layout: &SaoLayout, name: &str) -> crate::io::shards::Source {
    use crate::io::shards::Source;
    match (layout, official_source(name)) {
        (SaoLayout::Diffusers, _) => Source::One(name.into()),
        (SaoLayout::Official, Source::One(n)) if name == "time_proj.weight" => Source::Flat(n),
        (SaoLayout::Official, s) => s,
    }
}

/// Where diffusers' DiT tensor `name` lives in stable-audio-tools' `model.safetensors`.
fn official_source(name: &str) -> crate::io::shards::Source {
    use crate::io::shards::Source;
    let p = "model.model.";
    let one = |n: String| Source::One(format!("{p}{n}"));
    let top = [
        ("time_proj.", "timestep_features."),
        ("timestep_proj.", "to_timestep_embed."),
        ("global_proj.", "to_global_embed."),
        ("cross_attention_proj.", "to_cond_embed."),
        ("proj_in.", "transformer.project_in."),
        ("proj_out.", "transformer.project_out."),
    ];
    for (ours, theirs) in top {
        if let Some(rest) = name.strip_prefix(ours) {
            return one(format!("{theirs}{rest}"));
        }
    }
    let Some(rest) = name.strip_prefix("transformer_blocks.") else {
        return one(name.into());
    };
    let (i, part) = rest.split_once('.').unwrap_or((rest, ""));
    let l = format!("transformer.layers.{i}");
    let norm = |n: &str, which: &str| {
        let affine = if which == "weight" { "gamma" } else { "beta" };
        one(format!("{l}.{n}.{affine}"))
    };
    match part {
        "norm1.weight" | "norm1.bias" => norm("pre_norm", &part[6..]),
        "norm2.weight" | "norm2.bias" => norm("cross_attend_norm", &part[6..]),
        "norm3.weight" | "norm3.bias" => norm("ff_norm", &part[6..]),
        "attn1.to_q.weight" => Source::Part(format!("{p}{l}.self_attn.to_qkv.weight"), 0, 3),
        "attn1.to_k.weight" => Source::Part(format!("{p}{l}.self_attn.to_qkv.weight"), 1, 3),
        "attn1.to_v.weight" => Source::Part(format!("{p}{l}.self_attn.to_qkv.weight"), 2, 3),
        "attn1.to_out.0.weight" => one(format!("{l}.self_attn.to_out.weight")),
        "attn2.to_q.weight" => one(format!("{l}.cross_attn.to_q.weight")),
        "attn2.to_k.weight" => Source::Part(format!("{p}{l}.cross_attn.to_kv.weight"), 0, 2),
        "attn2.to_v.weight" => Source::Part(format!("{p}{l}.cross_attn.to_kv.weight"), 1, 2),
        "attn2.to_out.0.weight" => one(format!("{l}.cross_attn.to_out.weight")),
        _ => match part.strip_prefix("ff.net.") {
            Some(r) => one(format!("{l}.ff.ff.{r}")),
            None => one(format!("{l}.{part}")),
        },
    }
}

/// Stable Audio Open's DiT as a joint model on a 1-D grid of latent frames. Its context
/// rows are the projected text states (zero-padded from `cross_dim` to `hidden`) and the
/// projected global vector; its step conditioning is the global token.
///
/// It predicts `v = cos(phi) eps - sin(phi) x0` of the latent `x = cos(phi) x0 + sin(phi)
/// eps` at `phi = t pi / 2` (diffusers passes `t = atan(sigma) 2 / pi` and scales the
/// sample by `1 / sqrt(1 + sigma^2)`, which is this `x`). Then `dx/dt = (pi / 2) v`: the
/// velocity the engine's Euler step takes is `pi / 2` times the model's output.
impl JointModel for Sao {
    fn name(&self) -> &str {
        "stable-audio-open"
    }
    fn token_values(&self) -> usize {
        self.config().in_channels
    }
    fn kv_layers(&self) -> usize {
        self.config().depth
    }
    fn hidden(&self) -> usize {
        self.config().hidden()
    }
    fn cond_rows(&self) -> usize {
        1
    }
    fn text_widths(&self) -> (usize, usize) {
        (self.config().cross_in, self.config().global_in)
    }
    fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        let c = Sao::context(self, txt, pooled)?;
        let (h, w) = (self.hidden(), c.cross.dim(1)?);
        if w > h {
            return Err(ModelError::Input(format!(
                "Stable Audio DiT: cross-attention width {w} is wider than the transformer's \
                 {h}; its context rows cannot hold it"
            )));
        }
        Ok(Tensor::cat(
            &[c.cross.pad_with_zeros(1, 0, h - w)?, c.global],
            0,
        )?)
    }
    fn step_cond(&self, context: &Tensor, t: f32, _: f32) -> Result<Tensor, ModelError> {
        Sao::step_cond(self, &sao_context(self, context)?, t)
    }
    fn forward(
        &self,
        rows: Rows<'_>,
        _frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let mut out = Sao::forward(self, rows, &sao_context(self, context)?, cond)?;
        out.velocity = (out.velocity * std::f64::consts::FRAC_PI_2)?;
        Ok(out)
    }
    fn first_block_input(&self, x: &Tensor, _: usize, _: &Tensor) -> Result<Tensor, ModelError> {
        Sao::first_block_input(self, x)
    }
    /// One latent frame a token, its channels in order.
    fn packing(&self) -> (usize, PixelIndex) {
        (1, |k, _, _, _, _| k)
    }
    /// The global token (the text is only attended to; its keys and values are not counted).
    fn fixed_rows(&self, _text_tokens: usize) -> usize {
        1
    }
    /// Per latent frame: the pre-convolution and `proj_in`, every block's self-attention
    /// (Q/K/V and output, 8 D^2, D the width, over the N frames and the global token),
    /// cross-attention queries and output (4 D^2, T text keys) and SwiGLU feed-forward
    /// (24 D^2), then `proj_out` and the post-convolution. Per step: the global token
    /// through every block, and every block's cross-attention keys and values of the T text
    /// tokens. Every step: the time embedder. The text and global projections run once per
    /// request (the context), not per step.
    fn flops(&self, tokens: usize, text_tokens: usize) -> Option<crate::Flops> {
        let c = self.config();
        let d = c.hidden() as f64;
        let (n, t) = (tokens as f64, text_tokens as f64);
        let (ci, co) = (c.in_channels as f64, c.out_channels as f64);
        let depth = c.depth as f64;
        let block = 36.0 * d * d + 4.0 * d * (n + 1.0) + 4.0 * d * t;
        let kv = (c.kv_heads * c.head_dim) as f64;
        let signal = 2.0 * ci * ci + 2.0 * ci * d;
        Some(crate::Flops {
            per_token: signal + depth * block + 2.0 * d * co + 2.0 * co * co,
            per_step: depth * (block + t * 4.0 * c.cross_dim as f64 * kv),
            every_step: 2.0 * c.time_proj_dim as f64 * d + 2.0 * d * d,
            signal_per_token: signal,
            counted: true,
        })
    }
}

/// The [`SaoContext`] inside context rows made by [`JointModel::context`] for [`Sao`].
fn sao_context(m: &Sao, context: &Tensor) -> Result<SaoContext, ModelError> {
    let nt = context
        .dim(0)?
        .checked_sub(1)
        .ok_or_else(|| ModelError::Input("Stable Audio context without its global row".into()))?;
    Ok(SaoContext {
        cross: context
            .narrow(0, 0, nt)?
            .narrow(1, 0, m.config().cross_dim)?,
        global: context.narrow(0, nt, 1)?,
    })
}

/// Stable Audio Open behind the `Denoiser` contract.
pub type SaoDenoiser = JointDenoiser<Sao>;
