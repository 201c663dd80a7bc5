//! Reading a tensor's elements out: `to_vec`, `item` and their f64/i64 forms. They live
//! above the tensor core because a view is made contiguous with `contiguous()` and a GPU
//! tensor is copied to the host with `cpu()`, both ops.

use crate::device::Device;
use crate::kernels::copy;
use crate::runtime::element::Element;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};

impl Tensor {
    /// The elements in row-major order. `T` must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            bail!(
                DType,
                "to_vec: tensor has dtype {} but {} was asked for",
                self.dtype(),
                T::DTYPE
            );
        }
        if self.device() != Device::Cpu {
            return self.cpu()?.to_vec();
        }
        // made contiguous by the op (a trace or the profiler sees it), read by the kernel's
        // reader
        copy::to_vec(&self.contiguous()?)
    }

    /// The elements converted to f64 (exact for every dtype but large i64), or the error
    /// that kept them from being read (a tensor on a GPU that is gone).
    pub fn try_to_f64_vec(&self) -> Result<Vec<f64>> {
        crate::dispatch!(self.dtype(), T => self
            .to_vec::<T>()
            .map(|v| v.into_iter().map(Element::to_f64).collect()))
    }

    /// The elements converted to f64 (exact for every dtype but large i64); empty when they
    /// cannot be read, which [`Tensor::try_to_f64_vec`] reports instead.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        crate::dispatch!(self.dtype(), T => self
            .to_vec::<T>()
            .map(|v| v.into_iter().map(Element::to_f64).collect())
            .unwrap_or_default())
    }

    /// The elements converted to i64.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        crate::dispatch!(self.dtype(), T => self
            .to_vec::<T>()
            .map(|v| v.into_iter().map(Element::to_i64).collect())
            .unwrap_or_default())
    }

    /// The value of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            bail!(
                Value,
                "a Tensor with {} elements cannot be converted to Scalar",
                self.numel()
            );
        }
        self.to_vec::<T>().map(|v| v[0])
    }

    /// The value of a one-element tensor as f64, whatever its dtype.
    pub fn item_f64(&self) -> Result<f64> {
        if self.numel() != 1 {
            bail!(
                Value,
                "a Tensor with {} elements cannot be converted to Scalar",
                self.numel()
            );
        }
        Ok(self.to_f64_vec()[0])
    }
}
