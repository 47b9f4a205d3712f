//! Weights from a safetensors file, mapped read-only: little-endian, 4-byte-aligned f32
//! tensors are used in place; misaligned f32 tensors are copied once; f16/bf16 tensors stay
//! in the mapping and are widened to f32 only when read as f32 (once, on first use), so a
//! model that computes in bf16 ([`Weights::tensor_in`]) never holds an f32 copy of them.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// Why a weights file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be opened or mapped.
    #[error("cannot read weights {path}: {source}", path = .0.display(), source = .1)]
    Io(PathBuf, #[source] std::io::Error),
    /// Not a valid safetensors file (truncated, bad header, overlapping offsets).
    #[error("{path} is not a valid safetensors file: {why}", path = .0.display(), why = .1)]
    Format(PathBuf, String),
    /// A tensor the model needs is absent.
    #[error("weights file has no tensor {0:?}")]
    Missing(String),
    /// A tensor has the wrong shape.
    #[error("tensor {name:?} has shape {got:?}, the model config needs {expected:?}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Shape the model config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        got: Vec<usize>,
    },
    /// A tensor has a dtype we cannot read.
    #[error("tensor {0:?} has dtype {1}; only F32, F16 and BF16 are supported")]
    Dtype(String, String),
    /// Metadata (config, vocabulary) missing or malformed.
    #[error("weights metadata: {0}")]
    Metadata(String),
    /// A tensor could not be read through candle's `VarBuilder`: the reader's own error
    /// (one of the above), as text.
    #[error("{0}")]
    Read(String),
}

#[derive(Debug)]
enum Storage {
    /// Float offset and length inside the mapping.
    Mapped(usize, usize),
    Owned(Vec<f32>),
    /// 16-bit floats: byte offset inside the mapping, element count, which format, and
    /// their f32 widening once something has read them as f32.
    Half {
        at: usize,
        len: usize,
        dtype: candle_core::DType,
        wide: std::sync::OnceLock<Vec<f32>>,
    },
}

/// Files with at most this many floats (1 GiB of f32) are copied into one arena when first
/// read on the CPU (the built-in models, far below it); a released model's checkpoint
/// (billions) is read tensor by tensor.
pub const ARENA_MAX_FLOATS: usize = 1 << 28;

