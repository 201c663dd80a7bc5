//! Shape and dtype inference of the products: `matmul`, `linear` and `einsum`.

use super::check_arity;
use crate::ir::op::{Op, TensorType, not_implemented};
use crate::ir::shape::{Shape, broadcast_shapes, matmul_shape};
use crate::{Error, Result, bail};

/// The result type of a product op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::Matmul => {
            one(2)?;
            matmul_type(inputs[0], inputs[1])
        }
        Op::Linear { has_bias } => {
            one(2 + *has_bias as usize)?;
            let (x, w) = (inputs[0], inputs[1]);
            if w.ndim() != 2 && w.ndim() != 1 {
                bail!(
                    Shape,
                    "linear(): weight must be 1-D or 2-D, got {}-D",
                    w.ndim()
                );
            }
            let wt_shape: Shape = w.shape.iter().rev().copied().collect();
            let t = matmul_type(x, &TensorType::new(w.dtype, wt_shape))?;
            if *has_bias {
                let b = inputs[2];
                if b.dtype != t.dtype {
                    bail!(
                        DType,
                        "expected m1 and bias to have the same dtype, but got: {} != {}",
                        t.dtype.scalar_name(),
                        b.dtype.scalar_name()
                    );
                }
                let shape = broadcast_shapes(&t.shape, &b.shape)?;
                if shape != t.shape {
                    bail!(
                        Shape,
                        "linear(): bias of shape {:?} does not broadcast to the output shape {:?}",
                        b.shape,
                        t.shape
                    );
                }
            }
            Ok(t)
        }
        Op::Einsum { equation } => {
            let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.shape[..]).collect();
            let plan = crate::ir::einsum::EinsumSpec::parse(equation, &shapes)?;
            let mut d = inputs.first().map(|t| t.dtype).ok_or_else(|| {
                Error::Value("einsum(): must provide at least one operand".into())
            })?;
            for t in &inputs[1..] {
                if t.dtype != d {
                    bail!(
                        DType,
                        "einsum(): expected all operands to have the same dtype, but got {} and {}",
                        d.scalar_name(),
                        t.dtype.scalar_name()
                    );
                }
                d = t.dtype;
            }
            out(d, plan.output_shape())
        }
        _ => unreachable!("{name} is not a product op"),
    }
}

/// Shape of `matmul(a, b)` with PyTorch's rules for 1-D, 2-D and batched operands.
pub fn matmul_type(a: &TensorType, b: &TensorType) -> Result<TensorType> {
    if a.dtype != b.dtype {
        bail!(
            DType,
            "expected m1 and m2 to have the same dtype, but got: {} != {}",
            a.dtype.scalar_name(),
            b.dtype.scalar_name()
        );
    }
    if a.dtype.is_bool() {
        return Err(not_implemented("matmul", a.dtype));
    }
    Ok(TensorType::new(a.dtype, matmul_shape(&a.shape, &b.shape)?))
}
