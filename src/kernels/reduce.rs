//! Reductions (sum, mean, prod, amax, amin, all, any, logsumexp, argmax, argmin, var, std)
//! and row ops (cumsum, softmax, log_softmax, layer_norm).
//!
//! Every reduction runs on one driver, `drive`: the input's dims are split into kept dims
//! (one output element each) and reduced dims, each walked with `strided::Walk`. An op is a
//! `Reducer`: an accumulator with init / step / merge / finish. Contiguous runs of the reduced
//! range fold through `LANES` independent accumulators (a vectorisable loop); when the
//! innermost kept dim is contiguous instead, up to `COLS` neighbouring outputs are
//! reduced side by side, each in the reduced walk's order. Large work runs in parallel over output elements, or over chunks of the reduced range
//! (partial accumulators merged in order) when there are too few outputs.

use crate::ir::dtype::DType;
use crate::ir::op::{Op, ReduceOp, TensorType, reduction_dims};
use crate::ir::shape::{contiguous_strides, numel, wrap_dim};
use crate::kernels::native::RowFold;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::tensor::strided::{PAR_THRESHOLD, SendPtr, Walk};
use crate::tensor::threads::Ranges;
use crate::{Result, bail, dispatch, dispatch_float};
use half::{bf16, f16};
use std::marker::PhantomData;

/// Independent accumulators per contiguous run (and outputs per block).
const LANES: usize = 8;

/// Most outputs per block when the innermost kept dim is contiguous: each step of the reduced
/// walk then reads a run of up to this many elements, not one cache line per row, which keeps
/// the hardware prefetcher streaming (`sum(dim=0)`, BENCHMARKS.md).
const COLS: usize = 512;

/// An element with a totally ordered-enough key: f64 for floats (exact), i64 for the rest.
pub trait Num: Element {
    /// The key type: f64 or i64.
    type K: Copy + PartialOrd + Send + Sync;
    /// The element's key.
    fn key(self) -> Self::K;
    /// A key no element is below (the start of a maximum).
    fn lowest() -> Self::K;
    /// A key no element is above (the start of a minimum).
    fn highest() -> Self::K;
    /// The element of a key.
    fn from_key(k: Self::K) -> Self;
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            type K = i64;
            #[inline(always)] fn key(self) -> i64 { self as i64 }
            #[inline(always)] fn lowest() -> i64 { i64::MIN }
            #[inline(always)] fn highest() -> i64 { i64::MAX }
            #[inline(always)] fn from_key(k: i64) -> Self { k as $t }
        }
    )*};
}
num_int!(u8, i8, i16, i32, i64);

impl Num for bool {
    type K = i64;
    #[inline(always)]
    fn key(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn lowest() -> i64 {
        i64::MIN
    }
    #[inline(always)]
    fn highest() -> i64 {
        i64::MAX
    }
    #[inline(always)]
    fn from_key(k: i64) -> Self {
        k != 0
    }
}

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            type K = f64;
            #[inline(always)] fn key(self) -> f64 { Element::to_f64(self) }
            #[inline(always)] fn lowest() -> f64 { f64::NEG_INFINITY }
            #[inline(always)] fn highest() -> f64 { f64::INFINITY }
            #[inline(always)] fn from_key(k: f64) -> Self { <$t as Element>::from_f64(k) }
        }
    )*};
}
num_float!(f16, bf16, f32, f64);

/// True for NaN keys (`k != k` is only ever true for a float NaN).
#[inline(always)]
#[allow(clippy::eq_op)]
fn nan<K: PartialOrd + Copy>(k: K) -> bool {
    k != k
}

/// One reduction: a mergeable accumulator over elements of `T`.
pub trait Reducer<T>: Sync {
    /// The running state.
    type Acc: Copy + Send + Sync;
    /// The element type of the result.
    type Out: Element;
    /// The state before any element.
    fn init(&self) -> Self::Acc;
    /// Folds in the element at position `i` of the (row-major) reduced index space.
    fn step(&self, a: Self::Acc, x: T, i: usize) -> Self::Acc;
    /// Combines two partial results; `a` covers earlier positions than `b` or interleaves.
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The result from the final state; `n` is the number of elements reduced (for `mean`).
    fn finish(&self, a: Self::Acc, n: usize) -> Self::Out;
}

// ---- the reducers ----------------------------------------------------------------------

