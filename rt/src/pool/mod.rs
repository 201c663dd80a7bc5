//! 2-d pooling (max, average, adaptive average) and its gradients on dense slices, in NCHW
//! or NHWC order: the kernels eager tensors, the JIT and ahead-of-time models all run.
//!
//! Forward passes gather each output from its window, a row of outputs per task: in NCHW
//! one channel's row, computed tap by tap along the row; in NHWC every channel of the
//! row, the channels of a pixel (contiguous) handled together. Gradients scatter each
//! output's gradient into its window, per image and block of channels (a plane in NCHW),
//! so no two tasks write the same element and overlapping windows accumulate. The
//! gradient of max pooling finds each window's maximum again from `x`.
//!
//! Max pooling keeps the input's element type (floats and integers); the gradient of max
//! pooling goes to the window's first maximal element, a NaN counting as larger than
//! anything (as PyTorch: `v > max || isnan(v)`, so among several NaNs the last one).
//! Average pooling and the gradients compute in f64 for f64 and in f32 otherwise.

mod avg;
mod max;

pub use crate::conv::Real;
use crate::conv::valid_range;
use crate::threads::{SendPtr, available, run_chunks};
pub use avg::{
    adaptive_backward as adaptive_avg_backward, adaptive_forward as adaptive_avg_forward,
    backward as avg_backward, forward as avg_forward,
};
pub use max::{backward as max_backward, forward as max_forward};

/// Below this many element visits a pooling kernel runs on the calling thread.
const PAR_WORK: usize = 1 << 15;

/// The window of a pooling along (height, width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on both sides.
    pub padding: [usize; 2],
    /// Spacing between taps.
    pub dilation: [usize; 2],
}

impl Geometry {
    /// Whether the kernels can run it: positive sizes, strides and dilations, none near
    /// overflowing.
    pub fn consistent(&self) -> bool {
        let all = [self.kernel, self.stride, self.padding, self.dilation];
        all.iter().flatten().all(|&v| v < 1 << 32)
            && [self.kernel, self.stride, self.dilation]
                .iter()
                .flatten()
                .all(|&v| v > 0)
    }
}

/// An element type max pooling takes.
pub trait Elem: Copy + PartialOrd + Send + Sync + 'static {
    /// The value of a window with nothing inside the input (-inf for floats).
    const LOWEST: Self;
}

macro_rules! elems {
    ($($t:ty = $v:expr),*) => {$(impl Elem for $t { const LOWEST: Self = $v; })*};
}
// integers take what -inf converts to in the eager kernels (`as` from i64::MIN)
elems!(
    f32 = f32::NEG_INFINITY,
    f64 = f64::NEG_INFINITY,
    half::f16 = half::f16::NEG_INFINITY,
    half::bf16 = half::bf16::NEG_INFINITY,
    u8 = i64::MIN as u8,
    i8 = i64::MIN as i8,
    i16 = i64::MIN as i16,
    i32 = i64::MIN as i32,
    i64 = i64::MIN,
    bool = false
);

/// Sizes of one pooling, and the order of its dense buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Images.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Whether the buffers are NHWC (else NCHW).
    pub nhwc: bool,
}

impl Plan {
    /// Elements of the input and of the output.
    pub fn lens(&self) -> [usize; 2] {
        [
            self.n * self.c * self.h * self.w,
            self.n * self.c * self.oh * self.ow,
        ]
    }
    /// Whether every element count is far from overflowing.
    pub fn consistent(&self) -> bool {
        let count = |d: [usize; 4]| {
            d.iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .is_some_and(|v| v < 1 << 40)
        };
        count([self.n, self.c, self.h, self.w]) && count([self.n, self.c, self.oh, self.ow])
    }
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

/// The strides of a dense `[n, c, h, w]` buffer in NCHW or NHWC order.
fn dense_strides(nhwc: bool, c: usize, h: usize, w: usize) -> [usize; 4] {
    if nhwc {
        [h * w * c, 1, w * c, c]
    } else {
        [c * h * w, h * w, w, 1]
    }
}

/// How many chunks `work` element visits are cut into: one when it is small.
fn chunks_for(work: usize) -> usize {
    if work < PAR_WORK {
        1
    } else {
        available().saturating_mul(8)
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
        let per_image = (available() * 4).div_ceil(p.n.max(1));
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
