//! f32 convolutions without column buffers, on `smelt_rt::tiles`.
//!
//! A row of output pixels is a product whose inner index runs over the kernel's taps, each
//! tap a span of contiguous input channels of the zero-padded image; the padded copy is
//! the only pass besides the product (a column buffer is `kH·kW` times the image). The
//! input gradient is, per phase of the stride, the same kind of product over the padded
//! output gradient; the weight gradient is a product whose inner index runs over the output
//! pixels, one span per row of them.
//!
//! Each applies to one group of f32 channels whose count ([`tiles::supports`]) fits the
//! tiles (a multiple of 8: 16 and 32 channels are one and two AVX-512 vectors): the output
//! channels for the forward and the weight gradient, the input channels for the input
//! gradient. The caller keeps its GEMMs for everything else.
//!
//! The products read and write NHWC: NCHW operands are reordered into the padded copy, and
//! NCHW results leave a row at a time through a buffer.

use super::Dims;
use crate::threads::{self, SendPtr};
use crate::tiles::{self, Operands, Span, Start};
use std::cell::RefCell;

/// Whether the forward and the weight gradient of `d` run here: one group, output
/// channels the tiles take.
pub fn applies(d: &Dims) -> bool {
    fits(d) && tiles::available()
}

/// Whether the forward of `d` fits the tiles (one group, output channels a multiple of 8),
/// whatever the CPU.
pub fn fits(d: &Dims) -> bool {
    d.g == 1 && tiles::fits(d.co)
}

/// Whether the input gradient of `d` runs here: one group, input channels the tiles take.
pub fn applies_to_input(d: &Dims) -> bool {
    d.g == 1 && tiles::supports(d.c)
}

thread_local! {
    /// The padded copies (two: the weight gradient of NCHW tensors reorders both operands),
    /// kept between calls: a new one per call would take fresh pages from the system each
    /// time (it is larger than the allocator keeps for reuse).
    static PADDED: [RefCell<Vec<f32>>; 2] = const { [RefCell::new(Vec::new()), RefCell::new(Vec::new())] };
}

/// An NHWC image batch with `(rows, cols)` zero borders: `[n, hp, wp, c]` whose element at
/// pixel `(r, q)` is the input's at `(r − top, q − left)`, or zero outside it.
#[derive(Clone, Copy)]
struct Padded {
    hp: usize,
    wp: usize,
    top: usize,
    left: usize,
}

impl Padded {
    fn len(&self, n: usize, c: usize) -> usize {
        n * self.hp * self.wp * c
    }
}

/// Runs `f` on `x` (`[n, h, w, c]`, or `[n, c, h, w]` unless `nhwc`) as NHWC padded as
/// `p` says: `x` itself when it is NHWC and needs no border, else a copy in this thread's
/// buffer `slot` (a fresh one when a nested call holds it).
fn with_padded<R>(
    x: &[f32],
    (n, h, w, c): (usize, usize, usize, usize),
    nhwc: bool,
    (p, slot): (Padded, usize),
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    if nhwc && (p.hp, p.wp, p.top, p.left) == (h, w, 0, 0) {
        return f(x);
    }
    let fill = |buf: &mut Vec<f32>| {
        buf.resize(p.len(n, c), 0.0);
        let bp = SendPtr(buf.as_mut_ptr());
        let rows = n * p.hp;
        par_rows(rows, &|lo, hi| {
            for row in lo..hi {
                let (ni, r) = (row / p.hp, row % p.hp);
                // SAFETY: padded row `row` is this task's alone and inside the buffer
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(bp.get().add(row * p.wp * c), p.wp * c)
                };
                let src_row = r.checked_sub(p.top).filter(|&r| r < h);
                let Some(ir) = src_row else {
                    dst.fill(0.0);
                    continue;
                };
                let lo_q = p.left.min(p.wp);
                let hi_q = (p.left + w).min(p.wp);
                dst[..lo_q * c].fill(0.0);
                dst[hi_q * c..].fill(0.0);
                if nhwc {
                    let src = &x[(ni * h + ir) * w * c..][..(hi_q - lo_q) * c];
                    dst[lo_q * c..hi_q * c].copy_from_slice(src);
                } else {
                    for ch in 0..c {
                        let src = &x[((ni * c + ch) * h + ir) * w..][..hi_q - lo_q];
                        for (q, &v) in src.iter().enumerate() {
                            dst[(lo_q + q) * c + ch] = v;
                        }
                    }
                }
            }
        });
    };
    PADDED.with(|cells| match cells[slot].try_borrow_mut() {
        Ok(mut buf) => {
            fill(&mut buf);
            f(&buf)
        }
        Err(_) => {
            let mut buf = Vec::new();
            fill(&mut buf);
            f(&buf)
        }
    })
}