/// Float sum or mean, accumulated in f64 and rounded once.
struct SumF<O> {
    mean: bool,
    _o: PhantomData<O>,
}
impl<T: Element, O: Element> Reducer<T> for SumF<O> {
    type Acc = f64;
    type Out = O;
    fn init(&self) -> f64 {
        0.0
    }
    #[inline(always)]
    fn step(&self, a: f64, x: T, _: usize) -> f64 {
        a + x.to_f64()
    }
    #[inline(always)]
    fn merge(&self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn finish(&self, a: f64, n: usize) -> O {
        O::from_f64(if self.mean { a / n as f64 } else { a })
    }
}

/// Integer (and bool) sum into i64, wrapping.
struct SumI;
impl<T: Element> Reducer<T> for SumI {
    type Acc = i64;
    type Out = i64;
    fn init(&self) -> i64 {
        0
    }
    #[inline(always)]
    fn step(&self, a: i64, x: T, _: usize) -> i64 {
        a.wrapping_add(x.to_i64())
    }
    #[inline(always)]
    fn merge(&self, a: i64, b: i64) -> i64 {
        a.wrapping_add(b)
    }
    fn finish(&self, a: i64, _: usize) -> i64 {
        a
    }
}

/// Float product in f64.
struct ProdF<O>(PhantomData<O>);
impl<T: Element, O: Element> Reducer<T> for ProdF<O> {
    type Acc = f64;
    type Out = O;
    fn init(&self) -> f64 {
        1.0
    }
    #[inline(always)]
    fn step(&self, a: f64, x: T, _: usize) -> f64 {
        a * x.to_f64()
    }
    #[inline(always)]
    fn merge(&self, a: f64, b: f64) -> f64 {
        a * b
    }
    fn finish(&self, a: f64, _: usize) -> O {
        O::from_f64(a)
    }
}

/// Integer (and bool) product into i64, wrapping.
struct ProdI;
impl<T: Element> Reducer<T> for ProdI {
    type Acc = i64;
    type Out = i64;
    fn init(&self) -> i64 {
        1
    }
    #[inline(always)]
    fn step(&self, a: i64, x: T, _: usize) -> i64 {
        a.wrapping_mul(x.to_i64())
    }
    #[inline(always)]
    fn merge(&self, a: i64, b: i64) -> i64 {
        a.wrapping_mul(b)
    }
    fn finish(&self, a: i64, _: usize) -> i64 {
        a
    }
}

/// amax (`max`) or amin; NaN wins, as in PyTorch.
struct Extreme {
    max: bool,
}
impl Extreme {
    #[inline(always)]
    fn pick<K: PartialOrd + Copy>(&self, a: K, x: K) -> K {
        let better = if self.max { x > a } else { x < a };
        if better || nan(x) { x } else { a }
    }
}
impl<T: Num> Reducer<T> for Extreme {
    type Acc = T::K;
    type Out = T;
    fn init(&self) -> T::K {
        if self.max { T::lowest() } else { T::highest() }
    }
    #[inline(always)]
    fn step(&self, a: T::K, x: T, _: usize) -> T::K {
        self.pick(a, x.key())
    }
    #[inline(always)]
    fn merge(&self, a: T::K, b: T::K) -> T::K {
        self.pick(a, b)
    }
    fn finish(&self, a: T::K, _: usize) -> T {
        T::from_key(a)
    }
}

/// all / any, written as bool or u8 (PyTorch keeps u8 for u8 inputs).
struct Logical<O> {
    all: bool,
    _o: PhantomData<O>,
}
impl<T: Num, O: Element> Reducer<T> for Logical<O> {
    type Acc = bool;
    type Out = O;
    fn init(&self) -> bool {
        self.all
    }
    #[inline(always)]
    fn step(&self, a: bool, x: T, _: usize) -> bool {
        let nz = x != T::zero();
        if self.all { a & nz } else { a | nz }
    }
    #[inline(always)]
    fn merge(&self, a: bool, b: bool) -> bool {
        if self.all { a & b } else { a | b }
    }
    fn finish(&self, a: bool, _: usize) -> O {
        O::from_i64(a as i64)
    }
}

/// Streaming logsumexp: the running max `m` and `s = sum(exp(x - m))`, rescaled when the max
/// grows, so one pass is enough and nothing overflows.
struct Lse<O>(PhantomData<O>);
impl<O> Lse<O> {
    #[inline(always)]
    fn rescale(s: f64, from: f64, to: f64) -> f64 {
        if from == to { s } else { s * (from - to).exp() }
    }
}
impl<T: Element, O: Element> Reducer<T> for Lse<O> {
    type Acc = (f64, f64);
    type Out = O;
    fn init(&self) -> (f64, f64) {
        (f64::NEG_INFINITY, 0.0)
    }
    #[inline(always)]
    fn step(&self, a: (f64, f64), x: T, _: usize) -> (f64, f64) {
        <Self as Reducer<T>>::merge(self, a, (x.to_f64(), 1.0))
    }
    #[inline(always)]
    fn merge(&self, a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
        if nan(a.0) || nan(b.0) {
            return (f64::NAN, f64::NAN);
        }
        let m = a.0.max(b.0);
        if m == f64::NEG_INFINITY {
            return (m, 0.0);
        }
        (m, Self::rescale(a.1, a.0, m) + Self::rescale(b.1, b.0, m))
    }
    fn finish(&self, (m, s): (f64, f64), _: usize) -> O {
        O::from_f64(if nan(m) || m.is_infinite() {
            m
        } else {
            m + s.ln()
        })
    }
}

/// argmax / argmin: the first position of the extreme; NaN counts as the extreme.
struct ArgExtreme {
    max: bool,
}
impl ArgExtreme {
    const NONE: usize = usize::MAX;
    #[inline(always)]
    fn better<K: PartialOrd + Copy>(&self, x: K, b: K) -> bool {
        !nan(b) && (nan(x) || if self.max { x > b } else { x < b })
    }
    #[inline(always)]
    fn same<K: PartialOrd + Copy>(x: K, b: K) -> bool {
        x == b || (nan(x) && nan(b))
    }
}
impl<T: Num> Reducer<T> for ArgExtreme {
    type Acc = (T::K, usize);
    type Out = i64;
    fn init(&self) -> (T::K, usize) {
        (T::lowest(), Self::NONE)
    }
    #[inline(always)]
    fn step(&self, a: (T::K, usize), x: T, i: usize) -> (T::K, usize) {
        <Self as Reducer<T>>::merge(self, a, (x.key(), i))
    }
    #[inline(always)]
    fn merge(&self, a: (T::K, usize), b: (T::K, usize)) -> (T::K, usize) {
        let take_b = a.1 == Self::NONE
            || (b.1 != Self::NONE
                && (self.better(b.0, a.0) || (Self::same(b.0, a.0) && b.1 < a.1)));
        if take_b { b } else { a }
    }
    fn finish(&self, a: (T::K, usize), _: usize) -> i64 {
        if a.1 == Self::NONE { 0 } else { a.1 as i64 }
    }
}

/// var / std by Welford's update, partials joined with Chan's formula.
struct Moments<O> {
    correction: f64,
    std: bool,
    _o: PhantomData<O>,
}
impl<T: Element, O: Element> Reducer<T> for Moments<O> {
    /// (count, mean, sum of squared deviations)
    type Acc = (f64, f64, f64);
    type Out = O;
    fn init(&self) -> (f64, f64, f64) {
        (0.0, 0.0, 0.0)
    }
    #[inline(always)]
    fn step(&self, (n, mean, m2): (f64, f64, f64), x: T, _: usize) -> (f64, f64, f64) {
        let x = x.to_f64();
        let n = n + 1.0;
        let d = x - mean;
        let mean = mean + d / n;
        (n, mean, m2 + d * (x - mean))
    }
    fn merge(&self, a: (f64, f64, f64), b: (f64, f64, f64)) -> (f64, f64, f64) {
        if a.0 == 0.0 {
            return b;
        }
        if b.0 == 0.0 {
            return a;
        }
        let n = a.0 + b.0;
        let d = b.1 - a.1;
        (n, a.1 + d * b.0 / n, a.2 + b.2 + d * d * a.0 * b.0 / n)
    }
    fn finish(&self, (n, _, m2): (f64, f64, f64), _: usize) -> O {
        // PyTorch divides by max(0, N - correction): 0/0 = nan, x/0 = inf.
        let var = m2 / (n - self.correction).max(0.0);
        O::from_f64(if self.std { var.sqrt() } else { var })
    }
}

// ---- the driver ------------------------------------------------------------------------

/// Kept and reduced dims of an input, with the strides each is walked by.
struct Split {
    kept: Vec<usize>,
    kept_x: Vec<usize>,
    kept_out: Vec<usize>,
    red: Vec<usize>,
    red_x: Vec<usize>,
    red_out: Vec<usize>,
}

/// Splits `x`'s dims into kept and `dims`; output strides are those of a contiguous tensor
/// of `x`'s shape (row ops) restricted to each side, or of the kept shape (reductions).
fn split(x: &Tensor, dims: &[usize], out_full_shape: bool) -> Split {
    let (shape, st) = (x.shape(), x.strides());
    let full = contiguous_strides(shape);
    let mut s = Split {
        kept: vec![],
        kept_x: vec![],
        kept_out: vec![],
        red: vec![],
        red_x: vec![],
        red_out: vec![],
    };
    for d in 0..shape.len() {
        if dims.contains(&d) {
            s.red.push(shape[d]);
            s.red_x.push(st[d]);
            s.red_out.push(full[d]);
        } else {
            s.kept.push(shape[d]);
            s.kept_x.push(st[d]);
            s.kept_out.push(full[d]);
        }
    }
    if !out_full_shape {
        s.kept_out = contiguous_strides(&s.kept);
    }
    s
}

/// Element stride of the innermost reduced dim that is not of size 1 (0 when none).
fn inner_stride(sizes: &[usize], strides: &[usize]) -> usize {
    sizes
        .iter()
        .zip(strides)
        .rev()
        .find(|(n, _)| **n != 1)
        .map_or(0, |(_, s)| *s)
}

/// Folds `xs` (positions `pos..`) into `acc` through LANES independent accumulators.
#[inline(always)]
fn fold_slice<T: Copy, R: Reducer<T>>(r: &R, acc: R::Acc, xs: &[T], pos: usize) -> R::Acc {
    let mut lanes = [r.init(); LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for (j, (l, &x)) in lanes.iter_mut().zip(chunk).enumerate() {
            *l = r.step(*l, x, pos + c * LANES + j);
        }
    }
    let mut acc = lanes.iter().fold(acc, |a, &l| r.merge(a, l));
    let t0 = pos + xs.len() - tail.len();
    for (j, &x) in tail.iter().enumerate() {
        acc = r.step(acc, x, t0 + j);
    }
    acc
}

/// Folds positions `lo..hi` of the reduced walk starting at `base`.
///
/// # Safety
/// Every position of the walk from `base` must be in bounds.
#[inline]
unsafe fn fold_range<T: Copy, R: Reducer<T>>(
    r: &R,
    walk: &Walk<1>,
    base: *const T,
    lo: usize,
    hi: usize,
) -> R::Acc {
    let mut acc = r.init();
    let mut pos = lo;
    // SAFETY: every position of the walk from `base` is in bounds (this fn's contract), and
    // the walk hands out runs `b + i·s`, i < len, of those positions: the slice of `len`
    // (s == 1) and each strided element are inside `x`.
    walk.run_range(lo, hi, &mut |[b], len, [s]| unsafe {
        let p = base.add(b);
        if s == 1 {
            acc = fold_slice(r, acc, std::slice::from_raw_parts(p, len), pos);
        } else {
            for i in 0..len {
                acc = r.step(acc, *p.add(i * s), pos + i);
            }
        }
        pos += len;
    });
    acc
}

/// Reduces `lanes.len()` neighbouring outputs at once (their inputs are contiguous in `x`),
/// each in the order of the reduced walk, and writes them `so` apart from `o`.
///
/// # Safety
/// As for `fold_range`, for each of the bases `base..base + lanes.len()`; `o` is valid for
/// `lanes.len()` outputs `so` apart.
#[inline]
unsafe fn fold_block<T: Copy, R: Reducer<T>>(
    r: &R,
    walk: &Walk<1>,
    base: *const T,
    n: usize,
    lanes: &mut [R::Acc],
    o: *mut R::Out,
    so: usize,
) {
    lanes.fill(r.init());
    let mut pos = 0;
    let w = lanes.len();
    // SAFETY: by this fn's contract every position of the walk is in bounds for each base
    // `base..base + w`; row i of a run is the `w` contiguous elements at `base + b + i·s`,
    // one per base, so each slice lies inside `x`.
    walk.run_range(0, n, &mut |[b], len, [s]| unsafe {
        let row = |i: usize| std::slice::from_raw_parts(base.add(b + i * s), w);
        let mut i = 0;
        // four steps per pass over the accumulators: a quarter of their loads and stores
        while i + 4 <= len {
            let (x0, x1, x2, x3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
            let at = pos + i;
            for j in 0..w {
                let a = r.step(lanes[j], x0[j], at);
                let a = r.step(a, x1[j], at + 1);
                let a = r.step(a, x2[j], at + 2);
                lanes[j] = r.step(a, x3[j], at + 3);
            }
            i += 4;
        }
        for i in i..len {
            for (l, &x) in lanes.iter_mut().zip(row(i)) {
                *l = r.step(*l, x, pos + i);
            }
        }
        pos += len;
    });
    for (j, &a) in lanes.iter().enumerate() {
        // SAFETY: `j < lanes.len()`, and `o` is valid for `lanes.len()` outputs `so` apart (this
        // fn's contract).
        unsafe { *o.add(j * so) = r.finish(a, n) };
    }
}

/// Splits `0..n` into chunks (edges on multiples of `align`) and runs `f` on each in parallel.
fn par_chunks(n: usize, align: usize, f: impl Fn(usize, usize) + Sync) {
    let chunks = (crate::tensor::threads::available() * 4).min(n / align);
    crate::tensor::threads::par_each(&Ranges::new(n, chunks, align), &|_, lo, hi| f(lo, hi));
}

fn parallel_worth(work: usize) -> bool {
    work >= crate::tensor::threads::eager_par_min() && crate::tensor::threads::available() > 1
}

/// Runs reducer `r` over `dims` of `x`, into a new tensor of type `ty`.
fn drive<T: Num, R: Reducer<T>>(
    x: &Tensor,
    dims: &[usize],
    ty: &TensorType,
    r: &R,
) -> Result<Tensor> {
    let out = Tensor::alloc(ty.dtype, &ty.shape)?;
    let s = split(x, dims, false);
    let (n_out, n_in) = (numel(&s.kept), numel(&s.red));
    if n_out == 0 {
        return Ok(out);
    }
    let inner = Walk::new(&s.red, [&s.red_x]);
    let outer = Walk::new(&s.kept, [&s.kept_out, &s.kept_x]);
    let blocks_ok = inner_stride(&s.red, &s.red_x) != 1;
    let acc = access::lock(&[x], &[&out]);
    let px = SendPtr(acc.read::<T>(0) as *mut T);
    let po = SendPtr(acc.write::<R::Out>(0));
    let run_outputs = |lo: usize, hi: usize| {
        // SAFETY: the outer walk's positions `bo + i·so` lie in the contiguous output and
        // `bx + i·sx` in x's layout (both from `split` of the shapes the lock covers); each
        // reduced walk from there stays in x's layout, as `fold_range` and `fold_block`
        // require; parallel chunks (`par_chunks`) get disjoint output ranges, so no output
        // element is written twice.
        outer.run_range(lo, hi, &mut |[bo, bx], len, [so, sx]| unsafe {
            let (o, xb) = (po.get().add(bo), (px.get() as *const T).add(bx));
            let mut i = 0;
            if sx == 1 && blocks_ok {
                let mut lanes = [r.init(); COLS];
                while i < len {
                    let w = COLS.min(len - i);
                    let (xb, o) = (xb.add(i), o.add(i * so));
                    fold_block(r, &inner, xb, n_in, &mut lanes[..w], o, so);
                    i += w;
                }
            }
            for i in i..len {
                let a = fold_range(r, &inner, xb.add(i * sx), 0, n_in);
                *o.add(i * so) = r.finish(a, n_in);
            }
        });
    };
    let threads = crate::tensor::threads::available();
    if !parallel_worth(n_out.saturating_mul(n_in)) {
        run_outputs(0, n_out);
    } else if n_out >= 4 * threads || n_in < PAR_THRESHOLD {
        par_chunks(n_out, LANES, run_outputs);
    } else {
        // Few outputs, long reductions: partial accumulators over chunks of the reduced range.
        outer.run_range(0, n_out, &mut |[bo, bx], len, [so, sx]| {
            for i in 0..len {
                // SAFETY: `bx + i·sx`, i < len, is a position of the outer walk over x's layout,
                // the start of output i's reduced walk: inside x.
                let base = SendPtr(unsafe { px.get().add(bx + i * sx) });
                let ranges = Ranges::new(n_in, (threads * 4).min(n_in / 1024), 64);
                let mut parts: Vec<R::Acc> = vec![r.init(); ranges.count()];
                let pp = SendPtr(parts.as_mut_ptr());
                // SAFETY: `c < ranges.count() == parts.len()`, so each chunk writes its own slot of
                // `parts`, which outlives `par_each`; `lo..hi` is a range of the reduced walk from
                // `base`, inside x (as above).
                crate::tensor::threads::par_each(&ranges, &|c, lo, hi| unsafe {
                    // each chunk writes its own slot
                    *pp.get().add(c) = fold_range(r, &inner, base.get() as *const T, lo, hi);
                });
                let a = parts.into_iter().fold(r.init(), |a, b| r.merge(a, b));
                // SAFETY: `bo + i·so` is output i's position in the contiguous output, which the
                // lock lends to this thread alone (this branch runs the outer walk serially).
                unsafe { *po.get().add(bo + i * so) = r.finish(a, n_in) };
            }
        });
    }
    drop(acc);
    Ok(out)
}

// ---- row ops ---------------------------------------------------------------------------

/// For each slice of `x` along `dims` (a "row"), loads it into a scratch buffer through
/// `load`, transforms it with `f`, and stores it through `store` into the same positions of
/// a new contiguous tensor of type `ty` (same shape as `x`).
fn rows<T: Element, O: Element, S: Copy + Default + Send>(
    x: &Tensor,
    dims: &[usize],
    ty: &TensorType,
    load: impl Fn(T) -> S + Sync,
    store: impl Fn(S) -> O + Sync,
    f: impl Fn(&mut [S]) + Sync,
) -> Result<Tensor> {
    let out = Tensor::alloc(ty.dtype, &ty.shape)?;
    let s = split(x, dims, true);
    let (n_rows, len) = (numel(&s.kept), numel(&s.red));
    if n_rows == 0 || len == 0 {
        return Ok(out);
    }
    let inner = Walk::new(&s.red, [&s.red_x, &s.red_out]);
    let outer = Walk::new(&s.kept, [&s.kept_out, &s.kept_x]);
    let acc = access::lock(&[x], &[&out]);
    let px = SendPtr(acc.read::<T>(0) as *mut T);
    let po = SendPtr(acc.write::<O>(0));
    let run_rows = |lo: usize, hi: usize| {
        let mut buf = vec![S::default(); len];
        outer.run_range(lo, hi, &mut |[bo, bx], n, [so, sx]| {
            for i in 0..n {
                // SAFETY: the walks stay inside x's layout and the output; rows are disjoint.
                unsafe {
                    let (xb, ob) = (
                        px.get().add(bx + i * sx) as *const T,
                        po.get().add(bo + i * so),
                    );
                    let mut k = 0;
                    inner.run_range(0, len, &mut |[b, _], m, [s, _]| {
                        for j in 0..m {
                            buf[k + j] = load(*xb.add(b + j * s));
                        }
                        k += m;
                    });
                    f(&mut buf);
                    let mut k = 0;
                    inner.run_range(0, len, &mut |[_, b], m, [_, s]| {
                        for j in 0..m {
                            *ob.add(b + j * s) = store(buf[k + j]);
                        }
                        k += m;
                    });
                }
            }
        });
    };
    if parallel_worth(n_rows.saturating_mul(len)) && n_rows > 1 {
        par_chunks(n_rows, 1, run_rows);
    } else {
        run_rows(0, n_rows);
    }
    drop(acc);
    Ok(out)
}

/// `softmax` (or `log_softmax`) of one row in place, after subtracting its max.
fn softmax_row(v: &mut [f64], log: bool) {
    let m = v.iter().fold(
        f64::NEG_INFINITY,
        |m, &x| if x > m || nan(x) { x } else { m },
    );
    let sum: f64 = v.iter().map(|&x| (x - m).exp()).sum();
    if log {
        let lse = sum.ln();
        v.iter_mut().for_each(|x| *x = *x - m - lse);
    } else {
        v.iter_mut().for_each(|x| *x = (*x - m).exp() / sum);
    }
}

/// `(x - mean) / sqrt(var + eps) * w + b` of one row, with the biased variance.
fn layer_norm_row(v: &mut [f64], eps: f64, w: Option<&[f64]>, b: Option<&[f64]>) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    for (i, x) in v.iter_mut().enumerate() {
        let mut y = (*x - mean) * rstd;
        if let Some(w) = w {
            y *= w[i];
        }
        if let Some(b) = b {
            y += b[i];
        }
        *x = y;
    }
}

/// `d` as the run-time library names element types.
pub(crate) fn elem_type(d: DType) -> smelt_rt::ElemType {
    use smelt_rt::ElemType as E;
    match d {
        DType::F16 => E::F16,
        DType::BF16 => E::BF16,
        DType::F32 => E::F32,
        DType::F64 => E::F64,
        DType::U8 => E::U8,
        DType::I8 => E::I8,
        DType::I16 => E::I16,
        DType::I32 => E::I32,
        DType::I64 => E::I64,
        DType::Bool => E::Bool,
    }
}

/// `cumsum` along `d` (none for a 0-d `x`) by `smelt_rt::scan`, which compiled models run.
fn cumsum(x: &Tensor, d: Vec<usize>, ty: &TensorType) -> Result<Tensor> {
    let float = x.dtype().is_float();
    if ty.dtype != if float { x.dtype() } else { DType::I64 } || ty.shape != x.shape() {
        bail!(DType, "cumsum: unexpected result {ty:?} for {}", x.dtype());
    }
    let out = Tensor::alloc(ty.dtype, &ty.shape)?;
    let xs: Vec<isize> = x.strides().iter().map(|&s| s as isize).collect();
    let ys: Vec<isize> = contiguous_strides(&ty.shape)
        .iter()
        .map(|&s| s as isize)
        .collect();
    let acc = access::lock(&[x], &[&out]);
    // SAFETY: the walks are x's layout and out's (new, contiguous) over x's shape, under the
    // locks; out's dtype is the kind's result type (checked above).
    unsafe {
        smelt_rt::scan::cumsum(
            elem_type(x.dtype()),
            (x.shape(), d.first().copied().unwrap_or(0)),
            (acc.write::<u8>(0), &ys),
            (acc.read::<u8>(0), &xs),
        )
    };
    drop(acc);
    Ok(out)
}

/// Entry point for the reduction family; `out` is the type the shape rule inferred.
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let x = inputs[0];
    let nd = x.dim();
    let one_dim = |d: i64| -> Result<Vec<usize>> {
        let w = wrap_dim(d, nd)?;
        Ok(if nd == 0 { vec![] } else { vec![w] })
    };
    match op {
        Op::Reduce { op, dim, .. } => {
            let dims = reduction_dims(dim, nd)?;
            reduce(*op, x, &dims, out)
        }
        Op::ArgMax { dim, .. } | Op::ArgMin { dim, .. } => {
            let dims = match dim {
                Some(d) => one_dim(*d)?,
                None => (0..nd).collect(),
            };
            let r = ArgExtreme {
                max: matches!(op, Op::ArgMax { .. }),
            };
            dispatch!(x.dtype(), T => drive::<T, _>(x, &dims, out, &r))
        }
        Op::Var {
            dim, correction, ..
        }
        | Op::Std {
            dim, correction, ..
        } => {
            let dims = reduction_dims(dim, nd)?;
            let std = matches!(op, Op::Std { .. });
            dispatch_float!(x.dtype(), T => drive::<T, _>(x, &dims, out, &Moments::<T> {
                correction: *correction, std, _o: PhantomData,
            }), else bail!(DType, "std and var only support floating point and complex dtypes"))
        }
        Op::Cumsum { dim } => cumsum(x, one_dim(*dim)?, out),
        Op::Softmax { dim } | Op::LogSoftmax { dim } => {
            let d = one_dim(*dim)?;
            let log = matches!(op, Op::LogSoftmax { .. });
            if let [last] = d[..]
                && let Some(r) = crate::kernels::native::softmax_f32(x, last, log)
            {
                return r;
            }
            dispatch_float!(x.dtype(), T => rows::<T, T, f64>(x, &d, out, T::to_f64, T::from_f64,
                |v| softmax_row(v, log)), else bail!(DType, "{} needs a float input", op.name()))
        }
        Op::LayerNorm {
            normalized_shape,
            eps,
            has_weight,
            has_bias,
        } => {
            let dims: Vec<usize> = (nd - normalized_shape.len()..nd).collect();
            let wt = has_weight.then(|| inputs[1]);
            let bt = has_bias.then(|| inputs[1 + *has_weight as usize]);
            let len = normalized_shape.iter().product();
            if let Some(r) = crate::kernels::native::layer_norm_f32(x, len, *eps, wt, bt) {
                return r;
            }
            let w = has_weight.then(|| param(inputs[1]));
            let b = has_bias.then(|| param(inputs[1 + *has_weight as usize]));
            let (w, b) = (w.as_deref(), b.as_deref());
            dispatch_float!(x.dtype(), T => rows::<T, T, f64>(x, &dims, out, T::to_f64, T::from_f64,
                |v| layer_norm_row(v, *eps, w, b)), else bail!(DType, "layer_norm needs a float input"))
        }
        _ => bail!(Unsupported, "{} is not a reduction", op.name()),
    }
}

