//! Creation functions: `zeros`, `ones`, `full`, `arange` and their relatives.

use crate::ir::dtype::{DEFAULT_FLOAT, DType, Scalar};
use crate::ir::op::Op;
use crate::runtime::tensor::{Tensor, apply};
use crate::Result;

impl Tensor {
    /// A tensor of `size` filled with `value`; the dtype follows the value (float → f32,
    /// int → i64, bool → bool) unless given.
    pub fn full(size: &[usize], value: impl Into<Scalar>, dtype: Option<DType>) -> Result<Tensor> {
        apply(
            Op::Full {
                size: size.to_vec(),
                fill_value: value.into(),
                dtype,
            },
            &[],
        )
    }
    pub fn zeros(size: &[usize], dtype: DType) -> Tensor {
        crate::runtime::kernels::creation::full(
            &crate::ir::op::TensorType::new(dtype, size.to_vec()),
            Scalar::Int(0),
        )
    }
    pub fn ones(size: &[usize], dtype: DType) -> Tensor {
        crate::runtime::kernels::creation::full(
            &crate::ir::op::TensorType::new(dtype, size.to_vec()),
            Scalar::Int(1),
        )
    }
    /// Uninitialised in PyTorch; zero-filled here (reading garbage is not worth the risk).
    pub fn empty(size: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(size, dtype)
    }
    pub fn zeros_like(&self) -> Tensor {
        Tensor::zeros(self.shape(), self.dtype())
    }
    pub fn ones_like(&self) -> Tensor {
        Tensor::ones(self.shape(), self.dtype())
    }
    pub fn empty_like(&self) -> Tensor {
        Tensor::empty(self.shape(), self.dtype())
    }
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        Tensor::full(self.shape(), value, Some(self.dtype()))
    }
    /// `torch.arange(start, end, step)`: i64 when all three are integers, else f32.
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        dtype: Option<DType>,
    ) -> Result<Tensor> {
        apply(
            Op::Arange {
                start: start.into(),
                end: end.into(),
                step: step.into(),
                dtype,
            },
            &[],
        )
    }
    /// `torch.zeros` with the default float dtype.
    pub fn zeros_f32(size: &[usize]) -> Tensor {
        Tensor::zeros(size, DEFAULT_FLOAT)
    }
}
