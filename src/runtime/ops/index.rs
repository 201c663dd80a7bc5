//! Indexing methods on `Tensor`: concatenation, flips, triangles, gathers and scatters, and
//! the eager-only data-dependent ops (`masked_select`, `nonzero`, mask and integer-array
//! indexing, `sort`, `topk`). Every one of them returns a copy, never a view, as in PyTorch.

use crate::Result;
use crate::ir::dtype::Scalar;
use crate::ir::op::Op;
use crate::runtime::kernels::index as kern;
use crate::runtime::tensor::{Tensor, apply};

impl Tensor {
    /// `torch.cat(tensors, dim)`; mixed dtypes are promoted as in PyTorch.
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        apply(Op::Cat { dim }, tensors)
    }
    /// `torch.stack(tensors, dim)`: joins equal-shaped tensors along a new dim.
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        apply(Op::Stack { dim }, tensors)
    }
    /// Reverses the order of elements along `dims` (a copy).
    pub fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        apply(
            Op::Flip {
                dims: dims.to_vec(),
            },
            &[self],
        )
    }
    /// Lower triangle of the last two dims; elements above `diagonal` become zero.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        apply(Op::Tril { diagonal }, &[self])
    }
    /// Upper triangle of the last two dims; elements below `diagonal` become zero.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        apply(Op::Triu { diagonal }, &[self])
    }
    /// Slices along `dim` picked by a 1-D int32/int64 `index` (no negative indices).
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        apply(Op::IndexSelect { dim }, &[self, index])
    }
    /// `out[p] = self[p with p[dim] = index[p]]`, for an int64 `index`.
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        apply(Op::Gather { dim }, &[self, index])
    }
    /// A copy of `self` with `src[p]` written at `p with p[dim] = index[p]`. With repeated
    /// indices the last write in row-major order of `index` wins.
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        apply(Op::Scatter { dim }, &[self, index, src])
    }
    /// `torch.scatter(self, dim, index, value=value)`: `value` (cast to `self`'s dtype)
    /// written at `p with p[dim] = index[p]` for every position `p` of `index`.
    pub fn scatter_value(
        &self,
        dim: i64,
        index: &Tensor,
        value: impl Into<Scalar>,
    ) -> Result<Tensor> {
        let size: Vec<i64> = index.shape().iter().map(|&d| d as i64).collect();
        let src = apply(
            Op::To {
                dtype: self.dtype(),
            },
            &[&Tensor::wrapped(value.into())],
        )?;
        let src = apply(Op::Expand { size }, &[&src])?;
        self.scatter(dim, index, &src)
    }
    /// Like `scatter`, adding instead of writing (repeated indices accumulate).
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        apply(Op::ScatterAdd { dim }, &[self, index, src])
    }
    /// `torch.scatter_reduce(self, dim, index, src, reduce)` with `include_self=True`: a
    /// copy of `self` with every element of `src` combined into the element its index
    /// names along `dim` (`"sum"`, `"prod"`, `"mean"`, `"amax"` or `"amin"`).
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: &str,
    ) -> Result<Tensor> {
        let reduce = crate::ir::op::ScatterReduction::parse(reduce)?;
        apply(Op::ScatterReduce { dim, reduce }, &[self, index, src])
    }
    /// A copy of `self` with slice `i` of `source` along `dim` added to slice `index[i]`.
    pub fn index_add(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        apply(Op::IndexAdd { dim }, &[self, index, source])
    }
    /// `torch.nn.functional.embedding(index, weight)`: rows of a 2-D `weight`.
    pub fn embedding(index: &Tensor, weight: &Tensor) -> Result<Tensor> {
        apply(Op::Embedding, &[index, weight])
    }
    /// The elements where the bool `mask` (broadcast with `self`) is true, as a 1-D copy.
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        kern::masked_select(self, mask)
    }
    /// Indices of the nonzero elements: int64 of shape `[n, ndim]`.
    pub fn nonzero(&self) -> Result<Tensor> {
        kern::nonzero(self)
    }
    /// `self[mask]`: `mask` matches the leading dims of `self`; result `[n] + rest` (a copy).
    pub fn index_mask(&self, mask: &Tensor) -> Result<Tensor> {
        kern::index_mask(self, mask)
    }
    /// `self[idx]` along dim 0 for an integer `idx` of any shape (negatives count from the
    /// end): shape `idx.shape + self.shape[1..]`, a copy. A bool `idx` is a mask.
    pub fn index_tensor(&self, idx: &Tensor) -> Result<Tensor> {
        kern::index_tensor(self, idx)
    }
    /// Stable sort along `dim`: values and their int64 source positions. NaN sorts as the
    /// largest value.
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        kern::sort(self, dim, descending)
    }
    /// The `k` largest (or smallest) elements along `dim` and their positions. The result
    /// is sorted whatever `sorted` says (an order PyTorch allows).
    pub fn topk(
        &self,
        k: usize,
        dim: i64,
        largest: bool,
        sorted: bool,
    ) -> Result<(Tensor, Tensor)> {
        let _ = sorted;
        kern::topk(self, k, dim, largest)
    }
}
