//! A request's checkpoint: everything needed to continue it from its last committed step in
//! another process (after the coordinator or server died): settings, prompt, step, patch
//! layout, extrapolation state, what the request's method remembers (its own record, named
//! arrays: the change budget's, the patch gate's, a cache's), report counters and the committed regions of its state. One file per request, replaced atomically (written to a temporary name, then
//! renamed) at every step boundary; mode 0600. Format: a 24-byte header (magic "FDCK",
//! format version, payload length, CRC-32 of the payload) and an rkyv archive, mapped and
//! validated (bytecheck) on open. Bytes that are truncated, flipped or of another version
//! are refused with an error, never trusted.

use std::io::Write;
use std::path::{Path, PathBuf};

use rkyv::rancor::Error as RkyvError;

const MAGIC: [u8; 4] = *b"FDCK";
const VERSION: u32 = 9;
const HEADER: usize = 24;
/// Largest checkpoint accepted (far above any model's request state today).
pub const MAX_CHECKPOINT: u64 = 1 << 34;

pub use records::*;

// rkyv's derives generate `Archived*` types without docs; the records are documented here.
#[allow(missing_docs)]
mod records {
    use rkyv::{Archive, Deserialize, Serialize};

    /// Settings of a request ([`crate::engine::RequestConfig`]), in plain numbers.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct ConfigRecord {
        pub steps: u32,
        pub warmup: u32,
        pub patches: Option<u32>,
        pub epsilon: f32,
        pub adaptive_epsilon: bool,
        pub max_skip: u32,
        /// The work budget, if any.
        pub budget: Option<f32>,
        pub seed: u64,
        /// [`crate::engine::Mode`] by name.
        pub mode: String,
        pub priority: u8,
        /// 0 saliency, 1 uniform.
        pub layout: u8,
        pub cache_threshold: f32,
        pub ras_ratio: f32,
        pub auto_dispersion: f32,
        /// [`crate::engine::Reuse::code`]: 0 stale, 1 extrapolated, 2 second order, 3 and 4
        /// corrected first and second order (one byte, so records written when this was a
        /// bool read the same).
        pub reuse: u8,
        pub monotasks: Option<u32>,
        pub deadline_ns: Option<u64>,
    }

    /// One named array of what a request's method remembers between steps: floats or
    /// counts (one of the two is empty). Each method writes and reads its own names.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct MemoryRecord {
        pub name: String,
        pub floats: Vec<f32>,
        pub counts: Vec<u32>,
    }

    /// Extrapolation state of every token.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct TrackRecord {
        pub kv_weight: f32,
        pub k_base: Vec<f32>,
        pub v_base_kv: Vec<f32>,
        pub k_slope: Vec<f32>,
        pub v_slope_kv: Vec<f32>,
        pub v_base: Vec<f32>,
        pub v_slope: Vec<f32>,
        /// Second divided differences of the velocities (empty at first order).
        pub v_curve: Vec<f32>,
        /// Steps between each token's last two computations (0: one computation so far).
        pub gap: Vec<u32>,
        pub last: Vec<u32>,
    }

    /// Report counters so far (durations in nanoseconds).
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct ReportRecord {
        pub patches: u32,
        pub patch_steps: u64,
        pub computed: u64,
        pub computed_tokens: u64,
        pub active_per_step: Vec<u32>,
        /// warm-up, partition, gate, compute, schedule, io.
        pub time_ns: [u64; 6],
        pub epsilon_sum: f64,
        pub epsilon_steps: u32,
        pub reuse_err2: f64,
        pub reuse_norm2: f64,
        /// The automatic choice ([`crate::engine::Mode::Auto`]): regional or not, and the
        /// dispersion it was made on.
        pub choice: Option<(bool, f32)>,
    }

    /// One request between two steps.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub struct Checkpoint {
        pub id: u64,
        pub prompt: String,
        pub cfg: ConfigRecord,
        /// Submission time, nanoseconds since the Unix epoch (latency counts from it).
        pub submitted_unix_ns: u64,
        /// The next step to open (the last committed one + 1).
        pub step: u32,
        /// The model's dimensions (tokens, channels, kv_dim, kv_layers, words): a
        /// checkpoint of another model is refused.
        pub dims: [u32; 5],
        pub patch_of: Vec<u32>,
        pub patches: u32,
        pub active: Vec<bool>,
        pub track: Option<TrackRecord>,
        /// What the request's method remembers, as it wrote it.
        pub memory: Vec<MemoryRecord>,
        pub report: ReportRecord,
        /// Committed regions, in [`super::SAVED_REGIONS`] order.
        pub regions: Vec<Vec<f32>>,
    }
}

/// The state regions a checkpoint keeps: what a step reads that the coordinator committed.
/// The others are rewritten when a step opens (monotask map, step conditioning), by the
/// step's monotasks (fresh rows, importances), or recomputed from the prompt (context).
pub const SAVED_REGIONS: [crate::state::Region; 7] = {
    use crate::state::Region::*;
    [X0, X, Velocity, CacheKeys, CacheValues, Cross, PatchOf]
};

/// Encodes a checkpoint with its header.
pub fn encode(c: &Checkpoint) -> Vec<u8> {
    let payload = rkyv::to_bytes::<RkyvError>(c).expect("checkpoints always serialise");
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&payload);
    out
}

