//! The built-in model, TinyDiT (see `models/tinydit/model.py`, the reference): a
//! text-conditioned Diffusion Transformer over a 8x8 grid of 4x4x3 pixel patches, trained with
//! rectified flow on procedural shapes. Executed with the kernels crate, including the
//! token-subset forward that regional execution needs.

mod tinydit;
mod weights;

pub use tinydit::{
    write_rows, CacheView, Config, ForwardOut, KvCache, StepCond, StepStats, TextContext, TinyDit,
};
pub use weights::{Weights, WeightsError};
