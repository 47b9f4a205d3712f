//! Stable Diffusion 3 / 3.5's MMDiT with FlashDiff's token-subset forward, written from the
//! SD3 paper's description and diffusers' `SD3Transformer2DModel` weight names
//! (`transformer_blocks.N.attn.to_q.weight`, ...): joint attention of text and image
//! streams, SD3.5's per-head RMS norms of Q and K, and its dual-attention (MMDiT-X) blocks,
//! which add a second attention over the image tokens alone.
//!
//! As for FLUX ([`crate::families::flux`]), the patchable grid is the image tokens and the text stream
//! is computed in every forward (exact). A token holds one `patch x patch` patch of the
//! latent in (row, column, channel) order, which is the order the model's output comes in;
//! the patch embedding's convolution is reordered to read it at load time.
//!
//! What the engine keeps: context = `context_embedder(T5+CLIP states)` (`text_tokens x
//! hidden`) then `text_embedder(pooled)` (`hidden`); step conditioning = every block's
//! modulation rows of that time ([`MmditConfig::cond_rows`] x hidden); K/V cache = the joint
//! attention's image keys and values of every block, then, for a dual block, its second
//! attention's (after the Q/K norms).

use candle_core::{IndexOp, Tensor};
use candle_nn::VarBuilder;

use crate::families::joint::denoiser::{JointDenoiser, JointModel, PixelIndex};
use crate::families::joint::TensorSource;
use crate::families::joint::{
    affine, check_rows, check_text_cache, layer_norm, lin, modulate, rms, text_context, Attention,
    Embedder, Lin, Pass,
};
pub use crate::families::joint::{JointOutput, Rows};
use crate::ModelError;
use flashdiff_kernels::ops::{add_gated, gelu_tanh_inplace};

mod load;
pub use load::{MmditCheckpoint, MmditLayout};

/// The architecture's sizes (diffusers' `SD3Transformer2DModel` config).
#[derive(Debug, Clone, PartialEq)]
pub struct MmditConfig {
    /// Latent pixels per token side.
    pub patch: usize,
    /// Latent channels in (16 for SD3).
    pub in_channels: usize,
    /// Latent channels out.
    pub out_channels: usize,
    /// Transformer width (heads x 64 in the released models).
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Joint blocks (the last one only reads the text).
    pub depth: usize,
    /// Side of the learned position grid the image's positions are cropped from.
    pub pos_max: usize,
    /// Width of the text encoders' joint states (4096).
    pub context_in_dim: usize,
    /// Width of the pooled text vector (2048).
    pub pooled_dim: usize,
    /// Per-head RMS norms of Q and K (SD3.5).
    pub qk_norm: bool,
    /// Blocks with a second, image-only attention (SD3.5 medium: 0..=12).
    pub dual: Vec<usize>,
}

impl MmditConfig {
    /// SD3 medium.
    pub fn sd3_medium() -> Self {
        Self {
            patch: 2,
            in_channels: 16,
            out_channels: 16,
            hidden: 1536,
            heads: 24,
            depth: 24,
            pos_max: 192,
            context_in_dim: 4096,
            pooled_dim: 2048,
            qk_norm: false,
            dual: vec![],
        }
    }

    /// SD3.5 large.
    pub fn sd35_large() -> Self {
        Self {
            hidden: 2432,
            heads: 38,
            depth: 38,
            qk_norm: true,
            ..Self::sd3_medium()
        }
    }

