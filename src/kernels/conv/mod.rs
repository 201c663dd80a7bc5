//! Convolution (1-d and 2-d, grouped, strided, dilated, asymmetrically padded) and its two
//! gradients, as GEMMs over tiles of output pixels through the `gemm` crate.
//!
//! Forward, per image, group and tile of output pixels: the tile's patches are gathered
//! into a small column buffer (about half an L2) and multiplied by the group's weights.
//! In NCHW the buffer is `col[Cin_g·kH·kW, pixels]` and the product `W[Cout_g, ·] · col`
//! writes rows of output channels; in NHWC (channels_last inputs) the buffer is
//! `col[pixels, kH·kW·Cin_g]`, whose rows are runs of contiguous channels, and the product
//! `col · Wᵀ` writes rows of output pixels. A 1×1, stride-1, unpadded convolution reads
//! the input directly, and a depthwise convolution (one input and one output channel per
//! group) runs a direct loop instead of one-channel GEMMs. Tasks (image, group, tile) run
//! in parallel, each GEMM on its own thread. Results are written straight into the output
//! tensor's (possibly recycled) buffer when it has the compute dtype.
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
//! f64 computes in f64; f32 in f32; f16 and bf16 in f32, with one rounding of the result.
//! A 1-d convolution is the 2-d one with a height of 1.

use super::copy;
use super::{cast_vec, f32s, f32s_mut};
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::layout::Layout;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::tensor::strided::SendPtr;
use crate::tensor::threads::{self, Ranges};
use crate::{Result, bail};
use gemm::Parallelism;

mod depthwise;
mod direct;
mod forward;
mod input_grad;
#[cfg(test)]
mod tests;
mod weight_grad;

pub use crate::ir::conv::ConvGeometry;
pub use forward::{Epilogue, forward, forward_then};
pub use input_grad::backward_input;
pub use weight_grad::backward_weight;
// What the parts share with each other, `direct` and the tests.
use depthwise::*;
use forward::*;
use weight_grad::*;

/// Whether a tensor of `shape` with `strides` is dense in channels_last (NHWC) order, as
/// PyTorch's `is_contiguous(memory_format=torch.channels_last)`: 4-d, strides
/// `[H·W·C, 1, W·C, C]`, where a dim of size 1 may have any stride.
pub fn is_channels_last(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != 4 || strides.len() != 4 {
        return false;
    }
    let mut expected = 1;
    for d in [1, 3, 2, 0] {
        if shape[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected *= shape[d];
        }
    }
    true
}

/// Whether a kernel should read `t` in NHWC order (and give its result in it): when `t`
/// is channels_last. A tensor that is also plain contiguous (one channel, or one pixel) is
/// NHWC only when its strides order the dims as NHWC, PyTorch's tie-break in
/// `suggest_memory_format`: `[N, C, 1, 1]` with strides `[C, 1, C, C]` is, with
/// `[C, 1, 1, 1]` it is not.
pub(crate) fn prefers_nhwc(t: &Tensor) -> bool {
    let (sh, st) = (t.shape(), t.strides());
    t.dim() == 4 && is_channels_last(sh, st) && (!t.is_contiguous() || strides_like_nhwc(sh, st))
}

/// PyTorch's `is_channels_last_strides_2d`: the strides, read in the order C, W, H, N,
/// never decrease, ties between size-1 dims resolved towards NCHW.
fn strides_like_nhwc(shape: &[usize], strides: &[usize]) -> bool {
    if strides[1] == 0 {
        return false;
    }
    let mut min = 0;
    for d in [1, 3, 2, 0] {
        if shape[d] == 0 || strides[d] < min || (d == 0 && min == strides[1]) {
            return false;
        }
        min = strides[d];
        if shape[d] > 1 {
            min *= shape[d];
        }
    }
    true
}

/// The float types the kernels compute in.
pub(crate) trait Acc:
    Element
    + Default
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
{
}
impl Acc for f32 {}
impl Acc for f64 {}

