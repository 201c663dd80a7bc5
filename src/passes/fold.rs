//! Constant folding: a value computed only from leaves that need no input (`constant`,
//! Python scalars, `full`, `arange`) is evaluated once, on the eager kernels the reference
//! interpreter runs, and replaced by a captured `constant`.
//!
//! Limits: no value larger than [`FoldOptions::max_bytes`] is ever materialised, neither the
//! folded value nor any intermediate of its computation, so `expand(full(...))` to a huge shape
//! stays a broadcast the fuser computes inline. Leaves themselves are not replaced (a `full`
//! is cheaper to compute where used than to load). Random draws never appear as ops: tracing
//! captures their results as constants, so nothing random is re-evaluated here.
//!
//! A sum, mean, amax or amin over a value too large to materialise whose elements all equal
//! one number (a `full`, its views and casts, and pointwise ops of such values) becomes a
//! `full` of its closed form: `c·n`, `c`, `c`, `c`. `sum(full([10⁶,10⁶], 1.0))` would
//! otherwise compile to a kernel of 10¹² additions.

use super::simplify::{copy_op, start_copy};
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{Op, ReduceOp};
use crate::ir::shape::reduction_dims;
use crate::runtime::literal;
use crate::runtime::tensor::{Tensor, apply};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};

/// Limits of constant folding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldOptions {
    /// Largest value, in bytes, that folding may materialise.
    pub max_bytes: usize,
}

impl Default for FoldOptions {
    fn default() -> FoldOptions {
        FoldOptions { max_bytes: 1 << 16 }
    }
}

