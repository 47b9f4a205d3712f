//! Stable Audio Open's VAE decoder (Oobleck), written from diffusers' `AutoencoderOobleck`
//! description: a 7-tap convolution up to `channels x 16`, five upsampling blocks (Snake,
//! a transposed convolution of stride s, three residual units with dilations 1, 3, 9),
//! Snake, a 7-tap convolution to the audio channels. Every convolution is weight-normalised
//! (`w = g v / |v|`, the norm over all but the first dimension); a Snake is
//! `x + sin^2(e^a x) / (e^b + 1e-9)` per channel. candle has the convolutions; the rest is
//! a few tensor ops. Weights come under diffusers' names (`vae/`) or stable-audio-tools'
//! (`pretransform.model.decoder.layers.*` in the released single `model.safetensors`).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::io::shards::TensorSource;
use crate::io::shards::{f32_builder, var_builder, Dtypes, Shards, Source};
use crate::ModelError;

/// What we read of diffusers' `vae/config.json` (`AutoencoderOobleck`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct OobleckConfig {
    /// Width before the channel multiples (128).
    pub decoder_channels: usize,
    /// Latent channels (64).
    pub decoder_input_channels: usize,
    /// Audio channels out (2: stereo).
    pub audio_channels: usize,
    /// The encoder's strides; the decoder upsamples by them in reverse ([2, 4, 4, 8, 8]).
    pub downsampling_ratios: Vec<usize>,
    /// Width multiples ([1, 2, 4, 8, 16]).
    pub channel_multiples: Vec<usize>,
    /// Samples per second (44,100).
    pub sampling_rate: u32,
}

impl OobleckConfig {
    /// Stable Audio Open 1.0's.
    pub fn open_1_0() -> Self {
        Self {
            decoder_channels: 128,
            decoder_input_channels: 64,
            audio_channels: 2,
            downsampling_ratios: vec![2, 4, 4, 8, 8],
            channel_multiples: vec![1, 2, 4, 8, 16],
            sampling_rate: 44_100,
        }
    }

    /// Audio samples per latent frame (the product of the strides: 2,048).
    pub fn hop(&self) -> usize {
        self.downsampling_ratios.iter().product()
    }

    fn validate(&self) -> Result<(), ModelError> {
        let n = self.downsampling_ratios.len();
        let ok = n > 0
            && self.channel_multiples.len() == n
            && self.decoder_channels > 0
            && self.decoder_input_channels > 0
            && self.audio_channels > 0
            && self.sampling_rate > 0
            && self.downsampling_ratios.iter().all(|&s| s > 0)
            && self.channel_multiples.iter().all(|&m| m > 0)
            && self.hop() <= 1 << 16;
        if ok {
            Ok(())
        } else {
            Err(ModelError::Input(format!(
                "Oobleck VAE config: {self:?}: needs as many strides (even, product at most \
                 65536) as channel multiples, and positive widths"
            )))
        }
    }
}

/// A weight-normalised 1-D convolution (or transposed convolution).
#[derive(Debug)]
struct Conv {
    w: Tensor,
    b: Option<Tensor>,
    padding: usize,
    stride: usize,
    dilation: usize,
    transposed: bool,
}

impl Conv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.unsqueeze(0)?;
        let y = if self.transposed {
            x.conv_transpose1d(&self.w, self.padding, 0, self.stride, self.dilation, 1)?
        } else {
            x.conv1d(&self.w, self.padding, self.stride, self.dilation, 1)?
        };
        let y = y.squeeze(0)?;
        match &self.b {
            Some(b) => y.broadcast_add(&b.unsqueeze(1)?),
            None => Ok(y),
        }
    }
}

/// Snake: `x + sin^2(alpha x) / (beta + 1e-9)`, alpha = e^a and beta = e^b per channel.
#[derive(Debug)]
struct Snake {
    alpha: Tensor,
    inv_beta: Tensor,
}

impl Snake {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let s = x.broadcast_mul(&self.alpha)?.sin()?.sqr()?;
        x + s.broadcast_mul(&self.inv_beta)?
    }
}

#[derive(Debug)]
struct Residual {
    snake1: Snake,
    conv1: Conv,
    snake2: Snake,
    conv2: Conv,
}

#[derive(Debug)]
struct Block {
    snake: Snake,
    up: Conv,
    res: [Residual; 3],
}

