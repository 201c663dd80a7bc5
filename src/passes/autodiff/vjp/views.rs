//! The gradients of the ops that rearrange elements: `repeat`, `cat` and `diagonal`.

use super::Grads;
use crate::Result;
use crate::ir::dtype::Scalar;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op};
use crate::ir::shape::wrap_dim;
use crate::passes::autodiff::graph_builder::Emit;

pub(super) fn repeat(e: &mut Emit, repeats: &[usize], x: ValueId, g: ValueId) -> Result<Grads> {
    // Split each dim of the result into (repeat, size) and sum over the repeat axes.
    let xs = e.shape(x);
    let lead = repeats.len() - xs.len();
    let mut split = Vec::new();
    let mut sum_axes = Vec::new();
    for (i, &r) in repeats.iter().enumerate() {
        sum_axes.push(split.len());
        split.push(r);
        if i >= lead {
            split.push(xs[i - lead]);
        }
    }
    let r = e.reshape(g, &split)?;
    let s = if sum_axes.is_empty() {
        r
    } else {
        e.sum_dims(r, &sum_axes, false)?
    };
    Ok(vec![Some(e.reshape(s, &xs)?)])
}

pub(super) fn cat(e: &mut Emit, xs: &[ValueId], g: ValueId, dim: i64) -> Result<Grads> {
    let legacy_empty = |e: &Emit, v: ValueId| {
        let s = e.shape(v);
        s.len() == 1 && s[0] == 0
    };
    let Some(first) = xs.iter().find(|&&v| !legacy_empty(e, v)) else {
        return Ok(vec![None; xs.len()]);
    };
    let d = wrap_dim(dim, e.ty(*first).ndim())?;
    let mut offset = 0usize;
    let mut out = Vec::with_capacity(xs.len());
    for &v in xs {
        if legacy_empty(e, v) {
            out.push(None);
            continue;
        }
        let len = e.shape(v)[d];
        out.push(Some(e.op(
            Op::Narrow {
                dim: d as i64,
                start: offset as i64,
                length: len as i64,
            },
            &[g],
        )?));
        offset += len;
    }
    Ok(out)
}

/// The diagonal's gradient laid back on the (dim1, dim2) plane: the gradient padded to the
/// rows, broadcast along the columns and masked to the cells with `col - row == offset`.
pub(super) fn diagonal(
    e: &mut Emit,
    x: ValueId,
    g: ValueId,
    offset: i64,
    dim1: i64,
    dim2: i64,
) -> Result<Grads> {
    let shape = e.shape(x);
    let n = shape.len();
    let (a, b) = (wrap_dim(dim1, n)?, wrap_dim(dim2, n)?);
    let (rows, cols) = (shape[a], shape[b]);
    let gl = e.shape(g);
    let last = gl.len() - 1;
    if gl[last] == 0 {
        // an empty diagonal (an offset past the plane) passes nothing back
        return Ok(vec![None]);
    }
    // Diagonal element k sits at row k + max(-offset, 0).
    let row0 = (-offset).max(0) as usize;
    let mut padded_shape = gl.clone();
    padded_shape[last] = rows;
    let padded = e.place_slice(g, &padded_shape, last, row0, 1)?;
    let col = e.unsqueeze(padded, -1)?;
    let mut plane = padded_shape.clone();
    plane.push(cols);
    let wide = e.expand(col, &plane)?;
    let arange = |e: &mut Emit, len: usize| {
        e.op(
            Op::Arange {
                start: Scalar::Int(0),
                end: Scalar::Int(len as i64),
                step: Scalar::Int(1),
                dtype: Some(crate::DType::I64),
            },
            &[],
        )
    };
    let r = arange(e, rows)?;
    let c = arange(e, cols)?;
    let ru = e.unsqueeze(r, 1)?;
    let diff = e.sub(c, ru)?;
    let off = e.g.add_scalar(Scalar::Int(offset))?;
    let on = e.bin(BinaryOp::Eq, diff, off)?;
    let masked = e.keep_where(on, wide)?;
    // Dims are now (the others in order, a, b): move them back to x's order.
    let others: Vec<usize> = (0..n).filter(|&i| i != a && i != b).collect();
    let mut order = others.clone();
    order.push(a);
    order.push(b);
    let mut inv = vec![0i64; n];
    for (pos, &d) in order.iter().enumerate() {
        inv[d] = pos as i64;
    }
    Ok(vec![Some(e.op(Op::Permute { dims: inv }, &[masked])?)])
}
