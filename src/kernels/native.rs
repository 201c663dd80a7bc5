//! Eager f32 ops on the compiled kernels' native helpers (`smelt_rt::vmath`): exp, tanh,
//! sigmoid, silu, erf, both GELUs and their slopes of an f32 tensor run 8 or 16 lanes at a
//! time with the compiled code's bits, and softmax, log_softmax, layer_norm and sums over
//! trailing dims run one vector helper per row, instead of the float64 reference formulas,
//! which widen every element to f64 and evaluate it alone, one libm call after another.
//!
//! The reference interpreter (`super::interp::run`, the oracle compiled code is tested
//! against, and `--backend interp`) keeps the reference formulas: it runs in
//! [`ReferenceMode`], which turns this path off on its thread.

use super::copy;
use crate::ir::dtype::DType;
use crate::ir::op::UnaryOp;
use crate::tensor::Tensor;
use crate::tensor::access;
use smelt_rt::vmath::{self, StripOp};
use std::cell::Cell;

/// The strip op that evaluates f32 unary op `u`, if one does.
pub fn strip_of(u: UnaryOp) -> Option<StripOp> {
    StripOp::ALL.into_iter().find(|&s| {
        u == match s {
            StripOp::Exp => UnaryOp::Exp,
            StripOp::Tanh => UnaryOp::Tanh,
            StripOp::Sigmoid => UnaryOp::Sigmoid,
            StripOp::Silu => UnaryOp::Silu,
            StripOp::GeluTanh => UnaryOp::Gelu { tanh: true },
            StripOp::GeluErf => UnaryOp::Gelu { tanh: false },
            StripOp::Erf => UnaryOp::Erf,
            StripOp::GeluErfSlope => UnaryOp::GeluSlope { tanh: false },
            StripOp::GeluTanhSlope => UnaryOp::GeluSlope { tanh: true },
        }
    })
}

thread_local! {
    static REFERENCE: Cell<bool> = const { Cell::new(false) };
}

/// Whether eager ops on this thread run the reference formulas only.
pub fn reference() -> bool {
    REFERENCE.with(Cell::get)
}

/// While alive, eager ops on this thread run the reference formulas only.
pub struct ReferenceMode {
    before: bool,
}

impl ReferenceMode {
    /// Enters reference mode on this thread until the guard drops.
    pub fn enter() -> ReferenceMode {
        ReferenceMode {
            before: REFERENCE.with(|r| r.replace(true)),
        }
    }
}

impl Drop for ReferenceMode {
    fn drop(&mut self) {
        REFERENCE.with(|r| r.set(self.before));
    }
}

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// Whether a helper over `n` elements splits them across the threads.
fn split(n: usize) -> bool {
    n >= (2 * CHUNK).max(crate::tensor::threads::eager_par_min())
        && crate::tensor::threads::available() > 1
}

/// `dst = u(x)` on the native helpers, when `u` has one, both are f32 of one shape, `dst`
/// is contiguous and this thread is not in reference mode; `None` leaves it to the
/// reference loop. Results below f32's normal range (where the helpers, working in f32,
/// lose precision with the exponent) are recomputed by the reference formula, where
/// [`helper_stands_below`] does not keep the helper's.
pub(crate) fn unary_f32(u: UnaryOp, x: &Tensor, dst: &Tensor) -> Option<()> {
    let op = strip_of(u)?;
    let usable = !reference()
        && vmath::available()
        && x.dtype() == DType::F32
        && dst.dtype() == DType::F32
        && x.shape() == dst.shape()
        && dst.is_contiguous();
    if !usable {
        return None;
    }
    // a contiguous source apart from dst (an in-place call reads a copy)
    let src = if x.is_contiguous() && !x.shares_storage(dst) {
        x.clone()
    } else {
        copy::cast_new(x, DType::F32).ok()?
    };
    let n = dst.numel();
    let acc = access::lock(&[&src], &[dst]);
    // SAFETY: src and dst are contiguous f32 tensors of n elements in distinct storages;
    // the read and write locks are held while the slices live.
    let (xs, ys) = unsafe {
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n),
            std::slice::from_raw_parts_mut(acc.write::<f32>(0), n),
        )
    };
    let stands = helper_stands_below(op);
    let task = |(y, x): (&mut [f32], &[f32])| {
        vmath::apply_from(op, x, y);
        let Some(below) = stands else { return };
        // a counting pass vectorises; the fix-up below runs only where one may be needed
        // (and skips the results that round to ±0 anyway: exp's masked softmax rows)
        let tiny: u32 = y
            .iter()
            .map(|y| u32::from(y.abs() < f32::MIN_POSITIVE))
            .sum();
        if tiny > 0 {
            for (y, &x) in y.iter_mut().zip(x) {
                if y.abs() < f32::MIN_POSITIVE && x >= below {
                    *y = u.eval_f64(f64::from(x)) as f32;
                }
            }
        }
    };
    if split(n) {
        use rayon::prelude::*;
        ys.par_chunks_mut(CHUNK)
            .zip(xs.par_chunks(CHUNK))
            .for_each(task);
    } else {
        task((ys, xs));
    }
    Some(())
}

