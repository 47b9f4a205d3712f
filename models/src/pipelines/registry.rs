//! Models by description: a [`ModelSpec`] (a name, where the weights are, a pipeline's options)
//! turns into a [`Denoiser`]. The engine and its worker processes build their models from
//! the same description, so whatever one can load the others load too; no caller above this
//! crate names a concrete model.
//!
//! ```
//! use flashdiff_models::pipelines::registry::ModelSpec;
//! let spec = ModelSpec::builtin("tinydit").unwrap();
//! let model = spec.load(&candle_core::Device::Cpu)?;
//! assert_eq!(model.dims().grid.tokens(), 64);
//! // A worker process gets the same description as arguments.
//! assert_eq!(ModelSpec::from_worker_args(&spec.worker_args()).unwrap(), spec);
//! # Ok::<(), flashdiff_models::ModelError>(())
//! ```

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use crate::families::tinydit::TinyDit;
use crate::pipelines::{self as pipeline, Family, PipelineOptions, DTYPES};
use crate::{Denoiser, ModelError};

/// The built-in models, by name: the rows of [`pipeline::TABLE`] whose weights ship with
/// this crate. The TinyDiT family (image, video, audio: one file each) and the TinyFLUX
/// family (FLUX transformers over pixels at 64, 256 and 1024 image tokens, each a model
/// folder, [`crate::pipelines::tinyflux`]).
pub const BUILTIN_MODELS: [&str; pipeline::count(true)] = pipeline::names(true);

/// Every model by name: the built-in models, then the pipelines read from a folder
/// ([`crate::pipelines::PIPELINES`]).
pub const MODELS: [&str; pipeline::TABLE.len()] = {
    let mut out = [""; pipeline::TABLE.len()];
    let (builtin, folders) = (BUILTIN_MODELS, pipeline::PIPELINES);
    let mut i = 0;
    while i < builtin.len() {
        out[i] = builtin[i];
        i += 1;
    }
    let mut j = 0;
    while j < folders.len() {
        out[i + j] = folders[j];
        j += 1;
    }
    out
};

/// The TinyFLUX family, smallest first: 32x32 pixels (64 image tokens), 64x64 (256),
/// 128x128 (1024): the rows of [`pipeline::TABLE`] of [`Family::TinyFlux`].
pub const TINYFLUX_FAMILY: [&str; family_count(Family::TinyFlux)] = {
    let mut out = [""; family_count(Family::TinyFlux)];
    let (mut i, mut j) = (0, 0);
    while i < pipeline::TABLE.len() {
        if matches!(pipeline::TABLE[i].family, Family::TinyFlux) {
            out[j] = pipeline::TABLE[i].name;
            j += 1;
        }
        i += 1;
    }
    out
};

