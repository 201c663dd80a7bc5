//! Creation functions: `zeros`, `ones`, `full`, `arange` and their relatives.

use crate::Result;
use crate::dispatch;
use crate::ir::dtype::{DEFAULT_FLOAT, DType, Scalar};
use crate::ir::op::Op;
use crate::runtime::element::{Element, round_to_dtype};
use crate::runtime::layout::Layout;
use crate::runtime::storage::Storage;
use crate::runtime::tensor::{Tensor, apply};
use std::sync::Arc;

/// `zeros`/`ones`: the convenience constructors that cannot return an error.
fn filled(size: &[usize], dtype: DType, value: i64) -> Tensor {
    let ty = crate::ir::op::TensorType::new(dtype, size.to_vec());
    crate::runtime::kernels::creation::full(&ty, Scalar::Int(value))
        .unwrap_or_else(|e| panic!("a tensor of shape {size:?} and dtype {dtype}: {e}"))
}

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
    /// A tensor of zeros.
    ///
    /// # Panics
    /// When memory cannot hold it, as `vec![0; n]` does; [`Tensor::full`] returns that case
    /// as an error.
    pub fn zeros(size: &[usize], dtype: DType) -> Tensor {
        filled(size, dtype, 0)
    }
    /// A tensor of ones; panics where [`Tensor::zeros`] does.
    pub fn ones(size: &[usize], dtype: DType) -> Tensor {
        filled(size, dtype, 1)
    }
    /// Uninitialised in PyTorch; zero-filled here (reading garbage is not worth the risk).
    pub fn empty(size: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(size, dtype)
    }
    /// `torch.zeros_like`: zeros of this shape and dtype.
    pub fn zeros_like(&self) -> Tensor {
        Tensor::zeros(self.shape(), self.dtype())
    }
    /// `torch.ones_like`: ones of this shape and dtype.
    pub fn ones_like(&self) -> Tensor {
        Tensor::ones(self.shape(), self.dtype())
    }
    /// `torch.empty_like` (zero-filled, as [`Tensor::empty`]).
    pub fn empty_like(&self) -> Tensor {
        Tensor::empty(self.shape(), self.dtype())
    }
    /// `torch.full_like`: `value` in this shape and dtype.
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

    /// `torch.linspace`: `steps` values from `start` to `end`, f32 unless a dtype is given.
    /// As in PyTorch, the first half counts up from `start` and the second half down from
    /// `end`, so the last value is exactly `end`; integer dtypes truncate.
    pub fn linspace(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        steps: usize,
        dtype: Option<DType>,
    ) -> Result<Tensor> {
        let dtype = dtype.unwrap_or(DEFAULT_FLOAT);
        // PyTorch converts the bounds to the output dtype before computing the step.
        let s = round_to_dtype(start.into().to_f64(), dtype);
        let e = round_to_dtype(end.into().to_f64(), dtype);
        let step = if steps > 1 {
            (e - s) / (steps - 1) as f64
        } else {
            0.0
        };
        let half = steps / 2;
        let value = |i: usize| {
            if steps == 1 || i < half {
                s + step * i as f64
            } else {
                e - step * (steps - 1 - i) as f64
            }
        };
        Ok(dispatch!(dtype, T => {
            Tensor::from_data((0..steps).map(|i| T::from_f64(value(i))).collect::<Vec<T>>(), &[steps])
        }))
    }

    /// `torch.eye(n, m)`: ones on the main diagonal of an `n × m` matrix (`m` defaults to
    /// `n`), f32 unless a dtype is given.
    pub fn eye(n: usize, m: Option<usize>, dtype: Option<DType>) -> Result<Tensor> {
        let m = m.unwrap_or(n);
        let t = Tensor::zeros(&[n, m], dtype.unwrap_or(DEFAULT_FLOAT));
        if t.numel() == 0 {
            return Ok(t);
        }
        dispatch!(t.dtype(), T => t.with_slice_mut::<T, _>(|s| {
            for i in 0..n.min(m) {
                s[i * m + i] = T::from_i64(1);
            }
        }))?;
        Ok(t)
    }

    /// A contiguous tensor adopting `data`, whose length the caller made the product of
    /// `size`.
    pub(crate) fn from_data<T: Element>(data: Vec<T>, size: &[usize]) -> Tensor {
        debug_assert_eq!(data.len(), size.iter().product::<usize>());
        Tensor::from_parts(Arc::new(Storage::from_vec(data)), Layout::contiguous(size))
    }
}
