//! FlashDiff engine: not built yet (issue "The engine"). This crate will hold the built-in
//! model, per-request state in shared memory (memmap2 + rkyv records), the engine loop that
//! drives the partitioner, gate and scheduler, worker processes with fault recovery, and the
//! `flashdiff` command (`generate`, `serve`, `bench`). Until then it exports nothing.
