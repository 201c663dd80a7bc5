//! Autograd: which tensors require gradients, where their gradients accumulate, and the
//! eager tape. While grad mode is on, `runtime::apply` records every op whose operand
//! requires grad (`tape`); `backward` differentiates the recorded graph with the
//! `passes::autodiff` pass (`engine`).

mod backward_plan;
mod checkpoint;
mod clip;
mod engine;
mod function;
mod gradcheck;
pub(crate) mod tape;

pub use checkpoint::{Segment, checkpoint, checkpoint_sequential};
pub use clip::{clip_grad_norm_, clip_grad_value_};
pub use function::{Context, Function, apply_function};
pub use gradcheck::{GradcheckOptions, gradcheck, gradcheck_with};

use crate::runtime::Tensor;
use crate::{Result, bail};
use std::collections::HashSet;
use std::sync::Arc;

pub(crate) use crate::runtime::tensor::AutogradMeta;

impl AutogradMeta {
    /// The recorded op that produced this tensor (`grad_fn`); `None` for leaves.
    pub(crate) fn node(&self) -> Option<Arc<tape::GradNode>> {
        let n = self.grad_fn.clone()?;
        // Only the tape sets `grad_fn`, always to one of its nodes.
        Some(
            n.downcast::<tape::GradNode>()
                .unwrap_or_else(|_| unreachable!("grad_fn holds a tape node")),
        )
    }

    pub(crate) fn set_node(&mut self, n: Arc<tape::GradNode>) {
        tape::register_hooks();
        self.requires_grad = true;
        self.grad_fn = Some(n);
    }
}

impl Tensor {
    pub(crate) fn meta(&self) -> std::sync::MutexGuard<'_, AutogradMeta> {
        // A panic while the lock was held cannot leave the plain fields half-written.
        self.0.autograd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `hook` with this leaf each time a backward pass has accumulated a gradient into
    /// its `.grad` (`register_post_accumulate_grad_hook`): what `DistributedDataParallel`
    /// uses to start reducing a bucket as soon as its gradients are ready.
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        let mut m = self.meta();
        if m.grad_fn.is_some() {
            bail!(
                Value,
                "post accumulate grad hooks cannot be registered on non-leaf tensors"
            );
        }
        m.post_accumulate.push(Arc::new(hook));
        Ok(())
    }

    /// Whether gradients flow to this tensor.
    pub fn requires_grad(&self) -> bool {
        self.meta().requires_grad
    }

    /// Marks this tensor as one whose gradient is wanted (`requires_grad_()`). Only
    /// floating-point tensors can require gradients, as in PyTorch.
    pub fn requires_grad_(&self, on: bool) -> Result<&Tensor> {
        if on && !self.dtype().is_float() {
            bail!(
                DType,
                "only Tensors of floating point dtype can require gradients"
            );
        }
        if on {
            tape::register_hooks();
        }
        self.meta().requires_grad = on;
        Ok(self)
    }

    /// The accumulated gradient, if any (`.grad`).
    pub fn grad(&self) -> Option<Tensor> {
        self.meta().grad.clone()
    }

    /// Replaces the accumulated gradient (`t.grad = g`; `None` clears it).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        self.meta().grad = grad;
    }

    /// True for tensors not produced by a recorded op (every tensor that does not require
    /// grad is a leaf, as in PyTorch).
    pub fn is_leaf(&self) -> bool {
        self.meta().grad_fn.is_none()
    }

    /// The name of the op that produced this tensor (`MulBackward0`), for non-leaves.
    pub fn grad_fn_name(&self) -> Option<String> {
        self.meta().node().map(|n| n.name())
    }

    /// A tensor sharing this one's data, cut off from the recorded graph (`detach()`).
    pub fn detach(&self) -> Tensor {
        tape::detached(self)
    }

    /// Makes backward fill `.grad` of this non-leaf tensor too (`retain_grad()`).
    pub fn retain_grad(&self) -> Result<()> {
        let node = {
            let m = self.meta();
            if !m.requires_grad {
                bail!(
                    Value,
                    "can't retain_grad on Tensor that has requires_grad=False"
                );
            }
            m.node()
        };
        if let Some(n) = node {
            n.set_retained(self);
        }
        Ok(())
    }

    /// Whether backward fills this tensor's `.grad` (leaves that require grad, and
    /// non-leaves after `retain_grad`).
    pub fn retains_grad(&self) -> bool {
        let m = self.meta();
        match m.node() {
            Some(n) => n
                .retained_tensor()
                .is_some_and(|t| Arc::ptr_eq(&t.0, &self.0)),
            None => m.requires_grad,
        }
    }

    /// Gradients of this scalar with respect to the leaves it depends on, added to their
    /// `.grad`; frees the recorded graph (`loss.backward()`).
    pub fn backward(&self) -> Result<()> {
        self.backward_opts(None, false)
    }

    /// Backward seeded with `grad` (the gradient of some scalar with respect to `self`).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        self.backward_opts(Some(grad), false)
    }

    /// Backward of a scalar that keeps the recorded graph for another backward
    /// (`loss.backward(retain_graph=True)`).
    pub fn backward_retain_graph(&self) -> Result<()> {
        self.backward_opts(None, true)
    }

    /// Backward with an optional seed (required for non-scalars) and `retain_graph`.
    pub fn backward_opts(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        let seed = match grad {
            Some(g) => {
                if g.shape() != self.shape() {
                    bail!(
                        Shape,
                        "Mismatch in shape: grad_output[0] has a shape of {:?} and output[0] has a shape of {:?}.",
                        g.shape(),
                        self.shape()
                    );
                }
                let _off = no_grad();
                if g.dtype() != self.dtype() {
                    g.to_dtype(self.dtype())?
                } else {
                    g.detach()
                }
            }
            None => {
                if self.numel() != 1 {
                    bail!(
                        Value,
                        "grad can be implicitly created only for scalar outputs"
                    );
                }
                if !self.dtype().is_float() {
                    bail!(
                        Value,
                        "grad can be implicitly created only for real scalar outputs but got {}",
                        self.dtype().torch_name()
                    );
                }
                Tensor::ones(self.shape(), self.dtype())
            }
        };
        engine::backward(self, seed, retain_graph)
    }
}

