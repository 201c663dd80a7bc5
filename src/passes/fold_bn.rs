//! Folds an evaluation-mode `batch_norm` into the convolution that feeds it, when the
//! weights and statistics are constants (a model traced for inference):
//!
//! `batch_norm(conv(x, W, b), mean, var, gamma, beta)` = `conv(x, W·s, (b - mean)·s + beta)`
//! with `s = gamma / sqrt(var + eps)` per output channel,
//!
//! so the normalisation costs nothing at run time: no kernel, no pass over memory. The new
//! weights are computed in f64 and rounded once to the weights' dtype.

use super::simplify::{copy_op, start_copy};
use crate::Result;
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{Literal, Op};
use crate::runtime::tensor::{Tensor, apply};
use std::collections::HashMap;

/// The f64 values of a constant node.
fn constant(g: &Graph, v: ValueId) -> Option<Vec<f64>> {
    match g.node(v).op() {
        Some(op @ Op::Constant(_)) => apply(op.clone(), &[]).ok().map(|t| t.to_f64_vec()),
        _ => None,
    }
}

/// `values` as a literal of `dtype` and `shape`.
fn literal(values: Vec<f64>, shape: &[usize], dtype: DType) -> Result<Literal> {
    crate::runtime::literal(&Tensor::from_vec(values, shape)?.to_dtype(dtype)?)
}

/// The folded convolution for batch norm `v`, or `None` when the pattern does not apply.
fn folded(g: &Graph, v: ValueId) -> Result<Option<(Op, Literal, Literal)>> {
    let Some(Op::BatchNorm(bn)) = g.node(v).op() else {
        return Ok(None);
    };
    let ops = g.operands(v);
    let conv = ops[0];
    let Some(Op::Conv {
        conv: attrs,
        has_bias,
    }) = g.node(conv).op()
    else {
        return Ok(None);
    };
    if bn.training || !bn.has_running || g.users(conv).len() != 1 || g.outputs().contains(&conv) {
        return Ok(None);
    }
    let cops = g.operands(conv);
    let w_ty = &g.node(cops[1]).ty;
    let Some(w) = constant(g, cops[1]) else {
        return Ok(None);
    };
    let cout = w_ty.shape[0];
    let b = match has_bias {
        true => match constant(g, cops[2]) {
            Some(b) => b,
            None => return Ok(None),
        },
        false => vec![0.0; cout],
    };
    let [rm, rv, gw, gb] = bn.positions();
    let stat = |p: Option<usize>, default: f64| match p {
        Some(i) => constant(g, ops[i]),
        None => Some(vec![default; cout]),
    };
    let (Some(mean), Some(var), Some(gamma), Some(beta)) =
        (stat(rm, 0.0), stat(rv, 1.0), stat(gw, 1.0), stat(gb, 0.0))
    else {
        return Ok(None);
    };
    let scale: Vec<f64> = (0..cout)
        .map(|o| gamma[o] / (var[o] + bn.eps.get()).sqrt())
        .collect();
    let per = w.len() / cout.max(1);
    let w2: Vec<f64> = w
        .iter()
        .enumerate()
        .map(|(i, x)| x * scale[i / per])
        .collect();
    let b2: Vec<f64> = (0..cout)
        .map(|o| (b[o] - mean[o]) * scale[o] + beta[o])
        .collect();
    let op = Op::Conv {
        conv: attrs.clone(),
        has_bias: true,
    };
    Ok(Some((
        op,
        literal(w2, &w_ty.shape, w_ty.dtype)?,
        literal(b2, &[cout], w_ty.dtype)?,
    )))
}

/// Rewrites every foldable `conv → batch_norm` pair; the convolutions it replaces are left
/// for dead-code elimination.
pub fn fold_batch_norm(g: &Graph) -> Result<Graph> {
    let (mut out, mut map): (Graph, HashMap<ValueId, ValueId>) = start_copy(g)?;
    for v in g.topo_order() {
        if g.node(v).op().is_none() {
            continue;
        }
        let name = g.node(v).name.clone();
        let nv = match folded(g, v)? {
            Some((op, w, b)) => {
                let x = map[&g.operands(g.operands(v)[0])[0]];
                let w = out.add_op_named(Op::Constant(w), &[], &format!("{name}.weight"))?;
                let b = out.add_op_named(Op::Constant(b), &[], &format!("{name}.bias"))?;
                out.add_op_named(op, &[x, w, b], &name)?
            }
            None => {
                let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
                copy_op(&mut out, g, v, &args)?
            }
        };
        map.insert(v, nv);
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(out)
}