/// Writes `m` pixels of `c` channels, `src[m, c]`, as row `dst` of an NCHW image whose
/// planes are `plane` elements apart.
///
/// # Safety
/// `dst + ch·plane + q` is writable for every channel `ch` and pixel `q`, and no one else's.
unsafe fn store_nchw(src: &[f32], c: usize, dst: *mut f32, plane: usize) {
    for (q, px) in src.chunks_exact(c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            // SAFETY: as the caller promises
            unsafe { *dst.add(ch * plane + q) = v };
        }
    }
}

/// Element `(o, t, ci)` of weights `[Cout, kH, kW, Cin]` (`nhwc`) or `[Cout, Cin, kH, kW]`
/// with `taps = kH·kW` and `c = Cin`.
fn weight_at(
    w: &[f32],
    nhwc: bool,
    (taps, c): (usize, usize),
    (o, t, ci): (usize, usize, usize),
) -> f32 {
    if nhwc {
        w[(o * taps + t) * c + ci]
    } else {
        w[(o * c + ci) * taps + t]
    }
}

/// The taps' weights as rows of output channels, `[kH·kW·Cin, Cout]`: a transpose, done in
/// blocks (a row of the result gathers one element from every output channel's weights, so
/// row by row every read would miss the cache) and in parallel.
pub fn taps_by_channel(w: &[f32], nhwc: bool, (taps, c, co): (usize, usize, usize)) -> Vec<f32> {
    use rayon::prelude::*;
    const B: usize = 64;
    let mut wt = vec![0.0f32; taps * c * co];
    wt.par_chunks_mut(B * co)
        .enumerate()
        .for_each(|(bi, rows)| {
            let r0 = bi * B;
            for o0 in (0..co).step_by(B) {
                for (i, row) in rows.chunks_mut(co).enumerate() {
                    let (t, ci) = ((r0 + i) / c, (r0 + i) % c);
                    let end = co.min(o0 + B);
                    for (o, v) in (o0..end).zip(&mut row[o0..end]) {
                        *v = weight_at(w, nhwc, (taps, c), (o, t, ci));
                    }
                }
            }
        });
    wt
}

/// The input padded for the forward and the weight gradient: every tap of every output
/// pixel inside it.
fn input_padding(d: &Dims) -> Padded {
    Padded {
        hp: (d.oh - 1) * d.sh + (d.kh - 1) * d.dh + 1,
        wp: (d.ow - 1) * d.sw + (d.kw - 1) * d.dw + 1,
        top: d.ph,
        left: d.pw,
    }
}

