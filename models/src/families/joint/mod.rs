//! What FLUX and SD3's MMDiT share: joint attention of text and image tokens in which the
//! image rows of a forward may be a subset, the others' keys and values coming from a cache;
//! the statistics FlashDiff needs (image-to-text saliency, per-patch attention mass); the
//! small layers both are made of.

pub mod denoiser;
pub mod pieces;

use candle_core::{Device, IndexOp, Tensor, D};
use flashdiff_kernels::ops::{flash_attention, linear_fast, norm_modulate};

use crate::ModelError;

/// A linear layer `y = x W^T + b` on rows (in f32 on the CPU, a system BLAS when one is
/// installed: `flashdiff_kernels::blas`). `W` may be held in bf16 or f16 (a checkpoint
/// loaded for 16-bit compute): the rows are then rounded to its dtype, multiplied in it
/// (cuBLAS on CUDA; candle widens both to f32 on the CPU) and the product returned in the
/// rows' dtype (f32), so every other op of the model stays in f32.
#[derive(Debug, Clone)]
pub(crate) struct Lin {
    pub(crate) w: Tensor,
    pub(crate) b: Option<Tensor>,
}

impl Lin {
    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if self.w.dtype() == x.dtype() {
            return linear_fast(x, &self.w, self.b.as_ref());
        }
        let y = x
            .to_dtype(self.w.dtype())?
            .matmul(&self.w.t()?)?
            .to_dtype(x.dtype())?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

pub(crate) use crate::io::shards::TensorSource;

pub(crate) fn lin(
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

/// Two-layer SiLU MLP embedder (time, guidance, pooled text).
#[derive(Debug, Clone)]
pub(crate) struct Embedder {
    inp: Lin,
    out: Lin,
}

impl Embedder {
    /// Layers `inp_name` (`inp -> h`) and `out_name` (`h -> h`), with biases.
    pub(crate) fn load(
        get: &TensorSource,
        (inp_name, out_name): (&str, &str),
        inp: usize,
        h: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            inp: lin(get, inp_name, inp, h, true)?,
            out: lin(get, out_name, h, h, true)?,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.inp.forward(x)?.silu()?)
    }
}
/// Output of a joint-attention DiT's forward over image rows ([`crate::families::flux::Flux::forward`],
/// [`crate::families::mmdit::Mmdit::forward`]).
#[derive(Debug)]
pub struct JointOutput {
    /// Velocity of the computed image tokens, `n x in_channels`.
    pub velocity: Tensor,
    /// Their fresh keys, `kv_layers x n x hidden` (keys after the model's Q/K norm and
    /// position encoding).
    pub k: Tensor,
    /// Their fresh values, same shape.
    pub v: Tensor,
    /// When asked for: attention of each computed image token to each text token, averaged
    /// over heads and the model's saliency blocks, `n x text_tokens`.
    pub saliency: Option<Tensor>,
    /// When patches are given: each computed image token's attention mass into each patch,
    /// averaged over heads and every block, `n x patches`.
    pub patch_mass: Option<Tensor>,
    /// The text tokens' keys and values at every joint attention (`text_layers x
    /// text_tokens x hidden`: every block for FLUX, every block's joint attention for the
    /// MMDiT), when this forward computed the text stream (no [`Rows::text_cache`]).
    pub text_kv: Option<(Tensor, Tensor)>,
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
    /// The text tokens' keys and values at every joint attention (as
    /// [`JointOutput::text_kv`] returned them): the text stream is then not computed,
    /// which makes a subset's cost proportional to its image rows. `None`: computed.
    pub text_cache: Option<(&'a Tensor, &'a Tensor)>,
}

/// Queries per block of attention: bounds the score matrix at `QUERY_BLOCK x keys` per head.
const QUERY_BLOCK: usize = 512;
/// One attention of a forward: `q`, `k`, `v` are `rows x heads x head_dim`; `k` and `v`
/// hold the `nt` text rows first (0 for an image-only attention), then the computed image
/// rows; `q` holds `qt` text rows (`nt`, or 0 when the text is cached) then the image rows.
#[derive(Clone, Copy)]
pub(crate) struct Attention<'a> {
    pub(crate) q: &'a Tensor,
    pub(crate) k: &'a Tensor,
    pub(crate) v: &'a Tensor,
    pub(crate) nt: usize,
    pub(crate) qt: usize,
    /// Cache layer of the image keys and values.
    pub(crate) layer: usize,
    /// Whether this attention's image-to-text probabilities count towards the saliency.
    pub(crate) saliency: bool,
}

