//! Row-parallel loops over candle's thread pool (rayon, which candle's own CPU ops use), with
//! the calling thread's floating-point mode carried into every task.
//!
//! Each output row is computed by the same code whichever thread runs it, so results do not
//! depend on the thread count. The denormal mode is part of that code: the engine's workers
//! flush denormals to zero ([`crate::flush_denormals_to_zero`]) and a pool thread would not,
//! so a task takes the caller's MXCSR for its duration and gives the pool thread its own back.

use rayon::prelude::*;

/// Below this many output values a loop runs on the calling thread: waking the pool costs
/// more than it saves on small tensors (TinyFLUX's 80-row activations).
pub(crate) const MIN_PARALLEL: usize = 1 << 15;

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut csr: u32 = 0;
    // SAFETY: stmxcsr writes this thread's MXCSR register to a valid pointer to a local u32;
    // every x86_64 CPU has SSE.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    csr
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(csr: u32) {
    // SAFETY: the value was read from an MXCSR register by `mxcsr` (reserved bits as the CPU
    // gave them), so ldmxcsr cannot fault; it changes only this thread's rounding modes.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly)) };
}

/// Runs `f` with the floating-point mode `mode`, restoring the thread's own after.
fn in_mode<R>(mode: u32, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        let own = mxcsr();
        if own == mode {
            return f();
        }
        set_mxcsr(mode);
        let r = f();
        set_mxcsr(own);
        r
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = mode;
        f()
    }
}

fn mode() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        mxcsr()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// `f(first_row, chunk)` over chunks of `rows_per_task` rows of width `d` of `out`, in
/// parallel when `out` holds at least [`MIN_PARALLEL`] values.
pub(crate) fn for_row_chunks(
    out: &mut [f32],
    d: usize,
    rows_per_task: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let step = rows_per_task.max(1) * d.max(1);
    if out.len() < MIN_PARALLEL || out.len() <= step {
        for (i, c) in out.chunks_mut(step).enumerate() {
            f(i * rows_per_task.max(1), c);
        }
        return;
    }
    let m = mode();
    out.par_chunks_mut(step)
        .enumerate()
        .for_each(|(i, c)| in_mode(m, || f(i * rows_per_task.max(1), c)));
}

/// Rows per task for `rows` rows split over the pool: a few tasks per thread.
pub(crate) fn rows_per_task(rows: usize) -> usize {
    let tasks = rayon::current_num_threads().max(1) * 4;
    rows.div_ceil(tasks).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_once_in_order() {
        for rows in [1usize, 3, 100, 5000] {
            let d = 7;
            let mut out = vec![0.0f32; rows * d];
            for_row_chunks(&mut out, d, rows_per_task(rows), |first, c| {
                for (r, row) in c.chunks_mut(d).enumerate() {
                    row.fill((first + r) as f32 + row[0]);
                }
            });
            for (r, row) in out.chunks(d).enumerate() {
                assert!(row.iter().all(|&v| v == r as f32), "row {r} of {rows}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_task_runs_in_the_mode_it_is_given_and_restores_its_own() {
        // This test's thread starts without FTZ/DAZ; a denormal survives a multiplication.
        let tiny = f32::MIN_POSITIVE / 4.0;
        let product = || std::hint::black_box(tiny) * std::hint::black_box(1.0);
        assert_ne!(product(), 0.0, "the test thread already flushes denormals");
        let own = mxcsr();
        let flushing = own | (1 << 15) | (1 << 6);
        assert_eq!(
            in_mode(flushing, product),
            0.0,
            "the given mode was not applied"
        );
        assert_eq!(mxcsr(), own, "the thread's own mode was not restored");
        assert_ne!(product(), 0.0);
    }
}
