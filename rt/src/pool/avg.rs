//! Average pooling, fixed windows (with or without the padding counted) and adaptive,
//! forward and backward.

use super::*;

/// Along dim `d` (of input size `n`), the input range `start..end` of average-pooling
/// window `o` clipped to the input, and the window's size before clipping: PyTorch's rule,
/// where a window ends at most `padding` past the input.
fn avg_span(geo: &Geometry, o: usize, d: usize, n: usize) -> (usize, usize, usize) {
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
    geo: &Geometry,
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
fn avg_row<A: Real>(
    x: &[A],
    p: &Plan,
    geo: &Geometry,
    count_include_pad: bool,
    oh: usize,
    dst: &mut [A],
) {
    dst.fill(A::ZERO);
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
            Some(div) => *d = *d / A::of_f64(div as f64),
            None => *d = A::ZERO,
        }
    }
}

/// Adds input rows `h0..h1`, columns `w0..w1` of image `n`, channels from `c0`, into `dst`
/// (one channel in NCHW, whose rows are contiguous runs; contiguous channels in NHWC).
fn sum_window<A: Real>(
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
fn sum_run<A: Real>(v: &[A]) -> A {
    if v.len() < 16 {
        return v.iter().fold(A::ZERO, |s, &x| s + x);
    }
    let mut part = [A::ZERO; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (p, &x) in part.iter_mut().zip(c) {
            *p += x;
        }
    }
    let mut s = A::ZERO;
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
unsafe fn spread<A: Real>(
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

/// The input range `start..end` of adaptive window `i` of `o` over `n` elements:
/// `floor(i·n/o)..ceil((i+1)·n/o)`.
fn adaptive(i: usize, o: usize, n: usize) -> (usize, usize) {
    (i * n / o, ((i + 1) * n).div_ceil(o))
}

/// Average pooling of `x` into `y`: each window's sum divided by PyTorch's divisor, the
/// window's size before clipping to the input (it ends at most `padding` past it) with
/// `count_include_pad`, else the number of its elements inside the input; a window with
/// nothing inside gives 0. Both dense in `p`'s order; `geo.dilation` is `[1, 1]`.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn forward<A: Real>(x: &[A], p: &Plan, geo: &Geometry, count_include_pad: bool, y: &mut [A]) {
    let [xn, yn] = p.lens();
    assert!(x.len() >= xn && y.len() >= yn, "avg_pool2d: short operands");
    if yn == 0 {
        return;
    }
    let y = &mut y[..yn];
    let xs = p.in_strides();
    let work = yn * geo.kernel[0] * geo.kernel[1];
    for_rows(p, y, work, &|n, c, oh, dst| {
        if !p.nhwc {
            avg_row(p.plane(x, n, c), p, geo, count_include_pad, oh, dst);
            return;
        }
        for (ow, d) in dst.chunks_mut(p.c).enumerate() {
            d.fill(A::ZERO);
            let window = avg_window(p, geo, count_include_pad, oh, ow);
            if let Some((h0, h1, w0, w1, div)) = window {
                sum_window(x, xs, (n, c), (h0, h1, w0, w1), d);
                let div = A::of_f64(div as f64);
                d.iter_mut().for_each(|v| *v = *v / div);
            }
        }
    });
}

/// The gradient of average pooling into `dx`: each output's gradient divided by its
/// divisor, added to every input element of its window; both dense in `p`'s order.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn backward<A: Real>(
    gy: &[A],
    p: &Plan,
    geo: &Geometry,
    count_include_pad: bool,
    dx: &mut [A],
) {
    let [xn, yn] = p.lens();
    assert!(
        gy.len() >= yn && dx.len() >= xn,
        "avg_pool2d_backward: short operands"
    );
    dx[..xn].fill(A::ZERO);
    if xn == 0 || yn == 0 {
        return;
    }
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let work = yn * geo.kernel[0] * geo.kernel[1];
    let dxp = SendPtr(dx.as_mut_ptr());
    for_blocks(p, work, &|n, c0, c1| {
        for oh in 0..p.oh {
            for ow in 0..p.ow {
                let Some((h0, h1, w0, w1, div)) = avg_window(p, geo, count_include_pad, oh, ow)
                else {
                    continue;
                };
                let g = &gy[Plan::at(gs, n, c0, oh, ow)..];
                let div = A::of_f64(div as f64);
                // SAFETY: channels c0..c1 of image n are this task's alone.
                unsafe { spread(dxp, xs, (n, c0, c1 - c0), (h0, h1, w0, w1), g, gs[1], div) };
            }
        }
    });
}

/// Adaptive average pooling of `x` into `y`: output (`i`, `j`) averages input rows
/// `floor(i·H/OH)..ceil((i+1)·H/OH)` and the columns alike; both dense in `p`'s order.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn adaptive_forward<A: Real>(x: &[A], p: &Plan, y: &mut [A]) {
    let [xn, yn] = p.lens();
    assert!(
        x.len() >= xn && y.len() >= yn,
        "adaptive_avg_pool2d: short operands"
    );
    if yn == 0 {
        return;
    }
    let y = &mut y[..yn];
    let xs = p.in_strides();
    for_rows(p, y, xn + yn, &|n, c, oh, dst| {
        let (h0, h1) = adaptive(oh, p.oh, p.h);
        for (ow, d) in dst.chunks_mut(dst.len() / p.ow).enumerate() {
            let (w0, w1) = adaptive(ow, p.ow, p.w);
            d.fill(A::ZERO);
            let count = (h1 - h0) * (w1 - w0);
            if count > 0 {
                sum_window(x, xs, (n, c), (h0, h1, w0, w1), d);
                let count = A::of_f64(count as f64);
                d.iter_mut().for_each(|v| *v = *v / count);
            }
        }
    });
}

/// The gradient of adaptive average pooling into `dx`: each output's gradient divided by
/// its window's size, added to every input element of the window.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn adaptive_backward<A: Real>(gy: &[A], p: &Plan, dx: &mut [A]) {
    let [xn, yn] = p.lens();
    assert!(
        gy.len() >= yn && dx.len() >= xn,
        "adaptive_avg_pool2d_backward: short operands"
    );
    dx[..xn].fill(A::ZERO);
    if xn == 0 || yn == 0 {
        return;
    }
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let dxp = SendPtr(dx.as_mut_ptr());
    for_blocks(p, yn + xn, &|n, c0, c1| {
        for oh in 0..p.oh {
            let (h0, h1) = adaptive(oh, p.oh, p.h);
            for ow in 0..p.ow {
                let (w0, w1) = adaptive(ow, p.ow, p.w);
                let count = (h1 - h0) * (w1 - w0);
                if count == 0 {
                    continue;
                }
                let g = &gy[Plan::at(gs, n, c0, oh, ow)..];
                let count = A::of_f64(count as f64);
                // SAFETY: channels c0..c1 of image n are this task's alone.
                unsafe { spread(dxp, xs, (n, c0, c1 - c0), (h0, h1, w0, w1), g, gs[1], count) };
            }
        }
    });
}