/// The type a float op on `dtype` computes in: f64 for f64, f32 for f32 and the halves.
pub(crate) fn compute_type(op: &str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        d => bail!(DType, "\"{op}\" not implemented for '{}'", d.scalar_name()),
    }
}

/// `t` as a 4-d tensor: a 3-d `[N, C, L]` is read as `[N, C, 1, L]`.
fn as4d(t: &Tensor) -> Tensor {
    if t.dim() != 3 {
        return t.clone();
    }
    let (sh, st) = (t.shape(), t.strides());
    t.with_layout(Layout {
        shape: vec![sh[0], sh[1], 1, sh[2]],
        strides: vec![st[0], st[1], st[2] * sh[2], st[2]],
        offset: t.storage_offset(),
    })
}

/// `t` (3-d read as 4-d) converted to the element type `T` in a dense buffer, in NCHW
/// order or, when `nhwc`, NHWC order. A tensor already so is used as it is, uncopied.
pub(crate) fn dense<T: Element>(t: &Tensor, nhwc: bool) -> Result<Tensor> {
    let t4 = as4d(t);
    let v = if nhwc {
        t4.with_layout(t4.layout().permute(&[0, 2, 3, 1]))
    } else {
        t4
    };
    copy::contiguous(&copy::cast(&v, T::DTYPE)?)
}

/// Runs `f` on the elements of `t`, a dense tensor of element type `T`, read-locked.
pub(crate) fn with_elements<T: Element, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> R {
    let acc = access::lock(&[t], &[]);
    let s: &[T] = if t.numel() == 0 {
        &[]
    } else {
        // SAFETY: `t` is dense with numel elements of type T from its first one, and the
        // read lock on its storage is held while `f` runs.
        unsafe { std::slice::from_raw_parts(acc.read::<T>(0), t.numel()) }
    };
    f(s)
}

/// Runs `f` on the elements of `a` and `b`, dense tensors of element types `T` and `U`,
/// both read-locked at once (they may share a storage).
pub(crate) fn with_elements2<T: Element, U: Element, R>(
    a: &Tensor,
    b: &Tensor,
    f: impl FnOnce(&[T], &[U]) -> R,
) -> R {
    let acc = access::lock(&[a, b], &[]);
    let sa: &[T] = if a.numel() == 0 {
        &[]
    } else {
        // SAFETY: `a` is dense with numel elements of type T, read-locked while `f` runs.
        unsafe { std::slice::from_raw_parts(acc.read::<T>(0), a.numel()) }
    };
    let sb: &[U] = if b.numel() == 0 {
        &[]
    } else {
        // SAFETY: as for `a`.
        unsafe { std::slice::from_raw_parts(acc.read::<U>(1), b.numel()) }
    };
    f(sa, sb)
}

/// A contiguous `[N, H, W, C]` tensor seen as `[N, C, H, W]` with channels_last strides.
pub(crate) fn channels_last_view(t: &Tensor) -> Tensor {
    let s = t.shape();
    let (n, h, w, c) = (s[0], s[1], s[2], s[3]);
    t.with_layout(Layout {
        shape: vec![n, c, h, w],
        strides: vec![h * w * c, 1, w * c, c],
        offset: t.storage_offset(),
    })
}

/// The result tensor of type `out` from `data` computed in `A`: NCHW-ordered, or
/// NHWC-ordered when `nhwc`, then presented with channels_last strides.
pub(crate) fn finish<A: Element>(data: Vec<A>, nhwc: bool, out: &TensorType) -> Result<Tensor> {
    let t = Tensor::from_vec(data, &dense_shape(nhwc, &out.shape))?;
    let t = copy::cast(&t, out.dtype)?;
    Ok(present(t, nhwc, &out.shape))
}

/// The shape a result of `shape` is stored in: NHWC order when `nhwc` (4-d only).
fn dense_shape(nhwc: bool, shape: &[usize]) -> Vec<usize> {
    match shape {
        &[n, c, h, w] if nhwc => vec![n, h, w, c],
        _ => shape.to_vec(),
    }
}

