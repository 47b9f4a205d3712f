//! FlashDiff Patch Partitioner (paper §4.1, Appendix A.3).
//!
//! Decides *where* to cut a latent: it takes the prompt's words and the cross-attention the
//! model recorded during warm-up, and returns a [`PatchLayout`] of R disjoint, load-balanced,
//! semantically coherent patches. Plain slices in, plain layouts out: no tensors, no I/O.
//!
//! ```
//! use flashdiff_partitioner::{partition_saliency, salient_mask, saliency_map, split_words, Grid};
//!
//! let grid = Grid::image(8, 8)?;
//! let words = split_words("a red circle on a white background");
//! let salient = salient_mask(&words); // "a", "on" are function words
//! // Cross-attention, 64 latent tokens x 7 prompt tokens: "circle" lights up one corner.
//! let mut attn = vec![0.1f32; 64 * words.len()];
//! for t in [0usize, 1, 8, 9] {
//!     attn[t * words.len() + 2] = 0.9;
//! }
//! let s = saliency_map(&attn, 64, &salient)?;
//! let layout = partition_saliency(grid, &s, 4)?;
//! assert_eq!(layout.patches(), 4);
//! assert_eq!(layout.patch_of()[0], layout.patch_of()[9]); // the object stays in one patch
//! # Ok::<(), flashdiff_partitioner::PartitionError>(())
//! ```
//!
//! Also here: the uniform partitioner (the NaivePatch / DistriFusion baseline and fallback),
//! the adaptive-R [`GranularityController`], and an independent [`checker`].

mod adaptive;
pub mod checker;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod grid;
mod layout;
mod otsu;
mod partition;
mod saliency;
mod salient;

pub use adaptive::{objective, GranularityConfig, GranularityController};
pub use error::PartitionError;
pub use grid::{Grid, MAX_TOKENS};
pub use layout::PatchLayout;
pub use otsu::{otsu, Otsu, BINS};
pub use partition::{
    partition_saliency, partition_saliency_with, partition_uniform, PartitionConfig, MIN_CONTRAST,
    MIN_SEPARABILITY,
};
pub use saliency::saliency_map;
pub use salient::{is_function_word, normalize_word, salient_mask, split_words};

/// The README's example, run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
