//! The gradients of the reductions: sums, means, products, extrema, `var` and `std`.

use super::Grads;
use crate::Result;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::ir::shape::reduction_dims;
use crate::passes::autodiff::graph_builder::Emit;

pub(super) fn reduce(
    e: &mut Emit,
    op: ReduceOp,
    dim: &Option<Vec<i64>>,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<Grads> {
    let shape = e.shape(x);
    let dims = reduction_dims(dim, shape.len())?;
    let count: usize = dims.iter().map(|&d| shape[d]).product();
    let gx = match op {
        ReduceOp::Sum => e.unreduce(g, &shape, &dims)?,
        ReduceOp::Mean => {
            let u = e.unreduce(g, &shape, &dims)?;
            e.mul_s(u, 1.0 / count as f64)?
        }
        ReduceOp::Prod => {
            // Product of the other elements, exact when the slice holds zeros: with one
            // zero only that element gets the product of the rest, with more none does.
            let dt = e.dtype(x);
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let zero = e.bin_s(BinaryOp::Eq, x, 0.0)?;
            let one = e.scalar(1.0)?;
            let nz = e.op(Op::Where, &[zero, one, x])?;
            let pnz = e.reduce(ReduceOp::Prod, nz, &dims, true)?;
            let zm = e.mask(zero, dt)?;
            let cnt = e.sum_dims(zm, &dims, true)?;
            let single = e.bin_s(BinaryOp::Eq, cnt, 1.0)?;
            let at_zero = e.keep_where(single, pnz)?;
            let others = e.div(yk, x)?;
            let w = e.op(Op::Where, &[zero, at_zero, others])?;
            e.mul(gk, w)?
        }
        ReduceOp::Amax | ReduceOp::Amin => {
            // Ties share the gradient evenly.
            let dt = e.dtype(x);
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let hit = e.bin(BinaryOp::Eq, x, yk)?;
            let m = e.mask(hit, dt)?;
            let cnt = e.sum_dims(m, &dims, true)?;
            let w = e.div(m, cnt)?;
            e.mul(gk, w)?
        }
        ReduceOp::LogSumExp => {
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let d = e.sub(x, yk)?;
            let p = e.unary(UnaryOp::Exp, d)?;
            e.mul(gk, p)?
        }
        ReduceOp::All | ReduceOp::Any => return Ok(vec![None]),
    };
    Ok(vec![Some(gx)])
}

pub(super) fn var_std(
    e: &mut Emit,
    std: bool,
    dim: &Option<Vec<i64>>,
    correction: f64,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<Grads> {
    let shape = e.shape(x);
    let dims = reduction_dims(dim, shape.len())?;
    let n: usize = dims.iter().map(|&d| shape[d]).product();
    let denom = (n as f64 - correction).max(0.0);
    let gk = e.keep(g, &shape, &dims)?;
    let mean = e.reduce(ReduceOp::Mean, x, &dims, true)?;
    let xc = e.sub(x, mean)?;
    let gx = if std {
        // d std = (x - mean) / (denom · std)
        let yk = e.keep(y, &shape, &dims)?;
        let d = e.mul_s(yk, denom)?;
        let q = e.div(xc, d)?;
        e.mul(gk, q)?
    } else {
        let q = e.mul_s(xc, 2.0 / denom)?;
        e.mul(gk, q)?
    };
    Ok(vec![Some(gx)])
}
