//! Wan2.1's VAE decoder, written from diffusers' `AutoencoderKLWan` description (the
//! Wan2.1 form: no residual up blocks, no patching). Tensors are `channels x frames x
//! height x width`.
//!
//! diffusers decodes one latent frame at a time, each causal 3-D convolution keeping its
//! last two input frames for the next chunk. That equals running every causal convolution
//! over the whole sequence with two zero frames in front, which is what this does, except
//! for the temporal upsamplers: the first chunk's frame passes them unchanged (one frame
//! in, one out) and their time convolution starts at the second chunk with zeros behind
//! it. So a temporal upsampler here keeps the first frame, runs its time convolution over
//! the other frames alone, and interleaves its two halves of channels as two frames each:
//! `1 + 2 (T - 1)` frames. Two of them make `1 + 4 (T - 1)`, Wan's frame count.

use std::path::Path;

use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

use crate::io::shards::TensorSource;
use crate::io::shards::{f32_builder, Shards};
use crate::ModelError;

/// What we read of `vae/config.json` (`AutoencoderKLWan`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct WanVaeConfig {
    /// Base width (96).
    #[serde(default = "base_dim")]
    pub base_dim: usize,
    /// The decoder's base width, where it differs.
    #[serde(default)]
    pub decoder_base_dim: Option<usize>,
    /// Latent channels (16).
    #[serde(default = "z_dim")]
    pub z_dim: usize,
    /// Width multiples ([1, 2, 4, 4]).
    #[serde(default = "dim_mult")]
    pub dim_mult: Vec<usize>,
    /// Residual blocks a level (2; the decoder has one more).
    #[serde(default = "two")]
    pub num_res_blocks: usize,
    /// The encoder's temporal downsamplings; the decoder upsamples in reverse.
    #[serde(default = "temporal")]
    pub temperal_downsample: Vec<bool>,
    /// Per-channel mean of the latents.
    pub latents_mean: Vec<f32>,
    /// Per-channel standard deviation of the latents.
    pub latents_std: Vec<f32>,
    /// Wan2.2's residual form (not supported).
    #[serde(default)]
    pub is_residual: bool,
    /// Wan2.2's patching (not supported).
    #[serde(default)]
    pub patch_size: Option<usize>,
}

fn base_dim() -> usize {
    96
}
fn z_dim() -> usize {
    16
}
fn dim_mult() -> Vec<usize> {
    vec![1, 2, 4, 4]
}
fn two() -> usize {
    2
}
fn temporal() -> Vec<bool> {
    vec![false, true, true]
}

/// A causal 3-D convolution: `k_t` frames back (zeros before the first), symmetric
/// spatial padding.
#[derive(Debug)]
struct Conv3 {
    /// One `out x in x kh x kw` kernel per frame offset, oldest first.
    taps: Vec<Tensor>,
    b: Tensor,
    pad: usize,
}

impl Conv3 {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, t, h, w) = x.dims4()?;
        let kt = self.taps.len();
        // Frames as a batch, kt - 1 zero frames in front.
        let mut frames = x.transpose(0, 1)?.contiguous()?;
        if kt > 1 {
            let zeros = Tensor::zeros((kt - 1, c, h, w), x.dtype(), x.device())?;
            frames = Tensor::cat(&[zeros, frames], 0)?;
        }
        let mut y: Option<Tensor> = None;
        for (dt, k) in self.taps.iter().enumerate() {
            let part = frames.narrow(0, dt, t)?.conv2d(k, self.pad, 1, 1, 1)?;
            y = Some(match y {
                Some(acc) => (acc + part)?,
                None => part,
            });
        }
        let y = y.expect("at least one tap");
        let y = y.broadcast_add(&self.b.reshape((1, (), 1, 1))?)?;
        y.transpose(0, 1)?.contiguous()
    }
}

/// RMS norm over the channels (`F.normalize` times `sqrt(C)` times gamma).
#[derive(Debug)]
struct Norm {
    gamma: Tensor,
}