const fn family_count(f: Family) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < pipeline::TABLE.len() {
        // `==` is not const on enums; their discriminants are.
        if pipeline::TABLE[i].family as u8 == f as u8 {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The shipped weights of a built-in model (its row's file or folder in [`models_dir`]);
/// `None` for a name not in [`BUILTIN_MODELS`].
pub fn builtin_weights(name: &str) -> Option<PathBuf> {
    pipeline::model(name)?
        .shipped
        .map(|path| models_dir().join(path))
}

/// The folder that holds the built-in models' weights: `$FLASHDIFF_MODELS_DIR` (a binary
/// copied away from its source tree, with the repository's `models/` folder beside it
/// elsewhere), or this crate's source folder as it was when the binary was built.
pub fn models_dir() -> PathBuf {
    std::env::var_os("FLASHDIFF_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf())
}

/// The image model's weights: `$FLASHDIFF_WEIGHTS`, or the shipped TinyDiT.
pub fn default_weights() -> PathBuf {
    std::env::var_os("FLASHDIFF_WEIGHTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| builtin_weights("tinydit").expect("tinydit is built in"))
}

/// What to load: a model's name, its weights, and a pipeline's options.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// One of [`BUILTIN_MODELS`] (any file of the TinyDiT family loads under the first three
    /// names: the file says whether it is an image, video or sound model; `tinyflux` reads a
    /// TinyFLUX folder) or of [`pipeline::PIPELINES`].
    pub name: String,
    /// A TinyDiT-family safetensors file, TinyFLUX's folder, or a pipeline's diffusers folder.
    pub weights: PathBuf,
    /// What a pipeline is asked for besides its folder (ignored by the built-in models).
    pub options: PipelineOptions,
}

impl ModelSpec {
    /// A built-in model with its shipped weights (`tinydit`'s honours `$FLASHDIFF_WEIGHTS`).
    pub fn builtin(name: &str) -> Option<Self> {
        let weights = match name {
            "tinydit" => default_weights(),
            _ => builtin_weights(name)?,
        };
        Some(Self::file(&weights).named(name))
    }

    /// A TinyDiT-family file (a built-in model's format, perhaps other weights), or a
    /// TinyFLUX folder (`transformer/` and `text_encoder/model.safetensors`), named after the
    /// family member whose folder name it has (`.../tinyflux-l`), else `tinyflux`.
    pub fn file(weights: &Path) -> Self {
        let folder = weights.file_name().and_then(|n| n.to_str());
        let name = match crate::pipelines::tinyflux::is_folder(weights) {
            true => TINYFLUX_FAMILY
                .into_iter()
                .find(|&m| Some(m) == folder)
                .unwrap_or(TINYFLUX_FAMILY[0]),
            false => BUILTIN_MODELS[0],
        };
        Self {
            name: name.into(),
            weights: weights.into(),
            options: PipelineOptions::new((1024, 1024)),
        }
    }

    /// Pipeline `name` from its folder `dir`, with `options`.
    pub fn pipeline(name: &str, dir: &Path, options: PipelineOptions) -> Self {
        Self {
            name: name.into(),
            weights: dir.into(),
            options,
        }
    }

    fn named(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// Whether the name is one of [`pipeline::PIPELINES`] (else a built-in model's).
    pub fn is_pipeline(&self) -> bool {
        pipeline::PIPELINES.contains(&self.name.as_str())
    }

    /// Loads the model onto `device`; the error names what is wrong.
    pub fn load(&self, device: &Device) -> Result<Box<dyn Denoiser>, ModelError> {
        let Some(row) = pipeline::model(&self.name) else {
            return Err(ModelError::Input(format!(
                "unknown model {:?}; known: {}",
                self.name,
                MODELS.join(", ")
            )));
        };
        Ok(match row.family {
            Family::TinyFlux => Box::new(crate::pipelines::tinyflux::load_named(
                &self.weights,
                &self.name,
                device,
            )?),
            Family::TinyDit => Box::new(TinyDit::load(&self.weights, device)?),
            _ => return pipeline::load(&self.name, &self.weights, &self.options, device),
        })
    }

    /// The description as arguments of `flashdiff worker`: `--model NAME --weights PATH`,
    /// and for a pipeline `--options` with its options ([`ModelSpec::from_worker_args`]
    /// reads them back).
    pub fn worker_args(&self) -> Vec<String> {
        let mut args = vec![
            "--model".to_string(),
            self.name.clone(),
            "--weights".to_string(),
            self.weights.display().to_string(),
        ];
        if self.is_pipeline() {
            args.extend(["--options".to_string(), options_arg(&self.options)]);
        }
        args
    }

    /// The description from `flashdiff worker`'s arguments (what [`ModelSpec::worker_args`]
    /// writes); the error names the argument that is wrong.
    pub fn from_worker_args(args: &[String]) -> Result<Self, String> {
        let (mut name, mut weights, mut options) = (None, None, None);
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it
                .next()
                .ok_or_else(|| format!("worker argument {flag} has no value"))?;
            match flag.as_str() {
                "--model" => name = Some(value.clone()),
                "--weights" => weights = Some(PathBuf::from(value)),
                "--options" => options = Some(parse_options_arg(value)?),
                _ => return Err(format!("unknown worker argument {flag}")),
            }
        }
        let weights = weights.ok_or("the worker needs --weights")?;
        let mut spec = Self::file(&weights);
        if let Some(name) = name {
            spec.name = name;
        }
        if let Some(options) = options {
            spec.options = options;
        }
        Ok(spec)
    }
}

/// A path alone is a TinyDiT-family file ([`ModelSpec::file`]).
impl From<&Path> for ModelSpec {
    fn from(weights: &Path) -> Self {
        Self::file(weights)
    }
}

impl From<&PathBuf> for ModelSpec {
    fn from(weights: &PathBuf) -> Self {
        Self::file(weights)
    }
}

impl From<&ModelSpec> for ModelSpec {
    fn from(spec: &ModelSpec) -> Self {
        spec.clone()
    }
}

/// A pipeline's options as one argument: `size=HxW,dtype=D[,guidance=G][,seconds=S][,frames=F]`.
fn options_arg(o: &PipelineOptions) -> String {
    let dtype = DTYPES
        .iter()
        .find(|(_, d)| *d == o.dtype)
        .map_or("f32", |(n, _)| n);
    let mut s = format!("size={}x{},dtype={dtype}", o.size.0, o.size.1);
    if let Some(g) = o.guidance {
        s += &format!(",guidance={g}");
    }
    if let Some(sec) = o.seconds {
        s += &format!(",seconds={sec}");
    }
    if let Some(f) = o.frames {
        s += &format!(",frames={f}");
    }
    s
}

fn parse_options_arg(s: &str) -> Result<PipelineOptions, String> {
    let mut o = PipelineOptions::new((1024, 1024));
    o.dtype = DType::F32;
    for part in s.split(',') {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("--options {s:?}: {part:?} is not key=value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("--options {key}={value:?}: {e}");
        match key {
            "size" => {
                let (h, w) = value.split_once('x').ok_or_else(|| bad(&"expected HxW"))?;
                o.size = (
                    h.parse().map_err(|e| bad(&e))?,
                    w.parse().map_err(|e| bad(&e))?,
                );
            }
            "dtype" => o.dtype = pipeline::parse_dtype(value).map_err(|e| bad(&e))?,
            "guidance" => o.guidance = Some(value.parse().map_err(|e| bad(&e))?),
            "seconds" => o.seconds = Some(value.parse().map_err(|e| bad(&e))?),
            "frames" => o.frames = Some(value.parse().map_err(|e| bad(&e))?),
            _ => return Err(format!("--options: unknown key {key:?}")),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_description_survives_the_worker_arguments() {
        let mut options = PipelineOptions::new((480, 832));
        options.dtype = DType::BF16;
        options.guidance = Some(5.5);
        options.frames = Some(9);
        options.seconds = Some(1.5);
        let spec = ModelSpec::pipeline("wan2.1", Path::new("/some/dir"), options);
        assert_eq!(
            ModelSpec::from_worker_args(&spec.worker_args()).unwrap(),
            spec
        );
    }

    #[test]
    fn bad_worker_arguments_are_named() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let err = |a: &[&str]| ModelSpec::from_worker_args(&args(a)).unwrap_err();
        assert!(err(&["--model", "x"]).contains("--weights"));
        assert!(err(&["--weights"]).contains("no value"));
        assert!(err(&["--weights", "w", "--bogus", "1"]).contains("--bogus"));
        assert!(err(&["--weights", "w", "--options", "size=12"]).contains("HxW"));
        assert!(err(&["--weights", "w", "--options", "dtype=f64"]).contains("dtype"));
        assert!(err(&["--weights", "w", "--options", "speed=3"]).contains("speed"));
    }

    /// Each built-in row of the table says what its shipped weights load as: the kind, and
    /// the image size where the model knows it; the pipelines' rows ship nothing.
    #[test]
    fn the_table_rows_of_the_built_in_models_are_what_their_weights_load() {
        assert_eq!(
            BUILTIN_MODELS.len() + pipeline::PIPELINES.len(),
            MODELS.len()
        );
        for row in pipeline::TABLE {
            let Some(weights) = builtin_weights(row.name) else {
                assert!(pipeline::PIPELINES.contains(&row.name), "{}", row.name);
                assert!(pipeline::pipeline(row.name).is_some());
                continue;
            };
            assert!(BUILTIN_MODELS.contains(&row.name) && pipeline::pipeline(row.name).is_none());
            assert!(weights.exists(), "{}: {}", row.name, weights.display());
            let model = ModelSpec::builtin(row.name)
                .unwrap()
                .load(&Device::Cpu)
                .unwrap();
            assert_eq!(model.kind(), row.kind, "{}", row.name);
            if let Some((w, h)) = model.image_size() {
                assert_eq!((h, w), row.size, "{}", row.name);
            }
            assert_eq!(
                TINYFLUX_FAMILY.contains(&row.name),
                row.family == Family::TinyFlux,
                "{}",
                row.name
            );
        }
        assert_eq!(TINYFLUX_FAMILY, ["tinyflux", "tinyflux-l", "tinyflux-xl"]);
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let mut spec = ModelSpec::builtin("tinydit").unwrap();
        spec.name = "tinyflux2".into();
        let e = spec.load(&Device::Cpu).err().unwrap().to_string();
        assert!(e.contains("tinyflux2") && e.contains("flux-dev"), "{e}");
    }
}
