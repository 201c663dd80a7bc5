//! 2-d pooling (max, average, adaptive average) and its gradients on `[N, C, H, W]`
//! tensors in NCHW or channels_last (NHWC) order: the shapes checked, the operands made
//! dense in the compute dtype and the order the kernels read, then the kernels of
//! `smelt_rt::pool` (shared with compiled models), and the result presented in its layout.
//!
//! Max pooling keeps the input's dtype (floats and integers); the gradient of max pooling
//! goes to the window's first maximal element, a NaN counting as larger than anything (as
//! PyTorch: `v > max || isnan(v)`, so among several NaNs the last one). Average pooling
//! and the gradients compute in f64 for f64 and in f32 for f32, f16 and bf16.

use super::conv::{Acc, compute_type, dense, prefers_nhwc, produce, with_elements, with_elements2};
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::tensor::Tensor;
use crate::tensor::element::Element;
use crate::{Result, bail, dispatch};
use smelt_rt::pool::{self as rt, Plan};

pub use crate::ir::conv::PoolGeometry;

mod avg;
mod max;
#[cfg(test)]
mod tests;

pub use avg::{adaptive_avg_pool2d, adaptive_avg_pool2d_backward, avg_pool2d, avg_pool2d_backward};
pub use max::{max_pool2d, max_pool2d_backward};

/// Checks that `input` and `output` are 4-d with the same batch and channels.
pub(crate) fn plan(op: &str, input: &[usize], output: &[usize], nhwc: bool) -> Result<Plan> {
    if input.len() != 4 || output.len() != 4 || input[..2] != output[..2] {
        bail!(
            Shape,
            "{op}: expected 4-d input and output with the same batch and channels, got {input:?} and {output:?}"
        );
    }
    Ok(Plan {
        n: input[0],
        c: input[1],
        h: input[2],
        w: input[3],
        oh: output[2],
        ow: output[3],
        nhwc,
    })
}

/// `geo` as the kernels take it, once its sizes are checked.
pub(crate) fn geometry(op: &str, geo: &PoolGeometry) -> Result<rt::Geometry> {
    if geo.kernel.contains(&0) || geo.stride.contains(&0) || geo.dilation.contains(&0) {
        bail!(
            Value,
            "{op}: kernel size, stride and dilation must be positive, got {geo:?}"
        );
    }
    Ok(rt::Geometry {
        kernel: geo.kernel,
        stride: geo.stride,
        padding: geo.padding,
        dilation: geo.dilation,
    })
}
