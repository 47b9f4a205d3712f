//! The kernels as candle ops: what a model written on candle tensors calls on its hot path.
//!
//! On the CPU each op is a candle custom op whose body is this crate's fused kernel (one pass,
//! no intermediate tensors). On every other device (CUDA with the `cuda` feature) the same
//! function composes candle's own ops, which candle runs there with its kernels and cuBLAS.
//! The composed form is also the reference the CPU ops are tested against
//! (`tests/ops.rs`): one body, two implementations, an explicit tolerance.
//!
//! Inputs must be f32; CPU inputs must be contiguous (callers pass fresh tensors or call
//! `.contiguous()`, which is free when they already are).

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, InplaceOp1, Layout, Result, Shape, Tensor,
};

use crate::par::{for_row_chunks, rows_per_task};
use crate::{
    add_gated_f32, attention_f32, flash_attention_f32, gelu_tanh_f32, layer_norm_f32, linear_f32,
    modulate_f32, rms_rope_f32, scatter_rows_f32,
};
use crate::{AttnStats, GroupMass};

/// `f` over `y` in row-parallel chunks of width `d` (the whole of `y` when it is small).
fn par_rows(y: &mut [f32], d: usize, f: impl Fn(&mut [f32]) + Sync) {
    let rows = y.len() / d.max(1);
    for_row_chunks(y, d, rows_per_task(rows), |_, c| f(c));
}

fn slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        candle_core::bail!("{op}: expects f32 storage");
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("{op}: input is not contiguous"),
    }
}

fn last_dim(shape: &Shape, op: &str) -> Result<usize> {
    match shape.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => candle_core::bail!("{op}: needs a non-empty last dimension, got {shape:?}"),
    }
}

struct Linear;

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "linear_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, inp) = l1.shape().dims2()?;
        let (out, w_in) = l2.shape().dims2()?;
        if w_in != inp || l3.shape().elem_count() != out {
            candle_core::bail!(
                "linear: x is {rows}x{inp}, weight {out}x{w_in}, bias {:?}",
                l3.shape()
            );
        }
        let (x, w, b) = (
            slice(s1, l1, self.name())?,
            slice(s2, l2, self.name())?,
            slice(s3, l3, self.name())?,
        );
        let mut y = vec![0.0f32; rows * out];
        linear_f32(x, rows, inp, w, Some(b), out, &mut y);
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }
}

/// `x [rows x in] · wᵀ + b` with `w` stored `[out x in]` (PyTorch's layout). On the CPU one
/// single-threaded pass whose every output row is computed the same way whatever other rows
/// share the call, so a token's result does not depend on which tokens it was batched with
/// (the engine's determinism relies on it) and worker threads do not contend for a thread
/// pool; elsewhere candle's matmul.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() {
        return x
            .contiguous()?
            .apply_op3_no_bwd(&w.contiguous()?, &b.contiguous()?, &Linear);
    }
    x.matmul(&w.t()?)?.broadcast_add(b)
}

struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu_tanh_f32"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let mut y = slice(s, l, "gelu_tanh_f32")?.to_vec();
        let d = last_dim(l.shape(), "gelu_tanh_f32")?;
        par_rows(&mut y, d, gelu_tanh_f32);
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }
}

impl InplaceOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu_tanh_f32_inplace"
    }
    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let CpuStorage::F32(v) = s else {
            candle_core::bail!("gelu_tanh_inplace: expects f32 storage");
        };
        let d = last_dim(l.shape(), "gelu_tanh_inplace")?;
        match l.contiguous_offsets() {
            Some((a, b)) => par_rows(&mut v[a..b], d, gelu_tanh_f32),
            None => candle_core::bail!("gelu_tanh_inplace: input is not contiguous"),
        }
        Ok(())
    }
}

/// [`gelu_tanh`] written over `x` itself, without a copy: for a fresh op output that no
/// other tensor shares (a layer's hidden activations). Returns `x`.
pub fn gelu_tanh_inplace(x: Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.is_contiguous() {
        x.inplace_op1(&Gelu)?;
        Ok(x)
    } else {
        gelu_tanh(&x)
    }
}

