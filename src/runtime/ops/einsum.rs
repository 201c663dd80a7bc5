//! `Tensor::einsum`.

use crate::Result;
use crate::ir::op::Op;
use crate::runtime::tensor::{Tensor, apply};

impl Tensor {
    /// `torch.einsum(equation, operands)`: explicit (`"ij,jk->ik"`) or implicit (`"ij,jk"`)
    /// output, repeated subscripts (diagonals, traces), `...` with broadcasting.
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        apply(
            Op::Einsum {
                equation: equation.to_string(),
            },
            operands,
        )
    }
}
