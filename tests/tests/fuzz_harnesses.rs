//! The fuzz harnesses (the same code `fuzz/fuzz_targets/*` run under libFuzzer) driven by
//! proptest's random bytes on every `cargo test`, so the policies' checkers run in CI even
//! where no fuzzer is installed.

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn partition_harness(data in prop::collection::vec(any::<u8>(), 0..600)) {
        flashdiff_partitioner::fuzzing::partition(&data);
    }

    #[test]
    fn gate_harness(data in prop::collection::vec(any::<u8>(), 0..300)) {
        flashdiff_gate::fuzzing::gate(&data);
    }

    #[test]
    fn budget_harness(data in prop::collection::vec(any::<u8>(), 0..300)) {
        flashdiff_gate::fuzzing::budget(&data);
    }

    #[test]
    fn pace_harness(data in prop::collection::vec(any::<u8>(), 0..300)) {
        flashdiff_gate::fuzzing::pace(&data);
    }

    #[test]
    fn choice_harness(data in prop::collection::vec(any::<u8>(), 0..200)) {
        flashdiff_gate::fuzzing::choice(&data);
    }

    #[test]
    fn records_harness(data in prop::collection::vec(any::<u8>(), 0..200)) {
        flashdiff_runtime::fuzzing::records(&data);
    }
}

proptest! {
    // Each case runs a few short requests on the built-in model.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn start_window_harness(data in prop::collection::vec(any::<u8>(), 0..14)) {
        flashdiff_runtime::fuzzing::start_window(&data);
    }

    /// Well-formed frames with corrupted payloads: the decoder must refuse or decode, never
    /// panic (bytecheck validation).
    #[test]
    fn records_harness_framed(payload in prop::collection::vec(any::<u8>(), 0..120)) {
        let mut framed = b"FDRC\x02\x00\x00\x00".to_vec();
        framed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        framed.extend_from_slice(&payload);
        flashdiff_runtime::fuzzing::records(&framed);
    }

    /// Checkpoints: random bytes, and a valid checkpoint damaged at a random byte.
    #[test]
    fn checkpoint_harness(data in prop::collection::vec(any::<u8>(), 0..200)) {
        flashdiff_runtime::fuzzing::checkpoint(&data);
    }

    /// A checkpoint's own header with random payloads: refused (checksum), never a panic.
    #[test]
    fn checkpoint_harness_framed(payload in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut b = b"FDCK\x01\x00\x00\x00".to_vec();
        b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        b.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&payload);
        flashdiff_runtime::fuzzing::checkpoint(&b);
    }

    #[test]
    fn scheduler_harness(data in prop::collection::vec(any::<u8>(), 0..120)) {
        flashdiff_scheduler::fuzzing::scheduler(&data);
    }
}
