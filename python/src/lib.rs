//! `flashdiff._native`: the Python face of FlashDiff. The policies (salient words, saliency
//! map, partition, gate, scheduler) work on numpy arrays read in place; the engine generates
//! with a model through the same request schema as the CLI, HTTP and JSON lines; the image
//! metrics are the bench's. Every Rust
//! error becomes `flashdiff.Error` carrying the Rust error's text; long work releases the GIL.
//!
//! The Python package (`python/flashdiff`) re-exports these and adds typed wrappers.

use pyo3::create_exception;
use pyo3::prelude::*;

mod engine;
mod metrics;
mod policies;

create_exception!(
    flashdiff,
    Error,
    pyo3::exceptions::PyValueError,
    "A FlashDiff call was refused or failed; the message says what was wrong."
);

/// The Python error of any Rust error: its text.
pub(crate) fn fail(e: impl std::fmt::Display) -> PyErr {
    Error::new_err(e.to_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    policies::register(m)?;
    engine::register(m)?;
    metrics::register(m)?;
    Ok(())
}
