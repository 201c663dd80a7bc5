//! The column-buffer (im2col) paths: gathers and GEMMs for the forward and the weight
//! gradient, GEMMs and scatter-adds (col2im) for the input gradient, NCHW and NHWC.

use super::*;

/// The column buffer `col[kk, p1−p0]` of output pixels `p0..p1` (flat over OH·OW) from the
/// `Cin_g` input planes `xg` of one image and group.
pub(super) fn gather_nchw<A: Real>(xg: &[A], d: &Dims, p0: usize, p1: usize, col: &mut [A]) {
    let np = p1 - p0;
    let ipix = d.ipix();
    for ci in 0..d.cig() {
        let plane = &xg[ci * ipix..(ci + 1) * ipix];
        for i in 0..d.kh {
            for j in 0..d.kw {
                let r = (ci * d.kh + i) * d.kw + j;
                let dst = &mut col[r * np..(r + 1) * np];
                let off = d.col_off(j);
                let mut p = p0;
                while p < p1 {
                    let (oh, ow0) = (p / d.ow, p % d.ow);
                    let ow1 = d.ow.min(ow0 + (p1 - p));
                    let seg = &mut dst[p - p0..p - p0 + (ow1 - ow0)];
                    match d.in_row(oh, i) {
                        None => seg.fill(A::ZERO),
                        Some(ih) => {
                            let row = &plane[ih * d.w..(ih + 1) * d.w];
                            let (lo, hi) = d.cols(ow0, ow1, j);
                            seg[..lo - ow0].fill(A::ZERO);
                            seg[hi - ow0..].fill(A::ZERO);
                            let mid = &mut seg[lo - ow0..hi - ow0];
                            if lo < hi {
                                let s0 = (lo * d.sw) as isize + off;
                                let src = &row[s0 as usize..];
                                if d.sw == 1 {
                                    mid.copy_from_slice(&src[..hi - lo]);
                                } else {
                                    for (k, m) in mid.iter_mut().enumerate() {
                                        *m = src[k * d.sw];
                                    }
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

/// The column buffer `col[p1−p0, kk]` (patch order kH, kW, Cin_g) of output pixels
/// `p0..p1` of group `g` from the NHWC image `xi`.
pub(super) fn gather_nhwc<A: Real>(
    xi: &[A],
    d: &Dims,
    g: usize,
    p0: usize,
    p1: usize,
    col: &mut [A],
) {
    let (kk, cig) = (d.kk(), d.cig());
    for p in p0..p1 {
        let (oh, ow) = (p / d.ow, p % d.ow);
        let row = &mut col[(p - p0) * kk..(p - p0 + 1) * kk];
        let iw0 = (ow * d.sw) as isize + d.col_off(0);
        for i in 0..d.kh {
            let taps = &mut row[i * d.kw * cig..(i + 1) * d.kw * cig];
            let Some(ih) = d.in_row(oh, i) else {
                taps.fill(A::ZERO);
                continue;
            };
            if d.g == 1 && d.dw == 1 && iw0 >= 0 && iw0 as usize + d.kw <= d.w {
                // one group, taps side by side, all inside: one run of kW·C elements
                let s = (ih * d.w + iw0 as usize) * d.c;
                taps.copy_from_slice(&xi[s..s + taps.len()]);
                continue;
            }
            for (j, dst) in taps.chunks_mut(cig).enumerate() {
                let iw = (ow * d.sw) as isize + d.col_off(j);
                if iw >= 0 && (iw as usize) < d.w {
                    let s = (ih * d.w + iw as usize) * d.c + g * cig;
                    dst.copy_from_slice(&xi[s..s + cig]);
                } else {
                    dst.fill(A::ZERO);
                }
            }
        }
    }
}

/// NCHW forward: per (image, group, tile) `y[Cog, tile] = W_g · col`.
pub(super) fn forward_nchw<A: Real>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
    epi: Option<Epilogue>,
) {
    let (cig, cog, kk, ipix, opix) = (d.cig(), d.cog(), d.kk(), d.ipix(), d.opix());
    let direct = d.pointwise();
    let tile = tile_len::<A>(kk, opix);
    let tiles = opix.div_ceil(tile);
    let yp = SendPtr(y.as_mut_ptr());
    let scratch = if direct { 0 } else { kk * tile };
    // an image's channels of one group are one contiguous block of the output
    let blocks = Blocks::new(if epi.is_some() { d.n * d.g } else { 0 }, tiles);
    par_tasks::<A>(d.n * d.g * tiles, scratch, &|t, col| {
        let (ni, gi, ti) = (t / (d.g * tiles), t / tiles % d.g, t % tiles);
        let (p0, p1) = (ti * tile, opix.min(ti * tile + tile));
        let np = p1 - p0;
        let xg = &x[(ni * d.c + gi * cig) * ipix..(ni * d.c + (gi + 1) * cig) * ipix];
        // SAFETY: rows gi·Cog.. of image ni, pixels p0..p1: this task's alone; the weights,
        // column buffer and input hold the elements the strides address.
        unsafe {
            let dst = yp.get().add((ni * d.co + gi * cog) * opix + p0);
            if let Some(b) = bias {
                for o in 0..cog {
                    fill_at(dst.add(o * opix), np, b[gi * cog + o]);
                }
            }
            let (rhs, rrs) = if direct {
                (xg.as_ptr().add(p0), ipix)
            } else {
                gather_nchw(xg, d, p0, p1, col);
                (col.as_ptr(), np)
            };
            gemm_at(
                (cog, np, kk),
                dst,
                (opix, 1),
                bias.is_some(),
                w.as_ptr().add(gi * cog * kk),
                (kk, 1),
                rhs,
                (rrs, 1),
                Parallelism::None,
            );
            if let Some(e) = epi
                && blocks.done(ni * d.g + gi)
            {
                e(
                    yp.get() as *mut u8,
                    (ni * d.co + gi * cog) * opix,
                    cog * opix,
                );
            }
        }
    });
}

/// NHWC forward: per (image, tile, group) `y[tile, Cog] = col · W_gᵀ`, with `w` as
/// `[Cout, kH, kW, Cin_g]`.
pub(super) fn forward_nhwc<A: Real>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
    epi: Option<Epilogue>,
) {
    let (cig, cog, kk, ipix, opix) = (d.cig(), d.cog(), d.kk(), d.ipix(), d.opix());
    let direct = d.pointwise();
    let tile = tile_len::<A>(kk, opix);
    let tiles = opix.div_ceil(tile);
    let yp = SendPtr(y.as_mut_ptr());
    let scratch = if direct { 0 } else { kk * tile };
    // a tile of pixels is contiguous when one group has every channel, else an image is
    let blocks = Blocks::new(if epi.is_some() { d.n } else { 0 }, tiles * d.g);
    par_tasks::<A>(d.n * tiles * d.g, scratch, &|t, col| {
        let (ni, ti, gi) = (t / (tiles * d.g), t / d.g % tiles, t % d.g);
        let (p0, p1) = (ti * tile, opix.min(ti * tile + tile));
        let np = p1 - p0;
        let xi = &x[ni * ipix * d.c..(ni + 1) * ipix * d.c];
        // SAFETY: pixels p0..p1, channels gi·Cog.. of image ni: this task's alone; the
        // weights, column buffer and input hold the elements the strides address.
        unsafe {
            let dst = yp.get().add((ni * opix + p0) * d.co + gi * cog);
            if let Some(b) = bias {
                for p in 0..np {
                    std::slice::from_raw_parts_mut(dst.add(p * d.co), cog)
                        .copy_from_slice(&b[gi * cog..(gi + 1) * cog]);
                }
            }
            let (lhs, lrs) = if direct {
                (xi.as_ptr().add(p0 * d.c + gi * cig), d.c)
            } else {
                gather_nhwc(xi, d, gi, p0, p1, col);
                (col.as_ptr(), kk)
            };
            gemm_at(
                (np, cog, kk),
                dst,
                (d.co, 1),
                bias.is_some(),
                lhs,
                (lrs, 1),
                w.as_ptr().add(gi * cog * kk),
                (1, kk),
                Parallelism::None,
            );
            if let Some(e) = epi {
                if d.g == 1 {
                    e(yp.get() as *mut u8, (ni * opix + p0) * d.co, np * d.co);
                } else if blocks.done(ni) {
                    e(yp.get() as *mut u8, ni * opix * d.co, opix * d.co);
                }
            }
        }
    });
}

/// Adds the column buffer `col[kk, p1−p0]` of output pixels `p0..p1` into input channels
/// `ci0..ci1` of one image and group, whose channel 0 starts at `dx`.
///
/// # Safety
/// `dx` addresses the group's `Cin_g` planes, and nothing else accesses channels
/// `ci0..ci1` of them.
pub(super) unsafe fn scatter_nchw<A: Real>(
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
pub(super) unsafe fn scatter_nhwc<A: Real>(
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

/// The column buffer of output pixels `p0..p1` of image `ni`, group `gi`: `W_gᵀ · gy` as
/// `col[kk, pixels]` in NCHW, `gy · W_g` as `col[pixels, kk]` in NHWC.
#[allow(clippy::too_many_arguments)]
pub(super) fn input_columns<A: Real>(
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
pub(super) fn backward_input_gemm<A: Real>(gy: &[A], w: &[A], d: &Dims, nhwc: bool, dx: &mut [A]) {
    let (cig, kk, ipix, opix) = (d.cig(), d.kk(), d.ipix(), d.opix());
    let threads = crate::threads::available();
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
        let mut col = vec![A::ZERO; kk * tile];
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

/// The weight gradient `Σ gy · colᵀ` over images and tiles, as `[Cout, kk]` (patch order
/// Cin_g, kH, kW in NCHW; kH, kW, Cin_g in NHWC).
pub(super) fn backward_weight_gemm<A: Real>(gy: &[A], x: &[A], d: &Dims, nhwc: bool) -> Vec<A> {
    let (cig, cog, kk, ipix, opix) = (d.cig(), d.cog(), d.kk(), d.ipix(), d.opix());
    let direct = d.pointwise();
    let tile = tile_len::<A>(kk, opix);
    let tiles = opix.div_ceil(tile);
    let tasks = d.n * d.g * tiles;
    let chunks = crate::threads::available().min(tasks).max(1);
    let size = d.co * kk;
    let mut parts = vec![A::ZERO; chunks * size];
    let pp = SendPtr(parts.as_mut_ptr());
    run_chunks(tasks, chunks, &|c, lo, hi| {
        // SAFETY: partial sum c is this chunk's alone.
        let part = unsafe { std::slice::from_raw_parts_mut(pp.get().add(c * size), size) };
        let mut col = vec![A::ZERO; if direct { 0 } else { kk * tile }];
        for t in lo..hi {
            let (ni, gi, ti) = (t / (d.g * tiles), t / tiles % d.g, t % tiles);
            let (p0, p1) = (ti * tile, opix.min(ti * tile + tile));
            let np = p1 - p0;
            let dst = part[gi * cog * kk..].as_mut_ptr();
            // SAFETY: gy, x and col hold the elements their strides address.
            unsafe {
                if nhwc {
                    let xi = &x[ni * ipix * d.c..(ni + 1) * ipix * d.c];
                    let (rhs, rrs) = if direct {
                        (xi.as_ptr().add(p0 * d.c + gi * cig), d.c)
                    } else {
                        gather_nhwc(xi, d, gi, p0, p1, &mut col);
                        (col.as_ptr(), kk)
                    };
                    gemm_at(
                        (cog, kk, np),
                        dst,
                        (kk, 1),
                        true,
                        gy.as_ptr().add((ni * opix + p0) * d.co + gi * cog),
                        (1, d.co),
                        rhs,
                        (rrs, 1),
                        Parallelism::None,
                    );
                } else {
                    let xg = &x[(ni * d.c + gi * cig) * ipix..(ni * d.c + (gi + 1) * cig) * ipix];
                    let (rhs, rcs) = if direct {
                        (xg.as_ptr().add(p0), ipix)
                    } else {
                        gather_nchw(xg, d, p0, p1, &mut col);
                        (col.as_ptr(), np)
                    };
                    gemm_at(
                        (cog, kk, np),
                        dst,
                        (kk, 1),
                        true,
                        gy.as_ptr().add((ni * d.co + gi * cog) * opix + p0),
                        (opix, 1),
                        rhs,
                        (1, rcs),
                        Parallelism::None,
                    );
                }
            }
        }
    });
    add_parts(&mut parts, size);
    parts
}
