//! `scaled_dot_product_attention` in one pass over the keys with an online softmax (the
//! FlashAttention recurrence): per (batch, head) and block of query rows, keys and values
//! are read block by block, each row keeps its running maximum, its running sum of
//! exponentials and its weighted sum of values, so the `[L, S]` score matrix never exists
//! and memory stays linear in the sequence length. Rows run in parallel.
//!
//! f64 inputs compute in f64; f32 in f32, as PyTorch's CPU kernel; f16 and bf16 compute in
//! f32 and round the result once. A row whose every key is masked out gives zeros.

use super::copy;
use super::{f32s, f32s_mut};
use crate::ir::dtype::DType;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::kernels::native::chains;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::Element;
use crate::{Result, bail};
use rayon::prelude::*;

/// Query rows per parallel task: they share each block of keys while it is in cache.
pub(super) const ROWS: usize = 64;
/// Keys per block.
const KEYS: usize = 128;

/// Float arithmetic the kernel runs in.
pub(super) trait Acc: Copy + Send + Sync + PartialOrd + std::fmt::Debug + 'static {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn from_f64(x: f64) -> Self;
    /// `exp(x)` for `x <= 0` (`-inf` gives 0), as the kernel needs it.
    fn exp_le0(self) -> Self;
    /// `x = exp(x)` for every `x <= 0` of `xs`.
    fn exp_le0_all(xs: &mut [Self]);
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
}

macro_rules! acc {
    ($t:ty) => {
        impl Acc for $t {
            fn exp_le0(self) -> $t {
                ExpLe0::exp_le0(self)
            }
            #[inline(always)]
            fn exp_le0_all(xs: &mut [$t]) {
                <$t as ExpLe0>::exp_le0_all(xs)
            }
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const NEG_INF: $t = <$t>::NEG_INFINITY;
            fn from_f64(x: f64) -> $t {
                x as $t
            }
            fn add(self, o: $t) -> $t {
                self + o
            }
            fn sub(self, o: $t) -> $t {
                self - o
            }
            fn mul(self, o: $t) -> $t {
                self * o
            }
            fn div(self, o: $t) -> $t {
                self / o
            }
        }
    };
}
acc!(f32);
acc!(f64);

impl ExpLe0 for f64 {
    fn exp_le0(self) -> f64 {
        self.exp()
    }
    fn exp_le0_all(xs: &mut [f64]) {
        for x in xs {
            *x = x.exp();
        }
    }
}

/// `exp(x)` for `x <= 0` without a call into libm, so a row's exponentials vectorise:
/// `x = n ln 2 + r` with `|r| <= ln 2 / 2` (ln 2 split in two parts so `r` is exact), a
/// degree-7 Taylor polynomial for `e^r` (truncation below 2e-9, under f32's rounding),
/// and `2^n` built in the exponent bits. Below -87 (where `e^x` is below f32's normal
/// range) it gives 0.
impl ExpLe0 for f32 {
    fn exp_le0(self) -> f32 {
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        let x = self.max(-87.0);
        let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
        let r = (x - n * LN2_HI) - n * LN2_LO;
        let mut e = 1.0 / 5040.0;
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            e = e * r + c;
        }
        let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
        if self < -87.0 { 0.0 } else { e * two_n }
    }
    /// The compiled kernels' native exp strips where the CPU has them (16 or 8 lanes, no
    /// call per element: `floor` above is a libm call on baseline x86-64), else the loop.
    /// Below -87 both give 0: the strips would compute subnormals there, a microcode assist
    /// per element on x86 (which rows of scores of large magnitude would pay on most of
    /// their elements), for weights that vanish next to the row's largest, which is 1.
    #[inline(always)]
    fn exp_le0_all(xs: &mut [f32]) {
        if smelt_rt::vmath::available() {
            for x in xs.iter_mut() {
                *x = if *x < -87.0 { f32::NEG_INFINITY } else { *x };
            }
            smelt_rt::vmath::apply(smelt_rt::vmath::StripOp::Exp, xs);
        } else {
            for x in xs {
                *x = ExpLe0::exp_le0(*x);
            }
        }
    }
}