/// `g` with each input named in `values` replaced by a constant holding that value: a
/// model's weights captured in its code (an ahead-of-time object keeps them in a read-only
/// data section). The other inputs keep their order; a value whose name is no input, or
/// whose dtype or shape differs from the input's, is an error.
pub fn bind_inputs(g: &Graph, values: &[(String, Tensor)]) -> Result<Graph> {
    let mut out = Graph::new(&g.name);
    out.avoid_names_of(g);
    let mut map = HashMap::new();
    for (name, t) in values {
        let found = g.inputs().iter().find(|&&v| g.node(v).name == *name);
        let Some(&v) = found else {
            return Err(Error::Value(format!(
                "'{name}' is no input of graph {}",
                g.name
            )));
        };
        let ty = &g.node(v).ty;
        if t.dtype() != ty.dtype || t.shape() != ty.shape.as_slice() {
            return Err(Error::Shape(format!(
                "'{name}' is {}{:?} in graph {}, and {}{:?} in the values bound",
                ty.dtype,
                ty.shape,
                g.name,
                t.dtype(),
                t.shape()
            )));
        }
    }
    for &v in g.inputs() {
        let n = g.node(v);
        let nv = match values.iter().find(|(name, _)| *name == n.name) {
            Some((_, t)) => out.add_op_named(Op::Constant(literal(t)?), &[], &n.name)?,
            None => out.add_input(&n.name, n.ty.clone())?,
        };
        map.insert(v, nv);
    }
    for v in g.topo_order() {
        if matches!(g.node(v).kind, NodeKind::Op(_)) {
            let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
            map.insert(v, copy_op(&mut out, g, v, &args)?);
        }
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(out)
}

/// Folds with the default limits.
pub fn fold(g: &Graph) -> Result<Graph> {
    fold_with(g, &FoldOptions::default())
}

/// Replaces every value that depends on no input (and fits the limit) by a `constant`, at the
/// frontier where such values meet the rest of the graph or the outputs. The nodes it
/// replaces are left for [`super::dce`].
pub fn fold_with(g: &Graph, opts: &FoldOptions) -> Result<Graph> {
    // folded values are the interpreter's: the reference formulas
    let _reference = crate::runtime::native::ReferenceMode::enter();
    let order = g.topo_order();
    let mut evaluable: HashSet<ValueId> = HashSet::new();
    for &v in &order {
        let n = g.node(v);
        // control ops are simplified by `passes::control` (their results are not one value);
        // collectives need the other ranks
        let control = matches!(n.op(), Some(Op::Control(_) | Op::Result { .. }))
            || n.op().is_some_and(Op::communicates);
        if n.op().is_none()
            || control
            || n.ty.numel().saturating_mul(n.ty.dtype.size()) > opts.max_bytes
        {
            continue;
        }
        if g.operands(v).iter().all(|o| evaluable.contains(o)) {
            evaluable.insert(v);
        }
    }
    let outputs: HashSet<ValueId> = g.outputs().iter().copied().collect();
    let fold_here = |v: ValueId| {
        let n = g.node(v);
        evaluable.contains(&v)
            && !g.operands(v).is_empty()
            // a wrapped number ranks lower in promotion than a 0-d tensor: keep it as it is
            && !n.ty.wrapped
            && (outputs.contains(&v) || g.users(v).iter().any(|u| !evaluable.contains(u)))
    };
    // the input-free values the folded ones are computed from
    let mut needed: HashSet<ValueId> = HashSet::new();
    let mut stack: Vec<ValueId> = order.iter().copied().filter(|&v| fold_here(v)).collect();
    while let Some(v) = stack.pop() {
        if needed.insert(v) {
            stack.extend(g.operands(v));
        }
    }
    let (mut out, mut map) = start_copy(g)?;
    let mut values: HashMap<ValueId, Tensor> = HashMap::new();
    // values whose elements are all equal: one element, in a tensor of the value's rank and
    // dtype
    let mut uniform: HashMap<ValueId, Tensor> = HashMap::new();
    for &v in &order {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else { continue };
        if needed.contains(&v) {
            // operands come first in topological order, so their values are there
            let args = g
                .operands(v)
                .iter()
                .map(|o| values.get(o).cloned())
                .collect::<Option<Vec<Tensor>>>()
                .ok_or_else(|| Error::Value(format!("fold: %{} has no value", n.name)))?;
            let refs: Vec<&Tensor> = args.iter().collect();
            values.insert(v, apply(op.clone(), &refs)?);
        }
        if let Some(u) = uniform_element(g, v, &uniform) {
            uniform.insert(v, u);
        }
        let large = |x: &ValueId| !evaluable.contains(x);
        if g.operands(v).first().is_some_and(large)
            && let Some(full) = reduce_uniform(g, v, &uniform)?
        {
            // a full of the reduction's own shape and dtype
            map.insert(v, out.add_op_named(full, &[], &n.name)?);
            continue;
        }
        if fold_here(v) {
            let t = values
                .get(&v)
                .ok_or_else(|| Error::Value(format!("fold: %{} has no value", n.name)))?;
            let lit = literal(t)?;
            map.insert(v, out.add_op_named(Op::Constant(lit), &[], &n.name)?);
        } else {
            let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
            map.insert(v, copy_op(&mut out, g, v, &args)?);
        }
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(out)
}

/// The one element of `v`, as a tensor of `v`'s rank with every size 1, when all of `v`'s
/// elements are equal by construction: a `full`, a view, reshape or copy of such a value, or
/// a pointwise op whose operands are such values or Python scalars (evaluated on the small
/// stand-ins, so promotion and rounding are the op's own).
fn uniform_element(g: &Graph, v: ValueId, uniform: &HashMap<ValueId, Tensor>) -> Option<Tensor> {
    let n = g.node(v);
    let op = n.op()?;
    let ones = vec![1usize; n.ty.shape.len()];
    let t = match op {
        Op::Full {
            fill_value, dtype, ..
        } => apply(
            Op::Full {
                size: ones,
                fill_value: *fill_value,
                dtype: *dtype,
            },
            &[],
        )
        .ok()?,
        _ if op.keeps_elements() => {
            let u = uniform.get(g.operands(v).first()?)?;
            u.reshape(&ones.iter().map(|&d| d as i64).collect::<Vec<_>>())
                .ok()?
        }
        _ if op.is_pointwise() => {
            let mut args = Vec::new();
            for o in g.operands(v) {
                match (uniform.get(&o), g.node(o).op()) {
                    (Some(u), _) => args.push(u.clone()),
                    (None, Some(leaf @ Op::Scalar(_))) => args.push(apply(leaf.clone(), &[]).ok()?),
                    _ => return None,
                }
            }
            let refs: Vec<&Tensor> = args.iter().collect();
            apply(op.clone(), &refs).ok()?
        }
        _ => return None,
    };
    (t.dtype() == n.ty.dtype && t.numel() == 1).then_some(t)
}

/// A `full` equal to the reduction `v` when it sums, averages or takes the extreme of a
/// uniform value: `c·n`, `c`, `c` (never over an empty range, where amax and amin fail and
/// the mean is NaN).
fn reduce_uniform(g: &Graph, v: ValueId, uniform: &HashMap<ValueId, Tensor>) -> Result<Option<Op>> {
    let n = g.node(v);
    let Some(Op::Reduce { op, dim, .. }) = n.op() else {
        return Ok(None);
    };
    let Some(x) = g.operands(v).first().copied() else {
        return Ok(None);
    };
    let Some(u) = uniform.get(&x) else {
        return Ok(None);
    };
    let shape = &g.node(x).ty.shape;
    let count: usize = reduction_dims(dim, shape.len())?
        .iter()
        .map(|&d| shape[d])
        .product();
    if count == 0 {
        return Ok(None);
    }
    let dtype = n.ty.dtype;
    let int = || u.to_dtype(DType::I64)?.item::<i64>();
    let fill_value = match op {
        // `+ 0.0`: a sum starts from +0, so a sum of -0s is +0
        ReduceOp::Sum if dtype.is_float() => Scalar::Float(u.item_f64()? * count as f64 + 0.0),
        ReduceOp::Sum => Scalar::Int(int()?.wrapping_mul(count as i64)),
        ReduceOp::Mean | ReduceOp::Amax | ReduceOp::Amin if u.dtype().is_float() => {
            Scalar::Float(u.item_f64()?)
        }
        ReduceOp::Amax | ReduceOp::Amin => Scalar::Int(int()?),
        _ => return Ok(None),
    };
    Ok(Some(Op::Full {
        size: n.ty.shape.clone(),
        fill_value,
        dtype: Some(dtype),
    }))
}