impl Norm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let c = x.dim(0)?;
        let n = x.sqr()?.sum_keepdim(0)?.sqrt()?.maximum(1e-12)?;
        let g = (&self.gamma * (c as f64).sqrt())?.reshape((c, 1, 1, 1))?;
        x.broadcast_div(&n)?.broadcast_mul(&g)
    }
}

#[derive(Debug)]
struct Residual {
    norm1: Norm,
    conv1: Conv3,
    norm2: Norm,
    conv2: Conv3,
    shortcut: Option<Conv3>,
}

impl Residual {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = match &self.shortcut {
            Some(s) => s.forward(x)?,
            None => x.clone(),
        };
        let y = self.conv1.forward(&self.norm1.forward(x)?.silu()?)?;
        let y = self.conv2.forward(&self.norm2.forward(&y)?.silu()?)?;
        y + h
    }
}

/// Single-head self-attention over each frame's pixels.
#[derive(Debug)]
struct Attention {
    norm: Norm,
    qkv: (Tensor, Tensor),
    proj: (Tensor, Tensor),
}

impl Attention {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, t, h, w) = x.dims4()?;
        let frames = self.norm.forward(x)?.transpose(0, 1)?.contiguous()?;
        let qkv = conv1x1(&frames, &self.qkv)?.reshape((t, 3 * c, h * w))?;
        let part = |i: usize| qkv.narrow(1, i * c, c)?.transpose(1, 2)?.contiguous();
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let p =
            candle_nn::ops::softmax_last_dim(&(q.matmul(&k.t()?)? * (1.0 / (c as f64).sqrt()))?)?;
        let o = p.matmul(&v)?.transpose(1, 2)?.reshape((t, c, h, w))?;
        let o = conv1x1(&o, &self.proj)?;
        x + o.transpose(0, 1)?
    }
}

/// A 1x1 2-D convolution (weight `out x in x 1 x 1`, bias) on frames as a batch.
fn conv1x1(x: &Tensor, (w, b): &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    x.conv2d(w, 0, 1, 1, 1)?
        .broadcast_add(&b.reshape((1, (), 1, 1))?)
}

/// 2x nearest upsampling of each frame, a 3x3 convolution halving the channels; with
/// `time`, first the temporal doubling described at the top of this file.
#[derive(Debug)]
struct Upsample {
    conv: (Tensor, Tensor),
    time: Option<Conv3>,
}

impl Upsample {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, t, h, w) = x.dims4()?;
        let x = match (&self.time, t) {
            (Some(tc), t) if t > 1 => {
                let rest = tc.forward(&x.narrow(1, 1, t - 1)?)?;
                // Channels [0, c) are frame 2i, [c, 2c) frame 2i + 1.
                let pairs = Tensor::stack(&[rest.narrow(0, 0, c)?, rest.narrow(0, c, c)?], 2)?
                    .reshape((c, 2 * (t - 1), h, w))?;
                Tensor::cat(&[x.narrow(1, 0, 1)?, pairs], 1)?
            }
            _ => x.clone(),
        };
        let frames = x
            .transpose(0, 1)?
            .contiguous()?
            .upsample_nearest2d(2 * h, 2 * w)?;
        let (k, b) = &self.conv;
        let y = frames
            .conv2d(k, 1, 1, 1, 1)?
            .broadcast_add(&b.reshape((1, (), 1, 1))?)?;
        y.transpose(0, 1)?.contiguous()
    }
}

#[derive(Debug)]
struct UpBlock {
    resnets: Vec<Residual>,
    up: Option<Upsample>,
}

/// Wan2.1's VAE decoder.
#[derive(Debug)]
pub struct WanVae {
    cfg: WanVaeConfig,
    post_quant: Conv3,
    conv_in: Conv3,
    mid: (Residual, Attention, Residual),
    ups: Vec<UpBlock>,
    norm_out: Norm,
    conv_out: Conv3,
    mean: Tensor,
    std: Tensor,
}

