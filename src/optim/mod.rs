//! Optimisers (`torch.optim`): SGD, Adam and AdamW with PyTorch's update formulas.
//!
//! An optimiser holds the parameter tensors themselves (shared storage), reads their
//! `.grad` on `step()` and updates them in place with gradient recording off. Parameters
//! without a gradient are skipped, as in PyTorch.

mod adam;
mod grad_scaler;
pub(crate) mod rule;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW};
pub use grad_scaler::GradScaler;
pub use sgd::{SGD, SGDConfig};

use crate::runtime::Tensor;
use crate::{Result, bail};

/// What every optimiser offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    /// The parameters being optimised.
    fn params(&self) -> &[Tensor];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Changes the learning rate (what schedulers do).
    fn set_lr(&mut self, lr: f64);

    /// Clears every parameter's gradient (`zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for p in self.params() {
            p.set_grad(None);
        }
    }
}

pub(crate) fn check_param(value: f64, name: &str) -> Result<()> {
    if value.is_nan() || value < 0.0 {
        bail!(Value, "Invalid {name}: {value}");
    }
    Ok(())
}

/// Checks that every parameter is a floating-point tensor.
pub(crate) fn check_params(params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.dtype().is_float() {
            bail!(
                DType,
                "optimizer can only optimize Tensors of floating point dtype, but one of the params is {}",
                p.dtype().torch_name()
            );
        }
    }
    Ok(())
}

/// The gradient of `p` when it has one, checked against `p`'s shape.
pub(crate) fn grad_of(p: &Tensor) -> Result<Option<Tensor>> {
    match p.grad() {
        Some(g) if g.shape() != p.shape() => bail!(
            Shape,
            "the gradient of shape {:?} does not match its parameter of shape {:?}",
            g.shape(),
            p.shape()
        ),
        other => Ok(other),
    }
}
