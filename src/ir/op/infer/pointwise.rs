//! Shape and dtype inference of the pointwise ops: unary, binary, `where`, `clamp`, `to` and `masked_fill`.

use super::check_arity;
use crate::ir::dtype::{DType, PromoteArg, result_type};
use crate::ir::op::{Op, TensorType, not_implemented};
use crate::ir::shape::{broadcast_all, broadcast_shapes};
use crate::{Result, bail};

/// The result type of a pointwise op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::Unary(u) => {
            one(1)?;
            out(u.out_dtype(inputs[0].dtype)?, inputs[0].shape.clone())
        }
        Op::Binary(b) => {
            one(2)?;
            let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
            out(b.out_dtype(inputs[0], inputs[1])?, shape)
        }
        Op::Where => {
            one(3)?;
            if inputs[0].dtype != DType::Bool {
                bail!(
                    DType,
                    "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
                    inputs[0].dtype.scalar_name()
                );
            }
            let shape = broadcast_all(&[&inputs[0].shape, &inputs[1].shape, &inputs[2].shape])?;
            let d = result_type(&[inputs[1].promote_arg(), inputs[2].promote_arg()]);
            out(d, shape)
        }
        Op::Clamp { min, max } => {
            one(1)?;
            if min.is_none() && max.is_none() {
                bail!(
                    Value,
                    "torch.clamp: At least one of 'min' or 'max' must not be None"
                );
            }
            let x = inputs[0];
            if x.dtype.is_bool() {
                return Err(not_implemented("clamp", x.dtype));
            }
            let mut args = vec![x.promote_arg()];
            for s in [min, max].into_iter().flatten() {
                args.push(PromoteArg {
                    dtype: s.dtype(),
                    zero_dim: true,
                    wrapped: true,
                });
            }
            out(result_type(&args), x.shape.clone())
        }
        Op::To { dtype } => {
            one(1)?;
            out(*dtype, inputs[0].shape.clone())
        }
        Op::ViewDtype { dtype } => {
            one(1)?;
            let from = inputs[0].dtype;
            if from.size() != dtype.size() {
                bail!(
                    DType,
                    "view(dtype): smelt reads bytes only as a dtype of the same size, {} is {} bytes and {} is {}",
                    from,
                    from.size(),
                    dtype,
                    dtype.size()
                );
            }
            out(*dtype, inputs[0].shape.clone())
        }
        Op::MaskedFill { .. } => {
            one(2)?;
            if inputs[1].dtype != DType::Bool {
                bail!(
                    DType,
                    "masked_fill_ only supports boolean masks, but got mask with dtype {}",
                    inputs[1].dtype.scalar_name()
                );
            }
            let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
            out(inputs[0].dtype, shape)
        }
        _ => unreachable!("{name} is not a pointwise op"),
    }
}
