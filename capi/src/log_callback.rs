//! The host's log callback, the C entry point over [`crate::logging`].

use std::os::raw::c_void;

use crate::error::{boundary, fd_status};
use crate::logging::{self, fd_log_fn};

/// Sends the library's messages to `callback(user, level, message)`; NULL (the default)
/// makes it silent. May be called at any time from any thread; the last call wins.
///
/// # Safety
/// `callback` NULL, or a function that may be called from any thread with `user` until it
/// is replaced; it must not call back into the library.
#[no_mangle]
pub unsafe extern "C" fn fd_set_log_callback(callback: fd_log_fn, user: *mut c_void) -> fd_status {
    boundary(|| {
        logging::set_sink(callback, user);
        Ok(())
    })
}
