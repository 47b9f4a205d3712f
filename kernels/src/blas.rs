//! A system BLAS, loaded at run time when one is installed, for the linear layers' GEMM.
//!
//! On the 2-core AVX2 machine these kernels are measured on, OpenBLAS's and MKL's `sgemm`
//! run FLUX's linear-layer shapes at about 125 GFLOP/s on two threads against about 100 for
//! the pure-Rust `gemm` crate candle uses (`docs/benchmarks.md`, the speed section). Loading it
//! at run time keeps the build free of a native dependency: without a BLAS the engine runs
//! candle's matmul as before. The library is found by `FLASHDIFF_BLAS` (a path, or `off`),
//! else as `libopenblas.so.0` (Debian's `libopenblas0-pthread`), `libopenblas.so`,
//! `libmkl_rt.so.2` or `libmkl_rt.so`. It runs on one thread per call: callers split the
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
