//! A system BLAS, loaded at run time when one is installed, for the linear layers' GEMM.
//!
//! On the 2-core AVX2 machine these kernels are measured on, OpenBLAS's and MKL's `sgemm`
//! run FLUX's linear-layer shapes at about 125 GFLOP/s on two threads against about 100 for
//! the pure-Rust `gemm` crate candle uses (`docs/benchmarks.md`, the speed section). Loading it
//! at run time keeps the build free of a native dependency: without a BLAS the engine runs
//! candle's matmul as before. The library is found by `FLASHDIFF_BLAS` (a path, or `off`),
//! else as `libopenblas.so.0` (Debian's `libopenblas0-pthread`), `libopenblas.so`,
//! `libmkl_rt.so.3`, `libmkl_rt.so.2` or `libmkl_rt.so`. It runs on one thread per call: callers split the
//! rows over candle's thread pool (`RAYON_NUM_THREADS`, else every core), so that the BLAS's
//! own threads do not spin beside the pool's between calls (measured: a tenth of the time
//! went to their yields). Results are reproducible for a given thread count.

use std::sync::OnceLock;

use libloading::Library;

type Sgemm = unsafe extern "C" fn(
    order: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// A loaded BLAS's `cblas_sgemm`.
pub struct Blas {
    // Kept open for as long as `sgemm` may be called (the process's life).
    _lib: Library,
    sgemm: Sgemm,
    name: String,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").field("name", &self.name).finish()
    }
}

impl Blas {
    /// The file it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `y[m x n] = x[m x k] · w[n x k]ᵀ + y` when `accumulate`, else `x · wᵀ`; every matrix
    /// row-major and contiguous.
    ///
    /// # Panics
    /// When a slice is shorter than its shape or a size does not fit the BLAS's `int`.
    pub fn linear(
        &self,
        x: &[f32],
        w: &[f32],
        y: &mut [f32],
        (m, k, n): (usize, usize, usize),
        accumulate: bool,
    ) {
        assert!(
            x.len() >= m * k && w.len() >= n * k && y.len() >= m * n,
            "blas linear: slices shorter than {m}x{k} · ({n}x{k})ᵀ"
        );
        let int = |v: usize| i32::try_from(v).expect("blas linear: size beyond the BLAS's int");
        let (mi, ki, ni) = (int(m), int(k), int(n));
        if m == 0 || n == 0 {
            return;
        }
        // SAFETY: `sgemm` is cblas_sgemm resolved from a BLAS that stays loaded (`_lib`). With
        // row-major order, A = x (m x k, lda = k), B = w read transposed (n x k, ldb = k) and
        // C = y (m x n, ldc = n), it reads m*k, n*k and writes m*n floats, which the slices
        // hold (asserted above); the sizes fit i32; no slice aliases another (y is &mut).
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                NO_TRANS,
                TRANS,
                mi,
                ni,
                ki,
                1.0,
                x.as_ptr(),
                ki.max(1),
                w.as_ptr(),
                ki.max(1),
                if accumulate { 1.0 } else { 0.0 },
                y.as_mut_ptr(),
                ni,
            )
        }
    }
}

impl Blas {
    /// `c[m x n] = alpha · a[m x k] · op(b) + beta · c`, where `op(b)` is `b[k x n]`, or
    /// `b[n x k]ᵀ` when `b_transposed`; row-major with leading dimensions `lda`, `ldb`, `ldc`
    /// (the attention tiles read one head's columns of wider rows).
    ///
    /// # Panics
    /// When a slice is shorter than its shape at its stride, a stride is shorter than its
    /// row, or a size does not fit the BLAS's `int`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_strided(
        &self,
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, lda): (&[f32], usize),
        (b, ldb, b_transposed): (&[f32], usize, bool),
        beta: f32,
        (c, ldc): (&mut [f32], usize),
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let (b_rows, b_cols) = if b_transposed { (n, k) } else { (k, n) };
        let need = |rows: usize, cols: usize, ld: usize| {
            if rows == 0 {
                0
            } else {
                (rows - 1) * ld + cols
            }
        };
        assert!(
            lda >= k.max(1)
                && ldb >= b_cols.max(1)
                && ldc >= n
                && a.len() >= need(m, k, lda)
                && b.len() >= need(b_rows, b_cols, ldb)
                && c.len() >= need(m, n, ldc),
            "blas gemm: slices or strides shorter than {m}x{k} · {b_rows}x{b_cols} into {m}x{n}"
        );
        let int = |v: usize| i32::try_from(v).expect("blas gemm: size beyond the BLAS's int");
        // SAFETY: `sgemm` is cblas_sgemm from a BLAS that stays loaded (`_lib`). Row-major, it
        // reads rows of A (m rows, k floats at stride lda), of B (b_rows rows of b_cols floats
        // at stride ldb) and writes C (m rows of n floats at stride ldc); each slice holds its
        // last row's end (asserted above); sizes fit i32; c is &mut and so aliases neither.
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                NO_TRANS,
                if b_transposed { TRANS } else { NO_TRANS },
                int(m),
                int(n),
                int(k),
                alpha,
                a.as_ptr(),
                int(lda),
                b.as_ptr(),
                int(ldb),
                beta,
                c.as_mut_ptr(),
                int(ldc),
            )
        }
    }
}

