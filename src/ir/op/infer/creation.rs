//! Shape and dtype inference of the leaf ops: scalars, constants, `full` and `arange`.

use super::check_arity;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::{arange_len, numel};
use crate::{Result, bail};

/// The result type of a leaf op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::Scalar(s) => {
            one(0)?;
            let dtype = match s {
                Scalar::Bool(_) => DType::Bool,
                Scalar::Int(_) => DType::I64,
                Scalar::Float(_) => DType::F64,
            };
            Ok(TensorType {
                dtype,
                shape: vec![],
                wrapped: true,
            })
        }
        Op::Constant(lit) => {
            one(0)?;
            if lit.bytes.len() != numel(&lit.shape) * lit.dtype.size() {
                bail!(
                    Value,
                    "constant: {} bytes do not fill a {} tensor of shape {:?}",
                    lit.bytes.len(),
                    lit.dtype,
                    lit.shape
                );
            }
            out(lit.dtype, lit.shape.clone())
        }
        Op::Full {
            size,
            fill_value,
            dtype,
        } => {
            one(0)?;
            let d = dtype.unwrap_or(match fill_value {
                Scalar::Bool(_) => DType::Bool,
                Scalar::Int(_) => DType::I64,
                Scalar::Float(_) => crate::ir::dtype::DEFAULT_FLOAT,
            });
            out(d, size.clone())
        }
        Op::Arange {
            start,
            end,
            step,
            dtype,
        } => {
            one(0)?;
            let len = arange_len(*start, *end, *step)?;
            let any_float = start.is_float() || end.is_float() || step.is_float();
            let d = dtype.unwrap_or(if any_float {
                crate::ir::dtype::DEFAULT_FLOAT
            } else {
                DType::I64
            });
            out(d, vec![len])
        }
        _ => unreachable!("{name} is not a leaf op"),
    }
}
