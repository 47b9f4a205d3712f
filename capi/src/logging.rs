//! Where the library's messages go: a host callback, or nowhere (the default). Worker losses,
//! retries, a worker process's own stderr and caught panics all arrive here instead of the
//! host's stderr.

use std::cell::Cell;
use std::ffi::CString;
use std::os::raw::{c_char, c_void};
use std::sync::{Once, RwLock};

/// A host's log sink: `level` is 1 error, 2 warning, 3 information; `message` is
/// NUL-terminated UTF-8, valid only during the call. Called from any thread, including the
/// library's own; it must not call back into the library.
pub type fd_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: u32, message: *const c_char)>;

#[derive(Clone, Copy)]
struct Sink {
    f: unsafe extern "C" fn(*mut c_void, u32, *const c_char),
    user: usize,
}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

struct ToHost;

impl log::Log for ToHost {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record) {
        let Some(sink) = *SINK.read().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        let level = match r.level() {
            log::Level::Error => 1,
            log::Level::Warn => 2,
            _ => 3,
        };
        let text = r.args().to_string().replace('\0', " ");
        let Ok(c) = CString::new(text) else {
            return;
        };
        // SAFETY: `f` is the host's callback, registered with `user` through
        // fd_set_log_callback, whose contract makes it callable from any thread with that
        // pointer and a NUL-terminated message valid for the call.
        unsafe { (sink.f)(sink.user as *mut c_void, level, c.as_ptr()) };
    }

    fn flush(&self) {}
}

thread_local! {
    /// Depth of `fd_` calls on this thread (panics inside one are the library's).
    static IN_CALL: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as inside an `fd_` call while `f` runs.
pub(crate) fn in_call<R>(f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            IN_CALL.with(|c| c.set(c.get().saturating_sub(1)));
        }
    }
    IN_CALL.with(|c| c.set(c.get() + 1));
    let _leave = Leave;
    f()
}

/// Installs the logger and a panic hook, once: a panic in an `fd_` call or on one of the
/// library's threads is logged (and then caught at the boundary) instead of printed with a
/// backtrace on the host's stderr; any other panic goes to the hook that was there before.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        static LOGGER: ToHost = ToHost;
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = IN_CALL.with(Cell::get) > 0
                || std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("flashdiff-"));
            if ours {
                log::error!("internal error (caught): {info}");
            } else {
                previous(info);
            }
        }));
    });
}

/// Replaces the host's sink (`None`: silent).
pub(crate) fn set_sink(callback: fd_log_fn, user: *mut c_void) {
    let sink = callback.map(|f| Sink {
        f,
        user: user as usize,
    });
    *SINK.write().unwrap_or_else(|p| p.into_inner()) = sink;
}
