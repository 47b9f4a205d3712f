//! The FlashDiff runtime: the serving engine over any `Denoiser`.
//!
//! - [`engine`]: requests through warm-up, partition, gated patch-steps and commit, with the
//!   execution semantics (a step's patches packed into monotasks, displaced and extrapolated
//!   K/V, the final full step, bit-identical output for any worker count) documented at the
//!   top of that module.
//! - [`exec`]: one monotask (a warm-up, a step's patches) on a request's state; what a worker
//!   runs. [`proc`]: worker processes and the framed, validated rkyv control records.
//!   [`state`]: the request state as named regions of one mapping (/dev/shm or anonymous).
//! - [`schema`]: the one request schema of every interface, turned into the engine's settings.
//! - [`image`]: PNG, PSNR, SSIM; [`media`]: GIF and WAV, video and sound metrics. Models (the `Denoiser` contract, TinyDiT, the prompt
//!   language and checker) live in `flashdiff-models`, re-exported as [`models`].
//!
//! The `flashdiff` command lives in `server/`, the studies in `studies/`.

pub mod checkpoint;
pub mod engine;
pub mod exec;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod image;
pub mod media;
pub mod proc;
pub mod schema;
pub mod service;
pub mod state;

pub use flashdiff_models as models;

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
