//! The model families, each a transformer with FlashDiff's token-subset forward: the built-in
//! TinyDiT family (image, video and sound, with their prompt languages and checkers), and the
//! released architectures FLUX, SD3's MMDiT, Wan2.1 and Stable Audio Open's DiT, the last
//! three sharing the joint-attention parts in [`joint`].

pub mod flux;
pub mod joint;
pub mod mmdit;
pub mod sao;
pub mod tinydit;
pub mod wan;