/// What every attention of one forward shares.
pub(crate) struct Pass<'a> {
    pub(crate) rows: Rows<'a>,
    /// The tokens a subset with a cache reads from the cache (those not computed), in
    /// ascending order: their cached rows, then the fresh rows, are the image keys.
    /// Attention does not depend on the keys' order, so they are not put back in token
    /// order; the patch map (`onehot`) is put in theirs instead.
    pub(crate) gather: Option<Tensor>,
    pub(crate) onehot: Option<Tensor>,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) acc: Acc,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(rows: Rows<'a>, heads: usize, head_dim: usize) -> candle_core::Result<Self> {
        let dev = rows.x.device();
        let (gather, order) = match rows.cache {
            Some(_) if rows.ids.len() < rows.tokens => {
                let mut computed = vec![false; rows.tokens];
                for &t in rows.ids {
                    computed[t as usize] = true;
                }
                let rest: Vec<u32> = (0..rows.tokens as u32)
                    .filter(|&t| !computed[t as usize])
                    .collect();
                let mut order = rest.clone();
                order.extend_from_slice(rows.ids);
                let n = rest.len();
                (Some(Tensor::from_vec(rest, n, dev)?), Some(order))
            }
            _ => (None, None),
        };
        let onehot = match rows.patches {
            Some((of, p)) => Some(match &order {
                Some(order) => {
                    let of: Vec<u32> = order.iter().map(|&t| of[t as usize]).collect();
                    one_hot(&of, p, dev)?
                }
                None => one_hot(of, p, dev)?,
            }),
            None => None,
        };
        Ok(Self {
            rows,
            gather,
            onehot,
            heads,
            head_dim,
            acc: Acc::default(),
        })
    }

    /// The forward's output from its velocity rows, each layer's fresh image K/V (`n x heads
    /// x head_dim`) and the statistics gathered (saliency averaged over the
    /// `saliency_layers` attentions that counted, mass over every layer).
    pub(crate) fn finish(
        self,
        velocity: Tensor,
        (ks, vs): (Vec<Tensor>, Vec<Tensor>),
        text: Option<(Vec<Tensor>, Vec<Tensor>)>,
        saliency_layers: usize,
    ) -> candle_core::Result<JointOutput> {
        let layers = ks.len();
        let width = self.heads * self.head_dim;
        let flat = |t: Vec<Tensor>| {
            let n = t.first().map_or(0, |x| x.dim(0).unwrap_or(0));
            let l = t.len();
            Tensor::stack(&t, 0)?.reshape((l, n, width))
        };
        let saliency = match self.acc.saliency {
            Some(s) if self.rows.saliency => Some((s / saliency_layers.max(1) as f64)?),
            _ => None,
        };
        let patch_mass = match self.acc.mass {
            Some(s) => Some((s / layers.max(1) as f64)?),
            None => None,
        };
        let text_kv = match text {
            Some((k, v)) => Some((flat(k)?, flat(v)?)),
            None => None,
        };
        Ok(JointOutput {
            velocity,
            k: flat(ks)?,
            v: flat(vs)?,
            saliency,
            patch_mass,
            text_kv,
        })
    }

    /// Attention of `a.q` over the text keys and every image token's keys (fresh rows, or
    /// the cache at `a.layer` for the others). Returns `rows x heads * head_dim` and
    /// accumulates the statistics asked for.
    pub(crate) fn attend(&mut self, a: Attention<'_>) -> Result<Tensor, ModelError> {
        let Attention {
            q,
            k,
            v,
            nt,
            qt,
            layer,
            saliency,
        } = a;
        let rows = &self.rows;
        let (heads, hd) = (self.heads, self.head_dim);
        let n = rows.ids.len();
        let (k, v) = match (&self.gather, rows.cache) {
            (Some(rest), Some((ck, cv))) => {
                // [text rows; cached rows of the other tokens; fresh image rows].
                let full = |fresh: &Tensor, cache: &Tensor| -> candle_core::Result<Tensor> {
                    // (A cache that is a view, e.g. one pass's half of a guided model's
                    // rows, is copied first: index_select reads contiguous tensors.)
                    let c = cache.i(layer)?;
                    let c = if c.is_contiguous() {
                        c
                    } else {
                        c.contiguous()?
                    };
                    let c = c.index_select(rest, 0)?;
                    let c = c.reshape((rest.dim(0)?, heads, hd))?;
                    if nt == 0 {
                        Tensor::cat(&[&c, fresh], 0)
                    } else {
                        Tensor::cat(&[&fresh.narrow(0, 0, nt)?, &c, &fresh.narrow(0, nt, n)?], 0)
                    }
                };
                (full(k, ck)?, full(v, cv)?)
            }
            _ => (k.clone(), v.clone()),
        };
        if !(saliency && rows.saliency) && self.onehot.is_none() {
            // No statistics asked of this attention: no probability matrix either (online
            // softmax over key tiles on the CPU).
            let total = q.dim(0)?;
            let w = heads * hd;
            let flat = |t: &Tensor| -> candle_core::Result<Tensor> {
                let n = t.dim(0)?;
                t.reshape((n, w))
            };
            return Ok(
                flash_attention(&flat(q)?, &flat(&k)?, &flat(&v)?, heads)?.reshape((total, w))?
            );
        }
        // (heads, rows, head_dim), keys as (heads, head_dim, rows). On the CPU, views of the
        // row-major tensors: candle's CPU matmul takes any row and column strides, which
        // saves copying every key and value twice per attention (a cost that does not shrink
        // with the subset). cuBLAS takes fewer layouts: copies there.
        let (q, kt, v) = if q.device().is_cpu() {
            (
                q.transpose(0, 1)?,
                k.permute((1, 2, 0))?,
                v.transpose(0, 1)?,
            )
        } else {
            (
                q.transpose(0, 1)?.contiguous()?,
                k.transpose(0, 1)?.transpose(1, 2)?.contiguous()?,
                v.transpose(0, 1)?.contiguous()?,
            )
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let total = q.dim(1)?;
        let mut outs = Vec::with_capacity(total.div_ceil(QUERY_BLOCK));
        let mut start = 0;
        while start < total {
            let len = QUERY_BLOCK.min(total - start);
            let p = candle_nn::ops::softmax_last_dim(
                &(q.narrow(1, start, len)?.matmul(&kt)? * scale)?,
            )?;
            outs.push(p.matmul(&v)?);
            // Statistics of the image rows in this block (rows qt.. of q).
            let lo = start.max(qt);
            if lo < start + len {
                let img = p.narrow(1, lo - start, start + len - lo)?.mean(0)?;
                let keys = img.dim(1)?;
                if saliency && rows.saliency {
                    self.acc.add_saliency(lo - qt, img.narrow(1, 0, nt)?, n)?;
                }
                if let Some(oh) = &self.onehot {
                    // Only over the whole latent's image keys (a cache, or every token).
                    if keys - nt == rows.tokens {
                        self.acc.add_mass(
                            lo - qt,
                            img.narrow(1, nt, rows.tokens)?.matmul(oh)?,
                            n,
                        )?;
                    }
                }
            }
            start += len;
        }
        let o = Tensor::cat(&outs, 1)?; // heads x rows x hd
        Ok(o.transpose(0, 1)?.reshape((total, heads * hd))?)
    }
}
/// Per-block statistics summed over layers, one row per computed image token.
#[derive(Default)]
pub(crate) struct Acc {
    pub(crate) saliency: Option<Tensor>,
    pub(crate) mass: Option<Tensor>,
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

/// Checks a forward's rows against a model's sizes, with the reason.
pub(crate) fn check_rows(
    rows: &Rows<'_>,
    model: &str,
    in_channels: usize,
    kv_layers: usize,
    hidden: usize,
) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Input(m));
    let n = rows.ids.len();
    if n == 0 {
        return bad(format!("a {model} forward needs at least one image token"));
    }
    if rows.width == 0 || rows.tokens % rows.width != 0 {
        return bad(format!(
            "grid width {} does not divide {} tokens",
            rows.width, rows.tokens
        ));
    }
    if rows.x.dims() != [n, in_channels] {
        return bad(format!(
            "{model} image rows must be {n} x {in_channels}, got {:?}",
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
        let want = [kv_layers, rows.tokens, hidden];
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

/// A request's context for a joint-attention model: the text states through its text
/// projection (`text_tokens x hidden`) with the pooled vector through its embedder as one
/// more row. `widths`: the states' and the pooled vector's, checked.
pub(crate) fn text_context(
    model: &str,
    (txt, pooled): (&Tensor, &Tensor),
    (txt_proj, pooled_emb): (&Lin, &Embedder),
    widths: (usize, usize),
) -> Result<Tensor, ModelError> {
    let (_, w) = txt.dims2()?;
    if w != widths.0 || pooled.dims1()? != widths.1 {
        return Err(ModelError::Input(format!(
            "{model} text states must be n x {} and the pooled vector {} wide; got {:?} and {:?}",
            widths.0,
            widths.1,
            txt.dims(),
            pooled.dims()
        )));
    }
    let t = txt_proj.forward(txt)?;
    let y = pooled_emb.forward(&pooled.unsqueeze(0)?)?;
    Ok(Tensor::cat(&[t, y], 0)?)
}

/// Checks a text cache against the text's length and the model's layers.
pub(crate) fn check_text_cache(
    rows: &Rows<'_>,
    nt: usize,
    text_layers: usize,
    hidden: usize,
) -> Result<(), ModelError> {
    if let Some((k, v)) = rows.text_cache {
        let want = [text_layers, nt, hidden];
        if k.dims() != want || v.dims() != want {
            return Err(ModelError::Input(format!(
                "text K/V cache must be {want:?}, got {:?} and {:?}",
                k.dims(),
                v.dims()
            )));
        }
    }
    Ok(())
}

/// `tokens x patches` one-hot matrix of the patch map.
pub(crate) fn one_hot(of: &[u32], p: usize, dev: &Device) -> candle_core::Result<Tensor> {
    let mut m = vec![0f32; of.len() * p];
    for (t, &x) in of.iter().enumerate() {
        m[t * p + x as usize] = 1.0;
    }
    Tensor::from_vec(m, (of.len(), p), dev)
}

/// LayerNorm without affine parameters, eps 1e-6, over the last dimension.
pub(crate) fn layer_norm(x: &Tensor) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    xc.broadcast_div(&(var + 1e-6)?.sqrt()?)
}

/// RMS norm over the last dimension with a learned scale, eps 1e-6.
pub(crate) fn rms(x: &Tensor, scale: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::ops::rms_norm(&x.contiguous()?, scale, 1e-6)
}

/// `x * (1 + m[scale]) + m[shift]`: modulation by rows `scale` and `shift` of `m`.
pub(crate) fn affine(
    x: &Tensor,
    m: &Tensor,
    scale: usize,
    shift: usize,
) -> candle_core::Result<Tensor> {
    x.broadcast_mul(&(m.i(scale)? + 1.0)?)?
        .broadcast_add(&m.i(shift)?)
}

/// `(1 + scale) * LN(x) + shift` with the chunks `at` (shift), `at + 1` (scale) of `m`, in
/// one pass (the kernels' fused op on the CPU).
pub(crate) fn modulate(x: &Tensor, m: &Tensor, at: usize) -> candle_core::Result<Tensor> {
    norm_modulate(x, &m.i(at)?, &m.i(at + 1)?, 1e-6)
}

/// A [`rope_table`] as one `rows x head_dim` tensor, the cosines then the sines: the table
/// of the kernels' fused norm + rotation (`flashdiff_kernels::ops::rms_rope`).
pub(crate) fn rotation(pe: &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    let t = Tensor::cat(&[&pe.0, &pe.1], 2)?;
    let (rows, _, dh) = t.dims3()?;
    t.reshape((rows, dh))
}

/// Cosines and sines of every rotated pair for tokens at the given (axis 0, 1, 2)
/// positions, each `rows x head_dim / 2`: the pairs of axis 0 first, then 1, then 2.
pub(crate) fn rope_table(
    axes_dim: [usize; 3],
    theta: f64,
    pos: impl Iterator<Item = [f32; 3]>,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = axes_dim.iter().sum::<usize>() / 2;
    let mut freqs = Vec::with_capacity(half);
    for (axis, &d) in axes_dim.iter().enumerate() {
        for i in (0..d).step_by(2) {
            let f = 1.0f32 / theta.powf(i as f64 / d as f64) as f32;
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
pub(crate) fn rope(x: &Tensor, pe: &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    let (r, h, d) = x.dims3()?;
    let x = x.reshape((r, h, d / 2, 2))?;
    let x0 = x.narrow(3, 0, 1)?.squeeze(3)?;
    let x1 = x.narrow(3, 1, 1)?.squeeze(3)?;
    let (c, s) = pe;
    let y0 = (x0.broadcast_mul(c)? - x1.broadcast_mul(s)?)?;
    let y1 = (x0.broadcast_mul(s)? + x1.broadcast_mul(c)?)?;
    Tensor::stack(&[y0, y1], 3)?.reshape((r, h, d))
}
