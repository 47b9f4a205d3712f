//! Status codes, the thread-local error detail, and the panic boundary every export runs in.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Result of every fallible `fd_` call. Numbers are stable and never reused.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fd_status {
    /// Success.
    FD_OK = 0,
    /// A required pointer argument was NULL.
    FD_ERR_NULL = 1,
    /// A length disagrees with the other arguments, or is too large.
    FD_ERR_LENGTH = 2,
    /// A number is NaN, infinite, negative or otherwise out of its range.
    FD_ERR_VALUE = 3,
    /// The patch count R is outside 1..=tokens.
    FD_ERR_PATCH_COUNT = 4,
    /// The salient-token mask selects no word.
    FD_ERR_NO_SALIENT = 5,
    /// A configuration struct holds an invalid setting.
    FD_ERR_CONFIG = 6,
    /// The caller's output buffer is too small (the detail says how big it must be).
    FD_ERR_BUFFER_TOO_SMALL = 7,
    /// Admission control refused: too many requests or queued monotasks. Retry later.
    FD_ERR_FULL = 8,
    /// No such request.
    FD_ERR_UNKNOWN_REQUEST = 9,
    /// The request id is already admitted.
    FD_ERR_DUPLICATE_REQUEST = 10,
    /// A step cannot open before the previous one completes, and steps must increase.
    FD_ERR_BARRIER = 11,
    /// A step's patch list is empty or repeats a patch.
    FD_ERR_BAD_PATCHES = 12,
    /// No such worker.
    FD_ERR_UNKNOWN_WORKER = 13,
    /// The worker was declared lost.
    FD_ERR_WORKER_DEAD = 14,
    /// The worker already runs a monotask.
    FD_ERR_BUSY = 15,
    /// The worker does not run that monotask.
    FD_ERR_NOT_RUNNING = 16,
    /// The request has a step in flight.
    FD_ERR_NOT_IDLE = 17,
    /// The patch was skipped this step, so it has no fresh importance.
    FD_ERR_NOT_ACTIVE = 18,
    /// A string is not valid UTF-8.
    FD_ERR_UTF8 = 19,
    /// A grid dimension is zero or the grid is too large.
    FD_ERR_GRID = 20,
    /// An index (patch, token) is out of range.
    FD_ERR_INDEX = 21,
    /// A bug inside libflashdiff was caught at the boundary; the handle may be unusable.
    FD_ERR_PANIC = 22,
    /// The request already finished (or failed, or was cancelled): read its result with
    /// `fd_engine_result`, then `fd_engine_release` it.
    FD_ERR_FINISHED = 23,
}

pub(crate) const LAST_STATUS: u32 = 23;

/// Fixed message of a status code (no argument details: see `fd_last_error_detail`).
pub(crate) fn message(code: u32) -> &'static str {
    match code {
        0 => "success",
        1 => "a required pointer argument was NULL",
        2 => "a length disagrees with the other arguments or is too large",
        3 => "a number is NaN, infinite or out of range",
        4 => "the patch count is out of range (1 <= R <= tokens)",
        5 => "the salient-token mask selects no word",
        6 => "invalid configuration",
        7 => "output buffer too small",
        8 => "admission control refused: too many requests or queued monotasks",
        9 => "unknown request",
        10 => "request id already admitted",
        11 => "step barrier: previous step incomplete or step not increasing",
        12 => "bad patch list: empty or repeated patches",
        13 => "unknown worker",
        14 => "worker was declared lost",
        15 => "worker already runs a monotask",
        16 => "worker does not run that monotask",
        17 => "request has a step in flight",
        18 => "patch was skipped this step",
        19 => "string is not valid UTF-8",
        20 => "grid dimension is zero or the grid is too large",
        21 => "index out of range",
        22 => "internal error caught at the C boundary",
        23 => "request already finished",
        _ => "unknown status code",
    }
}

/// An error on its way to C: a status and the detail for `fd_last_error_detail`.
#[derive(Debug)]
pub(crate) struct Fail {
    pub status: fd_status,
    pub detail: String,
}

impl Fail {
    pub fn new(status: fd_status, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }
}

thread_local! {
    static LAST_DETAIL: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_detail(s: &str) {
    LAST_DETAIL.with(|d| {
        let mut d = d.borrow_mut();
        d.clear();
        d.push_str(s);
    });
}

pub(crate) fn with_detail<R>(f: impl FnOnce(&str) -> R) -> R {
    LAST_DETAIL.with(|d| f(&d.borrow()))
}

/// Runs an export's body: panics become `FD_ERR_PANIC`, failures set the thread's detail.
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Fail>) -> fd_status {
    crate::logging::install();
    match catch_unwind(AssertUnwindSafe(|| crate::logging::in_call(body))) {
        Ok(Ok(())) => {
            set_detail("");
            fd_status::FD_OK
        }
        Ok(Err(f)) => {
            set_detail(&f.detail);
            f.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_detail(&format!("internal error: {what}"));
            fd_status::FD_ERR_PANIC
        }
    }
}

/// For exports that return a value instead of a status: a panic yields `default`.
pub(crate) fn boundary_value<T>(default: T, body: impl FnOnce() -> T) -> T {
    crate::logging::install();
    catch_unwind(AssertUnwindSafe(|| crate::logging::in_call(body))).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_stop_at_the_boundary() {
        let st = boundary(|| panic!("boom {}", 7));
        assert_eq!(st, fd_status::FD_ERR_PANIC);
        with_detail(|d| assert!(d.contains("boom 7"), "{d}"));
        assert_eq!(boundary(|| Ok(())), fd_status::FD_OK);
        with_detail(|d| assert!(d.is_empty()));
        assert_eq!(boundary_value(5u32, || panic!("x")), 5);
    }

    #[test]
    fn every_code_has_its_own_message() {
        let mut seen = std::collections::HashSet::new();
        for code in 0..=LAST_STATUS {
            assert!(seen.insert(message(code)), "code {code} repeats a message");
        }
        assert_eq!(message(LAST_STATUS + 1), "unknown status code");
        assert_eq!(fd_status::FD_ERR_FINISHED as u32, LAST_STATUS);
    }
}
