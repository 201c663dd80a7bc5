//! Autograd: which tensors require gradients and where their gradients accumulate.

use crate::runtime::Tensor;
use crate::{Result, bail};

/// Per-tensor gradient state, as PyTorch keeps it on every tensor.
#[derive(Default)]
pub(crate) struct AutogradMeta {
    /// Gradients flow to this tensor.
    pub requires_grad: bool,
    /// The accumulated gradient (`.grad`).
    pub grad: Option<Tensor>,
}

impl Tensor {
    fn meta(&self) -> std::sync::MutexGuard<'_, AutogradMeta> {
        // A panic while the lock was held cannot leave the plain fields half-written.
        self.0.autograd.lock().unwrap_or_else(|e| e.into_inner())
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
}