/// The kernel's exponential, by type.
trait ExpLe0: Sized {
    fn exp_le0(self) -> Self;
    /// `x = exp(x)` for every `x <= 0` of `xs` (`-inf` gives 0).
    fn exp_le0_all(xs: &mut [Self]);
}

/// The mask's elements.
enum MaskData {
    /// true: takes part.
    Bool(Vec<bool>),
    /// Added to the scores.
    Add(Vec<f64>),
}

/// The mask as the kernel reads it: element (b, i, j) is
/// `data[batch_off[b] + i * row + j * col]`, with stride 0 where it broadcasts.
pub(super) struct Mask {
    data: MaskData,
    batch_off: Vec<usize>,
    row: usize,
    col: usize,
}

impl Mask {
    /// `mask` broadcast to the scores' shape `[batch_shape.., l, s]`, read in place of its
    /// own (dense) elements: nothing as large as the scores is made.
    pub(super) fn of(mask: &Tensor, batch_shape: &[usize], l: usize, s: usize) -> Result<Mask> {
        let dense = copy::contiguous(mask)?;
        let mut full: Vec<i64> = batch_shape.iter().map(|&d| d as i64).collect();
        full.extend([l as i64, s as i64]);
        let view = super::run(Op::Expand { size: full }, &[&dense])?;
        let st: Vec<usize> = view.strides().to_vec();
        let nb = batch_shape.len();
        let batch_off = (0..numel(batch_shape))
            .map(|mut b| {
                let mut off = 0;
                for d in (0..nb).rev() {
                    off += (b % batch_shape[d]) * st[d];
                    b /= batch_shape[d];
                }
                // `values` below start at the mask's first element: no storage offset
                off
            })
            .collect();
        let values = copy::to_f64_vec(&dense);
        let data = if dense.dtype().is_bool() {
            MaskData::Bool(values.iter().map(|&x| x != 0.0).collect())
        } else {
            MaskData::Add(values)
        };
        Ok(Mask {
            data,
            batch_off,
            row: st[nb],
            col: st[nb + 1],
        })
    }

    /// The score `x` of (b, i, j) with the mask applied.
    pub(super) fn apply<A: Acc>(&self, x: A, b: usize, i: usize, j: usize) -> A {
        let at = self.batch_off[b] + i * self.row + j * self.col;
        match &self.data {
            MaskData::Bool(m) if !m[at] => A::NEG_INF,
            MaskData::Bool(_) => x,
            MaskData::Add(m) => x.add(A::from_f64(m[at])),
        }
    }
}

/// The scores `row` of query `i` of batch `b` against keys `j0..`: the mask applied and,
/// when causal, the keys after `i` hidden (`-inf`).
pub(super) fn hide<A: Acc>(
    row: &mut [A],
    mask: Option<&Mask>,
    d: &Dims,
    b: usize,
    i: usize,
    j0: usize,
) {
    if let Some(mk) = mask {
        for (jj, x) in row.iter_mut().enumerate() {
            *x = mk.apply(*x, b, i, j0 + jj);
        }
    }
    if d.is_causal && i + 1 < j0 + row.len() {
        row[(i + 1).saturating_sub(j0)..].fill(A::NEG_INF);
    }
}

/// Evaluates attention over `inputs` (q, k, v, and the mask when `has_mask`).
pub fn eval(
    inputs: &[&Tensor],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
    out: &TensorType,
) -> Result<Tensor> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let (dims, mask) = setup([q, k, v], has_mask.then(|| inputs[3]), scale, is_causal)?;
    let job = Job {
        mask: mask.as_ref(),
        d: &dims,
    };
    by_dtype("scaled_dot_product_attention", [q, k, v], out, &job)
}

