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
use crate::runtime::element::Element;
use crate::runtime::strided::SendPtr;
use crate::runtime::tensor::Tensor;
use crate::runtime::threads;
use crate::{Result, bail, dispatch};

/// Below this many element visits a pooling kernel runs on the calling thread.
const PAR_WORK: usize = 1 << 15;

pub use crate::ir::conv::PoolGeometry;

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

/// `v != v`: NaN, for any element type (always false for integers).
#[allow(clippy::eq_op)]
fn is_nan<T: PartialEq>(v: T) -> bool {
    v != v
}

/// The maximum of the window of output (`oh`, `ow`) of image `n`, for the channels from
/// `c0` that `best` holds, and, when `IDX`, the flat input position `ih·W + iw` it was
/// found at (`usize::MAX` for a window with no element inside the input, whose maximum
/// is `-inf`).
#[allow(clippy::too_many_arguments)]
fn window_max<T: Element + PartialOrd, const IDX: bool>(
    x: &[T],
    xs: [usize; 4],
    p: &Plan,
    geo: &PoolGeometry,
    (n, c0, oh, ow): (usize, usize, usize, usize),
    best: &mut [T],
    idx: &mut [usize],
) {
    let len = best.len();
    let mut seeded = false;
    for i in 0..geo.kernel[0] {
        let ih = (oh * geo.stride[0] + i * geo.dilation[0]) as isize - geo.padding[0] as isize;
        if ih < 0 || ih as usize >= p.h {
            continue;
        }
        for j in 0..geo.kernel[1] {
            let iw = (ow * geo.stride[1] + j * geo.dilation[1]) as isize - geo.padding[1] as isize;
            if iw < 0 || iw as usize >= p.w {
                continue;
            }
            let (ih, iw) = (ih as usize, iw as usize);
            let base = Plan::at(xs, n, c0, ih, iw);
            // one channel (NCHW) or contiguous channels (NHWC)
            let src = &x[base..base + len];
            let pos = ih * p.w + iw;
            if !seeded {
                best.copy_from_slice(src);
                if IDX {
                    idx[..len].fill(pos);
                }
                seeded = true;
            } else {
                for k in 0..len {
                    let v = src[k];
                    if v > best[k] || is_nan(v) {
                        best[k] = v;
                        if IDX {
                            idx[k] = pos;
                        }
                    }
                }
            }
        }
    }
    if !seeded {
        best.fill(T::from_f64(f64::NEG_INFINITY));
        if IDX {
            idx[..len].fill(usize::MAX);
        }
    }
}

/// The maxima of output row `oh` of one NCHW plane `x` into `best` (OW of them) and, when
/// `IDX`, their flat input positions into `idx`: [`window_max`]'s rule, run along the row
/// so that the inner loop is over output columns.
fn max_row<T: Element + PartialOrd, const IDX: bool>(
    x: &[T],
    p: &Plan,
    geo: &PoolGeometry,
    oh: usize,
    best: &mut [T],
    idx: &mut [usize],
) {
    let in_row = |i: usize| {
        let ih = (oh * geo.stride[0] + i * geo.dilation[0]) as isize - geo.padding[0] as isize;
        (ih >= 0 && (ih as usize) < p.h).then_some(ih as usize)
    };
    let off = |j: usize| (j * geo.dilation[1]) as isize - geo.padding[1] as isize;
    let cols = |j: usize| valid_range(0, p.ow, geo.stride[1], off(j), p.w);
    let at = |ow: usize, j: usize| ((ow * geo.stride[1]) as isize + off(j)) as usize;
    // every output starts from the first element of its window, in the window's order
    best.fill(T::from_f64(f64::NEG_INFINITY));
    if IDX {
        idx[..p.ow].fill(usize::MAX);
    }
    let Some(first) = (0..geo.kernel[0]).find_map(in_row) else {
        return;
    };
    // later taps' columns start further left: going down, the first tap of each wins
    for j in (0..geo.kernel[1]).rev() {
        let (lo, hi) = cols(j);
        for ow in lo..hi {
            let pos = first * p.w + at(ow, j);
            best[ow] = x[pos];
            if IDX {
                idx[ow] = pos;
            }
        }
    }
    for i in 0..geo.kernel[0] {
        let Some(ih) = in_row(i) else {
            continue;
        };
        let row = &x[ih * p.w..(ih + 1) * p.w];
        for j in 0..geo.kernel[1] {
            let (lo, hi) = cols(j);
            if lo >= hi {
                continue;
            }
            let s0 = at(lo, j);
            let src = row[s0..].iter().step_by(geo.stride[1]);
            if IDX {
                let pos = (ih * p.w + s0..).step_by(geo.stride[1]);
                for ((b, i), (&v, q)) in best[lo..hi]
                    .iter_mut()
                    .zip(&mut idx[lo..hi])
                    .zip(src.zip(pos))
                {
                    if v > *b || is_nan(v) {
                        *b = v;
                        *i = q;
                    }
                }
            } else {
                for (b, &v) in best[lo..hi].iter_mut().zip(src) {
                    *b = if v > *b || is_nan(v) { v } else { *b };
                }
            }
        }
    }
}

/// `max_pool2d`: the maximum of each window, positions outside the input skipped. Any
/// numeric dtype; the result has x's dtype, and x's layout when x is channels_last.
pub fn max_pool2d(x: &Tensor, geo: &PoolGeometry, out: &TensorType) -> Result<Tensor> {
    check_geometry("max_pool2d", geo)?;
    let p = plan("max_pool2d", x.shape(), &out.shape, prefers_nhwc(x))?;
    if x.dtype() == DType::Bool {
        bail!(DType, "\"max_pool2d\" not implemented for 'Bool'");
    }
    if out.dtype != x.dtype() {
        bail!(
            DType,
            "max_pool2d: a result of dtype {} for an input of dtype {}",
            out.dtype,
            x.dtype()
        );
    }
    dispatch!(x.dtype(), T => max_pool_as::<T>(x, geo, &p, out))
}

