//! Max pooling, forward and backward; NaN wins, as in PyTorch.

use super::*;

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
fn window_max<T: Elem, const IDX: bool>(
    x: &[T],
    xs: [usize; 4],
    p: &Plan,
    geo: &Geometry,
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
        best.fill(T::LOWEST);
        if IDX {
            idx[..len].fill(usize::MAX);
        }
    }
}

/// The maxima of output row `oh` of one NCHW plane `x` into `best` (OW of them) and, when
/// `IDX`, their flat input positions into `idx`: [`window_max`]'s rule, run along the row
/// so that the inner loop is over output columns.
fn max_row<T: Elem, const IDX: bool>(
    x: &[T],
    p: &Plan,
    geo: &Geometry,
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
    best.fill(T::LOWEST);
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

/// The maximum of each window of `x` into `y`, positions outside the input skipped; both
/// dense in `p`'s order.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn forward<T: Elem>(x: &[T], p: &Plan, geo: &Geometry, y: &mut [T]) {
    let [xn, yn] = p.lens();
    assert!(x.len() >= xn && y.len() >= yn, "max_pool2d: short operands");
    if yn == 0 {
        return;
    }
    let y = &mut y[..yn];
    let xs = p.in_strides();
    let work = yn * geo.kernel[0] * geo.kernel[1];
    for_rows(p, y, work, &|n, c, oh, dst| {
        if p.nhwc {
            for (ow, d) in dst.chunks_mut(p.c).enumerate() {
                window_max::<T, false>(x, xs, p, geo, (n, 0, oh, ow), d, &mut []);
            }
        } else {
            max_row::<T, false>(p.plane(x, n, c), p, geo, oh, dst, &mut []);
        }
    });
}

/// The gradient of max pooling into `dx`: each output's gradient `gy` goes to the first
/// maximal element of its window in `x` (a NaN counting as the maximum), accumulated where
/// windows overlap; every operand dense in `p`'s order.
///
/// # Panics
/// When a slice is shorter than `p` needs.
pub fn backward<T: Elem, A: Real>(gy: &[A], x: &[T], p: &Plan, geo: &Geometry, dx: &mut [A]) {
    let [xn, yn] = p.lens();
    assert!(
        x.len() >= xn && gy.len() >= yn && dx.len() >= xn,
        "max_pool2d_backward: short operands"
    );
    dx[..xn].fill(A::ZERO);
    if xn == 0 || yn == 0 {
        return;
    }
    let (xs, gs) = (p.in_strides(), p.out_strides());
    let work = yn * geo.kernel[0] * geo.kernel[1];
    let dxp = SendPtr(dx.as_mut_ptr());
    let (xv, gv) = (x, gy);
    for_blocks(p, work, &|n, c0, c1| {
        if !p.nhwc {
            // one plane, a row of outputs at a time
            let (plane, base) = (p.plane(xv, n, c0), (n * p.c + c0) * p.h * p.w);
            let mut best = vec![T::LOWEST; p.ow];
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
        let mut best = vec![T::LOWEST; len];
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
}
