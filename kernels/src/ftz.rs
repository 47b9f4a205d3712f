/// Sets flush-to-zero and denormals-are-zero for this thread's SSE/AVX arithmetic. adaLN-zero
/// layers produce denormals, which made PyTorch's CPU steps 3-15x slower in our probe; a worker
/// calls this once at start. Results differ from IEEE only for values below ~1.2e-38.
/// Returns whether the mode could be set (false on other architectures).
pub fn flush_denormals_to_zero() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr read and write this thread's MXCSR register through a valid
        // pointer to a local u32; every x86_64 CPU has SSE, and setting FTZ (bit 15) and DAZ
        // (bit 6) changes only how this thread rounds tiny values.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            csr |= (1 << 15) | (1 << 6);
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly));
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
