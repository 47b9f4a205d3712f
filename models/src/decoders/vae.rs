//! The image decoders of FLUX and SD3: diffusers' `AutoencoderKL` (`vae/`) or Black Forest
//! Labs' `ae.safetensors`, both from candle-transformers.

use std::path::Path;

use candle_core::{Device, Tensor};
use candle_transformers::models::flux::autoencoder as bfl;
use candle_transformers::models::stable_diffusion::vae as sd;

use crate::io::folder::{config, weights};
use crate::ModelError;

/// What we read of diffusers' `vae/config.json`.
#[derive(Debug, serde::Deserialize)]
struct VaeJson {
    block_out_channels: Vec<usize>,
    layers_per_block: usize,
    latent_channels: usize,
    norm_num_groups: usize,
    #[serde(default = "yes")]
    use_quant_conv: bool,
    #[serde(default = "yes")]
    use_post_quant_conv: bool,
    #[serde(default = "three")]
    in_channels: usize,
    #[serde(default = "three")]
    out_channels: usize,
    scaling_factor: f64,
    #[serde(default)]
    shift_factor: Option<f64>,
}

fn yes() -> bool {
    true
}

fn three() -> usize {
    3
}

enum Net {
    Diffusers(sd::AutoEncoderKL),
    Bfl(bfl::AutoEncoder),
}

/// A VAE decoder: latents (`channels x h x w`, as the transformer denoises them) to RGB.
pub struct Vae {
    net: Net,
    channels: usize,
    /// Image pixels per latent pixel side: 2 per upsampling block.
    upscale: usize,
    /// diffusers' latents are `(z - shift) * scale`; BFL's decoder undoes that itself.
    scale: f64,
    shift: f64,
}

impl std::fmt::Debug for Vae {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vae")
            .field("channels", &self.channels)
            .field("scale", &self.scale)
            .field("shift", &self.shift)
            .finish()
    }
}

impl Vae {
    /// The VAE of the pipeline folder `dir`: `dir/vae/` (diffusers) or `dir/ae.safetensors`
    /// (Black Forest Labs' FLUX autoencoder).
    pub fn load(dir: &Path, dev: &Device) -> Result<Self, ModelError> {
        let vae = dir.join("vae");
        if vae.join("config.json").is_file() {
            let c: VaeJson = config(&vae)?;
            if c.block_out_channels.is_empty() || c.block_out_channels.len() > 8 {
                return Err(ModelError::Input(format!(
                    "{}: block_out_channels {:?}; 1 to 8 blocks",
                    vae.join("config.json").display(),
                    c.block_out_channels
                )));
            }
            let upscale = 1 << (c.block_out_channels.len() - 1);
            let net = sd::AutoEncoderKL::new(
                weights(&vae, dev)?,
                c.in_channels,
                c.out_channels,
                sd::AutoEncoderKLConfig {
                    block_out_channels: c.block_out_channels,
                    layers_per_block: c.layers_per_block,
                    latent_channels: c.latent_channels,
                    norm_num_groups: c.norm_num_groups,
                    use_quant_conv: c.use_quant_conv,
                    use_post_quant_conv: c.use_post_quant_conv,
                },
            )
            .map_err(|e| ModelError::Input(format!("VAE in {}: {e}", vae.display())))?;
            return Ok(Self {
                net: Net::Diffusers(net),
                channels: c.latent_channels,
                upscale,
                scale: c.scaling_factor,
                shift: c.shift_factor.unwrap_or(0.0),
            });
        }
        let ae = dir.join("ae.safetensors");
        if ae.is_file() {
            let cfg = bfl::Config::dev();
            let net = bfl::AutoEncoder::new(&cfg, weights(&ae, dev)?)
                .map_err(|e| ModelError::Input(format!("{}: {e}", ae.display())))?;
            return Ok(Self {
                upscale: 1 << (cfg.ch_mult.len() - 1),
                net: Net::Bfl(net),
                channels: cfg.z_channels,
                scale: 1.0,
                shift: 0.0,
            });
        }
        Err(ModelError::Input(format!(
            "{} has no VAE: neither vae/config.json (diffusers) nor ae.safetensors",
            dir.display()
        )))
    }

    /// Image pixels per latent pixel side (8 for the released VAEs: three 2x upsamplings).
    pub fn scale(&self) -> usize {
        self.upscale
    }

    /// Latent channels.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// `latent` (`channels x h x w`) to an image `3 x sh x sw` in [0, 1] (`s`:
    /// [`Vae::scale`]).
    pub fn decode(&self, latent: &Tensor) -> Result<Tensor, ModelError> {
        let z = latent.unsqueeze(0)?;
        let img = match &self.net {
            Net::Diffusers(n) => n.decode(&((z / self.scale)? + self.shift)?)?,
            Net::Bfl(n) => n.decode(&z)?,
        };
        Ok(((img.squeeze(0)?.clamp(-1f32, 1f32)? + 1.0)? * 0.5)?)
    }
}

impl crate::families::joint::denoiser::LatentDecoder for Vae {
    fn decode(&self, z: &Tensor) -> Result<Tensor, ModelError> {
        Vae::decode(self, z)
    }
    fn scale(&self) -> usize {
        Vae::scale(self)
    }
}
