//! A model folder in diffusers' layout: a part's `config.json`, the scheduler's
//! `scheduler_config.json`, and a part's weights (its `*.safetensors`) as a `VarBuilder`.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;

use crate::io::shards::{same_names, var_builder, Dtypes, Shards};
use crate::ModelError;

fn input(msg: String) -> ModelError {
    ModelError::Input(msg)
}

/// The f32 weights in `dir` (its `*.safetensors`) as a `VarBuilder`.
pub(crate) fn weights(dir: &Path, dev: &Device) -> Result<VarBuilder<'static>, ModelError> {
    weights_in(dir, DType::F32, dev)
}

/// The weights in `dir` as a `VarBuilder` of `dtype` tensors (a 16-bit file read in its
/// own dtype is not widened).
pub(crate) fn weights_in(
    dir: &Path,
    dtype: DType,
    dev: &Device,
) -> Result<VarBuilder<'static>, ModelError> {
    let files = Arc::new(Shards::open(dir)?);
    Ok(var_builder(files, same_names(), dtype, Dtypes::All, dev))
}

/// `dir/scheduler/scheduler_config.json`, parsed; where there is none, every field's
/// default (`T`'s fields all have one).
pub(crate) fn scheduler_config<T: serde::de::DeserializeOwned>(
    dir: &Path,
) -> Result<T, ModelError> {
    let p = dir.join("scheduler/scheduler_config.json");
    let text = if p.is_file() {
        std::fs::read_to_string(&p).map_err(|e| input(format!("{}: {e}", p.display())))?
    } else {
        "{}".to_string()
    };
    serde_json::from_str(&text).map_err(|e| input(format!("{}: {e}", p.display())))
}

/// `dir/config.json`, parsed.
pub(crate) fn config<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, ModelError> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| input(format!("{}: {e}", p.display())))?;
    serde_json::from_str(&text).map_err(|e| input(format!("{}: {e}", p.display())))
}
