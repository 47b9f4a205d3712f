//! Checked conversions of C arguments. Every raw-pointer read in the crate goes through here.

use crate::error::{fd_status, Fail};

/// A shared reference from a handle pointer, or `FD_ERR_NULL` naming the argument.
///
/// # Safety
/// 1. `p` is NULL or points to a live `T` created by this library and not yet freed.
/// 2. No other thread mutates `*p` for the duration of the call (handles are not shared
///    across threads without the caller's synchronisation, as the header documents).
pub(crate) unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: invariant 1 of this function: non-NULL means live and valid.
    unsafe { p.as_ref() }
        .ok_or_else(|| Fail::new(fd_status::FD_ERR_NULL, format!("{what} is NULL")))
}

/// A unique reference from a handle pointer, or `FD_ERR_NULL`.
///
/// # Safety
/// As [`handle`], and no other reference to `*p` exists during the call.
pub(crate) unsafe fn handle_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Fail> {
    // SAFETY: the function's contract: non-NULL means live, valid and not aliased.
    unsafe { p.as_mut() }
        .ok_or_else(|| Fail::new(fd_status::FD_ERR_NULL, format!("{what} is NULL")))
}

fn check_len<T>(len: usize, what: &str) -> Result<(), Fail> {
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Fail::new(
            fd_status::FD_ERR_LENGTH,
            format!("{what} length {len} is larger than any buffer can be"),
        ));
    }
    Ok(())
}

/// A slice from (pointer, length); (NULL, 0) is the empty slice.
///
/// # Safety
/// 1. When `p` is non-NULL it points to `len` initialised, properly aligned `T`s that stay
///    valid and unmutated for the duration of the call.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Fail> {
    check_len::<T>(len, what)?;
    if p.is_null() {
        if len == 0 {
            return Ok(&[]);
        }
        return Err(Fail::new(
            fd_status::FD_ERR_NULL,
            format!("{what} is NULL with length {len}"),
        ));
    }
    // SAFETY: invariant 1: non-NULL `p` addresses `len` valid `T`s; `len` fits isize (checked).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A mutable slice from (pointer, length); (NULL, 0) is the empty slice.
///
/// # Safety
/// 1. When `p` is non-NULL it points to `len` properly aligned `T`s, writable, not aliased by
///    any other live reference during the call.
pub(crate) unsafe fn slice_mut<'a, T>(
    p: *mut T,
    len: usize,
    what: &str,
) -> Result<&'a mut [T], Fail> {
    check_len::<T>(len, what)?;
    if p.is_null() {
        if len == 0 {
            return Ok(&mut []);
        }
        return Err(Fail::new(
            fd_status::FD_ERR_NULL,
            format!("{what} is NULL with length {len}"),
        ));
    }
    // SAFETY: invariant 1: non-NULL `p` addresses `len` writable, unaliased `T`s.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Writes an out-parameter, or fails with `FD_ERR_NULL`.
///
/// # Safety
/// 1. When `p` is non-NULL it is valid for a write of one `T` (initialised or not).
pub(crate) unsafe fn write_out<T>(p: *mut T, value: T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(Fail::new(fd_status::FD_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: invariant 1: non-NULL `p` is writable for one `T`; `write` does not read or drop
    // the old (possibly uninitialised) value.
    unsafe { p.write(value) };
    Ok(())
}

/// Moves a value to the heap and writes its pointer to `out`, or fails without leaking.
///
/// # Safety
/// As [`write_out`] for `*mut T`.
pub(crate) unsafe fn write_handle<T>(out: *mut *mut T, value: T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::new(fd_status::FD_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: `out` non-NULL and writable for one pointer (this function's contract).
    unsafe { out.write(Box::into_raw(Box::new(value))) };
    Ok(())
}

/// Frees a handle created by [`write_handle`] and sets the caller's pointer to NULL, so a
/// later call with it fails with `FD_ERR_NULL` instead of touching freed memory.
///
/// # Safety
/// 1. `pp` is NULL, or points to a pointer that is NULL or came from [`write_handle`] with
///    the same `T` and was not freed since.
pub(crate) unsafe fn free_handle<T>(pp: *mut *mut T) {
    if pp.is_null() {
        return;
    }
    // SAFETY: invariant 1: `pp` is readable and writable for one pointer.
    let p = unsafe { pp.read() };
    if !p.is_null() {
        // SAFETY: invariant 1: `p` came from Box::into_raw for this T and is freed only here,
        // after which the caller's copy is nulled below.
        drop(unsafe { Box::from_raw(p) });
    }
    // SAFETY: `pp` is writable (invariant 1).
    unsafe { pp.write(std::ptr::null_mut()) };
}
