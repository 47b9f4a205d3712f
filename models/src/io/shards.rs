//! Checkpoints of models we did not train: one safetensors file or a folder of shards, in
//! f32, f16 or bf16, whose tensors a model reads under its own names through a mapping
//! (`Source`): one tensor, several concatenated, a third of one (a fused QKV split), or
//! one with its halves swapped ((scale, shift) stored as (shift, scale)).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::io::weights::{Weights, WeightsError};
use crate::ModelError;

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
    /// One tensor stored under another shape of the same elements (a vector kept as an
    /// `n x 1` matrix).
    Flat(String),
}

/// The dtype a model keeps tensor `name` of `shape` in when it computes its matrix products
/// in `compute` (F32, or BF16 / F16 for 16-bit compute): a linear layer's weight (rank 2,
/// `*.weight`) in `compute`, everything else (norms, biases, convolutions, and the lookup
/// tables of T5's token embedding `shared.weight` and relative position biases) in f32. An
/// error for any other `compute`.
pub(crate) fn dtype_for(name: &str, shape: &[usize], compute: DType) -> Result<DType, ModelError> {
    if !matches!(compute, DType::F32 | DType::BF16 | DType::F16) {
        return Err(ModelError::Input(format!(
            "compute dtype {compute:?}: only f32, bf16 and f16 are supported"
        )));
    }
    let lookup = name == "shared.weight" || name.contains("relative_attention_bias");
    Ok(
        if shape.len() == 2 && name.ends_with(".weight") && !lookup {
            compute
        } else {
            DType::F32
        },
    )
}

/// The files of a checkpoint.
#[derive(Debug)]
pub(crate) struct Shards {
    files: Vec<Weights>,
}

/// Where a layout keeps each of a model's tensors ([`Source`] of the model's name).
pub(crate) type Mapping = Arc<dyn Fn(&str) -> Source + Send + Sync>;

/// One transformer checkpoint of any family: its tensors under the model's own names, and
/// the naming (`L`, the family's layout enum) its files were found in. Each family opens
/// its own (`Checkpoint<FluxLayout>::open`, and so on: the layout is told from the names in
/// the files) and reads its architecture and weights from [`Checkpoint::weights`].
#[derive(Debug)]
pub struct Checkpoint<L> {
    weights: MappedWeights,
    layout: L,
}

impl<L> Checkpoint<L> {
    /// A checkpoint of `files` in `layout`, each of the model's tensor names found through
    /// `map`.
    pub(crate) fn new(
        files: Shards,
        layout: L,
        map: impl Fn(&str) -> Source + Send + Sync + 'static,
    ) -> Self {
        Self {
            weights: MappedWeights::new(files, map),
            layout,
        }
    }

    /// The layout found.
    pub fn layout(&self) -> &L {
        &self.layout
    }

    /// The checkpoint's tensors under the transformer's own names:
    /// [`MappedWeights::var_builder`] is candle's `VarBuilder` over them.
    pub fn weights(&self) -> &MappedWeights {
        &self.weights
    }
}

/// A checkpoint's tensors under a model's own names: its files and where its layout keeps
/// each tensor (one tensor, several concatenated, a part of a fused one, halves swapped, a
/// vector kept as a matrix). What a [`Checkpoint`] reads its sizes and weights from.
#[derive(Clone)]
pub struct MappedWeights {
    files: Arc<Shards>,
    map: Mapping,
}

impl std::fmt::Debug for MappedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedWeights")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl MappedWeights {
    pub(crate) fn new(files: Shards, map: impl Fn(&str) -> Source + Send + Sync + 'static) -> Self {
        Self {
            files: Arc::new(files),
            map: Arc::new(map),
        }
    }

    /// Shape of the model's tensor `name`, if the checkpoint has it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.files.shape(&(self.map)(name))
    }

    /// The shape of the model's tensor `name`, which must have `rank` dimensions (reading a
    /// model's sizes); `what` names the checkpoint and layout in the error.
    pub(crate) fn need(
        &self,
        name: &str,
        rank: usize,
        what: &str,
    ) -> Result<Vec<usize>, ModelError> {
        self.files.need(&(self.map)(name), name, rank, what)
    }

    /// The checkpoint as candle's `VarBuilder` under the model's own names, the layout's
    /// mapping applied; linear layers' weights in `compute` (F32, BF16 or F16, read in that
    /// dtype where the file stores it so), every other tensor f32.
    pub fn var_builder(&self, compute: DType, dev: &Device) -> VarBuilder<'static> {
        var_builder(
            self.files.clone(),
            self.map.clone(),
            compute,
            Dtypes::Linear,
            dev,
        )
    }

    /// The model's tensor `name` checked against `shape`, in f32, on `dev`. A missing or
    /// mis-shaped tensor is an error that names the checkpoint's key and both shapes.
    pub fn tensor(&self, name: &str, shape: &[usize], dev: &Device) -> Result<Tensor, ModelError> {
        getter(&self.var_builder(DType::F32, dev))(name, shape)
    }
}

/// How a [`VarBuilder`] over a checkpoint hands out dtypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtypes {
    /// Every tensor in the builder's dtype (candle-transformers' encoders).
    All,
    /// Linear layers' weights in the builder's dtype, everything else f32 ([`dtype_for`]):
    /// our transformers, which compute in f32 around 16-bit matrix products.
    Linear,
}

