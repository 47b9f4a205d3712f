//! Reading weights: one safetensors file mapped in place ([`weights`]), checkpoints of models
//! we did not train, one file or shards read under a model's own names ([`shards`]), and the
//! parts of a diffusers folder ([`folder`]).

pub mod folder;
pub mod shards;
pub mod weights;