/// GELU with the tanh approximation (PyTorch's `approximate="tanh"`).
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() {
        x.contiguous()?.apply_op1_no_bwd(&Gelu)
    } else {
        x.gelu()
    }
}

struct NormModulate {
    eps: f32,
}

impl CustomOp3 for NormModulate {
    fn name(&self) -> &'static str {
        "norm_modulate_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1.shape(), self.name())?;
        let (shift, scale) = (slice(s2, l2, self.name())?, slice(s3, l3, self.name())?);
        if shift.len() != d || scale.len() != d {
            candle_core::bail!("{}: shift and scale must hold {d} values", self.name());
        }
        let mut y = slice(s1, l1, self.name())?.to_vec();
        par_rows(&mut y, d, |c| {
            layer_norm_f32(c, d, self.eps, None, None);
            modulate_f32(c, d, shift, scale);
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
}

/// Layer norm over the last dimension without affine parameters, then adaLN modulation
/// `y * (1 + scale) + shift` with `shift`, `scale` of the last dimension's length.
pub fn norm_modulate(x: &Tensor, shift: &Tensor, scale: &Tensor, eps: f32) -> Result<Tensor> {
    if x.device().is_cpu() {
        return x.contiguous()?.apply_op3_no_bwd(
            &shift.contiguous()?,
            &scale.contiguous()?,
            &NormModulate { eps },
        );
    }
    let y = layer_norm_plain(x, eps)?;
    y.broadcast_mul(&(scale + 1.0)?)?.broadcast_add(shift)
}

/// Layer norm over the last dimension, no affine parameters (the composed form).
pub fn layer_norm_plain(x: &Tensor, eps: f32) -> Result<Tensor> {
    let last = x.rank() - 1;
    let mean = x.mean_keepdim(last)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(last)?;
    xc.broadcast_div(&(var + eps as f64)?.sqrt()?)
}

/// Rows from which [`linear_fast`] calls a system BLAS: below, this crate's kernel was faster
/// (TinyFLUX's 16-80 rows: 2.1 against 3.3 ms for a 16-row forward).
const BLAS_MIN_ROWS: usize = 256;

/// `x [rows x in] · wᵀ (+ b)` with `w` stored `[out x in]`, as fast as this machine allows:
/// on the CPU in f32 for at least 256 rows a system BLAS's `sgemm` when one is installed
/// ([`crate::blas`]), the bias written first and accumulated into; otherwise this crate's
/// [`linear_f32`] over blocks of rows in parallel (the same result on every AVX2 machine);
/// on other devices candle's matmul and a bias add.
pub fn linear_fast(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let f32s = x.dtype() == DType::F32 && w.dtype() == DType::F32;
    if x.device().is_cpu() && f32s && x.rank() == 2 {
        let op = RowsLinear {
            blas: match x.dim(0)? >= BLAS_MIN_ROWS {
                true => crate::blas::blas(),
                false => None,
            },
        };
        let (x, w) = (x.contiguous()?, w.contiguous()?);
        return match b {
            Some(b) => x.apply_op3_no_bwd(&w, &b.contiguous()?, &op),
            None => x.apply_op2_no_bwd(&w, &op),
        };
    }
    let y = x.matmul(&w.t()?)?;
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// A linear layer over blocks of rows in parallel: [`linear_f32`] (each row computed as the
/// kernel computes it alone, so results do not depend on the machine's cache sizes, the
/// thread count or the other rows, where candle's matmul picks its blocking by CPU), or a
/// single-threaded BLAS `sgemm` per block into rows that start as the bias.
struct RowsLinear {
    blas: Option<&'static crate::blas::Blas>,
}

impl RowsLinear {
    fn run(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let name = "linear";
        let (rows, inp) = x.1.shape().dims2()?;
        let (out, w_in) = w.1.shape().dims2()?;
        let bias = match b {
            Some((s, l)) => Some(slice(s, l, name)?),
            None => None,
        };
        if w_in != inp || bias.is_some_and(|b| b.len() != out) {
            candle_core::bail!(
                "linear: x is {rows}x{inp}, weight {out}x{w_in}, bias of {out} expected"
            );
        }
        let (xs, ws) = (slice(x.0, x.1, name)?, slice(w.0, w.1, name)?);
        let Some(blas) = self.blas else {
            let mut y = vec![0.0f32; rows * out];
            for_row_chunks(&mut y, out, rows_per_task(rows), |first, c| {
                let n = c.len() / out;
                linear_f32(
                    &xs[first * inp..(first + n) * inp],
                    n,
                    inp,
                    ws,
                    bias,
                    out,
                    c,
                );
            });
            return Ok((CpuStorage::F32(y), Shape::from((rows, out))));
        };
        let mut y = match bias {
            Some(bias) => bias.repeat(rows),
            None => vec![0.0f32; rows * out],
        };
        // One block of rows per thread, each one single-threaded sgemm.
        let per = rows.div_ceil(rayon::current_num_threads().max(1)).max(16);
        for_row_chunks(&mut y, out, per, |first, c| {
            let n = c.len() / out;
            let x = &xs[first * inp..(first + n) * inp];
            blas.linear(x, ws, c, (n, inp, out), bias.is_some());
        });
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }
}

impl CustomOp2 for RowsLinear {
    fn name(&self) -> &'static str {
        "linear_rows"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run((s1, l1), (s2, l2), None)
    }
}

impl CustomOp3 for RowsLinear {
    fn name(&self) -> &'static str {
        "linear_rows"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run((s1, l1), (s2, l2), Some((s3, l3)))
    }
}

struct AddGated;

impl CustomOp3 for AddGated {
    fn name(&self) -> &'static str {
        "add_gated_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1.shape(), self.name())?;
        let (o, gate) = (slice(s2, l2, self.name())?, slice(s3, l3, self.name())?);
        if l2.shape() != l1.shape() || gate.len() != d {
            candle_core::bail!(
                "add_gated: x is {:?}, o must match it ({:?}) and the gate hold {d} values",
                l1.shape(),
                l2.shape()
            );
        }
        let mut y = slice(s1, l1, self.name())?.to_vec();
        for_row_chunks(&mut y, d, rows_per_task(o.len() / d), |first, c| {
            add_gated_f32(c, &o[first * d..first * d + c.len()], d, gate)
        });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
}

/// `x + o * gate`: a residual `x` plus a block's output `o` (same shape) gated per column by
/// `gate` (the last dimension's length), in one pass on the CPU.
pub fn add_gated(x: &Tensor, o: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() {
        return x
            .contiguous()?
            .apply_op3_no_bwd(&o.contiguous()?, &gate.contiguous()?, &AddGated);
    }
    x.add(&o.broadcast_mul(gate)?)
}

struct RmsRope {
    heads: usize,
    eps: f32,
}

impl CustomOp3 for RmsRope {
    fn name(&self) -> &'static str {
        "rms_rope_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, d) = l1.shape().dims2()?;
        let dh = d / self.heads.max(1);
        let stride = l1.stride();
        if self.heads == 0 || d % self.heads != 0 || dh % 2 != 0 || stride[1] != 1 {
            candle_core::bail!(
                "rms_rope: rows of {d} values in {} heads of an even width, unit column stride",
                self.heads
            );
        }
        let CpuStorage::F32(xs) = s1 else {
            candle_core::bail!("rms_rope: expects f32 storage");
        };
        let start = l1.start_offset();
        let end = if rows == 0 {
            start
        } else {
            start + (rows - 1) * stride[0] + d
        };
        if end > xs.len() {
            candle_core::bail!("rms_rope: the rows lie outside their storage");
        }
        let x = &xs[start..end];
        let (scale, table) = (slice(s2, l2, self.name())?, slice(s3, l3, self.name())?);
        if scale.len() != dh || l3.shape().dims2()? != (rows, dh) {
            candle_core::bail!(
                "rms_rope: scale must hold {dh} values and the table be {rows} x {dh} (cos | sin)"
            );
        }
        let mut cos = Vec::with_capacity(rows * dh / 2);
        let mut sin = Vec::with_capacity(rows * dh / 2);
        for r in table.chunks_exact(dh) {
            cos.extend_from_slice(&r[..dh / 2]);
            sin.extend_from_slice(&r[dh / 2..]);
        }
        let mut y = vec![0.0f32; rows * d];
        rms_rope_f32(
            x,
            rows,
            stride[0],
            self.heads,
            dh,
            scale,
            self.eps,
            (&cos, &sin),
            &mut y,
        );
        Ok((CpuStorage::F32(y), Shape::from((rows, d))))
    }
}

