//! Recording: while grad mode is on, every op whose operand requires grad leaves a
//! `GradNode` on its result. The nodes form the recorded graph (tensors are its values);
//! `backward` turns the part it needs into an IR graph and runs the autodiff pass on it.

use super::function::CustomBackward;
use super::is_grad_enabled;
use crate::ir::op::{Op, TensorType};
use crate::runtime::Tensor;
use crate::runtime::tensor::Inner;
use crate::{Result, bail};
use std::sync::{Arc, Mutex, Weak};

/// Installs the tape's hooks into eager execution (`runtime::hooks`). Called whenever a
/// tensor starts requiring grad: before that, no op has anything to record.
pub(crate) fn register_hooks() {
    use crate::runtime::hooks::{TAPE, TAPE_INPLACE};
    TAPE.register(on_apply);
    TAPE_INPLACE.register(on_inplace);
}

/// What produced a recorded value.
pub(crate) enum NodeOp {
    /// An IR op: differentiated by the autodiff pass.
    Op(Op),
    /// A user-defined function with its own backward.
    Custom(Arc<dyn CustomBackward>),
}

/// An operand of a recorded op.
pub(crate) enum Edge {
    /// The result of another recorded op.
    Node(Arc<GradNode>),
    /// A leaf that requires grad: gradients accumulate into its `.grad`.
    Leaf(Tensor),
    /// A tensor without gradient (a detached handle on its data).
    Const(Tensor),
}

/// One recorded op: its operands (with their storage versions when it ran) and its result.
pub(crate) struct GradNode {
    pub op: NodeOp,
    pub inputs: Vec<Edge>,
    pub in_versions: Vec<u64>,
    pub out_type: TensorType,
    pub out_version: u64,
    /// The result's data (`None` when it was not kept: backward recomputes it if needed).
    pub out: Mutex<Option<Tensor>>,
    /// Set by a backward without `retain_graph`: the saved values are gone.
    pub freed: std::sync::atomic::AtomicBool,
    /// The tensor whose `.grad` receives this value's gradient (`retain_grad`).
    pub retained: Mutex<Option<Weak<Inner>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GradNode {
    pub fn value(&self) -> Option<Tensor> {
        lock(&self.out).clone()
    }
    pub fn free(&self) {
        *lock(&self.out) = None;
        self.freed.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn is_freed(&self) -> bool {
        self.freed.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub fn retained_tensor(&self) -> Option<Tensor> {
        lock(&self.retained).as_ref()?.upgrade().map(Tensor)
    }
    pub fn set_retained(&self, t: &Tensor) {
        *lock(&self.retained) = Some(Arc::downgrade(&t.0));
    }
    /// PyTorch's name for the node: `MulBackward0`.
    pub fn name(&self) -> String {
        match &self.op {
            NodeOp::Op(op) => format!("{}Backward0", camel(op.name())),
            NodeOp::Custom(c) => format!("{}Backward", c.name()),
        }
    }
}

fn camel(s: &str) -> String {
    s.split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// A new handle on `t`'s data with no gradient state.
pub(crate) fn detached(t: &Tensor) -> Tensor {
    if t.is_wrapped_number() {
        return t.clone();
    }
    t.with_layout(t.layout().clone())
}

/// The edge through which gradients reach `t`.
pub(crate) fn edge_of(t: &Tensor) -> Edge {
    let m = t.meta();
    match m.node() {
        Some(n) => Edge::Node(n.clone()),
        None if m.requires_grad => Edge::Leaf(t.clone()),
        None => Edge::Const(detached(t)),
    }
}

/// Makes `out` the result of a recorded node.
pub(crate) fn attach(
    op: NodeOp,
    inputs: Vec<Edge>,
    in_versions: Vec<u64>,
    out: &Tensor,
) -> Arc<GradNode> {
    let node = Arc::new(GradNode {
        op,
        inputs,
        in_versions,
        out_type: out.ttype(),
        out_version: out.version(),
        out: Mutex::new(Some(detached(out))),
        retained: Mutex::new(None),
        freed: Default::default(),
    });
    out.meta().set_node(node.clone());
    node
}

/// The hook `runtime::apply` calls after every op: records it when grad mode is on, the
/// result is floating point and an operand requires grad.
pub(crate) fn on_apply(op: &Op, inputs: &[&Tensor], out: &Tensor) {
    if !out.dtype().is_float() || !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
        return;
    }
    let edges = inputs.iter().map(|t| edge_of(t)).collect();
    let versions = inputs.iter().map(|t| t.version()).collect();
    attach(NodeOp::Op(op.clone()), edges, versions, out);
}

/// Called before an in-place op writes `target = op(operands)`. Refuses in-place writes into
/// leaves that require grad (and their views) while grad mode is on; otherwise records the
/// write out of place, so that `target` becomes the op's result.
pub(crate) fn on_inplace(target: &Tensor, op: &Op, operands: &[&Tensor]) -> Result<()> {
    if !is_grad_enabled() {
        return Ok(());
    }
    let (req, node) = {
        let m = target.meta();
        (m.requires_grad, m.node())
    };
    if req && node.is_none() {
        bail!(
            Value,
            "a leaf Variable that requires grad is being used in an in-place operation."
        );
    }
    if let Some(n) = &node
        && views_leaf(n, target)
    {
        bail!(
            Value,
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        );
    }
    if !req && !operands.iter().any(|t| t.requires_grad()) || !target.dtype().is_float() {
        return Ok(());
    }
    let types: Vec<TensorType> = operands.iter().map(|t| t.ttype()).collect();
    let out_ty = op.infer(&types.iter().collect::<Vec<_>>())?;
    let edges: Vec<Edge> = operands.iter().map(|t| edge_of(t)).collect();
    let versions: Vec<u64> = operands.iter().map(|t| t.version()).collect();
    // The write bumps the version once: that is the version backward will see.
    let after = target.version() + 1;
    let mut node = GradNode {
        op: NodeOp::Op(op.clone()),
        inputs: edges,
        in_versions: versions,
        out_type: out_ty.clone(),
        out_version: after,
        out: Mutex::new(Some(detached(target))),
        retained: Mutex::new(None),
        freed: Default::default(),
    };
    if out_ty.dtype != target.dtype() {
        // The op computed in another dtype and the write cast back: record both steps. The
        // uncast result is not kept, so rules that need it report it as modified.
        node.out = Mutex::new(None);
        node.out_version = u64::MAX;
        let inner = Arc::new(node);
        let cast = GradNode {
            op: NodeOp::Op(Op::To {
                dtype: target.dtype(),
            }),
            inputs: vec![Edge::Node(inner)],
            in_versions: vec![u64::MAX],
            out_type: target.ttype(),
            out_version: after,
            out: Mutex::new(Some(detached(target))),
            retained: Mutex::new(None),
            freed: Default::default(),
        };
        node = cast;
    }
    target.meta().set_node(Arc::new(node));
    Ok(())
}

/// True when `target` is a view (through view ops only) of a leaf that requires grad.
fn views_leaf(n: &GradNode, target: &Tensor) -> bool {
    let mut cur = n;
    loop {
        let NodeOp::Op(op) = &cur.op else {
            return false;
        };
        if !op.is_view() {
            return false;
        }
        match cur.inputs.first() {
            Some(Edge::Leaf(t)) => return t.shares_storage(target),
            Some(Edge::Node(next)) => cur = next,
            _ => return false,
        }
    }
}
