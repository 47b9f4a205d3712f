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

use candle_core::{Device, IndexOp, Tensor, D};

use crate::ModelError;

mod load;
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
    /// FLUX.1 [dev].
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

    /// FLUX.1 [schnell]: dev without the guidance embedding.
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

/// A linear layer `y = x W^T + b` on rows.
#[derive(Debug, Clone)]
struct Lin {
    w: Tensor,
    b: Option<Tensor>,
}

impl Lin {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let y = x.matmul(&self.w.t()?)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// Where the weights come from: a tensor by name, checked against its shape.
pub type TensorSource<'a> = dyn Fn(&str, &[usize]) -> Result<Tensor, ModelError> + 'a;

fn lin(
    get: &TensorSource,
    name: &str,
    inp: usize,
    out: usize,
    bias: bool,
) -> Result<Lin, ModelError> {
    Ok(Lin {
        w: get(&format!("{name}.weight"), &[out, inp])?,
        b: if bias {
            Some(get(&format!("{name}.bias"), &[out])?)
        } else {
            None
        },
    })
}

/// Two-layer SiLU MLP embedder (`in_layer`, `out_layer`).
#[derive(Debug, Clone)]
struct Embedder {
    inp: Lin,
    out: Lin,
}

impl Embedder {
    fn load(get: &TensorSource, name: &str, inp: usize, h: usize) -> Result<Self, ModelError> {
        Ok(Self {
            inp: lin(get, &format!("{name}.in_layer"), inp, h, true)?,
            out: lin(get, &format!("{name}.out_layer"), h, h, true)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.inp.forward(x)?.silu()?)
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

/// Output of [`Flux::forward`].
#[derive(Debug)]
pub struct FluxOutput {
    /// Velocity of the computed image tokens, `n x in_channels`.
    pub velocity: Tensor,
    /// Their fresh keys, `kv_layers x n x hidden`.
    pub k: Tensor,
    /// Their fresh values, same shape.
    pub v: Tensor,
    /// When asked for: attention of each computed image token to each text token, averaged
    /// over heads and the double blocks, `n x text_tokens`.
    pub saliency: Option<Tensor>,
    /// When patches are given: each computed image token's attention mass into each patch,
    /// averaged over heads and every block, `n x patches`.
    pub patch_mass: Option<Tensor>,
}

/// The image tokens a forward computes and where it finds the others.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// Their noisy values, `n x in_channels`, in the order of `ids`.
    pub x: &'a Tensor,
    /// Ascending token ids (row-major over the grid).
    pub ids: &'a [u32],
    /// Grid width in tokens (positions: row = id / width, column = id % width).
    pub width: usize,
    /// Image tokens in the latent.
    pub tokens: usize,
    /// Cached keys and values of every image token (`kv_layers x tokens x hidden`), for
    /// those not in `ids`; `None`: the rows attend only to each other and the text.
    pub cache: Option<(&'a Tensor, &'a Tensor)>,
    /// Patch of every image token and the patch count, for the per-patch attention mass.
    pub patches: Option<(&'a [u32], usize)>,
    /// Whether to return the image-to-text saliency.
    pub saliency: bool,
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
}

/// Queries per block of attention: bounds the score matrix at `QUERY_BLOCK x keys` per head.
const QUERY_BLOCK: usize = 512;

impl Flux {
    /// Loads the transformer from tensors named as in Black Forest Labs' checkpoints. A
    /// missing or mis-shaped tensor is the source's error (it names the key and shapes).
    pub fn load(cfg: FluxConfig, get: &TensorSource) -> Result<Self, ModelError> {
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
            time_in: Embedder::load(get, "time_in", 256, h)?,
            vector_in: Embedder::load(get, "vector_in", cfg.vec_in_dim, h)?,
            guidance_in: if cfg.guidance_embed {
                Some(Embedder::load(get, "guidance_in", 256, h)?)
            } else {
                None
            },
            double,
            single,
            final_mod: lin(get, "final_layer.adaLN_modulation.1", h, 2 * h, true)?,
            final_linear: lin(get, "final_layer.linear", h, cfg.in_channels, true)?,
            cfg,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &FluxConfig {
        &self.cfg
    }

    /// A request's context from the text encoders' outputs: `txt_in(txt)` (`text_tokens x
    /// hidden`) with `vector_in(pooled)` as one more row, `(text_tokens + 1) x hidden`.
    pub fn context(&self, txt: &Tensor, pooled: &Tensor) -> Result<Tensor, ModelError> {
        let (_, w) = txt.dims2()?;
        if w != self.cfg.context_in_dim || pooled.dims1()? != self.cfg.vec_in_dim {
            return Err(ModelError::Input(format!(
                "FLUX text states must be n x {} and the pooled vector {} wide; got {:?} and {:?}",
                self.cfg.context_in_dim,
                self.cfg.vec_in_dim,
                txt.dims(),
                pooled.dims()
            )));
        }
        let t = self.txt_in.forward(txt)?;
        let y = self.vector_in.forward(&pooled.unsqueeze(0)?)?;
        Ok(Tensor::cat(&[t, y], 0)?)
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

    /// Forward of the image tokens in `rows` (every image token for the full forward) with
    /// the text stream, given a request's `context` and a step's `cond`.
    pub fn forward(
        &self,
        rows: Rows<'_>,
        context: &Tensor,
        cond: &Tensor,
    ) -> Result<FluxOutput, ModelError> {
        let cfg = &self.cfg;
        let (n, tokens) = (rows.ids.len(), rows.tokens);
        let dev = rows.x.device().clone();
        check_rows(&rows, cfg)?;
        let all = n == tokens;
        let nt = context.dim(0)? - 1;
        if cond.dims() != [cfg.cond_rows(), cfg.hidden] {
            return Err(ModelError::Input(format!(
                "FLUX step conditioning must be {} x {}, got {:?}",
                cfg.cond_rows(),
                cfg.hidden,
                cond.dims()
            )));
        }
        // Keys of image tokens: fresh rows where computed, the cache elsewhere (gathered
        // from [cache rows; fresh rows] by one index per token).
        let gather = match (rows.cache, all) {
            (Some(_), false) => {
                let mut at: Vec<u32> = (0..tokens as u32).collect();
                for (i, &t) in rows.ids.iter().enumerate() {
                    at[t as usize] = (tokens + i) as u32;
                }
                Some(Tensor::from_vec(at, tokens, &dev)?)
            }
            _ => None,
        };
        let img_pe = rope_table(
            cfg,
            rows.ids.iter().map(|&t| {
                [
                    0.0,
                    (t as usize / rows.width) as f32,
                    (t as usize % rows.width) as f32,
                ]
            }),
            &dev,
        )?;
        let txt_pe = rope_table(cfg, (0..nt).map(|_| [0.0f32; 3]), &dev)?;
        let pe = (
            Tensor::cat(&[&txt_pe.0, &img_pe.0], 0)?,
            Tensor::cat(&[&txt_pe.1, &img_pe.1], 0)?,
        );
        let onehot = match rows.patches {
            Some((of, p)) => Some(one_hot(of, p, &dev)?),
            None => None,
        };
        let mut acc = Acc::default();
        let mut ks = Vec::with_capacity(cfg.kv_layers());
        let mut vs = Vec::with_capacity(cfg.kv_layers());
        let mut img = self.img_in.forward(rows.x)?;
        let mut txt = context.narrow(0, 0, nt)?;
        let mut layer = 0;
        let mut c = 0;
        for b in &self.double {
            let im = cond.narrow(0, c, 6)?;
            let tm = cond.narrow(0, c + 6, 6)?;
            c += 12;
            let (iq, ik, iv) = qkv(&b.img.attn, &modulate(&img, &im, 0)?, cfg)?;
            let (tq, tk, tv) = qkv(&b.txt.attn, &modulate(&txt, &tm, 0)?, cfg)?;
            let q = rope(&Tensor::cat(&[&tq, &iq], 0)?, &pe)?;
            let k = rope(&Tensor::cat(&[&tk, &ik], 0)?, &pe)?;
            let v = Tensor::cat(&[&tv, &iv], 0)?;
            let out = self.attend(
                &q,
                &k,
                &v,
                nt,
                &rows,
                gather.as_ref(),
                layer,
                true,
                &onehot,
                &mut acc,
            )?;
            ks.push(k.narrow(0, nt, n)?);
            vs.push(v.narrow(0, nt, n)?);
            let (ta, ia) = (out.narrow(0, 0, nt)?, out.narrow(0, nt, n)?);
            img = stream_rest(&b.img, &img, &ia, &im)?;
            txt = stream_rest(&b.txt, &txt, &ta, &tm)?;
            layer += 1;
        }
        let mut x = Tensor::cat(&[&txt, &img], 0)?;
        let (h, m) = (cfg.hidden, cfg.mlp_hidden());
        for b in &self.single {
            let md = cond.narrow(0, c, 3)?;
            c += 3;
            let y = b.linear1.forward(&modulate(&x, &md, 0)?)?;
            let rows_all = nt + n;
            let split = |i: usize| {
                y.narrow(1, i * h, h)?
                    .reshape((rows_all, cfg.heads, cfg.head_dim()))
            };
            let q = rope(&rms(&split(0)?, &b.q_norm)?, &pe)?;
            let k = rope(&rms(&split(1)?, &b.k_norm)?, &pe)?;
            let v = split(2)?;
            let out = self.attend(
                &q,
                &k,
                &v,
                nt,
                &rows,
                gather.as_ref(),
                layer,
                false,
                &onehot,
                &mut acc,
            )?;
            ks.push(k.narrow(0, nt, n)?);
            vs.push(v.narrow(0, nt, n)?);
            let mlp = y.narrow(1, 3 * h, m)?.gelu()?;
            let o = b.linear2.forward(&Tensor::cat(&[&out, &mlp], 1)?)?;
            x = x.add(&o.broadcast_mul(&md.i(2)?)?)?;
            layer += 1;
        }
        let img = x.narrow(0, nt, n)?;
        let fm = cond.narrow(0, c, 2)?;
        // The final layer's chunks are (shift, scale).
        let y = layer_norm(&img)?
            .broadcast_mul(&(fm.i(1)? + 1.0)?)?
            .broadcast_add(&fm.i(0)?)?;
        let velocity = self.final_linear.forward(&y)?;
        let flat = |t: Vec<Tensor>| -> candle_core::Result<Tensor> {
            Tensor::stack(&t, 0)?.reshape((cfg.kv_layers(), n, h))
        };
        let saliency = match acc.saliency {
            Some(s) if rows.saliency => Some((s / self.double.len().max(1) as f64)?),
            _ => None,
        };
        let patch_mass = match acc.mass {
            Some(s) => Some((s / cfg.kv_layers() as f64)?),
            None => None,
        };
        Ok(FluxOutput {
            velocity,
            k: flat(ks)?,
            v: flat(vs)?,
            saliency,
            patch_mass,
        })
    }

    /// Joint attention of `q` (text rows then the computed image rows, heads split) over
    /// the text keys and every image token's keys (fresh or cached at `layer`). Returns
    /// `rows x hidden` and accumulates the statistics asked for.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        nt: usize,
        rows: &Rows<'_>,
        gather: Option<&Tensor>,
        layer: usize,
        double: bool,
        onehot: &Option<Tensor>,
        acc: &mut Acc,
    ) -> Result<Tensor, ModelError> {
        let cfg = &self.cfg;
        let n = rows.ids.len();
        let (k, v) = match (gather, rows.cache) {
            (Some(at), Some((ck, cv))) => {
                let full = |fresh: &Tensor, cache: &Tensor| -> candle_core::Result<Tensor> {
                    let c = cache
                        .i(layer)?
                        .reshape((rows.tokens, cfg.heads, cfg.head_dim()))?;
                    let img =
                        Tensor::cat(&[&c, &fresh.narrow(0, nt, n)?], 0)?.index_select(at, 0)?;
                    Tensor::cat(&[&fresh.narrow(0, 0, nt)?, &img], 0)
                };
                (full(k, ck)?, full(v, cv)?)
            }
            _ => (k.clone(), v.clone()),
        };
        // (heads, rows, head_dim)
        let q = q.transpose(0, 1)?.contiguous()?;
        let kt = k.transpose(0, 1)?.transpose(1, 2)?.contiguous()?;
        let v = v.transpose(0, 1)?.contiguous()?;
        let scale = 1.0 / (cfg.head_dim() as f64).sqrt();
        let total = q.dim(1)?;
        let mut outs = Vec::with_capacity(total.div_ceil(QUERY_BLOCK));
        let mut start = 0;
        while start < total {
            let len = QUERY_BLOCK.min(total - start);
            let p = candle_nn::ops::softmax_last_dim(
                &(q.narrow(1, start, len)?.matmul(&kt)? * scale)?,
            )?;
            outs.push(p.matmul(&v)?);
            // Statistics of the image rows in this block (rows nt.. of q).
            let lo = start.max(nt);
            if lo < start + len {
                let img = p.narrow(1, lo - start, start + len - lo)?.mean(0)?;
                let keys = img.dim(1)?;
                if double && rows.saliency {
                    acc.add_saliency(lo - nt, img.narrow(1, 0, nt)?, n)?;
                }
                if let Some(oh) = onehot {
                    // Only over the whole latent's image keys (a cache, or every token).
                    if keys - nt == rows.tokens {
                        acc.add_mass(lo - nt, img.narrow(1, nt, rows.tokens)?.matmul(oh)?, n)?;
                    }
                }
            }
            start += len;
        }
        let o = Tensor::cat(&outs, 1)?; // heads x rows x hd
        Ok(o.transpose(0, 1)?.reshape((total, cfg.hidden))?)
    }
}

/// Per-block statistics summed over layers, one row per computed image token.
#[derive(Default)]
struct Acc {
    saliency: Option<Tensor>,
    mass: Option<Tensor>,
    // Rows gathered for the current layer before they are summed into the totals.
    sal_parts: Vec<(usize, Tensor)>,
    mass_parts: Vec<(usize, Tensor)>,
}

impl Acc {
    fn add_saliency(&mut self, at: usize, t: Tensor, n: usize) -> candle_core::Result<()> {
        Self::add(&mut self.sal_parts, &mut self.saliency, at, t, n)
    }

    fn add_mass(&mut self, at: usize, t: Tensor, n: usize) -> candle_core::Result<()> {
        Self::add(&mut self.mass_parts, &mut self.mass, at, t, n)
    }

    /// Collects a layer's row blocks; when they cover all `n` rows, adds them to the total.
    fn add(
        parts: &mut Vec<(usize, Tensor)>,
        total: &mut Option<Tensor>,
        at: usize,
        t: Tensor,
        n: usize,
    ) -> candle_core::Result<()> {
        parts.push((at, t));
        let covered: usize = parts.iter().map(|(_, t)| t.dim(0).unwrap_or(0)).sum();
        if covered < n {
            return Ok(());
        }
        parts.sort_by_key(|(a, _)| *a);
        let layer = Tensor::cat(&parts.drain(..).map(|(_, t)| t).collect::<Vec<_>>(), 0)?;
        *total = Some(match total.take() {
            Some(s) => s.add(&layer)?,
            None => layer,
        });
        Ok(())
    }
}

fn check_rows(rows: &Rows<'_>, cfg: &FluxConfig) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Input(m));
    let n = rows.ids.len();
    if n == 0 {
        return bad("a FLUX forward needs at least one image token".into());
    }
    if rows.width == 0 || rows.tokens % rows.width != 0 {
        return bad(format!(
            "grid width {} does not divide {} tokens",
            rows.width, rows.tokens
        ));
    }
    if rows.x.dims() != [n, cfg.in_channels] {
        return bad(format!(
            "FLUX image rows must be {n} x {}, got {:?}",
            cfg.in_channels,
            rows.x.dims()
        ));
    }
    if rows.ids.windows(2).any(|w| w[0] >= w[1]) || rows.ids[n - 1] as usize >= rows.tokens {
        return bad(format!(
            "token ids must ascend and lie below {}",
            rows.tokens
        ));
    }
    if let Some((k, v)) = rows.cache {
        let want = [cfg.kv_layers(), rows.tokens, cfg.hidden];
        if k.dims() != want || v.dims() != want {
            return bad(format!(
                "K/V cache must be {want:?}, got {:?} and {:?}",
                k.dims(),
                v.dims()
            ));
        }
    }
    if let Some((of, p)) = rows.patches {
        if of.len() != rows.tokens || of.iter().any(|&x| x as usize >= p) {
            return bad(format!(
                "patch map must give each of {} tokens a patch below {p}",
                rows.tokens
            ));
        }
    }
    Ok(())
}

/// `tokens x patches` one-hot matrix of the patch map.
fn one_hot(of: &[u32], p: usize, dev: &Device) -> candle_core::Result<Tensor> {
    let mut m = vec![0f32; of.len() * p];
    for (t, &x) in of.iter().enumerate() {
        m[t * p + x as usize] = 1.0;
    }
    Tensor::from_vec(m, (of.len(), p), dev)
}

/// LayerNorm without affine parameters, eps 1e-6, over the last dimension.
fn layer_norm(x: &Tensor) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    xc.broadcast_div(&(var + 1e-6)?.sqrt()?)
}

/// RMS norm over the last dimension with a learned scale, eps 1e-6.
fn rms(x: &Tensor, scale: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::rms_norm(&x.contiguous()?, scale, 1e-6)
}

/// `(1 + scale) * LN(x) + shift` with the chunks `at` (shift), `at + 1` (scale) of `m`.
fn modulate(x: &Tensor, m: &Tensor, at: usize) -> candle_core::Result<Tensor> {
    layer_norm(x)?
        .broadcast_mul(&(m.i(at + 1)? + 1.0)?)?
        .broadcast_add(&m.i(at)?)
}

/// Q (normed), K (normed) and V of one stream, each `rows x heads x head_dim`, before RoPE.
fn qkv(a: &Attn, x: &Tensor, cfg: &FluxConfig) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let y = a.qkv.forward(x)?;
    let r = y.dim(0)?;
    let h = cfg.hidden;
    let split = |i: usize| {
        y.narrow(1, i * h, h)?
            .reshape((r, cfg.heads, cfg.head_dim()))
    };
    Ok((
        rms(&split(0)?, &a.q_norm)?,
        rms(&split(1)?, &a.k_norm)?,
        split(2)?,
    ))
}

/// The rest of a double block's stream after attention: projection, gate, MLP.
fn stream_rest(s: &Stream, x: &Tensor, attn: &Tensor, m: &Tensor) -> candle_core::Result<Tensor> {
    let x = x.add(&s.attn.proj.forward(attn)?.broadcast_mul(&m.i(2)?)?)?;
    let h = s
        .mlp_out
        .forward(&s.mlp_in.forward(&modulate(&x, m, 3)?)?.gelu()?)?;
    x.add(&h.broadcast_mul(&m.i(5)?)?)
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

/// Cosines and sines of every rotated pair for tokens at the given (axis 0, 1, 2)
/// positions, each `rows x head_dim / 2`: the pairs of axis 0 first, then 1, then 2.
fn rope_table(
    cfg: &FluxConfig,
    pos: impl Iterator<Item = [f32; 3]>,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = cfg.head_dim() / 2;
    let mut freqs = Vec::with_capacity(half);
    for (axis, &d) in cfg.axes_dim.iter().enumerate() {
        for i in (0..d).step_by(2) {
            let f = 1.0f32 / cfg.theta.powf(i as f64 / d as f64) as f32;
            freqs.push((axis, f));
        }
    }
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    let mut rows = 0;
    for p in pos {
        for &(axis, f) in &freqs {
            let a = p[axis] * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
        rows += 1;
    }
    Ok((
        Tensor::from_vec(cos, (rows, 1, half), dev)?,
        Tensor::from_vec(sin, (rows, 1, half), dev)?,
    ))
}

/// Rotates consecutive pairs (x0, x1) of `x` (`rows x heads x head_dim`) by the table:
/// (cos x0 - sin x1, sin x0 + cos x1).
fn rope(x: &Tensor, pe: &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    let (r, h, d) = x.dims3()?;
    let x = x.reshape((r, h, d / 2, 2))?;
    let x0 = x.narrow(3, 0, 1)?.squeeze(3)?;
    let x1 = x.narrow(3, 1, 1)?.squeeze(3)?;
    let (c, s) = pe;
    let y0 = (x0.broadcast_mul(c)? - x1.broadcast_mul(s)?)?;
    let y1 = (x0.broadcast_mul(s)? + x1.broadcast_mul(c)?)?;
    Tensor::stack(&[y0, y1], 3)?.reshape((r, h, d))
}