/// The Oobleck decoder: latents (`channels x frames`) to audio (`audio_channels x samples`).
#[derive(Debug)]
pub struct Oobleck {
    cfg: OobleckConfig,
    conv1: Conv,
    blocks: Vec<Block>,
    snake: Snake,
    conv2: Conv,
}

fn snake(get: &TensorSource, p: &str, c: usize) -> Result<Snake, ModelError> {
    let a = get(&format!("{p}.alpha"), &[1, c, 1])?.reshape((c, 1))?;
    let b = get(&format!("{p}.beta"), &[1, c, 1])?.reshape((c, 1))?;
    Ok(Snake {
        alpha: a.exp()?,
        inv_beta: (b.exp()? + 1e-9)?.recip()?,
    })
}

/// A weight-normalised convolution `p` of `inp -> out` channels, `k` taps.
fn conv(
    get: &TensorSource,
    p: &str,
    (inp, out, k): (usize, usize, usize),
    (padding, stride, dilation): (usize, usize, usize),
    (bias, transposed): (bool, bool),
) -> Result<Conv, ModelError> {
    // A transposed convolution's weight is `in x out x k`, and weight norm's first
    // dimension is then the input channels.
    let shape = if transposed {
        [inp, out, k]
    } else {
        [out, inp, k]
    };
    let v = get(&format!("{p}.weight_v"), &shape)?;
    let g = get(&format!("{p}.weight_g"), &[shape[0], 1, 1])?;
    let norm = v.sqr()?.sum_keepdim(2)?.sum_keepdim(1)?.sqrt()?;
    Ok(Conv {
        w: v.broadcast_mul(&g.broadcast_div(&norm)?)?,
        b: if bias {
            Some(get(&format!("{p}.bias"), &[out])?)
        } else {
            None
        },
        padding,
        stride,
        dilation,
        transposed,
    })
}

impl Oobleck {
    /// The decoder from tensors named as diffusers names them (`decoder.*`).
    pub fn load(cfg: OobleckConfig, vb: &VarBuilder) -> Result<Self, ModelError> {
        let get = &crate::io::shards::getter(vb);
        cfg.validate()?;
        let n = cfg.downsampling_ratios.len();
        let mult: Vec<usize> = std::iter::once(1)
            .chain(cfg.channel_multiples.iter().copied())
            .collect();
        let ch = cfg.decoder_channels;
        let conv1 = conv(
            get,
            "decoder.conv1",
            (cfg.decoder_input_channels, ch * mult[n], 7),
            (3, 1, 1),
            (true, false),
        )?;
        let mut blocks = Vec::with_capacity(n);
        for (i, &s) in cfg.downsampling_ratios.iter().rev().enumerate() {
            let (inp, out) = (ch * mult[n - i], ch * mult[n - i - 1]);
            let p = format!("decoder.block.{i}");
            let res = |j: usize, d: usize| -> Result<Residual, ModelError> {
                let r = format!("{p}.res_unit{j}");
                Ok(Residual {
                    snake1: snake(get, &format!("{r}.snake1"), out)?,
                    conv1: conv(
                        get,
                        &format!("{r}.conv1"),
                        (out, out, 7),
                        (3 * d, 1, d),
                        (true, false),
                    )?,
                    snake2: snake(get, &format!("{r}.snake2"), out)?,
                    conv2: conv(
                        get,
                        &format!("{r}.conv2"),
                        (out, out, 1),
                        (0, 1, 1),
                        (true, false),
                    )?,
                })
            };
            blocks.push(Block {
                snake: snake(get, &format!("{p}.snake1"), inp)?,
                up: conv(
                    get,
                    &format!("{p}.conv_t1"),
                    (inp, out, 2 * s),
                    (s.div_ceil(2), s, 1),
                    (true, true),
                )?,
                res: [res(1, 1)?, res(2, 3)?, res(3, 9)?],
            });
        }
        Ok(Self {
            snake: snake(get, "decoder.snake1", ch)?,
            conv2: conv(
                get,
                "decoder.conv2",
                (ch, cfg.audio_channels, 7),
                (3, 1, 1),
                (false, false),
            )?,
            conv1,
            blocks,
            cfg,
        })
    }