/// The `x` below which the helper's result of `op` stands even under f32's normal range:
/// where the exact result rounds to ±0 (with a margin), as the helper's does. `None` where
/// it stands everywhere: the GELUs and their slopes flush results under the normal range to
/// ±0, as the compiled kernels do (so eager GELUs give the compiled bits).
fn helper_stands_below(op: StripOp) -> Option<f32> {
    match op {
        // e^-104 < 2^-150
        StripOp::Exp => Some(-104.0),
        StripOp::Sigmoid => Some(-105.0),
        StripOp::Silu => Some(-110.0),
        StripOp::GeluTanh | StripOp::GeluTanhSlope | StripOp::GeluErf | StripOp::GeluErfSlope => {
            None
        }
        StripOp::Tanh | StripOp::Erf => Some(f32::NEG_INFINITY),
    }
}

/// What a row of f32s folds into on the native helpers ([`row_fold_f32`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowFold {
    Sum,
    Mean,
    Max,
    Min,
}

impl RowFold {
    /// The fold of one run of a row: an f64 sum, or the extreme (NaN when any is NaN).
    fn part(self, xs: &[f32]) -> f64 {
        match self {
            RowFold::Sum | RowFold::Mean => vmath::sum(xs),
            RowFold::Max => f64::from(vmath::extreme(xs, true)),
            RowFold::Min => f64::from(vmath::extreme(xs, false)),
        }
    }
    /// Two runs' folds as one.
    fn combine(self, a: f64, b: f64) -> f64 {
        match self {
            RowFold::Sum | RowFold::Mean => a + b,
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            RowFold::Max => a.max(b),
            RowFold::Min => a.min(b),
        }
    }
    fn finish(self, s: f64, n_in: usize) -> f32 {
        match self {
            RowFold::Mean => (s / n_in as f64) as f32,
            _ => s as f32,
        }
    }
}

/// `sum`, `mean`, `amax` or `amin` of a contiguous f32 tensor over trailing dims, `n_in`
/// elements per output, on the strip helpers (sums in f64 partial sums, as the compiled
/// kernels sum), when this thread is not in reference mode; `None` leaves it to the
/// reference loop. Outputs are split over the threads, or, when there are few, each
/// output's run is.
pub(crate) fn row_fold_f32(x: &Tensor, n_in: usize, fold: RowFold, out: &Tensor) -> Option<()> {
    let usable = !reference()
        && vmath::available()
        && x.dtype() == DType::F32
        && out.dtype() == DType::F32
        && x.is_contiguous()
        && out.is_contiguous()
        && n_in > 0
        && x.numel() == n_in * out.numel();
    if !usable {
        return None;
    }
    let n_out = out.numel();
    let acc = access::lock(&[x], &[out]);
    // SAFETY: x holds n_out·n_in contiguous f32s and out n_out; the locks are held.
    let (xs, ys) = unsafe {
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n_out * n_in),
            std::slice::from_raw_parts_mut(acc.write::<f32>(0), n_out),
        )
    };
    let row = |row: &[f32]| fold.finish(fold.part(row), n_in);
    use rayon::prelude::*;
    let threads = crate::tensor::threads::available();
    if !split(xs.len()) {
        for (y, r) in ys.iter_mut().zip(xs.chunks_exact(n_in)) {
            *y = row(r);
        }
    } else if n_out >= 4 * threads {
        let rows = CHUNK.div_ceil(n_in).max(1);
        ys.par_chunks_mut(rows)
            .zip(xs.par_chunks(rows * n_in))
            .for_each(|(y, x)| {
                for (y, r) in y.iter_mut().zip(x.chunks_exact(n_in)) {
                    *y = row(r);
                }
            });
    } else {
        for (y, r) in ys.iter_mut().zip(xs.chunks_exact(n_in)) {
            let part = n_in.div_ceil(4 * threads).max(CHUNK);
            let parts: Vec<f64> = r.par_chunks(part).map(|c| fold.part(c)).collect();
            let s = parts.into_iter().reduce(|a, b| fold.combine(a, b));
            *y = fold.finish(s.unwrap_or(0.0), n_in);
        }
    }
    Some(())
}

