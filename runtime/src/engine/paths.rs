//! Where the engine keeps files: request state and checkpoints (and, from the models' registry,
//! where the built-in models' weights are).

use std::path::{Path, PathBuf};

pub use flashdiff_models::pipelines::registry::{builtin_weights, default_weights, BUILTIN_MODELS};

/// Where request state files go: `/dev/shm` (memory) when it exists, else the temporary
/// directory.
pub fn state_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.into()
    } else {
        std::env::temp_dir()
    }
}

/// Creates `dir` (and its parents) if missing, mode 0700; refuses one that is not a
/// directory.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if !dir.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    Ok(())
}
