//! Fuzz harness for the untrusted bytes the runtime reads (feature `fuzzing`): control
//! records from worker pipes, request-state files and request checkpoints must be refused
//! with an error, never panic or misread.

use crate::proc::{decode_order, decode_report, encode_order, encode_report, read_frame};
use crate::state::{SharedState, StateLayout};
use flashdiff_models::{Dims, LatentGrid};

/// Runs one fuzz case. Panics only on a violated property: a record that decodes must
/// encode back to a record that decodes to the same value; a state file is accepted only
/// when its size and header are exactly a valid state's.
pub fn records(data: &[u8]) {
    check_record(data);
    let mut r = data;
    // Frames back to back until the bytes run out or one is refused.
    while let Ok(Some(frame)) = read_frame(&mut r) {
        check_record(&frame);
    }
    state_file(data);
    checkpoint(data);
}

/// Checkpoints: arbitrary bytes decode only into a checkpoint that encodes back to itself;
/// a valid checkpoint truncated, with a flipped bit or another version is refused.
pub fn checkpoint(data: &[u8]) {
    use crate::checkpoint::{decode, encode, sample};
    if let Ok(c) = decode(data) {
        assert_eq!(
            decode(&encode(&c)).as_ref(),
            Ok(&c),
            "checkpoint round trip"
        );
    }
    let good = encode(&sample());
    assert!(decode(&good).is_ok());
    if data.len() >= 9 {
        let at = u64::from_le_bytes(data[..8].try_into().expect("8 bytes")) as usize % good.len();
        let flip = data[8].max(1);
        let mut bad = good.clone();
        bad[at] ^= flip;
        let e = decode(&bad);
        assert!(
            e.is_err(),
            "a checkpoint with byte {at} flipped by {flip:#x} was accepted"
        );
        assert!(!e.unwrap_err().is_empty());
        assert!(
            decode(&good[..at]).is_err(),
            "a checkpoint cut at {at} was accepted"
        );
    }
}

fn check_record(bytes: &[u8]) {
    if let Ok(o) = decode_order(bytes) {
        assert_eq!(
            decode_order(&encode_order(&o)).as_ref(),
            Ok(&o),
            "order round trip"
        );
    }
    if let Ok(r) = decode_report(bytes) {
        assert_eq!(
            decode_report(&encode_report(&r)).as_ref(),
            Ok(&r),
            "report round trip"
        );
    }
}

/// A small model's state layout, so that fuzzed bytes can be a whole state file.
fn layout() -> StateLayout {
    StateLayout::new(&Dims {
        grid: LatentGrid {
            frames: 1,
            height: 1,
            width: 2,
        },
        channels: 2,
        kv_layers: 1,
        kv_dim: 2,
        words: 1,
        context_len: 3,
        cond_len: 2,
    })
}

/// The bytes as a state file: `open` refuses them unless they are exactly a valid state
/// (right length, magic, version and dimensions), and a refusal says why.
fn state_file(data: &[u8]) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("flashdiff-fuzz-{}-{n}.state", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let l = layout();
    let valid = SharedState::create(l.clone(), None, 0)
        .map(|s| s.header_bytes().to_vec())
        .unwrap_or_default();
    match SharedState::open(&path, l.clone()) {
        Ok(_) => assert!(
            data.len() == l.bytes() && data.starts_with(&valid),
            "accepted a state file that is not a valid state"
        ),
        Err(e) => assert!(!e.is_empty(), "a refusal without a reason"),
    }
    let _ = std::fs::remove_file(&path);
}
