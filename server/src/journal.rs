//! The HTTP server's durable job table, in its state directory (`serve --state-dir`):
//!
//! - `journal`: append-only records, each `[payload length u32][CRC-32 u32][rkyv payload]`,
//!   synced to disk when appended: a job's admission (prompt, settings, PNG scale) and its
//!   end (succeeded, failed, cancelled, with the error). Replay stops at the first torn or
//!   damaged record (the one being written when the process died) and cuts it off.
//! - `results/ID.png`, `results/ID.json`: a succeeded job's image and report, written
//!   (atomically, synced) before its end record.
//! - `checkpoints/`: the engine's per-request checkpoints (replaced at every step).
//! - `lock`: held (flock) while a server uses the directory, so two cannot share one.
//!
//! Everything is mode 0600 in 0700 directories.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use flashdiff_runtime::checkpoint::{write_atomic, ConfigRecord};
use flashdiff_runtime::engine::create_private_dir;
use rkyv::rancor::Error as RkyvError;

/// Largest journal record accepted (a prompt and settings; prompts are bounded far below).
const MAX_RECORD: u32 = 1 << 20;

pub use records::*;

#[allow(missing_docs)]
mod records {
    use flashdiff_runtime::checkpoint::ConfigRecord;
    use rkyv::{Archive, Deserialize, Serialize};

    /// One journal record.
    #[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
    pub enum Entry {
        Submitted {
            id: u64,
            prompt: String,
            cfg: ConfigRecord,
            scale: u32,
            created: u64,
        },
        /// `phase`: 0 succeeded, 1 failed, 2 cancelled.
        Finished { id: u64, phase: u8, error: String },
    }
}

/// A job as the journal knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub id: u64,
    pub prompt: String,
    pub cfg: ConfigRecord,
    pub scale: u32,
    pub created: u64,
    /// `(phase, error)` once it ended.
    pub end: Option<(u8, String)>,
}

/// The open state directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    journal: File,
    _lock: File,
}

/// Encodes one record with its frame.
pub fn frame(e: &Entry) -> Vec<u8> {
    let payload = rkyv::to_bytes::<RkyvError>(e).expect("entries always serialise");
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Decodes records from untrusted bytes: every whole, intact record up to the first torn
/// or damaged one, and how many bytes those took (the rest is cut off on open).
pub fn replay_bytes(bytes: &[u8]) -> (Vec<Entry>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 8 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        if len > MAX_RECORD || bytes.len() - at - 8 < len as usize {
            break;
        }
        let payload = &bytes[at + 8..at + 8 + len as usize];
        if crc32fast::hash(payload) != crc {
            break;
        }
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(payload.len());
        aligned.extend_from_slice(payload);
        match rkyv::from_bytes::<Entry, RkyvError>(&aligned) {
            Ok(e) => out.push(e),
            Err(_) => break,
        }
        at += 8 + len as usize;
    }
    (out, at)
}

/// Whether a whole record with a matching CRC starts at `at` (a record [`replay_bytes`]
/// stopped at for its contents, not for a torn or damaged frame).
pub fn intact_record_at(bytes: &[u8], at: usize) -> bool {
    let Some(head) = bytes.get(at..at + 8) else {
        return false;
    };
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    len <= MAX_RECORD
        && bytes
            .get(at + 8..at + 8 + len as usize)
            .is_some_and(|payload| crc32fast::hash(payload) == crc)
}

/// Folds records into jobs, in id order.
pub fn jobs_of(entries: Vec<Entry>) -> Vec<JobRecord> {
    let mut jobs: std::collections::BTreeMap<u64, JobRecord> = Default::default();
    for e in entries {
        match e {
            Entry::Submitted {
                id,
                prompt,
                cfg,
                scale,
                created,
            } => {
                jobs.insert(
                    id,
                    JobRecord {
                        id,
                        prompt,
                        cfg,
                        scale,
                        created,
                        end: None,
                    },
                );
            }
            Entry::Finished { id, phase, error } => {
                if let Some(j) = jobs.get_mut(&id) {
                    j.end = Some((phase, error));
                }
            }
        }
    }
    jobs.into_values().collect()
}

