//! Convolution (1-d and 2-d, grouped, strided, dilated, asymmetrically padded) and its two
//! gradients on dense slices: the kernels eager tensors, the JIT and ahead-of-time models
//! all run, so that their results agree bit for bit.
//!
//! Forward, per image, group and tile of output pixels: the tile's patches are gathered
//! into a small column buffer (about half an L2) and multiplied by the group's weights.
//! In NCHW the buffer is `col[Cin_g·kH·kW, pixels]` and the product `W[Cout_g, ·] · col`
//! writes rows of output channels; in NHWC (channels_last inputs) the buffer is
//! `col[pixels, kH·kW·Cin_g]`, whose rows are runs of contiguous channels, and the product
//! `col · Wᵀ` writes rows of output pixels. A 1×1, stride-1, unpadded convolution reads
//! the input directly, and a depthwise convolution (one input and one output channel per
//! group) runs a direct loop instead of one-channel GEMMs. Tasks (image, group, tile) run
//! in parallel, each GEMM on its own thread.
//!
//! The input gradient is the transposed convolution: `Wᵀ · gy` into a column buffer, then a
//! scatter-add of its patches into the image (per image, so no two threads write the same
//! elements; a batch too small to keep the threads busy runs one image at a time with a
//! parallel GEMM and a scatter split over channels). The weight gradient sums
//! `gy · colᵀ` over images and tiles, one partial sum per thread, added at the end.
//!
//! f32 with one group skips the column buffers where the channel counts fit register tiles
//! (`direct`, both layouts): at the channel counts of small networks the gather, the
//! scatter and the GEMMs' packing cost as much as the products (BENCHMARKS.md).
//!
//! Every operand is a dense buffer in NCHW order, or NHWC order when `nhwc`; the weights in
//! the order [`weight_order`] names. A 1-d convolution is the 2-d one with a height of 1.

mod columns;
mod depthwise;
mod direct;

pub use crate::threads::{SendPtr, run_chunks};
use columns::*;
use depthwise::*;
pub use direct::{applies, applies_to_input, taps_by_channel};
use gemm::Parallelism;

/// The float types the kernels compute in (f32 and f64).
pub trait Real:
    Copy
    + Send
    + Sync
    + PartialEq
    + Default
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
    + 'static
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// `v` rounded to this type.
    fn of_f64(v: f64) -> Self;
}
impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    fn of_f64(v: f64) -> f32 {
        v as f32
    }
}
impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn of_f64(v: f64) -> f64 {
        v
    }
}

/// `s` as f32 elements, when `A` is f32.
fn f32s<A: 'static>(s: &[A]) -> Option<&[f32]> {
    // SAFETY: `A` is f32
    (std::any::TypeId::of::<A>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// [`f32s`] of a mutable slice.
fn f32s_mut<A: 'static>(s: &mut [A]) -> Option<&mut [f32]> {
    // SAFETY: `A` is f32
    (std::any::TypeId::of::<A>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

/// `v` as a vector of `A`, when `A` is f32 (the way back from [`f32s`]).
fn cast_vec<A: 'static>(v: Vec<f32>) -> Option<Vec<A>> {
    let any: Box<dyn std::any::Any> = Box::new(v);
    any.downcast::<Vec<A>>().ok().map(|b| *b)
}

/// The problem, every tensor read as 4-d (a 1-d convolution has a height of 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Images.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub co: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride along the height.
    pub sh: usize,
    /// Stride along the width.
    pub sw: usize,
    /// Zeros above.
    pub ph: usize,
    /// Zeros to the left.
    pub pw: usize,
    /// Dilation along the height.
    pub dh: usize,
    /// Dilation along the width.
    pub dw: usize,
    /// Channel groups.
    pub g: usize,
}

