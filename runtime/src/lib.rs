//! FlashDiff engine. So far: the built-in model ([`model`]), its language and checker
//! ([`scene`]), images and metrics ([`image`]), and the single-process engine ([`engine`]).

pub mod bench;
pub mod engine;
pub mod exec;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod image;
pub mod model;
pub mod proc;
pub mod scene;
pub mod state;