/// A layer_norm weight or bias as f64 values (row-major).
fn param(t: &Tensor) -> Vec<f64> {
    if t.numel() == 0 {
        vec![]
    } else {
        super::copy::to_f64_vec(t)
    }
}

/// Whether `dims` are `x`'s last dims (every output reads one run of a contiguous `x`).
fn trailing(x: &Tensor, dims: &[usize]) -> bool {
    let nd = x.shape().len();
    let mut ds = dims.to_vec();
    ds.sort_unstable();
    ds.dedup();
    ds.iter().enumerate().all(|(k, &d)| d == nd - ds.len() + k)
}

/// Whether `dims` are `x`'s first dims, not all of them (every output is a column of a
/// contiguous `x` seen as rows of the other dims).
fn leading(x: &Tensor, dims: &[usize]) -> bool {
    let mut ds = dims.to_vec();
    ds.sort_unstable();
    ds.dedup();
    !ds.is_empty() && ds.len() < x.shape().len() && ds.iter().enumerate().all(|(k, &d)| d == k)
}

fn reduce(op: ReduceOp, x: &Tensor, dims: &[usize], out: &TensorType) -> Result<Tensor> {
    use ReduceOp::*;
    let float = x.dtype().is_float();
    match op {
        // f32 sums over trailing dims (rows) or leading dims (columns) on native helpers
        Sum | Mean if x.dtype() == DType::F32 && (trailing(x, dims) || leading(x, dims)) => {
            let t = Tensor::alloc(out.dtype, &out.shape)?;
            let n_in: usize = dims.iter().map(|&d| x.shape()[d]).product();
            let native = if trailing(x, dims) {
                let fold = if op == Mean {
                    RowFold::Mean
                } else {
                    RowFold::Sum
                };
                crate::kernels::native::row_fold_f32(x, n_in, fold, &t)
            } else {
                crate::kernels::native::col_sum_f32(x, n_in, op == Mean, &t)
            };
            match native {
                Some(()) => Ok(t),
                None => drive::<f32, _>(
                    x,
                    dims,
                    out,
                    &SumF::<f32> {
                        mean: op == Mean,
                        _o: PhantomData,
                    },
                ),
            }
        }
        Sum | Mean if float => dispatch_float!(x.dtype(), T => drive::<T, _>(x, dims, out,
            &SumF::<T> { mean: op == Mean, _o: PhantomData }), else bail!(DType, "{}: unexpected dtype {}", op.name(), x.dtype())),
        Sum => dispatch!(x.dtype(), T => drive::<T, _>(x, dims, out, &SumI)),
        Mean => bail!(DType, "mean(): input dtype must be floating point"),
        Prod if float => dispatch_float!(x.dtype(), T =>
            drive::<T, _>(x, dims, out, &ProdF::<T>(PhantomData)), else bail!(DType, "{}: unexpected dtype {}", op.name(), x.dtype())),
        Prod => dispatch!(x.dtype(), T => drive::<T, _>(x, dims, out, &ProdI)),
        // f32 maxima and minima over trailing dims on the native helpers
        Amax | Amin if x.dtype() == DType::F32 && trailing(x, dims) => {
            let t = Tensor::alloc_for_overwrite(out.dtype, &out.shape)?;
            let n_in: usize = dims.iter().map(|&d| x.shape()[d]).product();
            let fold = if op == Amax {
                RowFold::Max
            } else {
                RowFold::Min
            };
            match crate::kernels::native::row_fold_f32(x, n_in, fold, &t) {
                Some(()) => Ok(t),
                None => drive::<f32, _>(x, dims, out, &Extreme { max: op == Amax }),
            }
        }
        Amax | Amin => {
            let r = Extreme { max: op == Amax };
            dispatch!(x.dtype(), T => drive::<T, _>(x, dims, out, &r))
        }
        All | Any => {
            let all = op == All;
            if out.dtype == DType::U8 {
                dispatch!(x.dtype(), T => drive::<T, _>(x, dims, out,
                    &Logical::<u8> { all, _o: PhantomData }))
            } else {
                dispatch!(x.dtype(), T => drive::<T, _>(x, dims, out,
                    &Logical::<bool> { all, _o: PhantomData }))
            }
        }
        LogSumExp => {
            let o = out.dtype;
            dispatch!(x.dtype(), T => dispatch_float!(o, O => drive::<T, _>(x, dims, out,
                &Lse::<O>(PhantomData)), else bail!(DType, "logsumexp: unexpected output dtype {o}")))
        }
    }
}
