//! Checkpoints of models we did not train: one safetensors file or a folder of shards, in
//! f32, f16 or bf16, whose tensors a model reads under its own names through a mapping
//! ([`Source`]): one tensor, several concatenated, a third of one (a fused QKV split), or
//! one with its halves swapped ((scale, shift) stored as (shift, scale)).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::{ModelError, Weights, WeightsError};

/// Where a model's tensor lives in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    One(String),
    /// Concatenated along the first dimension.
    Cat(Vec<String>),
    /// Part `i` of `n` equal parts of a tensor along the first dimension (a fused Q, K, V:
    /// thirds; a fused K, V: halves).
    Part(String, usize, usize),
    /// The two halves along the first dimension, swapped.
    Swap(String),
}

/// The dtype a model keeps tensor `name` of `shape` in when it computes its matrix products
/// in `compute` (F32, or BF16 / F16 for 16-bit compute): a linear layer's weight (rank 2,
/// `*.weight`) in `compute`, everything else (norms, biases, embeddings, convolutions) in
/// f32. An error for any other `compute`.
pub(crate) fn dtype_for(name: &str, shape: &[usize], compute: DType) -> Result<DType, ModelError> {
    if !matches!(compute, DType::F32 | DType::BF16 | DType::F16) {
        return Err(ModelError::Input(format!(
            "compute dtype {compute:?}: only f32, bf16 and f16 are supported"
        )));
    }
    Ok(if shape.len() == 2 && name.ends_with(".weight") {
        compute
    } else {
        DType::F32
    })
}

/// The files of a checkpoint.
#[derive(Debug)]
pub(crate) struct Shards {
    files: Vec<Weights>,
}

impl Shards {
    /// `path`: a safetensors file, or a folder holding `*.safetensors` shards (a diffusers
    /// `transformer/` folder, or the model folder above it).
    pub(crate) fn open(path: &Path) -> Result<Self, ModelError> {
        let files = shard_paths(path)?
            .iter()
            .map(|p| Weights::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { files })
    }

    /// Which naming the checkpoint at `path` uses: `None` for diffusers' (it has one of
    /// `diffusers_keys`), `Some(prefix)` for the original release's (it has `original.0`
    /// after "" or ComfyUI's `model.diffusion_model.`); otherwise an error that names both.
    /// `model` reads "a FLUX", "an SD3", ...; `original.1` names the original's maker.
    pub(crate) fn naming(
        &self,
        path: &Path,
        model: &str,
        diffusers_keys: &[&str],
        original: (&str, &str),
    ) -> Result<Option<String>, ModelError> {
        if diffusers_keys.iter().any(|k| self.has(k)) {
            return Ok(None);
        }
        if let Some(prefix) = ["", "model.diffusion_model."]
            .into_iter()
            .find(|p| self.has(&format!("{p}{}", original.0)))
        {
            return Ok(Some(prefix.into()));
        }
        Err(ModelError::Input(format!(
            "{} is not {model} checkpoint: it has neither `{}` (diffusers) nor `{}` ({})",
            path.display(),
            diffusers_keys.first().copied().unwrap_or(""),
            original.0,
            original.1
        )))
    }

