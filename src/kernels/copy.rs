//! Copies and casts: the kernels behind `contiguous`, `to(dtype)` and `copy_`.

use crate::device::Device;
use crate::dispatch;
use crate::ir::dtype::DType;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::tensor::strided::map1;
use crate::{Result, bail};

/// `x` itself when already contiguous, else a contiguous copy.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    cast_new(x, x.dtype())
}

/// The elements of a CPU tensor in row-major order, `T` its dtype: what `Tensor::to_vec`
/// gives, for the kernels, which sit below the ops it goes through.
pub fn to_vec<T: Element>(t: &Tensor) -> Result<Vec<T>> {
    if T::DTYPE != t.dtype() {
        bail!(
            DType,
            "to_vec: tensor has dtype {} but {} was asked for",
            t.dtype(),
            T::DTYPE
        );
    }
    if t.device() != Device::Cpu {
        bail!(
            Device,
            "to_vec: kernels read CPU tensors, not {} ones",
            t.device()
        );
    }
    contiguous(t)?.with_slice(|s: &[T]| s.to_vec())
}

/// The elements converted to f64, as `Tensor::to_f64_vec` (empty when they cannot be read).
pub fn to_f64_vec(t: &Tensor) -> Vec<f64> {
    dispatch!(t.dtype(), T => to_vec::<T>(t)
        .map(|v| v.into_iter().map(Element::to_f64).collect())
        .unwrap_or_default())
}

/// The elements converted to i64, as `Tensor::to_i64_vec` (empty when they cannot be read).
pub fn to_i64_vec(t: &Tensor) -> Vec<i64> {
    dispatch!(t.dtype(), T => to_vec::<T>(t)
        .map(|v| v.into_iter().map(Element::to_i64).collect())
        .unwrap_or_default())
}

/// `x.to(dtype)`: `x` itself when the dtype already matches, as in PyTorch.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype && !x.is_wrapped_number() {
        return Ok(x.clone());
    }
    cast_new(x, dtype)
}

/// A new contiguous tensor holding `x` converted to `dtype`.
pub fn cast_new(x: &Tensor, dtype: DType) -> Result<Tensor> {
    let out = Tensor::alloc_for_overwrite(dtype, x.shape())?;
    copy_into(&out, x);
    Ok(out)
}

/// Writes `src`, broadcast to `dst`'s shape and converted to its dtype, into `dst`.
/// The caller has checked shapes, overlap and aliasing.
pub fn copy_into(dst: &Tensor, src: &Tensor) {
    let acc = access::lock(&[src], &[dst]);
    let src_strides = src.layout().broadcast_strides(dst.shape());
    if src.dtype() == dst.dtype() {
        // a plain copy: no conversion through f64 or i64 in the inner loop
        dispatch!(dst.dtype(), T => {
            // SAFETY: both layouts lie inside their storages and dst has no internal overlap.
            unsafe {
                map1::<T, T>(
                    dst.shape(),
                    (acc.write::<T>(0), dst.strides()),
                    (acc.read::<T>(0), &src_strides),
                    |a| a,
                )
            }
        });
        return;
    }
    dispatch!(dst.dtype(), O => dispatch!(src.dtype(), A => {
        // SAFETY: both layouts lie inside their storages and dst has no internal overlap.
        unsafe {
            map1::<A, O>(
                dst.shape(),
                (acc.write::<O>(0), dst.strides()),
                (acc.read::<A>(0), &src_strides),
                convert::<A, O>,
            )
        }
    }))
}

/// Element conversion with PyTorch's cast semantics (floats through f64, ints through i64).
#[inline(always)]
pub fn convert<A: Element, O: Element>(a: A) -> O {
    if A::DTYPE.is_float() || O::DTYPE.is_float() {
        if O::DTYPE.is_float() {
            O::from_f64(a.to_f64())
        } else if O::DTYPE == DType::Bool {
            O::from_i64((a.to_f64() != 0.0) as i64)
        } else {
            O::from_i64(a.to_f64() as i64)
        }
    } else {
        O::from_i64(a.to_i64())
    }
}

/// A copy of 4-D `x` in the channels_last memory format: NHWC in memory, `x`'s shape.
pub fn to_channels_last(x: &Tensor) -> Result<Tensor> {
    let s = x.shape();
    let nhwc = Tensor::alloc_for_overwrite(x.dtype(), &[s[0], s[2], s[3], s[1]])?;
    let out = nhwc.with_layout(nhwc.layout().permute(&[0, 3, 1, 2]));
    copy_into(&out, x);
    Ok(out)
}

/// A new tensor holding `x`'s values in `x`'s memory format (channels_last stays
/// channels_last; anything else becomes contiguous).
pub fn clone_format(x: &Tensor) -> Result<Tensor> {
    if x.dim() == 4 && super::conv::is_channels_last(x.shape(), x.strides()) {
        to_channels_last(x)
    } else {
        cast_new(x, x.dtype())
    }
}

/// [`to_f64_vec`] as a method, for the kernels' tests (`Tensor::to_f64_vec` goes through
/// ops, on the floor above).
#[cfg(test)]
pub(crate) trait F64s {
    /// The elements converted to f64.
    fn f64s(&self) -> Vec<f64>;
}

#[cfg(test)]
impl F64s for Tensor {
    fn f64s(&self) -> Vec<f64> {
        to_f64_vec(self)
    }
}