/// `sum` (or `mean`) of a contiguous f32 tensor over leading dims, `n_in` rows of
/// `out.numel()` columns, on the column-sum helper (f64 sums, rows in order, as the compiled
/// column reductions add), blocks of columns split over the threads, when this thread is
/// not in reference mode; `None` leaves it to the reference loop.
pub(crate) fn col_sum_f32(x: &Tensor, n_in: usize, mean: bool, out: &Tensor) -> Option<()> {
    let cols = out.numel();
    let usable = !reference()
        && x.dtype() == DType::F32
        && out.dtype() == DType::F32
        && x.is_contiguous()
        && out.is_contiguous()
        && n_in > 0
        && cols > 0
        && x.numel() == n_in * cols;
    if !usable {
        return None;
    }
    let acc = access::lock(&[x], &[out]);
    // SAFETY: x holds n_in·cols contiguous f32s and out cols; the locks are held.
    let (xs, ys) = unsafe {
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n_in * cols),
            std::slice::from_raw_parts_mut(acc.write::<f32>(0), cols),
        )
    };
    let block = |c0: usize, y: &mut [f32]| {
        let mut s = vec![0.0f64; y.len()];
        vmath::col_sums(xs, cols, c0, &mut s);
        for (y, s) in y.iter_mut().zip(s) {
            *y = (if mean { s / n_in as f64 } else { s }) as f32;
        }
    };
    let threads = crate::tensor::threads::available();
    if !split(xs.len()) {
        block(0, ys);
    } else {
        use rayon::prelude::*;
        // a few blocks per thread, each a whole number of 64-byte lines wide
        let width = cols.div_ceil(4 * threads).next_multiple_of(16).max(16);
        ys.par_chunks_mut(width)
            .enumerate()
            .for_each(|(i, y)| block(i * width, y));
    }
    Some(())
}

/// `layer_norm` of an f32 tensor over its last `len` elements, with an optional f32
/// weight and bias of `len` elements, when this thread is not in reference mode: the
/// reference's formula (mean, biased variance and the normalisation in f64, one rounding
/// to f32), each row one call of the vector helper `vmath::layer_norm`, the rows split
/// over the threads. `None` leaves it to the reference loop.
pub(crate) fn layer_norm_f32(
    x: &Tensor,
    len: usize,
    eps: f64,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
) -> Option<crate::Result<Tensor>> {
    let param_ok = |p: Option<&Tensor>| {
        p.is_none_or(|p| p.dtype() == DType::F32 && p.numel() == len && p.is_contiguous())
    };
    let usable = !reference()
        && x.dtype() == DType::F32
        && x.dim() > 0
        && len > 0
        && x.numel().is_multiple_of(len)
        && param_ok(w)
        && param_ok(b);
    if !usable {
        return None;
    }
    let run = || -> crate::Result<Tensor> {
        let wv = w.map(copy::to_vec::<f32>).transpose()?;
        let bv = b.map(copy::to_vec::<f32>).transpose()?;
        map_rows(x, len, |x, y| {
            vmath::layer_norm(x, y, wv.as_deref(), bv.as_deref(), eps)
        })
    };
    Some(run())
}

/// A fresh contiguous f32 tensor of `x`'s shape whose rows of `len` elements are `f` of
/// `x`'s rows (`x` read contiguous first), the rows split over the threads when there are
/// many. `len` must be positive and divide `x`'s element count.
fn map_rows(
    x: &Tensor,
    len: usize,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) -> crate::Result<Tensor> {
    let src = copy::contiguous(x)?;
    let out = Tensor::alloc_for_overwrite(DType::F32, x.shape())?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let acc = access::lock(&[&src], &[&out]);
    // SAFETY: src and the fresh out are contiguous f32 tensors of n elements in distinct
    // storages; the read and write locks are held while the slices live.
    let (xs, ys) = unsafe {
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n),
            std::slice::from_raw_parts_mut(acc.write::<f32>(0), n),
        )
    };
    let per_task = (CHUNK / len).max(1) * len;
    let task = |(ys, xs): (&mut [f32], &[f32])| {
        for (y, x) in ys.chunks_mut(len).zip(xs.chunks(len)) {
            f(x, y);
        }
    };
    if split(n) {
        use rayon::prelude::*;
        ys.par_chunks_mut(per_task)
            .zip(xs.par_chunks(per_task))
            .for_each(task);
    } else {
        task((ys, xs));
    }
    drop(acc);
    Ok(out)
}

/// `row` folded by `step` in eight interleaved chains from `init`, joined by `join` at the
/// end: a single chain would serialise the row on each step's latency.
pub(crate) fn chains<E: Copy, A: Copy>(
    row: &[E],
    init: A,
    step: impl Fn(A, E) -> A,
    join: impl Fn(A, A) -> A,
) -> A {
    let mut acc = [init; 8];
    let blocks = row.chunks_exact(8);
    let tail = blocks.remainder();
    for b in blocks {
        for (a, &x) in acc.iter_mut().zip(b) {
            *a = step(*a, x);
        }
    }
    let r = acc.into_iter().fold(init, join);
    tail.iter().fold(r, |a, &x| step(a, x))
}

/// softmax or log_softmax of an f32 tensor along its last dim on the native exp (a
/// contiguous result; a strided input is read through a contiguous copy), when this thread
/// is not in reference mode; `None` leaves it to the reference kernel.
pub(crate) fn softmax_f32(x: &Tensor, dim: usize, log: bool) -> Option<crate::Result<Tensor>> {
    let usable = !reference()
        && vmath::available()
        && x.dtype() == DType::F32
        && x.dim() > 0
        && dim + 1 == x.dim();
    if !usable {
        return None;
    }
    let len = x.shape()[dim].max(1);
    Some(map_rows(x, len, |x, y| vmath::softmax(x, y, log)))
}
