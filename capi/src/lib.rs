//! libflashdiff: the C ABI over FlashDiff's policies (`include/flashdiff.h`).
//!
//! Conventions (modelled on rustls-ffi): every export runs behind a panic boundary and returns
//! an [`fd_status`] (or a documented default); handles are opaque, created by `fd_<thing>_new`
//! and released by `fd_<thing>_free(&handle)`, which also sets the caller's pointer to NULL
//! (`_free` of NULL is a no-op); out-parameters end in `_out`; an empty input slice may be
//! `(NULL, 0)`. After a failure, `fd_last_error_detail` gives this thread's detail message
//! (which argument, which bound). Thread safety is stated on each handle type:
//! `fd_engine` may be shared between threads (all but `fd_engine_free`), `fd_layout` read
//! from many at once, the other handles used from one thread at a time.

#![allow(non_camel_case_types)]

mod engine;
mod error;
mod gate;
mod log_callback;
mod logging;
mod partitioner;
mod ptr;
mod results;
mod scheduler;

pub use engine::*;
pub use error::fd_status;
pub use gate::*;
pub use log_callback::*;
pub use logging::*;
pub use partitioner::*;
pub use scheduler::*;

use error::{boundary, boundary_value, fd_status as S, with_detail, Fail};
use std::os::raw::c_char;

/// Major version of this library (also `FLASHDIFF_VERSION_MAJOR` in the header).
pub const VERSION_MAJOR: u32 = parse(env!("CARGO_PKG_VERSION_MAJOR"));
/// Minor version.
pub const VERSION_MINOR: u32 = parse(env!("CARGO_PKG_VERSION_MINOR"));
/// Patch version.
pub const VERSION_PATCH: u32 = parse(env!("CARGO_PKG_VERSION_PATCH"));

const fn parse(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut v = 0u32;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// Runtime version as `major * 10000 + minor * 100 + patch`; equals `FLASHDIFF_VERSION` of
/// the header the caller compiled against when the two match.
#[no_mangle]
pub extern "C" fn fd_version() -> u32 {
    VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH
}

/// Runtime version as a NUL-terminated string ("0.1.0"); static, never freed.
#[no_mangle]
pub extern "C" fn fd_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Copies `text` NUL-terminated into (buf, len), truncating; `out_n` gets the full length
/// without the NUL. A too-small buffer is not an error here: the caller sees `out_n >= len`.
///
/// # Safety
/// `buf` is NULL or writable for `len` bytes; `out_n` is NULL or writable.
unsafe fn copy_text(
    text: &str,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> Result<(), Fail> {
    // SAFETY: forwarded contract: buf is NULL or writable for len bytes.
    let dst = unsafe { ptr::slice_mut(buf.cast::<u8>(), len, "buf") }?;
    if let Some(room) = dst.len().checked_sub(1) {
        let n = room.min(text.len());
        dst[..n].copy_from_slice(&text.as_bytes()[..n]);
        dst[n] = 0;
    }
    if !out_n.is_null() {
        // SAFETY: out_n is non-NULL and writable (forwarded contract).
        unsafe { ptr::write_out(out_n, text.len(), "out_n") }?;
    }
    Ok(())
}

/// Writes the fixed message of status `code` into `buf` (NUL-terminated, truncated to `len`);
/// `out_n` (may be NULL) gets the message length. Unknown codes get "unknown status code".
///
/// # Safety
/// `buf` is NULL (with `len` 0) or writable for `len` bytes; `out_n` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_status_message(
    code: u32,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> fd_status {
    // SAFETY: the caller's contract above is copy_text's.
    boundary(|| unsafe { copy_text(error::message(code), buf, len, out_n) })
}

/// Writes this thread's detail of the last failed call (empty after a success) into `buf`,
/// NUL-terminated and truncated to `len`; returns the detail's full length.
///
/// # Safety
/// `buf` is NULL (with `len` 0) or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn fd_last_error_detail(buf: *mut c_char, len: usize) -> usize {
    boundary_value(0, || {
        let text = with_detail(|d| d.to_string());
        // SAFETY: the caller's contract above; on a bad buffer nothing is written.
        let _ = unsafe { copy_text(&text, buf, len, std::ptr::null_mut()) };
        text.len()
    })
}

/// Highest status code this library returns (codes are 0..=this).
#[no_mangle]
pub extern "C" fn fd_status_last() -> u32 {
    error::LAST_STATUS
}

pub(crate) fn bad(status: S, detail: impl Into<String>) -> Fail {
    Fail::new(status, detail)
}
