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

#[cfg(test)]
mod tests {
    use super::*;

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
