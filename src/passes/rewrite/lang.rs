//! The e-graph language: one node kind per IR `Op` value (attributes included), plus graph
//! inputs. Every e-class carries its `TensorType`, computed by `Op::infer`, so the language
//! needs no list of ops of its own.

use crate::ir::op::{Op, TensorType};
use crate::ir::op_key::OpKey;
use egg::{Analysis, DidMerge, EGraph, Id, Language};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// An `Op` as an e-node head: equal, ordered and hashed as its [`OpKey`] (every attribute,
/// floats by their bits, constants by dtype, shape and bytes). The hash is computed once, so
/// a large constant's bytes are not hashed again at every e-graph lookup; `DefaultHasher::new`
/// has fixed keys, so hashes (and so e-graph order) are repeatable.
#[derive(Clone)]
pub struct HeadOp {
    op: Arc<Op>,
    hash: u64,
}

impl HeadOp {
    /// Wraps `op`, hashing it once.
    pub fn new(op: Op) -> HeadOp {
        let mut h = DefaultHasher::new();
        OpKey(&op).hash(&mut h);
        HeadOp {
            op: Arc::new(op),
            hash: h.finish(),
        }
    }

    /// The wrapped op.
    pub fn op(&self) -> &Op {
        &self.op
    }
}

impl PartialEq for HeadOp {
    fn eq(&self, other: &HeadOp) -> bool {
        self.hash == other.hash && OpKey(&self.op) == OpKey(&other.op)
    }
}
impl Eq for HeadOp {}

impl Hash for HeadOp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for HeadOp {
    fn partial_cmp(&self, other: &HeadOp) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeadOp {
    fn cmp(&self, other: &HeadOp) -> Ordering {
        OpKey(&self.op).cmp(&OpKey(&other.op))
    }
}

impl fmt::Debug for HeadOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        OpKey(&self.op).fmt(f)
    }
}

/// What an e-node is: the graph input at a position, or an op.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Head {
    /// The graph input at this position.
    Input(usize),
    /// An op.
    Op(HeadOp),
}

/// An e-node: a head and its operand e-classes in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ENode {
    /// What the node is.
    pub head: Head,
    /// The operand e-classes, in operand order.
    pub children: Vec<Id>,
}

impl ENode {
    /// The node for `op` applied to `children`.
    pub fn op(op: Op, children: Vec<Id>) -> ENode {
        ENode {
            head: Head::Op(HeadOp::new(op)),
            children,
        }
    }

    /// The op of this node, `None` for an input.
    pub fn as_op(&self) -> Option<&Op> {
        match &self.head {
            Head::Op(k) => Some(k.op()),
            Head::Input(_) => None,
        }
    }
}

impl Language for ENode {
    type Discriminant = Head;

    fn discriminant(&self) -> Head {
        self.head.clone()
    }

    fn matches(&self, other: &ENode) -> bool {
        self.head == other.head && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

/// The type analysis: each e-class's `TensorType`, `None` only if a node failed to type
/// (rules check types before they add anything, so this marks a bug, never a user error).
#[derive(Default)]
pub struct Types {
    /// The graph inputs' types, by position.
    pub inputs: Vec<TensorType>,
}

/// The e-graph the rewriter works on.
pub type EG = EGraph<ENode, Types>;

impl Analysis<ENode> for Types {
    type Data = Option<TensorType>;

    fn make(egraph: &mut EG, enode: &ENode) -> Option<TensorType> {
        match &enode.head {
            Head::Input(i) => egraph.analysis.inputs.get(*i).cloned(),
            Head::Op(k) => {
                let tys: Option<Vec<&TensorType>> = enode
                    .children
                    .iter()
                    .map(|&c| egraph[c].data.as_ref())
                    .collect();
                k.op().infer(&tys?).ok()
            }
        }
    }

    fn merge(&mut self, a: &mut Option<TensorType>, b: Option<TensorType>) -> DidMerge {
        match (a.is_some(), b.is_some()) {
            (false, true) => {
                *a = b;
                DidMerge(true, false)
            }
            (true, false) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::dtype::{DType, Scalar};
    use crate::ir::op::Literal;

    #[test]
    fn keys_tell_signed_zeros_apart_and_match_equal_ops() {
        let z = |v: f64| HeadOp::new(Op::Scalar(Scalar::Float(v)));
        assert_ne!(z(0.0), z(-0.0));
        assert_eq!(z(-0.0), z(-0.0));
        assert_eq!(z(f64::NAN), z(f64::NAN));
        let t = |a, b| HeadOp::new(Op::Transpose { dim0: a, dim1: b });
        assert_eq!(t(0, 1), t(0, 1));
        assert_ne!(t(0, 1), t(1, 0));
        assert_ne!(
            HeadOp::new(Op::Scalar(Scalar::Int(1))),
            HeadOp::new(Op::Scalar(Scalar::Float(1.0)))
        );
    }

    #[test]
    fn constants_compare_by_bytes() {
        let c = |b: Vec<u8>| {
            HeadOp::new(Op::Constant(Literal {
                dtype: DType::U8,
                shape: vec![b.len()],
                bytes: Arc::new(b),
            }))
        };
        assert_eq!(c(vec![1, 2, 3]), c(vec![1, 2, 3]));
        assert_ne!(c(vec![1, 2, 3]), c(vec![1, 2, 4]));
        assert_eq!(c(vec![1, 2]).cmp(&c(vec![1, 2])), Ordering::Equal);
    }
}