/// A checkpoint behind candle's `VarBuilder`: a model asks for its tensors under its own
/// names and shapes; the layout's [`Mapping`] says where each lives in the files (one tensor,
/// several concatenated, a part of a fused one, halves swapped). The one way every model
/// reads its weights.
struct Mapped {
    files: Arc<Shards>,
    map: Mapping,
    dtypes: Dtypes,
}

impl Mapped {
    fn read(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor, ModelError> {
        let dtype = match self.dtypes {
            Dtypes::All => dtype,
            Dtypes::Linear => dtype_for(name, shape, dtype)?,
        };
        self.files
            .tensor_in(&(self.map)(name), name, shape, dtype, dev)
    }
}

impl SimpleBackend for Mapped {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        self.read(name, s.dims(), dtype, dev)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let shape = self.files.shape(&(self.map)(name)).ok_or_else(|| {
            candle_core::Error::Msg(WeightsError::Missing(name.into()).to_string())
        })?;
        self.get(shape.into(), name, Init::Const(0.0), dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.files.shape(&(self.map)(name)).is_some()
    }
}

/// `files` as a `VarBuilder` of `dtype` tensors under the names `map` gives.
pub(crate) fn var_builder(
    files: Arc<Shards>,
    map: Mapping,
    dtype: DType,
    dtypes: Dtypes,
    dev: &Device,
) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(Mapped { files, map, dtypes }), dtype, dev.clone())
}

/// Any tensor source as candle's `VarBuilder`, for weights made or renamed some other way
/// (tests against reference implementations, random weights): each tensor a model asks for
/// is `get(name, shape)`, in whatever dtype `get` makes it; its error reaches the loader as
/// text.
pub fn var_builder_from<'a>(
    get: impl Fn(&str, &[usize]) -> Result<Tensor, ModelError> + Send + Sync + 'a,
    dev: &Device,
) -> VarBuilder<'a> {
    struct Made<F>(F);
    impl<F: Fn(&str, &[usize]) -> Result<Tensor, ModelError> + Send + Sync> SimpleBackend for Made<F> {
        fn get(
            &self,
            s: Shape,
            name: &str,
            _: Init,
            _: DType,
            _: &Device,
        ) -> candle_core::Result<Tensor> {
            (self.0)(name, s.dims()).map_err(|e| candle_core::Error::Msg(e.to_string()))
        }
        fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
            candle_core::bail!("{name}: a tensor source is asked by shape")
        }
        fn contains_tensor(&self, _: &str) -> bool {
            false
        }
    }
    VarBuilder::from_backend(Box::new(Made(get)), DType::F32, dev.clone())
}

/// `files` as an f32 `VarBuilder` under the names they hold.
pub(crate) fn f32_builder(files: Arc<Shards>, dev: &Device) -> VarBuilder<'static> {
    var_builder(files, same_names(), DType::F32, Dtypes::All, dev)
}

/// A layout that keeps every tensor under the model's own name.
pub(crate) fn same_names() -> Mapping {
    Arc::new(|n: &str| Source::One(n.into()))
}

/// Where the weights come from inside a model's loader: tensor `name` of `shape` from the
/// loader's `VarBuilder`, a read failure as our error (its text kept).
pub(crate) type TensorSource<'a> = dyn Fn(&str, &[usize]) -> Result<Tensor, ModelError> + 'a;

/// The getter a loader passes down its layers: `vb.get`, its error ours.
pub(crate) fn getter<'a>(
    vb: &'a VarBuilder,
) -> impl Fn(&str, &[usize]) -> Result<Tensor, ModelError> + 'a {
    move |name, shape| vb.get(shape, name).map_err(read_error)
}

/// A `VarBuilder` error as ours: what our reader said, or a tensor library failure.
pub(crate) fn read_error(e: candle_core::Error) -> ModelError {
    match e {
        candle_core::Error::Msg(m) => WeightsError::Read(m).into(),
        candle_core::Error::WithBacktrace { inner, .. } => read_error(*inner),
        e => ModelError::Tensor(e),
    }
}

impl Shards {
    /// One file already open.
    pub(crate) fn one(file: Weights) -> Self {
        Self { files: vec![file] }
    }

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
            Source::One(n) | Source::Swap(n) | Source::Flat(n) => self.raw_shape(n),
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

    /// What `src` yields, checked against `shape`, as a `dtype` tensor (F32, F16 or BF16) on
    /// `dev`, read from the file in that dtype where it is stored so (no f32 copy); `name` is
    /// the model's name for it. A missing or mis-shaped tensor is an error naming the
    /// checkpoint's key and both shapes.
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
            Source::Flat(n) => {
                let t = whole(n)?;
                if t.elem_count() != shape.iter().product::<usize>() {
                    return Err(WeightsError::Shape {
                        name: n.clone(),
                        expected: shape.to_vec(),
                        got: t.dims().to_vec(),
                    }
                    .into());
                }
                t.reshape(shape)?
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
                Source::One(n) | Source::Swap(n) | Source::Flat(n) => n.clone(),
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
