//! Wan2.1's text-to-video transformer with FlashDiff's token-subset forward, written from
//! diffusers' `WanTransformer3DModel` description and weight names: 3-D patches of the video
//! latent, 3-D rotary positions (frame, row, column), self-attention with RMS norms of Q
//! and K across heads, cross-attention to the umT5 text states, time modulation from a
//! shared projection plus a learned table per block.
//!
//! The patchable grid is the video tokens (frames x rows x columns, frame-major). A token
//! holds one `pt x ph x pw` patch in (frame, row, column, channel) order, the order the
//! model's output comes in; the patch embedding is reordered to read it. Self-attention
//! K/V (after the norms and RoPE) are cached per block; the text is only attended to, so
//! nothing of it is computed per token.

use candle_core::{IndexOp, Tensor};
use candle_nn::VarBuilder;

use crate::families::joint::denoiser::{JointDenoiser, JointModel, PixelIndex};
use crate::families::joint::{
    check_rows, layer_norm, lin, modulate, rope, rope_table, Attention, Lin, Pass,
};
pub use crate::families::joint::{JointOutput, Rows};
use crate::io::shards::{Checkpoint, Shards, Source};
use crate::ModelError;
use flashdiff_kernels::ops::{add_gated, flash_attention, gelu_tanh_inplace};

/// The architecture's sizes (diffusers' `WanTransformer3DModel` config).
#[derive(Debug, Clone, PartialEq)]
pub struct WanConfig {
    /// Patch in (frames, rows, columns) of latent pixels: (1, 2, 2).
    pub patch: [usize; 3],
    /// Latent channels in (16).
    pub in_channels: usize,
    /// Latent channels out.
    pub out_channels: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of one head (128).
    pub head_dim: usize,
    /// Blocks.
    pub depth: usize,
    /// Feed-forward width.
    pub ffn_dim: usize,
    /// Width of the text states (umT5-XXL: 4096).
    pub text_dim: usize,
    /// Width of the sinusoidal time features (256).
    pub freq_dim: usize,
    /// LayerNorm with affine parameters before the cross-attention (Wan2.1: yes).
    pub cross_attn_norm: bool,
}

impl WanConfig {
    /// Wan2.1 T2V 1.3B.
    pub fn t2v_1_3b() -> Self {
        Self {
            patch: [1, 2, 2],
            in_channels: 16,
            out_channels: 16,
            heads: 12,
            head_dim: 128,
            depth: 30,
            ffn_dim: 8960,
            text_dim: 4096,
            freq_dim: 256,
            cross_attn_norm: true,
        }
    }

    /// Wan2.1 T2V 14B.
    pub fn t2v_14b() -> Self {
        Self {
            heads: 40,
            depth: 40,
            ffn_dim: 13824,
            ..Self::t2v_1_3b()
        }
    }

    /// Transformer width.
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Values per latent token.
    pub fn token_in(&self) -> usize {
        self.patch.iter().product::<usize>() * self.in_channels
    }

    /// RoPE widths of (frame, row, column) in a head, as Wan splits it.
    pub fn axes_dim(&self) -> [usize; 3] {
        let hw = 2 * (self.head_dim / 6);
        [self.head_dim - 2 * hw, hw, hw]
    }