/// FLUX's query/key path for `x` (`rows x heads * dh`, any row stride): each head RMS-normed
/// with `scale` (`dh` values, eps inside the root), then its consecutive pairs rotated by
/// `table` (`rows x dh`: the `dh / 2` cosines, then the sines). Returns `rows x heads * dh`.
pub fn rms_rope(
    x: &Tensor,
    scale: &Tensor,
    table: &Tensor,
    heads: usize,
    eps: f32,
) -> Result<Tensor> {
    if x.device().is_cpu() {
        let x = if x.rank() == 2 && x.stride()[1] == 1 {
            x.clone()
        } else {
            x.contiguous()?
        };
        return x.apply_op3_no_bwd(
            &scale.contiguous()?,
            &table.contiguous()?,
            &RmsRope { heads, eps },
        );
    }
    rms_rope_composed(x, scale, table, heads, eps)
}

/// [`rms_rope`] composed of candle's own ops: what runs on non-CPU devices and the CPU op's
/// reference.
pub fn rms_rope_composed(
    x: &Tensor,
    scale: &Tensor,
    table: &Tensor,
    heads: usize,
    eps: f32,
) -> Result<Tensor> {
    let (rows, d) = x.dims2()?;
    if heads == 0 || d % heads != 0 || (d / heads) % 2 != 0 {
        candle_core::bail!("rms_rope: {d} values do not split into {heads} heads of an even width");
    }
    let dh = d / heads;
    let xh = x.reshape((rows, heads, dh))?;
    let ms = xh.sqr()?.mean_keepdim(2)?;
    let y = xh
        .broadcast_div(&(ms + eps as f64)?.sqrt()?)?
        .broadcast_mul(scale)?
        .reshape((rows, heads, dh / 2, 2))?;
    let y0 = y.narrow(3, 0, 1)?.squeeze(3)?;
    let y1 = y.narrow(3, 1, 1)?.squeeze(3)?;
    let c = table.narrow(1, 0, dh / 2)?.unsqueeze(1)?;
    let s = table.narrow(1, dh / 2, dh / 2)?.unsqueeze(1)?;
    let r0 = (y0.broadcast_mul(&c)? - y1.broadcast_mul(&s)?)?;
    let r1 = (y0.broadcast_mul(&s)? + y1.broadcast_mul(&c)?)?;
    Tensor::stack(&[r0, r1], 3)?.reshape((rows, d))
}

