//! Depthwise convolutions (one filter per channel), forward and both gradients, NCHW and
//! NHWC: per-channel loops instead of GEMMs.

use super::*;

/// `dst[k] += a · x[k]`.
pub(super) fn axpy<A: Real>(dst: &mut [A], a: A, x: &[A]) {
    for (o, &v) in dst.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// `Σ a[k] · b[k]`, in eight interleaved partial sums (so it vectorises).
pub(super) fn dot<A: Real>(a: &[A], b: &[A]) -> A {
    let mut part = [A::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (u, v) in ca.zip(cb) {
        for k in 0..8 {
            part[k] += u[k] * v[k];
        }
    }
    let mut s = A::ZERO;
    for (&u, &v) in ra.iter().zip(rb) {
        s += u * v;
    }
    part.iter().fold(s, |s, &p| s + p)
}

/// Depthwise forward in NCHW by direct loops, per (image, channel) plane: each tap adds a
/// weighted run of an input row to a run of an output row. `w` is `[C, kH·kW]`.
pub(super) fn depthwise_forward<A: Real>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
) {
    let (ipix, opix) = (d.ipix(), d.opix());
    let yp = SendPtr(y.as_mut_ptr());
    par_tasks::<A>(d.n * d.c, 0, &|t, _| {
        let ci = t % d.c;
        // SAFETY: plane t of y is this task's alone.
        let yplane = unsafe { std::slice::from_raw_parts_mut(yp.get().add(t * opix), opix) };
        yplane.fill(bias.map_or(A::ZERO, |b| b[ci]));
        let xplane = &x[t * ipix..(t + 1) * ipix];
        for oh in 0..d.oh {
            let yrow = &mut yplane[oh * d.ow..(oh + 1) * d.ow];
            for i in 0..d.kh {
                let Some(ih) = d.in_row(oh, i) else {
                    continue;
                };
                let xrow = &xplane[ih * d.w..(ih + 1) * d.w];
                for j in 0..d.kw {
                    let wv = w[(ci * d.kh + i) * d.kw + j];
                    let (lo, hi) = d.cols(0, d.ow, j);
                    if lo >= hi {
                        continue;
                    }
                    let s0 = ((lo * d.sw) as isize + d.col_off(j)) as usize;
                    if d.sw == 1 {
                        axpy(&mut yrow[lo..hi], wv, &xrow[s0..s0 + (hi - lo)]);
                    } else {
                        for (k, o) in yrow[lo..hi].iter_mut().enumerate() {
                            *o += wv * xrow[s0 + k * d.sw];
                        }
                    }
                }
            }
        }
    });
}

/// Depthwise weights `[C, kH·kW]` as `[kH·kW, C]`: a tap's weights contiguous over channels.
pub(super) fn taps_by_channel<A: Real>(w: &[A], c: usize, kp: usize) -> Vec<A> {
    let mut t = vec![A::ZERO; kp * c];
    for ci in 0..c {
        for q in 0..kp {
            t[q * c + ci] = w[ci * kp + q];
        }
    }
    t
}

/// `dst[k] += a[k] · b[k]`.
pub(super) fn mul_add<A: Real>(dst: &mut [A], a: &[A], b: &[A]) {
    for ((o, &u), &v) in dst.iter_mut().zip(a).zip(b) {
        *o += u * v;
    }
}

/// Depthwise forward in NHWC, per (image, output row), the channels of a pixel together;
/// `w` is `[C, kH·kW]`, `y` dense NHWC.
pub(super) fn depthwise_forward_nhwc<A: Real>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
) {
    let c = d.c;
    let wt = taps_by_channel(w, c, d.kh * d.kw);
    let (row_len, image) = (d.ow * c, d.ipix() * c);
    let yp = SendPtr(y.as_mut_ptr());
    par_tasks::<A>(d.n * d.oh, 0, &|t, _| {
        let (ni, oh) = (t / d.oh, t % d.oh);
        // SAFETY: output row (ni, oh) is this task's alone.
        let row = unsafe { std::slice::from_raw_parts_mut(yp.get().add(t * row_len), row_len) };
        match bias {
            Some(b) => row.chunks_mut(c).for_each(|px| px.copy_from_slice(b)),
            None => row.fill(A::ZERO),
        }
        let xi = &x[ni * image..(ni + 1) * image];
        for i in 0..d.kh {
            let Some(ih) = d.in_row(oh, i) else {
                continue;
            };
            for j in 0..d.kw {
                let wj = &wt[(i * d.kw + j) * c..(i * d.kw + j + 1) * c];
                let (lo, hi) = d.cols(0, d.ow, j);
                for ow in lo..hi {
                    let iw = ((ow * d.sw) as isize + d.col_off(j)) as usize;
                    let src = &xi[(ih * d.w + iw) * c..(ih * d.w + iw + 1) * c];
                    mul_add(&mut row[ow * c..(ow + 1) * c], wj, src);
                }
            }
        }
    });
}

