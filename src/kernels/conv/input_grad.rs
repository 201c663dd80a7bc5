//! The gradient of a convolution for its input: the weights times the output gradient
//! as GEMMs, scattered back over the input (col2im), NCHW and NHWC.

use super::*;

/// Adds the column buffer `col[kk, p1−p0]` of output pixels `p0..p1` into input channels
/// `ci0..ci1` of one image and group, whose channel 0 starts at `dx`.
///
/// # Safety
/// `dx` addresses the group's `Cin_g` planes, and nothing else accesses channels
/// `ci0..ci1` of them.
pub(super) unsafe fn scatter_nchw<A: Acc>(
    col: &[A],
    d: &Dims,
    (p0, p1): (usize, usize),
    (ci0, ci1): (usize, usize),
    dx: SendPtr<A>,
) {
    let np = p1 - p0;
    let ipix = d.ipix();
    for ci in ci0..ci1 {
        // SAFETY: the caller's channel `ci` is `ipix` elements that only this call accesses.
        let plane = unsafe { std::slice::from_raw_parts_mut(dx.get().add(ci * ipix), ipix) };
        for i in 0..d.kh {
            for j in 0..d.kw {
                let r = (ci * d.kh + i) * d.kw + j;
                let src = &col[r * np..(r + 1) * np];
                let off = d.col_off(j);
                let mut p = p0;
                while p < p1 {
                    let (oh, ow0) = (p / d.ow, p % d.ow);
                    let ow1 = d.ow.min(ow0 + (p1 - p));
                    if let Some(ih) = d.in_row(oh, i) {
                        let row = &mut plane[ih * d.w..(ih + 1) * d.w];
                        let (lo, hi) = d.cols(ow0, ow1, j);
                        if lo < hi {
                            let seg = &src[p - p0 + (lo - ow0)..p - p0 + (hi - ow0)];
                            let s0 = ((lo * d.sw) as isize + off) as usize;
                            if d.sw == 1 {
                                for (a, &v) in row[s0..s0 + (hi - lo)].iter_mut().zip(seg) {
                                    *a += v;
                                }
                            } else {
                                for (k, &v) in seg.iter().enumerate() {
                                    row[s0 + k * d.sw] += v;
                                }
                            }
                        }
                    }
                    p += ow1 - ow0;
                }
            }
        }
    }
}

/// Adds the column buffer `col[p1−p0, kk]` of output pixels `p0..p1` of group `g` into
/// the group's channels `c0..c1` of the NHWC image at `dx`.
///
/// # Safety
/// `dx` addresses one NHWC image, and nothing else accesses those channels of it.
pub(super) unsafe fn scatter_nhwc<A: Acc>(
    col: &[A],
    d: &Dims,
    g: usize,
    (p0, p1): (usize, usize),
    (c0, c1): (usize, usize),
    dx: SendPtr<A>,
) {
    let (kk, cig) = (d.kk(), d.cig());
    for p in p0..p1 {
        let (oh, ow) = (p / d.ow, p % d.ow);
        let row = &col[(p - p0) * kk..(p - p0 + 1) * kk];
        let iw0 = (ow * d.sw) as isize + d.col_off(0);
        for i in 0..d.kh {
            let Some(ih) = d.in_row(oh, i) else {
                continue;
            };
            if d.g == 1
                && d.dw == 1
                && (c0, c1) == (0, cig)
                && iw0 >= 0
                && iw0 as usize + d.kw <= d.w
            {
                // one group, taps side by side, all inside: one run of kW·C elements
                let s = (ih * d.w + iw0 as usize) * d.c;
                let src = &row[i * d.kw * cig..(i + 1) * d.kw * cig];
                // SAFETY: the whole run lies in the image, whose channels are all the caller's.
                let dst = unsafe { std::slice::from_raw_parts_mut(dx.get().add(s), src.len()) };
                for (a, &v) in dst.iter_mut().zip(src) {
                    *a += v;
                }
                continue;
            }
            for j in 0..d.kw {
                let iw = (ow * d.sw) as isize + d.col_off(j);
                if iw < 0 || iw as usize >= d.w {
                    continue;
                }
                let s = (ih * d.w + iw as usize) * d.c + g * cig;
                let src = &row[(i * d.kw + j) * cig + c0..(i * d.kw + j) * cig + c1];
                // SAFETY: channels c0..c1 of the group at this pixel, only this call's.
                let dst = unsafe { std::slice::from_raw_parts_mut(dx.get().add(s + c0), c1 - c0) };
                for (a, &v) in dst.iter_mut().zip(src) {
                    *a += v;
                }
            }
        }
    }
}

/// dL/dx given dL/dy `gy` (`[N, C_out, OH, OW]`) and the weight `w`; `out` is x's type.
/// A channels_last `gy` gives a channels_last result, anything else a contiguous one.
pub fn backward_input(
    gy: &Tensor,
    w: &Tensor,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let d = plan(
        "convolution_backward",
        &out.shape,
        w.shape(),
        gy.shape(),
        geo,
    )?;
    compute_type("convolution_backward", gy.dtype())?;
    match compute_type("convolution_backward", out.dtype)? {
        DType::F64 => backward_input_in::<f64>(gy, w, &d, out),
        _ => backward_input_in::<f32>(gy, w, &d, out),
    }
}