/// `y[n, oh, ow, o] = bias[o] + Σ x[n, oh·s + i·d − p, ow·s + j·d − p, c] · w[o, i, j, c]`,
/// `x`, `w` and `y` in NHWC order (`[Cout, kH, kW, Cin]` for `w`) or, unless `nhwc`, NCHW
/// order; `done(start, len)` after each run of finished output elements (in memory order).
pub(super) fn forward(
    (x, w, bias): (&[f32], &[f32], Option<&[f32]>),
    d: &Dims,
    nhwc: bool,
    y: &mut [f32],
    done: &(dyn Fn(usize, usize) + Sync),
) {
    let (c, co, kk) = (d.c, d.co, d.kk());
    let wt = w;
    debug_assert_eq!(wt.len(), kk * co);
    let p = input_padding(d);
    let spans: Vec<Span> = taps(d)
        .map(|(i, j, t)| Span {
            a: ((i * d.dh * p.wp + j * d.dw) * c) as isize,
            b: (t * c * co) as isize,
            len: c,
        })
        .collect();
    with_padded(x, (d.n, d.h, d.w, c), nhwc, (p, 0), |xp| {
        let xpp = SendPtr(xp.as_ptr() as *mut f32);
        // output row `row` (image, oh) into `dst`, `co` apart from pixel to pixel
        let row_into = |row: usize, dst: *mut f32| {
            let (ni, oh) = (row / d.oh, row % d.oh);
            let op = Operands {
                a: xpp.get().wrapping_add((ni * p.hp + oh * d.sh) * p.wp * c),
                b: wt.as_ptr(),
                spans: &spans,
                a_rows: (d.sw * c) as isize,
                a_step: 1,
                b_step: co as isize,
            };
            let start = bias.map_or(Start::Zero, Start::Row);
            // SAFETY: the padded image holds every tap of the row's pixels; the caller
            // gives `dst` room for the row
            unsafe { tiles::product(&op, d.ow, co, dst, co as isize, start) };
        };
        write_rows(y, (d.n, d.oh, d.ow, co), nhwc, &row_into, done);
    });
}

/// Writes a result of `n` images of `rows × m` pixels of `c` channels row by row, rows in
/// parallel: `row_into(row, dst)` writes row `row` (counted over all images) as `m × c`
/// values at `dst`, straight into `out` when `nhwc`, else into a buffer that goes to the
/// rows of the channels' planes. `done(start, len)` after each run of finished elements in
/// memory order: runs of rows in NHWC, whole images in NCHW.
fn write_rows(
    out: &mut [f32],
    (n, rows, m, c): (usize, usize, usize, usize),
    nhwc: bool,
    row_into: &(dyn Fn(usize, *mut f32) + Sync),
    done: &(dyn Fn(usize, usize) + Sync),
) {
    let op = SendPtr(out.as_mut_ptr());
    let (row_len, image) = (m * c, rows * m * c);
    // rows of each image still to write (NCHW)
    let left = super::Blocks::new(if nhwc { 0 } else { n }, rows);
    par_rows(n * rows, &|lo, hi| {
        let mut buf = vec![0.0f32; if nhwc { 0 } else { row_len }];
        for row in lo..hi {
            if nhwc {
                // SAFETY: row `row` of the result is this task's alone
                row_into(row, unsafe { op.get().add(row * row_len) });
                continue;
            }
            row_into(row, buf.as_mut_ptr());
            let (ni, r) = (row / rows, row % rows);
            // SAFETY: row r of every plane of image ni is this task's alone
            unsafe { store_nchw(&buf, c, op.get().add(ni * image + r * m), rows * m) };
            if left.done(ni) {
                done(ni * image, image);
            }
        }
        if nhwc {
            done(lo * row_len, (hi - lo) * row_len);
        }
    });
}

