//! Stub: PyTorch-style repr, filled in by its owner.

use super::tensor::Tensor;
use std::fmt;

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor(shape={:?}, dtype={})", self.shape(), self.dtype().torch_name())
    }
}
