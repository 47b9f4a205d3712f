//! FlashDiff compute kernels, CPU reference implementation.
//!
//! What the built-in model and regional execution need: a linear layer over a subset of rows
//! ([`linear_f32`]), multi-head attention of a subset of queries over a whole latent's keys
//! with fused statistics ([`attention_f32`]: head-averaged probabilities for cross-attention
//! saliency, per-query mass into each key group for the gate's refinement importance) or
//! without them and without a score matrix ([`flash_attention_f32`], online softmax over key
//! tiles), layer norm and adaLN modulation, per-head RMS norm with rotary encoding
//! ([`rms_rope_f32`]), gated residuals, GELU/SiLU, and row gather/scatter. Plain `&[f32]`
//! row-major buffers in and out; the caller owns all memory.
//!
//! ```
//! use flashdiff_kernels::linear_f32;
//! // y[2x3] = x[2x2] W^T + b, W stored [out x in] as PyTorch stores it.
//! let x = [1.0, 2.0, 3.0, 4.0];
//! let w = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let b = [0.5, 0.0, 0.0];
//! let mut y = [0.0; 6];
//! linear_f32(&x, 2, 2, &w, Some(&b), 3, &mut y);
//! assert_eq!(y, [1.5, 2.0, 3.0, 3.5, 4.0, 7.0]);
//! ```
//!
//! [`ops`] wraps them as candle ops: custom ops with these kernels as bodies on the CPU,
//! candle's own composed ops on other devices (CUDA with the `cuda` feature), tested
//! against each other. Models written on candle tensors call [`ops`]; the slice kernels
//! stay the CPU implementation and the reference.

mod simd;

mod activation;
mod attention;
pub mod blas;
mod flash;
mod ftz;
mod gather;
mod linear;
mod norm;
pub mod ops;
mod par;
mod rope;

pub use activation::{exp_f32, gelu_tanh_f32, silu_f32};
pub use attention::{attention_f32, AttnStats, GroupMass, QUERY_BLOCK};
pub use flash::flash_attention_f32;
pub use ftz::flush_denormals_to_zero;
pub use gather::{gather_rows_f32, scatter_rows_f32};
pub use linear::linear_f32;
pub use norm::{add_gated_f32, layer_norm_f32, modulate_f32};
pub use rope::rms_rope_f32;

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