    /// Whether some file has tensor `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.files.iter().any(|w| w.has(name))
    }

    fn file_with(&self, name: &str) -> Result<&Weights, ModelError> {
        self.files
            .iter()
            .find(|w| w.has(name))
            .ok_or_else(|| WeightsError::Missing(name.into()).into())
    }

    fn raw_shape(&self, n: &str) -> Option<Vec<usize>> {
        self.files
            .iter()
            .find_map(|w| w.shape(n).map(<[usize]>::to_vec))
    }

    /// Shape of what `src` yields, if every tensor it needs is there.
    pub(crate) fn shape(&self, src: &Source) -> Option<Vec<usize>> {
        match src {
            Source::One(n) | Source::Swap(n) => self.raw_shape(n),
            Source::Part(n, _, parts) => self.raw_shape(n).map(|mut s| {
                s[0] /= parts.max(&1);
                s
            }),
            Source::Cat(parts) => {
                let mut total: Option<Vec<usize>> = None;
                for p in parts {
                    let s = self.raw_shape(p)?;
                    total = Some(match total {
                        None => s,
                        Some(mut t) => {
                            t[0] += s[0];
                            t
                        }
                    });
                }
                total
            }
        }
    }

    /// The shape of what `src` yields (the model's tensor `name`), which must have `rank`
    /// dimensions: reading a model's sizes from a checkpoint. `what` names the checkpoint
    /// and layout in the error.
    pub(crate) fn need(
        &self,
        src: &Source,
        name: &str,
        rank: usize,
        what: &str,
    ) -> Result<Vec<usize>, ModelError> {
        match self.shape(src) {
            Some(s) if s.len() == rank => Ok(s),
            Some(s) => Err(ModelError::Input(format!(
                "{what}: {name} has shape {s:?}; a rank-{rank} tensor was expected"
            ))),
            None => Err(WeightsError::Missing(format!("{name} ({what})")).into()),
        }
    }

    /// What `src` yields, checked against `shape`, on `dev`; `name` is the model's name for
    /// it. A missing or mis-shaped tensor is an error naming the checkpoint's key and both
    /// shapes.
    pub(crate) fn tensor(
        &self,
        src: &Source,
        name: &str,
        shape: &[usize],
        dev: &Device,
    ) -> Result<Tensor, ModelError> {
        self.tensor_in(src, name, shape, DType::F32, dev)
    }

    /// What a model's loader asks for when it computes in `compute`: what `src` yields, in
    /// the dtype [`dtype_for`] gives the model's tensor `name` of `shape`.
    pub(crate) fn for_compute(
        &self,
        src: &Source,
        name: &str,
        shape: &[usize],
        compute: DType,
        dev: &Device,
    ) -> Result<Tensor, ModelError> {
        let dtype = dtype_for(name, shape, compute)?;
        self.tensor_in(src, name, shape, dtype, dev)
    }

    /// [`Shards::tensor`] as a `dtype` tensor (F32, F16 or BF16), read from the file in that
    /// dtype where it is stored so (no f32 copy).
    pub(crate) fn tensor_in(
        &self,
        src: &Source,
        name: &str,
        shape: &[usize],
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor, ModelError> {
        let whole = |n: &str| -> Result<Tensor, ModelError> {
            let w = self.file_with(n)?;
            let s = w.shape(n).unwrap_or(&[]).to_vec();
            Ok(w.tensor_in(n, &s, dtype, dev)?)
        };
        let t = match src {
            Source::One(n) => return Ok(self.file_with(n)?.tensor_in(n, shape, dtype, dev)?),
            Source::Swap(n) => {
                let t = self.file_with(n)?.tensor_in(n, shape, dtype, dev)?;
                let h = shape[0] / 2;
                return Ok(Tensor::cat(&[t.narrow(0, h, h)?, t.narrow(0, 0, h)?], 0)?);
            }
            Source::Part(n, i, parts) => {
                let t = whole(n)?;
                let rows = t.dim(0)?;
                if *parts == 0 || rows % parts != 0 {
                    return Err(ModelError::Input(format!(
                        "tensor {n:?} has {rows} rows, not {parts} equal parts"
                    )));
                }
                t.narrow(0, i * rows / parts, rows / parts)?
            }
            Source::Cat(parts) => {
                let ts = parts
                    .iter()
                    .map(|p| whole(p))
                    .collect::<Result<Vec<_>, _>>()?;
                Tensor::cat(&ts, 0).map_err(|_| {
                    ModelError::Input(format!(
                        "tensors {} cannot be stacked into {name:?} {shape:?}: shapes {:?}",
                        parts.join(", "),
                        ts.iter().map(|t| t.dims().to_vec()).collect::<Vec<_>>()
                    ))
                })?
            }
        };
        if t.dims() != shape {
            let key = match src {
                Source::Cat(parts) => format!("{} (stacked as {name})", parts.join(" + ")),
                Source::Part(n, i, parts) => format!("{n} (part {i} of {parts}, as {name})"),
                Source::One(n) | Source::Swap(n) => n.clone(),
            };
            return Err(WeightsError::Shape {
                name: key,
                expected: shape.to_vec(),
                got: t.dims().to_vec(),
            }
            .into());
        }
        Ok(t)
    }
}

/// The safetensors files of `path`: itself, or the sorted `*.safetensors` of a folder (or
/// of its `transformer/` subfolder).
fn shard_paths(path: &Path) -> Result<Vec<PathBuf>, ModelError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let dir = if path.join("transformer").is_dir() {
        path.join("transformer")
    } else {
        path.to_path_buf()
    };
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| WeightsError::Io(dir.clone(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    out.sort();
    if out.is_empty() {
        return Err(ModelError::Input(format!(
            "{} holds no .safetensors files",
            dir.display()
        )));
    }
    Ok(out)
}
