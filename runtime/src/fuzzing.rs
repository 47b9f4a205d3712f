//! Fuzz harnesses (feature `fuzzing`): the untrusted bytes the runtime reads (control
//! records from worker pipes, request-state files and request checkpoints must be refused
//! with an error, never panic or misread), and the engine's start window against its rule.

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

/// The start window: arbitrary bytes become a window and a run of submissions (a priority
/// level each), cancellations and polls on a one-worker engine over the built-in image
/// model; after every operation the engine's waiting requests must be exactly those the rule
/// leaves waiting, recomputed here from the submissions, cancellations and completions
/// alone (a request starts while fewer than the window's started requests are at its level
/// or above; when one leaves, the best waiting ones start, highest level first, then in
/// submission order), and none of them may have started. Panics on a violation.
pub fn start_window(data: &[u8]) {
    use crate::engine::{default_weights, Engine, RequestConfig};
    use std::time::Duration;

    let Some((&w, ops)) = data.split_first() else {
        return;
    };
    let window = 1 + (w % 3) as usize;
    let mut e = Engine::new(&default_weights(), 1).expect("the built-in model loads");
    e.set_start_window(Some(window as u32))
        .expect("a window of 1-3");
    // (id, level, started), in submission order.
    let mut rule: Vec<(u64, u8, bool)> = Vec::new();
    let started =
        |rule: &[(u64, u8, bool)], level: u8| rule.iter().filter(|r| r.2 && r.1 >= level).count();
    let fill = |rule: &mut Vec<(u64, u8, bool)>| loop {
        let best = rule
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.2)
            .max_by_key(|(i, r)| (r.1, std::cmp::Reverse(*i)))
            .map(|(i, r)| (i, r.1));
        match best {
            Some((i, level)) if started(rule, level) < window => rule[i].2 = true,
            _ => return,
        }
    };
    let check = |e: &mut Engine, rule: &mut Vec<(u64, u8, bool)>| {
        for r in e.take_finished() {
            let id = match r {
                Ok(o) => o.report.id,
                Err((id, _)) => id,
            };
            rule.retain(|r| r.0 != id);
            fill(rule);
        }
        let waiting: Vec<u64> = rule.iter().filter(|r| !r.2).map(|r| r.0).collect();
        assert_eq!(e.waiting(), waiting.len(), "waiting requests");
        assert_eq!(e.in_flight(), rule.len(), "requests in flight");
        for id in waiting {
            assert!(e.patch_of(id).is_none(), "waiting request {id} has started");
        }
    };
    let mut next = 0u64;
    // At most 12 operations: each submission runs a short request on the model.
    for &b in ops.iter().take(12) {
        match b % 6 {
            0..=2 => {
                next += 1;
                let level = b / 6 % 3;
                let cfg = RequestConfig {
                    steps: 6,
                    warmup: 2,
                    patches: Some(4),
                    seed: next,
                    priority: level,
                    ..Default::default()
                };
                e.submit(next, "a red circle on a white background", cfg)
                    .expect("a valid request");
                let start = started(&rule, level) < window;
                rule.push((next, level, start));
            }
            3 => {
                if let Some(&(id, _, _)) = rule.get((b / 6) as usize % rule.len().max(1)) {
                    e.cancel(id).expect("a request in flight");
                }
            }
            _ => e.poll(&mut |_| {}, Duration::from_millis(20)),
        }
        check(&mut e, &mut rule);
    }
    while e.in_flight() > 0 {
        e.poll(&mut |_| {}, Duration::from_millis(20));
        check(&mut e, &mut rule);
    }
}
