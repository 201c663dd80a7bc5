//! Movement methods on `Tensor`. All of them return views (shared storage, no copy) except
//! `reshape` of a layout that cannot be viewed, `contiguous` of a non-contiguous tensor,
//! and `repeat`.

use crate::ir::op::Op;
use crate::ir::shape::wrap_dim;
use crate::runtime::tensor::{Dim, Tensor, apply};
use crate::{Result, bail};

fn ishape<D: Dim>(shape: &[D]) -> Vec<i64> {
    shape.iter().map(|d| d.to_i64()).collect()
}

impl Tensor {
    /// A view with another shape (one dim may be -1). Fails, as in PyTorch, when the strides
    /// do not allow it (after `transpose`, say): use `reshape` or `contiguous().view`.
    pub fn view<D: Dim>(&self, shape: &[D]) -> Result<Tensor> {
        apply(
            Op::View {
                shape: ishape(shape),
            },
            &[self],
        )
    }
    /// A view when the strides allow it, else a contiguous copy.
    pub fn reshape<D: Dim>(&self, shape: &[D]) -> Result<Tensor> {
        apply(
            Op::Reshape {
                shape: ishape(shape),
            },
            &[self],
        )
    }
    /// Dims `dim0` and `dim1` swapped (a view).
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        apply(Op::Transpose { dim0, dim1 }, &[self])
    }
    /// Transpose of a tensor with at most 2 dims.
    pub fn t(&self) -> Result<Tensor> {
        apply(Op::T, &[self])
    }
    /// The dims reordered: dim `i` of the result is dim `dims[i]` (a view).
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        apply(
            Op::Permute {
                dims: dims.to_vec(),
            },
            &[self],
        )
    }
    /// Broadcast view with stride 0 along new or size-1 dims; -1 keeps a size. No copy.
    pub fn expand<D: Dim>(&self, size: &[D]) -> Result<Tensor> {
        apply(Op::Expand { size: ishape(size) }, &[self])
    }
    /// `expand` to `other`'s shape.
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        let size: Vec<i64> = other.shape().iter().map(|&s| s as i64).collect();
        self.expand(&size)
    }
    /// Drops every dim of size 1.
    pub fn squeeze(&self) -> Result<Tensor> {
        apply(Op::Squeeze { dim: None }, &[self])
    }
    /// Drops `dim` if its size is 1.
    pub fn squeeze_dim(&self, dim: i64) -> Result<Tensor> {
        apply(
            Op::Squeeze {
                dim: Some(vec![dim]),
            },
            &[self],
        )
    }
    /// A size-1 dim inserted at `dim` (a view).
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        apply(Op::Unsqueeze { dim }, &[self])
    }
    /// Dims `start_dim..=end_dim` merged into one (a copy only when the strides require one).
    pub fn flatten(&self, start_dim: i64, end_dim: i64) -> Result<Tensor> {
        apply(Op::Flatten { start_dim, end_dim }, &[self])
    }
    /// `length` elements of `dim` from `start` (a view).
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Tensor> {
        apply(Op::Narrow { dim, start, length }, &[self])
    }
    /// Removes `dim` by taking the element at `index` along it (`x[:, i]`).
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        apply(Op::Select { dim, index }, &[self])
    }
    /// Python slicing along one dim: `x[start:end:step]`, with `None` for an open bound.
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        apply(
            Op::Slice {
                dim,
                start,
                end,
                step,
            },
            &[self],
        )
    }
    /// The `offset` diagonal of the `dim1`/`dim2` planes, as a last dim (a view).
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        apply(Op::Diagonal { offset, dim1, dim2 }, &[self])
    }
    /// Itself when contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        // through `apply`, so tracing records the copy
        apply(Op::Contiguous, &[self])
    }
    /// Tiles the data (copies, unlike `expand`).
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        apply(
            Op::Repeat {
                repeats: repeats.to_vec(),
            },
            &[self],
        )
    }
    /// Views of each slice along `dim`.
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        let d = wrap_dim(dim, self.dim())?;
        if self.dim() == 0 {
            bail!(
                Index,
                "Dimension specified as 0 but tensor has no dimensions"
            );
        }
        (0..self.shape()[d] as i64)
            .map(|i| self.select(d as i64, i))
            .collect()
    }
    /// `chunks` views along `dim`, each of size `ceil(n / chunks)` but the last.
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            bail!(Value, "chunk expects `chunks` to be greater than 0, got: 0");
        }
        let n = self.size(dim)?;
        let each = n.div_ceil(chunks).max(1);
        self.split(each, dim)
    }
    /// Views of `split_size` elements along `dim` (the last may be shorter).
    pub fn split(&self, split_size: usize, dim: i64) -> Result<Vec<Tensor>> {
        let n = self.size(dim)?;
        if split_size == 0 && n > 0 {
            bail!(
                Value,
                "split_size can only be 0 if dimension size is 0, but got dimension size of {n}"
            );
        }
        if n == 0 {
            return Ok(vec![self.clone()]);
        }
        (0..n)
            .step_by(split_size)
            .map(|s| self.narrow(dim, s as i64, split_size.min(n - s) as i64))
            .collect()
    }
    /// Views of the given sizes along `dim` (`torch.split` with a list).
    pub fn split_sizes(&self, sizes: &[usize], dim: i64) -> Result<Vec<Tensor>> {
        let n = self.size(dim)?;
        if sizes.iter().sum::<usize>() != n {
            bail!(
                Shape,
                "split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at dimension {dim}), but got split_sizes={sizes:?}"
            );
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let v = self.narrow(dim, start as i64, s as i64);
                start += s;
                v
            })
            .collect()
    }
}
