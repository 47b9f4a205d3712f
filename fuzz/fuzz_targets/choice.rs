#![no_main]
// The harness lives in the crate behind its `fuzzing` feature; this is only the entry point.
libfuzzer_sys::fuzz_target!(|data: &[u8]| flashdiff_gate::fuzzing::choice(data));
