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
    fn records_harness(data in prop::collection::vec(any::<u8>(), 0..200)) {
        flashdiff_runtime::fuzzing::records(&data);
    }

    /// Well-formed frames with corrupted payloads: the decoder must refuse or decode, never
    /// panic (bytecheck validation).
    #[test]
    fn records_harness_framed(payload in prop::collection::vec(any::<u8>(), 0..120)) {
        let mut framed = b"FDRC\x01\x00\x00\x00".to_vec();
        framed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        framed.extend_from_slice(&payload);
        flashdiff_runtime::fuzzing::records(&framed);
    }

    #[test]
    fn scheduler_harness(data in prop::collection::vec(any::<u8>(), 0..120)) {
        flashdiff_scheduler::fuzzing::scheduler(&data);
    }
}
