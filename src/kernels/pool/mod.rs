//! 2-d pooling (max, average, adaptive average) and its gradients, on `[N, C, H, W]`
//! tensors in NCHW or channels_last (NHWC) order.
//!
//! Forward passes gather each output from its window, a row of outputs per task: in NCHW
//! one channel's row, computed tap by tap along the row; in NHWC every channel of the
//! row, the channels of a pixel (contiguous) handled together. Gradients scatter each
//! output's gradient into its window, per image and block of channels (a plane in NCHW),
//! so no two tasks write the same element and overlapping windows accumulate. The
//! gradient of max pooling finds each window's maximum again from `x`.
//!
//! Max pooling keeps the input's dtype (floats and integers); the gradient of max pooling
//! goes to the window's first maximal element, a NaN counting as larger than anything (as
//! PyTorch: `v > max || isnan(v)`, so among several NaNs the last one). Average pooling
//! and the gradients compute in f64 for f64 and in f32 for f32, f16 and bf16.

use super::conv::{
    Acc, compute_type, dense, dense_strides, prefers_nhwc, produce, run_chunks, valid_range,
    with_elements, with_elements2,
};
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::tensor::Tensor;
use crate::tensor::element::Element;
use crate::tensor::strided::SendPtr;
use crate::tensor::threads;
use crate::{Result, bail, dispatch};

/// Below this many element visits a pooling kernel runs on the calling thread.
const PAR_WORK: usize = 1 << 15;

pub use crate::ir::conv::PoolGeometry;

mod avg;
mod max;
#[cfg(test)]
mod tests;

pub use avg::{adaptive_avg_pool2d, adaptive_avg_pool2d_backward, avg_pool2d, avg_pool2d_backward};
pub use max::{max_pool2d, max_pool2d_backward};

/// Sizes of one pooling, and the order of its dense buffers.
#[derive(Clone, Copy, Debug)]
struct Plan {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    nhwc: bool,
}

impl Plan {
    fn in_strides(&self) -> [usize; 4] {
        dense_strides(self.nhwc, self.c, self.h, self.w)
    }
    fn out_strides(&self) -> [usize; 4] {
        dense_strides(self.nhwc, self.c, self.oh, self.ow)
    }
    /// Plane (`n`, `c`) of a dense NCHW buffer of the input's size.
    fn plane<'a, T>(&self, x: &'a [T], n: usize, c: usize) -> &'a [T] {
        let size = self.h * self.w;
        &x[(n * self.c + c) * size..(n * self.c + c + 1) * size]
    }
    /// Where channel `c0` of pixel (`h`, `w`) of image `n` is in a dense buffer of strides `s`.
    fn at(s: [usize; 4], n: usize, c0: usize, h: usize, w: usize) -> usize {
        n * s[0] + c0 * s[1] + h * s[2] + w * s[3]
    }
}

/// Checks that `input` and `output` are 4-d with the same batch and channels.
fn plan(op: &str, input: &[usize], output: &[usize], nhwc: bool) -> Result<Plan> {
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

fn check_geometry(op: &str, geo: &PoolGeometry) -> Result<()> {
    if geo.kernel.contains(&0) || geo.stride.contains(&0) || geo.dilation.contains(&0) {
        bail!(
            Value,
            "{op}: kernel size, stride and dilation must be positive, got {geo:?}"
        );
    }
    Ok(())
}

/// How many chunks `work` element visits are cut into: one when it is small.
fn chunks_for(work: usize) -> usize {
    if work < PAR_WORK {
        1
    } else {
        threads::available().saturating_mul(8)
    }
}

/// A function of one row of outputs, `(n, c, oh, dst)`: `dst` holds the OW outputs of
/// channel `c` (NCHW), or the OW·C outputs of every channel (NHWC, `c` = 0), of output row
/// `oh` of image `n`.
type Row<'a, O> = dyn Fn(usize, usize, usize, &mut [O]) + Sync + 'a;

/// Runs `row` for every row of outputs, in parallel: per (image, channel, output row) in
/// NCHW, per (image, output row) in NHWC.
fn for_rows<O: Copy + Send + Sync>(p: &Plan, y: &mut [O], work: usize, row: &Row<'_, O>) {
    let chunk = if p.nhwc { p.ow * p.c } else { p.ow };
    if chunk == 0 || y.is_empty() {
        return;
    }
    let yp = SendPtr(y.as_mut_ptr());
    run_chunks(y.len() / chunk, chunks_for(work), &|_, lo, hi| {
        for t in lo..hi {
            // SAFETY: row t of y is this task's alone.
            let part = unsafe { std::slice::from_raw_parts_mut(yp.get().add(t * chunk), chunk) };
            let (outer, oh) = (t / p.oh, t % p.oh);
            if p.nhwc {
                row(outer, 0, oh, part);
            } else {
                row(outer / p.c, outer % p.c, oh, part);
            }
        }
    });
}

/// Runs `f(n, c0, c1)` for every image and block of channels `c0..c1`: one channel in
/// NCHW, blocks sized to give every thread work in NHWC.
fn for_blocks(p: &Plan, work: usize, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    let cb = if p.nhwc {
        let per_image = (threads::available() * 4).div_ceil(p.n.max(1));
        p.c.div_ceil(per_image.clamp(1, p.c.max(1))).max(1)
    } else {
        1
    };
    let blocks = p.c.div_ceil(cb);
    run_chunks(p.n * blocks, chunks_for(work), &|_, lo, hi| {
        for t in lo..hi {
            let (ni, b) = (t / blocks, t % blocks);
            f(ni, b * cb, p.c.min(b * cb + cb));
        }
    });
}