/// Clears the gradients of `params` (`optimizer.zero_grad()`, set to `None`).
pub fn zero_grad(params: &[Tensor]) {
    for p in params {
        p.set_grad(None);
    }
}

/// Bytes of tensor data the recorded graph behind `t` keeps for backward (each storage
/// counted once; leaves are not counted).
pub fn saved_tensor_bytes(t: &Tensor) -> usize {
    let mut seen_nodes: HashSet<*const tape::GradNode> = HashSet::new();
    let mut seen_storage: HashSet<u64> = HashSet::new();
    let mut total = 0;
    let mut count = |id: u64, bytes: usize, total: &mut usize| {
        if seen_storage.insert(id) {
            *total += bytes;
        }
    };
    let mut stack: Vec<Arc<tape::GradNode>> = t.meta().node().into_iter().collect();
    while let Some(n) = stack.pop() {
        if !seen_nodes.insert(Arc::as_ptr(&n)) {
            continue;
        }
        match &n.op {
            tape::NodeOp::Custom(c) => {
                for (id, b) in c.saved() {
                    count(id, b, &mut total);
                }
                if let Some(v) = n.value() {
                    count(v.storage().id(), v.storage().nbytes(), &mut total);
                }
            }
            tape::NodeOp::Op(_) => {
                if let Some(v) = n.value() {
                    count(v.storage().id(), v.storage().nbytes(), &mut total);
                }
                for e in &n.inputs {
                    if let tape::Edge::Const(c) = e {
                        count(c.storage().id(), c.storage().nbytes(), &mut total);
                    }
                }
            }
        }
        for e in &n.inputs {
            if let tape::Edge::Node(c) = e {
                stack.push(c.clone());
            }
        }
    }
    total
}

thread_local! {
    static GRAD_ENABLED: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Whether ops on this thread record what gradients need (`torch.is_grad_enabled()`).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous grad mode of its thread when dropped.
#[must_use = "grad mode is restored when the guard is dropped"]
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

fn set_grad_enabled(on: bool) -> GradModeGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(on));
    GradModeGuard { previous }
}

/// Turns gradient recording off on this thread until the guard drops (`torch.no_grad()`).
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// Turns gradient recording on on this thread until the guard drops (`torch.enable_grad()`).
pub fn enable_grad() -> GradModeGuard {
    set_grad_enabled(true)
}

/// Runs `f` with gradient recording off and restores the previous mode, even when `f`
/// returns early or panics: the block form of `with torch.no_grad():`. (A guard bound with
/// `let _ = no_grad();` is dropped at once and turns nothing off; this form cannot be
/// misused that way.)
pub fn no_grad_scope<R>(f: impl FnOnce() -> R) -> R {
    let _off = no_grad();
    f()
}

/// Runs `f` with gradient recording on (`with torch.enable_grad():`), then restores the mode.
pub fn enable_grad_scope<R>(f: impl FnOnce() -> R) -> R {
    let _on = enable_grad();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_switch_recording_for_their_block_only() {
        assert!(is_grad_enabled());
        let inside = no_grad_scope(|| {
            let nested = enable_grad_scope(is_grad_enabled);
            (is_grad_enabled(), nested)
        });
        assert_eq!(inside, (false, true));
        assert!(is_grad_enabled());
        // restored after a panic inside the block too
        let r = std::panic::catch_unwind(|| no_grad_scope(|| panic!("inside")));
        assert!(r.is_err());
        assert!(is_grad_enabled());
        // an op inside the block is not recorded
        let w = Tensor::from_vec(vec![1.5f64], &[1]).unwrap();
        w.requires_grad_(true).unwrap();
        let y = no_grad_scope(|| w.mul_scalar(2.0)).unwrap();
        assert!(!y.requires_grad());
        assert!(w.mul_scalar(2.0).unwrap().requires_grad());
    }

    #[test]
    fn guards_nest_and_restore() {
        assert!(is_grad_enabled());
        {
            let _off = no_grad();
            assert!(!is_grad_enabled());
            {
                let _on = enable_grad();
                assert!(is_grad_enabled());
            }
            assert!(!is_grad_enabled());
        }
        assert!(is_grad_enabled());
    }

    #[test]
    fn only_float_tensors_require_grad() {
        let i = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
        assert!(i.requires_grad_(true).is_err());
        let f = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        assert!(f.requires_grad_(true).unwrap().requires_grad());
        assert!(f.grad().is_none());
        f.set_grad(Some(f.clone()));
        assert_eq!(f.grad().unwrap().to_f64_vec(), vec![1.0, 2.0]);
    }
}