/// Widens little-endian 16-bit floats (`dtype` F16 or BF16) to f32.
fn widen(bytes: &[u8], dtype: candle_core::DType) -> Vec<f32> {
    let pairs = bytes.chunks_exact(2).map(|b| [b[0], b[1]]);
    if dtype == candle_core::DType::F16 {
        pairs
            .map(|b| half::f16::from_le_bytes(b).to_f32())
            .collect()
    } else {
        pairs
            .map(|b| half::bf16::from_le_bytes(b).to_f32())
            .collect()
    }
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

/// Opening a file and reading its raw values.
impl Weights {
    /// Maps and validates a safetensors file.
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        let file = File::open(path).map_err(|e| WeightsError::Io(path.into(), e))?;
        let meta = file
            .metadata()
            .map_err(|e| WeightsError::Io(path.into(), e))?;
        if !meta.is_file() {
            return Err(WeightsError::Io(
                path.into(),
                std::io::Error::other("not a file (a .safetensors file is needed)"),
            ));
        }
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
                Dtype::F16 | Dtype::BF16 => Storage::Half {
                    at: bytes.as_ptr() as usize - base,
                    len: bytes.len() / 2,
                    dtype: if view.dtype() == Dtype::F16 {
                        candle_core::DType::F16
                    } else {
                        candle_core::DType::BF16
                    },
                    wide: std::sync::OnceLock::new(),
                },
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
        self.check(name, shape)?;
        Ok(self.floats(name))
    }

    /// The floats of a tensor known to exist.
    fn floats(&self, name: &str) -> &[f32] {
        match &self.tensors[name].1 {
            Storage::Owned(v) => v,
            Storage::Half {
                at,
                len,
                dtype,
                wide,
            } => wide.get_or_init(|| widen(&self.map[*at..at + len * 2], *dtype)),
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
}

/// Tensors on a device: checked, converted and copied once into one arena.
impl Weights {
    /// Tensor `name`, checked against `shape`, as an f32 candle tensor on `device`.
    pub fn tensor(
        &self,
        name: &str,
        shape: &[usize],
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor, WeightsError> {
        self.check(name, shape)?;
        let bad = |e: candle_core::Error| WeightsError::Metadata(format!("tensor {name:?}: {e}"));
        if !device.is_cpu() || self.total_floats() > ARENA_MAX_FLOATS {
            let data = self.floats_once(name);
            return candle_core::Tensor::from_slice(&data, shape, device).map_err(bad);
        }
        let (arena, at) = self.arena();
        arena
            .narrow(0, at[name], self.storage_len(name))
            .and_then(|t| t.reshape(shape))
            .map_err(bad)
    }

    /// An error unless tensor `name` exists with shape `shape`.
    fn check(&self, name: &str, shape: &[usize]) -> Result<(), WeightsError> {
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
        Ok(())
    }

    /// The floats of a tensor known to exist; a 16-bit one not yet widened is widened for
    /// this call alone, not kept.
    fn floats_once(&self, name: &str) -> std::borrow::Cow<'_, [f32]> {
        match &self.tensors[name].1 {
            Storage::Half {
                at,
                len,
                dtype,
                wide,
            } if wide.get().is_none() => {
                std::borrow::Cow::Owned(widen(&self.map[*at..at + len * 2], *dtype))
            }
            _ => std::borrow::Cow::Borrowed(self.floats(name)),
        }
    }

    fn total_floats(&self) -> usize {
        self.tensors.keys().map(|n| self.storage_len(n)).sum()
    }

    /// Tensor `name`, checked against `shape`, as a `dtype` (F32, F16 or BF16) candle tensor
    /// on `device`. A 16-bit tensor asked for in its own format is read from the mapping as
    /// it is, without an f32 copy; any other pair goes through f32 for that tensor alone.
    pub fn tensor_in(
        &self,
        name: &str,
        shape: &[usize],
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> Result<candle_core::Tensor, WeightsError> {
        use candle_core::DType;
        if dtype == DType::F32 {
            return self.tensor(name, shape, device);
        }
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(WeightsError::Dtype(
                name.into(),
                format!("{dtype:?} (asked for)"),
            ));
        }
        self.check(name, shape)?;
        let storage = &self.tensors[name].1;
        let bad = |e: candle_core::Error| WeightsError::Metadata(format!("tensor {name:?}: {e}"));
        match storage {
            Storage::Half {
                at, len, dtype: d, ..
            } if *d == dtype => candle_core::Tensor::from_raw_buffer(
                &self.map[*at..at + len * 2],
                dtype,
                shape,
                device,
            ),
            Storage::Half {
                at, len, dtype: d, ..
            } => candle_core::Tensor::from_vec(
                widen(&self.map[*at..at + len * 2], *d),
                shape,
                device,
            )
            .and_then(|t| t.to_dtype(dtype)),
            _ => candle_core::Tensor::from_slice(&self.floats_once(name), shape, device)
                .and_then(|t| t.to_dtype(dtype)),
        }
        .map_err(bad)
    }

    /// How many 16-bit tensors have been widened to f32 and kept (read as f32 one by one).
    pub fn widened(&self) -> usize {
        self.tensors
            .values()
            .filter(|(_, s)| matches!(s, Storage::Half { wide, .. } if wide.get().is_some()))
            .count()
    }

    /// One CPU buffer holding every float tensor (files up to [`ARENA_MAX_FLOATS`]; a
    /// larger one's tensors are copied one by one, so that reading a few of them in f32
    /// never widens the whole file), so that loading a model costs one copy
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
                match &self.tensors[n.as_str()].1 {
                    // Widened straight into the arena, not kept twice.
                    Storage::Half {
                        at,
                        len,
                        dtype,
                        wide,
                    } if wide.get().is_none() => {
                        v.extend(widen(&self.map[*at..at + len * 2], *dtype));
                    }
                    _ => v.extend_from_slice(self.floats(n)),
                }
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
            Storage::Mapped(_, len) | Storage::Half { len, .. } => *len,
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// A file with one bf16 matrix, one f16 vector and one f32 vector.
    fn file(dir: &Path) -> PathBuf {
        let m: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 2.0).collect();
        let bf: Vec<u8> = m
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect();
        let hf: Vec<u8> = [1.5f32, -0.25, 3.0]
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect();
        let f: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            (
                "m.weight",
                safetensors::tensor::TensorView::new(Dtype::BF16, vec![3, 4], &bf),
            ),
            (
                "h",
                safetensors::tensor::TensorView::new(Dtype::F16, vec![3], &hf),
            ),
            (
                "f",
                safetensors::tensor::TensorView::new(Dtype::F32, vec![2], &f),
            ),
        ];
        let views: Vec<_> = views.into_iter().map(|(n, v)| (n, v.unwrap())).collect();
        let p = dir.join("w.safetensors");
        safetensors::tensor::serialize_to_file(views, &None, &p).unwrap();
        p
    }

    #[test]
    fn sixteen_bit_tensors_are_read_in_their_dtype_without_an_f32_copy() {
        let dir = std::env::temp_dir().join(format!("flashdiff-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = Weights::open(&file(&dir)).unwrap();
        let cpu = Device::Cpu;
        let m = w.tensor_in("m.weight", &[3, 4], DType::BF16, &cpu).unwrap();
        assert_eq!(m.dtype(), DType::BF16);
        let want: Vec<half::bf16> = (0..12)
            .map(|i| half::bf16::from_f32(i as f32 * 0.37 - 2.0))
            .collect();
        assert_eq!(
            m.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap(),
            want
        );
        // f16 asked for as bf16, f32 as f16: converted, one tensor at a time.
        let h = w.tensor_in("h", &[3], DType::BF16, &cpu).unwrap();
        assert_eq!(
            h.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(),
            [1.5, -0.25, 3.0]
        );
        let f = w.tensor_in("f", &[2], DType::F16, &cpu).unwrap();
        assert_eq!(f.dtype(), DType::F16);
        assert_eq!(w.widened(), 0, "a 16-bit read kept an f32 copy");
        // As f32 through the arena (small file): widened into it, not kept beside it.
        let m32 = w.tensor("m.weight", &[3, 4], &cpu).unwrap();
        assert_eq!(m32.dims(), [3, 4]);
        assert_eq!(w.widened(), 0);
        // `get` hands out a slice, so that one is widened and kept.
        assert_eq!(w.get("h", &[3]).unwrap(), [1.5, -0.25, 3.0]);
        assert_eq!(w.widened(), 1);
        // Wrong shape, missing tensor, unsupported dtype: errors that say so.
        let e = w
            .tensor_in("m.weight", &[4, 3], DType::BF16, &cpu)
            .unwrap_err();
        assert!(e.to_string().contains("[3, 4]"), "{e}");
        let e = w.tensor_in("nope", &[1], DType::BF16, &cpu).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = w.tensor_in("f", &[2], DType::U8, &cpu).unwrap_err();
        assert!(e.to_string().contains("U8"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