/// The sizes of attention over `[q, k, v]` and its mask, read as the kernels read it.
pub(super) fn setup(
    [q, k, v]: [&Tensor; 3],
    mask: Option<&Tensor>,
    scale: Option<f64>,
    is_causal: bool,
) -> Result<(Dims, Option<Mask>)> {
    let n = q.dim();
    let batch_shape = &q.shape()[..n - 2];
    let e = q.shape()[n - 1];
    let d = Dims {
        batch: numel(batch_shape),
        l: q.shape()[n - 2],
        s: k.shape()[n - 2],
        e,
        ev: v.shape()[n - 1],
        scale: scale.unwrap_or(1.0 / (e as f64).sqrt()),
        is_causal,
    };
    let mask = mask
        .map(|m| Mask::of(m, batch_shape, d.l, d.s))
        .transpose()?;
    Ok((d, mask))
}

/// What an attention kernel needs besides its operands.
pub(super) struct Job<'a> {
    pub(super) mask: Option<&'a Mask>,
    pub(super) d: &'a Dims,
}

/// An attention kernel over `N` operands read as rows, generic over the type it computes
/// in; it writes every element of `out`.
pub(super) trait RowsKernel<const N: usize> {
    fn run<A: Acc>(&self, ops: [Rows<'_, A>; N], out: &mut [A]);
}

impl RowsKernel<3> for Job<'_> {
    fn run<A: Acc>(&self, ops: [Rows<'_, A>; 3], out: &mut [A]) {
        run(ops, self.mask, self.d, out)
    }
}

/// Runs kernel `k` of op `name` on `ops` into a new tensor of type `out`: f64 computes in
/// f64, f32 in f32, f16 and bf16 in f32 rounded once.
pub(super) fn by_dtype<const N: usize>(
    name: &str,
    ops: [&Tensor; N],
    out: &TensorType,
    k: &impl RowsKernel<N>,
) -> Result<Tensor> {
    match out.dtype {
        DType::F64 => pooled::<f64>(out, |o| with_rows(ops, |r| k.run(r, o))),
        DType::F32 => pooled::<f32>(out, |o| with_rows(ops, |r| k.run(r, o))),
        DType::F16 | DType::BF16 => {
            let mut o = vec![0f32; out.numel()];
            with_rows::<f32, N, _>(ops, |r| k.run(r, &mut o))?;
            copy::cast(&Tensor::from_vec(o, &out.shape)?, out.dtype)
        }
        d => bail!(DType, "{name}: not implemented for '{}'", d.scalar_name()),
    }
}

/// A new tensor of type `out` whose elements `fill` writes, every one of them; from the
/// storage pool, since a training step asks for one of the same size every call.
fn pooled<A: Element>(
    out: &TensorType,
    fill: impl FnOnce(&mut [A]) -> Result<()>,
) -> Result<Tensor> {
    let t = Tensor::alloc_for_overwrite(A::DTYPE, &out.shape)?;
    let acc = access::lock(&[], &[&t]);
    // SAFETY: t is a new contiguous tensor of out.numel() elements of A, write-locked
    // while the slice lives.
    let dst = unsafe { std::slice::from_raw_parts_mut(acc.write::<A>(0), out.numel()) };
    fill(dst)?;
    drop(acc);
    Ok(t)
}

/// One operand's rows as the kernel reads them: row `i` of (flattened) batch `b` starts
/// at `data[base[b] + i * rs]`, its elements adjacent.
pub(super) struct Rows<'a, A> {
    data: &'a [A],
    base: Vec<usize>,
    pub(super) rs: usize,
}

impl<A> Rows<'_, A> {
    /// The elements from row `i` of batch `b` on (none past the end: an empty operand).
    pub(super) fn from(&self, b: usize, i: usize) -> &[A] {
        self.data.get(self.base[b] + i * self.rs..).unwrap_or(&[])
    }
}

