//! A request's state in one memory region that every worker process can map: the latent,
//! cached velocities, per-block K/V cache, the fresh rows a step's patch-steps produce, the
//! prompt's text context, the step conditioning, the patch layout and per-patch importances.
//! File-backed under `/dev/shm` for worker processes, anonymous in single-process mode; the
//! same code reads and writes both.
//!
//! Ownership protocol (what makes the shared mutable mapping sound): between a step's opening
//! and its barrier, the coordinator writes nothing, and each patch-step writes only the fresh
//! rows of its own tokens and its own importance slot; patches are disjoint. At the barrier
//! (every completion received through a pipe, a syscall that orders memory) the coordinator
//! alone commits. The warm-up writes the whole state and runs before any patch-step.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use flashdiff_models::Dims;

/// "FDST" + format version in the state header.
const MAGIC: u32 = u32::from_le_bytes(*b"FDST");
const VERSION: u32 = 3;
/// Header: magic, version, tokens, channels, kv_dim, kv_layers, words, region count (u32 each),
/// padded to 64 bytes.
const HEADER: usize = 64;

/// Regions of the state, each an f32 array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Region {
    /// Initial noise (kept so a re-run warm-up starts from the same point).
    X0,
    /// Current latent.
    X,
    /// Cached velocity of every token (last computed).
    Velocity,
    /// Attention keys cache, `depth x tokens x d`.
    CacheKeys,
    /// Attention values cache, `depth x tokens x d`.
    CacheValues,
    /// Fresh key rows written by this step's patch-steps.
    FreshKeys,
    /// Fresh value rows.
    FreshValues,
    /// Fresh velocity rows.
    FreshVelocity,
    /// Warm-up cross-attention, `tokens x words`.
    Cross,
    /// The prompt's conditioning (the model's [`flashdiff_models::Conditioning::context`]).
    Context,
    /// Step conditioning ([`flashdiff_models::Denoiser::step_cond`]).
    Cond,
    /// Patch of every token (as f32, exact below 2^24).
    PatchOf,
    /// Refinement importance of every patch (up to `tokens` patches).
    Importance,
    /// Monotask of every token at the current step (as f32): the index of the monotask that
    /// computes the token's patch, or -1 when the patch is skipped. Written by the
    /// coordinator when it opens a step, read by that step's monotasks.
    Monotask,
}

const REGIONS: usize = 14;

/// Offsets of every region for a model config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLayout {
    off: [usize; REGIONS + 1],
    dims: [u32; 5],
}

impl StateLayout {
    /// The regions for a model.
    pub fn new(dims: &Dims) -> Self {
        let (t, c, kv) = (
            dims.grid.tokens(),
            dims.channels,
            dims.kv_layers * dims.grid.tokens() * dims.kv_dim,
        );
        let sizes = [
            t * c,
            t * c,
            t * c,
            kv,
            kv,
            kv,
            kv,
            t * c,
            t * dims.words,
            dims.context_len,
            dims.cond_len,
            t,
            t,
            t,
        ];
        let mut off = [0usize; REGIONS + 1];
        for i in 0..REGIONS {
            off[i + 1] = off[i] + sizes[i];
        }
        Self {
            off,
            dims: [
                t as u32,
                c as u32,
                dims.kv_dim as u32,
                dims.kv_layers as u32,
                dims.words as u32,
            ],
        }
    }

    /// The dimensions a state header records: tokens, channels, kv_dim, kv_layers, words.
    pub fn dims_words(&self) -> [u32; 5] {
        self.dims
    }

    /// Bytes of a state.
    pub fn bytes(&self) -> usize {
        HEADER + self.off[REGIONS] * 4
    }
}

/// 16 random bytes from the kernel, as hex: names nobody can guess.
pub fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: getrandom writes at most `len - got` bytes into the buffer's tail, which
        // is valid and writable for that many bytes.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// One engine's directory of request state files: `ROOT/flashdiff-UID/ePID-RANDOM`, mode
