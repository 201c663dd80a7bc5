//! Indexing kernels: concatenation, flips, triangles, and the ops that read or write through
//! an index tensor. Inputs are read through their strides; outputs are fresh and contiguous.
//! Every index is checked against its bound, under the same storage locks as the copy, before
//! any element is read or written.
//!
//! Pure data movement copies raw element bits (1, 2, 4 or 8 bytes), so one instance serves
//! every dtype of that size. The walks pass extra "counter" operands to `Walk`: a stride
//! vector that is 1 along one dim and 0 elsewhere makes the walk report that dim's index
//! (a row number, a position in the index tensor) alongside the memory offsets.

use super::copy::{cast_new, copy_into};
use crate::ir::op::{Op, ScatterReduction, TensorType};
use crate::ir::shape::{contiguous_strides, wrap_dim, wrap_dims};
use crate::layout::Layout;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::tensor::strided::{SendPtr, Walk};
use crate::{DType, Error, Result, bail, dispatch};
use std::cmp::Ordering;

/// Runs `$body` with `$T` an unsigned integer of `$size` bytes (for copying raw elements).
macro_rules! dispatch_bits {
    ($size:expr, $T:ident => $body:expr) => {
        match $size {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            _ => {
                type $T = u64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$I` the element type of an index tensor (int32 or int64).
macro_rules! dispatch_index {
    ($dtype:expr, $I:ident => $body:expr) => {
        match $dtype {
            DType::I32 => {
                type $I = i32;
                $body
            }
            _ => {
                type $I = i64;
                $body
            }
        }
    };
}

/// Evaluates a joining, flipping, triangle or indexing op (`cat`, `stack`, `flip`, `tril`, `triu`,
/// `index_select`, `gather`, `scatter`, `scatter_add`, `index_add`, `embedding`).
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let x = inputs[0];
    let dim_of = |dim: i64| wrap_dim(dim, x.dim());
    match op {
        Op::Cat { dim } => cat(inputs, *dim, out),
        Op::Stack { dim } => stack(inputs, *dim, out),
        Op::Flip { dims } => flip(x, &wrap_dims(dims, x.dim())?),
        Op::Tril { diagonal } => triangle(x, *diagonal, true),
        Op::Triu { diagonal } => triangle(x, *diagonal, false),
        Op::IndexSelect { dim } => index_select(x, dim_of(*dim)?, inputs[1], out),
        Op::Gather { dim } => gather(x, dim_of(*dim)?, inputs[1]),
        Op::Scatter { dim } => scatter(x, dim_of(*dim)?, inputs[1], inputs[2], None),
        Op::ScatterAdd { dim } => {
            let sum = Some(ScatterReduction::Sum);
            scatter(x, dim_of(*dim)?, inputs[1], inputs[2], sum)
        }
        Op::ScatterReduce { dim, reduce } => {
            scatter(x, dim_of(*dim)?, inputs[1], inputs[2], Some(*reduce))
        }
        Op::IndexAdd { dim } => {
            let o = cast_new(x, x.dtype())?;
            index_add_into(&o, dim_of(*dim)?, inputs[1], inputs[2])?;
            Ok(o)
        }
        Op::Embedding => embedding(inputs[0], inputs[1], out),
        _ => unreachable!("index::eval called with {}", op.name()),
    }
}

// ---- helpers -----------------------------------------------------------------------------

/// Size of `dim` of `x`, a 0-d tensor counting as one element along dim 0.
fn dim_size(x: &Tensor, d: usize) -> usize {
    x.shape().get(d).copied().unwrap_or(1)
}

/// Stride of `dim` of `x` (0 for a 0-d tensor).
fn dim_stride(x: &Tensor, d: usize) -> usize {
    x.strides().get(d).copied().unwrap_or(0)
}

/// `x`'s strides over a walk of `nd` dims, with `skip` (the indexed dim) and dims `x` lacks
/// set to 0.
fn walk_strides(x: &Tensor, nd: usize, skip: Option<usize>) -> Vec<usize> {
    (0..nd)
        .map(|k| {
            if Some(k) == skip {
                0
            } else {
                x.strides().get(k).copied().unwrap_or(0)
            }
        })
        .collect()
}

/// A stride vector of `nd` dims that is `s` along `d` and 0 elsewhere.
fn one_hot(nd: usize, d: usize, s: usize) -> Vec<usize> {
    (0..nd).map(|k| if k == d { s } else { 0 }).collect()
}

/// The first index of `idx` (element 0 at `p`) outside `0..size`, in row-major order.
///
/// # Safety
/// `p` must point at element 0 of `idx` under a held lock.
unsafe fn first_bad_index<I: Element>(p: *const I, idx: &Tensor, size: usize) -> Option<i64> {
    let mut bad = None;
    Walk::new(idx.shape(), [idx.strides()]).run_range(0, idx.numel(), &mut |[b], len, [s]| {
        if bad.is_some() {
            return;
        }
        for k in 0..len {
            // SAFETY: the walk stays inside idx's layout.
            let v = unsafe { *p.add(b + k * s) }.to_i64();
            if v < 0 || v as u64 >= size as u64 {
                bad = Some(v);
                return;
            }
        }
    });
    bad
}

/// The message of PyTorch's gather/scatter bound check.
fn out_of_bounds(v: i64, d: usize, size: usize) -> Error {
    Error::Index(format!(
        "index {v} is out of bounds for dimension {d} with size {size}"
    ))
}

/// The bound-check message of index_select-like ops, naming the index and the size.
fn out_of_range(name: &str, v: i64, d: usize, size: usize) -> Error {
    Error::Index(format!(
        "{name}(): index {v} is out of range for dimension {d} with size {size}"
    ))
}

// ---- concatenation, flips, triangles -------------------------------------------------------

/// `torch.cat`: each input is cast into its slice of the output.
fn cat(inputs: &[&Tensor], dim: i64, out: &TensorType) -> Result<Tensor> {
    let o = Tensor::alloc(out.dtype, &out.shape)?;
    // PyTorch skips legacy empty 1-D inputs, as the shape rule does.
    let parts: Vec<&&Tensor> = inputs
        .iter()
        .filter(|t| !(t.dim() == 1 && t.shape()[0] == 0))
        .collect();
    if parts.is_empty() || o.numel() == 0 {
        return Ok(o);
    }
    let d = wrap_dim(dim, o.dim())?;
    let mut start = 0;
    for t in parts {
        let len = t.shape()[d];
        let view = o.with_layout(o.layout().narrow(d as i64, start as i64, len as i64)?);
        copy_into(&view, t);
        start += len;
    }
    Ok(o)
}

/// `torch.stack`: each input is cast into its slice along the new dim.
fn stack(inputs: &[&Tensor], dim: i64, out: &TensorType) -> Result<Tensor> {
    let o = Tensor::alloc(out.dtype, &out.shape)?;
    let d = wrap_dim(dim, o.dim().saturating_sub(1) + 1)?;
    for (i, t) in inputs.iter().enumerate() {
        let view = o.with_layout(o.layout().select(d as i64, i as i64)?);
        copy_into(&view, t);
    }
    Ok(o)
}

/// `flip(dims)`. The source offset `sum (n-1-i)*s` over flipped dims is computed as a
/// constant minus a walked offset, since strides are unsigned.
fn flip(x: &Tensor, dims: &[usize]) -> Result<Tensor> {
    let o = Tensor::alloc(x.dtype(), x.shape())?;
    if o.numel() == 0 {
        return Ok(o);
    }
    let nd = x.dim();
    let keep: Vec<usize> = (0..nd)
        .map(|k| if dims.contains(&k) { 0 } else { x.strides()[k] })
        .collect();
    let back: Vec<usize> = (0..nd)
        .map(|k| if dims.contains(&k) { x.strides()[k] } else { 0 })
        .collect();
    let base: usize = dims
        .iter()
        .map(|&k| (x.shape()[k] - 1) * x.strides()[k])
        .sum();
    let acc = access::lock(&[x], &[&o]);
    dispatch_bits!(x.dtype().size(), T => {
        let (po, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
        let walk = Walk::new(x.shape(), [o.strides(), &keep, &back]);
        walk.par_run(|[bo, bk, bb], len, [so, sk, sb]| {
            for i in 0..len {
                let src = base + bk + i * sk - (bb + i * sb);
                // SAFETY: src is a valid index of x's layout; o is fresh and contiguous.
                unsafe { *po.get().add(bo + i * so) = *px.get().add(src) };
            }
        });
    });
    drop(acc);
    Ok(o)
}

/// `tril`/`triu` over the last two dims, batched over the leading ones. Dropped elements
/// keep the output's zero fill (all-zero bits are zero in every dtype).
fn triangle(x: &Tensor, diagonal: i64, lower: bool) -> Result<Tensor> {
    let o = Tensor::alloc(x.dtype(), x.shape())?;
    let nd = x.dim();
    let rows = one_hot(nd, nd - 2, 1);
    let cols = one_hot(nd, nd - 1, 1);
    let acc = access::lock(&[x], &[&o]);
    dispatch_bits!(x.dtype().size(), T => {
        let (po, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
        let walk = Walk::new(x.shape(), [o.strides(), x.strides(), &rows, &cols]);
        walk.par_run(|[bo, bx, r, c], len, [so, sx, sr, sc]| {
            for i in 0..len {
                let diff = (c + i * sc) as i64 - (r + i * sr) as i64;
                if (lower && diff <= diagonal) || (!lower && diff >= diagonal) {
                    // SAFETY: both offsets come from the walk over valid layouts.
                    unsafe { *po.get().add(bo + i * so) = *px.get().add(bx + i * sx) };
                }
            }
        });
    });
    drop(acc);
    Ok(o)
}

// ---- reading through an index tensor ---------------------------------------------------------

/// `index_select(dim, index)`: whole slices of `x` picked along `d`.
fn index_select(x: &Tensor, d: usize, idx: &Tensor, out: &TensorType) -> Result<Tensor> {
    if x.dim() == 0 && idx.numel() != 1 {
        bail!(
            Index,
            "index_select(): Index to scalar can have only 1 value, got {} value(s)",
            idx.numel()
        );
    }
    let o = Tensor::alloc(out.dtype, &out.shape)?;
    let size = dim_size(x, d);
    let nd = o.dim();
    let xs = walk_strides(x, nd, Some(d));
    let is = one_hot(nd, d, idx.strides().first().copied().unwrap_or(0));
    let step = dim_stride(x, d);
    let acc = access::lock(&[x, idx], &[&o]);
    dispatch_index!(idx.dtype(), I => {
        let pi = acc.read::<I>(1);
        // SAFETY: pi is element 0 of idx under the lock.
        if let Some(v) = unsafe { first_bad_index(pi, idx, size) } {
            return Err(out_of_range("index_select", v, d, size));
        }
        let pi = SendPtr(pi as *mut I);
        dispatch_bits!(x.dtype().size(), T => {
            let (po, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
            Walk::new(o.shape(), [o.strides(), &xs, &is]).par_run(|[bo, bx, bi], len, [so, sx, si]| {
                for k in 0..len {
                    // SAFETY: every index was checked to lie in 0..size above.
                    unsafe {
                        let v = (*pi.get().add(bi + k * si)).to_i64() as usize;
                        *po.get().add(bo + k * so) = *px.get().add(bx + k * sx + v * step);
                    }
                }
            });
        });
    });
    drop(acc);
    Ok(o)
}

/// `gather(dim, index)`: `out[p] = x[p with p[d] = index[p]]`.
fn gather(x: &Tensor, d: usize, idx: &Tensor) -> Result<Tensor> {
    let o = Tensor::alloc(x.dtype(), idx.shape())?;
    let size = dim_size(x, d);
    let xs = walk_strides(x, idx.dim(), Some(d));
    let step = dim_stride(x, d);
    let acc = access::lock(&[x, idx], &[&o]);
    let pi = acc.read::<i64>(1);
    // SAFETY: pi is element 0 of idx (int64, checked by the shape rule) under the lock.
    if let Some(v) = unsafe { first_bad_index(pi, idx, size) } {
        return Err(out_of_bounds(v, d, size));
    }
    let pi = SendPtr(pi as *mut i64);
    dispatch_bits!(x.dtype().size(), T => {
        let (po, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
        Walk::new(idx.shape(), [o.strides(), idx.strides(), &xs]).par_run(|[bo, bi, bx], len, [so, si, sx]| {
            for k in 0..len {
                // SAFETY: indices checked above; the shape rule bounds the other coordinates.
                unsafe {
                    let v = *pi.get().add(bi + k * si) as usize;
                    *po.get().add(bo + k * so) = *px.get().add(bx + k * sx + v * step);
                }
            }
        });
    });
    drop(acc);
    Ok(o)
}

/// `embedding(index, weight)`: rows of `weight` picked by `index`.
fn embedding(idx: &Tensor, w: &Tensor, out: &TensorType) -> Result<Tensor> {
    let o = Tensor::alloc(out.dtype, &out.shape)?;
    let size = w.shape()[0];
    let mut is = idx.strides().to_vec();
    is.push(0);
    let mut ws = vec![0; idx.dim()];
    ws.push(w.strides()[1]);
    let step = w.strides()[0];
    let acc = access::lock(&[w, idx], &[&o]);
    dispatch_index!(idx.dtype(), I => {
        let pi = acc.read::<I>(1);
        // SAFETY: pi is element 0 of idx under the lock.
        if let Some(v) = unsafe { first_bad_index(pi, idx, size) } {
            return Err(out_of_range("embedding", v, 0, size));
        }
        let pi = SendPtr(pi as *mut I);
        dispatch_bits!(w.dtype().size(), T => {
            let (po, pw) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
            Walk::new(o.shape(), [o.strides(), &is, &ws]).par_run(|[bo, bi, bw], len, [so, si, sw]| {
                for k in 0..len {
                    // SAFETY: every index was checked to lie in 0..size above.
                    unsafe {
                        let v = (*pi.get().add(bi + k * si)).to_i64() as usize;
                        *po.get().add(bo + k * so) = *pw.get().add(bw + k * sw + v * step);
                    }
                }
            });
        });
    });
    drop(acc);
    Ok(o)
}

// ---- writing through an index tensor ---------------------------------------------------------

/// `a + b` with the reference numerics: f64 for floats, wrapping i64 for integers (bool: or).
#[inline(always)]
fn add_elem<T: Element>(a: T, b: T) -> T {
    if T::DTYPE.is_float() {
        T::from_f64(a.to_f64() + b.to_f64())
    } else {
        T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
    }
}

/// `a` and `b` combined by `r` with the reference numerics (f64 for floats, wrapping i64
/// for integers and bools); `Mean` sums here and divides at the end.
#[inline(always)]
fn combine<T: Element>(r: ScatterReduction, a: T, b: T) -> T {
    use ScatterReduction::*;
    match r {
        Sum | Mean => add_elem(a, b),
        Prod if T::DTYPE.is_float() => T::from_f64(a.to_f64() * b.to_f64()),
        Prod => T::from_i64(a.to_i64().wrapping_mul(b.to_i64())),
        Amax | Amin if T::DTYPE.is_float() => {
            let (x, y) = (a.to_f64(), b.to_f64());
            if x.is_nan() || y.is_nan() {
                return T::from_f64(f64::NAN);
            }
            let keep = if r == Amax { x >= y } else { x <= y };
            if keep { a } else { b }
        }
        Amax => T::from_i64(a.to_i64().max(b.to_i64())),
        Amin => T::from_i64(a.to_i64().min(b.to_i64())),
    }
}

/// `scatter` (`reduce` None), `scatter_add` (`Sum`) or `scatter_reduce(dim, index, src)`
/// with `include_self` into a copy of `x`. Runs in order on one thread, so with duplicate
/// indices `scatter` keeps the last write in row-major order of `index` (PyTorch leaves
/// that case unspecified).
fn scatter(
    x: &Tensor,
    d: usize,
    idx: &Tensor,
    src: &Tensor,
    reduce: Option<ScatterReduction>,
) -> Result<Tensor> {
    let o = cast_new(x, x.dtype())?;
    let size = dim_size(x, d);
    let nd = idx.dim();
    let ss = walk_strides(src, nd, None);
    let os = walk_strides(&o, nd, Some(d));
    let step = dim_stride(&o, d);
    let acc = access::lock(&[idx, src], &[&o]);
    let pi = acc.read::<i64>(0);
    // SAFETY: pi is element 0 of idx (int64, checked by the shape rule) under the lock.
    if let Some(v) = unsafe { first_bad_index(pi, idx, size) } {
        return Err(out_of_bounds(v, d, size));
    }
    let walk = Walk::new(idx.shape(), [idx.strides(), &ss, &os]);
    // a mean counts the values each element receives (o is a fresh contiguous tensor, so
    // an element's offset is its row-major position)
    let mean = reduce == Some(ScatterReduction::Mean);
    let mut counts = vec![0u32; if mean { o.numel() } else { 0 }];
    dispatch!(x.dtype(), T => {
        let (po, ps) = (acc.write::<T>(0), acc.read::<T>(1));
        walk.run_range(0, walk.numel(), &mut |[bi, bs, bo], len, [si, ss, so]| {
            for k in 0..len {
                // SAFETY: indices checked above; the shape rule bounds idx by src and x.
                unsafe {
                    let v = *pi.add(bi + k * si) as usize;
                    let at = bo + k * so + v * step;
                    let dst = po.add(at);
                    let s = *ps.add(bs + k * ss);
                    *dst = match reduce {
                        None => s,
                        Some(r) => combine(r, *dst, s),
                    };
                    if mean {
                        counts[at] += 1;
                    }
                }
            }
        });
        for (at, &c) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            // x's own element counts too (include_self); integers round down, as PyTorch
            let n = c as i64 + 1;
            // SAFETY: at < o.numel(), an offset of the contiguous o.
            unsafe {
                let p = po.add(at);
                *p = if T::DTYPE.is_float() {
                    T::from_f64((*p).to_f64() / n as f64)
                } else {
                    T::from_i64((*p).to_i64().div_euclid(n))
                };
            }
        }
    });
    drop(acc);
    Ok(o)
}

/// `dst.index_add_(dim, index, source)`: adds slices of `src` into `dst` in place. The
/// caller has checked shapes (the shape rule) and that `dst` has no internal overlap.
pub fn index_add_into(dst: &Tensor, d: usize, idx: &Tensor, src: &Tensor) -> Result<()> {
    // Inputs that alias the destination are read from a copy, so writes cannot feed reads.
    let idx_c;
    let idx = if idx.shares_storage(dst) {
        idx_c = cast_new(idx, idx.dtype())?;
        &idx_c
    } else {
        idx
    };
    let src_c;
    let src = if src.shares_storage(dst) {
        src_c = cast_new(src, src.dtype())?;
        &src_c
    } else {
        src
    };
    let size = dim_size(dst, d);
    let nd = src.dim();
    let ds = walk_strides(dst, nd, Some(d));
    let is = one_hot(nd, d, idx.strides().first().copied().unwrap_or(0));
    let step = dim_stride(dst, d);
    let acc = access::lock(&[idx, src], &[dst]);
    dispatch_index!(idx.dtype(), I => {
        let pi = acc.read::<I>(0);
        // SAFETY: pi is element 0 of idx under the lock.
        if let Some(v) = unsafe { first_bad_index(pi, idx, size) } {
            return Err(out_of_range("index_add", v, d, size));
        }
        dst.storage().bump_version();
        let walk = Walk::new(src.shape(), [src.strides(), &ds, &is]);
        dispatch!(dst.dtype(), T => {
            let (po, ps) = (acc.write::<T>(0), acc.read::<T>(1));
            walk.run_range(0, walk.numel(), &mut |[bs, bd, bi], len, [ss, sd, si]| {
                for k in 0..len {
                    // SAFETY: indices checked above; the shape rule matches src to dst.
                    unsafe {
                        let v = (*pi.add(bi + k * si)).to_i64() as usize;
                        let p = po.add(bd + k * sd + v * step);
                        *p = add_elem(*p, *ps.add(bs + k * ss));
                    }
                }
            });
        });
    });
    Ok(())
}

// ---- eager-only, data-dependent ops -----------------------------------------------------------

/// Linear (row-major) positions of the nonzero elements of `x`, in order.
fn nonzero_positions(x: &Tensor) -> Vec<usize> {
    let mut pos = Vec::new();
    let lin = contiguous_strides(x.shape());
    let acc = access::lock(&[x], &[]);
    let walk = Walk::new(x.shape(), [x.strides(), &lin]);
    dispatch!(x.dtype(), T => {
        let p = acc.read::<T>(0);
        walk.run_range(0, walk.numel(), &mut |[b, l], len, [s, sl]| {
            for k in 0..len {
                // SAFETY: the walk stays inside x's layout. NaN counts as nonzero.
                if unsafe { *p.add(b + k * s) }.to_f64() != 0.0 {
                    pos.push(l + k * sl);
                }
            }
        });
    });
    pos
}

/// Splits a row-major position into its multi-index over `shape`.
fn unravel(mut p: usize, shape: &[usize], out: &mut [usize]) {
    for k in (0..shape.len()).rev() {
        out[k] = p % shape[k];
        p /= shape[k];
    }
}

/// `torch.nonzero`: an int64 `[n, ndim]` tensor of the indices of nonzero elements.
pub fn nonzero(x: &Tensor) -> Result<Tensor> {
    let pos = nonzero_positions(x);
    let nd = x.dim();
    let mut data = vec![0usize; pos.len() * nd];
    for (row, &p) in data.chunks_mut(nd.max(1)).zip(&pos) {
        unravel(p, x.shape(), &mut row[..nd]);
    }
    Tensor::from_vec(
        data.into_iter().map(|v| v as i64).collect::<Vec<_>>(),
        &[pos.len(), nd],
    )
}

/// A new `[bases.len()] + x.shape[k..]` tensor whose i-th block is the sub-tensor of `x`'s
/// trailing dims starting at storage offset `x.offset + bases[i]`.
fn take_blocks(x: &Tensor, k: usize, bases: &[usize]) -> Result<Tensor> {
    let mut shape = vec![bases.len()];
    shape.extend_from_slice(&x.shape()[k..]);
    let o = Tensor::alloc(x.dtype(), &shape)?;
    let mut xs = vec![0];
    xs.extend_from_slice(&x.strides()[k..]);
    let counter = one_hot(shape.len(), 0, 1);
    let acc = access::lock(&[x], &[&o]);
    dispatch_bits!(x.dtype().size(), T => {
        let (po, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
        Walk::new(&shape, [o.strides(), &xs, &counter]).par_run(|[bo, bx, bi], len, [so, sx, si]| {
            for j in 0..len {
                let src = bases[bi + j * si] + bx + j * sx;
                // SAFETY: each base is the offset of a valid position of x's leading dims.
                unsafe { *po.get().add(bo + j * so) = *px.get().add(src) };
            }
        });
    });
    drop(acc);
    Ok(o)
}

/// `x[mask]` with a bool (or uint8) mask over the leading dims of `x`: a copy.
pub fn index_mask(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    if !matches!(mask.dtype(), DType::Bool | DType::U8) {
        bail!(
            DType,
            "expected a bool or uint8 mask, but got {}",
            mask.dtype().scalar_name()
        );
    }
    let k = mask.dim();
    if k > x.dim() {
        bail!(
            Index,
            "too many indices for tensor of dimension {}",
            x.dim()
        );
    }
    for i in 0..k {
        if mask.shape()[i] != x.shape()[i] {
            bail!(
                Index,
                "The shape of the mask {:?} at index {i} does not match the shape of the indexed tensor {:?} at index {i}",
                mask.shape(),
                x.shape()
            );
        }
    }
    let mut multi = vec![0; k];
    let bases: Vec<usize> = nonzero_positions(mask)
        .into_iter()
        .map(|p| {
            unravel(p, mask.shape(), &mut multi);
            multi.iter().zip(x.strides()).map(|(i, s)| i * s).sum()
        })
        .collect();
    take_blocks(x, k, &bases)
}

/// `x[idx]` with an integer index tensor along dim 0 (negative indices count from the end).
/// The result has shape `idx.shape + x.shape[1..]` and is a copy.
pub fn index_tensor(x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    match idx.dtype() {
        DType::Bool | DType::U8 => return index_mask(x, idx),
        DType::I64 | DType::I32 => {}
        _ => bail!(
            Index,
            "tensors used as indices must be long, int, byte or bool tensors"
        ),
    }
    if x.dim() == 0 {
        bail!(Index, "too many indices for tensor of dimension 0");
    }
    let size = x.shape()[0] as i64;
    let mut bases = Vec::with_capacity(idx.numel());
    for v in super::copy::to_i64_vec(idx) {
        let w = if v < 0 { v + size } else { v };
        if !(0..size).contains(&w) {
            return Err(out_of_bounds(v, 0, size as usize));
        }
        bases.push(w as usize * x.strides()[0]);
    }
    let flat = take_blocks(x, 1, &bases)?;
    let mut shape = idx.shape().to_vec();
    shape.extend_from_slice(&x.shape()[1..]);
    Ok(flat.with_layout(Layout::contiguous(&shape)))
}

/// `torch.masked_select`: the elements of `x` where the broadcast `mask` is true, as 1-D.
pub fn masked_select(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    if mask.dtype() != DType::Bool {
        bail!(DType, "masked_select: expected BoolTensor for mask");
    }
    let shape = crate::ir::shape::broadcast_shapes(x.shape(), mask.shape())?;
    let xs = x.layout().broadcast_strides(&shape);
    let ms = mask.layout().broadcast_strides(&shape);
    let acc = access::lock(&[x, mask], &[]);
    let pm = acc.read::<bool>(1);
    let walk = Walk::new(&shape, [&xs, &ms]);
    dispatch!(x.dtype(), T => {
        let px = acc.read::<T>(0);
        let mut vals: Vec<T> = Vec::new();
        walk.run_range(0, walk.numel(), &mut |[bx, bm], len, [sx, sm]| {
            for k in 0..len {
                // SAFETY: both walks stay inside their (broadcast) layouts.
                unsafe {
                    if *pm.add(bm + k * sm) {
                        vals.push(*px.add(bx + k * sx));
                    }
                }
            }
        });
        drop(acc);
        let n = vals.len();
        Tensor::from_vec(vals, &[n])
    })
}

/// Total order used by `sort`: NaN above everything (as PyTorch sorts it), ints exact.
#[inline]
fn sort_cmp<T: Element>(a: T, b: T) -> Ordering {
    if T::DTYPE.is_float() {
        let (x, y) = (a.to_f64(), b.to_f64());
        match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            _ => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        }
    } else {
        a.to_i64().cmp(&b.to_i64())
    }
}

/// `sort(dim, descending)`, stable: values and int64 positions along `dim`.
pub fn sort(x: &Tensor, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
    let d = wrap_dim(dim, x.dim())?;
    let vals = Tensor::alloc(x.dtype(), x.shape())?;
    let inds = Tensor::alloc(DType::I64, x.shape())?;
    let n = dim_size(x, d);
    if x.numel() == 0 {
        return Ok((vals, inds));
    }
    // Walk every slice's first element; the slice itself runs along d.
    let mut outer = x.shape().to_vec();
    if let Some(s) = outer.get_mut(d) {
        *s = 1;
    }
    let (xs, os) = (dim_stride(x, d), dim_stride(&vals, d));
    let acc = access::lock(&[x], &[&vals, &inds]);
    let pi = SendPtr(acc.write::<i64>(1));
    dispatch!(x.dtype(), T => {
        let (pv, px) = (SendPtr(acc.write::<T>(0)), SendPtr(acc.read::<T>(0) as *mut T));
        let slices: Vec<[usize; 2]> = {
            let mut v = Vec::new();
            Walk::new(&outer, [x.strides(), vals.strides()]).run_range(
                0,
                crate::ir::shape::numel(&outer),
                &mut |[bx, bo], len, [sx, so]| {
                    v.extend((0..len).map(|k| [bx + k * sx, bo + k * so]));
                },
            );
            v
        };
        let work = |&[bx, bo]: &[usize; 2]| {
            // SAFETY: each slice is read from x's layout and written to its own disjoint
            // positions of the fresh outputs.
            let mut row: Vec<(T, i64)> =
                (0..n).map(|j| (unsafe { *px.get().add(bx + j * xs) }, j as i64)).collect();
            if descending {
                row.sort_by(|a, b| sort_cmp(b.0, a.0));
            } else {
                row.sort_by(|a, b| sort_cmp(a.0, b.0));
            }
            for (j, (v, i)) in row.into_iter().enumerate() {
                // SAFETY: `j < n`: position `bo + j·os` of this slice in the fresh `vals` and
                // `inds`, which hold x's shape; slices start at distinct `bo`, so the parallel
                // slices write disjoint elements.
                unsafe {
                    *pv.get().add(bo + j * os) = v;
                    *pi.get().add(bo + j * os) = i;
                }
            }
        };
        if x.numel() >= crate::tensor::threads::eager_par_min() {
            crate::tensor::threads::par_for(slices.len(), &|i| work(&slices[i]));
        } else {
            slices.iter().for_each(work);
        }
    });
    drop(acc);
    Ok((vals, inds))
}

/// `topk(k, dim, largest, sorted)`: always returned sorted (allowed when `sorted` is false).
pub fn topk(x: &Tensor, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
    let d = wrap_dim(dim, x.dim())?;
    if k > dim_size(x, d) {
        bail!(Index, "selected index k out of range");
    }
    let (v, i) = sort(x, dim, largest)?;
    if x.dim() == 0 {
        return Ok((v, i));
    }
    let cut = |t: &Tensor| -> Result<Tensor> {
        let l = t.layout().narrow(d as i64, 0, k as i64)?;
        super::copy::contiguous(&t.with_layout(l))
    };
    Ok((cut(&v)?, cut(&i)?))
}
