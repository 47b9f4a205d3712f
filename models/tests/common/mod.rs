//! What the real-architecture tests share: golden files under `models/reference/` and
//! tensor comparisons.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use flashdiff_models::io::weights::Weights;

/// `models/reference/NAME.safetensors`.
pub fn reference(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("reference/{name}.safetensors"))
}

/// A golden file, opened.
pub fn golden(name: &str) -> Weights {
    Weights::open(&reference(name)).unwrap()
}

/// A golden file's tensors under their own names, as the models' loaders take them.
pub fn vb(w: &Weights) -> candle_nn::VarBuilder<'_> {
    flashdiff_models::io::shards::var_builder_from(
        |n: &str, s: &[usize]| Ok(w.tensor(n, s, &Device::Cpu)?),
        &Device::Cpu,
    )
}

/// Tensor `n` of a golden file, on the CPU.
pub fn t(w: &Weights, n: &str) -> Tensor {
    let (s, v) = w.get_any(n).unwrap();
    Tensor::from_slice(v, s, &Device::Cpu).unwrap()
}

/// Largest |a - b| (shapes must agree).
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Largest |a|.
pub fn max_abs(a: &Tensor) -> f32 {
    a.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The T5 encoder in `dir` (`config.json`, `model.safetensors`) through candle's own
/// loader, the reference our checkpoint reader is held to.
pub fn candle_t5(dir: &Path) -> candle_transformers::models::t5::T5EncoderModel {
    use candle_transformers::models::t5;
    let cfg: t5::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    // SAFETY: the file was written by the test that calls this, and nothing modifies it
    // while it is mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            candle_core::DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    t5::T5EncoderModel::load(vb, &cfg).unwrap()
}
