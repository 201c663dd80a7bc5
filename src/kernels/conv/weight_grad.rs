//! The gradient of a convolution for its weights: the output gradient times the
//! gathered input tiles as GEMMs, summed over per-thread partial results.

use super::*;

/// Adds the partial sums of `size` elements laid end to end in `parts`, in order, into the
/// first, and keeps only that.
pub(super) fn add_parts<A: Copy + std::ops::AddAssign>(parts: &mut Vec<A>, size: usize) {
    let (first, rest) = parts.split_at_mut(size);
    for part in rest.chunks(size) {
        for (a, &b) in first.iter_mut().zip(part) {
            *a += b;
        }
    }
    parts.truncate(size);
}

/// dL/dw given dL/dy `gy` (`[N, C_out, OH, OW]`) and the input `x`; `out` is w's type.
/// The result is contiguous.
pub fn backward_weight(
    gy: &Tensor,
    x: &Tensor,
    geo: &ConvGeometry,
    out: &TensorType,
) -> Result<Tensor> {
    let d = plan(
        "convolution_backward",
        x.shape(),
        &out.shape,
        gy.shape(),
        geo,
    )?;
    compute_type("convolution_backward", gy.dtype())?;
    compute_type("convolution_backward", x.dtype())?;
    match compute_type("convolution_backward", out.dtype)? {
        DType::F64 => backward_weight_in::<f64>(gy, x, &d, out),
        _ => backward_weight_in::<f32>(gy, x, &d, out),
    }
}

pub(super) fn backward_weight_in<A: Acc>(
    gy: &Tensor,
    x: &Tensor,
    d: &Dims,
    out: &TensorType,
) -> Result<Tensor> {
    let kk = d.kk();
    if d.n * d.opix() == 0 || d.co * kk == 0 {
        return finish(vec![A::zero(); d.co * kk], false, out);
    }
    let nhwc = prefers_nhwc(x);
    let xd = dense::<A>(x, nhwc)?;
    let gd = dense::<A>(gy, nhwc)?;
    let dw = with_elements2::<A, A, _>(&xd, &gd, |xs, gs| {
        if d.depthwise() && nhwc {
            depthwise_backward_weight_nhwc(gs, xs, d)
        } else if d.depthwise() {
            depthwise_backward_weight(gs, xs, d)
        } else if let (true, Some(g), Some(x)) = (direct::applies(d), f32s(gs), f32s(xs))
            && let Some(dw) = cast_vec(direct::backward_weight(g, x, d, nhwc))
        {
            dw
        } else {
            let dw = backward_weight_gemm(gs, xs, d, nhwc);
            if nhwc {
                // [Cout, kH, kW, Cin_g] to [Cout, Cin_g, kH, kW]
                let (cig, kp) = (d.cig(), d.kh * d.kw);
                let mut t = vec![A::zero(); dw.len()];
                for o in 0..d.co {
                    for q in 0..kp {
                        for ci in 0..cig {
                            t[(o * cig + ci) * kp + q] = dw[(o * kp + q) * cig + ci];
                        }
                    }
                }
                t
            } else {
                dw
            }
        }
    });
    finish(dw, false, out)
}

/// The weight gradient `Σ gy · colᵀ` over images and tiles, as `[Cout, kk]` (patch order
/// Cin_g, kH, kW in NCHW; kH, kW, Cin_g in NHWC).
pub(super) fn backward_weight_gemm<A: Acc>(gy: &[A], x: &[A], d: &Dims, nhwc: bool) -> Vec<A> {
    let (cig, cog, kk, ipix, opix) = (d.cig(), d.cog(), d.kk(), d.ipix(), d.opix());
    let direct = d.pointwise();
    let tile = tile_len::<A>(kk, opix);
    let tiles = opix.div_ceil(tile);
    let tasks = d.n * d.g * tiles;
    let chunks = threads::available().min(tasks).max(1);
    let size = d.co * kk;
    let mut parts = vec![A::zero(); chunks * size];
    let pp = SendPtr(parts.as_mut_ptr());
    run_chunks(tasks, chunks, &|c, lo, hi| {
        // SAFETY: partial sum c is this chunk's alone.
        let part = unsafe { std::slice::from_raw_parts_mut(pp.get().add(c * size), size) };
        let mut col = vec![A::zero(); if direct { 0 } else { kk * tile }];
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