fn max_pool_as<T: Element + PartialOrd>(
    x: &Tensor,
    geo: &PoolGeometry,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let len = p.n * p.c * p.oh * p.ow;
    if len == 0 {
        return produce::<T>(out, p.nhwc, false, |_| {});
    }
    let xd = dense::<T>(x, p.nhwc)?;
    let xs = p.in_strides();
    let work = len * geo.kernel[0] * geo.kernel[1];
    produce::<T>(out, p.nhwc, false, |y| {
        with_elements::<T, _>(&xd, |xv| {
            for_rows(p, y, work, &|n, c, oh, dst| {
                if p.nhwc {
                    for (ow, d) in dst.chunks_mut(p.c).enumerate() {
                        window_max::<T, false>(xv, xs, p, geo, (n, 0, oh, ow), d, &mut []);
                    }
                } else {
                    max_row::<T, false>(p.plane(xv, n, c), p, geo, oh, dst, &mut []);
                }
            });
        })
    })
}

/// The gradient of `max_pool2d`: each output's gradient `gy` goes to the first maximal
/// element of its window in `x` (a NaN counting as the maximum), accumulated where windows
/// overlap. `out` is x's type (a float dtype); the result has x's layout when x is
/// channels_last.
pub fn max_pool2d_backward(
    gy: &Tensor,
    x: &Tensor,
    geo: &PoolGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "max_pool2d_backward";
    check_geometry(op, geo)?;
    let p = plan(op, x.shape(), gy.shape(), prefers_nhwc(x))?;
    if out.shape != x.shape() {
        bail!(
            Shape,
            "{op}: gradient of shape {:?} for an input of shape {:?}",
            out.shape,
            x.shape()
        );
    }
    let acc = compute_type(op, out.dtype)?;
    compute_type(op, gy.dtype())?;
    if x.dtype() == DType::Bool {
        bail!(DType, "\"{op}\" not implemented for 'Bool'");
    }
    dispatch!(x.dtype(), T => match acc {
        DType::F64 => max_backward_as::<T, f64>(gy, x, geo, &p, out),
        _ => max_backward_as::<T, f32>(gy, x, geo, &p, out),
    })
}

fn max_backward_as<T: Element + PartialOrd, A: Acc>(
    gy: &Tensor,
    x: &Tensor,
    geo: &PoolGeometry,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let len = p.n * p.c * p.h * p.w;
    if len == 0 || p.oh * p.ow == 0 {
        return produce::<A>(out, p.nhwc, true, |_| {});
    }
    let xd = dense::<T>(x, p.nhwc)?;
    let gd = dense::<A>(gy, p.nhwc)?;
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let work = gd.numel() * geo.kernel[0] * geo.kernel[1];
    produce::<A>(out, p.nhwc, true, |dx| {
        let dxp = SendPtr(dx.as_mut_ptr());
        with_elements2::<T, A, _>(&xd, &gd, |xv, gv| {
            for_blocks(p, work, &|n, c0, c1| {
                if !p.nhwc {
                    // one plane, a row of outputs at a time
                    let (plane, base) = (p.plane(xv, n, c0), (n * p.c + c0) * p.h * p.w);
                    let mut best = vec![T::zero(); p.ow];
                    let mut idx = vec![0usize; p.ow];
                    for oh in 0..p.oh {
                        max_row::<T, true>(plane, p, geo, oh, &mut best, &mut idx);
                        let g = &gv[Plan::at(gs, n, c0, oh, 0)..][..p.ow];
                        for (&pos, &gv) in idx.iter().zip(g) {
                            if pos != usize::MAX {
                                // SAFETY: plane (n, c0) is this task's alone.
                                unsafe { *dxp.get().add(base + pos) += gv };
                            }
                        }
                    }
                    return;
                }
                let len = c1 - c0;
                let mut best = vec![T::zero(); len];
                let mut idx = vec![0usize; len];
                for oh in 0..p.oh {
                    for ow in 0..p.ow {
                        let at = (n, c0, oh, ow);
                        window_max::<T, true>(xv, xs, p, geo, at, &mut best, &mut idx);
                        let g = Plan::at(gs, n, c0, oh, ow);
                        for (k, &pos) in idx.iter().enumerate() {
                            if pos != usize::MAX {
                                let d = Plan::at(xs, n, c0 + k, pos / p.w, pos % p.w);
                                // SAFETY: channels c0..c1 of image n are this task's alone.
                                unsafe { *dxp.get().add(d) += gv[g + k * gs[1]] };
                            }
                        }
                    }
                }
            });
        })
    })
}

/// Along dim `d` (of input size `n`), the input range `start..end` of average-pooling
/// window `o` clipped to the input, and the window's size before clipping: PyTorch's rule,
/// where a window ends at most `padding` past the input.
fn avg_span(geo: &PoolGeometry, o: usize, d: usize, n: usize) -> (usize, usize, usize) {
    let s = (o * geo.stride[d]) as isize - geo.padding[d] as isize;
    let e = (s + geo.kernel[d] as isize).min((n + geo.padding[d]) as isize);
    let size = (e - s).max(0) as usize;
    let (s, e) = (s.max(0) as usize, e.clamp(0, n as isize) as usize);
    (s, e.max(s), size)
}

/// The divisor of an average-pooling window of `inside` elements in the input whose size
/// before clipping is `full`; `None` when the window holds nothing.
fn avg_divisor(count_include_pad: bool, inside: usize, full: usize) -> Option<usize> {
    match inside {
        0 => None,
        _ if count_include_pad => Some(full),
        _ => Some(inside),
    }
}

