//! The convolution itself: im2col tiles times the weights as GEMMs (NCHW and NHWC), the
//! direct kernels for small channel counts, and the tiled epilogue that fused callers run.

use super::*;

/// y[n, g·Cog+o, oh, ow] = bias[o'] + Σ_{c in group g, kh, kw} x[n, c, oh·s − pad_lo + kh·d, …]
/// · w[o', c − g·Cig, kh, kw].
///
/// `x` is `[N, C_in, H, W]` (or `[N, C_in, L]` for 1-d), `w` is `[C_out, C_in/groups, kH, kW]`,
/// `bias` is `[C_out]` or `None`. `out` is the result type (dtype and shape
/// `[N, C_out, OH, OW]`). Inputs may be any strided view. A channels_last `x` gives a
/// channels_last result, anything else a contiguous one.
pub fn forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    Ok(forward_then(x, w, bias, geo, out, None)?.0)
}

/// A pointwise epilogue of a convolution: `f(y, start, len)` computes the elements
/// `start..start + len` (in memory order) of whatever reads the convolution's output, `y`
/// being that output's first element. Ranges of different calls never overlap, and calls
/// come from several threads at once.
pub type Epilogue<'a> = &'a (dyn Fn(*mut u8, usize, usize) -> Result<()> + Sync);

/// [`forward`], running `epi` over each tile of the output as soon as the tile is written,
/// while it is still in cache, so that the epilogue costs no pass of its own over memory.
/// The flag says whether it ran: not when the result is rounded to another dtype after the
/// convolution (f16, bf16) or the convolution is depthwise, and then the caller runs it.
pub fn forward_then(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    geo: &ConvGeometry,
    out: &TensorType,
    epi: Option<Epilogue>,
) -> Result<(Tensor, bool)> {
    let d = plan("convolution", x.shape(), w.shape(), &out.shape, geo)?;
    if let Some(b) = bias
        && b.shape() != [d.co]
    {
        bail!(
            Shape,
            "convolution: bias of shape {:?} for {} output channels",
            b.shape(),
            d.co
        );
    }
    compute_type("convolution", x.dtype())?;
    match compute_type("convolution", out.dtype)? {
        DType::F64 => forward_in::<f64>(x, w, bias, &d, out, epi),
        _ => forward_in::<f32>(x, w, bias, &d, out, epi),
    }
}

/// An epilogue called from the tile tasks; its first error stops later calls and is
/// returned after the convolution.
pub(super) struct TileEpilogue<'a> {
    f: Epilogue<'a>,
    failed: std::sync::atomic::AtomicBool,
    err: std::sync::Mutex<Option<crate::Error>>,
}

/// Tasks still to finish per block of the output: the task that finishes a block's last
/// tile runs the epilogue over the whole block, while it is still in cache.
pub(super) struct Blocks(Vec<std::sync::atomic::AtomicUsize>);

impl Blocks {
    pub(super) fn new(blocks: usize, tasks_each: usize) -> Blocks {
        Blocks((0..blocks).map(|_| tasks_each.into()).collect())
    }
    /// One task of block `b` is done; true for the last one (which then sees every other
    /// task's writes: the count is released by each and acquired by the last).
    pub(super) fn done(&self, b: usize) -> bool {
        self.0[b].fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1
    }
}

impl TileEpilogue<'_> {
    fn run<A>(&self, y: *mut A, start: usize, len: usize) {
        use std::sync::atomic::Ordering;
        if len == 0 || self.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = (self.f)(y as *mut u8, start, len) {
            self.failed.store(true, Ordering::Relaxed);
            let mut slot = self.err.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
    }
}