/// Depthwise input gradient in NHWC, per (image, input row): each input row gathers the
/// output rows whose windows reach it, the channels of a pixel together; `dx` is zeroed.
pub(super) fn depthwise_backward_input_nhwc<A: Real>(gy: &[A], w: &[A], d: &Dims, dx: &mut [A]) {
    let c = d.c;
    let wt = taps_by_channel(w, c, d.kh * d.kw);
    let (row_len, image) = (d.w * c, d.opix() * c);
    let dxp = SendPtr(dx.as_mut_ptr());
    par_tasks::<A>(d.n * d.h, 0, &|t, _| {
        let (ni, ih) = (t / d.h, t % d.h);
        // SAFETY: input row (ni, ih) is this task's alone.
        let row = unsafe { std::slice::from_raw_parts_mut(dxp.get().add(t * row_len), row_len) };
        let gi = &gy[ni * image..(ni + 1) * image];
        for i in 0..d.kh {
            // the output row oh with oh·sh + i·dh − ph = ih, if any
            let r = (ih + d.ph) as isize - (i * d.dh) as isize;
            if r < 0 || !(r as usize).is_multiple_of(d.sh) || r as usize / d.sh >= d.oh {
                continue;
            }
            let oh = r as usize / d.sh;
            for j in 0..d.kw {
                let wj = &wt[(i * d.kw + j) * c..(i * d.kw + j + 1) * c];
                let (lo, hi) = d.cols(0, d.ow, j);
                for ow in lo..hi {
                    let iw = ((ow * d.sw) as isize + d.col_off(j)) as usize;
                    let g = &gi[(oh * d.ow + ow) * c..(oh * d.ow + ow + 1) * c];
                    mul_add(&mut row[iw * c..(iw + 1) * c], wj, g);
                }
            }
        }
    });
}

/// Depthwise weight gradient in NHWC as `[C, kH·kW]`: per chunk of (image, output row)
/// a partial sum `[kH·kW, C]`, the channels of a pixel together; the partials added.
pub(super) fn depthwise_backward_weight_nhwc<A: Real>(gy: &[A], x: &[A], d: &Dims) -> Vec<A> {
    let (c, kp) = (d.c, d.kh * d.kw);
    let rows = d.n * d.oh;
    let chunks = crate::threads::available().min(rows).max(1);
    let size = kp * c;
    let mut parts = vec![A::ZERO; chunks * size];
    let pp = SendPtr(parts.as_mut_ptr());
    let (ximage, gimage) = (d.ipix() * c, d.opix() * c);
    run_chunks(rows, chunks, &|ch, lo, hi| {
        // SAFETY: partial sum ch is this chunk's alone.
        let part = unsafe { std::slice::from_raw_parts_mut(pp.get().add(ch * size), size) };
        for t in lo..hi {
            let (ni, oh) = (t / d.oh, t % d.oh);
            let xi = &x[ni * ximage..(ni + 1) * ximage];
            let grow = &gy[ni * gimage + oh * d.ow * c..ni * gimage + (oh + 1) * d.ow * c];
            for i in 0..d.kh {
                let Some(ih) = d.in_row(oh, i) else {
                    continue;
                };
                for j in 0..d.kw {
                    let acc = &mut part[(i * d.kw + j) * c..(i * d.kw + j + 1) * c];
                    let (lo, hi) = d.cols(0, d.ow, j);
                    for ow in lo..hi {
                        let iw = ((ow * d.sw) as isize + d.col_off(j)) as usize;
                        let src = &xi[(ih * d.w + iw) * c..(ih * d.w + iw + 1) * c];
                        mul_add(acc, &grow[ow * c..(ow + 1) * c], src);
                    }
                }
            }
        }
    });
    add_parts(&mut parts, size);
    let mut dw = vec![A::ZERO; size];
    for q in 0..kp {
        for ci in 0..c {
            dw[ci * kp + q] = parts[q * c + ci];
        }
    }
    dw
}

