//! Each optimiser's update rule, written once over [`Arith`], the arithmetic it needs.
//!
//! The eager optimisers run a rule on tensors ([`TensorOps`]) or, for a contiguous f32
//! parameter, on each element in one pass ([`F32`], every operation rounded to f32 as the
//! tensor ops on f32 round); the compiled training step runs it on the values of its graph,
//! which appends the same operations in the same order. So every path computes the same
//! numbers, and a change to a rule reaches them all.

use super::{AdamConfig, SGDConfig};
use crate::Result;
use crate::runtime::Tensor;
use crate::runtime::kernels::pointwise::max_nan;

/// The operations the rules are written in. `T` is a tensor: a tensor, one element of one,
/// or a graph value. `S` is a scalar: a setting, or a value of the step (an input of a
/// graph, so that a new learning rate or bias correction does not recompile it).
pub(crate) trait Arith {
    /// A tensor.
    type T: Clone;
    /// A scalar.
    type S: Copy;
    /// The setting `c` as a scalar.
    fn constant(&mut self, c: f64) -> Self::S;
    /// `x + y`.
    fn add(&mut self, x: &Self::T, y: &Self::T) -> Result<Self::T>;
    /// `x / y`.
    fn div(&mut self, x: &Self::T, y: &Self::T) -> Result<Self::T>;
    /// `torch.maximum(x, y)`: NaN wins.
    fn maximum(&mut self, x: &Self::T, y: &Self::T) -> Result<Self::T>;
    /// `x * x`.
    fn square(&mut self, x: &Self::T) -> Result<Self::T>;
    /// `sqrt(x)`.
    fn sqrt(&mut self, x: &Self::T) -> Result<Self::T>;
    /// `x + s`.
    fn add_s(&mut self, x: &Self::T, s: Self::S) -> Result<Self::T>;
    /// `x * s`.
    fn mul_s(&mut self, x: &Self::T, s: Self::S) -> Result<Self::T>;
    /// `x / s`.
    fn div_s(&mut self, x: &Self::T, s: Self::S) -> Result<Self::T>;
    /// The parameter's new value `p - step`, the last operation of a rule (tensors write it
    /// into `p` itself).
    fn descend(&mut self, p: &Self::T, step: &Self::T) -> Result<Self::T>;

    /// `x * c` for a setting `c`.
    fn scale(&mut self, x: &Self::T, c: f64) -> Result<Self::T> {
        let c = self.constant(c);
        self.mul_s(x, c)
    }
}

/// `torch.optim.SGD` for one parameter: with `g = grad + weight_decay·p`, the momentum
/// buffer is `b = g` on the first step (`buf` is `None`) and `b = momentum·b + (1 -
/// dampening)·g` after; the direction is `g + momentum·b` (Nesterov) or `b`, and the new
/// parameter `p - lr·direction`. Returns it and, with momentum, the new buffer.
pub(crate) fn sgd<A: Arith>(
    a: &mut A,
    c: &SGDConfig,
    p: &A::T,
    grad: &A::T,
    buf: Option<&A::T>,
    lr: A::S,
) -> Result<(A::T, Option<A::T>)> {
    let mut d = grad.clone();
    if c.weight_decay != 0.0 {
        let decay = a.scale(p, c.weight_decay)?;
        d = a.add(&d, &decay)?;
    }
    let mut new_buf = None;
    if c.momentum != 0.0 {
        let b = match buf {
            None => d.clone(),
            Some(b) => {
                let kept = a.scale(b, c.momentum)?;
                let fresh = a.scale(&d, 1.0 - c.dampening)?;
                a.add(&kept, &fresh)?
            }
        };
        d = if c.nesterov {
            let m = a.scale(&b, c.momentum)?;
            a.add(&d, &m)?
        } else {
            b.clone()
        };
        new_buf = Some(b);
    }
    let step = a.mul_s(&d, lr)?;
    Ok((a.descend(p, &step)?, new_buf))
}