/// The input gradient: `dx[n, h, w, c] = Σ gy[n, oh, ow, o] · w[o, i, j, c]` over the
/// taps and output pixels with `oh·s + i·d − p = h` (and the same along the width), `w` as
/// `[Cout, kH, kW, Cin]`. The pixels of one phase (`h mod s`, `w mod s`) take the same taps,
/// each from the output gradient shifted by a whole number of pixels: a row of them is a
/// product over those taps, reading the zero-padded gradient. Writes every element of `dx`;
/// `gy`, `w` and `dx` are ordered as for [`forward`].
pub(super) fn backward_input(gy: &[f32], w: &[f32], d: &Dims, nhwc: bool, dx: &mut [f32]) {
    let (c, co, taps_n) = (d.c, d.co, d.kh * d.kw);
    // the taps' weights as [kH·kW, Cout, Cin]
    let mut wt = vec![0.0f32; taps_n * co * c];
    for o in 0..co {
        for t in 0..taps_n {
            for ci in 0..c {
                wt[(t * co + o) * c + ci] = weight_at(w, nhwc, (taps_n, c), (o, t, ci));
            }
        }
    }
    let (ah, aw) = (
        Axis::new(d.h, d.oh, d.kh, d.sh, d.ph, d.dh),
        Axis::new(d.w, d.ow, d.kw, d.sw, d.pw, d.dw),
    );
    let p = Padded {
        hp: ah.padded,
        wp: aw.padded,
        top: ah.before,
        left: aw.before,
    };
    // per phase (h mod s, w mod s): the taps that reach it and their shifts
    let phases: Vec<Vec<Span>> = (0..d.sh * d.sw)
        .map(|ph| {
            let (fh, fw) = (ph / d.sw, ph % d.sw);
            let mut spans = vec![];
            for (i, j, t) in taps(d) {
                if let (Some(eh), Some(ew)) = (ah.shift(fh, i), aw.shift(fw, j)) {
                    spans.push(Span {
                        a: (eh * p.wp as isize + ew) * co as isize,
                        b: (t * co * c) as isize,
                        len: co,
                    });
                }
            }
            spans
        })
        .collect();
    with_padded(gy, (d.n, d.oh, d.ow, co), nhwc, (p, 0), |gp| {
        let gpp = SendPtr(gp.as_ptr() as *mut f32);
        // input row `row` (image, ih) into `dst`, `c` apart from pixel to pixel
        let row_into = |row: usize, dst: *mut f32| {
            let (ni, ih) = (row / d.h, row % d.h);
            let (fh, th) = (ih % d.sh, ih / d.sh);
            for fw in 0..d.sw.min(d.w) {
                let op = Operands {
                    a: gpp
                        .get()
                        .wrapping_add(((ni * p.hp + th + p.top) * p.wp + p.left) * co),
                    b: wt.as_ptr(),
                    spans: &phases[fh * d.sw + fw],
                    a_rows: co as isize,
                    a_step: 1,
                    b_step: c as isize,
                };
                let m = (d.w - fw).div_ceil(d.sw);
                // SAFETY: the padded gradient holds every shifted tap of the phase's pixels
                // (`Axis`); the caller gives `dst` room for the row
                unsafe {
                    let at = dst.add(fw * c);
                    tiles::product(&op, m, c, at, (d.sw * c) as isize, Start::Zero)
                };
            }
        };
        write_rows(dx, (d.n, d.h, d.w, c), nhwc, &row_into, &|_, _| {});
    });
}

/// One spatial axis of the input gradient: the input pixel `φ + s·t` of phase `φ` takes tap
/// `i` from output pixel `t + e`, where `e = (φ + p − i·d) / s` when that divides.
#[derive(Clone, Copy)]
struct Axis {
    s: usize,
    p: usize,
    dl: usize,
    /// Zero pixels before the gradient: the most negative shift.
    before: usize,
    /// The padded length: every `t + e` of every phase inside it.
    padded: usize,
}

impl Axis {
    fn new(input: usize, output: usize, k: usize, s: usize, p: usize, dl: usize) -> Axis {
        let before = ((k - 1) * dl).div_ceil(s);
        let most = input.div_ceil(s) + p.div_ceil(s);
        Axis {
            s,
            p,
            dl,
            before,
            padded: before + output.max(most),
        }
    }

    /// The shift `e` of tap `i` in phase `f`, when the tap reaches that phase.
    fn shift(&self, f: usize, i: usize) -> Option<isize> {
        let num = (f + self.p) as isize - (i * self.dl) as isize;
        let s = self.s as isize;
        (num.rem_euclid(s) == 0).then(|| num.div_euclid(s))
    }
}