fn conv3(
    get: &TensorSource,
    p: &str,
    (inp, out, k): (usize, usize, usize),
) -> Result<Conv3, ModelError> {
    let w = get(&format!("{p}.weight"), &[out, inp, k, k, k])?;
    Ok(Conv3 {
        taps: (0..k)
            .map(|dt| w.narrow(2, dt, 1)?.squeeze(2)?.contiguous())
            .collect::<candle_core::Result<Vec<_>>>()?,
        b: get(&format!("{p}.bias"), &[out])?,
        pad: k / 2,
    })
}

/// The time convolution of a temporal upsampler: `3 x 1 x 1`, `c -> 2c`.
fn time_conv(get: &TensorSource, p: &str, c: usize) -> Result<Conv3, ModelError> {
    let w = get(&format!("{p}.weight"), &[2 * c, c, 3, 1, 1])?;
    Ok(Conv3 {
        taps: (0..3)
            .map(|dt| w.narrow(2, dt, 1)?.squeeze(2)?.contiguous())
            .collect::<candle_core::Result<Vec<_>>>()?,
        b: get(&format!("{p}.bias"), &[2 * c])?,
        pad: 0,
    })
}

fn norm(get: &TensorSource, p: &str, c: usize, images: bool) -> Result<Norm, ModelError> {
    let shape: Vec<usize> = if images {
        vec![c, 1, 1]
    } else {
        vec![c, 1, 1, 1]
    };
    Ok(Norm {
        gamma: get(&format!("{p}.gamma"), &shape)?.reshape(c)?,
    })
}

fn residual(get: &TensorSource, p: &str, inp: usize, out: usize) -> Result<Residual, ModelError> {
    Ok(Residual {
        norm1: norm(get, &format!("{p}.norm1"), inp, false)?,
        conv1: conv3(get, &format!("{p}.conv1"), (inp, out, 3))?,
        norm2: norm(get, &format!("{p}.norm2"), out, false)?,
        conv2: conv3(get, &format!("{p}.conv2"), (out, out, 3))?,
        shortcut: if inp != out {
            Some(conv3(get, &format!("{p}.conv_shortcut"), (inp, out, 1))?)
        } else {
            None
        },
    })
}

