//! Shape, strides and offset: how a tensor's elements sit in its storage. Every view op is a
//! function from one layout to another; none of them touches data.

use crate::ir::op::{diagonal_len, narrow_range, select_index, slice_range};
use crate::ir::shape::{Shape, contiguous_strides, numel, wrap_dim};
use crate::{Result, bail};

/// Where a tensor's elements sit in its storage: shape, strides and offset.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Sizes.
    pub shape: Shape,
    /// In elements. Zero for broadcast (expanded) dims.
    pub strides: Vec<usize>,
    /// In elements, from the start of the storage.
    pub offset: usize,
}

impl Layout {
    /// The row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major contiguous, so the elements are `storage[offset..offset + numel]` in order.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true; // as in PyTorch: an empty tensor is contiguous whatever its strides
        }
        let mut expected = 1;
        for i in (0..self.ndim()).rev() {
            if self.shape[i] != 1 {
                if self.strides[i] != expected {
                    return false;
                }
                expected *= self.shape[i];
            }
        }
        true
    }

    /// One past the largest storage index this layout reaches (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&s, &st)| (s - 1) * st)
                .sum::<usize>()
            + 1
    }

    /// True if two different indices can reach the same element (a stride-0 dim of size > 1,
    /// or strides that overlap): in-place writes into such a layout are refused.
    pub fn has_internal_overlap(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|&(&s, _)| s > 1)
            .map(|(&s, &st)| (st, s))
            .collect();
        dims.sort_unstable();
        let mut reach = 0; // largest offset reachable by the dims seen so far
        for (stride, size) in dims {
            if stride == 0 || stride <= reach {
                return true;
            }
            reach += stride * (size - 1);
        }
        false
    }

    /// Dim `i` of the result is dim `dims[i]` of this layout (dims already wrapped).
    pub fn permute(&self, dims: &[usize]) -> Layout {
        Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        }
    }

    /// Dims `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        if l.ndim() > 0 {
            l.shape.swap(a, b);
            l.strides.swap(a, b);
        }
        l
    }

    /// Broadcast to `shape` (already checked by the shape rule): new and size-1 dims get stride 0.
    pub fn expand(&self, shape: &[usize]) -> Layout {
        let lead = shape.len() - self.ndim();
        let strides = (0..shape.len())
            .map(|i| {
                if i < lead || self.shape[i - lead] != shape[i] {
                    0
                } else {
                    self.strides[i - lead]
                }
            })
            .collect();
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    /// Strides of this layout read as `shape` broadcast to `out` (for kernels' index maps).
    pub fn broadcast_strides(&self, out: &[usize]) -> Vec<usize> {
        self.expand(out).strides
    }

    /// The size-1 dims among `dims` removed.
    pub fn squeeze(&self, dims: &[usize]) -> Layout {
        let keep = |i: usize| !(self.shape[i] == 1 && dims.contains(&i));
        Layout {
            shape: (0..self.ndim())
                .filter(|&i| keep(i))
                .map(|i| self.shape[i])
                .collect(),
            strides: (0..self.ndim())
                .filter(|&i| keep(i))
                .map(|i| self.strides[i])
                .collect(),
            offset: self.offset,
        }
    }

    /// A size-1 dim inserted at `dim` (already wrapped).
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let stride = if dim < l.ndim() {
            l.strides[dim] * l.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride);
        l
    }

    /// `length` indices of `dim` from `start` (as `torch.narrow`).
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Layout> {
        let (d, s) = narrow_range(&self.shape, dim, start, length)?;
        let mut l = self.clone();
        if length > 0 {
            l.offset += s * l.strides[d];
        }
        l.shape[d] = length as usize;
        Ok(l)
    }

    /// Index `index` of `dim`, the dim removed (as `torch.select`).
    pub fn select(&self, dim: i64, index: i64) -> Result<Layout> {
        let (d, i) = select_index(&self.shape, dim, index)?;
        let mut l = self.clone();
        l.offset += i * l.strides[d];
        l.shape.remove(d);
        l.strides.remove(d);
        Ok(l)
    }

    /// `x[start:end:step]` along `dim` (Python's clamped bounds).
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Layout> {
        let (d, s, len) = slice_range(&self.shape, dim, start, end, step)?;
        let mut l = self.clone();
        if len > 0 {
            l.offset += s * l.strides[d];
        }
        l.shape[d] = len;
        l.strides[d] *= step as usize;
        Ok(l)
    }

    /// The `offset` diagonal of the `dim1`/`dim2` planes as a last dim (as `torch.diagonal`).
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Layout> {
        // The shape rule validates the dims.
        crate::ir::op::diagonal_shape(&self.shape, offset, dim1, dim2)?;
        let (a, b) = (wrap_dim(dim1, self.ndim())?, wrap_dim(dim2, self.ndim())?);
        let len = diagonal_len(self.shape[a], self.shape[b], offset);
        let mut l = self.clone();
        if len > 0 {
            l.offset += if offset >= 0 {
                offset as usize * self.strides[b]
            } else {
                (-offset) as usize * self.strides[a]
            };
        }
        let diag_stride = self.strides[a] + self.strides[b];
        let keep: Vec<usize> = (0..self.ndim()).filter(|&i| i != a && i != b).collect();
        l.shape = keep.iter().map(|&i| self.shape[i]).collect();
        l.strides = keep.iter().map(|&i| self.strides[i]).collect();
        l.shape.push(len);
        l.strides.push(diag_stride);
        Ok(l)
    }

    /// The layout of `view(shape)` if the strides allow it without copying (PyTorch's
    /// `computeStride`): each group of old dims that merges or splits must be contiguous
    /// within itself.
    pub fn view(&self, shape: &[usize]) -> Option<Layout> {
        if self.numel() == 0 || self.ndim() == 0 {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        let mut new_strides = vec![0; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last()?;
        let mut tensor_numel = 1;
        let mut view_numel = 1;
        for tensor_d in (0..self.ndim()).rev() {
            tensor_numel *= self.shape[tensor_d];
            let chunk_ends = tensor_d == 0
                || (self.shape[tensor_d - 1] != 1
                    && self.strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = self.strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides: new_strides,
            offset: self.offset,
        })
    }
}

/// Refuses in-place writes into layouts whose elements alias, with PyTorch's message.
pub fn check_no_overlap(l: &Layout) -> Result<()> {
    if l.has_internal_overlap() {
        bail!(
            Value,
            "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation."
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_after_transpose_is_refused() {
        let l = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert!(!l.is_contiguous());
        assert!(l.view(&[6]).is_none());
        assert_eq!(l.view(&[3, 2]).unwrap().strides, vec![1, 3]);
        let c = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(c.view(&[6, 4]).unwrap().strides, vec![4, 1]);
        assert_eq!(c.view(&[2, 12]).unwrap().strides, vec![12, 1]);
        assert_eq!(c.view(&[2, 3, 2, 2]).unwrap().strides, vec![12, 4, 2, 1]);
    }

    #[test]
    fn overlap_and_extent() {
        let e = Layout::contiguous(&[3, 1]).expand(&[3, 4]);
        assert!(e.has_internal_overlap());
        assert!(
            !Layout::contiguous(&[3, 4])
                .transpose(0, 1)
                .has_internal_overlap()
        );
        assert_eq!(
            Layout::contiguous(&[3, 4])
                .narrow(1, 1, 2)
                .unwrap()
                .extent(),
            11
        );
    }
}