/// Adam's state of one parameter.
#[derive(Clone, Debug)]
pub(crate) struct AdamState<T> {
    /// The running average of the gradient.
    pub exp_avg: T,
    /// The running average of its square.
    pub exp_avg_sq: T,
    /// The running maximum of `exp_avg_sq`, kept under AMSGrad only.
    pub max_exp_avg_sq: Option<T>,
}

impl<T> AdamState<T> {
    /// The state with AMSGrad (`amsgrad`) or without, each tensor made by `make`.
    pub(crate) fn new(amsgrad: bool, mut make: impl FnMut() -> T) -> AdamState<T> {
        AdamState {
            exp_avg: make(),
            exp_avg_sq: make(),
            max_exp_avg_sq: amsgrad.then(make),
        }
    }

    /// The tensors in the order PyTorch names them (`exp_avg`, `exp_avg_sq`,
    /// `max_exp_avg_sq`).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        [&self.exp_avg, &self.exp_avg_sq]
            .into_iter()
            .chain(self.max_exp_avg_sq.as_ref())
    }

    /// The tensors of [`AdamState::iter`], in a vector.
    pub(crate) fn into_vec(self) -> Vec<T> {
        let mut v = vec![self.exp_avg, self.exp_avg_sq];
        v.extend(self.max_exp_avg_sq);
        v
    }
}

/// The scalars of one Adam step, the same for every parameter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamScalars<S> {
    /// `lr / (1 - β1ᵗ)`.
    pub step_size: S,
    /// `sqrt(1 - β2ᵗ)`.
    pub bias_correction2_sqrt: S,
    /// AdamW's `1 - lr·weight_decay`.
    pub decay: S,
}

impl AdamScalars<f64> {
    /// The scalars of step `t` (counted from 1) at learning rate `lr`.
    pub(crate) fn new(c: &AdamConfig, decoupled: bool, lr: f64, t: u64) -> AdamScalars<f64> {
        let t = t as i32;
        let (b1, b2) = c.betas;
        let bias_correction1 = 1.0 - b1.powi(t);
        let bias_correction2 = 1.0 - b2.powi(t);
        AdamScalars {
            step_size: lr / bias_correction1,
            bias_correction2_sqrt: bias_correction2.sqrt(),
            decay: 1.0 - lr * c.weight_decay_for(decoupled),
        }
    }
}

impl<S> AdamScalars<S> {
    /// Each scalar through `f`.
    pub(crate) fn map<U>(self, mut f: impl FnMut(S) -> U) -> AdamScalars<U> {
        AdamScalars {
            step_size: f(self.step_size),
            bias_correction2_sqrt: f(self.bias_correction2_sqrt),
            decay: f(self.decay),
        }
    }
}

/// `torch.optim.Adam` for one parameter, `AdamW` when `decoupled`: the weight decay is
/// `g += weight_decay·p` (Adam) or `p *= 1 - lr·weight_decay` first (AdamW); then `m =
/// β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`, and the new parameter is `p - lr/(1-β1ᵗ) · m /
/// (sqrt(v)/sqrt(1-β2ᵗ) + eps)`, with `v` replaced by its running maximum under AMSGrad
/// (`state` keeps the maximum exactly when `c.amsgrad`). Returns it and the new state.
pub(crate) fn adam<A: Arith>(
    a: &mut A,
    c: &AdamConfig,
    decoupled: bool,
    p: &A::T,
    grad: &A::T,
    state: &AdamState<A::T>,
    k: AdamScalars<A::S>,
) -> Result<(A::T, AdamState<A::T>)> {
    debug_assert_eq!(c.amsgrad, state.max_exp_avg_sq.is_some());
    let (b1, b2) = c.betas;
    let wd = c.weight_decay_for(decoupled);
    let mut p = p.clone();
    let mut grad = grad.clone();
    if wd != 0.0 {
        if decoupled {
            p = a.mul_s(&p, k.decay)?;
        } else {
            let decay = a.scale(&p, wd)?;
            grad = a.add(&grad, &decay)?;
        }
    }
    let m_kept = a.scale(&state.exp_avg, b1)?;
    let m_fresh = a.scale(&grad, 1.0 - b1)?;
    let exp_avg = a.add(&m_kept, &m_fresh)?;
    let v_kept = a.scale(&state.exp_avg_sq, b2)?;
    let square = a.square(&grad)?;
    let v_fresh = a.scale(&square, 1.0 - b2)?;
    let exp_avg_sq = a.add(&v_kept, &v_fresh)?;
    let max_exp_avg_sq = match &state.max_exp_avg_sq {
        Some(vmax) => Some(a.maximum(vmax, &exp_avg_sq)?),
        None => None,
    };
    let second = max_exp_avg_sq.as_ref().unwrap_or(&exp_avg_sq);
    let root = a.sqrt(second)?;
    let scaled_root = a.div_s(&root, k.bias_correction2_sqrt)?;
    let eps = a.constant(c.eps);
    let denom = a.add_s(&scaled_root, eps)?;
    let ratio = a.div(&exp_avg, &denom)?;
    let step = a.mul_s(&ratio, k.step_size)?;
    let p = a.descend(&p, &step)?;
    let state = AdamState {
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    };
    Ok((p, state))
}

