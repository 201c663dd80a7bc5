//! Matrix-product methods on `Tensor`.

use crate::Result;
use crate::ir::op::Op;
use crate::runtime::tensor::{Tensor, apply};

impl Tensor {
    /// `torch.matmul`: dot, matrix-vector, matrix and batched products with broadcasting.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        apply(Op::Matmul, &[self, other])
    }
    /// `x · weightᵀ + bias`, as `torch.nn.functional.linear`.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        apply(
            Op::Linear {
                has_bias: bias.is_some(),
            },
            &inputs,
        )
    }
}