pub(super) fn backward_input_in<A: Acc>(
    gy: &Tensor,
    w: &Tensor,
    d: &Dims,
    out: &TensorType,
) -> Result<Tensor> {
    let nhwc = prefers_nhwc(gy);
    if d.n * d.c * d.ipix() == 0 || d.co == 0 || d.opix() == 0 {
        return produce::<A>(out, nhwc, true, |_| {});
    }
    let wv = copy::to_vec::<A>(&dense::<A>(w, nhwc && !d.depthwise())?)?;
    let gd = dense::<A>(gy, nhwc)?;
    // the direct product writes every element; the others add into zeros
    let direct = f32s(&wv).is_some() && direct::applies_to_input(d);
    produce::<A>(out, nhwc, !direct, |dx| {
        with_elements::<A, _>(&gd, |gs| {
            if d.depthwise() && nhwc {
                depthwise_backward_input_nhwc(gs, &wv, d, dx);
            } else if d.depthwise() {
                depthwise_backward_input(gs, &wv, d, dx);
            } else if let (true, Some(gs), Some(w), Some(dx)) =
                (direct, f32s(gs), f32s(&wv), f32s_mut(dx))
            {
                direct::backward_input(gs, w, d, nhwc, dx);
            } else {
                backward_input_gemm(gs, &wv, d, nhwc, dx);
            }
        })
    })
}

/// The column buffer of output pixels `p0..p1` of image `ni`, group `gi`: `W_gᵀ · gy` as
/// `col[kk, pixels]` in NCHW, `gy · W_g` as `col[pixels, kk]` in NHWC.
#[allow(clippy::too_many_arguments)]
pub(super) fn input_columns<A: Acc>(
    gy: &[A],
    w: &[A],
    d: &Dims,
    nhwc: bool,
    (ni, gi): (usize, usize),
    (p0, p1): (usize, usize),
    col: &mut [A],
    par: Parallelism,
) {
    let (cog, kk, opix) = (d.cog(), d.kk(), d.opix());
    let np = p1 - p0;
    // SAFETY: col holds kk × np; gy and w hold the elements their strides address.
    unsafe {
        if nhwc {
            gemm_at(
                (np, kk, cog),
                col.as_mut_ptr(),
                (kk, 1),
                false,
                gy.as_ptr().add((ni * opix + p0) * d.co + gi * cog),
                (d.co, 1),
                w.as_ptr().add(gi * cog * kk),
                (kk, 1),
                par,
            );
        } else {
            gemm_at(
                (kk, np, cog),
                col.as_mut_ptr(),
                (np, 1),
                false,
                w.as_ptr().add(gi * cog * kk),
                (1, kk),
                gy.as_ptr().add((ni * d.co + gi * cog) * opix + p0),
                (opix, 1),
                par,
            );
        }
    }
}

/// The input gradient by GEMMs into column buffers and scatter-adds.
pub(super) fn backward_input_gemm<A: Acc>(gy: &[A], w: &[A], d: &Dims, nhwc: bool, dx: &mut [A]) {
    let (cig, kk, ipix, opix) = (d.cig(), d.kk(), d.ipix(), d.opix());
    let threads = threads::available();
    let dxp = SendPtr(dx.as_mut_ptr());
    // where group gi of image ni starts, and how its channels are cut among tasks
    let base = move |ni: usize, gi: usize| {
        let at = if nhwc {
            ni * ipix * d.c
        } else {
            (ni * d.c + gi * cig) * ipix
        };
        SendPtr(dxp.get().wrapping_add(at))
    };
    let scatter = |col: &[A], gi: usize, ps: (usize, usize), cs: (usize, usize), at: SendPtr<A>| {
        // SAFETY: the callers give each task its own image, group or channels.
        unsafe {
            if nhwc {
                scatter_nhwc(col, d, gi, ps, cs, at);
            } else {
                scatter_nchw(col, d, ps, cs, at);
            }
        }
    };
    if threads <= 1 || d.n * d.g >= 4 * threads {
        // one task per (image, group), its tiles in turn
        let tile = tile_len::<A>(kk, opix);
        par_tasks::<A>(d.n * d.g, kk * tile, &|t, col| {
            let (ni, gi) = (t / d.g, t % d.g);
            let mut p0 = 0;
            while p0 < opix {
                let p1 = opix.min(p0 + tile);
                input_columns(gy, w, d, nhwc, (ni, gi), (p0, p1), col, Parallelism::None);
                scatter(col, gi, (p0, p1), (0, cig), base(ni, gi));
                p0 = p1;
            }
        });
    } else {
        // few images: one at a time, a parallel GEMM, the scatter split over channels
        let tile = ((16 << 20) / (kk.max(1) * size_of::<A>())).clamp(1, opix);
        let mut col = vec![A::zero(); kk * tile];
        for ni in 0..d.n {
            for gi in 0..d.g {
                let mut p0 = 0;
                while p0 < opix {
                    let p1 = opix.min(p0 + tile);
                    let par = Parallelism::Rayon(threads);
                    input_columns(gy, w, d, nhwc, (ni, gi), (p0, p1), &mut col, par);
                    let colr = &col;
                    run_chunks(cig, threads * 4, &|_, c0, c1| {
                        scatter(colr, gi, (p0, p1), (c0, c1), base(ni, gi));
                    });
                    p0 = p1;
                }
            }
        }
    }
}