/// Runs `f` on the rows of the operands (q, k, v, ..) as `A` (f32 for halves). A tensor
/// of `A` whose last dim is dense is read where it lies (the heads of a fused projection,
/// sliced and permuted, need no copy); any other is copied contiguous first. One lock
/// covers them all (they may share a storage: self-attention passes one tensor thrice).
fn with_rows<A: crate::tensor::element::Element, const N: usize, R>(
    ts: [&Tensor; N],
    f: impl FnOnce([Rows<'_, A>; N]) -> R,
) -> Result<R> {
    let readable = |t: &Tensor| {
        t.dtype() == A::DTYPE
            && (t.shape().last().is_none_or(|&n| n <= 1) || t.strides().last() == Some(&1))
    };
    let d = ts
        .map(|t| match readable(t) {
            true => Ok(t.clone()),
            false => copy::contiguous(&copy::cast(t, A::DTYPE)?),
        })
        .into_iter()
        .collect::<Result<Vec<Tensor>>>()?;
    let acc = access::lock(&d.iter().collect::<Vec<_>>(), &[]);
    let rows: [Rows<'_, A>; N] = std::array::from_fn(|i| {
        let t = &d[i];
        let n = t.dim();
        let (shape, strides) = (t.shape(), t.strides());
        // the farthest element from the first (strides are never negative)
        let span = if t.numel() == 0 {
            0
        } else {
            1 + shape
                .iter()
                .zip(strides)
                .map(|(&s, &st)| (s - 1) * st)
                .sum::<usize>()
        };
        // SAFETY: the tensor's elements lie within `span` elements of A from its first,
        // and the read lock on its storage is held for the call.
        let data = unsafe { std::slice::from_raw_parts(acc.read::<A>(i), span) };
        let batch = &shape[..n - 2];
        let mut base = vec![0usize; numel(batch)];
        for (b, off) in base.iter_mut().enumerate() {
            let mut rest = b;
            for (&size, &st) in batch.iter().zip(strides).rev() {
                *off += (rest % size) * st;
                rest /= size;
            }
        }
        Rows {
            data,
            base,
            rs: strides[n - 2],
        }
    });
    Ok(f(rows))
}

/// The sizes of one attention: `batch` (flattened leading dims) of `[L, E]` queries over
/// `[S, E]` keys and `[S, Ev]` values.
pub(super) struct Dims {
    pub(super) batch: usize,
    pub(super) l: usize,
    pub(super) s: usize,
    pub(super) e: usize,
    pub(super) ev: usize,
    pub(super) scale: f64,
    pub(super) is_causal: bool,
}

/// The attention of every batch into `out`.
fn run<A: Acc>(qkv: [Rows<'_, A>; 3], mask: Option<&Mask>, d: &Dims, out: &mut [A]) {
    if out.is_empty() || d.ev == 0 {
        return;
    }
    // per batch its rows, in blocks of ROWS written by one task each
    out.par_chunks_mut(d.l * d.ev)
        .enumerate()
        .for_each(|(b, ob)| {
            ob.par_chunks_mut(ROWS * d.ev)
                .enumerate()
                .for_each(|(blk, o)| {
                    let qkv = &qkv;
                    let mut rows = move || rows_of(qkv, mask, d, b, blk * ROWS, o);
                    #[cfg(target_arch = "x86_64")]
                    if smelt_rt::vmath::available() {
                        // SAFETY: `available` saw AVX2 and FMA
                        return unsafe { on_avx2(rows) };
                    }
                    rows()
                });
        });
}

/// `dst (rows × cols, row stride ldd) = scale · lhs (rows × inner) · rhs`, plus `dst`
/// when `add`; `lhs` and `rhs` are read through their strides (`rs` between rows, `cs`
/// between columns), so a block of keys is used transposed in place.
///
/// # Safety
/// Every slice holds the elements its shape and strides address.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_into<A: Acc>(
    (rows, cols, inner): (usize, usize, usize),
    dst: &mut [A],
    ldd: usize,
    add: bool,
    lhs: &[A],
    (ls, lcs): (usize, usize),
    rhs: &[A],
    (rs, cs): (usize, usize),
    scale: A,
) {
    // f32 products with no scale whose right operand is read by rows run on register
    // tiles: those of one (batch, head) are a few thousand multiply-adds, and a GEMM
    // library's packing and dispatch cost more than they do
    if let (Some(lhs), Some(rhs), Some(dst)) = (f32s(lhs), f32s(rhs), f32s_mut(dst))
        && scale == A::ONE
        && cs == 1
        && smelt_rt::tiles::supports(cols)
    {
        use smelt_rt::tiles::{Operands, Span, Start, product};
        let spans = [Span {
            a: 0,
            b: 0,
            len: inner,
        }];
        let op = Operands {
            a: lhs.as_ptr(),
            b: rhs.as_ptr(),
            spans: &spans,
            a_rows: ls as isize,
            a_step: lcs as isize,
            b_step: rs as isize,
        };
        let start = if add { Start::Dst } else { Start::Zero };
        // SAFETY: the caller's shapes and strides stay inside the slices
        unsafe { product(&op, rows, cols, dst.as_mut_ptr(), ldd as isize, start) };
        return;
    }
    // SAFETY: the caller's shapes and strides stay inside the slices.
    unsafe {
        gemm::gemm(
            rows,
            cols,
            inner,
            dst.as_mut_ptr(),
            1,
            ldd as isize,
            add,
            lhs.as_ptr(),
            lcs as isize,
            ls as isize,
            rhs.as_ptr(),
            cs as isize,
            rs as isize,
            A::ONE,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `scale · xᵀ` of `n` rows of `e` elements (`rs` apart) from `x`, as `[e, n]`: an operand
/// read by columns becomes one read by rows.
pub(super) fn transposed<A: Acc>(
    x: &[A],
    (n, e, rs): (usize, usize, usize),
    scale: A,
    out: &mut Vec<A>,
) {
    // every element is written below: only a longer buffer needs filling
    out.resize(n * e, A::ZERO);
    if e == 0 {
        // no columns: the rows' stride may point past an empty `x`
        return;
    }
    if let (Some(x), Some(&[scale]), Some(out)) =
        (f32s(x), f32s(std::slice::from_ref(&scale)), f32s_mut(out))
    {
        smelt_rt::tiles::transpose_scaled(x, (n, e, rs), scale, out);
        return;
    }
    for j in 0..n {
        for (c, &v) in x[j * rs..][..e].iter().enumerate() {
            out[c * n + j] = v.mul(scale);
        }
    }
}

/// Runs `f` compiled for AVX2 and FMA: [`rows_of`], inlined into it, runs its loops over a
/// block's rows (maxima, shifts, sums, the last division) eight lanes wide where the
/// baseline build runs four. The same operations in the same order, so the same bits.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Query rows `i0 ..` of batch `b`, as many as `acc` holds, written into `acc`. Per block
/// of keys: the block's scores as one small GEMM, the mask, the online-softmax update of
/// each row, then the probabilities times the block's values as a second GEMM.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rows_of<A: Acc>(
    [q, k, v]: &[Rows<'_, A>; 3],
    mask: Option<&Mask>,
    d: &Dims,
    b: usize,
    i0: usize,
    acc: &mut [A],
) {
    let rows = acc.len() / d.ev;
    // the weighted sums of values accumulate from 0
    acc.fill(A::ZERO);
    let mut m = vec![A::NEG_INF; rows];
    let mut sum = vec![A::ZERO; rows];
    let mut p = vec![A::ZERO; rows * KEYS.min(d.s)];
    let qb = q.from(b, i0);
    let mut kt = Vec::new();
    // causal rows see keys up to their own index: later blocks are skipped whole
    let end = if d.is_causal { d.s.min(i0 + rows) } else { d.s };
    let mut j0 = 0;
    while j0 < end {
        let keys = KEYS.min(end - j0);
        if d.e == 0 {
            p[..rows * keys].iter_mut().for_each(|x| *x = A::ZERO);
        } else {
            // the scores against the scaled key block, transposed so that keys are columns
            let scale = A::from_f64(d.scale);
            transposed(k.from(b, j0), (keys, d.e, k.rs), scale, &mut kt);
            // SAFETY: p holds rows × keys; qb rows × E (rows q.rs apart); kt E × keys.
            unsafe {
                gemm_into(
                    (rows, keys, d.e),
                    &mut p,
                    keys,
                    false,
                    qb,
                    (q.rs, 1),
                    &kt,
                    (keys, 1),
                    A::ONE,
                );
            }
        }
        for r in 0..rows {
            let i = i0 + r;
            let row = &mut p[r * keys..(r + 1) * keys];
            hide(row, mask, d, b, i, j0);
            let max = |a: A, x: A| if x > a { x } else { a };
            let block_max = chains(row, A::NEG_INF, max, max);
            if block_max == A::NEG_INF {
                // every key of the block hidden: its exponentials are all 0
                continue;
            }
            let new_m = if block_max > m[r] { block_max } else { m[r] };
            if m[r] != A::NEG_INF && new_m != m[r] {
                let corr = A::exp_le0(m[r].sub(new_m));
                sum[r] = sum[r].mul(corr);
                for a in acc[r * d.ev..(r + 1) * d.ev].iter_mut() {
                    *a = a.mul(corr);
                }
            }
            m[r] = new_m;
            row.iter_mut().for_each(|x| *x = x.sub(new_m));
        }
        // the block's exponentials in one call: rows of a few keys would each pay the
        // vector helper's entry
        A::exp_le0_all(&mut p[..rows * keys]);
        for r in 0..rows {
            let s = chains(&p[r * keys..(r + 1) * keys], A::ZERO, A::add, A::add);
            sum[r] = sum[r].add(s);
        }
        // SAFETY: acc holds rows × Ev; p rows × keys; the value block keys rows of Ev
        // from j0, v.rs apart.
        unsafe {
            gemm_into(
                (rows, d.ev, keys),
                acc,
                d.ev,
                true,
                &p,
                (keys, 1),
                v.from(b, j0),
                (v.rs, 1),
                A::ONE,
            );
        }
        j0 += keys;
    }
    for r in 0..rows {
        let a_row = &mut acc[r * d.ev..(r + 1) * d.ev];
        if sum[r] == A::ZERO {
            // every key masked out
            a_row.iter_mut().for_each(|a| *a = A::ZERO);
        } else {
            for a in a_row.iter_mut() {
                *a = a.div(sum[r]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ExpLe0;

    #[test]
    fn the_f32_exponential_is_within_two_ulps_of_f64s() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0f32 * i as f32 / 200_000.0;
            let got = f64::from(x.exp_le0());
            let want = f64::from(x).exp();
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "{worst} ulps");
        assert_eq!(f32::NEG_INFINITY.exp_le0(), 0.0);
        assert_eq!((-100.0f32).exp_le0(), 0.0);
        assert_eq!(0.0f32.exp_le0(), 1.0);
    }

    #[test]
    fn the_row_exponentials_vanish_below_the_normal_range_too() {
        let xs = [
            0.0f32,
            -1.0,
            -50.0,
            -86.9,
            -87.1,
            -95.0,
            -104.0,
            -200.0,
            f32::NEG_INFINITY,
        ];
        let mut got = xs;
        <f32 as super::Acc>::exp_le0_all(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            if x < -87.0 {
                assert_eq!(g, 0.0, "exp({x})");
            } else {
                let want = f64::from(x).exp();
                let ulp = f64::from(f32::EPSILON) * want;
                assert!((f64::from(g) - want).abs() <= 2.0 * ulp, "exp({x}) = {g}");
            }
        }
    }
}