/// Decodes and validates a checkpoint from untrusted bytes.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
    if bytes.len() < HEADER {
        return Err(format!(
            "checkpoint truncated: {} bytes, the header alone is {HEADER}",
            bytes.len()
        ));
    }
    if bytes[..4] != MAGIC {
        return Err("not a FlashDiff checkpoint (bad magic)".into());
    }
    let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(format!(
            "checkpoint format version {version}, this build reads {VERSION}"
        ));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if len > MAX_CHECKPOINT || len != (bytes.len() - HEADER) as u64 {
        return Err(format!(
            "checkpoint truncated or padded: header says {len} payload bytes, found {}",
            bytes.len() - HEADER
        ));
    }
    if bytes[20..24] != [0u8; 4] {
        return Err("checkpoint corrupt: reserved header bytes are not zero".into());
    }
    let payload = &bytes[HEADER..];
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if crc32fast::hash(payload) != crc {
        return Err("checkpoint corrupt: its checksum does not match".into());
    }
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(payload.len());
    aligned.extend_from_slice(payload);
    rkyv::from_bytes::<Checkpoint, RkyvError>(&aligned)
        .map_err(|e| format!("checkpoint invalid: {e}"))
}

/// The checkpoint file of request `id` in `dir`.
pub fn path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("request-{id}.ckpt"))
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, mode 0600,
/// then rename): a reader sees the old file or the new one, never a partial one. With `sync`
/// the data and then the directory entry are on disk before it returns.
pub fn write_atomic(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    if sync {
        f.sync_data()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if sync {
        // The rename itself is durable only once the directory entry is.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
    }
    Ok(())
}

/// Maps and decodes a checkpoint file.
pub fn read(path: &Path) -> Result<Checkpoint, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot open checkpoint {}: {e}", path.display()))?;
    let len = file
        .metadata()
        .map_err(|e| format!("checkpoint {}: {e}", path.display()))?
        .len();
    if len > MAX_CHECKPOINT + HEADER as u64 {
        return Err(format!(
            "checkpoint {} is too large ({len} bytes)",
            path.display()
        ));
    }
    if len == 0 {
        return decode(&[]).map_err(|e| format!("checkpoint {}: {e}", path.display()));
    }
    // SAFETY: the file is ours (mode 0600 in our state directory) and replaced only by
    // rename, never truncated in place, so the mapping stays valid while we read it; every
    // byte is validated by decode before use.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| format!("cannot map checkpoint {}: {e}", path.display()))?;
    decode(&map).map_err(|e| format!("checkpoint {}: {e}", path.display()))
}

/// A small, valid checkpoint (for tests and the fuzz harness).
#[doc(hidden)]
pub fn sample() -> Checkpoint {
    Checkpoint {
        id: 3,
        prompt: "a red circle".into(),
        cfg: ConfigRecord {
            steps: 10,
            warmup: 2,
            patches: Some(4),
            epsilon: 0.1,
            adaptive_epsilon: false,
            max_skip: 3,
            budget: None,
            seed: 9,
            mode: "flashdiff".into(),
            priority: 1,
            layout: 0,
            cache_threshold: 0.1,
            ras_ratio: 0.5,
            auto_dispersion: 0.5,
            reuse: 1,
            monotasks: None,
            deadline_ns: Some(5),
        },
        submitted_unix_ns: 1,
        step: 4,
        dims: [4, 3, 2, 1, 2],
        patch_of: vec![0, 1, 2, 3],
        patches: 4,
        active: vec![true; 4],
        track: None,
        memory: vec![
            MemoryRecord {
                name: "budget.accumulated".into(),
                floats: vec![0.0, 0.05, f32::INFINITY, 0.0],
                counts: Vec::new(),
            },
            MemoryRecord {
                name: "budget.skipped_run".into(),
                floats: Vec::new(),
                counts: vec![0, 1, 0, 0],
            },
        ],
        report: ReportRecord {
            patches: 4,
            patch_steps: 8,
            computed: 7,
            computed_tokens: 7,
            active_per_step: vec![4, 3],
            time_ns: [1, 2, 3, 4, 5, 6],
            epsilon_sum: 0.0,
            epsilon_steps: 0,
            reuse_err2: 0.0,
            reuse_norm2: 0.0,
            choice: Some((true, 0.75)),
        },
        regions: vec![vec![0.5; 12]; 7],
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let c = sample();
        let bytes = encode(&c);
        assert_eq!(decode(&bytes).unwrap(), c);
        for cut in [0, 3, HEADER - 1, HEADER, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut v = bytes.clone();
        v[5] ^= 1;
        assert!(decode(&v).unwrap_err().contains("version"));
        for at in [0, 9, 17, HEADER + 3, bytes.len() / 2, bytes.len() - 1] {
            let mut f = bytes.clone();
            f[at] ^= 0x10;
            assert!(decode(&f).is_err(), "bit flip at {at} accepted");
        }
    }

    #[test]
    fn files_are_written_atomically_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fd-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = path(&dir, 3);
        write_atomic(&p, &encode(&sample()), false).unwrap();
        assert_eq!(read(&p).unwrap(), sample());
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::write(&p, b"FDCK").unwrap();
        assert!(read(&p).unwrap_err().contains("truncated"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
