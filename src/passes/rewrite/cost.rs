//! The extraction cost: memory traffic and kernel boundaries, not node counts.
//!
//! Units are bytes of memory traffic; arithmetic is priced in the same units.
//! - Materialising ops (matmul, reductions, normalisations, indexing, `contiguous`, cat,
//!   constants, ...) end a kernel: they cost the bytes of every operand they read plus the
//!   bytes of the result they write.
//! - Pointwise ops fuse into their neighbours' kernels, so they cost only their arithmetic:
//!   a few units per output element (1 for add/mul/compare/select/cast, 3 for NaN-propagating
//!   max/min such as relu and clamp, which need a compare, a max and a blend, 4 for divisions
//!   and square roots, 10 for transcendental functions).
//! - `full` and `arange` are generated inside the kernel that reads them: 1 unit per element.
//! - Views and inputs only touch metadata: a flat unit each. `view` costs more than `reshape`
//!   so that extraction always picks `reshape` (which cannot fail on a changed layout).
//! - Every node costs at least one unit on top of its operands, so the cost strictly grows
//!   along every path and extraction never picks a cycle.
//!
//! Costs add over the extracted term as a tree (a shared operand counts once per use), the
//! standard greedy approximation; the extracted graph itself keeps sharing.

use super::lang::{EG, ENode, Head};
use crate::ir::op::{BinaryOp, Op, TensorType, UnaryOp};
use egg::{CostFunction, Id};

/// The memory-traffic cost function over an e-graph's types.
pub struct TrafficCost<'a> {
    pub egraph: &'a EG,
}

fn bytes(t: &TensorType) -> f64 {
    (t.numel() * t.dtype.size()) as f64
}

fn unary_weight(u: UnaryOp) -> f64 {
    use UnaryOp::*;
    match u {
        Neg | Abs | Floor | Ceil | Round | Sign | Square | LogicalNot | IsNan => 1.0,
        Relu => 3.0,
        Sqrt | Rsqrt | Reciprocal => 4.0,
        _ => 10.0,
    }
}

fn binary_weight(b: BinaryOp) -> f64 {
    use BinaryOp::*;
    match b {
        Maximum | Minimum => 3.0,
        Div => 4.0,
        Pow | Remainder => 10.0,
        _ => 1.0,
    }
}

/// Cost of one node, operands excluded.
pub fn node_cost(op: &Op, inputs: &[&TensorType], out: &TensorType) -> f64 {
    let elems = out.numel() as f64;
    let own = match op {
        Op::Scalar(_) => 0.0,
        Op::Unary(u) => elems * unary_weight(*u),
        Op::Binary(b) => elems * binary_weight(*b),
        Op::Where | Op::To { .. } | Op::MaskedFill { .. } => elems,
        // generated in the kernel that uses them, like a broadcast constant
        Op::Full { .. } | Op::Arange { .. } => elems,
        Op::Clamp { .. } => elems * 3.0,
        Op::View { .. } => 2.0,
        _ if op.is_view() || matches!(op, Op::Reshape { .. } | Op::Flatten { .. }) => 0.0,
        _ => inputs.iter().map(|t| bytes(t)).sum::<f64>() + bytes(out),
    };
    1.0 + own
}

impl CostFunction<ENode> for TrafficCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &ENode, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let below: f64 = enode.children.iter().map(|&c| costs(c)).sum();
        let own = match &enode.head {
            Head::Input(_) => 1.0,
            Head::Op(k) => {
                let tys: Option<Vec<&TensorType>> = enode
                    .children
                    .iter()
                    .map(|&c| self.egraph[c].data.as_ref())
                    .collect();
                match tys.and_then(|t| k.op().infer(&t).ok().map(|o| (t, o))) {
                    Some((t, out)) => node_cost(k.op(), &t, &out),
                    None => f64::INFINITY,
                }
            }
        };
        own + below
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::DType;

    #[test]
    fn copies_cost_their_traffic_and_views_cost_a_unit() {
        let t = TensorType::new(DType::F32, vec![8, 16]);
        let copy = node_cost(&Op::Contiguous, &[&t], &t);
        assert_eq!(copy, 1.0 + 2.0 * 512.0);
        assert_eq!(node_cost(&Op::T, &[&t], &t), 1.0);
        let relu = node_cost(&Op::Unary(UnaryOp::Relu), &[&t], &t);
        let mul = node_cost(&Op::Binary(BinaryOp::Mul), &[&t, &t], &t);
        let sel = node_cost(&Op::Where, &[&t, &t, &t], &t);
        assert!(
            relu + mul > sel + 2.0 * mul,
            "relu·c must cost more than its where form"
        );
        assert!(
            node_cost(&Op::View { shape: vec![128] }, &[&t], &t)
                > node_cost(&Op::Reshape { shape: vec![128] }, &[&t], &t)
        );
    }
}