/// Tensor ops, for a parameter of any dtype and layout. Each operation makes a new tensor
/// but [`Arith::descend`], which subtracts the step from `p` in place.
pub(crate) struct TensorOps;

impl Arith for TensorOps {
    type T = Tensor;
    type S = f64;
    fn constant(&mut self, c: f64) -> f64 {
        c
    }
    fn add(&mut self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        x.add(y)
    }
    fn div(&mut self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        x.div(y)
    }
    fn maximum(&mut self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        x.maximum(y)
    }
    fn square(&mut self, x: &Tensor) -> Result<Tensor> {
        x.square()
    }
    fn sqrt(&mut self, x: &Tensor) -> Result<Tensor> {
        x.sqrt()
    }
    fn add_s(&mut self, x: &Tensor, s: f64) -> Result<Tensor> {
        x.add_scalar(s)
    }
    fn mul_s(&mut self, x: &Tensor, s: f64) -> Result<Tensor> {
        x.mul_scalar(s)
    }
    fn div_s(&mut self, x: &Tensor, s: f64) -> Result<Tensor> {
        x.div_scalar(s)
    }
    fn descend(&mut self, p: &Tensor, step: &Tensor) -> Result<Tensor> {
        p.sub_(step)?;
        Ok(p.clone())
    }
}

/// One f32 element: each operation rounded to f32, as the tensor ops on f32 tensors round
/// (a scalar is rounded to f32 first), `maximum` as their kernel computes it.
pub(crate) struct F32;

impl Arith for F32 {
    type T = f32;
    type S = f32;
    #[inline]
    fn constant(&mut self, c: f64) -> f32 {
        c as f32
    }
    #[inline]
    fn add(&mut self, x: &f32, y: &f32) -> Result<f32> {
        Ok(x + y)
    }
    #[inline]
    fn div(&mut self, x: &f32, y: &f32) -> Result<f32> {
        Ok(x / y)
    }
    #[inline]
    fn maximum(&mut self, x: &f32, y: &f32) -> Result<f32> {
        Ok(max_nan(f64::from(*x), f64::from(*y)) as f32)
    }
    #[inline]
    fn square(&mut self, x: &f32) -> Result<f32> {
        Ok(x * x)
    }
    #[inline]
    fn sqrt(&mut self, x: &f32) -> Result<f32> {
        Ok(x.sqrt())
    }
    #[inline]
    fn add_s(&mut self, x: &f32, s: f32) -> Result<f32> {
        Ok(x + s)
    }
    #[inline]
    fn mul_s(&mut self, x: &f32, s: f32) -> Result<f32> {
        Ok(x * s)
    }
    #[inline]
    fn div_s(&mut self, x: &f32, s: f32) -> Result<f32> {
        Ok(x / s)
    }
    #[inline]
    fn descend(&mut self, p: &f32, step: &f32) -> Result<f32> {
        Ok(p - step)
    }
}
