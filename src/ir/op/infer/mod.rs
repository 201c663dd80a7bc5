//! `Op::infer`, the shape and dtype rule of every op, one file per op family.

mod collective;
mod control_flow;
mod creation;
mod index;
mod linalg;
mod nn;
mod pointwise;
mod reduce;
mod views;

use super::{Op, TensorType};
use crate::{Result, bail};

pub use linalg::matmul_type;

fn check_arity(name: &str, inputs: &[&TensorType], n: usize) -> Result<()> {
    if inputs.len() != n {
        bail!(
            Value,
            "{name}() takes {n} tensor operand{}, but {} were given",
            if n == 1 { "" } else { "s" },
            inputs.len()
        );
    }
    Ok(())
}

impl Op {
    /// The type of the op's result. This is the single shape and dtype rule of every op.
    pub fn infer(&self, inputs: &[&TensorType]) -> Result<TensorType> {
        match self {
            Op::Scalar(_) | Op::Constant(_) | Op::Full { .. } | Op::Arange { .. } => {
                creation::infer(self, inputs)
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Clamp { .. }
            | Op::To { .. }
            | Op::ViewDtype { .. }
            | Op::MaskedFill { .. } => pointwise::infer(self, inputs),
            Op::Reduce { .. }
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::Var { .. }
            | Op::Std { .. }
            | Op::Cumsum { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. } => reduce::infer(self, inputs),
            Op::Matmul | Op::Linear { .. } | Op::Einsum { .. } => linalg::infer(self, inputs),
            Op::LayerNorm { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::Conv { .. }
            | Op::ConvInputGrad { .. }
            | Op::ConvWeightGrad { .. }
            | Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. }
            | Op::MaxPool2dGrad { .. }
            | Op::AvgPool2dGrad { .. }
            | Op::AdaptiveAvgPool2d { .. }
            | Op::AdaptiveAvgPool2dGrad { .. }
            | Op::BatchNorm(_)
            | Op::Dropout { .. } => nn::infer(self, inputs),
            Op::Control(_) | Op::Result { .. } => control_flow::infer(self, inputs),
            Op::AllReduce { .. } => collective::infer(self, inputs),
            Op::Reshape { .. }
            | Op::View { .. }
            | Op::Permute { .. }
            | Op::Transpose { .. }
            | Op::T
            | Op::Expand { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Narrow { .. }
            | Op::Select { .. }
            | Op::Slice { .. }
            | Op::Diagonal { .. }
            | Op::Contiguous
            | Op::Repeat { .. }
            | Op::Cat { .. }
            | Op::Stack { .. }
            | Op::Flip { .. }
            | Op::Tril { .. }
            | Op::Triu { .. } => views::infer(self, inputs),
            Op::IndexSelect { .. }
            | Op::Gather { .. }
            | Op::Scatter { .. }
            | Op::ScatterAdd { .. }
            | Op::ScatterReduce { .. }
            | Op::IndexAdd { .. }
            | Op::Embedding => index::infer(self, inputs),
        }
    }
}
