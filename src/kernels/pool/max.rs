//! Max pooling, forward (values and argmax indices) and backward; NaN wins, as in PyTorch.

use super::*;

/// `v != v`: NaN, for any element type (always false for integers).
#[allow(clippy::eq_op)]
pub(super) fn is_nan<T: PartialEq>(v: T) -> bool {
    v != v
}

/// The maximum of the window of output (`oh`, `ow`) of image `n`, for the channels from
/// `c0` that `best` holds, and, when `IDX`, the flat input position `ih·W + iw` it was
/// found at (`usize::MAX` for a window with no element inside the input, whose maximum
/// is `-inf`).
#[allow(clippy::too_many_arguments)]
pub(super) fn window_max<T: Element + PartialOrd, const IDX: bool>(
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
pub(super) fn max_row<T: Element + PartialOrd, const IDX: bool>(
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

pub(super) fn max_pool_as<T: Element + PartialOrd>(
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

pub(super) fn max_backward_as<T: Element + PartialOrd, A: Acc>(
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
