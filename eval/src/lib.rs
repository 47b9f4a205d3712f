//! FlashDiff's evaluation: how good an output is, measured, not trusted.
//!
//! - [`metrics`]: an output against a reference (full computation's, same seed): PSNR and
//!   SSIM of images, per-frame and temporal PSNR of clips, SNR and spectral distance of
//!   sounds.
//! - [`image`], [`video`], [`sound`]: the built-in models' checkers, which read a sample and
//!   say whether it shows what its prompt says; each is held to its Python reference (the
//!   training data's own checker) by golden tests.
//!
//! ```
//! use flashdiff_models::families::tinydit::scene;
//! let s = scene::sample(7);
//! assert!(flashdiff_eval::image::check(&scene::render(&s), &s).all());
//! assert_eq!(flashdiff_eval::metrics::psnr(&[0.5; 12], &[0.5; 12]), f64::INFINITY);
//! ```

pub mod image;
pub mod metrics;
pub mod sound;
pub mod video;