/// The `nq x d` queries and `nk x d` keys and values of an attention op, checked.
#[allow(clippy::type_complexity)]
fn qkv_slices<'a>(
    op: &str,
    (s1, l1): (&'a CpuStorage, &Layout),
    (s2, l2): (&'a CpuStorage, &Layout),
    (s3, l3): (&'a CpuStorage, &Layout),
) -> Result<((usize, usize, usize), (&'a [f32], &'a [f32], &'a [f32]))> {
    let (nq, d) = l1.shape().dims2()?;
    let (nk, dk) = l2.shape().dims2()?;
    if dk != d || l3.shape().dims2()? != (nk, d) {
        candle_core::bail!("{op}: q is {nq}x{d}, k and v must be nk x {d}");
    }
    Ok((
        (nq, nk, d),
        (slice(s1, l1, op)?, slice(s2, l2, op)?, slice(s3, l3, op)?),
    ))
}

struct Flash {
    heads: usize,
}

impl CustomOp3 for Flash {
    fn name(&self) -> &'static str {
        "flash_attention_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((nq, nk, d), (q, k, v)) = qkv_slices("flash_attention", (s1, l1), (s2, l2), (s3, l3))?;
        let mut out = vec![0.0f32; nq * d];
        flash_attention_f32(q, nq, k, v, nk, d, self.heads, &mut out);
        Ok((CpuStorage::F32(out), Shape::from((nq, d))))
    }
}

/// Multi-head attention of `q` (`nq x d`) over `k`, `v` (`nk x d`), `heads` heads interleaved
/// in the columns, without statistics: on the CPU the online-softmax kernel (no `nq x nk`
/// matrix, query blocks in parallel), elsewhere [`attention_composed`].
pub fn flash_attention(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> Result<Tensor> {
    let wants = AttnWants::default();
    check_attention(q, k, v, heads, wants)?;
    if !q.device().is_cpu() {
        return Ok(attention_composed(q, k, v, heads, wants)?.out);
    }
    q.contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &Flash { heads })
}

struct ScatterRows<'a> {
    ids: &'a [u32],
}

impl CustomOp2 for ScatterRows<'_> {
    fn name(&self) -> &'static str {
        "scatter_rows_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = last_dim(l1.shape(), self.name())?;
        let (base, rows) = (slice(s1, l1, self.name())?, slice(s2, l2, self.name())?);
        check_scatter(base.len() / d, rows.len(), d, self.ids)?;
        let mut y = base.to_vec();
        scatter_rows_f32(rows, d, self.ids, &mut y);
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }
}

