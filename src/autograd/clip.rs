//! Gradient clipping (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`).

use super::no_grad;
use crate::runtime::Tensor;
use crate::{Result, Scalar, bail};

/// Scales the gradients of `params` so that their joint `norm_type`-norm is at most
/// `max_norm` (`f64::INFINITY` for the max-norm); returns the norm before clipping.
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64, norm_type: f64) -> Result<f64> {
    if norm_type <= 0.0 || norm_type.is_nan() {
        bail!(
            Value,
            "clip_grad_norm_: norm_type must be positive, got {norm_type}"
        );
    }
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    let mut total = 0.0f64;
    for g in &grads {
        for v in g.to_f64_vec() {
            if norm_type.is_infinite() {
                total = total.max(v.abs());
            } else {
                total += v.abs().powf(norm_type);
            }
        }
    }
    if !norm_type.is_infinite() {
        total = total.powf(1.0 / norm_type);
    }
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        let _off = no_grad();
        for g in &grads {
            g.mul_scalar_(coef)?;
        }
    }
    Ok(total)
}

/// Clamps every gradient of `params` into `[-clip_value, clip_value]`.
pub fn clip_grad_value_(params: &[Tensor], clip_value: f64) -> Result<()> {
    let _off = no_grad();
    for g in params.iter().filter_map(|p| p.grad()) {
        g.clamp_(
            Some(Scalar::Float(-clip_value)),
            Some(Scalar::Float(clip_value)),
        )?;
    }
    Ok(())
}
