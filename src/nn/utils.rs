//! Gradient utilities (`torch.nn.utils`).

use crate::runtime::Tensor;
use crate::{DType, Result, bail};

/// Scales the gradients of `params` in place so that their joint 2-norm is at most
/// `max_norm` (`clip_grad_norm_`); returns the norm before clipping. Parameters without a
/// gradient are skipped. A non-finite norm is an error when `error_if_nonfinite`.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, error_if_nonfinite: bool) -> Result<f64> {
    let _g = crate::autograd::no_grad();
    let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
    let mut total = 0.0;
    for g in &grads {
        total += g.to_dtype(DType::F64)?.square()?.sum()?.item::<f64>()?;
    }
    let total = total.sqrt();
    if error_if_nonfinite && !total.is_finite() {
        bail!(
            Value,
            "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
        );
    }
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        for g in &grads {
            g.mul_scalar_(coef)?;
        }
    }
    Ok(total)
}
