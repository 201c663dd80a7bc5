//! Reference kernels of eager mode, one module per op family. `eval` is the only door in:
//! it receives an op already checked by its shape rule, with the inferred output type.

pub mod attention;
pub mod attention_grad;
pub mod cnn;
pub mod conv;
pub mod copy;
pub mod creation;
pub mod einsum;
pub mod index;
pub mod linalg;
pub mod native;
pub mod pointwise;
pub mod pool;
pub mod reduce;
pub(crate) mod views;

use crate::ir::op::{Op, TensorType};
use crate::ir::shape::checked_numel;
use crate::tensor::Tensor;
use crate::{Result, bail};
use std::any::TypeId;

/// `s` as f32s, when `A` is f32: the way from a kernel generic over its element type to
/// code for f32 alone (`smelt_rt::tiles`).
pub(super) fn f32s<A: 'static>(s: &[A]) -> Option<&[f32]> {
    // SAFETY: `A` is f32
    (TypeId::of::<A>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// [`f32s`] of a mutable slice.
pub(super) fn f32s_mut<A: 'static>(s: &mut [A]) -> Option<&mut [f32]> {
    // SAFETY: `A` is f32
    (TypeId::of::<A>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

/// Refuses results whose bytes do not fit an allocation (rather than aborting in it). Views
/// allocate nothing and are exempt: an expanded view may describe more than memory holds.
pub(crate) fn check_size(t: &TensorType) -> Result<()> {
    let fits = checked_numel(&t.shape).and_then(|n| crate::tensor::storage::byte_len(t.dtype, n));
    if fits.is_err() {
        bail!(
            Value,
            "a tensor of shape {:?} and dtype {} is too large to allocate",
            t.shape,
            t.dtype
        );
    }
    Ok(())
}

/// An op on CPU tensors straight to its kernel: the shape rule, the size check and the
/// kernel, as `runtime::apply` runs them on the CPU, without its hooks and profiler span.
/// For kernels made of other ops (einsum), which sit below `apply`.
pub(crate) fn run(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ttype()).collect();
    let out = result_type(&op, &types)?;
    eval(&op, inputs, &out)
}

/// The type of `op`'s result on operands of `types` (its shape rule), refused when a
/// tensor of it could not be allocated (a view allocates nothing).
pub(crate) fn result_type(op: &Op, types: &[TensorType]) -> Result<TensorType> {
    let refs: Vec<&TensorType> = types.iter().collect();
    let out = op.infer(&refs)?;
    if !op.is_view() {
        check_size(&out)?;
    }
    Ok(out)
}

/// Evaluates `op` on `inputs` with the eager reference kernels; `out` is the result type
/// `Op::infer` gave.
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    match op {
        Op::Scalar(_) | Op::Constant(_) | Op::Full { .. } | Op::Arange { .. } => {
            creation::eval(op, out)
        }
        Op::Control(_) | Op::Result { .. } => Err(crate::Error::Unsupported(format!(
            "{} has several results: it runs through runtime::control, not as one kernel",
            op.name()
        ))),
        Op::AllReduce { op } => match crate::tensor::hooks::COLLECTIVE.get() {
            Some(f) => f(inputs[0], *op),
            None => Err(crate::Error::Distributed(
                "all_reduce: the default process group has not been initialized (call distributed::init_process_group first)".into(),
            )),
        },
        Op::To { dtype } => copy::cast(inputs[0], *dtype),
        Op::Contiguous => copy::contiguous(inputs[0]),
        Op::ViewDtype { dtype } => {
            // a copy, not an alias: graphs never write through a value
            let x = inputs[0];
            Tensor::from_bytes(*dtype, x.shape(), &x.to_bytes()?)
        }
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Clamp { .. } | Op::MaskedFill { .. } => {
            pointwise::eval(op, inputs, out)
        }
        Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::ArgMin { .. }
        | Op::Var { .. }
        | Op::Std { .. }
        | Op::Cumsum { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. } => reduce::eval(op, inputs, out),
        Op::Matmul | Op::Linear { .. } => linalg::eval(op, inputs, out),
        Op::Einsum { equation } => einsum::eval(equation, inputs, out),
        Op::Attention {
            has_mask,
            is_causal,
            scale,
        } => attention::eval(inputs, *has_mask, *is_causal, scale.map(|s| s.get()), out),
        Op::AttentionGrad {
            has_mask,
            is_causal,
            scale,
        } => attention_grad::eval(inputs, *has_mask, *is_causal, scale.map(|s| s.get()), out),
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
        | Op::Repeat { .. } => views::eval(op, inputs[0], out),
        Op::Cat { .. }
        | Op::Stack { .. }
        | Op::Flip { .. }
        | Op::Tril { .. }
        | Op::Triu { .. }
        | Op::IndexSelect { .. }
        | Op::Gather { .. }
        | Op::Scatter { .. }
        | Op::ScatterAdd { .. }
        | Op::ScatterReduce { .. }
        | Op::IndexAdd { .. }
        | Op::Embedding => index::eval(op, inputs, out),
        Op::Conv { .. }
        | Op::ConvInputGrad { .. }
        | Op::ConvWeightGrad { .. }
        | Op::MaxPool2d { .. }
        | Op::MaxPool2dGrad { .. }
        | Op::AvgPool2d { .. }
        | Op::AvgPool2dGrad { .. }
        | Op::AdaptiveAvgPool2d { .. }
        | Op::AdaptiveAvgPool2dGrad { .. }
        | Op::BatchNorm(_)
        | Op::Dropout { .. } => cnn::eval(op, inputs, out),
    }
}
