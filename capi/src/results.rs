//! A finished request read back through the C ABI: its image and fixed report, its whole
//! report as JSON, and its release.

use std::os::raw::c_char;

use flashdiff_runtime::engine::report_json;
use flashdiff_runtime::service::MailboxError;

use crate::engine::{fd_engine, fd_report, from_mailbox};
use crate::error::{boundary, fd_status, Fail};
use crate::ptr;

/// Copies a finished request's RGB image (`rgb_len` must be side*side*3) and report. A failed
/// request returns its error (the reason is in `fd_last_error_detail`).
///
/// # Safety
/// `e` live; `rgb_out` writable for `rgb_len` floats (or NULL with 0 to skip the image);
/// `report_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_result(
    e: *const fd_engine,
    id: u64,
    rgb_out: *mut f32,
    rgb_len: usize,
    report_out: *mut fd_report,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section (live engine; buffers of the given sizes).
        let (e, rgb) = unsafe {
            (
                ptr::handle(e, "engine")?,
                ptr::slice_mut(rgb_out, rgb_len, "rgb_out")?,
            )
        };
        let read = e.inner.read(id, |r| {
            let o = r.map_err(|why| {
                Fail::new(
                    fd_status::FD_ERR_VALUE,
                    format!("request {id} failed: {why}"),
                )
            })?;
            if !rgb.is_empty() {
                if rgb.len() != o.sample.rgb.len() {
                    return Err(Fail::new(
                        fd_status::FD_ERR_LENGTH,
                        format!(
                            "rgb_len is {}, the image has {} floats",
                            rgb.len(),
                            o.sample.rgb.len()
                        ),
                    ));
                }
                rgb.copy_from_slice(&o.sample.rgb);
            }
            if !report_out.is_null() {
                let r = &o.report;
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                let rep = fd_report {
                    id: r.id,
                    steps: r.steps,
                    warmup: r.warmup,
                    patches: r.patches,
                    patch_steps: r.patch_steps,
                    computed: r.computed,
                    latency_ms: ms(r.latency),
                    warmup_ms: ms(r.time.warmup),
                    partition_ms: ms(r.time.partition),
                    gate_ms: ms(r.time.gate),
                    schedule_ms: ms(r.time.schedule),
                    compute_ms: ms(r.time.compute),
                    queue_ms: ms(r.time.queue),
                };
                // SAFETY: report_out non-NULL and writable (this function's contract).
                unsafe { ptr::write_out(report_out, rep, "report_out") }?;
            }
            Ok(())
        });
        match read {
            Ok(r) => r,
            Err(MailboxError::Pending(_)) => Err(Fail::new(
                fd_status::FD_ERR_NOT_IDLE,
                format!("request {id} is still pending: call fd_engine_run or fd_engine_step"),
            )),
            Err(e) => Err(from_mailbox(e)),
        }
    })
}

/// Writes a finished request's whole report as JSON (the object the HTTP server and Python
/// return: steps by kind, the automatic choice, model FLOPs run and full computation's, every
/// time) into `buf`, NUL-terminated and truncated to `len`; `out_n` (may be NULL) gets its
/// full length without the NUL, so a caller can size a buffer with `buf` NULL and `len` 0
/// first. A failed request returns its error, a pending one `FD_ERR_NOT_IDLE`.
///
/// # Safety
/// `e` live; `buf` NULL (with `len` 0) or writable for `len` bytes; `out_n` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_report_json(
    e: *const fd_engine,
    id: u64,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine.
        let e = unsafe { ptr::handle(e, "engine") }?;
        let text = e.inner.read(id, |r| match r {
            Ok(o) => Ok(report_json(o).to_string()),
            Err(why) => Err(Fail::new(
                fd_status::FD_ERR_VALUE,
                format!("request {id} failed: {why}"),
            )),
        });
        let text = match text {
            Ok(t) => t?,
            Err(MailboxError::Pending(_)) => {
                return Err(Fail::new(
                    fd_status::FD_ERR_NOT_IDLE,
                    format!("request {id} is still pending: call fd_engine_run or fd_engine_step"),
                ))
            }
            Err(e) => return Err(from_mailbox(e)),
        };
        // SAFETY: the buffers' contract is this function's `# Safety` section.
        unsafe { crate::copy_text(&text, buf, len, out_n) }
    })
}

/// Forgets a finished (or failed) request's result. A pending request gets
/// `FD_ERR_NOT_IDLE` (cancel it, or let it finish, first).
///
/// # Safety
/// `e` live.
#[no_mangle]
pub unsafe extern "C" fn fd_engine_release(e: *const fd_engine, id: u64) -> fd_status {
    boundary(|| {
        // SAFETY: this function's `# Safety` section: live engine.
        let e = unsafe { ptr::handle(e, "engine") }?;
        match e.inner.take(id) {
            Ok(_) => Ok(()),
            Err(MailboxError::Pending(_)) => Err(Fail::new(
                fd_status::FD_ERR_NOT_IDLE,
                format!("request {id} is still pending: cancel it or let it finish first"),
            )),
            Err(e) => Err(from_mailbox(e)),
        }
    })
}
