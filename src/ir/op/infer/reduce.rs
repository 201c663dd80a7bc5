//! Shape and dtype inference of the reductions and the ops along one dim: sums and extrema, `argmax`, `var`, `cumsum`, `softmax`.

use super::check_arity;
use crate::ir::dtype::DType;
use crate::ir::op::{Op, ReduceOp, TensorType, not_implemented};
use crate::ir::shape::{reduced_shape, reduction_dims, wrap_dim};
use crate::{Result, bail};

/// The result type of a reduction op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::Reduce { op, dim, keepdim } => {
            one(1)?;
            let x = inputs[0];
            if *op == ReduceOp::Prod
                && let Some(d) = dim
                && d.len() > 1
            {
                bail!(Value, "prod(): dim must be a single int, got {d:?}");
            }
            let dims = reduction_dims(dim, x.ndim())?;
            if matches!(op, ReduceOp::Amax | ReduceOp::Amin) {
                for &d in &dims {
                    if x.shape[d] == 0 {
                        bail!(
                            Shape,
                            "{}(): Expected reduction dim {d} to have non-zero size.",
                            op.name()
                        );
                    }
                }
            }
            out(
                op.out_dtype(x.dtype)?,
                reduced_shape(&x.shape, &dims, *keepdim),
            )
        }
        Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => {
            one(1)?;
            let x = inputs[0];
            if x.dtype.is_bool() {
                return Err(not_implemented(name, x.dtype));
            }
            match dim {
                None => {
                    if x.numel() == 0 {
                        bail!(
                            Shape,
                            "{name}(): Expected reduction dim to be specified for input.numel() == 0."
                        );
                    }
                    let shape = if *keepdim { vec![1; x.ndim()] } else { vec![] };
                    out(DType::I64, shape)
                }
                Some(d) => {
                    let d = wrap_dim(*d, x.ndim())?;
                    if x.ndim() > 0 && x.shape[d] == 0 {
                        bail!(
                            Shape,
                            "{name}(): Expected reduction dim {d} to have non-zero size."
                        );
                    }
                    let dims: Vec<usize> = if x.ndim() == 0 { vec![] } else { vec![d] };
                    out(DType::I64, reduced_shape(&x.shape, &dims, *keepdim))
                }
            }
        }
        Op::Var { dim, keepdim, .. } | Op::Std { dim, keepdim, .. } => {
            one(1)?;
            let x = inputs[0];
            if !x.dtype.is_float() {
                bail!(
                    DType,
                    "std and var only support floating point and complex dtypes"
                );
            }
            let dims = reduction_dims(dim, x.ndim())?;
            out(x.dtype, reduced_shape(&x.shape, &dims, *keepdim))
        }
        Op::Cumsum { dim } => {
            one(1)?;
            let x = inputs[0];
            wrap_dim(*dim, x.ndim())?;
            let d = if x.dtype.is_float() {
                x.dtype
            } else {
                DType::I64
            };
            out(d, x.shape.clone())
        }
        Op::Softmax { dim } | Op::LogSoftmax { dim } => {
            one(1)?;
            let x = inputs[0];
            wrap_dim(*dim, x.ndim())?;
            if !x.dtype.is_float() {
                return Err(not_implemented(name, x.dtype));
            }
            out(x.dtype, x.shape.clone())
        }
        _ => unreachable!("{name} is not a reduction op"),
    }
}