/// The weight gradient as `[Cout, Cin, kH, kW]`: `Σ xp[n, oh·s + i·d, ow·s + j·d, c] ·
/// gy[n, oh, ow, o]` over every output pixel, computed as `[kH, kW, Cin] × Cout` rows: a
/// kernel row's taps and channels (adjacent in the padded image when the dilation is 1)
/// are rows of one product whose inner index runs over the output pixels, one span per row
/// of them. Each thread sums its run of images, a few at a time (so that their gradient
/// and input stay in cache across the kernel rows), into a partial sum; the partial sums
/// are added at the end.
pub(super) fn backward_weight(gy: &[f32], x: &[f32], d: &Dims, nhwc: bool) -> Vec<f32> {
    // NCHW operands are read as NHWC copies; the gradient's needs no border
    let flat = Padded {
        hp: d.oh,
        wp: d.ow,
        top: 0,
        left: 0,
    };
    with_padded(gy, (d.n, d.oh, d.ow, d.co), nhwc, (flat, 1), |gy| {
        weight_nhwc(gy, x, d, nhwc)
    })
}

/// [`backward_weight`] of an NHWC gradient.
fn weight_nhwc(gy: &[f32], x: &[f32], d: &Dims, nhwc: bool) -> Vec<f32> {
    let (c, co, kk) = (d.c, d.co, d.kk());
    let p = input_padding(d);
    let size = co * kk;
    let per_image = (d.oh * d.ow * co + p.hp * p.wp * c) * size_of::<f32>();
    let group = ((256 << 10) / per_image.max(1)).clamp(1, d.n);
    let chunks = threads::available().min(d.n).max(1);
    let mut parts = vec![0.0f32; chunks * size];
    let pp = SendPtr(parts.as_mut_ptr());
    // (first tap, rows): a kernel row at a time, or a tap at a time when dilated
    let blocks: Vec<(usize, usize)> = if d.dw == 1 {
        (0..d.kh).map(|i| (i * d.kw, d.kw * c)).collect()
    } else {
        taps(d).map(|(_, _, t)| (t, c)).collect()
    };
    with_padded(x, (d.n, d.h, d.w, c), nhwc, (p, 0), |xp| {
        let xpp = SendPtr(xp.as_ptr() as *mut f32);
        super::run_chunks(d.n, chunks, &|ci, lo, hi| {
            let mut spans = Vec::with_capacity(group * d.oh);
            let mut n0 = lo;
            while n0 < hi {
                let n1 = hi.min(n0 + group);
                spans.clear();
                for ni in n0..n1 {
                    for oh in 0..d.oh {
                        spans.push(Span {
                            a: (((ni * p.hp + oh * d.sh) * p.wp) * c) as isize,
                            b: (((ni * d.oh + oh) * d.ow) * co) as isize,
                            len: d.ow,
                        });
                    }
                }
                for &(t, rows) in &blocks {
                    let (i, j) = (t / d.kw, t % d.kw);
                    let op = Operands {
                        a: xpp.get().wrapping_add((i * d.dh * p.wp + j * d.dw) * c),
                        b: gy.as_ptr(),
                        spans: &spans,
                        a_rows: 1,
                        a_step: (d.sw * c) as isize,
                        b_step: co as isize,
                    };
                    // SAFETY: every span's pixels lie in `gy` and, for these taps, in the
                    // padded input; partial sum `ci` is this chunk's alone
                    unsafe {
                        let dst = pp.get().add(ci * size + t * c * co);
                        tiles::product(&op, rows, co, dst, co as isize, Start::Dst)
                    };
                }
                n0 = n1;
            }
        });
    });
    super::add_parts(&mut parts, size);
    // [kH, kW, Cin, Cout] to PyTorch's [Cout, Cin, kH, kW]
    let taps_n = d.kh * d.kw;
    let mut dw = vec![0.0f32; size];
    for t in 0..taps_n {
        for ci in 0..c {
            for o in 0..co {
                dw[(o * c + ci) * taps_n + t] = parts[(t * c + ci) * co + o];
            }
        }
    }
    dw
}

/// Runs `f(lo, hi)` over `0..count` cut into a few runs per thread.
fn par_rows(count: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    super::run_chunks(count, threads::available() * 4, &|_, lo, hi| f(lo, hi));
}

/// The kernel's taps `(i, j)` in memory order, with their index `i·kW + j`.
fn taps(d: &Dims) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    (0..d.kh * d.kw).map(move |t| (t / d.kw, t % d.kw, t))
}
