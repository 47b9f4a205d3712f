//! Weights from a safetensors file, mapped read-only: little-endian, 4-byte-aligned f32
//! tensors are used in place; f16/bf16 (or misaligned f32) tensors are converted once.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// Why a weights file could not be used.
#[derive(Debug)]
pub enum WeightsError {
    /// The file could not be opened or mapped.
    Io(PathBuf, std::io::Error),
    /// Not a valid safetensors file (truncated, bad header, overlapping offsets).
    Format(PathBuf, String),
    /// A tensor the model needs is absent.
    Missing(String),
    /// A tensor has the wrong shape.
    Shape {
        /// Tensor name.
        name: String,
        /// Shape the model config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        got: Vec<usize>,
    },
    /// A tensor has a dtype we cannot read.
    Dtype(String, String),
    /// Metadata (config, vocabulary) missing or malformed.
    Metadata(String),
}

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(p, e) => write!(f, "cannot read weights {}: {e}", p.display()),
            Self::Format(p, e) => write!(f, "{} is not a valid safetensors file: {e}", p.display()),
            Self::Missing(n) => write!(f, "weights file has no tensor {n:?}"),
            Self::Shape {
                name,
                expected,
                got,
            } => write!(
                f,
                "tensor {name:?} has shape {got:?}, the model config needs {expected:?}"
            ),
            Self::Dtype(n, d) => write!(
                f,
                "tensor {n:?} has dtype {d}; only F32, F16 and BF16 are supported"
            ),
            Self::Metadata(m) => write!(f, "weights metadata: {m}"),
        }
    }
}

impl std::error::Error for WeightsError {}

#[derive(Debug)]
enum Storage {
    /// Float offset and length inside the mapping.
    Mapped(usize, usize),
    Owned(Vec<f32>),
}

/// All tensors of a file, by name, as `&[f32]`.
#[derive(Debug)]
pub struct Weights {
    map: Mmap,
    tensors: HashMap<String, (Vec<usize>, Storage)>,
    ints: HashMap<String, Vec<i64>>,
    metadata: HashMap<String, String>,
    path: PathBuf,
    /// Every float tensor copied once into one buffer (built on the first CPU
    /// [`Weights::tensor`]): name -> offset in it.
    arena: std::sync::OnceLock<(candle_core::Tensor, HashMap<String, usize>)>,
}

impl Weights {
    /// Maps and validates a safetensors file.
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        let file = File::open(path).map_err(|e| WeightsError::Io(path.into(), e))?;
        // SAFETY: the mapping is read-only and private to this process; the file is one we
        // ship or the user points at, and nothing in this process writes it. Another process
        // truncating it while mapped would be a user error that can fault; the safetensors
        // header is validated below before any tensor is read.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::Io(path.into(), e))?;
        let (header_len, meta) = SafeTensors::read_metadata(&map)
            .map_err(|e| WeightsError::Format(path.into(), e.to_string()))?;
        let st = SafeTensors::deserialize(&map)
            .map_err(|e| WeightsError::Format(path.into(), e.to_string()))?;
        let _ = header_len;
        let base = map.as_ptr() as usize;
        let mut tensors = HashMap::new();
        let mut ints = HashMap::new();
        for (name, view) in st.tensors() {
            let shape = view.shape().to_vec();
            let bytes = view.data();
            let storage = match view.dtype() {
                Dtype::F32
                    if cfg!(target_endian = "little") && (bytes.as_ptr() as usize) % 4 == 0 =>
                {
                    Storage::Mapped((bytes.as_ptr() as usize - base) / 4, bytes.len() / 4)
                }
                Dtype::F32 => Storage::Owned(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                Dtype::F16 => Storage::Owned(
                    bytes
                        .chunks_exact(2)
                        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                        .collect(),
                ),
                Dtype::BF16 => Storage::Owned(
                    bytes
                        .chunks_exact(2)
                        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                        .collect(),
                ),
                Dtype::I64 => {
                    ints.insert(
                        name,
                        bytes
                            .chunks_exact(8)
                            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                            .collect(),
                    );
                    continue;
                }
                other => return Err(WeightsError::Dtype(name, format!("{other:?}"))),
            };
            tensors.insert(name, (shape, storage));
        }
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(Self {
            map,
            tensors,
            ints,
            metadata,
            path: path.into(),
            arena: std::sync::OnceLock::new(),
        })
    }