impl WanVae {
    /// The decoder from tensors under diffusers' names (`decoder.*`, `post_quant_conv.*`).
    pub fn load(cfg: WanVaeConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        let n = cfg.dim_mult.len();
        let z = cfg.z_dim;
        if cfg.is_residual || cfg.patch_size.is_some_and(|p| p > 1) {
            return Err(ModelError::Input(
                "Wan VAE config: the residual, patched form (Wan2.2) is not supported".into(),
            ));
        }
        if n < 2
            || z == 0
            || cfg.temperal_downsample.len() != n - 1
            || cfg.latents_mean.len() != z
            || cfg.latents_std.len() != z
            || cfg.latents_std.iter().any(|s| !s.is_finite() || *s == 0.0)
        {
            return Err(ModelError::Input(format!(
                "Wan VAE config: {} width multiples need {} temporal flags (got {}), and the \
                 latents' mean and std one value per latent channel ({z}; got {} and {}), \
                 std non-zero",
                n,
                n.saturating_sub(1),
                cfg.temperal_downsample.len(),
                cfg.latents_mean.len(),
                cfg.latents_std.len()
            )));
        }
        let dim = cfg.decoder_base_dim.unwrap_or(cfg.base_dim);
        let dims: Vec<usize> = std::iter::once(cfg.dim_mult[n - 1])
            .chain(cfg.dim_mult.iter().rev().copied())
            .map(|u| dim * u)
            .collect();
        let up_temporal: Vec<bool> = cfg.temperal_downsample.iter().rev().copied().collect();
        let d0 = dims[0];
        let mid = (
            residual(get, "decoder.mid_block.resnets.0", d0, d0)?,
            Attention {
                norm: norm(get, "decoder.mid_block.attentions.0.norm", d0, true)?,
                qkv: (
                    get(
                        "decoder.mid_block.attentions.0.to_qkv.weight",
                        &[3 * d0, d0, 1, 1],
                    )?,
                    get("decoder.mid_block.attentions.0.to_qkv.bias", &[3 * d0])?,
                ),
                proj: (
                    get(
                        "decoder.mid_block.attentions.0.proj.weight",
                        &[d0, d0, 1, 1],
                    )?,
                    get("decoder.mid_block.attentions.0.proj.bias", &[d0])?,
                ),
            },
            residual(get, "decoder.mid_block.resnets.1", d0, d0)?,
        );
        let mut ups = Vec::with_capacity(n);
        for i in 0..n {
            let (mut inp, out) = (dims[i], dims[i + 1]);
            if i > 0 {
                inp /= 2;
            }
            let p = format!("decoder.up_blocks.{i}");
            let resnets = (0..=cfg.num_res_blocks)
                .map(|j| {
                    residual(
                        get,
                        &format!("{p}.resnets.{j}"),
                        if j == 0 { inp } else { out },
                        out,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let up = if i + 1 < n {
                let u = format!("{p}.upsamplers.0");
                Some(Upsample {
                    conv: (
                        get(&format!("{u}.resample.1.weight"), &[out / 2, out, 3, 3])?,
                        get(&format!("{u}.resample.1.bias"), &[out / 2])?,
                    ),
                    time: if up_temporal[i] {
                        Some(time_conv(get, &format!("{u}.time_conv"), out)?)
                    } else {
                        None
                    },
                })
            } else {
                None
            };
            ups.push(UpBlock { resnets, up });
        }
        let dev = get("post_quant_conv.bias", &[z])?.device().clone();
        Ok(Self {
            post_quant: conv3(get, "post_quant_conv", (z, z, 1))?,
            conv_in: conv3(get, "decoder.conv_in", (z, d0, 3))?,
            mid,
            ups,
            norm_out: norm(get, "decoder.norm_out", dim, false)?,
            conv_out: conv3(get, "decoder.conv_out", (dim, 3, 3))?,
            mean: Tensor::from_vec(cfg.latents_mean.clone(), (z, 1, 1, 1), &dev)?,
            std: Tensor::from_vec(cfg.latents_std.clone(), (z, 1, 1, 1), &dev)?,
            cfg,
        })
    }

    /// `dir/vae/` (config.json and the weights), if there is one.
    pub fn open(dir: &Path, dev: &Device) -> Result<Option<Self>, ModelError> {
        let vae = dir.join("vae");
        if !vae.is_dir() {
            return Ok(None);
        }
        let cfg: WanVaeConfig = crate::io::folder::config(&vae)?;
        let files = std::sync::Arc::new(Shards::open(&vae)?);
        let vb = f32_builder(files, dev);
        Ok(Some(Self::load(cfg, &vb)?))
    }

    /// The architecture.
    pub fn config(&self) -> &WanVaeConfig {
        &self.cfg
    }

    /// RGB frames in [-1, 1] (`3 x (1 + 4 (T - 1)) x 8h x 8w` for Wan2.1) from a latent as
    /// the transformer denoises it (`z_dim x T x h x w`, normalised): `z std + mean`, then
    /// the decoder.
    pub fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        if z.dims().len() != 4 || z.dim(0)? != self.cfg.z_dim {
            return Err(ModelError::Input(format!(
                "Wan VAE latent must be {} x frames x height x width, got {:?}",
                self.cfg.z_dim,
                z.dims()
            )));
        }
        let z = z.broadcast_mul(&self.std)?.broadcast_add(&self.mean)?;
        let x = self.post_quant.forward(&z)?;
        let mut x = self.conv_in.forward(&x)?;
        x = self.mid.0.forward(&x)?;
        x = self.mid.1.forward(&x)?;
        x = self.mid.2.forward(&x)?;
        for b in &self.ups {
            for r in &b.resnets {
                x = r.forward(&x)?;
            }
            if let Some(u) = &b.up {
                x = u.forward(&x)?;
            }
        }
        let x = self.conv_out.forward(&self.norm_out.forward(&x)?.silu()?)?;
        Ok(x.clamp(-1f32, 1f32)?)
    }
}

impl crate::families::joint::denoiser::LatentDecoder for WanVae {
    fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        WanVae::decode(self, z)
    }
}