/// 0700 (the per-user parent too), removed when the engine is dropped. Creating one sweeps
/// the directories of engines whose process is gone (a crashed predecessor's state files).
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Creates a fresh engine directory under `root` (e.g. `/dev/shm`), sweeping dead ones.
    pub fn create(root: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let parent = root.join(format!("flashdiff-{uid}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        // Refuse a parent someone else made (or made readable to others): state files hold
        // prompts' conditioning and latents.
        let meta = std::fs::symlink_metadata(&parent)?;
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(std::io::Error::other(format!(
                "{} is not a private directory of this user (owner {}, mode {:o})",
                parent.display(),
                meta.uid(),
                meta.mode() & 0o777
            )));
        }
        sweep(&parent);
        let path = parent.join(format!("e{}-{}", std::process::id(), random_hex()?));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes engine directories under `parent` whose process no longer exists.
fn sweep(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix('e'))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            log::info!(
                "removing {} left by a process that is gone",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

enum Backing {
    Anon,
    File(PathBuf),
}

/// One request's state.
pub struct SharedState {
    map: MmapMut,
    layout: StateLayout,
    backing: Backing,
}

impl std::fmt::Debug for SharedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedState")
            .field("bytes", &self.map.len())
            .field("path", &self.path())
            .finish()
    }
}

impl SharedState {
    /// A fresh zeroed state: anonymous memory when `dir` is `None`, else a new file in `dir`
    /// (an engine's [`StateDir`]) with an unpredictable name, mode 0600.
    pub fn create(layout: StateLayout, dir: Option<&Path>, request: u64) -> std::io::Result<Self> {
        let (map, backing) = match dir {
            None => (MmapMut::map_anon(layout.bytes())?, Backing::Anon),
            Some(d) => {
                use std::os::unix::fs::OpenOptionsExt;
                let path = d.join(format!("r{request}-{}.state", random_hex()?));
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                file.set_len(layout.bytes() as u64)?;
                // SAFETY: the file was just created by this process with create_new, sized
                // above, and is only shared with our own worker processes, which follow the
                // ownership protocol in the module docs; nothing truncates it while mapped.
                (unsafe { MmapMut::map_mut(&file) }?, Backing::File(path))
            }
        };
        let mut s = Self {
            map,
            layout,
            backing,
        };
        s.write_header();
        Ok(s)
    }

    /// Maps an existing state file and validates its header against `layout`.
    pub fn open(path: &Path, layout: StateLayout) -> Result<Self, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open state {}: {e}", path.display()))?;
        let len = file.metadata().map_err(|e| e.to_string())?.len() as usize;
        if len != layout.bytes() {
            return Err(format!(
                "state {} has {len} bytes, expected {}",
                path.display(),
                layout.bytes()
            ));
        }
        // SAFETY: the file belongs to our coordinator, which keeps it at this size until every
        // worker is done with the request; writes follow the ownership protocol (module docs).
        let map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|e| format!("cannot map state {}: {e}", path.display()))?;
        let s = Self {
            map,
            layout,
            backing: Backing::Anon,
        };
        s.check_header()
            .map_err(|e| format!("state {}: {e}", path.display()))?;
        Ok(s)
    }

    /// The header's words as stored (magic, version, dimensions, region count).
    pub fn header_bytes(&self) -> &[u8] {
        &self.map[..32]
    }

    fn header_words(&self) -> [u32; 8] {
        let mut h = [0u32; 8];
        for (i, w) in h.iter_mut().enumerate() {
            *w = u32::from_le_bytes(self.map[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        }
        h
    }

    fn write_header(&mut self) {
        let d = self.layout.dims;
        let h = [MAGIC, VERSION, d[0], d[1], d[2], d[3], d[4], REGIONS as u32];
        for (i, w) in h.iter().enumerate() {
            self.map[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
    }

    fn check_header(&self) -> Result<(), String> {
        let h = self.header_words();
        let d = self.layout.dims;
        if h[0] != MAGIC {
            return Err("bad magic: not a FlashDiff request state".into());
        }
        if h[1] != VERSION {
            return Err(format!(
                "format version {}, this build reads {VERSION}",
                h[1]
            ));
        }
        if h[2..7] != d || h[7] != REGIONS as u32 {
            return Err(format!(
                "dimensions {:?} do not match the model {:?}",
                &h[2..8],
                d
            ));
        }
        Ok(())
    }

    /// The layout this state was made with.
    pub fn layout(&self) -> &StateLayout {
        &self.layout
    }

    /// The file path, when file-backed.
    pub fn path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::File(p) => Some(p),
            Backing::Anon => None,
        }
    }

    fn range(&self, r: Region) -> (usize, usize) {
        let i = r as usize;
        (
            HEADER + self.layout.off[i] * 4,
            self.layout.off[i + 1] - self.layout.off[i],
        )
    }

    /// A region, read-only.
    pub fn get(&self, r: Region) -> &[f32] {
        let (at, len) = self.range(r);
        let bytes = &self.map[at..at + len * 4];
        // SAFETY: the mapping is page-aligned and HEADER and every region offset are multiples
        // of 4 bytes, so the pointer is f32-aligned; the range lies inside the mapping (layout
        // sizes sum to its length); any bit pattern is a valid f32. The borrow of `self` keeps
        // the mapping alive; concurrent writers touch disjoint rows (module docs).
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), len) }
    }

    /// A region, writable.
    pub fn get_mut(&mut self, r: Region) -> &mut [f32] {
        let (at, len) = self.range(r);
        let bytes = &mut self.map[at..at + len * 4];
        // SAFETY: as in `get`, and the unique borrow of `self` rules out other references into
        // this mapping from this process.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), len) }
    }

    /// Writes `data` at element `at` of region `r` without borrowing the rest of the region:
    /// how a patch-step writes its own rows while other workers write theirs.
    pub fn write_at(&mut self, r: Region, at: usize, data: &[f32]) {
        let (start, len) = self.range(r);
        assert!(
            at + data.len() <= len,
            "write_at: {} + {} past region {r:?} of {len}",
            at,
            data.len()
        );
        // SAFETY: the destination lies inside the region (asserted) and the mapping, is
        // f32-aligned (see `get`), and does not overlap `data` (a borrow of other memory);
        // only these bytes are touched, so writers of other rows are not aliased.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(start).cast::<f32>().add(at),
                data.len(),
            );
        }
    }

    /// Two regions at once: one read, one written (they never overlap).
    pub fn get_pair(&mut self, read: Region, write: Region) -> (&[f32], &mut [f32]) {
        assert_ne!(read, write, "get_pair: the same region twice");
        let (ra, rl) = self.range(read);
        let (wa, wl) = self.range(write);
        let base = self.map.as_mut_ptr();
        // SAFETY: both ranges lie inside the mapping, are f32-aligned (see `get`), and are
        // disjoint because distinct regions occupy disjoint offset intervals of the layout;
        // the unique borrow of `self` covers both for the returned lifetime.
        unsafe {
            (
                std::slice::from_raw_parts(base.add(ra).cast::<f32>(), rl),
                std::slice::from_raw_parts_mut(base.add(wa).cast::<f32>(), wl),
            )
        }
    }
}

