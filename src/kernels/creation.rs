//! Leaf ops: wrapped scalars, captured constants, `full` and `arange`.

use crate::Result;
use crate::dispatch;
use crate::ir::dtype::Scalar;
use crate::ir::op::{Op, TensorType};
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;

/// A scalar converted to `T` with cast semantics.
#[inline]
pub fn scalar_to<T: Element>(s: Scalar) -> T {
    match s {
        Scalar::Float(f) => T::from_f64(f),
        Scalar::Int(i) => T::from_i64(i),
        Scalar::Bool(b) => T::from_i64(b as i64),
    }
}

/// Evaluates a leaf op (`scalar`, `constant`, `full`, `arange`) of type `out`.
pub fn eval(op: &Op, out: &TensorType) -> Result<Tensor> {
    Ok(match op {
        Op::Scalar(s) => Tensor::wrapped(*s),
        Op::Constant(lit) => {
            let t = Tensor::alloc(out.dtype, &out.shape)?;
            let acc = access::lock(&[], &[&t]);
            // SAFETY: the shape rule checked that the literal has exactly numel * size bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    lit.bytes.as_ptr(),
                    acc.write::<u8>(0),
                    lit.bytes.len(),
                )
            };
            drop(acc);
            t
        }
        Op::Full { fill_value, .. } => full(out, *fill_value)?,
        Op::Arange { start, step, .. } => {
            let t = Tensor::alloc(out.dtype, &out.shape)?;
            let float_math = out.dtype.is_float() || start.is_float() || step.is_float();
            dispatch!(out.dtype, T => t.with_slice_mut::<T, _>(|s| {
                for (i, v) in s.iter_mut().enumerate() {
                    *v = if float_math {
                        T::from_f64(start.to_f64() + i as f64 * step.to_f64())
                    } else {
                        T::from_i64(start.to_i64() + i as i64 * step.to_i64())
                    };
                }
            }))?;
            t
        }
        _ => unreachable!("creation::eval called with {}", op.name()),
    })
}

/// A contiguous tensor of `ty` filled with `value`.
pub fn full(ty: &TensorType, value: Scalar) -> Result<Tensor> {
    let t = Tensor::alloc(ty.dtype, &ty.shape)?;
    dispatch!(ty.dtype, T => {
        let v = scalar_to::<T>(value);
        // the allocation is zeroed; -0.0 equals zero but must still be written
        if Element::to_f64(v).to_bits() != 0 {
            let acc = access::lock(&[], &[&t]);
            // SAFETY: freshly allocated contiguous tensor of numel elements.
            unsafe { std::slice::from_raw_parts_mut(acc.write::<T>(0), t.numel()) }.fill(v);
        }
    });
    Ok(t)
}
