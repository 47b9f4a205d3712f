//! FlashDiff compute kernels: not built yet (issue "A built-in model whose attention means
//! something"). This crate will hold GEMM, attention over token subsets with fused attention
//! statistics (cross-attention maps for the partitioner, per-patch self-attention mass for the
//! gate), layer norm, adaLN modulation, GELU and gather/scatter, as a CPU reference behind a
//! `Backend` trait, with CUDA (NVRTC through cudarc, loaded at run time) in the next milestone.
//! Until then it exports nothing, so nothing can depend on a stub.