impl Drop for SharedState {
    fn drop(&mut self) {
        if let Backing::File(p) = &self.backing {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Whether a state file exists (tests check that finished requests leave none behind).
pub fn exists(path: &Path) -> bool {
    File::open(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashdiff_models::LatentGrid;

    fn dims(kv_dim: usize) -> Dims {
        Dims {
            grid: LatentGrid {
                frames: 1,
                height: 2,
                width: 2,
            },
            channels: 48,
            kv_layers: 2,
            kv_dim,
            words: 4,
            context_len: 8 + 2 * 2 * 4 * 8,
            cond_len: 2 * 6 * 8 + 2 * 8,
        }
    }

    #[test]
    fn files_round_trip_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir();
        let layout = StateLayout::new(&dims(8));
        let mut s = SharedState::create(layout.clone(), Some(&dir), 424242).unwrap();
        s.get_mut(Region::X)[3] = 1.5;
        s.write_at(Region::Importance, 1, &[0.25]);
        let path = s.path().unwrap().to_path_buf();
        let o = SharedState::open(&path, layout.clone()).unwrap();
        assert_eq!(o.get(Region::X)[3], 1.5);
        assert_eq!(o.get(Region::Importance)[1], 0.25);
        // Wrong model dimensions.
        let other = StateLayout::new(&dims(16));
        assert!(SharedState::open(&path, other)
            .unwrap_err()
            .contains("bytes"));
        // Corrupt magic.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0xFF;
        let bad = dir.join("flashdiff-bad-magic.state");
        std::fs::write(&bad, &bytes).unwrap();
        assert!(SharedState::open(&bad, layout.clone())
            .unwrap_err()
            .contains("magic"));
        std::fs::remove_file(&bad).ok();
        drop(o);
        drop(s);
        assert!(
            !exists(&path),
            "state file not removed when the request ended"
        );
        assert!(SharedState::open(&path, layout)
            .unwrap_err()
            .contains("cannot open"));
    }

    #[test]
    fn engine_directories_are_private_and_swept_after_their_process() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("fd-statedir-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let a = StateDir::create(&root).unwrap();
        let parent = a.path().parent().unwrap().to_path_buf();
        // A crashed predecessor (no such pid) and a live one (this process).
        let dead = parent.join("e999999999-0123");
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::write(dead.join("r1-x.state"), b"left behind").unwrap();
        let b = StateDir::create(&root).unwrap();
        assert!(!dead.exists(), "a dead engine's directory was not swept");
        assert!(a.path().exists(), "a live engine's directory was swept");
        assert_ne!(a.path(), b.path());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&parent), 0o700);
        assert_eq!(mode(b.path()), 0o700);
        let layout = StateLayout::new(&dims(4));
        let s1 = SharedState::create(layout.clone(), Some(b.path()), 7).unwrap();
        let s2 = SharedState::create(layout, Some(b.path()), 7).unwrap();
        assert_eq!(mode(s1.path().unwrap()), 0o600);
        assert_ne!(s1.path(), s2.path(), "names must not be predictable");
        let kept = b.path().to_path_buf();
        drop((s1, s2, b));
        assert!(!kept.exists(), "an engine's directory outlived it");
        // A shared parent made by someone else (here: readable by others) is refused.
        drop(a);
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(StateDir::create(&root)
            .unwrap_err()
            .to_string()
            .contains("private"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