    /// Checks what the forward relies on, with the reason.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Input(format!("Wan config: {m}")));
        if self.heads == 0 || self.head_dim < 6 || self.depth == 0 {
            return bad("heads, depth and a head width of at least 6 are needed".into());
        }
        if self.axes_dim().iter().any(|a| a % 2 != 0) {
            return bad(format!(
                "head width {} splits into odd RoPE axes {:?}",
                self.head_dim,
                self.axes_dim()
            ));
        }
        if self.patch.contains(&0) || self.freq_dim % 2 != 0 {
            return bad("patch sides must be positive and the time features even".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Block {
    table: Tensor,
    q: Lin,
    k: Lin,
    v: Lin,
    out: Lin,
    q_norm: Tensor,
    k_norm: Tensor,
    cq: Lin,
    ck: Lin,
    cv: Lin,
    cout: Lin,
    cq_norm: Tensor,
    ck_norm: Tensor,
    norm2: Option<(Tensor, Tensor)>,
    ff_in: Lin,
    ff_out: Lin,
}

/// Wan2.1's transformer.
#[derive(Debug, Clone)]
pub struct Wan {
    cfg: WanConfig,
    patch_in: Lin,
    time1: Lin,
    time2: Lin,
    time_proj: Lin,
    text1: Lin,
    text2: Lin,
    blocks: Vec<Block>,
    out_table: Tensor,
    proj_out: Lin,
}

impl Wan {
    /// Loads the transformer from tensors named as in diffusers' `WanTransformer3DModel`.
    pub fn load(cfg: WanConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        cfg.validate()?;
        let (h, [pt, ph, pw], c) = (cfg.hidden(), cfg.patch, cfg.in_channels);
        let conv = get("patch_embedding.weight", &[h, c, pt, ph, pw])?;
        let patch_in = Lin {
            w: conv
                .permute((0, 2, 3, 4, 1))?
                .reshape((h, cfg.token_in()))?
                .contiguous()?,
            b: Some(get("patch_embedding.bias", &[h])?),
        };
        let blocks = (0..cfg.depth)
            .map(|i| {
                let p = format!("blocks.{i}");
                let l =
                    |n: &str, inp: usize, out: usize| lin(get, &format!("{p}.{n}"), inp, out, true);
                let w = |n: &str| get(&format!("{p}.{n}.weight"), &[h]);
                Ok(Block {
                    table: get(&format!("{p}.scale_shift_table"), &[1, 6, h])?.squeeze(0)?,
                    q: l("attn1.to_q", h, h)?,
                    k: l("attn1.to_k", h, h)?,
                    v: l("attn1.to_v", h, h)?,
                    out: l("attn1.to_out.0", h, h)?,
                    q_norm: w("attn1.norm_q")?,
                    k_norm: w("attn1.norm_k")?,
                    cq: l("attn2.to_q", h, h)?,
                    ck: l("attn2.to_k", h, h)?,
                    cv: l("attn2.to_v", h, h)?,
                    cout: l("attn2.to_out.0", h, h)?,
                    cq_norm: w("attn2.norm_q")?,
                    ck_norm: w("attn2.norm_k")?,
                    norm2: if cfg.cross_attn_norm {
                        Some((w("norm2")?, get(&format!("{p}.norm2.bias"), &[h])?))
                    } else {
                        None
                    },
                    ff_in: l("ffn.net.0.proj", h, cfg.ffn_dim)?,
                    ff_out: l("ffn.net.2", cfg.ffn_dim, h)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let ce = "condition_embedder";
        Ok(Self {
            patch_in,
            time1: lin(
                get,
                &format!("{ce}.time_embedder.linear_1"),
                cfg.freq_dim,
                h,
                true,
            )?,
            time2: lin(get, &format!("{ce}.time_embedder.linear_2"), h, h, true)?,
            time_proj: lin(get, &format!("{ce}.time_proj"), h, 6 * h, true)?,
            text1: lin(
                get,
                &format!("{ce}.text_embedder.linear_1"),
                cfg.text_dim,
                h,
                true,
            )?,
            text2: lin(get, &format!("{ce}.text_embedder.linear_2"), h, h, true)?,
            blocks,
            out_table: get("scale_shift_table", &[1, 2, h])?.squeeze(0)?,
            proj_out: lin(
                get,
                "proj_out",
                h,
                cfg.patch.iter().product::<usize>() * cfg.out_channels,
                true,
            )?,
            cfg,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &WanConfig {
        &self.cfg
    }

    /// A request's context: the text states through the text embedder, `n x hidden`.
    pub fn context(&self, text: &Tensor) -> Result<Tensor, ModelError> {
        if text.dims().len() != 2 || text.dim(1)? != self.cfg.text_dim {
            return Err(ModelError::Input(format!(
                "Wan text states must be n x {}, got {:?}",
                self.cfg.text_dim,
                text.dims()
            )));
        }
        Ok(self.text2.forward(&self.text1.forward(text)?.gelu()?)?)
    }

    /// The conditioning of time `t` (what diffusers passes as `timestep`, 0-1000): the time
    /// embedding (row 0) then its six-fold projection (rows 1-6), `7 x hidden`.
    pub fn step_cond(&self, t: f32, dev: &candle_core::Device) -> Result<Tensor, ModelError> {
        let half = self.cfg.freq_dim / 2;
        let l = -(10_000f64.ln() as f32);
        let mut v = vec![0f32; 2 * half];
        for i in 0..half {
            let a = t * ((l * i as f32) / half as f32).exp();
            v[i] = a.cos();
            v[half + i] = a.sin();
        }
        let f = Tensor::from_vec(v, (1, 2 * half), dev)?;
        let temb = self.time2.forward(&self.time1.forward(&f)?.silu()?)?;
        let proj = self
            .time_proj
            .forward(&temb.silu()?)?
            .reshape((6, self.cfg.hidden()))?;
        Ok(Tensor::cat(&[temb, proj], 0)?)
    }

    /// The first block's modulated input of every token of `x`: what whole-step caching
    /// watches.
    pub fn first_block_input(&self, x: &Tensor, cond: &Tensor) -> Result<Tensor, ModelError> {
        let m = self.blocks[0].table.add(&cond.narrow(0, 1, 6)?)?;
        Ok(modulate(&self.patch_in.forward(x)?, &m, 0)?)
    }

    /// Forward of the video tokens in `rows` (every token for the full forward) on a grid of
    /// `frames` x (`rows.tokens / frames / rows.width`) x `rows.width` tokens.
    pub fn forward(
        &self,
        rows: Rows<'_>,
        frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let cfg = &self.cfg;
        let (h, hd, heads) = (cfg.hidden(), cfg.head_dim, cfg.heads);
        check_rows(&rows, "Wan", cfg.token_in(), cfg.depth, h)?;
        let per_frame = rows.tokens / frames.max(1);
        if frames == 0 || per_frame * frames != rows.tokens {
            return Err(ModelError::Input(format!(
                "{} tokens are not {frames} equal frames",
                rows.tokens
            )));
        }
        if cond.dims() != [7, h] {
            return Err(ModelError::Input(format!(
                "Wan step conditioning must be 7 x {h}, got {:?}",
                cond.dims()
            )));
        }
        let (n, w) = (rows.ids.len(), rows.width);
        let dev = rows.x.device().clone();
        let pe = rope_table(
            cfg.axes_dim(),
            10_000.0,
            rows.ids.iter().map(|&t| {
                let t = t as usize;
                let (f, r) = (t / per_frame, t % per_frame);
                [f as f32, (r / w) as f32, (r % w) as f32]
            }),
            &dev,
        )?;
        let ne = context.dim(0)?;
        let mut x = self.patch_in.forward(rows.x)?;
        let mut pass = Pass::new(rows, heads, hd)?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let proj = cond.narrow(0, 1, 6)?;
        let mut saliency: Option<Tensor> = None;
        let scale = 1.0 / (hd as f64).sqrt();
        for (layer, b) in self.blocks.iter().enumerate() {
            let m = b.table.add(&proj)?;
            let a = modulate(&x, &m, 0)?;
            let heads_of = |t: Tensor, r: usize| t.reshape((r, heads, hd));
            let q = rope(&heads_of(rms(&b.q.forward(&a)?, &b.q_norm)?, n)?, &pe)?;
            let k = rope(&heads_of(rms(&b.k.forward(&a)?, &b.k_norm)?, n)?, &pe)?;
            let v = heads_of(b.v.forward(&a)?, n)?;
            let o = pass.attend(Attention {
                q: &q,
                k: &k,
                v: &v,
                nt: 0,
                qt: 0,
                layer,
                saliency: false,
            })?;
            ks.push(k);
            vs.push(v);
            x = add_gated(&x, &b.out.forward(&o)?, &m.i(2)?)?;
            // Cross-attention to the text.
            let a = match &b.norm2 {
                Some((g, bias)) => layer_norm(&x)?.broadcast_mul(g)?.broadcast_add(bias)?,
                None => x.clone(),
            };
            let (cq, ck, cv) = (
                rms(&b.cq.forward(&a)?, &b.cq_norm)?,
                rms(&b.ck.forward(context)?, &b.ck_norm)?,
                b.cv.forward(context)?,
            );
            let o = if pass.rows.saliency {
                // The saliency map reads the probabilities: the composed form.
                let by_head = |t: Tensor, r: usize| -> candle_core::Result<Tensor> {
                    heads_of(t, r)?.transpose(0, 1)?.contiguous()
                };
                let (cq, ck, cv) = (by_head(cq, n)?, by_head(ck, ne)?, by_head(cv, ne)?);
                let p = candle_nn::ops::softmax_last_dim(&(cq.matmul(&ck.t()?)? * scale)?)?;
                let s = p.mean(0)?;
                saliency = Some(match saliency {
                    Some(acc) => acc.add(&s)?,
                    None => s,
                });
                p.matmul(&cv)?.transpose(0, 1)?.reshape((n, h))?
            } else {
                flash_attention(&cq, &ck, &cv, heads)?
            };
            x = x.add(&b.cout.forward(&o)?)?;
            let f = b
                .ff_out
                .forward(&gelu_tanh_inplace(b.ff_in.forward(&modulate(&x, &m, 3)?)?)?)?;
            x = add_gated(&x, &f, &m.i(5)?)?;
        }
        // The output modulation adds the time embedding itself (row 0), not its projection.
        let m = self.out_table.broadcast_add(&cond.i(0)?)?;
        let velocity = self.proj_out.forward(&modulate(&x, &m, 0)?)?;
        let mut out = pass.finish(velocity, (ks, vs), None, 1)?;
        out.saliency = match saliency {
            Some(s) => Some((s / self.blocks.len() as f64)?),
            None => None,
        };
        Ok(out)
    }
}

/// RMS norm over the whole row (across heads), eps 1e-6.
fn rms(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::rms_norm(&x.contiguous()?, w, 1e-6)
}

/// How a Wan checkpoint names its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WanLayout {
    /// diffusers' `WanTransformer3DModel` (a `transformer/` folder).
    Diffusers,
    /// Wan-AI's own files (`blocks.N.self_attn.q.weight`, ...), after a prefix
    /// (`model.diffusion_model.` in ComfyUI's repackaging, "" in the originals).
    Official {
        /// Prefix before every name.
        prefix: String,
    },
}

/// One or more safetensors files holding a Wan2.1 transformer.
pub type WanCheckpoint = Checkpoint<WanLayout>;

impl Checkpoint<WanLayout> {
    /// Opens a safetensors file or a folder of shards.
    pub fn open(path: &std::path::Path) -> Result<Self, ModelError> {
        let files = Shards::open(path)?;
        let layout = match files.naming(
            path,
            "a Wan",
            &["blocks.0.attn1.to_q.weight"],
            ("blocks.0.self_attn.q.weight", "Wan-AI"),
        )? {
            None => WanLayout::Diffusers,
            Some(prefix) => WanLayout::Official { prefix },
        };
        let named = layout.clone();
        Ok(Self::new(files, layout, move |name| {
            layout_source(&named, name)
        }))
    }

    /// The architecture, from the tensors' shapes; the head count cannot be read from them
    /// (Q/K norms span every head): `heads`, or heads of 128 as in every released Wan2.1.
    pub fn config(&self, heads: Option<usize>) -> Result<WanConfig, ModelError> {
        let what = format!("Wan checkpoint, {:?} layout", self.layout());
        let need = |n: &str, rank: usize| self.weights().need(n, rank, &what);
        let conv = need("patch_embedding.weight", 5)?;
        let (hidden, in_channels, patch) = (conv[0], conv[1], [conv[2], conv[3], conv[4]]);
        let heads = heads.unwrap_or(hidden / 128).max(1);
        if hidden % heads != 0 {
            return Err(ModelError::Input(format!(
                "Wan checkpoint: width {hidden} is not a multiple of {heads} heads"
            )));
        }
        let depth = (0..)
            .take_while(|i| {
                self.weights()
                    .shape(&format!("blocks.{i}.attn1.to_q.weight"))
                    .is_some()
            })
            .count();
        let cfg = WanConfig {
            patch,
            in_channels,
            out_channels: need("proj_out.weight", 2)?[0] / patch.iter().product::<usize>(),
            heads,
            head_dim: hidden / heads,
            depth,
            ffn_dim: need("blocks.0.ffn.net.0.proj.weight", 2)?[0],
            text_dim: need("condition_embedder.text_embedder.linear_1.weight", 2)?[1],
            freq_dim: need("condition_embedder.time_embedder.linear_1.weight", 2)?[1],
            cross_attn_norm: self.weights().shape("blocks.0.norm2.weight").is_some(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The transformer on `dev` (`heads`: see [`WanCheckpoint::config`]).
    pub fn load(&self, heads: Option<usize>, dev: &candle_core::Device) -> Result<Wan, ModelError> {
        self.load_in(heads, candle_core::DType::F32, dev)
    }

    /// [`WanCheckpoint::load`] with the linear layers' weights in `compute` (F32, BF16 or
    /// F16), read in that dtype; everything else f32.
    pub fn load_in(
        &self,
        heads: Option<usize>,
        compute: candle_core::DType,
        dev: &candle_core::Device,
    ) -> Result<Wan, ModelError> {
        crate::io::shards::dtype_for("", &[], compute)?;
        let vb = self.weights().var_builder(compute, dev);
        Wan::load(self.config(heads)?, &vb)
    }
}

/// Where a checkpoint of `layout` keeps diffusers' tensor `name`.
fn layout_source(layout: &WanLayout, name: &str) -> Source {
    match layout {
        WanLayout::Diffusers => Source::One(name.into()),
        WanLayout::Official { prefix } => Source::One(format!("{prefix}{}", official_name(name))),
    }
}

/// Wan-AI's name for diffusers' tensor `name`.
fn official_name(name: &str) -> String {
    if name == "scale_shift_table" {
        return "head.modulation".into();
    }
    const PARTS: [(&str, &str); 16] = [
        (
            "condition_embedder.time_embedder.linear_1",
            "time_embedding.0",
        ),
        (
            "condition_embedder.time_embedder.linear_2",
            "time_embedding.2",
        ),
        (
            "condition_embedder.text_embedder.linear_1",
            "text_embedding.0",
        ),
        (
            "condition_embedder.text_embedder.linear_2",
            "text_embedding.2",
        ),
        ("condition_embedder.time_proj", "time_projection.1"),
        (".attn1.", ".self_attn."),
        (".attn2.", ".cross_attn."),
        (".to_q.", ".q."),
        (".to_k.", ".k."),
        (".to_v.", ".v."),
        (".to_out.0.", ".o."),
        (".norm2.", ".norm3."),
        (".scale_shift_table", ".modulation"),
        (".ffn.net.0.proj.", ".ffn.0."),
        (".ffn.net.2.", ".ffn.2."),
        ("proj_out.", "head.head."),
    ];
    PARTS
        .iter()
        .fold(name.to_string(), |n, (a, b)| n.replace(a, b))
}

impl JointModel for Wan {
    fn name(&self) -> &str {
        "wan2.1"
    }
    fn token_values(&self) -> usize {
        self.config().token_in()
    }
    fn kv_layers(&self) -> usize {
        self.config().depth
    }
    fn hidden(&self) -> usize {
        self.config().hidden()
    }
    fn cond_rows(&self) -> usize {
        7
    }
    /// Wan reads no pooled vector: its width is 0 and the context's pooled row is zeros.
    fn text_widths(&self) -> (usize, usize) {
        (self.config().text_dim, 0)
    }
    fn context(&self, txt: &Tensor, _pooled: &Tensor) -> Result<Tensor, ModelError> {
        let t = Wan::context(self, txt)?;
        let zero = Tensor::zeros((1, self.hidden()), t.dtype(), t.device())?;
        Ok(Tensor::cat(&[t, zero], 0)?)
    }
    /// Wan's time runs 0-1000.
    fn step_cond(&self, context: &Tensor, t: f32, _: f32) -> Result<Tensor, ModelError> {
        Wan::step_cond(self, t * 1000.0, context.device())
    }
    fn forward(
        &self,
        rows: Rows<'_>,
        frames: usize,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<JointOutput, ModelError> {
        let nt = context
            .dim(0)?
            .checked_sub(1)
            .ok_or_else(|| ModelError::Input("Wan context without its pooled row".into()))?;
        Wan::forward(self, rows, frames, &context.narrow(0, 0, nt)?, cond)
    }
    fn first_block_input(&self, x: &Tensor, _: usize, cond: &Tensor) -> Result<Tensor, ModelError> {
        Wan::first_block_input(self, x, cond)
    }
    /// A token's (row, column) latent pixels of its first latent frame (Wan2.1 patches one
    /// latent frame per token).
    /// The text is only attended to: its cross-attention keys and values (two projections
    /// of each text token per block, against a latent row's full block) are not counted.
    fn fixed_rows(&self, _text_tokens: usize) -> usize {
        0
    }
    /// Per video token: the patch embedding, every block's self-attention (Q/K/V and output
    /// projections, 8 D^2, D the width, and N keys), cross-attention queries and output
    /// (4 D^2, T text keys) and feed-forward (4 D F, F its width), and `proj_out`. Per
    /// step: every block's cross-attention keys and values of the T text tokens. Every
    /// step: the time embedder and its six-fold projection. The text embedder runs once per
    /// request (the context), not per step.
    fn flops(&self, tokens: usize, text_tokens: usize) -> Option<crate::Flops> {
        let c = self.config();
        let d = c.hidden() as f64;
        let (n, t) = (tokens as f64, text_tokens as f64);
        let depth = c.depth as f64;
        let io_in = 2.0 * c.token_in() as f64 * d;
        let block =
            8.0 * d * d + 4.0 * d * n + 4.0 * d * d + 4.0 * d * t + 4.0 * d * c.ffn_dim as f64;
        Some(crate::Flops {
            per_token: io_in
                + depth * block
                + 2.0 * d * (c.patch.iter().product::<usize>() * c.out_channels) as f64,
            per_step: depth * t * 4.0 * d * d,
            every_step: 2.0 * c.freq_dim as f64 * d + 2.0 * d * d + 12.0 * d * d,
            signal_per_token: io_in,
            counted: true,
        })
    }
    fn packing(&self) -> (usize, PixelIndex) {
        (self.config().patch[1], |k, dy, dx, p, c| {
            (dy * p + dx) * c + k
        })
    }
}

/// Wan2.1 behind the `Denoiser` contract.
pub type WanDenoiser = JointDenoiser<Wan>;
