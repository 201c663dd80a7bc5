//! Average pooling, fixed windows (with or without the padding counted) and adaptive,
//! forward and backward.

use super::*;

/// Along dim `d` (of input size `n`), the input range `start..end` of average-pooling
/// window `o` clipped to the input, and the window's size before clipping: PyTorch's rule,
/// where a window ends at most `padding` past the input.
pub(super) fn avg_span(geo: &PoolGeometry, o: usize, d: usize, n: usize) -> (usize, usize, usize) {
    let s = (o * geo.stride[d]) as isize - geo.padding[d] as isize;
    let e = (s + geo.kernel[d] as isize).min((n + geo.padding[d]) as isize);
    let size = (e - s).max(0) as usize;
    let (s, e) = (s.max(0) as usize, e.clamp(0, n as isize) as usize);
    (s, e.max(s), size)
}

/// The divisor of an average-pooling window of `inside` elements in the input whose size
/// before clipping is `full`; `None` when the window holds nothing.
pub(super) fn avg_divisor(count_include_pad: bool, inside: usize, full: usize) -> Option<usize> {
    match inside {
        0 => None,
        _ if count_include_pad => Some(full),
        _ => Some(inside),
    }
}

/// The window of output (`oh`, `ow`) for average pooling clipped to the input, as
/// `(h0, h1, w0, w1, divisor)`, or `None` when nothing of it is inside: the divisor is the
/// window's size before clipping with `count_include_pad`, the clipped one's without.
pub(super) fn avg_window(
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
pub(super) fn avg_row<A: Acc>(
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
pub(super) fn check_avg(op: &str, geo: &PoolGeometry) -> Result<()> {
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

pub(super) fn avg_as<A: Acc>(
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
pub(super) fn sum_window<A: Acc>(
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
pub(super) fn sum_run<A: Acc>(v: &[A]) -> A {
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
pub(super) unsafe fn spread<A: Acc>(
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

pub(super) fn avg_backward_as<A: Acc>(
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
pub(super) fn adaptive(i: usize, o: usize, n: usize) -> (usize, usize) {
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

pub(super) fn adaptive_as<A: Acc>(x: &Tensor, p: &Plan, out: &TensorType) -> Result<Tensor> {
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

pub(super) fn adaptive_backward_as<A: Acc>(
    gy: &Tensor,
    p: &Plan,
    out: &TensorType,
) -> Result<Tensor> {
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