    /// Path the weights came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata string.
    pub fn meta(&self, key: &str) -> Result<&str, WeightsError> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| WeightsError::Metadata(format!("key {key:?} missing")))
    }

    /// Shape of a float tensor, if the file has it.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|(s, _)| s.as_slice())
    }

    /// Names of the float tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Whether the tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor `name`, checked against `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<&[f32], WeightsError> {
        let (s, _) = self
            .tensors
            .get(name)
            .ok_or_else(|| WeightsError::Missing(name.into()))?;
        if s != shape {
            return Err(WeightsError::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                got: s.clone(),
            });
        }
        Ok(self.floats(name))
    }

    /// The floats of a tensor known to exist.
    fn floats(&self, name: &str) -> &[f32] {
        match &self.tensors[name].1 {
            Storage::Owned(v) => v,
            Storage::Mapped(off, len) => {
                let bytes = &self.map[off * 4..(off + len) * 4];
                // SAFETY: `bytes` lies inside the mapping (safetensors validated the offsets),
                // its address is 4-byte aligned (checked when the tensor was classified as
                // Mapped), its length is len * 4, any bit pattern is a valid f32, and the host
                // is little-endian like the file (checked at the same place). The slice
                // borrows `self`, which owns the mapping.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), *len) }
            }
        }
    }

    /// Tensor `name`, checked against `shape`, as an f32 candle tensor on `device`.
    pub fn tensor(
        &self,
        name: &str,
        shape: &[usize],
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor, WeightsError> {
        let data = self.get(name, shape)?;
        let bad = |e: candle_core::Error| WeightsError::Metadata(format!("tensor {name:?}: {e}"));
        if !device.is_cpu() {
            return candle_core::Tensor::from_slice(data, shape, device).map_err(bad);
        }
        let (arena, at) = self.arena();
        arena
            .narrow(0, at[name], data.len())
            .and_then(|t| t.reshape(shape))
            .map_err(bad)
    }

    /// One CPU buffer holding every float tensor, so that loading a model costs one copy
    /// into a few huge pages instead of a page fault per 4 KiB of every tensor (in a fresh
    /// process that was ~10 ms of TinyDiT's load). Tensors are views into it.
    fn arena(&self) -> &(candle_core::Tensor, HashMap<String, usize>) {
        self.arena.get_or_init(|| {
            let mut names: Vec<&String> = self.tensors.keys().collect();
            names.sort();
            let total: usize = names.iter().map(|n| self.storage_len(n)).sum();
            // Room to start the data on a 2 MiB boundary, where huge pages can back it.
            const HUGE: usize = 2 << 20;
            let pad = HUGE / 4;
            let mut v: Vec<f32> = Vec::with_capacity(total + pad);
            let addr = v.as_ptr() as usize;
            let start = (addr.div_ceil(HUGE) * HUGE - addr) / 4;
            let end = addr + (total + pad) * 4;
            let aligned = addr + start * 4;
            if end > aligned + HUGE {
                // SAFETY: [aligned, end) lies inside `v`'s allocation (capacity total + pad
                // floats from addr); MADV_HUGEPAGE only changes how the kernel backs the
                // range, never its contents or validity. Failure (no THP) is harmless.
                unsafe {
                    libc::madvise(
                        aligned as *mut libc::c_void,
                        (end - aligned) / HUGE * HUGE,
                        libc::MADV_HUGEPAGE,
                    );
                }
            }
            v.resize(start, 0.0);
            let mut at = HashMap::with_capacity(names.len());
            for n in names {
                at.insert(n.clone(), v.len());
                v.extend_from_slice(self.floats(n));
            }
            let len = v.len();
            let t = candle_core::Tensor::from_vec(v, len, &candle_core::Device::Cpu)
                .expect("a 1-D tensor of its own length");
            (t, at)
        })
    }

    fn storage_len(&self, name: &str) -> usize {
        match &self.tensors[name].1 {
            Storage::Owned(v) => v.len(),
            Storage::Mapped(_, len) => *len,
        }
    }

    /// An integer (I64) tensor, e.g. token ids in a golden file.
    pub fn get_i64(&self, name: &str) -> Result<&[i64], WeightsError> {
        self.ints
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| WeightsError::Missing(name.into()))
    }

    /// Tensor `name` with whatever shape it has.
    pub fn get_any(&self, name: &str) -> Result<(&[usize], &[f32]), WeightsError> {
        let (s, _) = self
            .tensors
            .get(name)
            .ok_or_else(|| WeightsError::Missing(name.into()))?;
        let shape = s.clone();
        Ok((&self.tensors[name].0, self.get(name, &shape)?))
    }
}
