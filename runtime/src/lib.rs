//! FlashDiff engine. So far: the built-in model ([`model`]); the engine loop, worker
//! processes, shared memory and the `flashdiff` command come with the engine issue.

pub mod model;