/// A dense result stored as [`dense_shape`] gives, seen with `shape`.
fn present(t: Tensor, nhwc: bool, shape: &[usize]) -> Tensor {
    if nhwc && shape.len() == 4 {
        channels_last_view(&t)
    } else {
        t
    }
}

/// The result tensor of type `out`, its dense buffer (NCHW order, or NHWC when `nhwc`,
/// then presented with channels_last strides) written by `f` in the compute type `A`:
/// straight into a new (possibly recycled) buffer when `A` is the result dtype, else into
/// a temporary one rounded once. The buffer `f` gets holds zeros when `zeroed`, anything
/// otherwise (then `f` writes every element).
pub(crate) fn produce<A: Element>(
    out: &TensorType,
    nhwc: bool,
    zeroed: bool,
    f: impl FnOnce(&mut [A]),
) -> Result<Tensor> {
    if out.dtype != A::DTYPE {
        let mut v = vec![A::zero(); out.shape.iter().product()];
        f(&mut v);
        return finish(v, nhwc, out);
    }
    let t = Tensor::alloc_for_overwrite(A::DTYPE, &dense_shape(nhwc, &out.shape))?;
    {
        let acc = access::lock(&[], &[&t]);
        let buf: &mut [A] = if t.numel() == 0 {
            &mut []
        } else {
            // SAFETY: `t` is a new contiguous tensor of numel elements of type A (initialised,
            // contents unspecified), write-locked here and seen by nobody else yet.
            unsafe { std::slice::from_raw_parts_mut(acc.write::<A>(0), t.numel()) }
        };
        if zeroed {
            buf.fill(A::zero());
        }
        f(buf);
    }
    Ok(present(t, nhwc, &out.shape))
}

/// The strides of a dense `[n, c, h, w]` buffer in NCHW or NHWC order.
pub(crate) fn dense_strides(nhwc: bool, c: usize, h: usize, w: usize) -> [usize; 4] {
    if nhwc {
        [h * w * c, 1, w * c, c]
    } else {
        [c * h * w, h * w, w, 1]
    }
}

/// Runs `f(chunk, lo, hi)` for `0..count` cut into at most `chunks` contiguous ranges,
/// across the available threads (on this thread alone when only one is available).
pub(crate) fn run_chunks(count: usize, chunks: usize, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    if count == 0 {
        return;
    }
    let r = Ranges::new(count, chunks, 1);
    if threads::available() <= 1 || r.count() == 1 {
        for c in 0..r.count() {
            let (lo, hi) = r.get(c);
            f(c, lo, hi);
        }
    } else {
        threads::par_each(&r, f);
    }
}

/// Runs `f(task, scratch)` for every task in `0..count`, in runs of consecutive tasks
/// spread over the threads; each run reuses one zeroed scratch buffer of `scratch` elements.
fn par_tasks<A: Acc>(count: usize, scratch: usize, f: &(dyn Fn(usize, &mut [A]) + Sync)) {
    let chunks = threads::available().saturating_mul(8);
    run_chunks(count, chunks, &|_, lo, hi| {
        let mut buf = vec![A::zero(); scratch];
        for t in lo..hi {
            f(t, &mut buf);
        }
    });
}

/// `dst[m×n] = lhs[m×k] · rhs[k×n]` (`+=` when `accumulate`), every operand given by its
/// first element and its (row, column) strides.
///
/// # Safety
/// Every operand's elements lie inside its allocation, and nothing else accesses `dst`'s.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_at<A: Acc>(
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
                        *dst.add(r * drs + c * dcs) = A::zero();
                    }
                }
            }
            return;
        }
        let one = A::from_f64(1.0);
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
            one,
            one,
            false,
            false,
            false,
            par,
        )
    }
}

/// The problem, every tensor read as 4-d (a 1-d convolution has a height of 1).
#[derive(Clone, Copy, Debug)]
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    co: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    dh: usize,
    dw: usize,
    g: usize,
}

