//! What a protocol run has measured so far, one line a result in `<dir>/measured.jsonl`, so
//! that a run stopped part-way (a study of hours on a large model, a session that ends)
//! continues where it stopped instead of starting again.
//!
//! - The first line names the model and a SHA-256 of its weights' files: a journal written
//!   for other weights is refused, never mixed in.
//! - Each later line is one request's result, keyed by the request's whole settings (its
//!   `RequestConfig`, seed included), so a setting or prompt the journal has not seen runs.
//! - A result is appended and flushed as soon as it is measured; a line cut short by a stop
//!   is ignored on reading.
//! - A build that computes differently would make old lines wrong: the first setting the run
//!   would take from the journal is computed again (with its prompt's full computation) and
//!   compared ([`Journal::verify`]); the run stops with an error that says so when the work or
//!   fidelity differ.

use anyhow::{bail, Context};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use flashdiff_runtime::engine::RequestConfig;

/// The journal's file in a study's folder.
pub const FILE: &str = "measured.jsonl";

/// A study's measured results, read back and appended to.
pub struct Journal {
    path: PathBuf,
    entries: HashMap<String, Value>,
    file: File,
    /// Whether a prompt taken from the journal has been computed again and matched.
    pub(crate) verified: bool,
}

impl Journal {
    /// Opens (or starts) the journal in `dir` for `model` with its weights at `weights` (a
    /// file or a folder). The error says why an existing journal cannot be continued.
    pub fn open(dir: &Path, model: &str, weights: &Path) -> anyhow::Result<Journal> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(FILE);
        let header =
            json!({"journal": 1, "model": model, "weights_sha256": weights_hash(weights)?});
        let mut entries = HashMap::new();
        if path.is_file() {
            let text = BufReader::new(
                File::open(&path).with_context(|| format!("cannot read {}", path.display()))?,
            );
            let mut lines = text.lines();
            let first: Value = match lines.next() {
                Some(l) => serde_json::from_str(&l?).unwrap_or(Value::Null),
                None => Value::Null,
            };
            if first != header && first != Value::Null {
                bail!(
                    "{} was measured for {} with weights {}, not {model} with weights {}: \
                     remove it (or give another --out-dir) to start again",
                    path.display(),
                    first["model"],
                    first["weights_sha256"],
                    header["weights_sha256"]
                );
            }
            for line in lines {
                // A line cut short by a stop is not JSON: what it held runs again.
                if let Ok(v) = serde_json::from_str::<Value>(&line?) {
                    if let Some(k) = v["key"].as_str() {
                        entries.insert(k.to_string(), v["result"].clone());
                    }
                }
            }
        }
        let fresh = entries.is_empty();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(!fresh)
            .write(true)
            .truncate(fresh)
            .open(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if fresh {
            writeln!(file, "{header}")?;
        } else if !ends_with_newline(&path)? {
            // A line cut short by a stop: the next result starts on a line of its own.
            writeln!(file)?;
        }
        Ok(Journal {
            path,
            entries,
            file,
            verified: fresh,
        })
    }

    /// Results read back from an earlier run.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was read back.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The result of the request `cfg`, if the journal has it.
    pub fn get(&self, cfg: &RequestConfig) -> Option<&Value> {
        self.entries.get(&key(cfg))
    }