impl Store {
    /// Opens (creating) a state directory, locks it, and replays its journal.
    pub fn open(dir: &Path) -> Result<(Self, Vec<JobRecord>), String> {
        let ctx = |what: &str, e: std::io::Error| {
            format!("state directory {}: {what}: {e}", dir.display())
        };
        for d in [
            dir.to_path_buf(),
            dir.join("results"),
            dir.join("checkpoints"),
        ] {
            create_private_dir(&d).map_err(|e| ctx("cannot create it", e))?;
        }
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join("lock"))
            .map_err(|e| ctx("cannot open its lock", e))?;
        // SAFETY: flock on a file descriptor we own; LOCK_NB makes it fail instead of wait.
        if unsafe {
            libc::flock(
                std::os::unix::io::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } != 0
        {
            return Err(format!(
                "state directory {} is in use by another flashdiff server (pass another --state-dir)",
                dir.display()
            ));
        }
        let path = dir.join("journal");
        let mut journal = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| ctx("cannot open its journal", e))?;
        let mut bytes = Vec::new();
        journal
            .read_to_end(&mut bytes)
            .map_err(|e| ctx("cannot read its journal", e))?;
        let (entries, good) = replay_bytes(&bytes);
        if intact_record_at(&bytes, good) {
            // Whole and intact by its CRC, yet not a record this build reads: not a torn
            // write but another format. Cutting it would lose every job from there on.
            return Err(format!(
                "state directory {}: its journal's record at byte {good} is intact but of a \
                 format this build does not read (written by another version of flashdiff); \
                 nothing was changed: serve it with the build that wrote it, or pass another \
                 --state-dir",
                dir.display()
            ));
        }
        if good < bytes.len() {
            log::warn!(
                "journal {}: cut off {} bytes of a torn or damaged record at its end",
                path.display(),
                bytes.len() - good
            );
            journal
                .set_len(good as u64)
                .map_err(|e| ctx("cannot cut its journal", e))?;
        }
        Ok((
            Self {
                dir: dir.into(),
                journal,
                _lock: lock,
            },
            jobs_of(entries),
        ))
    }

    /// Where the engine keeps its checkpoints.
    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// Appends a record and syncs it to disk.
    pub fn append(&mut self, e: &Entry) -> Result<(), String> {
        self.append_all(std::slice::from_ref(e))
    }

    /// Appends records and syncs them to disk once.
    pub fn append_all(&mut self, es: &[Entry]) -> Result<(), String> {
        let bytes: Vec<u8> = es.iter().flat_map(frame).collect();
        self.journal
            .write_all(&bytes)
            .and_then(|()| self.journal.sync_data())
            .map_err(|err| format!("cannot append to the journal: {err}"))
    }

    /// Rewrites the journal with only `jobs` (atomically): finished jobs beyond what the
    /// server keeps are forgotten, their result files removed.
    pub fn compact(&mut self, jobs: &[JobRecord], forget: &[u64]) -> Result<(), String> {
        let mut bytes = Vec::new();
        for j in jobs {
            bytes.extend(frame(&Entry::Submitted {
                id: j.id,
                prompt: j.prompt.clone(),
                cfg: j.cfg.clone(),
                scale: j.scale,
                created: j.created,
            }));
            if let Some((phase, error)) = &j.end {
                bytes.extend(frame(&Entry::Finished {
                    id: j.id,
                    phase: *phase,
                    error: error.clone(),
                }));
            }
        }
        let path = self.dir.join("journal");
        write_atomic(&path, &bytes, true)
            .map_err(|e| format!("cannot compact the journal: {e}"))?;
        self.journal = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("cannot reopen the journal: {e}"))?;
        for id in forget {
            self.remove_result(*id);
        }
        Ok(())
    }

    /// Saves a succeeded job's image and report (synced) before its end is journaled.
    pub fn save_result(
        &self,
        id: u64,
        png: &[u8],
        report: &serde_json::Value,
    ) -> Result<(), String> {
        let (p, j) = self.result_paths(id);
        write_atomic(&p, png, true)
            .and_then(|()| write_atomic(&j, report.to_string().as_bytes(), true))
            .map_err(|e| format!("cannot save the result of job {id}: {e}"))
    }

    /// A saved result, if readable.
    pub fn load_result(&self, id: u64) -> Option<(Vec<u8>, serde_json::Value)> {
        let (p, j) = self.result_paths(id);
        let png = std::fs::read(p).ok()?;
        let report = serde_json::from_slice(&std::fs::read(j).ok()?).ok()?;
        Some((png, report))
    }

    /// Removes a result's files (the job was forgotten).
    pub fn remove_result(&self, id: u64) {
        let (p, j) = self.result_paths(id);
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_file(j);
    }

    fn result_paths(&self, id: u64) -> (PathBuf, PathBuf) {
        let r = self.dir.join("results");
        (r.join(format!("{id}.png")), r.join(format!("{id}.json")))
    }
}

