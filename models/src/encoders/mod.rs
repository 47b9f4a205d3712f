//! The released pipelines' text encoders and tokenizers: T5 and CLIP for FLUX ([`text`]),
//! CLIP with its projection ([`clip`]) and SD3's three encoders joined ([`sd3`]), and Wan2.1's
//! umT5 ([`umt5`]).

pub mod clip;
pub mod sd3;
pub mod text;
pub mod umt5;