/// The window of output (`oh`, `ow`) for average pooling clipped to the input, as
/// `(h0, h1, w0, w1, divisor)`, or `None` when nothing of it is inside: the divisor is the
/// window's size before clipping with `count_include_pad`, the clipped one's without.
fn avg_window(
    p: &Plan,
    geo: &PoolGeometry,
    count_include_pad: bool,
    oh: usize,
    ow: usize,
) -> Option<(usize, usize, usize, usize, usize)> {
    let (h0, h1, hsize) = avg_span(geo, oh, 0, p.h);
    let (w0, w1, wsize) = avg_span(geo, ow, 1, p.w);
    let div = avg_divisor(count_include_pad, (h1 - h0) * (w1 - w0), hsize * wsize)?;
    Some((h0, h1, w0, w1, div))
}

/// Average pooling of output row `oh` of one NCHW plane `x` into `dst` (OW outputs), summed
/// along the row so that the inner loop is over output columns.
fn avg_row<A: Acc>(
    x: &[A],
    p: &Plan,
    geo: &PoolGeometry,
    count_include_pad: bool,
    oh: usize,
    dst: &mut [A],
) {
    dst.fill(A::zero());
    let (h0, h1, hsize) = avg_span(geo, oh, 0, p.h);
    for ih in h0..h1 {
        let row = &x[ih * p.w..(ih + 1) * p.w];
        for j in 0..geo.kernel[1] {
            let off = j as isize - geo.padding[1] as isize;
            let (lo, hi) = valid_range(0, p.ow, geo.stride[1], off, p.w);
            if lo < hi {
                let s0 = ((lo * geo.stride[1]) as isize + off) as usize;
                let src = row[s0..].iter().step_by(geo.stride[1]);
                for (d, &v) in dst[lo..hi].iter_mut().zip(src) {
                    *d += v;
                }
            }
        }
    }
    for (ow, d) in dst.iter_mut().enumerate() {
        let (w0, w1, wsize) = avg_span(geo, ow, 1, p.w);
        match avg_divisor(count_include_pad, (h1 - h0) * (w1 - w0), hsize * wsize) {
            Some(div) => *d = *d / A::from_f64(div as f64),
            None => *d = A::zero(),
        }
    }
}

/// Average pooling with dilation 1; a window with nothing inside the input gives 0.
fn check_avg(op: &str, geo: &PoolGeometry) -> Result<()> {
    check_geometry(op, geo)?;
    if geo.dilation != [1, 1] {
        bail!(Unsupported, "{op}: dilation is not supported, got {geo:?}");
    }
    Ok(())
}

/// `avg_pool2d`: each window's sum divided by PyTorch's divisor: the window's size before
/// clipping to the input (it ends at most `padding` past it) with `count_include_pad`,
/// else the number of its elements inside the input. `geo.dilation` must be `[1, 1]`.
/// The result has x's layout when x is channels_last.
pub fn avg_pool2d(
    x: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "avg_pool2d";
    check_avg(op, geo)?;
    let p = plan(op, x.shape(), &out.shape, prefers_nhwc(x))?;
    compute_type(op, x.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => avg_as::<f64>(x, geo, count_include_pad, &p, out),
        _ => avg_as::<f32>(x, geo, count_include_pad, &p, out),
    }
}

fn avg_as<A: Acc>(
    x: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let len = p.n * p.c * p.oh * p.ow;
    if len == 0 {
        return produce::<A>(out, p.nhwc, false, |_| {});
    }
    let xd = dense::<A>(x, p.nhwc)?;
    let xs = p.in_strides();
    let work = len * geo.kernel[0] * geo.kernel[1];
    produce::<A>(out, p.nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xv| {
            for_rows(p, y, work, &|n, c, oh, dst| {
                if !p.nhwc {
                    avg_row(p.plane(xv, n, c), p, geo, count_include_pad, oh, dst);
                    return;
                }
                for (ow, d) in dst.chunks_mut(p.c).enumerate() {
                    d.fill(A::zero());
                    let window = avg_window(p, geo, count_include_pad, oh, ow);
                    if let Some((h0, h1, w0, w1, div)) = window {
                        sum_window(xv, xs, (n, c), (h0, h1, w0, w1), d);
                        let div = A::from_f64(div as f64);
                        d.iter_mut().for_each(|v| *v = *v / div);
                    }
                }
            });
        })
    })
}

/// Adds input rows `h0..h1`, columns `w0..w1` of image `n`, channels from `c0`, into `dst`
/// (one channel in NCHW, whose rows are contiguous runs; contiguous channels in NHWC).
fn sum_window<A: Acc>(
    x: &[A],
    xs: [usize; 4],
    (n, c0): (usize, usize),
    (h0, h1, w0, w1): (usize, usize, usize, usize),
    dst: &mut [A],
) {
    let len = dst.len();
    for ih in h0..h1 {
        if len == 1 && xs[3] == 1 {
            let b = Plan::at(xs, n, c0, ih, w0);
            dst[0] += sum_run(&x[b..b + (w1 - w0)]);
            continue;
        }
        for iw in w0..w1 {
            let b = Plan::at(xs, n, c0, ih, iw);
            for (d, &v) in dst.iter_mut().zip(&x[b..b + len]) {
                *d += v;
            }
        }
    }
}

/// The sum of `v`, in eight interleaved partial sums (so it vectorises).
fn sum_run<A: Acc>(v: &[A]) -> A {
    if v.len() < 16 {
        return v.iter().fold(A::zero(), |s, &x| s + x);
    }
    let mut part = [A::zero(); 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (p, &x) in part.iter_mut().zip(c) {
            *p += x;
        }
    }
    let mut s = A::zero();
    for &x in chunks.remainder() {
        s += x;
    }
    part.iter().fold(s, |s, &p| s + p)
}