    /// SD3.5 medium.
    pub fn sd35_medium() -> Self {
        Self {
            pos_max: 384,
            qk_norm: true,
            dual: (0..=12).collect(),
            ..Self::sd3_medium()
        }
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Values per latent token.
    pub fn token_in(&self) -> usize {
        self.patch * self.patch * self.in_channels
    }

    /// Values per velocity row.
    pub fn token_out(&self) -> usize {
        self.patch * self.patch * self.out_channels
    }

    fn is_dual(&self, block: usize) -> bool {
        self.dual.contains(&block)
    }

    /// Layers with image K/V: one per block, two per dual block.
    pub fn kv_layers(&self) -> usize {
        self.depth + (0..self.depth).filter(|&b| self.is_dual(b)).count()
    }

    /// Modulation rows of `hidden` per step: image 6 (9 when dual), text 6 (2 in the last
    /// block), the final layer 2.
    pub fn cond_rows(&self) -> usize {
        (0..self.depth)
            .map(|b| {
                let img = if self.is_dual(b) { 9 } else { 6 };
                let txt = if b + 1 == self.depth { 2 } else { 6 };
                img + txt
            })
            .sum::<usize>()
            + 2
    }

    /// Checks what the forward relies on, with the reason.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Input(format!("MMDiT config: {m}")));
        if self.heads == 0 || self.hidden % self.heads != 0 {
            return bad(format!(
                "hidden {} is not a positive multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        if self.depth == 0 || self.patch == 0 || self.pos_max == 0 {
            return bad("depth, patch and pos_max must be positive".into());
        }
        if let Some(b) = self.dual.iter().find(|&&b| b + 1 >= self.depth) {
            return bad(format!(
                "dual-attention block {b} must come before the last block {}",
                self.depth - 1
            ));
        }
        Ok(())
    }
}

/// An attention's projections; the output projection is absent where the output is unused
/// (the text side of the last block).
#[derive(Debug, Clone)]
struct Proj {
    q: Lin,
    k: Lin,
    v: Lin,
    out: Option<Lin>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
}

impl Proj {
    /// `names`: q, k, v, out, q-norm, k-norm under `p`.
    fn load(
        get: &TensorSource,
        p: &str,
        names: [&str; 6],
        cfg: &MmditConfig,
        with_out: bool,
    ) -> Result<Self, ModelError> {
        let (h, hd) = (cfg.hidden, cfg.head_dim());
        let norm = |n: &str| -> Result<Option<Tensor>, ModelError> {
            if cfg.qk_norm {
                Ok(Some(get(&format!("{p}.{n}.weight"), &[hd])?))
            } else {
                Ok(None)
            }
        };
        Ok(Self {
            q: lin(get, &format!("{p}.{}", names[0]), h, h, true)?,
            k: lin(get, &format!("{p}.{}", names[1]), h, h, true)?,
            v: lin(get, &format!("{p}.{}", names[2]), h, h, true)?,
            out: if with_out {
                Some(lin(get, &format!("{p}.{}", names[3]), h, h, true)?)
            } else {
                None
            },
            q_norm: norm(names[4])?,
            k_norm: norm(names[5])?,
        })
    }

    /// Q, K (normed where the model norms them) and V, `rows x heads x head_dim`.
    fn qkv(&self, x: &Tensor, cfg: &MmditConfig) -> candle_core::Result<[Tensor; 3]> {
        let r = x.dim(0)?;
        let split = |l: &Lin| l.forward(x)?.reshape((r, cfg.heads, cfg.head_dim()));
        let norm = |t: Tensor, n: &Option<Tensor>| match n {
            Some(w) => rms(&t, w),
            None => Ok(t),
        };
        Ok([
            norm(split(&self.q)?, &self.q_norm)?,
            norm(split(&self.k)?, &self.k_norm)?,
            split(&self.v)?,
        ])
    }
}

const IMG: [&str; 6] = ["to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k"];
const TXT: [&str; 6] = [
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "norm_added_q",
    "norm_added_k",
];

#[derive(Debug, Clone)]
struct Ff {
    inp: Lin,
    out: Lin,
}

impl Ff {
    fn load(get: &TensorSource, p: &str, h: usize) -> Result<Self, ModelError> {
        Ok(Self {
            inp: lin(get, &format!("{p}.net.0.proj"), h, 4 * h, true)?,
            out: lin(get, &format!("{p}.net.2"), 4 * h, h, true)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&gelu_tanh_inplace(self.inp.forward(x)?)?)
    }
}

#[derive(Debug, Clone)]
struct Block {
    img_mod: Lin,
    txt_mod: Lin,
    img: Proj,
    txt: Proj,
    img2: Option<Proj>,
    ff: Ff,
    ff_txt: Option<Ff>,
}

/// The SD3 / SD3.5 transformer.
#[derive(Debug, Clone)]
pub struct Mmdit {
    cfg: MmditConfig,
    patch_in: Lin,
    pos: Tensor,
    time: Embedder,
    pooled: Embedder,
    context_in: Lin,
    blocks: Vec<Block>,
    final_mod: Lin,
    final_linear: Lin,
}

impl Mmdit {
    /// Loads the transformer from tensors named as in diffusers' `SD3Transformer2DModel`.
    pub fn load(cfg: MmditConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        cfg.validate()?;
        let (h, p, c) = (cfg.hidden, cfg.patch, cfg.in_channels);
        // The convolution reads (channel, row, column); tokens hold (row, column, channel).
        let conv = get("pos_embed.proj.weight", &[h, c, p, p])?;
        let patch_in = Lin {
            w: conv
                .permute((0, 2, 3, 1))?
                .reshape((h, p * p * c))?
                .contiguous()?,
            b: Some(get("pos_embed.proj.bias", &[h])?),
        };
        let pos = get("pos_embed.pos_embed", &[1, cfg.pos_max * cfg.pos_max, h])?.squeeze(0)?;
        let blocks = (0..cfg.depth)
            .map(|b| {
                let pre = format!("transformer_blocks.{b}");
                let last = b + 1 == cfg.depth;
                let dual = cfg.is_dual(b);
                Ok(Block {
                    img_mod: lin(
                        get,
                        &format!("{pre}.norm1.linear"),
                        h,
                        if dual { 9 * h } else { 6 * h },
                        true,
                    )?,
                    txt_mod: lin(
                        get,
                        &format!("{pre}.norm1_context.linear"),
                        h,
                        if last { 2 * h } else { 6 * h },
                        true,
                    )?,
                    img: Proj::load(get, &format!("{pre}.attn"), IMG, &cfg, true)?,
                    txt: Proj::load(get, &format!("{pre}.attn"), TXT, &cfg, !last)?,
                    img2: if dual {
                        Some(Proj::load(get, &format!("{pre}.attn2"), IMG, &cfg, true)?)
                    } else {
                        None
                    },
                    ff: Ff::load(get, &format!("{pre}.ff"), h)?,
                    ff_txt: if last {
                        None
                    } else {
                        Some(Ff::load(get, &format!("{pre}.ff_context"), h)?)
                    },
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            patch_in,
            pos,
            time: Embedder::load(
                get,
                (
                    "time_text_embed.timestep_embedder.linear_1",
                    "time_text_embed.timestep_embedder.linear_2",
                ),
                256,
                h,
            )?,
            pooled: Embedder::load(
                get,
                (
                    "time_text_embed.text_embedder.linear_1",
                    "time_text_embed.text_embedder.linear_2",
                ),
                cfg.pooled_dim,
                h,
            )?,
            context_in: lin(get, "context_embedder", cfg.context_in_dim, h, true)?,
            blocks,
            final_mod: lin(get, "norm_out.linear", h, 2 * h, true)?,
            final_linear: lin(get, "proj_out", h, cfg.token_out(), true)?,
            cfg,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &MmditConfig {
        &self.cfg
    }

    /// The dtype its linear layers multiply in (F32 unless loaded with
    /// [`MmditCheckpoint::load_in`]).
    pub fn compute_dtype(&self) -> candle_core::DType {
        self.final_linear.w.dtype()
    }

    /// A request's context: `context_embedder(txt)` (`text_tokens x hidden`) with
    /// `text_embedder(pooled)` as one more row.
    pub fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        text_context(
            "MMDiT",
            (txt, pooled),
            (&self.context_in, &self.pooled),
            (self.cfg.context_in_dim, self.cfg.pooled_dim),
        )
    }

    /// The conditioning of time `t` (1 = noise; the model sees `1000 t`): every block's
    /// modulation rows, [`MmditConfig::cond_rows`] x hidden, in the order the layers emit.
    pub fn step_cond(&self, context: &Tensor, t: f32) -> Result<Tensor, ModelError> {
        let rows = context.dim(0)?;
        let emb = timestep_embedding(t * 1000.0, 256, context.device())?;
        let c = self
            .time
            .forward(&emb)?
            .add(&context.narrow(0, rows - 1, 1)?)?;
        let s = c.silu()?;
        let h = self.cfg.hidden;
        let mut parts = Vec::with_capacity(2 * self.blocks.len() + 1);
        for b in &self.blocks {
            for l in [&b.img_mod, &b.txt_mod] {
                let y = l.forward(&s)?;
                let n = y.dim(1)? / h;
                parts.push(y.reshape((n, h))?);
            }
        }
        parts.push(self.final_mod.forward(&s)?.reshape((2, h))?);
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// Forward of the image tokens in `rows` (every token for the full forward) with the
    /// text stream. `rows.width` is the grid's width in tokens; the grid's height is
    /// `rows.tokens / rows.width`.
    pub fn forward(
        &self,
        rows: Rows<'_>,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let cfg = &self.cfg;
        check_rows(&rows, "MMDiT", cfg.token_in(), cfg.kv_layers(), cfg.hidden)?;
        if cond.dims() != [cfg.cond_rows(), cfg.hidden] {
            return Err(ModelError::Input(format!(
                "MMDiT step conditioning must be {} x {}, got {:?}",
                cfg.cond_rows(),
                cfg.hidden,
                cond.dims()
            )));
        }
        let (n, nt) = (rows.ids.len(), context.dim(0)? - 1);
        check_text_cache(&rows, nt, cfg.depth, cfg.hidden)?;
        let pos = self.positions(&rows)?;
        // With a text cache the text stream is not computed (see [`Rows::text_cache`]).
        let cached = rows.text_cache;
        let qt = if cached.is_some() { 0 } else { nt };
        let mut pass = Pass::new(rows, cfg.heads, cfg.head_dim())?;
        let mut x = self.patch_in.forward(rows.x)?.add(&pos)?;
        let mut txt = context.narrow(0, 0, nt)?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let (mut tks, mut tvs) = (Vec::new(), Vec::new());
        let (mut c, mut layer) = (0, 0);
        for (bi, b) in self.blocks.iter().enumerate() {
            let last = bi + 1 == self.blocks.len();
            let xm = cond.narrow(0, c, if b.img2.is_some() { 9 } else { 6 })?;
            c += xm.dim(0)?;
            let tm = cond.narrow(0, c, if last { 2 } else { 6 })?;
            c += tm.dim(0)?;
            // (The dual attention below modulates the block's input too.)
            let x_in = x.clone();
            let xa = modulate(&x_in, &xm, 0)?;
            let [iq, ik, iv] = b.img.qkv(&xa, cfg)?;
            let (q, tk, tv) = match cached {
                Some((k, v)) => {
                    let shape = (nt, cfg.heads, cfg.head_dim());
                    (iq, k.i(bi)?.reshape(shape)?, v.i(bi)?.reshape(shape)?)
                }
                None => {
                    // The last block's text norm is the continuous one: (scale, shift).
                    let ta = if last {
                        affine(&layer_norm(&txt)?, &tm, 0, 1)?
                    } else {
                        modulate(&txt, &tm, 0)?
                    };
                    let [tq, tk, tv] = b.txt.qkv(&ta, cfg)?;
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
            ks.push(ik);
            vs.push(iv);
            tks.push(tk);
            tvs.push(tv);
            layer += 1;
            let img_out = b.img.out.as_ref().expect("image attention has an output");
            x = add_gated(&x, &img_out.forward(&out.narrow(0, qt, n)?)?, &xm.i(2)?)?;
            if let Some(a2) = &b.img2 {
                let [q2, k2, v2] = a2.qkv(&modulate(&x_in, &xm, 6)?, cfg)?;
                let o2 = pass.attend(Attention {
                    q: &q2,
                    k: &k2,
                    v: &v2,
                    nt: 0,
                    qt: 0,
                    layer,
                    saliency: false,
                })?;
                ks.push(k2);
                vs.push(v2);
                layer += 1;
                let o = a2.out.as_ref().expect("image attention has an output");
                x = add_gated(&x, &o.forward(&o2)?, &xm.i(8)?)?;
            }
            let f = b.ff.forward(&modulate(&x, &xm, 3)?)?;
            x = add_gated(&x, &f, &xm.i(5)?)?;
            if let (Some(tout), Some(ff), None) = (&b.txt.out, &b.ff_txt, cached) {
                txt = add_gated(&txt, &tout.forward(&out.narrow(0, 0, nt)?)?, &tm.i(2)?)?;
                let f = ff.forward(&modulate(&txt, &tm, 3)?)?;
                txt = add_gated(&txt, &f, &tm.i(5)?)?;
            }
        }
        // The final norm is the continuous one: (scale, shift).
        let fm = cond.narrow(0, c, 2)?;
        let velocity = self
            .final_linear
            .forward(&affine(&layer_norm(&x)?, &fm, 0, 1)?)?;
        let text = if cached.is_some() {
            None
        } else {
            Some((tks, tvs))
        };
        Ok(pass.finish(velocity, (ks, vs), text, self.blocks.len())?)
    }

    /// The first block's modulated image input of every token of `x` (`width` tokens a
    /// row): what whole-step caching watches.
    pub fn first_block_input(
        &self,
        x: &Tensor,
        width: usize,
        cond: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let tokens = x.dim(0)?;
        let ids: Vec<u32> = (0..tokens as u32).collect();
        let rows = Rows {
            x,
            ids: &ids,
            width,
            tokens,
            cache: None,
            patches: None,
            saliency: false,
            text_cache: None,
        };
        check_rows(
            &rows,
            "MMDiT",
            self.cfg.token_in(),
            self.cfg.kv_layers(),
            self.cfg.hidden,
        )?;
        let h = self.patch_in.forward(x)?.add(&self.positions(&rows)?)?;
        Ok(modulate(&h, &cond.narrow(0, 0, 2)?, 0)?)
    }

    /// The learned positions of the rows' tokens: the image's grid cropped from the centre
    /// of the `pos_max` square.
    fn positions(&self, rows: &Rows<'_>) -> Result<Tensor, ModelError> {
        let (w, hgt, m) = (rows.width, rows.tokens / rows.width, self.cfg.pos_max);
        if w > m || hgt > m {
            return Err(ModelError::Input(format!(
                "a {hgt} x {w} token grid exceeds this model's {m} x {m} positions"
            )));
        }
        let (top, left) = ((m - hgt) / 2, (m - w) / 2);
        let at: Vec<u32> = rows
            .ids
            .iter()
            .map(|&t| ((top + t as usize / w) * m + left + t as usize % w) as u32)
            .collect();
        let n = at.len();
        Ok(self
            .pos
            .index_select(&Tensor::from_vec(at, n, rows.x.device())?, 0)?)
    }
}

/// diffusers' `Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)` of `t`, in
/// f32 as it computes it: cosines then sines, `1 x dim`.
fn timestep_embedding(
    t: f32,
    dim: usize,
    dev: &candle_core::Device,
) -> candle_core::Result<Tensor> {
    let half = dim / 2;
    let l = -(10_000f64.ln() as f32);
    let mut v = vec![0f32; dim];
    for i in 0..half {
        let a = t * ((l * i as f32) / half as f32).exp();
        v[i] = a.cos();
        v[half + i] = a.sin();
    }
    Tensor::from_vec(v, (1, dim), dev)
}

impl JointModel for Mmdit {
    fn name(&self) -> &str {
        if self.config().qk_norm {
            "sd3.5"
        } else {
            "sd3"
        }
    }
    fn token_values(&self) -> usize {
        self.config().token_in()
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
        (self.config().context_in_dim, self.config().pooled_dim)
    }
    fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        Mmdit::context(self, txt, pooled)
    }
    fn step_cond(&self, context: &Tensor, t: f32, _: f32) -> Result<Tensor, ModelError> {
        Mmdit::step_cond(self, context, t)
    }
    fn forward(
        &self,
        rows: Rows<'_>,
        _frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        Mmdit::forward(self, rows, context, cond)
    }
    fn first_block_input(
        &self,
        x: &Tensor,
        width: usize,
        cond: &Tensor,
    ) -> Result<Tensor, ModelError> {
        Mmdit::first_block_input(self, x, width, cond)
    }
    /// Per image token: the patch embedding, every block's Q/K/V and output projections
    /// and MLP (8 D^2 + 16 D^2, D the width) with its attention over all N + T keys, a dual
    /// block's second attention (8 D^2 and N keys), and `proj_out`. Per step: the text
    /// stream's T rows through the same blocks (the last block only projects them to Q/K/V
    /// and attends). Every step: the time embedder and the modulation linears. The context
    /// and pooled-text embedders run once per request (the context), not per step.
    fn flops(&self, tokens: usize, text_tokens: usize) -> Option<crate::Flops> {
        let c = &self.cfg;
        let d = c.hidden as f64;
        let (n, t) = (tokens as f64, text_tokens as f64);
        let attend = 4.0 * d * (n + t);
        let dual = (0..c.depth).filter(|&b| c.is_dual(b)).count() as f64;
        let depth = c.depth as f64;
        let io_in = 2.0 * c.token_in() as f64 * d;
        let io_out = 2.0 * d * c.token_out() as f64;
        let mods = (c.cond_rows() as f64) * 2.0 * d * d;
        Some(crate::Flops {
            per_token: io_in
                + io_out
                + depth * (24.0 * d * d + attend)
                + dual * (8.0 * d * d + 4.0 * d * n),
            per_step: if c.depth == 0 {
                0.0
            } else {
                t * ((depth - 1.0) * (24.0 * d * d + attend) + 6.0 * d * d + attend)
            },
            every_step: 2.0 * 256.0 * d + 2.0 * d * d + mods,
            signal_per_token: io_in,
            counted: true,
        })
    }
    fn packing(&self) -> (usize, PixelIndex) {
        // A token holds its patch as (row, column, channel), the channel fastest.
        (self.config().patch, |k, dy, dx, p, c| (dy * p + dx) * c + k)
    }
}

/// SD3 / SD3.5 behind the `Denoiser` contract.
pub type Sd3Denoiser = JointDenoiser<Mmdit>;