    /// Records the result of the request `cfg` and flushes it to the file.
    pub fn put(&mut self, cfg: &RequestConfig, result: Value) -> anyhow::Result<()> {
        let k = key(cfg);
        writeln!(self.file, "{}", json!({"key": k, "result": result}))
            .and_then(|()| self.file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.entries.insert(k, result);
        Ok(())
    }

    /// Compares a result computed again (`now`) with the journal's for the same request; the
    /// error says that the build computes differently from the one that wrote the journal.
    pub fn verify(&mut self, cfg: &RequestConfig, now: &Value) -> anyhow::Result<()> {
        if let Some(then) = self.get(cfg) {
            for field in ["work", "db"] {
                // The file's decimal form reads back to within an ulp; nulls (a fidelity that
                // could not be measured) match nulls.
                let same = match (then[field].as_f64(), now[field].as_f64()) {
                    (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                    (a, b) => a.is_none() && b.is_none(),
                };
                if !same {
                    bail!(
                        "{}: seed {} ({:?}) now gives {field} {} where the journal holds {}: this \
                         build computes differently from the one that measured it; remove the \
                         journal to start again",
                        self.path.display(),
                        cfg.seed,
                        cfg.mode,
                        now[field],
                        then[field]
                    );
                }
            }
        }
        self.verified = true;
        Ok(())
    }
}

/// Whether the file's last byte is a newline.
fn ends_with_newline(path: &Path) -> anyhow::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    if f.seek(SeekFrom::End(0))? == 0 {
        return Ok(true);
    }
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    f.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// A request's key: its whole settings.
fn key(cfg: &RequestConfig) -> String {
    format!("{cfg:?}")
}

/// SHA-256 of a weights file, or of a model folder's weights: the files in its subfolders
/// (`transformer/`, `text_encoder/`, ...; names and contents, in name order), not the files
/// beside them (its card, golden outputs, evaluation) nor a training run's `checkpoint/`.
fn weights_hash(path: &Path) -> anyhow::Result<String> {
    let mut files = Vec::new();
    if path.is_dir() {
        for e in
            std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            let p = e?.path();
            // A training run's state beside the weights is not the model.
            if p.is_dir() && p.file_name().is_none_or(|n| n != "checkpoint") {
                collect(&p, &mut files)?;
            }
        }
    } else {
        files.push(path.to_path_buf());
    }
    files.sort();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        h.update(
            f.strip_prefix(path)
                .unwrap_or(f)
                .to_string_lossy()
                .as_bytes(),
        );
        let mut r = File::open(f).with_context(|| format!("cannot read {}", f.display()))?;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if path.is_dir() {
        for e in
            std::fs::read_dir(path).with_context(|| format!("cannot read {}", path.display()))?
        {
            collect(&e?.path(), out)?;
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fd-journal-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn results_survive_a_stop_and_other_weights_are_refused() {
        let d = dir("survive");
        let w = d.join("w.safetensors");
        std::fs::write(&w, b"weights one").unwrap();
        let a = RequestConfig {
            seed: 3,
            ..RequestConfig::default()
        };
        let b = RequestConfig {
            seed: 4,
            ..RequestConfig::default()
        };
        let mut j = Journal::open(&d, "m", &w).unwrap();
        assert!(j.is_empty() && j.verified);
        j.put(&a, json!({"work": 0.5, "db": 40.0})).unwrap();
        drop(j);
        // A stop in the middle of a line: the cut line is ignored.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join(FILE))
            .unwrap();
        write!(f, "{{\"key\": \"cut").unwrap();
        drop(f);
        let mut j = Journal::open(&d, "m", &w).unwrap();
        assert_eq!(j.len(), 1);
        assert!(!j.verified);
        assert_eq!(j.get(&a).unwrap()["db"], 40.0);
        assert!(j.get(&b).is_none());
        // The same numbers computed again: verified; different ones: refused.
        j.verify(&a, &json!({"work": 0.5, "db": 40.0})).unwrap();
        assert!(j.verified);
        let e = j.verify(&a, &json!({"work": 0.5, "db": 41.0})).unwrap_err();
        assert!(e.to_string().contains("computes differently"), "{e}");
        j.put(&b, json!({"work": 0.25, "db": 30.0})).unwrap();
        drop(j);
        assert_eq!(Journal::open(&d, "m", &w).unwrap().len(), 2);
        // Other weights (or another model): refused, the file kept.
        std::fs::write(&w, b"weights two").unwrap();
        let e = Journal::open(&d, "m", &w).err().unwrap().to_string();
        assert!(e.contains("remove it"), "{e}");
        std::fs::write(&w, b"weights one").unwrap();
        assert!(Journal::open(&d, "other", &w).is_err());
        assert_eq!(Journal::open(&d, "m", &w).unwrap().len(), 2);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn a_folder_hashes_its_weights_but_not_its_card_or_training_state() {
        let d = dir("folder");
        std::fs::create_dir_all(d.join("transformer")).unwrap();
        std::fs::create_dir_all(d.join("checkpoint")).unwrap();
        std::fs::write(d.join("transformer/x.safetensors"), b"1").unwrap();
        let h1 = weights_hash(&d).unwrap();
        std::fs::write(d.join("checkpoint/ckpt.pt"), b"state").unwrap();
        std::fs::write(d.join("README.md"), b"a card").unwrap();
        assert_eq!(weights_hash(&d).unwrap(), h1);
        std::fs::write(d.join("transformer/x.safetensors"), b"2").unwrap();
        assert_ne!(weights_hash(&d).unwrap(), h1);
        std::fs::remove_dir_all(&d).ok();
    }
}