/// Adds `g` (channel `k` at `g[k·gstride]`) to input rows `h0..h1`, columns `w0..w1`,
/// channels `c0..c0+len` of image `n` of the dense buffer at `dx` of strides `xs`.
///
/// # Safety
/// Those channels of that image are the caller's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn spread<A: Acc>(
    dx: SendPtr<A>,
    xs: [usize; 4],
    (n, c0, len): (usize, usize, usize),
    (h0, h1, w0, w1): (usize, usize, usize, usize),
    g: &[A],
    gstride: usize,
    scale: A,
) {
    if len == 1 && xs[3] == 1 {
        // one NCHW channel: contiguous runs of each row
        let v = g[0] / scale;
        for ih in h0..h1 {
            let b = Plan::at(xs, n, c0, ih, w0);
            // SAFETY: as the caller promises.
            let run = unsafe { std::slice::from_raw_parts_mut(dx.get().add(b), w1 - w0) };
            run.iter_mut().for_each(|d| *d += v);
        }
        return;
    }
    for ih in h0..h1 {
        for iw in w0..w1 {
            let b = Plan::at(xs, n, c0, ih, iw);
            for k in 0..len {
                // SAFETY: as the caller promises.
                unsafe { *dx.get().add(b + k * xs[1]) += g[k * gstride] / scale };
            }
        }
    }
}

/// The gradient of `avg_pool2d`: each output's gradient divided by its divisor, added to
/// every input element of its window. `out` is x's type; the result is channels_last
/// when `gy` is.
pub fn avg_pool2d_backward(
    gy: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    out: &TensorType,
) -> Result<Tensor> {
    let op = "avg_pool2d_backward";
    check_avg(op, geo)?;
    let p = plan(op, &out.shape, gy.shape(), prefers_nhwc(gy))?;
    compute_type(op, gy.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => avg_backward_as::<f64>(gy, geo, count_include_pad, &p, out),
        _ => avg_backward_as::<f32>(gy, geo, count_include_pad, &p, out),
    }
}

fn avg_backward_as<A: Acc>(
    gy: &Tensor,
    geo: &PoolGeometry,
    count_include_pad: bool,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
    let len = p.n * p.c * p.h * p.w;
    if len == 0 || p.oh * p.ow == 0 {
        return produce::<A>(out, p.nhwc, true, |_| {});
    }
    let gd = dense::<A>(gy, p.nhwc)?;
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let work = gd.numel() * geo.kernel[0] * geo.kernel[1];
    produce::<A>(out, p.nhwc, true, |dx| {
        let dxp = SendPtr(dx.as_mut_ptr());
        with_elements::<A, _>(&gd, |gv| {
            for_blocks(p, work, &|n, c0, c1| {
                for oh in 0..p.oh {
                    for ow in 0..p.ow {
                        let Some((h0, h1, w0, w1, div)) =
                            avg_window(p, geo, count_include_pad, oh, ow)
                        else {
                            continue;
                        };
                        let g = &gv[Plan::at(gs, n, c0, oh, ow)..];
                        let div = A::from_f64(div as f64);
                        // SAFETY: channels c0..c1 of image n are this task's alone.
                        unsafe {
                            spread(dxp, xs, (n, c0, c1 - c0), (h0, h1, w0, w1), g, gs[1], div)
                        };
                    }
                }
            });
        })
    })
}

/// The input range `start..end` of adaptive window `i` of `o` over `n` elements:
/// `floor(i·n/o)..ceil((i+1)·n/o)`.
fn adaptive(i: usize, o: usize, n: usize) -> (usize, usize) {
    (i * n / o, ((i + 1) * n).div_ceil(o))
}

/// `adaptive_avg_pool2d`: output (`i`, `j`) averages input rows
/// `floor(i·H/OH)..ceil((i+1)·H/OH)` and the columns alike; the output size is `out`'s.
/// The result has x's layout when x is channels_last.
pub fn adaptive_avg_pool2d(x: &Tensor, out: &TensorType) -> Result<Tensor> {
    let op = "adaptive_avg_pool2d";
    let p = plan(op, x.shape(), &out.shape, prefers_nhwc(x))?;
    compute_type(op, x.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => adaptive_as::<f64>(x, &p, out),
        _ => adaptive_as::<f32>(x, &p, out),
    }
}

fn adaptive_as<A: Acc>(x: &Tensor, p: &Plan, out: &TensorType) -> Result<Tensor> {
    let len = p.n * p.c * p.oh * p.ow;
    if len == 0 {
        return produce::<A>(out, p.nhwc, false, |_| {});
    }
    let xd = dense::<A>(x, p.nhwc)?;
    let xs = p.in_strides();
    let work = xd.numel() + len;
    produce::<A>(out, p.nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xv| {
            for_rows(p, y, work, &|n, c, oh, dst| {
                let (h0, h1) = adaptive(oh, p.oh, p.h);
                for (ow, d) in dst.chunks_mut(dst.len() / p.ow).enumerate() {
                    let (w0, w1) = adaptive(ow, p.ow, p.w);
                    d.fill(A::zero());
                    let count = (h1 - h0) * (w1 - w0);
                    if count > 0 {
                        sum_window(xv, xs, (n, c), (h0, h1, w0, w1), d);
                        let count = A::from_f64(count as f64);
                        d.iter_mut().for_each(|v| *v = *v / count);
                    }
                }
            });
        })
    })
}