/// Depthwise input gradient in NCHW by direct loops, per (image, channel) plane: each tap
/// adds a weighted run of a gradient row to a run of an input row. `dx` is zeroed.
pub(super) fn depthwise_backward_input<A: Real>(gy: &[A], w: &[A], d: &Dims, dx: &mut [A]) {
    let (ipix, opix) = (d.ipix(), d.opix());
    let dxp = SendPtr(dx.as_mut_ptr());
    par_tasks::<A>(d.n * d.c, 0, &|t, _| {
        let ci = t % d.c;
        // SAFETY: plane t of dx is this task's alone.
        let xplane = unsafe { std::slice::from_raw_parts_mut(dxp.get().add(t * ipix), ipix) };
        let gplane = &gy[t * opix..(t + 1) * opix];
        for oh in 0..d.oh {
            let grow = &gplane[oh * d.ow..(oh + 1) * d.ow];
            for i in 0..d.kh {
                let Some(ih) = d.in_row(oh, i) else {
                    continue;
                };
                let xrow = &mut xplane[ih * d.w..(ih + 1) * d.w];
                for j in 0..d.kw {
                    let wv = w[(ci * d.kh + i) * d.kw + j];
                    let (lo, hi) = d.cols(0, d.ow, j);
                    if lo >= hi {
                        continue;
                    }
                    let s0 = ((lo * d.sw) as isize + d.col_off(j)) as usize;
                    if d.sw == 1 {
                        axpy(&mut xrow[s0..s0 + (hi - lo)], wv, &grow[lo..hi]);
                    } else {
                        for (k, &g) in grow[lo..hi].iter().enumerate() {
                            xrow[s0 + k * d.sw] += wv * g;
                        }
                    }
                }
            }
        }
    });
}

/// Depthwise weight gradient in NCHW by direct loops as `[C, kH·kW]`, one task per
/// channel over all images: each tap sums products of a gradient row and an input row.
pub(super) fn depthwise_backward_weight<A: Real>(gy: &[A], x: &[A], d: &Dims) -> Vec<A> {
    let (kp, ipix, opix) = (d.kh * d.kw, d.ipix(), d.opix());
    let mut dw = vec![A::ZERO; d.c * kp];
    let dwp = SendPtr(dw.as_mut_ptr());
    par_tasks::<A>(d.c, 0, &|ci, _| {
        // SAFETY: channel ci's taps are this task's alone.
        let taps = unsafe { std::slice::from_raw_parts_mut(dwp.get().add(ci * kp), kp) };
        for ni in 0..d.n {
            let t = ni * d.c + ci;
            let (xplane, gplane) = (&x[t * ipix..(t + 1) * ipix], &gy[t * opix..(t + 1) * opix]);
            for oh in 0..d.oh {
                let grow = &gplane[oh * d.ow..(oh + 1) * d.ow];
                for i in 0..d.kh {
                    let Some(ih) = d.in_row(oh, i) else {
                        continue;
                    };
                    let xrow = &xplane[ih * d.w..(ih + 1) * d.w];
                    for j in 0..d.kw {
                        let (lo, hi) = d.cols(0, d.ow, j);
                        if lo >= hi {
                            continue;
                        }
                        let s0 = ((lo * d.sw) as isize + d.col_off(j)) as usize;
                        taps[i * d.kw + j] += if d.sw == 1 {
                            dot(&grow[lo..hi], &xrow[s0..s0 + (hi - lo)])
                        } else {
                            let mut sum = A::ZERO;
                            for (k, &g) in grow[lo..hi].iter().enumerate() {
                                sum += g * xrow[s0 + k * d.sw];
                            }
                            sum
                        };
                    }
                }
            }
        }
    });
    dw
}