impl Dims {
    fn cig(&self) -> usize {
        self.c / self.g
    }
    fn cog(&self) -> usize {
        self.co / self.g
    }
    /// The length of a patch of one group: `Cin_g · kH · kW`.
    fn kk(&self) -> usize {
        self.cig() * self.kh * self.kw
    }
    fn ipix(&self) -> usize {
        self.h * self.w
    }
    fn opix(&self) -> usize {
        self.oh * self.ow
    }
    /// One input and one output channel per group.
    fn depthwise(&self) -> bool {
        self.cig() == 1 && self.cog() == 1
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
pub(crate) fn valid_range(o0: usize, o1: usize, s: usize, off: isize, n: usize) -> (usize, usize) {
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

/// Checks the shapes of input `x`, weight `w` and output `y` against `geo` and gives the
/// problem as 4-d.
fn plan(op: &str, x: &[usize], w: &[usize], y: &[usize], geo: &ConvGeometry) -> Result<Dims> {
    let r = x.len();
    if !(r == 3 || r == 4) || w.len() != r || y.len() != r {
        bail!(
            Shape,
            "{op}: expected 3-d or 4-d input, weight and output of one rank, got {x:?}, {w:?} and {y:?}"
        );
    }
    let nd = r - 2;
    let g = geo.groups;
    if [&geo.stride, &geo.pad_lo, &geo.pad_hi, &geo.dilation]
        .iter()
        .any(|v| v.len() != nd)
    {
        bail!(
            Shape,
            "{op}: expected a geometry of {nd} spatial dims, got {geo:?}"
        );
    }
    if g == 0 || geo.stride.contains(&0) || geo.dilation.contains(&0) {
        bail!(
            Value,
            "{op}: groups, strides and dilations must be positive, got {geo:?}"
        );
    }
    let (n, c, co) = (x[0], x[1], w[0]);
    if c % g != 0 || co % g != 0 || w[1] * g != c {
        bail!(
            Shape,
            "{op}: weight {w:?} does not fit input {x:?} with {g} groups"
        );
    }
    let mut sizes = [(1, 1, 1, 0, 1, 1); 2]; // (in, kernel, stride, pad_lo, dilation, out)
    for k in 0..nd {
        let (i, kz, s, pl, ph, dl) = (
            x[2 + k],
            w[2 + k],
            geo.stride[k],
            geo.pad_lo[k],
            geo.pad_hi[k],
            geo.dilation[k],
        );
        let span = (kz.max(1) - 1).saturating_mul(dl).saturating_add(1);
        let padded = i.saturating_add(pl).saturating_add(ph);
        if kz == 0 || padded < span {
            bail!(
                Shape,
                "{op}: kernel size {w:?} (dilated) is greater than the padded input size {x:?}"
            );
        }
        let o = (padded - span) / s + 1;
        if y[2 + k] != o {
            bail!(
                Shape,
                "{op}: output shape {y:?} does not match input {x:?}, weight {w:?} and {geo:?}"
            );
        }
        sizes[2 - nd + k] = (i, kz, s, pl, dl, o);
    }
    if y[0] != n || y[1] != co {
        bail!(Shape, "{op}: output shape {y:?} does not match input {x:?}");
    }
    let [(h, kh, sh, ph, dh, oh), (wd, kw, sw, pw, dw, ow)] = sizes;
    Ok(Dims {
        n,
        c,
        h,
        w: wd,
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
    })
}

/// Output pixels per tile: as many as keep a tile's column buffer (`kk` values per pixel)
/// within half of a 1 MiB L2, but at least 128, so that the GEMMs stay wide enough to
/// run at speed when patches are long.
fn tile_len<A>(kk: usize, pixels: usize) -> usize {
    const COL_BYTES: usize = 512 << 10;
    let t = (COL_BYTES / (kk.max(1) * size_of::<A>())).max(128);
    t.min(pixels).max(1)
}
