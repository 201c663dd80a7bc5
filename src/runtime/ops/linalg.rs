//! Matrix-product methods on `Tensor`.

use crate::Result;
use crate::ir::op::Op;
use crate::runtime::tensor::{Tensor, apply};

impl Tensor {
    /// `torch.matmul`: dot, matrix-vector, matrix and batched products with broadcasting.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        apply(Op::Matmul, &[self, other])
    }
    /// `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=,
    /// scale=)` with `self` as q `[.., L, E]`: `softmax(q kᵀ · scale + mask) v`. A bool
    /// mask keeps the positions where it is true, a float one is added to the scores;
    /// `is_causal` keeps keys `j <= i`; `scale` defaults to `1 / sqrt(E)`. Computed in one
    /// pass over the keys: the `[L, S]` scores are never stored.
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        is_causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let mut inputs = vec![self, key, value];
        inputs.extend(attn_mask);
        apply(
            Op::Attention {
                has_mask: attn_mask.is_some(),
                is_causal,
                scale: scale.map(crate::ir::unary::Real),
            },
            &inputs,
        )
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
