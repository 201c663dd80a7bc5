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
use crate::ir::unary::Cost;
use egg::{CostFunction, Id};
use std::collections::{HashMap, HashSet, VecDeque};

/// The memory-traffic cost function over an e-graph's types.
pub struct TrafficCost<'a> {
    /// The e-graph whose class types give the nodes' sizes.
    pub egraph: &'a EG,
}

fn bytes(t: &TensorType) -> f64 {
    (t.numel() * t.dtype.size()) as f64
}

fn unary_weight(u: UnaryOp) -> f64 {
    match u.cost() {
        Cost::Trivial => 1.0,
        Cost::Select => 3.0,
        Cost::Divide => 4.0,
        Cost::Transcendental => 10.0,
    }
}

fn binary_weight(b: BinaryOp) -> f64 {
    use BinaryOp::*;
    match b {
        Maximum | Minimum => 3.0,
        Div => 4.0,
        Pow | Remainder | DivFloor => 10.0,
        DivTrunc => 5.0,
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

impl TrafficCost<'_> {
    /// The cost of `enode` itself, operands excluded (infinite where its types do not check).
    fn own(&self, enode: &ENode) -> f64 {
        match &enode.head {
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
        }
    }
}

impl CostFunction<ENode> for TrafficCost<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &ENode, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let below: f64 = enode.children.iter().map(|&c| costs(c)).sum();
        self.own(enode) + below
    }
}

/// The cheapest node of every e-class under [`TrafficCost`] (tree costs, as egg's
/// `Extractor`), found with a worklist: a class is costed again only when one of its
/// children got cheaper. egg's extractor sweeps every class until nothing changes, which on
/// a chain of n ops takes up to n sweeps, each inferring every node's type again: seconds
/// for a few thousand ops. Here each node's own cost is computed once.
pub struct Cheapest {
    best: HashMap<Id, (f64, usize)>,
}

impl Cheapest {
    /// Finds the cheapest node of every class of `eg`.
    pub fn new(eg: &EG) -> Cheapest {
        let cost = TrafficCost { egraph: eg };
        let mut own: HashMap<Id, Vec<f64>> = HashMap::new();
        let mut best: HashMap<Id, (f64, usize)> = HashMap::new();
        let mut queue: VecDeque<Id> = eg.classes().map(|c| c.id).collect();
        let mut queued: HashSet<Id> = queue.iter().copied().collect();
        while let Some(c) = queue.pop_front() {
            queued.remove(&c);
            let class = &eg[c];
            let own = own
                .entry(c)
                .or_insert_with(|| class.nodes.iter().map(|n| cost.own(n)).collect());
            // the first node of least cost among those whose children all have a cost
            let mut pick: Option<(f64, usize)> = None;
            for (i, n) in class.nodes.iter().enumerate() {
                let below: Option<f64> = n
                    .children
                    .iter()
                    .map(|&ch| best.get(&eg.find(ch)).map(|b| b.0))
                    .sum();
                if let Some(below) = below {
                    let total = own[i] + below;
                    if pick.is_none_or(|(p, _)| total < p) {
                        pick = Some((total, i));
                    }
                }
            }
            let Some((total, i)) = pick else { continue };
            if best.get(&c).is_none_or(|&(b, _)| total < b) {
                best.insert(c, (total, i));
                for p in class.parents() {
                    let p = eg.find(p);
                    if queued.insert(p) {
                        queue.push_back(p);
                    }
                }
            }
        }
        Cheapest { best }
    }

    /// The tree cost of class `c`'s cheapest term.
    pub fn cost(&self, eg: &EG, c: Id) -> Option<f64> {
        self.best.get(&eg.find(c)).map(|b| b.0)
    }

    /// The cheapest node of class `c`; `None` for a class no finite term reaches.
    pub fn node<'a>(&self, eg: &'a EG, c: Id) -> Option<&'a ENode> {
        let c = eg.find(c);
        self.best.get(&c).and_then(|&(_, i)| eg[c].nodes.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::DType;

    /// The worklist finds the least cost egg's sweeping `Extractor` finds, for every class of
    /// saturated e-graphs (with the cycles `x*1 = x` makes), and its chosen nodes add up to
    /// that cost.
    #[test]
    fn cheapest_agrees_with_eggs_extractor() {
        let models = [
            "graph a(%x: f32[4,8], %b: f32[8]) {\n %r = relu(%x)\n %h = mul(%r, 0.5)\n %y = add(%h, %b)\n return %y\n}\n",
            "graph b(%x: f32[4,8]) {\n %o = mul(%x, 1.0)\n %z = add(%o, 0.0)\n %n = neg(%z)\n %m = neg(%n)\n %t = t(%m)\n %u = t(%t)\n %s = sum(%u, dim=[1])\n return %s, %u\n}\n",
            "graph c(%x: f32[4,8], %w: f32[8,3]) {\n %m = matmul(%x, %w)\n %e = exp(%m)\n %s = sum(%e, dim=[1], keepdim=true)\n %d = div(%e, %s)\n %c = contiguous(%d)\n %r = reshape(%c, shape=[12])\n return %r\n}\n",
        ];
        for text in models {
            let g = crate::ir::parse_module(text, "m").unwrap().graphs[0].clone();
            for fast in [false, true] {
                let (eg, roots, _) = super::super::convert::to_egraph(&g).unwrap();
                let rules = super::super::rules::rules(fast).unwrap();
                let runner: egg::Runner<ENode, super::super::lang::Types> =
                    egg::Runner::new(Default::default())
                        .with_egraph(eg)
                        .with_iter_limit(8)
                        .run(&rules);
                let eg = runner.egraph;
                let ours = Cheapest::new(&eg);
                let egg_x = egg::Extractor::new(&eg, TrafficCost { egraph: &eg });
                for class in eg.classes() {
                    let want = egg_x.find_best_cost(class.id);
                    let got = ours.cost(&eg, class.id).unwrap();
                    assert_eq!(got, want, "{}: class {}", g.name, class.id);
                    // the chosen node's own cost plus its children's is the class's cost
                    let n = ours.node(&eg, class.id).unwrap();
                    let mut tc = TrafficCost { egraph: &eg };
                    let sum = tc.cost(n, |c| ours.cost(&eg, c).unwrap());
                    assert_eq!(sum, got, "{}: class {}", g.name, class.id);
                }
                assert!(roots.iter().all(|&r| ours.node(&eg, r).is_some()));
            }
        }
    }

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
