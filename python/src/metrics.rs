//! Image quality as the engine's reports and `flashdiff bench` measure it
//! (`flashdiff-eval`), for scripts that compare other samplers with FlashDiff's numbers.

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::fail;
use crate::policies::contiguous;

/// Two RGB images in [0, 1] of one shape `(height, width, 3)`, as slices, and their size.
fn pair<'a>(
    a: &'a PyReadonlyArrayDyn<'_, f32>,
    b: &'a PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<(&'a [f32], &'a [f32], usize, usize)> {
    let (sa, sb) = (a.shape(), b.shape());
    if sa.len() != 3 || sa[2] != 3 || sa[0] == 0 || sa[1] == 0 || sa != sb {
        return Err(fail(format!(
            "expected two RGB images of one shape (height, width, 3), got {sa:?} and {sb:?}"
        )));
    }
    Ok((contiguous(a, "a")?, contiguous(b, "b")?, sa[0], sa[1]))
}

/// PSNR in dB between two RGB images in [0, 1] (float32, `(height, width, 3)`); infinite
/// when they are identical.
#[pyfunction]
fn psnr(a: PyReadonlyArrayDyn<'_, f32>, b: PyReadonlyArrayDyn<'_, f32>) -> PyResult<f64> {
    let (a, b, _, _) = pair(&a, &b)?;
    Ok(flashdiff_eval::metrics::psnr(a, b))
}

/// SSIM between two RGB images in [0, 1] (float32, `(height, width, 3)`): 11x11 Gaussian
/// window, sigma 1.5, averaged over channels and window positions; 1 for images smaller than
/// the window.
#[pyfunction]
fn ssim(
    py: Python<'_>,
    a: PyReadonlyArrayDyn<'_, f32>,
    b: PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<f64> {
    let (a, b, h, w) = pair(&a, &b)?;
    Ok(py.detach(|| flashdiff_eval::metrics::ssim(a, b, w, h)))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(psnr, m)?)?;
    m.add_function(wrap_pyfunction!(ssim, m)?)?;
    Ok(())
}
