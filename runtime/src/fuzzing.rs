//! Fuzz harness for the untrusted bytes the runtime reads (feature `fuzzing`): control
//! records from worker pipes and request-state headers must be refused with an error, never
//! panic or misread.

use crate::proc::{decode_order, decode_report, read_frame};

/// Runs one fuzz case. Panics only on a violated property.
pub fn records(data: &[u8]) {
    let _ = decode_order(data);
    let _ = decode_report(data);
    let mut r = data;
    // Frames back to back until the bytes run out or one is refused.
    while let Ok(Some(frame)) = read_frame(&mut r) {
        let _ = decode_order(&frame);
        let _ = decode_report(&frame);
    }
}
