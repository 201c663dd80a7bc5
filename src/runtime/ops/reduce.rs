//! Reduction and normalisation methods on `Tensor`.

use crate::Result;
use crate::ir::op::{Op, ReduceOp};
use crate::runtime::tensor::{Tensor, apply};

fn reduce(x: &Tensor, op: ReduceOp, dim: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
    let dim = dim.map(<[i64]>::to_vec);
    apply(Op::Reduce { op, dim, keepdim }, &[x])
}

impl Tensor {
    /// Sum of all elements (ints and bool sum into i64).
    pub fn sum(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Sum, None, false)
    }
    /// Sum over `dims` (an empty list means every dim).
    pub fn sum_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Sum, Some(dims), keepdim)
    }
    /// Mean of all elements (float dtypes only).
    pub fn mean(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Mean, None, false)
    }
    /// Mean over `dims` (an empty list means every dim).
    pub fn mean_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Mean, Some(dims), keepdim)
    }
    /// Largest element; NaN if any element is NaN.
    pub fn amax(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Amax, None, false)
    }
    /// Largest element over `dims`; NaN propagates.
    pub fn amax_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Amax, Some(dims), keepdim)
    }
    /// Smallest element; NaN if any element is NaN.
    pub fn amin(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Amin, None, false)
    }
    /// Smallest element over `dims`; NaN propagates.
    pub fn amin_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Amin, Some(dims), keepdim)
    }
    /// True when every element is non-zero.
    pub fn all(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::All, None, false)
    }
    /// `all` over `dims`.
    pub fn all_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::All, Some(dims), keepdim)
    }
    /// True when some element is non-zero.
    pub fn any(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Any, None, false)
    }
    /// `any` over `dims`.
    pub fn any_dim(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Any, Some(dims), keepdim)
    }
    /// `log(sum(exp(x)))` over `dims`, computed without overflow.
    pub fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::LogSumExp, Some(dims), keepdim)
    }
    /// Product of all elements (ints and bool multiply into i64).
    pub fn prod(&self) -> Result<Tensor> {
        reduce(self, ReduceOp::Prod, None, false)
    }
    /// Product over one dim.
    pub fn prod_dim(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        reduce(self, ReduceOp::Prod, Some(&[dim]), keepdim)
    }
    /// Index of the first largest element along `dim` (of the flattened tensor when `None`).
    pub fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        apply(Op::ArgMax { dim, keepdim }, &[self])
    }
    /// Index of the first smallest element along `dim` (of the flattened tensor when `None`).
    pub fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        apply(Op::ArgMin { dim, keepdim }, &[self])
    }
    /// Variance over `dims` (all when `None`), dividing by `N - correction`.
    pub fn var(&self, dims: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
        let dim = dims.map(<[i64]>::to_vec);
        apply(
            Op::Var {
                dim,
                correction,
                keepdim,
            },
            &[self],
        )
    }
    /// Standard deviation over `dims` (all when `None`), dividing by `N - correction`.
    pub fn std(&self, dims: Option<&[i64]>, correction: f64, keepdim: bool) -> Result<Tensor> {
        let dim = dims.map(<[i64]>::to_vec);
        apply(
            Op::Std {
                dim,
                correction,
                keepdim,
            },
            &[self],
        )
    }
    /// Running sum along `dim` (ints and bool accumulate into i64).
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        apply(Op::Cumsum { dim }, &[self])
    }
    /// `exp(x) / sum(exp(x))` along `dim`.
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        apply(Op::Softmax { dim }, &[self])
    }
    /// `x - logsumexp(x)` along `dim`.
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        apply(Op::LogSoftmax { dim }, &[self])
    }
    /// Normalises over the trailing `normalized_shape` dims, then scales and shifts.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = Op::LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        apply(op, &inputs)
    }
}