/// The per-user default state directory: `$XDG_STATE_HOME/flashdiff`, else
/// `$HOME/.local/state/flashdiff`, else `/tmp/flashdiff-state-UID`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("flashdiff");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".local/state/flashdiff");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    std::env::temp_dir().join(format!("flashdiff-state-{}", unsafe { libc::getuid() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ConfigRecord {
        flashdiff_runtime::checkpoint::sample().cfg
    }

    #[test]
    fn torn_and_damaged_tails_are_cut_and_the_rest_replays() {
        let a = Entry::Submitted {
            id: 1,
            prompt: "a red circle".into(),
            cfg: cfg(),
            scale: 2,
            created: 5,
        };
        let b = Entry::Finished {
            id: 1,
            phase: 0,
            error: String::new(),
        };
        let mut bytes = frame(&a);
        let first = bytes.len();
        bytes.extend(frame(&b));
        let (all, n) = replay_bytes(&bytes);
        assert_eq!((all.len(), n), (2, bytes.len()));
        // Every cut inside the second record keeps exactly the first.
        for cut in first..bytes.len() {
            let (got, n) = replay_bytes(&bytes[..cut]);
            assert_eq!((got.len(), n), (1, first), "cut at {cut}");
        }
        // A flipped bit anywhere in the second record stops replay before it.
        for at in first..bytes.len() {
            let mut f = bytes.clone();
            f[at] ^= 0x04;
            assert_eq!(replay_bytes(&f).0.len(), 1, "flip at {at}");
        }
        let jobs = jobs_of(all);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].end, Some((0, String::new())));
        assert!(replay_bytes(&[0xFF; 64]).0.is_empty());
    }

    #[test]
    fn an_intact_record_of_another_format_is_refused_not_cut() {
        let dir = std::env::temp_dir().join(format!("fd-journal-fmt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (mut s, _) = Store::open(&dir).unwrap();
        s.append(&Entry::Finished {
            id: 1,
            phase: 0,
            error: String::new(),
        })
        .unwrap();
        drop(s);
        // A whole record, its CRC right, whose payload this build cannot decode.
        let payload = [0xABu8; 24];
        let mut foreign = (payload.len() as u32).to_le_bytes().to_vec();
        foreign.extend(crc32fast::hash(&payload).to_le_bytes());
        foreign.extend(payload);
        let path = dir.join("journal");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend(&foreign);
        std::fs::write(&path, &bytes).unwrap();
        let e = Store::open(&dir).map(|_| ()).unwrap_err();
        assert!(e.contains("intact but of a format"), "{e}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the journal was changed"
        );
        // The same bytes with the CRC wrong are a damaged tail: cut, the rest replays.
        let n = bytes.len();
        bytes[n - payload.len() - 4] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, jobs) = Store::open(&dir).unwrap();
        assert!(jobs.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_is_locked_by_one_server_and_replayed_by_the_next() {
        let dir = std::env::temp_dir().join(format!("fd-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (mut s, jobs) = Store::open(&dir).unwrap();
        assert!(jobs.is_empty());
        assert!(Store::open(&dir).unwrap_err().contains("in use"));
        s.append(&Entry::Submitted {
            id: 7,
            prompt: "p".into(),
            cfg: cfg(),
            scale: 1,
            created: 0,
        })
        .unwrap();
        s.save_result(7, b"png", &serde_json::json!({"steps": 10}))
            .unwrap();
        s.append(&Entry::Finished {
            id: 7,
            phase: 0,
            error: String::new(),
        })
        .unwrap();
        drop(s);
        // A torn record at the end (a crash mid-append) is cut off.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("journal"))
            .unwrap();
        f.write_all(&[9, 0, 0, 0, 1]).unwrap();
        drop(f);
        let (s, jobs) = Store::open(&dir).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].end, Some((0, String::new())));
        let (png, report) = s.load_result(7).unwrap();
        assert_eq!(png, b"png");
        assert_eq!(report["steps"], 10);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("journal"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
