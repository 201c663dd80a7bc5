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
use crate::runtime::access;
use crate::runtime::element::Element;
use crate::runtime::layout::Layout;
use crate::runtime::strided::SendPtr;
use crate::runtime::tensor::Tensor;
use crate::runtime::threads::{self, Ranges};
use crate::{Result, bail};
use gemm::Parallelism;

mod direct;

pub use crate::ir::conv::ConvGeometry;

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
struct TileEpilogue<'a> {
    f: Epilogue<'a>,
    failed: std::sync::atomic::AtomicBool,
    err: std::sync::Mutex<Option<crate::Error>>,
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

fn forward_in<A: Acc>(
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
        Some(b) => Some(dense::<A>(b, false)?.to_vec::<A>()?),
        None => None,
    };
    let bv = bv.as_deref();
    // depthwise weights are read as [C, kH·kW] either way; NHWC GEMMs want [Cout, kH, kW, Cin_g]
    let wv = dense::<A>(w, nhwc && !d.depthwise())?.to_vec::<A>()?;
    let xd = dense::<A>(x, nhwc)?;
    let t = produce::<A>(out, nhwc, false, |y| {
        with_elements::<A, _>(&xd, |xs| {
            if d.depthwise() && nhwc {
                depthwise_forward_nhwc(xs, &wv, bv, d, y);
            } else if d.depthwise() {
                depthwise_forward(xs, &wv, bv, d, y);
            } else if forward_direct((xs, &wv, bv), d, nhwc, y, te) {
                // the whole output written by register tiles
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
unsafe fn fill_at<A: Copy>(p: *mut A, len: usize, value: A) {
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts_mut(p, len).fill(value) }
}

/// The column buffer `col[kk, p1−p0]` of output pixels `p0..p1` (flat over OH·OW) from the
/// `Cin_g` input planes `xg` of one image and group.
fn gather_nchw<A: Acc>(xg: &[A], d: &Dims, p0: usize, p1: usize, col: &mut [A]) {
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

/// Adds the column buffer `col[kk, p1−p0]` of output pixels `p0..p1` into input channels
/// `ci0..ci1` of one image and group, whose channel 0 starts at `dx`.
///
/// # Safety
/// `dx` addresses the group's `Cin_g` planes, and nothing else accesses channels
/// `ci0..ci1` of them.
unsafe fn scatter_nchw<A: Acc>(
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

/// The column buffer `col[p1−p0, kk]` (patch order kH, kW, Cin_g) of output pixels
/// `p0..p1` of group `g` from the NHWC image `xi`.
fn gather_nhwc<A: Acc>(xi: &[A], d: &Dims, g: usize, p0: usize, p1: usize, col: &mut [A]) {
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

/// Adds the column buffer `col[p1−p0, kk]` of output pixels `p0..p1` of group `g` into
/// the group's channels `c0..c1` of the NHWC image at `dx`.
///
/// # Safety
/// `dx` addresses one NHWC image, and nothing else accesses those channels of it.
unsafe fn scatter_nhwc<A: Acc>(
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

/// NCHW forward: per (image, group, tile) `y[Cog, tile] = W_g · col`.
fn forward_nchw<A: Acc>(
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

/// The forward of f32 by [`direct::forward`], when it applies (false otherwise).
fn forward_direct<A: Acc>(
    (x, w, bias): (&[A], &[A], Option<&[A]>),
    d: &Dims,
    nhwc: bool,
    y: &mut [A],
    epi: Option<&TileEpilogue>,
) -> bool {
    let bias = match bias.map(f32s) {
        Some(None) => return false,
        b => b.flatten(),
    };
    let (Some(x), Some(w), Some(y)) = (f32s(x), f32s(w), f32s_mut(y)) else {
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
fn forward_nhwc<A: Acc>(
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

/// `dst[k] += a · x[k]`.
fn axpy<A: Acc>(dst: &mut [A], a: A, x: &[A]) {
    for (o, &v) in dst.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// `Σ a[k] · b[k]`, in eight interleaved partial sums (so it vectorises).
fn dot<A: Acc>(a: &[A], b: &[A]) -> A {
    let mut part = [A::zero(); 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (u, v) in ca.zip(cb) {
        for k in 0..8 {
            part[k] += u[k] * v[k];
        }
    }
    let mut s = A::zero();
    for (&u, &v) in ra.iter().zip(rb) {
        s += u * v;
    }
    part.iter().fold(s, |s, &p| s + p)
}

/// Depthwise forward in NCHW by direct loops, per (image, channel) plane: each tap adds a
/// weighted run of an input row to a run of an output row. `w` is `[C, kH·kW]`.
fn depthwise_forward<A: Acc>(x: &[A], w: &[A], bias: Option<&[A]>, d: &Dims, y: &mut [A]) {
    let (ipix, opix) = (d.ipix(), d.opix());
    let yp = SendPtr(y.as_mut_ptr());
    par_tasks::<A>(d.n * d.c, 0, &|t, _| {
        let ci = t % d.c;
        // SAFETY: plane t of y is this task's alone.
        let yplane = unsafe { std::slice::from_raw_parts_mut(yp.get().add(t * opix), opix) };
        yplane.fill(bias.map_or(A::zero(), |b| b[ci]));
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
fn taps_by_channel<A: Acc>(w: &[A], c: usize, kp: usize) -> Vec<A> {
    let mut t = vec![A::zero(); kp * c];
    for ci in 0..c {
        for q in 0..kp {
            t[q * c + ci] = w[ci * kp + q];
        }
    }
    t
}

/// `dst[k] += a[k] · b[k]`.
fn mul_add<A: Acc>(dst: &mut [A], a: &[A], b: &[A]) {
    for ((o, &u), &v) in dst.iter_mut().zip(a).zip(b) {
        *o += u * v;
    }
}

/// Depthwise forward in NHWC, per (image, output row), the channels of a pixel together;
/// `w` is `[C, kH·kW]`, `y` dense NHWC.
fn depthwise_forward_nhwc<A: Acc>(x: &[A], w: &[A], bias: Option<&[A]>, d: &Dims, y: &mut [A]) {
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
            None => row.fill(A::zero()),
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
fn depthwise_backward_input_nhwc<A: Acc>(gy: &[A], w: &[A], d: &Dims, dx: &mut [A]) {
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
fn depthwise_backward_weight_nhwc<A: Acc>(gy: &[A], x: &[A], d: &Dims) -> Vec<A> {
    let (c, kp) = (d.c, d.kh * d.kw);
    let rows = d.n * d.oh;
    let chunks = threads::available().min(rows).max(1);
    let size = kp * c;
    let mut parts = vec![A::zero(); chunks * size];
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
    let mut dw = vec![A::zero(); size];
    for q in 0..kp {
        for ci in 0..c {
            dw[ci * kp + q] = parts[q * c + ci];
        }
    }
    dw
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

fn backward_input_in<A: Acc>(
    gy: &Tensor,
    w: &Tensor,
    d: &Dims,
    out: &TensorType,
) -> Result<Tensor> {
    let nhwc = prefers_nhwc(gy);
    if d.n * d.c * d.ipix() == 0 || d.co == 0 || d.opix() == 0 {
        return produce::<A>(out, nhwc, true, |_| {});
    }
    let wv = dense::<A>(w, nhwc && !d.depthwise())?.to_vec::<A>()?;
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
fn input_columns<A: Acc>(
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
fn backward_input_gemm<A: Acc>(gy: &[A], w: &[A], d: &Dims, nhwc: bool, dx: &mut [A]) {
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

/// Depthwise input gradient in NCHW by direct loops, per (image, channel) plane: each tap
/// adds a weighted run of a gradient row to a run of an input row. `dx` is zeroed.
fn depthwise_backward_input<A: Acc>(gy: &[A], w: &[A], d: &Dims, dx: &mut [A]) {
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

fn backward_weight_in<A: Acc>(
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
fn backward_weight_gemm<A: Acc>(gy: &[A], x: &[A], d: &Dims, nhwc: bool) -> Vec<A> {
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

/// Depthwise weight gradient in NCHW by direct loops as `[C, kH·kW]`, one task per
/// channel over all images: each tap sums products of a gradient row and an input row.
fn depthwise_backward_weight<A: Acc>(gy: &[A], x: &[A], d: &Dims) -> Vec<A> {
    let (kp, ipix, opix) = (d.kh * d.kw, d.ipix(), d.opix());
    let mut dw = vec![A::zero(); d.c * kp];
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
                            let mut sum = A::zero();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::threads;

    /// Builds an input tensor of a shape and dtype from values in NCHW order.
    type Make<'a> = dyn Fn(&[f64], &[usize], DType) -> Tensor + 'a;

    /// Deterministic values (xorshift).
    struct Rng(u64);

    impl Rng {
        fn bits(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// In [-1, 1).
        fn value(&mut self) -> f64 {
            (self.bits() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
        fn values(&mut self, n: usize) -> Vec<f64> {
            (0..n).map(|_| self.value()).collect()
        }
        /// In 0..n.
        fn below(&mut self, n: usize) -> usize {
            (self.bits() % n as u64) as usize
        }
    }

    /// One convolution; a 1-d one has `h = kh = 1` and uses only the second entries.
    #[derive(Clone, Debug)]
    struct Case {
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        co: usize,
        kh: usize,
        kw: usize,
        s: [usize; 2],
        pl: [usize; 2],
        ph: [usize; 2],
        dl: [usize; 2],
        g: usize,
        bias: bool,
        one_d: bool,
    }

    impl Case {
        fn out_hw(&self) -> [usize; 2] {
            let size = |i: usize, k: usize, d: usize| {
                let padded = i + self.pl[d] + self.ph[d];
                let span = self.dl[d] * (k - 1) + 1;
                (padded - span) / self.s[d] + 1
            };
            [size(self.h, self.kh, 0), size(self.w, self.kw, 1)]
        }
        fn geo(&self) -> ConvGeometry {
            let pick = |v: [usize; 2]| if self.one_d { vec![v[1]] } else { v.to_vec() };
            ConvGeometry {
                stride: pick(self.s),
                pad_lo: pick(self.pl),
                pad_hi: pick(self.ph),
                dilation: pick(self.dl),
                groups: self.g,
            }
        }
        fn shape(&self, a: usize, b: usize, h: usize, w: usize) -> Vec<usize> {
            if self.one_d {
                vec![a, b, w]
            } else {
                vec![a, b, h, w]
            }
        }
        fn x_shape(&self) -> Vec<usize> {
            self.shape(self.n, self.c, self.h, self.w)
        }
        fn w_shape(&self) -> Vec<usize> {
            self.shape(self.co, self.c / self.g, self.kh, self.kw)
        }
        fn y_shape(&self) -> Vec<usize> {
            let [oh, ow] = self.out_hw();
            self.shape(self.n, self.co, oh, ow)
        }

        /// Calls `f(x index, w index, y index)` for every product the convolution sums,
        /// all indices into dense NCHW buffers.
        fn visit(&self, mut f: impl FnMut(usize, usize, usize)) {
            let [oh, ow] = self.out_hw();
            let (cig, cog) = (self.c / self.g, self.co / self.g);
            for n in 0..self.n {
                for o in 0..self.co {
                    let grp = o / cog;
                    for y0 in 0..oh {
                        for x0 in 0..ow {
                            let yi = ((n * self.co + o) * oh + y0) * ow + x0;
                            for ci in 0..cig {
                                for i in 0..self.kh {
                                    for j in 0..self.kw {
                                        let r = (y0 * self.s[0] + i * self.dl[0]) as i64
                                            - self.pl[0] as i64;
                                        let q = (x0 * self.s[1] + j * self.dl[1]) as i64
                                            - self.pl[1] as i64;
                                        if r < 0
                                            || q < 0
                                            || r >= self.h as i64
                                            || q >= self.w as i64
                                        {
                                            continue;
                                        }
                                        let c = grp * cig + ci;
                                        let xi = ((n * self.c + c) * self.h + r as usize) * self.w
                                            + q as usize;
                                        let wi = ((o * cig + ci) * self.kh + i) * self.kw + j;
                                        f(xi, wi, yi);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }

        fn ref_forward(&self, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
            let [oh, ow] = self.out_hw();
            let mut y = vec![0.0; self.n * self.co * oh * ow];
            if let Some(b) = b {
                for (i, v) in y.iter_mut().enumerate() {
                    *v = b[i / (oh * ow) % self.co];
                }
            }
            self.visit(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
            y
        }
        fn ref_backward_input(&self, gy: &[f64], w: &[f64]) -> Vec<f64> {
            let mut dx = vec![0.0; self.n * self.c * self.h * self.w];
            self.visit(|xi, wi, yi| dx[xi] += gy[yi] * w[wi]);
            dx
        }
        fn ref_backward_weight(&self, gy: &[f64], x: &[f64]) -> Vec<f64> {
            let mut dw = vec![0.0; self.co * (self.c / self.g) * self.kh * self.kw];
            self.visit(|xi, wi, yi| dw[wi] += gy[yi] * x[xi]);
            dw
        }
    }

    fn random_case(r: &mut Rng, one_d: bool, depthwise: bool) -> Case {
        let (g, cig, cog) = if depthwise {
            (1 + r.below(4), 1, 1)
        } else {
            (1 + r.below(2), 1 + r.below(3), 1 + r.below(3))
        };
        let kh = if one_d { 1 } else { 1 + r.below(4) };
        let kw = 1 + r.below(4);
        let mut k = Case {
            n: 1 + r.below(3),
            c: g * cig,
            h: if one_d { 1 } else { 1 + 2 * r.below(5) },
            w: 1 + 2 * r.below(6),
            co: g * cog,
            kh,
            kw,
            s: [1 + r.below(3), 1 + r.below(3)],
            pl: [r.below(kh / 2 + 1), r.below(kw / 2 + 1)],
            ph: [r.below(kh / 2 + 1), r.below(kw / 2 + 1)],
            dl: [1 + r.below(2), 1 + r.below(2)],
            g,
            bias: r.below(2) == 0,
            one_d,
        };
        if one_d {
            k.s[0] = 1;
            k.pl[0] = 0;
            k.ph[0] = 0;
            k.dl[0] = 1;
        }
        while k.h + k.pl[0] + k.ph[0] < k.dl[0] * (k.kh - 1) + 1 {
            k.h += 1;
        }
        while k.w + k.pl[1] + k.ph[1] < k.dl[1] * (k.kw - 1) + 1 {
            k.w += 1;
        }
        k
    }

    /// `v` (NCHW order) as a contiguous tensor of `dtype`.
    fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
        copy::cast(&Tensor::from_vec(v.to_vec(), shape).unwrap(), dtype).unwrap()
    }

    /// `v` (NCHW order) as a channels_last tensor of `dtype`.
    fn channels_last(v: &[f64], s: &[usize], dtype: DType) -> Tensor {
        let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
        let mut t = vec![0.0; v.len()];
        for (i, &x) in v.iter().enumerate() {
            let (ni, ci, hi, wi) = (i / (c * h * w), i / (h * w) % c, i / w % h, i % w);
            t[((ni * h + hi) * w + wi) * c + ci] = x;
        }
        channels_last_view(&tensor(&t, &[n, h, w, c], dtype))
    }

    /// The values a tensor of `dtype` holds for `v`.
    fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
        tensor(v, &[v.len()], dtype).to_f64_vec()
    }

    fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
        let got = got.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{what}: element count");
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale,
                "{what}: element {i}: got {g}, want {w}"
            );
        }
    }

    fn tol(dtype: DType) -> f64 {
        match dtype {
            DType::F64 => 1e-10,
            DType::F32 => 1e-4,
            _ => 2e-2,
        }
    }

    fn ty(dtype: DType, shape: Vec<usize>) -> TensorType {
        TensorType::new(dtype, shape)
    }

    /// Forward and both gradients of `k` in `dtype` against the references, the inputs
    /// built by `make` (contiguous, channels_last, a view ...).
    fn check(k: &Case, dtype: DType, r: &mut Rng, make: &Make) {
        let what = format!("{k:?} {dtype:?}");
        let (xs, ws, ys) = (k.x_shape(), k.w_shape(), k.y_shape());
        let numel = |s: &[usize]| s.iter().product::<usize>();
        let x = rounded(&r.values(numel(&xs)), dtype);
        let w = rounded(&r.values(numel(&ws)), dtype);
        let b = rounded(&r.values(k.co), dtype);
        let gy = rounded(&r.values(numel(&ys)), dtype);
        let (xt, wt, gt) = (
            make(&x, &xs, dtype),
            make(&w, &ws, dtype),
            make(&gy, &ys, dtype),
        );
        let bt = tensor(&b, &[k.co], dtype);
        let bias = k.bias.then_some(&bt);
        let geo = k.geo();
        let y = forward(&xt, &wt, bias, &geo, &ty(dtype, ys.clone())).unwrap();
        assert_eq!(y.dtype(), dtype);
        assert_eq!(y.shape(), ys);
        let want = k.ref_forward(&x, &w, k.bias.then_some(&b[..]));
        assert_close(&y, &want, tol(dtype), &format!("forward {what}"));
        let dx = backward_input(&gt, &wt, &geo, &ty(dtype, xs.clone())).unwrap();
        assert_eq!(dx.shape(), xs);
        let want = k.ref_backward_input(&gy, &w);
        assert_close(&dx, &want, tol(dtype), &format!("backward_input {what}"));
        let dw = backward_weight(&gt, &xt, &geo, &ty(dtype, ws.clone())).unwrap();
        assert_eq!(dw.shape(), ws);
        assert!(dw.is_contiguous());
        let want = k.ref_backward_weight(&gy, &x);
        assert_close(&dw, &want, tol(dtype), &format!("backward_weight {what}"));
    }

    #[test]
    fn matches_the_reference_on_random_2d_and_1d_shapes() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for i in 0..60 {
            let k = random_case(&mut r, i % 3 == 2, i % 5 == 4);
            for dtype in [DType::F64, DType::F32] {
                check(&k, dtype, &mut r, &tensor);
            }
        }
        // 1×1, stride 1, unpadded: the input is read directly as the column matrix
        for i in 0..8 {
            let mut k = random_case(&mut r, i % 4 == 3, false);
            (k.kh, k.kw, k.s, k.pl, k.ph) = (1, 1, [1, 1], [0, 0], [0, 0]);
            for dtype in [DType::F64, DType::F32] {
                check(&k, dtype, &mut r, &tensor);
            }
        }
    }

    #[test]
    fn halves_compute_in_f32_and_round_once() {
        let mut r = Rng(7);
        for i in 0..6 {
            let k = random_case(&mut r, i == 5, i == 4);
            for dtype in [DType::F16, DType::BF16] {
                check(&k, dtype, &mut r, &tensor);
            }
        }
    }

    #[test]
    fn the_adjoint_identity_holds() {
        // <conv(x, w), gy> = <x, dL/dx(gy)> = <w, dL/dw(gy, x)>
        let mut r = Rng(11);
        for i in 0..12 {
            let mut k = random_case(&mut r, i % 4 == 3, i % 4 == 2);
            k.bias = false;
            let (xs, ws, ys) = (k.x_shape(), k.w_shape(), k.y_shape());
            let numel = |s: &[usize]| s.iter().product::<usize>();
            let (x, w, gy) = (
                r.values(numel(&xs)),
                r.values(numel(&ws)),
                r.values(numel(&ys)),
            );
            let t = |v: &[f64], s: &[usize]| tensor(v, s, DType::F64);
            let geo = k.geo();
            let y = forward(
                &t(&x, &xs),
                &t(&w, &ws),
                None,
                &geo,
                &ty(DType::F64, ys.clone()),
            );
            let dx = backward_input(&t(&gy, &ys), &t(&w, &ws), &geo, &ty(DType::F64, xs.clone()));
            let dw = backward_weight(&t(&gy, &ys), &t(&x, &xs), &geo, &ty(DType::F64, ws));
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
            let lhs = dot(&y.unwrap().to_f64_vec(), &gy);
            let via_x = dot(&x, &dx.unwrap().to_f64_vec());
            let via_w = dot(&w, &dw.unwrap().to_f64_vec());
            let scale = 1.0 + lhs.abs();
            assert!(
                (lhs - via_x).abs() <= 1e-10 * scale,
                "{k:?}: {lhs} vs {via_x}"
            );
            assert!(
                (lhs - via_w).abs() <= 1e-10 * scale,
                "{k:?}: {lhs} vs {via_w}"
            );
        }
    }

    #[test]
    fn channels_last_inputs_give_channels_last_results() {
        let mut r = Rng(23);
        for i in 0..24 {
            let mut k = random_case(&mut r, false, i % 4 == 3);
            // more than one channel and pixel, so the layouts differ
            if i % 4 == 3 {
                k.g *= 2;
            }
            k.c *= 2;
            k.co *= 2;
            k.h = k.h.max(2);
            k.w = k.w.max(2);
            if i % 4 == 0 {
                // the direct 1×1 path
                (k.kh, k.kw, k.s, k.pl, k.ph) = (1, 1, [1, 1], [0, 0], [0, 0]);
            }
            let dtype = [DType::F64, DType::F32][i % 2];
            check(&k, dtype, &mut r, &|v, s, d| {
                if s.len() == 4 && s[0] == k.n {
                    channels_last(v, s, d)
                } else {
                    tensor(v, s, d)
                }
            });
            let [oh, ow] = k.out_hw();
            let x = channels_last(&r.values(k.n * k.c * k.h * k.w), &k.x_shape(), dtype);
            let w = tensor(&r.values(k.w_shape().iter().product()), &k.w_shape(), dtype);
            let y = forward(&x, &w, None, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
            assert_eq!(y.strides(), [oh * ow * k.co, 1, ow * k.co, k.co], "{k:?}");
            let gy = channels_last(&r.values(y.numel()), &k.y_shape(), dtype);
            let dx = backward_input(&gy, &w, &k.geo(), &ty(dtype, k.x_shape())).unwrap();
            assert_eq!(dx.strides(), [k.h * k.w * k.c, 1, k.w * k.c, k.c], "{k:?}");
            let dw = backward_weight(&gy, &x, &k.geo(), &ty(dtype, k.w_shape())).unwrap();
            assert!(dw.is_contiguous());
            // contiguous inputs give contiguous results
            let xc = copy::contiguous(&tensor(&x.to_f64_vec(), &k.x_shape(), dtype)).unwrap();
            assert!(
                forward(&xc, &w, None, &k.geo(), &ty(dtype, k.y_shape()))
                    .unwrap()
                    .is_contiguous()
            );
        }
        assert!(is_channels_last(&[2, 3, 4, 5], &[60, 1, 15, 3]));
        assert!(!is_channels_last(&[2, 3, 4, 5], &[60, 20, 5, 1]));
        assert!(
            is_channels_last(&[2, 1, 4, 5], &[20, 20, 5, 1]),
            "size-1 dims: any stride"
        );
        assert!(is_channels_last(&[1, 3, 1, 1], &[3, 1, 3, 3]));
        assert!(!is_channels_last(&[2, 3, 4], &[12, 1, 3]));
    }

    /// f32, NCHW and channels_last, with channel counts the register tiles take (multiples of 8):
    /// the forward and the weight gradient (output channels) and the input gradient (input
    /// channels) run without column buffers; every geometry of `random_case` (strides,
    /// dilations, uneven padding), and sizes that leave every tail of the tiles.
    #[test]
    fn direct_products_match_the_reference() {
        if !smelt_rt::tiles::supports(8) {
            eprintln!("skipped: no register tiles on this CPU");
            return;
        }
        let mut r = Rng(41);
        let mut input_direct = 0;
        for i in 0..40 {
            let mut k = random_case(&mut r, false, false);
            k.g = 1;
            // one side at a time may be a count the tiles do not take (the stem's one
            // input channel)
            k.c = [8, 16, 24, 32, 48, 1, 3][r.below(if i % 4 == 1 { 7 } else { 5 })];
            k.co = [8, 16, 24, 32, 40][r.below(5)];
            if i % 4 == 3 {
                (k.c, k.co) = (k.co, [1, 5][r.below(2)]);
            }
            k.h += r.below(12);
            k.w += r.below(20);
            let d = plan("t", &k.x_shape(), &k.w_shape(), &k.y_shape(), &k.geo()).unwrap();
            assert_eq!(direct::applies(&d), k.co.is_multiple_of(8), "{k:?}");
            input_direct += usize::from(direct::applies_to_input(&d));
            // NCHW tensors are reordered on the way in and out
            check(&k, DType::F32, &mut r, &tensor);
            check(&k, DType::F32, &mut r, &|v, s, d| {
                if s.len() == 4 && s[0] == k.n {
                    channels_last(v, s, d)
                } else {
                    tensor(v, s, d)
                }
            });
        }
        assert!(
            input_direct >= 20,
            "{input_direct} input gradients ran direct"
        );
    }

    #[test]
    fn strided_views_are_read_through_their_strides() {
        let mut r = Rng(31);
        let views: [&Make; 3] = [
            // transposed: a [.., W, H] tensor with its last two dims swapped
            &|v, s, d| {
                let nd = s.len();
                let mut ts = s.to_vec();
                ts.swap(nd - 2, nd - 1);
                let (a, b) = (s[nd - 2], s[nd - 1]);
                let mut t = vec![0.0; v.len()];
                for (i, &x) in v.iter().enumerate() {
                    let (o, p, q) = (i / (a * b), i / b % a, i % b);
                    t[(o * b + q) * a + p] = x;
                }
                let t = tensor(&t, &ts, d);
                t.with_layout(t.layout().transpose(nd - 2, nd - 1))
            },
            // a slice of a larger tensor, with a storage offset
            &|v, s, d| {
                let mut big = s.to_vec();
                big[1] += 2;
                let nd = s.len();
                big[nd - 1] += 3;
                let mut t = vec![9.0; big.iter().product()];
                let inner: usize = s[2..].iter().product();
                for (i, &x) in v.iter().enumerate() {
                    let (o, c, rest) = (i / (s[1] * inner), i / inner % s[1], i % inner);
                    let last = rest % s[nd - 1];
                    let mid = rest / s[nd - 1];
                    let bi =
                        ((o * big[1] + c + 1) * (inner / s[nd - 1]) + mid) * big[nd - 1] + last + 2;
                    t[bi] = x;
                }
                let t = tensor(&t, &big, d);
                let l = t.layout().narrow(1, 1, s[1] as i64).unwrap();
                let l = l.narrow(nd as i64 - 1, 2, s[nd - 1] as i64).unwrap();
                t.with_layout(l)
            },
            // the batch broadcast from one image when the values allow it
            &|v, s, d| {
                let one: usize = s[1..].iter().product();
                if v.len() > one && v[one..].iter().zip(v.iter().cycle()).all(|(a, b)| a == b) {
                    let mut s1 = s.to_vec();
                    s1[0] = 1;
                    let t = tensor(&v[..one], &s1, d);
                    t.with_layout(t.layout().expand(s))
                } else {
                    tensor(v, s, d)
                }
            },
        ];
        for make in views {
            for i in 0..8 {
                let k = random_case(&mut r, i % 4 == 3, i % 4 == 2);
                check(&k, [DType::F64, DType::F32][i % 2], &mut r, make);
            }
        }
        // a batch that really is broadcast
        let k = random_case(&mut Rng(5), false, false);
        let one = r.values(k.c * k.h * k.w);
        let x: Vec<f64> = (0..k.n).flat_map(|_| one.iter().copied()).collect();
        let xt = tensor(&one, &k.shape(1, k.c, k.h, k.w), DType::F64);
        let xt = xt.with_layout(xt.layout().expand(&k.x_shape()));
        let w = r.values(k.w_shape().iter().product());
        let y = forward(
            &xt,
            &tensor(&w, &k.w_shape(), DType::F64),
            None,
            &k.geo(),
            &ty(DType::F64, k.y_shape()),
        )
        .unwrap();
        assert_close(&y, &k.ref_forward(&x, &w, None), 1e-10, "expanded");
    }

    #[test]
    fn tiles_and_both_input_gradient_schedules_agree() {
        // images large enough to take several tiles, cut mid-row
        let mut r = Rng(41);
        for (i, &(n, g, s)) in [(1, 1, 1), (3, 2, 2), (9, 1, 1)].iter().enumerate() {
            let k = Case {
                n,
                c: 32 * g,
                h: 21 + 3 * i,
                w: 25,
                co: 4 * g,
                kh: 3,
                kw: 3,
                s: [s, 1],
                pl: [1, 0],
                ph: [1, 2],
                dl: [1, 2],
                g,
                bias: true,
                one_d: false,
            };
            let pixels = k.out_hw()[0] * k.out_hw()[1];
            assert!(!pixels.is_multiple_of(tile_len::<f64>(32 * 9, usize::MAX)));
            assert!(tile_len::<f64>(32 * 9, usize::MAX) < pixels);
            for dtype in [DType::F64, DType::F32] {
                check(&k, dtype, &mut r, &tensor);
                threads::serial(|| check(&k, dtype, &mut r, &tensor));
                check(&k, dtype, &mut r, &|v, s, d| {
                    if s.len() == 4 && s[0] == k.n {
                        channels_last(v, s, d)
                    } else {
                        tensor(v, s, d)
                    }
                });
            }
        }
    }

    #[test]
    fn empty_batches_and_channels() {
        let geo = ConvGeometry {
            stride: vec![1, 1],
            pad_lo: vec![1, 1],
            pad_hi: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
        };
        let f = DType::F32;
        // no images
        let x = Tensor::alloc(f, &[0, 3, 5, 5]).unwrap();
        let w = Tensor::alloc(f, &[4, 3, 3, 3]).unwrap();
        let y = forward(&x, &w, None, &geo, &ty(f, vec![0, 4, 5, 5])).unwrap();
        assert_eq!(y.shape(), [0, 4, 5, 5]);
        let gy = Tensor::alloc(f, &[0, 4, 5, 5]).unwrap();
        let dx = backward_input(&gy, &w, &geo, &ty(f, vec![0, 3, 5, 5])).unwrap();
        assert_eq!(dx.shape(), [0, 3, 5, 5]);
        let dw = backward_weight(&gy, &x, &geo, &ty(f, vec![4, 3, 3, 3])).unwrap();
        assert_eq!(dw.to_f64_vec(), vec![0.0; 108]);
        // no input channels: the bias alone
        let x = Tensor::alloc(f, &[2, 0, 5, 5]).unwrap();
        let w = Tensor::alloc(f, &[4, 0, 3, 3]).unwrap();
        let b = tensor(&[1.0, 2.0, 3.0, 4.0], &[4], f);
        let y = forward(&x, &w, Some(&b), &geo, &ty(f, vec![2, 4, 5, 5])).unwrap();
        let want: Vec<f64> = (0..200).map(|i| (i / 25 % 4 + 1) as f64).collect();
        assert_eq!(y.to_f64_vec(), want);
        let gy = tensor(&vec![1.0; 200], &[2, 4, 5, 5], f);
        let dx = backward_input(&gy, &w, &geo, &ty(f, vec![2, 0, 5, 5])).unwrap();
        assert_eq!(dx.numel(), 0);
        let dw = backward_weight(&gy, &x, &geo, &ty(f, vec![4, 0, 3, 3])).unwrap();
        assert_eq!(dw.numel(), 0);
        // no output channels
        let x = tensor(&vec![1.0; 50], &[2, 1, 5, 5], f);
        let w = Tensor::alloc(f, &[0, 1, 3, 3]).unwrap();
        let y = forward(&x, &w, None, &geo, &ty(f, vec![2, 0, 5, 5])).unwrap();
        assert_eq!(y.numel(), 0);
        let gy = Tensor::alloc(f, &[2, 0, 5, 5]).unwrap();
        let dx = backward_input(&gy, &w, &geo, &ty(f, vec![2, 1, 5, 5])).unwrap();
        assert_eq!(dx.to_f64_vec(), vec![0.0; 50]);
    }

    #[test]
    fn bad_dtypes_and_shapes_are_errors() {
        let geo = ConvGeometry {
            stride: vec![1],
            pad_lo: vec![0],
            pad_hi: vec![0],
            dilation: vec![1],
            groups: 1,
        };
        let x = Tensor::alloc(DType::I64, &[1, 2, 5]).unwrap();
        let w = Tensor::alloc(DType::I64, &[3, 2, 3]).unwrap();
        let e = forward(&x, &w, None, &geo, &ty(DType::I64, vec![1, 3, 3]));
        assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
        let x = Tensor::alloc(DType::F32, &[1, 2, 5]).unwrap();
        let w = Tensor::alloc(DType::F32, &[3, 2, 3]).unwrap();
        let e = forward(&x, &w, None, &geo, &ty(DType::F32, vec![1, 3, 4]));
        assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
        let b = Tensor::alloc(DType::F32, &[2]).unwrap();
        let e = forward(&x, &w, Some(&b), &geo, &ty(DType::F32, vec![1, 3, 3]));
        assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
        let e = forward(
            &x,
            &w,
            None,
            &ConvGeometry {
                groups: 2,
                ..geo.clone()
            },
            &ty(DType::F32, vec![1, 3, 3]),
        );
        assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
        let e = forward(
            &x,
            &w,
            None,
            &ConvGeometry {
                stride: vec![0],
                ..geo
            },
            &ty(DType::F32, vec![1, 3, 3]),
        );
        assert!(e.is_err());
    }

    #[test]
    fn valid_ranges() {
        // o·s + off in 0..n
        for s in 1..4 {
            for off in -7isize..7 {
                for n in 0..9 {
                    let (lo, hi) = valid_range(1, 8, s, off, n);
                    let want: Vec<usize> = (1..8)
                        .filter(|&o| (0..n as isize).contains(&(o as isize * s as isize + off)))
                        .collect();
                    assert_eq!((lo..hi).collect::<Vec<_>>(), want, "{s} {off} {n}");
                }
            }
        }
    }
}
