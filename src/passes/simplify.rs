//! Clean-up passes: common-subexpression elimination ([`cse`]) and dead-code elimination
//! ([`dce`]). Both rebuild the graph in topological order, keeping every surviving value's
//! name, so dumps before and after a pass line up.

use crate::Result;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op_key::OpKey;
use std::collections::{HashMap, HashSet};

/// Adds a copy of `src`'s op node `v` to `dst` on the operands `args` (already in `dst`),
/// under the same name (anonymous scalars stay anonymous).
pub(crate) fn copy_op(
    dst: &mut Graph,
    src: &Graph,
    v: ValueId,
    args: &[ValueId],
) -> Result<ValueId> {
    let n = src.node(v);
    let NodeKind::Op(op) = &n.kind else {
        return dst.add_input(&n.name, n.ty.clone());
    };
    if n.is_inline_scalar() {
        dst.add_op(op.clone(), args)
    } else {
        dst.add_op_named(op.clone(), args, &n.name)
    }
}

/// A new graph with `g`'s name and inputs (same names and types), and the map old → new.
pub(crate) fn start_copy(g: &Graph) -> Result<(Graph, HashMap<ValueId, ValueId>)> {
    let mut out = Graph::new(&g.name);
    let mut map = HashMap::new();
    for &v in g.inputs() {
        let n = g.node(v);
        map.insert(v, out.add_input(&n.name, n.ty.clone())?);
    }
    Ok((out, map))
}

/// Merges structurally equal op nodes: same op and attributes ([`OpKey`]: floats by their
/// bits, so `mul(x, 0.0)` and `mul(x, -0.0)` stay apart; constants by their bytes), same
/// operands in order, same type. Inputs are never merged. The first node in topological
/// order survives, under its name.
pub fn cse(g: &Graph) -> Result<Graph> {
    let (mut out, mut map) = start_copy(g)?;
    // key → candidates (new ids) with that key, which differ in type
    let mut seen: HashMap<(OpKey, Vec<ValueId>, bool), Vec<ValueId>> = HashMap::new();
    for v in g.topo_order() {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else { continue };
        let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
        let key = (OpKey(op), args.clone(), n.is_inline_scalar());
        let found = seen
            .get(&key)
            .and_then(|cands| cands.iter().copied().find(|&c| out.node(c).ty == n.ty));
        let nv = match found {
            Some(c) => c,
            None => {
                let nv = copy_op(&mut out, g, v, &args)?;
                seen.entry(key).or_default().push(nv);
                nv
            }
        };
        map.insert(v, nv);
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(out)
}

/// The values an output depends on (outputs included).
pub(crate) fn live_values(g: &Graph) -> HashSet<ValueId> {
    let mut live = HashSet::new();
    let mut stack: Vec<ValueId> = g.outputs().to_vec();
    while let Some(v) = stack.pop() {
        if live.insert(v) {
            stack.extend(g.operands(v));
        }
    }
    live
}

/// Removes op nodes whose value reaches no output. Inputs are kept even when unused: they
/// are the graph's signature.
pub fn dce(g: &Graph) -> Result<Graph> {
    let live = live_values(g);
    let (mut out, mut map) = start_copy(g)?;
    for v in g.topo_order() {
        if g.node(v).op().is_none() || !live.contains(&v) {
            continue;
        }
        let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
        map.insert(v, copy_op(&mut out, g, v, &args)?);
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::{DType, Scalar};
    use crate::ir::op::{BinaryOp, Op, TensorType, UnaryOp};

    fn x_graph() -> (Graph, ValueId) {
        let mut g = Graph::new("t");
        let x = g
            .add_input("x", TensorType::new(DType::F32, vec![3]))
            .unwrap();
        (g, x)
    }

    #[test]
    fn cse_merges_equal_ops_and_keeps_signed_zeros_apart() {
        let (mut g, x) = x_graph();
        let a = g.add_op(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let b = g.add_op(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let z = g.add_scalar(Scalar::Float(0.0)).unwrap();
        let nz = g.add_scalar(Scalar::Float(-0.0)).unwrap();
        let p = g.add_op(Op::Binary(BinaryOp::Mul), &[a, z]).unwrap();
        let q = g.add_op(Op::Binary(BinaryOp::Mul), &[b, nz]).unwrap();
        g.set_outputs(vec![p, q]);
        let c = cse(&g).unwrap();
        c.verify().unwrap();
        // one exp, two scalars, two muls, one input
        assert_eq!(c.len(), 6);
        assert_ne!(c.outputs()[0], c.outputs()[1]);
    }

    #[test]
    fn dce_keeps_unused_inputs() {
        let (mut g, x) = x_graph();
        g.add_input("unused", TensorType::new(DType::I64, vec![2]))
            .unwrap();
        let dead = g.add_op(Op::Unary(UnaryOp::Sin), &[x]).unwrap();
        let _ = g.add_op(Op::Unary(UnaryOp::Cos), &[dead]).unwrap();
        let y = g.add_op(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let d = dce(&g).unwrap();
        d.verify().unwrap();
        assert_eq!(d.inputs().len(), 2);
        assert_eq!(d.len(), 3);
        assert!(d.value("unused").is_some());
    }
}