    /// The decoder of a pipeline folder: `dir/vae/` (diffusers: `config.json` and the
    /// weights), or, when `dir/model.safetensors` is stable-audio-tools' single file, its
    /// `pretransform.model.decoder.*` tensors with Stable Audio Open 1.0's sizes (or those of
    /// `dir/vae/config.json` if present).
    pub fn open(dir: &Path, dev: &Device) -> Result<Self, ModelError> {
        let vae = dir.join("vae");
        let official = dir.join("model.safetensors");
        let cfg_path = vae.join("config.json");
        let cfg = if cfg_path.is_file() {
            crate::io::folder::config::<OobleckConfig>(&vae)?
        } else {
            OobleckConfig::open_1_0()
        };
        if vae.is_dir() && !official.is_file() {
            let files = Arc::new(Shards::open(&vae)?);
            let vb = f32_builder(files, dev);
            return Self::load(cfg, &vb);
        }
        if !official.is_file() {
            return Err(ModelError::Input(format!(
                "{}: no vae/ folder (diffusers' AutoencoderOobleck) and no model.safetensors \
                 (stable-audio-tools' single file)",
                dir.display()
            )));
        }
        let files = Arc::new(Shards::open(&official)?);
        let blocks = cfg.downsampling_ratios.len();
        let map = move |n: &str| {
            let key = official_name(n, blocks);
            // The snakes' alpha and beta: 1-D there, 1 x C x 1 here.
            if n.ends_with(".alpha") || n.ends_with(".beta") {
                Source::Flat(key)
            } else {
                Source::One(key)
            }
        };
        let vb = var_builder(files, Arc::new(map), DType::F32, Dtypes::All, dev);
        Self::load(cfg, &vb)
    }

    /// The architecture.
    pub fn config(&self) -> &OobleckConfig {
        &self.cfg
    }

    /// Audio (`audio_channels x frames * hop`) from a latent (`channels x frames`).
    pub fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        if z.dims().len() != 2 || z.dim(0)? != self.cfg.decoder_input_channels {
            return Err(ModelError::Input(format!(
                "Oobleck latent must be {} x frames, got {:?}",
                self.cfg.decoder_input_channels,
                z.dims()
            )));
        }
        let mut x = self.conv1.forward(z)?;
        for b in &self.blocks {
            x = b.up.forward(&b.snake.forward(&x)?)?;
            for r in &b.res {
                let y = r.conv1.forward(&r.snake1.forward(&x)?)?;
                let y = r.conv2.forward(&r.snake2.forward(&y)?)?;
                x = (x + y)?;
            }
        }
        Ok(self.conv2.forward(&self.snake.forward(&x)?)?)
    }
}

/// stable-audio-tools' name of the decoder tensor diffusers calls `name`, for a decoder of
/// `blocks` upsampling blocks (`layers.0` the first convolution, `layers.1..=blocks` the
/// blocks, then the Snake and the last convolution; inside a block `layers.0` its Snake,
/// `layers.1` the transposed convolution, `layers.2..=4` the residual units, each
/// `layers.0..=3`: Snake, convolution, Snake, convolution).
pub fn official_name(name: &str, blocks: usize) -> String {
    let p = "pretransform.model.decoder.layers";
    let Some(rest) = name.strip_prefix("decoder.") else {
        return name.into();
    };
    let top = |i: usize, tail: &str| format!("{p}.{i}.{tail}");
    if let Some(t) = rest.strip_prefix("conv1.") {
        return top(0, t);
    }
    if let Some(t) = rest.strip_prefix("snake1.") {
        return top(blocks + 1, t);
    }
    if let Some(t) = rest.strip_prefix("conv2.") {
        return top(blocks + 2, t);
    }
    let mut it = rest.splitn(4, '.');
    let (_, b, part, tail) = (
        it.next(),
        it.next().and_then(|b| b.parse::<usize>().ok()),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    );
    let Some(b) = b else {
        return name.into();
    };
    let head = format!("{p}.{}.layers", b + 1);
    match part {
        "snake1" => format!("{head}.0.{tail}"),
        "conv_t1" => format!("{head}.1.{tail}"),
        _ => {
            let j: usize = part
                .strip_prefix("res_unit")
                .and_then(|j| j.parse().ok())
                .unwrap_or(0);
            let (inner, t) = tail.split_once('.').unwrap_or((tail, ""));
            let k = match inner {
                "snake1" => 0,
                "conv1" => 1,
                "snake2" => 2,
                _ => 3,
            };
            format!("{head}.{}.layers.{k}.{t}", j + 1)
        }
    }
}

impl crate::families::joint::denoiser::LatentDecoder for Oobleck {
    fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        Oobleck::decode(self, z)
    }
    fn sampling_rate(&self) -> u32 {
        self.config().sampling_rate
    }
}