impl Dims {
    /// The sizes in the order n, c, h, w, co, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g (a
    /// plan's conv step holds them so).
    pub fn to_array(&self) -> [usize; 16] {
        let d = self;
        [
            d.n, d.c, d.h, d.w, d.co, d.oh, d.ow, d.kh, d.kw, d.sh, d.sw, d.ph, d.pw, d.dh, d.dw,
            d.g,
        ]
    }
    /// The sizes from [`Dims::to_array`]'s order.
    pub fn from_array(a: [usize; 16]) -> Dims {
        let [n, c, h, w, co, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g] = a;
        Dims {
            n,
            c,
            h,
            w,
            co,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
            g,
        }
    }
    /// Input channels per group.
    pub fn cig(&self) -> usize {
        self.c / self.g
    }
    /// Output channels per group.
    pub fn cog(&self) -> usize {
        self.co / self.g
    }
    /// The length of a patch of one group: `Cin_g · kH · kW`.
    pub fn kk(&self) -> usize {
        self.cig() * self.kh * self.kw
    }
    /// Input pixels per image.
    pub fn ipix(&self) -> usize {
        self.h * self.w
    }
    /// Output pixels per image.
    pub fn opix(&self) -> usize {
        self.oh * self.ow
    }
    /// One input and one output channel per group.
    pub fn depthwise(&self) -> bool {
        self.cig() == 1 && self.cog() == 1
    }
    /// Elements of the input, the weights and the output.
    pub fn lens(&self) -> [usize; 3] {
        [
            self.n * self.c * self.ipix(),
            self.co * self.kk(),
            self.n * self.co * self.opix(),
        ]
    }
    /// Whether the kernels can run these sizes: positive groups dividing the channels,
    /// positive kernel sizes, strides and dilations, and every size and element count far
    /// from overflowing. (A caller that reads the sizes from a file checks this first.)
    pub fn consistent(&self) -> bool {
        const LIMIT: usize = 1 << 40;
        let all = [
            self.n, self.c, self.h, self.w, self.co, self.oh, self.ow, self.kh, self.kw, self.sh,
            self.sw, self.ph, self.pw, self.dh, self.dw, self.g,
        ];
        let spans = [
            self.oh.saturating_mul(self.sh),
            self.ow.saturating_mul(self.sw),
            self.kh.saturating_mul(self.dh),
            self.kw.saturating_mul(self.dw),
        ];
        let counts = [
            [self.n, self.c, self.h, self.w],
            [self.co, self.c, self.kh, self.kw],
            [self.n, self.co, self.oh, self.ow],
        ];
        self.g > 0
            && self.c.is_multiple_of(self.g)
            && self.co.is_multiple_of(self.g)
            && [self.kh, self.kw, self.sh, self.sw, self.dh, self.dw]
                .iter()
                .all(|&v| v > 0)
            && all.iter().chain(&spans).all(|&v| v < LIMIT)
            && counts.iter().all(|c| {
                c.iter()
                    .try_fold(1usize, |a, &b| a.checked_mul(b))
                    .is_some_and(|v| v < LIMIT)
            })
    }
    /// A 1×1, stride-1, unpadded convolution: the input is its own column matrix.
    fn pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.ph == 0
            && self.pw == 0
            && self.oh == self.h
            && self.ow == self.w
    }
    /// The input row of output row `oh` at kernel row `i`, when inside the input.
    fn in_row(&self, oh: usize, i: usize) -> Option<usize> {
        let ih = (oh * self.sh + i * self.dh) as isize - self.ph as isize;
        (ih >= 0 && (ih as usize) < self.h).then_some(ih as usize)
    }
    /// The input column of output column 0 at kernel column `j` (may be negative).
    fn col_off(&self, j: usize) -> isize {
        (j * self.dw) as isize - self.pw as isize
    }
    /// The output columns in `o0..o1` whose input column at kernel column `j` is inside.
    fn cols(&self, o0: usize, o1: usize, j: usize) -> (usize, usize) {
        valid_range(o0, o1, self.sw, self.col_off(j), self.w)
    }
}

/// The `o` in `o0..o1` for which `o·s + off` lies in `0..n`, as a range `lo..hi`.
pub fn valid_range(o0: usize, o1: usize, s: usize, off: isize, n: usize) -> (usize, usize) {
    let lo = if off >= 0 {
        0
    } else {
        (off.unsigned_abs()).div_ceil(s)
    };
    let lim = n as isize - off;
    let hi = if lim <= 0 {
        0
    } else {
        (lim as usize).div_ceil(s)
    };
    let lo = lo.clamp(o0, o1);
    (lo, hi.clamp(lo, o1))
}

/// How a kernel reads the weights `[Cout, Cin_g, kH, kW]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightOrder {
    /// As given, dense: `[Cout, Cin_g, kH, kW]`.
    Nchw,
    /// `[Cout, kH, kW, Cin_g]`.
    Nhwc,
    /// The register tiles' order, `[kH, kW, Cin, Cout]` ([`taps_by_channel`]).
    Taps,
}

/// The order [`forward`] reads the weights of `d` in, for f32 (`f32`) or f64 operands in
/// NHWC (`nhwc`) or NCHW order.
pub fn weight_order(d: &Dims, nhwc: bool, f32: bool) -> WeightOrder {
    weight_order_on(d, nhwc, f32, crate::tiles::available())
}