fn check_scatter(base_rows: usize, rows_len: usize, d: usize, ids: &[u32]) -> Result<()> {
    if rows_len != ids.len() * d {
        candle_core::bail!(
            "scatter_rows: {} rows given for {} ids of width {d}",
            rows_len / d.max(1),
            ids.len()
        );
    }
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= base_rows) {
        candle_core::bail!("scatter_rows: row {bad} is past the base's {base_rows} rows");
    }
    Ok(())
}

/// `base` (`m x d`) with row `ids[i]` replaced by row `i` of `rows` (`ids.len() x d`): the
/// keys of a whole latent with the active tokens' fresh rows written over the cached ones.
pub fn scatter_rows(base: &Tensor, rows: &Tensor, ids: &[u32]) -> Result<Tensor> {
    if base.device().is_cpu() {
        return base
            .contiguous()?
            .apply_op2_no_bwd(&rows.contiguous()?, &ScatterRows { ids });
    }
    let (m, d) = base.dims2()?;
    check_scatter(m, rows.elem_count(), d, ids)?;
    let idx = Tensor::from_slice(ids, ids.len(), base.device())?
        .unsqueeze(1)?
        .broadcast_as((ids.len(), d))?
        .contiguous()?;
    base.scatter(&idx, rows, 0)
}

/// What [`attention`] returns besides its output.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnWants<'a> {
    /// Return the head-averaged probabilities (`nq x nk`).
    pub probs: bool,
    /// Group of every key and the group count: return each query's head-averaged
    /// probability mass into each group (`nq x groups`).
    pub key_groups: Option<(&'a [u32], usize)>,
}

/// Output of [`attention`].
#[derive(Debug)]
pub struct AttnOut {
    /// `nq x d`.
    pub out: Tensor,
    /// `nq x nk`, when asked for.
    pub probs: Option<Tensor>,
    /// `nq x groups`, when asked for.
    pub group_mass: Option<Tensor>,
}

struct Attention<'a> {
    heads: usize,
    wants: AttnWants<'a>,
}

impl CustomOp3 for Attention<'_> {
    fn name(&self) -> &'static str {
        "attention_f32"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((nq, nk, d), (q, k, v)) = qkv_slices("attention", (s1, l1), (s2, l2), (s3, l3))?;
        let groups = self.wants.key_groups.map_or(0, |g| g.1);
        let np = if self.wants.probs { nk } else { 0 };
        let width = d + groups + np;
        let mut out = vec![0.0f32; nq * d];
        let mut mass = vec![0.0f32; nq * groups];
        let mut probs = vec![0.0f32; nq * np];
        let mut st = AttnStats {
            probs: self.wants.probs.then_some((&mut probs[..], 1.0)),
            group_mass: self.wants.key_groups.map(|(key_group, groups)| GroupMass {
                key_group,
                groups,
                out: &mut mass,
                weight: 1.0,
            }),
        };
        attention_f32(q, nq, k, v, nk, d, self.heads, &mut out, &mut st);
        if width == d {
            return Ok((CpuStorage::F32(out), Shape::from((nq, d))));
        }
        // One output tensor: [out | group mass | probs] per query row.
        let mut y = Vec::with_capacity(nq * width);
        for i in 0..nq {
            y.extend_from_slice(&out[i * d..(i + 1) * d]);
            y.extend_from_slice(&mass[i * groups..(i + 1) * groups]);
            y.extend_from_slice(&probs[i * np..(i + 1) * np]);
        }
        Ok((CpuStorage::F32(y), Shape::from((nq, width))))
    }
}