pub(super) fn forward_in<A: Acc>(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    d: &Dims,
    out: &TensorType,
    epi: Option<Epilogue>,
) -> Result<(Tensor, bool)> {
    let nhwc = prefers_nhwc(x);
    if d.n * d.co * d.opix() == 0 {
        // nothing for an epilogue to compute either
        return Ok((produce::<A>(out, nhwc, false, |_| {})?, epi.is_some()));
    }
    let tiles = epi
        .filter(|_| out.dtype == A::DTYPE && !d.depthwise())
        .map(|f| TileEpilogue {
            f,
            failed: false.into(),
            err: std::sync::Mutex::new(None),
        });
    let te = tiles.as_ref();
    let bv = match bias {
        Some(b) => Some(copy::to_vec::<A>(&dense::<A>(b, false)?)?),
        None => None,
    };
    let bv = bv.as_deref();
    // f32 convolutions on register tiles read the weights reordered (and cached across
    // calls); depthwise weights are read as [C, kH·kW] either way; NHWC GEMMs want
    // [Cout, kH, kW, Cin_g]
    let direct = if A::DTYPE == crate::DType::F32 && !d.depthwise() && direct::applies(d) {
        Some(direct::prepared(w, nhwc, d)?)
    } else {
        None
    };
    let wv = match direct {
        Some(_) => Vec::new(),
        None => copy::to_vec::<A>(&dense::<A>(w, nhwc && !d.depthwise())?)?,
    };
    let xd = dense::<A>(x, nhwc)?;
    let t = produce::<A>(out, nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xs| {
            if d.depthwise() && nhwc {
                depthwise_forward_nhwc(xs, &wv, bv, d, y);
            } else if d.depthwise() {
                depthwise_forward(xs, &wv, bv, d, y);
            } else if let Some(wt) = &direct {
                // the whole output written by register tiles (f32, which `direct` checked)
                let done = forward_direct((xs, wt, bv), d, nhwc, y, te);
                debug_assert!(done);
            } else if nhwc {
                forward_nhwc(xs, &wv, bv, d, y, te);
            } else {
                forward_nchw(xs, &wv, bv, d, y, te);
            }
        })
    })?;
    match tiles {
        Some(te) => match te.err.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok((t, true)),
        },
        None => Ok((t, false)),
    }
}

/// Writes `value` into `len` elements from `p`.
///
/// # Safety
/// The elements lie in one allocation nothing else accesses.
pub(super) unsafe fn fill_at<A: Copy>(p: *mut A, len: usize, value: A) {
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts_mut(p, len).fill(value) }
}

/// The column buffer `col[kk, p1−p0]` of output pixels `p0..p1` (flat over OH·OW) from the
/// `Cin_g` input planes `xg` of one image and group.
pub(super) fn gather_nchw<A: Acc>(xg: &[A], d: &Dims, p0: usize, p1: usize, col: &mut [A]) {
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
                        None => seg.fill(A::zero()),
                        Some(ih) => {
                            let row = &plane[ih * d.w..(ih + 1) * d.w];
                            let (lo, hi) = d.cols(ow0, ow1, j);
                            seg[..lo - ow0].fill(A::zero());
                            seg[hi - ow0..].fill(A::zero());
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
pub(super) fn gather_nhwc<A: Acc>(
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
                taps.fill(A::zero());
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
                    dst.fill(A::zero());
                }
            }
        }
    }
}

/// NCHW forward: per (image, group, tile) `y[Cog, tile] = W_g · col`.
pub(super) fn forward_nchw<A: Acc>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
    epi: Option<&TileEpilogue>,
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
                e.run(yp.get(), (ni * d.co + gi * cog) * opix, cog * opix);
            }
        }
    });
}

/// The forward of f32 by [`direct::forward`], `w` as [`direct::prepared`] gives it; false
/// (nothing written) unless the operands are f32 and the convolution is one it takes.
pub(super) fn forward_direct<A: Acc>(
    (x, w, bias): (&[A], &[f32], Option<&[A]>),
    d: &Dims,
    nhwc: bool,
    y: &mut [A],
    epi: Option<&TileEpilogue>,
) -> bool {
    let bias = match bias.map(f32s) {
        Some(None) => return false,
        b => b.flatten(),
    };
    let (Some(x), Some(y)) = (f32s(x), f32s_mut(y)) else {
        return false;
    };
    if !direct::applies(d) {
        return false;
    }
    let yp = SendPtr(y.as_mut_ptr());
    direct::forward((x, w, bias), d, nhwc, y, &|start, len| {
        if let Some(e) = epi {
            e.run(yp.get(), start, len);
        }
    });
    true
}

/// NHWC forward: per (image, tile, group) `y[tile, Cog] = col · W_gᵀ`, with `w` as
/// `[Cout, kH, kW, Cin_g]`.
pub(super) fn forward_nhwc<A: Acc>(
    x: &[A],
    w: &[A],
    bias: Option<&[A]>,
    d: &Dims,
    y: &mut [A],
    epi: Option<&TileEpilogue>,
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
                    e.run(yp.get(), (ni * opix + p0) * d.co, np * d.co);
                } else if blocks.done(ni) {
                    e.run(yp.get(), ni * opix * d.co, opix * d.co);
                }
            }
        }
    });
}