/// [`weight_order`] on a CPU that runs the register tiles (`tiles`: x86-64 with AVX2 and FMA)
/// or not: the order an object compiled for another machine lays its weights out in, for
/// [`forward`] there.
pub fn weight_order_on(d: &Dims, nhwc: bool, f32: bool, tiles: bool) -> WeightOrder {
    if d.depthwise() {
        WeightOrder::Nchw
    } else if f32 && tiles && direct::fits(d) {
        WeightOrder::Taps
    } else if nhwc {
        WeightOrder::Nhwc
    } else {
        WeightOrder::Nchw
    }
}

/// A pointwise epilogue of a convolution: `f(y, start, len)` computes the elements
/// `start..start + len` (in memory order) of whatever reads the convolution's output, `y`
/// being that output's first element. Ranges of different calls never overlap, and calls
/// come from several threads at once.
pub type Epilogue<'a> = &'a (dyn Fn(*mut u8, usize, usize) + Sync);

/// `y = conv(x, w) + bias`, `x` and `y` dense in NCHW order (NHWC when `nhwc`), `w` in the
/// order [`weight_order`] gives. `epi` runs over each block of `y` once it is written
/// (while it is still in cache); the result says whether it ran (not for a depthwise
/// convolution: then the caller runs it over the whole result).
///
/// # Panics
/// When a slice is shorter than `d` needs.
pub fn forward<A: Real>(
    (x, w, bias): (&[A], &[A], Option<&[A]>),
    d: &Dims,
    nhwc: bool,
    y: &mut [A],
    epi: Option<Epilogue>,
) -> bool {
    let [xn, wn, yn] = d.lens();
    assert!(
        x.len() >= xn && w.len() >= wn && y.len() >= yn,
        "conv: short operands"
    );
    assert!(bias.is_none_or(|b| b.len() >= d.co), "conv: short bias");
    if yn == 0 {
        return epi.is_some();
    }
    if d.depthwise() {
        if nhwc {
            depthwise_forward_nhwc(x, w, bias, d, y);
        } else {
            depthwise_forward(x, w, bias, d, y);
        }
        return false;
    }
    if weight_order(d, nhwc, f32s(x).is_some()) == WeightOrder::Taps
        && let (Some(x), Some(w), Some(y)) = (f32s(x), f32s(w), f32s_mut(y))
    {
        let bias = bias.and_then(f32s);
        let yp = SendPtr(y.as_mut_ptr());
        direct::forward((x, w, bias), d, nhwc, y, &|start, len| {
            if let Some(e) = epi {
                e(yp.get() as *mut u8, start, len);
            }
        });
    } else if nhwc {
        forward_nhwc(x, w, bias, d, y, epi);
    } else {
        forward_nchw(x, w, bias, d, y, epi);
    }
    true
}

/// dL/dx into `dx` from dL/dy `gy` and the weights `w` (`[Cout, kH, kW, Cin_g]` when
/// `nhwc` and not depthwise, else `[Cout, Cin_g, kH, kW]`); every operand dense in NCHW
/// order, or NHWC when `nhwc`. Writes every element of `dx`.
///
/// # Panics
/// When a slice is shorter than `d` needs.
pub fn backward_input<A: Real>(gy: &[A], w: &[A], d: &Dims, nhwc: bool, dx: &mut [A]) {
    let [xn, wn, yn] = d.lens();
    assert!(
        gy.len() >= yn && w.len() >= wn && dx.len() >= xn,
        "conv: short operands"
    );
    let direct = f32s(w).is_some() && direct::applies_to_input(d);
    if !direct || xn == 0 || yn == 0 {
        dx[..xn].fill(A::ZERO);
    }
    if xn == 0 || d.co == 0 || d.opix() == 0 {
        return;
    }
    if d.depthwise() && nhwc {
        depthwise_backward_input_nhwc(gy, w, d, dx);
    } else if d.depthwise() {
        depthwise_backward_input(gy, w, d, dx);
    } else if let (true, Some(gs), Some(w), Some(dx)) = (direct, f32s(gy), f32s(w), f32s_mut(dx)) {
        direct::backward_input(gs, w, d, nhwc, dx);
    } else {
        backward_input_gemm(gy, w, d, nhwc, dx);
    }
}