/// The gradient of `adaptive_avg_pool2d`: each output's gradient divided by its window's
/// size, added to every input element of the window. `out` is x's type; the result is
/// channels_last when `gy` is.
pub fn adaptive_avg_pool2d_backward(gy: &Tensor, out: &TensorType) -> Result<Tensor> {
    let op = "adaptive_avg_pool2d_backward";
    let p = plan(op, &out.shape, gy.shape(), prefers_nhwc(gy))?;
    compute_type(op, gy.dtype())?;
    match compute_type(op, out.dtype)? {
        DType::F64 => adaptive_backward_as::<f64>(gy, &p, out),
        _ => adaptive_backward_as::<f32>(gy, &p, out),
    }
}

fn adaptive_backward_as<A: Acc>(gy: &Tensor, p: &Plan, out: &TensorType) -> Result<Tensor> {
    let len = p.n * p.c * p.h * p.w;
    if len == 0 || p.oh * p.ow == 0 {
        return produce::<A>(out, p.nhwc, true, |_| {});
    }
    let gd = dense::<A>(gy, p.nhwc)?;
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let work = gd.numel() + len;
    produce::<A>(out, p.nhwc, true, |dx| {
        let dxp = SendPtr(dx.as_mut_ptr());
        with_elements::<A, _>(&gd, |gv| {
            for_blocks(p, work, &|n, c0, c1| {
                for oh in 0..p.oh {
                    let (h0, h1) = adaptive(oh, p.oh, p.h);
                    for ow in 0..p.ow {
                        let (w0, w1) = adaptive(ow, p.ow, p.w);
                        let count = (h1 - h0) * (w1 - w0);
                        if count == 0 {
                            continue;
                        }
                        let g = &gv[Plan::at(gs, n, c0, oh, ow)..];
                        let count = A::from_f64(count as f64);
                        // SAFETY: channels c0..c1 of image n are this task's alone.
                        unsafe {
                            spread(dxp, xs, (n, c0, c1 - c0), (h0, h1, w0, w1), g, gs[1], count)
                        };
                    }
                }
            });
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::kernels::conv::channels_last_view;
    use crate::runtime::kernels::copy;

    /// Deterministic values (xorshift).
    struct Rng(u64);

    impl Rng {
        fn bits(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// In 0..n.
        fn below(&mut self, n: usize) -> usize {
            (self.bits() % n as u64) as usize
        }
        /// Values in [-1, 1), or small integers (many ties) when `coarse`.
        fn values(&mut self, n: usize, coarse: bool) -> Vec<f64> {
            (0..n)
                .map(|_| {
                    if coarse {
                        self.below(7) as f64 - 3.0
                    } else {
                        (self.bits() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
                    }
                })
                .collect()
        }
    }

    #[derive(Clone, Debug)]
    struct Case {
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        ceil: bool,
    }

    impl Case {
        fn random(r: &mut Rng, dilated: bool) -> Case {
            let k = [1 + r.below(3), 1 + r.below(3)];
            let d = if dilated {
                [1 + r.below(2), 1 + r.below(2)]
            } else {
                [1, 1]
            };
            let p = [r.below(k[0] / 2 + 1), r.below(k[1] / 2 + 1)];
            let mut c = Case {
                n: 1 + r.below(2),
                c: 1 + r.below(3),
                h: 1 + r.below(9),
                w: 1 + r.below(9),
                k,
                s: [1 + r.below(3), 1 + r.below(3)],
                p,
                d,
                ceil: r.below(2) == 0,
            };
            while c.h + 2 * c.p[0] < c.d[0] * (c.k[0] - 1) + 1 {
                c.h += 1;
            }
            while c.w + 2 * c.p[1] < c.d[1] * (c.k[1] - 1) + 1 {
                c.w += 1;
            }
            c
        }
        /// PyTorch's pooling output size.
        fn out(&self, i: usize) -> usize {
            let size = [self.h, self.w][i];
            let (k, s, p, d) = (self.k[i], self.s[i], self.p[i], self.d[i]);
            let num = size + 2 * p - d * (k - 1) - 1 + if self.ceil { s - 1 } else { 0 };
            let mut o = num / s + 1;
            if self.ceil && (o - 1) * s >= size + p {
                o -= 1;
            }
            o
        }
        fn geo(&self) -> PoolGeometry {
            PoolGeometry {
                kernel: self.k,
                stride: self.s,
                padding: self.p,
                dilation: self.d,
            }
        }
        fn x_shape(&self) -> Vec<usize> {
            vec![self.n, self.c, self.h, self.w]
        }
        fn y_shape(&self) -> Vec<usize> {
            vec![self.n, self.c, self.out(0), self.out(1)]
        }
        fn planes(&self) -> usize {
            self.n * self.c
        }

        /// Max pooling in f64 and the position each window picks (PyTorch's loop: the
        /// first valid position, then any later one that is larger or NaN).
        fn ref_max(&self, x: &[f64]) -> (Vec<f64>, Vec<Option<usize>>) {
            let (oh, ow) = (self.out(0), self.out(1));
            let mut y = Vec::new();
            let mut at = Vec::new();
            for pl in 0..self.planes() {
                for a in 0..oh {
                    for b in 0..ow {
                        let mut m = f64::NEG_INFINITY;
                        let mut idx = None;
                        for i in 0..self.k[0] {
                            for j in 0..self.k[1] {
                                let r = (a * self.s[0] + i * self.d[0]) as i64 - self.p[0] as i64;
                                let q = (b * self.s[1] + j * self.d[1]) as i64 - self.p[1] as i64;
                                if r < 0 || q < 0 || r >= self.h as i64 || q >= self.w as i64 {
                                    continue;
                                }
                                let pos = (pl * self.h + r as usize) * self.w + q as usize;
                                if idx.is_none() {
                                    idx = Some(pos);
                                }
                                if x[pos] > m || x[pos].is_nan() {
                                    m = x[pos];
                                    idx = Some(pos);
                                }
                            }
                        }
                        y.push(m);
                        at.push(idx);
                    }
                }
            }
            (y, at)
        }

        /// Every window of average pooling as (output index, input indices, divisor).
        fn avg_windows(&self, cip: bool) -> Vec<(usize, Vec<usize>, f64)> {
            let (oh, ow) = (self.out(0), self.out(1));
            let mut all = Vec::new();
            for pl in 0..self.planes() {
                for a in 0..oh {
                    for b in 0..ow {
                        let hs = (a * self.s[0]) as i64 - self.p[0] as i64;
                        let ws = (b * self.s[1]) as i64 - self.p[1] as i64;
                        let he = (hs + self.k[0] as i64).min((self.h + self.p[0]) as i64);
                        let we = (ws + self.k[1] as i64).min((self.w + self.p[1]) as i64);
                        let pool = (he - hs) * (we - ws);
                        let mut inside = Vec::new();
                        for r in hs..he {
                            for q in ws..we {
                                if r >= 0 && q >= 0 && r < self.h as i64 && q < self.w as i64 {
                                    inside.push((pl * self.h + r as usize) * self.w + q as usize);
                                }
                            }
                        }
                        let div = if cip {
                            pool as f64
                        } else {
                            inside.len() as f64
                        };
                        all.push(((pl * oh + a) * ow + b, inside, div));
                    }
                }
            }
            all
        }
    }

    /// Every window of adaptive pooling of `[n, c, h, w]` to `oh × ow`.
    fn adaptive_windows(s: &[usize], oh: usize, ow: usize) -> Vec<(usize, Vec<usize>)> {
        let (h, w) = (s[2], s[3]);
        let mut all = Vec::new();
        for pl in 0..s[0] * s[1] {
            for a in 0..oh {
                for b in 0..ow {
                    let (h0, h1) = ((a * h) as f64 / oh as f64, ((a + 1) * h) as f64 / oh as f64);
                    let (w0, w1) = ((b * w) as f64 / ow as f64, ((b + 1) * w) as f64 / ow as f64);
                    let mut inside = Vec::new();
                    for r in h0.floor() as usize..h1.ceil() as usize {
                        for q in w0.floor() as usize..w1.ceil() as usize {
                            inside.push((pl * h + r) * w + q);
                        }
                    }
                    all.push(((pl * oh + a) * ow + b, inside));
                }
            }
        }
        all
    }

    fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
        copy::cast(&Tensor::from_vec(v.to_vec(), shape).unwrap(), dtype).unwrap()
    }

    /// How the tests lay out an input: contiguous, channels_last, or transposed.
    #[derive(Clone, Copy, Debug)]
    enum Form {
        Plain,
        ChannelsLast,
        Transposed,
    }

    fn make(v: &[f64], s: &[usize], dtype: DType, form: Form) -> Tensor {
        let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
        let shape = match form {
            Form::Plain => return tensor(v, s, dtype),
            Form::ChannelsLast => [n, h, w, c],
            Form::Transposed => [n, c, w, h],
        };
        let mut t = vec![0.0; v.len()];
        for (i, &x) in v.iter().enumerate() {
            let (ni, ci, hi, wi) = (i / (c * h * w), i / (h * w) % c, i / w % h, i % w);
            let at = match form {
                Form::ChannelsLast => ((ni * h + hi) * w + wi) * c + ci,
                _ => ((ni * c + ci) * w + wi) * h + hi,
            };
            t[at] = x;
        }
        let base = tensor(&t, &shape, dtype);
        match form {
            Form::ChannelsLast => channels_last_view(&base),
            _ => base.with_layout(base.layout().transpose(2, 3)),
        }
    }

    fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
        let got = got.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
            assert!(ok, "{what}: element {i}: got {g}, want {w}");
        }
    }

    fn tol(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        }
    }

    fn ty(dtype: DType, shape: Vec<usize>) -> TensorType {
        TensorType::new(dtype, shape)
    }

    /// Channels_last results for channels_last inputs (when the layouts differ).
    fn check_layout(t: &Tensor, form: Form, what: &str) {
        let s = t.shape();
        if matches!(form, Form::ChannelsLast) && s[1] > 1 && s[2] * s[3] > 1 {
            assert_eq!(
                t.strides(),
                [s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]],
                "{what}"
            );
        } else if t.numel() > 0 {
            assert!(t.is_contiguous(), "{what}");
        }
    }

    const FORMS: [Form; 3] = [Form::Plain, Form::ChannelsLast, Form::Transposed];

    #[test]
    fn max_pooling_matches_the_reference() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        for i in 0..90 {
            let k = Case::random(&mut r, true);
            let form = FORMS[i % 3];
            let dtype = [DType::F64, DType::F32][i / 3 % 2];
            let what = format!("{k:?} {form:?} {dtype:?}");
            let x = r.values(k.x_shape().iter().product(), i % 2 == 0);
            let x = tensor(&x, &[x.len()], dtype).to_f64_vec();
            let xt = make(&x, &k.x_shape(), dtype, form);
            let y = max_pool2d(&xt, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
            let (want, at) = k.ref_max(&x);
            assert_close(&y, &want, 0.0, &what);
            assert_eq!(y.dtype(), dtype);
            check_layout(&y, form, &what);
            let gy = tensor(&r.values(y.numel(), false), &k.y_shape(), dtype).to_f64_vec();
            let gyt = make(&gy, &k.y_shape(), dtype, form);
            let dx = max_pool2d_backward(&gyt, &xt, &k.geo(), &ty(dtype, k.x_shape())).unwrap();
            let mut want = vec![0.0; x.len()];
            for (o, a) in at.iter().enumerate() {
                if let Some(a) = a {
                    want[*a] += gy[o];
                }
            }
            assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
            check_layout(&dx, form, &what);
        }
    }

    #[test]
    fn average_pooling_matches_the_reference() {
        let mut r = Rng(77);
        for i in 0..90 {
            let k = Case::random(&mut r, false);
            let form = FORMS[i % 3];
            let dtype = [DType::F64, DType::F32][i / 3 % 2];
            let cip = i / 6 % 2 == 0;
            let what = format!("{k:?} {form:?} {dtype:?} count_include_pad {cip}");
            let x = tensor(
                &r.values(k.x_shape().iter().product(), false),
                &[k.x_shape().iter().product()],
                dtype,
            )
            .to_f64_vec();
            let xt = make(&x, &k.x_shape(), dtype, form);
            let y = avg_pool2d(&xt, &k.geo(), cip, &ty(dtype, k.y_shape())).unwrap();
            let windows = k.avg_windows(cip);
            let mut want = vec![0.0; y.numel()];
            for (o, inside, div) in &windows {
                if !inside.is_empty() {
                    want[*o] = inside.iter().map(|&i| x[i]).sum::<f64>() / div;
                }
            }
            assert_close(&y, &want, tol(dtype), &what);
            check_layout(&y, form, &what);
            let gy = tensor(&r.values(y.numel(), false), &k.y_shape(), dtype).to_f64_vec();
            let gyt = make(&gy, &k.y_shape(), dtype, form);
            let dx = avg_pool2d_backward(&gyt, &k.geo(), cip, &ty(dtype, k.x_shape())).unwrap();
            let mut want = vec![0.0; x.len()];
            for (o, inside, div) in &windows {
                for &i in inside {
                    want[i] += gy[*o] / div;
                }
            }
            assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
            check_layout(&dx, form, &what);
        }
    }

    #[test]
    fn adaptive_pooling_matches_the_reference() {
        let mut r = Rng(99);
        for i in 0..45 {
            let s = vec![
                1 + r.below(2),
                1 + r.below(3),
                1 + r.below(9),
                1 + r.below(9),
            ];
            let (oh, ow) = (1 + r.below(8), 1 + r.below(8));
            let ys = vec![s[0], s[1], oh, ow];
            let form = FORMS[i % 3];
            let dtype = [DType::F64, DType::F32][i / 3 % 2];
            let what = format!("{s:?} to {oh}x{ow} {form:?} {dtype:?}");
            let x = tensor(
                &r.values(s.iter().product(), false),
                &[s.iter().product()],
                dtype,
            )
            .to_f64_vec();
            let xt = make(&x, &s, dtype, form);
            let y = adaptive_avg_pool2d(&xt, &ty(dtype, ys.clone())).unwrap();
            let windows = adaptive_windows(&s, oh, ow);
            let mut want = vec![0.0; y.numel()];
            for (o, inside) in &windows {
                want[*o] = inside.iter().map(|&i| x[i]).sum::<f64>() / inside.len() as f64;
            }
            assert_close(&y, &want, tol(dtype), &what);
            check_layout(&y, form, &what);
            let gy = tensor(&r.values(y.numel(), false), &ys, dtype).to_f64_vec();
            let gyt = make(&gy, &ys, dtype, form);
            let dx = adaptive_avg_pool2d_backward(&gyt, &ty(dtype, s.clone())).unwrap();
            let mut want = vec![0.0; x.len()];
            for (o, inside) in &windows {
                for &i in inside {
                    want[i] += gy[*o] / inside.len() as f64;
                }
            }
            assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
            check_layout(&dx, form, &what);
        }
    }

    #[test]
    fn ties_go_to_the_first_maximum_and_nans_win() {
        let geo = PoolGeometry {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        let f = DType::F32;
        for form in FORMS {
            // overlapping windows over equal values: each goes to its top-left element
            let x = make(&[1.0; 9], &[1, 1, 3, 3], f, form);
            let gy = tensor(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], f);
            let dx = max_pool2d_backward(&gy, &x, &geo, &ty(f, vec![1, 1, 3, 3])).unwrap();
            assert_eq!(
                dx.to_f64_vec(),
                [1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]
            );
            // a NaN is the maximum of every window that holds it
            let v = [0.0, 5.0, 1.0, 2.0, f64::NAN, 3.0, 9.0, 4.0, 1.0];
            let x = make(&v, &[1, 1, 3, 3], f, form);
            let y = max_pool2d(&x, &geo, &ty(f, vec![1, 1, 2, 2])).unwrap();
            assert!(y.to_f64_vec().iter().all(|v| v.is_nan()), "{form:?}");
            let dx = max_pool2d_backward(&gy, &x, &geo, &ty(f, vec![1, 1, 3, 3])).unwrap();
            assert_eq!(dx.to_f64_vec()[4], 10.0);
        }
    }

    #[test]
    fn integers_and_halves() {
        let k = Case {
            n: 2,
            c: 3,
            h: 5,
            w: 6,
            k: [3, 2],
            s: [2, 2],
            p: [1, 1],
            d: [1, 2],
            ceil: true,
        };
        let mut r = Rng(5);
        let x = r.values(k.x_shape().iter().product(), true);
        let (want, _) = k.ref_max(&x);
        for dtype in [DType::I64, DType::I32, DType::I16, DType::I8] {
            let y = max_pool2d(
                &tensor(&x, &k.x_shape(), dtype),
                &k.geo(),
                &ty(dtype, k.y_shape()),
            );
            let y = y.unwrap();
            assert_eq!(y.dtype(), dtype);
            assert_eq!(y.to_f64_vec(), want, "{dtype:?}");
        }
        let xu: Vec<f64> = x.iter().map(|v| v + 3.0).collect();
        let y = max_pool2d(
            &tensor(&xu, &k.x_shape(), DType::U8),
            &k.geo(),
            &ty(DType::U8, k.y_shape()),
        );
        let wu: Vec<f64> = want.iter().map(|v| v + 3.0).collect();
        assert_eq!(y.unwrap().to_f64_vec(), wu);
        let b = Tensor::alloc(DType::Bool, &k.x_shape()).unwrap();
        let e = max_pool2d(&b, &k.geo(), &ty(DType::Bool, k.y_shape()));
        assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
        let xi = tensor(&x, &k.x_shape(), DType::I64);
        let e = avg_pool2d(
            &xi,
            &PoolGeometry {
                dilation: [1, 1],
                ..k.geo()
            },
            true,
            &ty(DType::I64, k.y_shape()),
        );
        assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
        let e = avg_pool2d(
            &tensor(&x, &k.x_shape(), DType::F32),
            &k.geo(),
            true,
            &ty(DType::F32, k.y_shape()),
        );
        assert!(matches!(e, Err(crate::Error::Unsupported(_))), "{e:?}");
        for dtype in [DType::F16, DType::BF16] {
            let xt = tensor(&x, &k.x_shape(), dtype);
            let y = max_pool2d(&xt, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
            assert_eq!((y.dtype(), y.to_f64_vec()), (dtype, want.clone()));
            let g = PoolGeometry {
                dilation: [1, 1],
                ..k.geo()
            };
            let c = Case {
                d: [1, 1],
                ..k.clone()
            };
            let y = avg_pool2d(&xt, &g, false, &ty(dtype, c.y_shape())).unwrap();
            let mut want = vec![0.0; y.numel()];
            for (o, inside, div) in c.avg_windows(false) {
                want[o] = inside.iter().map(|&i| x[i]).sum::<f64>() / div;
            }
            assert_close(&y, &want, tol(dtype), "half avg");
            let want_len = k.y_shape().iter().product::<usize>();
            let dx = max_pool2d_backward(
                &tensor(&vec![1.0; want_len], &k.y_shape(), dtype),
                &xt,
                &k.geo(),
                &ty(dtype, k.x_shape()),
            )
            .unwrap();
            assert_eq!(dx.dtype(), dtype);
            assert_eq!(dx.to_f64_vec().iter().sum::<f64>(), want_len as f64);
        }
    }

    #[test]
    fn empty_inputs() {
        let geo = PoolGeometry {
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
            dilation: [1, 1],
        };
        let f = DType::F32;
        for s in [[0, 3, 4, 4], [2, 0, 4, 4]] {
            let ys = vec![s[0], s[1], 2, 2];
            let x = Tensor::alloc(f, &s).unwrap();
            let gy = Tensor::alloc(f, &ys).unwrap();
            assert_eq!(
                max_pool2d(&x, &geo, &ty(f, ys.clone())).unwrap().shape(),
                ys
            );
            assert_eq!(
                avg_pool2d(&x, &geo, true, &ty(f, ys.clone()))
                    .unwrap()
                    .shape(),
                ys
            );
            assert_eq!(
                adaptive_avg_pool2d(&x, &ty(f, ys.clone())).unwrap().shape(),
                ys
            );
            let xs = s.to_vec();
            assert_eq!(
                max_pool2d_backward(&gy, &x, &geo, &ty(f, xs.clone()))
                    .unwrap()
                    .shape(),
                xs
            );
            assert_eq!(
                avg_pool2d_backward(&gy, &geo, true, &ty(f, xs.clone()))
                    .unwrap()
                    .shape(),
                xs
            );
            assert_eq!(
                adaptive_avg_pool2d_backward(&gy, &ty(f, xs.clone()))
                    .unwrap()
                    .shape(),
                xs
            );
        }
        // an empty adaptive output: nothing flows back
        let x = tensor(&[1.0; 8], &[1, 2, 2, 2], f);
        assert_eq!(
            adaptive_avg_pool2d(&x, &ty(f, vec![1, 2, 0, 2]))
                .unwrap()
                .numel(),
            0
        );
        let gy = Tensor::alloc(f, &[1, 2, 0, 2]).unwrap();
        let dx = adaptive_avg_pool2d_backward(&gy, &ty(f, vec![1, 2, 2, 2])).unwrap();
        assert_eq!(dx.to_f64_vec(), vec![0.0; 8]);
        let e = max_pool2d(&x, &geo, &ty(f, vec![1, 3, 1, 1]));
        assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
    }

    #[test]
    fn large_inputs_run_in_parallel_alike() {
        // enough work to cross PAR_WORK, in both layouts and on one thread
        let k = Case {
            n: 3,
            c: 16,
            h: 33,
            w: 31,
            k: [3, 3],
            s: [2, 2],
            p: [1, 1],
            d: [1, 1],
            ceil: false,
        };
        let mut r = Rng(3);
        let x = r.values(k.x_shape().iter().product(), true);
        let (want, _) = k.ref_max(&x);
        for form in FORMS {
            let xt = make(&x, &k.x_shape(), DType::F64, form);
            let y = max_pool2d(&xt, &k.geo(), &ty(DType::F64, k.y_shape())).unwrap();
            assert_close(&y, &want, 0.0, "parallel");
            let y = threads::serial(|| max_pool2d(&xt, &k.geo(), &ty(DType::F64, k.y_shape())));
            assert_close(&y.unwrap(), &want, 0.0, "serial");
            let gy = make(&vec![1.0; want.len()], &k.y_shape(), DType::F64, form);
            let a = max_pool2d_backward(&gy, &xt, &k.geo(), &ty(DType::F64, k.x_shape())).unwrap();
            let b = threads::serial(|| {
                max_pool2d_backward(&gy, &xt, &k.geo(), &ty(DType::F64, k.x_shape()))
            });
            assert_eq!(a.to_f64_vec(), b.unwrap().to_f64_vec());
            assert_eq!(a.to_f64_vec().iter().sum::<f64>(), want.len() as f64);
        }
    }
}
