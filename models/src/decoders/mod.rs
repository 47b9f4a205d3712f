//! The released pipelines' latent decoders: FLUX's and SD3's image VAE ([`vae`]), Wan2.1's
//! video VAE ([`wan_vae`]) and Stable Audio Open's Oobleck ([`oobleck`]).

pub mod oobleck;
pub mod vae;
pub mod wan_vae;