/// dL/dw, `[Cout, Cin_g, kH, kW]`, from dL/dy `gy` and the input `x`, both dense in NCHW
/// order, or NHWC when `nhwc`.
///
/// # Panics
/// When a slice is shorter than `d` needs.
pub fn backward_weight<A: Real>(gy: &[A], x: &[A], d: &Dims, nhwc: bool) -> Vec<A> {
    let [xn, wn, yn] = d.lens();
    assert!(gy.len() >= yn && x.len() >= xn, "conv: short operands");
    if d.n * d.opix() == 0 || wn == 0 {
        return vec![A::ZERO; wn];
    }
    if d.depthwise() && nhwc {
        return depthwise_backward_weight_nhwc(gy, x, d);
    }
    if d.depthwise() {
        return depthwise_backward_weight(gy, x, d);
    }
    if let (true, Some(g), Some(xs)) = (direct::applies(d), f32s(gy), f32s(x))
        && let Some(dw) = cast_vec(direct::backward_weight(g, xs, d, nhwc))
    {
        return dw;
    }
    let dw = backward_weight_gemm(gy, x, d, nhwc);
    if !nhwc {
        return dw;
    }
    // [Cout, kH, kW, Cin_g] to [Cout, Cin_g, kH, kW]
    let (cig, kp) = (d.cig(), d.kh * d.kw);
    let mut t = vec![A::ZERO; dw.len()];
    for o in 0..d.co {
        for q in 0..kp {
            for ci in 0..cig {
                t[(o * cig + ci) * kp + q] = dw[(o * kp + q) * cig + ci];
            }
        }
    }
    t
}

/// Output pixels per tile: as many as keep a tile's column buffer (`kk` values per pixel)
/// within half of a 1 MiB L2, but at least 128, so that the GEMMs stay wide enough to
/// run at speed when patches are long.
pub fn tile_len<A>(kk: usize, pixels: usize) -> usize {
    const COL_BYTES: usize = 512 << 10;
    let t = (COL_BYTES / (kk.max(1) * size_of::<A>())).max(128);
    t.min(pixels).max(1)
}

/// Runs `f(task, scratch)` for every task in `0..count`, in runs of consecutive tasks
/// spread over the threads; each run reuses one zeroed scratch buffer of `scratch` elements.
fn par_tasks<A: Real>(count: usize, scratch: usize, f: &(dyn Fn(usize, &mut [A]) + Sync)) {
    let chunks = crate::threads::available().saturating_mul(8);
    run_chunks(count, chunks, &|_, lo, hi| {
        let mut buf = vec![A::ZERO; scratch];
        for t in lo..hi {
            f(t, &mut buf);
        }
    });
}

/// Tasks still to finish per block of the output: the task that finishes a block's last
/// tile runs the epilogue over the whole block, while it is still in cache.
struct Blocks(Vec<std::sync::atomic::AtomicUsize>);

impl Blocks {
    fn new(blocks: usize, tasks_each: usize) -> Blocks {
        Blocks((0..blocks).map(|_| tasks_each.into()).collect())
    }
    /// One task of block `b` is done; true for the last one (which then sees every other
    /// task's writes: the count is released by each and acquired by the last).
    fn done(&self, b: usize) -> bool {
        self.0[b].fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1
    }
}

/// Adds the partial sums of `size` elements laid end to end in `parts`, in order, into the
/// first, and keeps only that.
fn add_parts<A: Copy + std::ops::AddAssign>(parts: &mut Vec<A>, size: usize) {
    let (first, rest) = parts.split_at_mut(size);
    for part in rest.chunks(size) {
        for (a, &b) in first.iter_mut().zip(part) {
            *a += b;
        }
    }
    parts.truncate(size);
}

/// Writes `value` into `len` elements from `p`.
///
/// # Safety
/// The elements lie in one allocation nothing else accesses.
unsafe fn fill_at<A: Copy>(p: *mut A, len: usize, value: A) {
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts_mut(p, len).fill(value) }
}

/// `dst[m×n] = lhs[m×k] · rhs[k×n]` (`+=` when `accumulate`), every operand given by its
/// first element and its (row, column) strides.
///
/// # Safety
/// Every operand's elements lie inside its allocation, and nothing else accesses `dst`'s.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_at<A: Real>(
    (m, n, k): (usize, usize, usize),
    dst: *mut A,
    (drs, dcs): (usize, usize),
    accumulate: bool,
    lhs: *const A,
    (lrs, lcs): (usize, usize),
    rhs: *const A,
    (rrs, rcs): (usize, usize),
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: as the caller promises.
    unsafe {
        if k == 0 {
            if !accumulate {
                for r in 0..m {
                    for c in 0..n {
                        *dst.add(r * drs + c * dcs) = A::ZERO;
                    }
                }
            }
            return;
        }
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dcs as isize,
            drs as isize,
            accumulate,
            lhs,
            lcs as isize,
            lrs as isize,
            rhs,
            rcs as isize,
            rrs as isize,
            A::ONE,
            A::ONE,
            false,
            false,
            false,
            par,
        )
    }
}