/// The BLAS this process uses, loaded on the first call; `None` when none is installed or
/// `FLASHDIFF_BLAS=off`.
pub fn blas() -> Option<&'static Blas> {
    static BLAS: OnceLock<Option<Blas>> = OnceLock::new();
    BLAS.get_or_init(load).as_ref()
}

fn load() -> Option<Blas> {
    let wanted = std::env::var("FLASHDIFF_BLAS").ok();
    let names: Vec<String> = match wanted.as_deref() {
        Some("off") | Some("none") => return None,
        Some(path) if !path.is_empty() => vec![path.to_string()],
        _ => [
            "libopenblas.so.0",
            "libopenblas.so",
            "libmkl_rt.so.3",
            "libmkl_rt.so.2",
            "libmkl_rt.so",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    };
    for name in names {
        // SAFETY: loading runs the library's initialisers; the names are BLAS libraries (or the
        // one the user named in FLASHDIFF_BLAS), whose initialisers set up their own thread
        // pools and require nothing of this process.
        let Ok(lib) = (unsafe { Library::new(&name) }) else {
            if wanted.is_some() {
                eprintln!("FLASHDIFF_BLAS={name}: cannot load it; using candle's matmul");
            }
            continue;
        };
        // SAFETY: cblas_sgemm has the C signature `Sgemm` in every CBLAS (OpenBLAS, MKL).
        let sgemm = match unsafe { lib.get::<Sgemm>(b"cblas_sgemm\0") } {
            Ok(f) => *f,
            Err(_) => continue,
        };
        for setter in [
            &b"openblas_set_num_threads\0"[..],
            &b"MKL_Set_Num_Threads\0"[..],
        ] {
            // SAFETY: both setters take one C int and return nothing in OpenBLAS and MKL.
            if let Ok(set) = unsafe { lib.get::<unsafe extern "C" fn(i32)>(setter) } {
                // SAFETY: as above; one thread: the callers split rows over candle's pool.
                unsafe { set(1) };
            }
        }
        return Some(Blas {
            _lib: lib,
            sgemm,
            name,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, lda): (&[f32], usize),
        (b, ldb, bt): (&[f32], usize, bool),
        beta: f32,
        (c, ldc): (&mut [f32], usize),
    ) {
        for i in 0..m {
            for j in 0..n {
                let dot: f32 = (0..k)
                    .map(|p| a[i * lda + p] * if bt { b[j * ldb + p] } else { b[p * ldb + j] })
                    .sum();
                c[i * ldc + j] = alpha * dot + beta * c[i * ldc + j];
            }
        }
    }

    #[test]
    fn strided_gemm_matches_the_plain_product() {
        let Some(blas) = blas() else {
            eprintln!("skipped: no system BLAS on this machine (install libopenblas0-pthread)");
            return;
        };
        let val = |i: usize| ((i * 37 + 11) % 23) as f32 / 7.0 - 1.5;
        // One head's columns of wider rows, as the attention tiles read them.
        let (m, n, k, lda, ldc) = (5, 7, 3, 8, 9);
        let a: Vec<f32> = (0..m * lda).map(val).collect();
        for bt in [false, true] {
            let ldb = 10;
            let b: Vec<f32> = (0..12 * ldb).map(|i| val(i + 5)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|i| val(i + 9)).collect();
            let (mut got, mut want) = (c0.clone(), c0.clone());
            blas.gemm_strided(
                (m, n, k),
                0.5,
                (&a, lda),
                (&b, ldb, bt),
                1.0,
                (&mut got, ldc),
            );
            naive(
                (m, n, k),
                0.5,
                (&a, lda),
                (&b, ldb, bt),
                1.0,
                (&mut want, ldc),
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() < 1e-5,
                    "transposed {bt}, element {i}: {g} against {w}"
                );
            }
        }
    }

    #[test]
    fn strided_gemm_refuses_short_slices() {
        let Some(blas) = blas() else {
            eprintln!("skipped: no system BLAS on this machine (install libopenblas0-pthread)");
            return;
        };
        // A 2x2 A at stride 2 needs 4 floats; 3 must be refused before the BLAS reads.
        let refused = std::panic::catch_unwind(|| {
            let mut c = vec![0.0f32; 4];
            blas.gemm_strided(
                (2, 2, 2),
                1.0,
                (&[0.0; 3], 2),
                (&[0.0; 4], 2, false),
                0.0,
                (&mut c, 2),
            );
        });
        let msg = refused.expect_err("a short slice was accepted");
        let text = msg
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        assert!(text.contains("shorter than"), "{text}");
    }
}