fn check_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    wants: AttnWants,
) -> Result<()> {
    let (_, d) = q.dims2()?;
    let (nk, dk) = k.dims2()?;
    if heads == 0 || d % heads != 0 {
        candle_core::bail!("attention: width {d} is not divisible into {heads} heads");
    }
    if dk != d || v.dims2()? != (nk, d) {
        candle_core::bail!("attention: q has width {d}, k and v must be {nk} x {d}");
    }
    if let Some((g, groups)) = wants.key_groups {
        if g.len() != nk || g.iter().any(|&x| x as usize >= groups) {
            candle_core::bail!("attention: key groups must be {nk} values below {groups}");
        }
    }
    for t in [q, k, v] {
        if t.dtype() != DType::F32 {
            candle_core::bail!("attention: expects f32, got {:?}", t.dtype());
        }
    }
    Ok(())
}

/// Multi-head scaled dot-product attention of queries `q` (`nq x d`) over keys `k` and
/// values `v` (`nk x d`), `heads` heads interleaved in the columns, with the statistics
/// `wants` asks for computed in the same pass. The queries may be a subset of the tokens
/// whose keys are given (token-subset execution).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    wants: AttnWants,
) -> Result<AttnOut> {
    check_attention(q, k, v, heads, wants)?;
    if !q.device().is_cpu() {
        return attention_composed(q, k, v, heads, wants);
    }
    let (_, d) = q.dims2()?;
    let (nk, _) = k.dims2()?;
    let y = q.contiguous()?.apply_op3_no_bwd(
        &k.contiguous()?,
        &v.contiguous()?,
        &Attention { heads, wants },
    )?;
    let groups = wants.key_groups.map_or(0, |g| g.1);
    Ok(AttnOut {
        out: if y.dim(1)? == d {
            y.clone()
        } else {
            y.narrow(1, 0, d)?
        },
        group_mass: match wants.key_groups {
            Some(_) => Some(y.narrow(1, d, groups)?),
            None => None,
        },
        probs: match wants.probs {
            true => Some(y.narrow(1, d + groups, nk)?),
            false => None,
        },
    })
}

/// [`attention`] composed of candle's own ops: what runs on non-CPU devices and the CPU
/// op's reference. Materialises the `heads x nq x nk` probabilities.
pub fn attention_composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    wants: AttnWants,
) -> Result<AttnOut> {
    check_attention(q, k, v, heads, wants)?;
    let (nq, d) = q.dims2()?;
    let (nk, _) = k.dims2()?;
    let dh = d / heads;
    let split = |t: &Tensor, n: usize| -> Result<Tensor> {
        t.reshape((n, heads, dh))?.transpose(0, 1)?.contiguous()
    };
    let (qh, kh, vh) = (split(q, nq)?, split(k, nk)?, split(v, nk)?);
    let scores = (qh.matmul(&kh.t()?)? * (1.0 / (dh as f64).sqrt()))?;
    let p = candle_core::Tensor::exp(&scores.broadcast_sub(&scores.max_keepdim(2)?)?)?;
    let p = p.broadcast_div(&p.sum_keepdim(2)?)?;
    let out = p
        .matmul(&vh)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((nq, d))?;
    let mean = p.mean(0)?;
    let group_mass = match wants.key_groups {
        None => None,
        Some((g, groups)) => {
            let mut onehot = vec![0.0f32; nk * groups];
            for (j, &x) in g.iter().enumerate() {
                onehot[j * groups + x as usize] = 1.0;
            }
            let onehot = Tensor::from_vec(onehot, (nk, groups), q.device())?;
            Some(mean.matmul(&onehot)?)
        }
    };
    Ok(AttnOut {
        out,
        probs: wants.probs.then_some(mean),
        group_mass,
    })
}
