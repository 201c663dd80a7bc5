//! Native vector math for strips (`smelt::codegen_cpu::strip`): f32 transcendentals mapped over a buffer
//! by loops that rustc vectorises for AVX-512 or AVX2 + FMA, chosen once at run time.
//!
//! Cranelift emits 128-bit vectors only, and a transcendental costs some forty instructions per
//! vector: in a fused kernel it, not memory, sets the pace. These loops run the same math 8 or
//! 16 lanes at a time. Each function is a port of its emitter in `smelt::codegen_cpu::math`: the same
//! constants and the same IEEE operations in the same order (fused multiply-adds where the
//! emitter fuses), so a strip's results are bit-identical to the inline code's
//! (`tests/cpu_math.rs` checks every op over its whole range).
//!
//! Without AVX2 + FMA (or off x86-64) [`available`] is false and kernels keep the inline code:
//! a software fma would make these loops slower than Cranelift's.
//!
//! The streamed copy (`stream`) moves a stack row to a large output with non-temporal AVX
//! stores (`smelt::codegen_cpu::stream`); kernels stream only where [`available`] is true.
//!
//! The column sum (`col_sum`) serves rows as lanes (`smelt::codegen_cpu::lanes`). It only adds
//! converted f32s and needs no fma, so it runs its portable build wherever AVX2 is missing.

use crate::consts::{
    ERF_SMALL, ERFC_Q, ERFC_Q_CENTER, ERFC_SLOPE, EXP_G, FRAC_1_SQRT_2PI, GELU_ERF_END,
    GELU_ERF_TAIL, GELU_TAIL_CENTER, GELU_TAIL_FIRST, GELU_TANH_END, GELU_TANH_TAIL, LN2_HI,
    LN2_LO, LOG2E, SHIFT32, SIGMOID_GONE,
};
use crate::lanes::{self, Lanes};
use std::sync::OnceLock;

/// An op a strip helper evaluates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StripOp {
    /// `exp(x)`.
    Exp = 0,
    /// `tanh(x)`.
    Tanh = 1,
    /// `1 / (1 + exp(-x))`.
    Sigmoid = 2,
    /// `x * sigmoid(x)`.
    Silu = 3,
    /// GELU with the tanh approximation (`approximate="tanh"`).
    GeluTanh = 4,
    /// GELU, exact form `x·Φ(x)` (`approximate="none"`).
    GeluErf = 5,
    /// The error function.
    Erf = 6,
    /// The exact GELU's slope `Φ(x) + x·φ(x)` (its gradient multiplies by it).
    GeluErfSlope = 7,
    /// The tanh GELU's slope.
    GeluTanhSlope = 8,
}

impl StripOp {
    /// Every strip op, in discriminant order.
    pub const ALL: [StripOp; 9] = [
        StripOp::Exp,
        StripOp::Tanh,
        StripOp::Sigmoid,
        StripOp::Silu,
        StripOp::GeluTanh,
        StripOp::GeluErf,
        StripOp::Erf,
        StripOp::GeluErfSlope,
        StripOp::GeluTanhSlope,
    ];

    /// The strip op of a code generated kernels pass.
    pub fn from_code(c: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|&op| op as i32 == c)
    }
}

/// The symbol generated kernels call: `smelt_strip_math(op, src, dst, n)` maps op over `n` f32s
/// from `src` into `dst`.
pub const SYMBOL: &str = "smelt_strip_math";

/// The symbol of the strip sum: `smelt_strip_sum(src, n)` is the f64 sum of `n` f32s.
pub const SUM_SYMBOL: &str = "smelt_strip_sum";

/// The symbols of the strip extremes: `smelt_strip_max(src, n)` (`smelt_strip_min`) is the
/// largest (smallest) of `n` f32s; a quiet NaN when any is NaN, as the generated vector
/// loops give; `-inf` (`inf`) for none.
pub const MAX_SYMBOL: &str = "smelt_strip_max";
/// See [`MAX_SYMBOL`].
pub const MIN_SYMBOL: &str = "smelt_strip_min";

/// The symbol of the column sum: `smelt_col_sum(src, stride, cols, rows, dst)` writes the f64
/// sums of `cols` adjacent columns over `rows` rows `stride` elements apart (`smelt::codegen_cpu::lanes`).
pub const COL_SUM_SYMBOL: &str = "smelt_col_sum";

/// The symbol of the streamed copy: `smelt_stream(src, dst, n)` copies `n` f32s from a stack
/// row to an output with non-temporal stores (`smelt::codegen_cpu::stream`).
pub const STREAM_SYMBOL: &str = "smelt_stream";

/// The symbol of the row softmax: `smelt_softmax_row(src, dst, n, log)` writes the softmax
/// (`log` = 1: log_softmax) of the `n` f32s at `src` to `dst` (`smelt::codegen_cpu::softmax`).
pub const SOFTMAX_SYMBOL: &str = "smelt_softmax_row";

// ---------------------------------------------------------------------------------------------
// Scalar definitions, written branch-free (selects, not jumps) so that the loops vectorise.

/// Clamp by compare + select; NaN passes through (as `math::clamp`).
#[inline(always)]
fn clamp<T: PartialOrd + Copy>(x: T, lo: T, hi: T) -> T {
    let x = if x > hi { hi } else { x };
    if x < lo { lo } else { x }
}

#[inline(always)]
fn poly32(x: f32, c: &[f64]) -> f32 {
    let (last, rest) = c.split_last().unwrap_or((&0.0, &[]));
    let mut acc = *last as f32;
    for &ci in rest.iter().rev() {
        acc = acc.mul_add(x, ci as f32);
    }
    acc
}

#[inline(always)]
fn pow2i32(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

#[inline(always)]
fn scale2n(y: f32, n: i32) -> f32 {
    scale2n_unless(y, n, false)
}

/// `math::scale2n_factors`: [`scale2n`] with the first factor 0 where `gone`.
#[inline(always)]
fn scale2n_unless(y: f32, n: i32, gone: bool) -> f32 {
    let n1 = n >> 1;
    let s1 = if gone { 0.0 } else { pow2i32(n1) };
    y * s1 * pow2i32(n.wrapping_sub(n1))
}

/// `math::scale2n_from_one`: `y·2^n` as added to or taken from 1, in one multiply.
#[inline(always)]
fn scale2n_from_one(y: f32, n: i32) -> f32 {
    y * pow2i32(n.max(-64))
}

/// `x = k·ln2 + r` (`math::reduce_ln2`).
#[inline(always)]
fn reduce_ln2(x: f32) -> (f32, i32) {
    let shift = SHIFT32 as f32;
    let s = x.mul_add(LOG2E as f32, shift);
    let kf = s + (-shift);
    let k = (s.to_bits() as i32).wrapping_sub(shift.to_bits() as i32);
    let r = kf.mul_add(-LN2_HI as f32, x);
    (kf.mul_add(-LN2_LO as f32, r), k)
}

#[inline(always)]
fn expm1_small(r: f32) -> f32 {
    let g = poly32(r, &EXP_G);
    (r * r).mul_add(g, r)
}

#[inline(always)]
fn exp_parts(x: f32) -> (f32, i32) {
    let (r, k) = reduce_ln2(clamp(x, -110.0, 89.0));
    (expm1_small(r) + 1.0, k)
}

#[inline(always)]
fn exp(x: f32) -> f32 {
    let (p, k) = exp_parts(x);
    // `math::exp`: 0 below -105 without an underflowing product
    let p = if x < -105.0 { 0.0 } else { p };
    scale2n(p, k)
}

#[inline(always)]
fn expm1(x: f32) -> f32 {
    let (r, k) = reduce_ln2(clamp(x, -30.0, 89.0));
    let p = expm1_small(r);
    let s = pow2i32(k.wrapping_sub(1));
    let y = s.mul_add(p, s + (-0.5));
    let y = if k == 0 { p } else { y + y };
    if x == 0.0 { x } else { y }
}

#[inline(always)]
fn tanh(x: f32) -> f32 {
    let a = clamp(x.abs(), 0.0, 10.0);
    let t = expm1(a + a);
    (t / (t + 2.0)).copysign(x)
}

/// `math::sigmoid`: `1/(1+e)` for `x ≥ 0`, `p/(1+e)·2^k` below (`e = p·2^k = e^{-|x|}`).
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    let (p, k) = exp_parts(-x.abs());
    // `math::sigmoid`: no subnormal product where the result does not need one
    let den = 1.0 + scale2n_from_one(p, k);
    let y_neg = scale2n_unless(p / den, k, k < SIGMOID_GONE);
    if x >= 0.0 { 1.0 / den } else { y_neg }
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `math::split_const`: `c` as two f32s.
#[inline(always)]
fn split(c: f64) -> (f32, f32) {
    let hi = c as f32;
    (hi, (c - f64::from(hi)) as f32)
}

/// `math::erf_small`: `erf(x)` for `|x| ≤ 1`.
#[inline(always)]
fn erf_small(x: f32) -> f32 {
    x * poly32(x * x, &ERF_SMALL)
}

/// `math::two_sum_err`: the rounding error of `s = x + y`.
#[inline(always)]
fn two_sum_err(x: f32, y: f32, s: f32) -> f32 {
    let yv = s - x;
    let xv = s - yv;
    (x - xv) + (y - yv)
}

/// `math::erfc_tail`: `erfc(z) = w·p·2^k` given `z² = hi + lo`.
#[inline(always)]
fn erfc_tail(z: f32, hi: f32, lo: f32) -> (f32, f32, i32) {
    let (p, k) = exp_parts(-hi);
    let d = z + 2.0;
    let dl = two_sum_err(z, 2.0, d);
    let t0 = 2.0 / d;
    let rem = (-t0).mul_add(d, 2.0);
    let rem = (-t0).mul_add(dl, rem);
    let c = rem / d;
    let ts = t0 + (-ERFC_Q_CENTER as f32);
    let q = poly32(ts, &ERFC_Q);
    let slope = poly32(ts, &ERFC_SLOPE);
    let w = c.mul_add(slope, t0 * q);
    let w = (-w).mul_add(lo, w);
    (w, p, k)
}

/// `math::erf`: `x·P(x²)` below 1, `1 - erfc(|x|)` (with the sign of `x`) above.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let a = x.abs();
    let small = erf_small(x);
    // erf rounds to ±1 beyond 3.92
    let z = clamp(a, 0.5, 4.0);
    let hi = z * z;
    let lo = z.mul_add(z, -hi);
    let (w, p, k) = erfc_tail(z, hi, lo);
    let big = (1.0 - scale2n_from_one(w * p, k)).copysign(x);
    if a < 1.0 { small } else { big }
}

/// What the GELUs' tail finishes, here and in the code generator's inline emitters: a GELU,
/// or the slope of one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum GeluTail {
    /// Either GELU: `x - m` above 0 and `m` below.
    Gelu,
    /// The exact GELU's slope: `1 - m` above 0 and `m` below, `m = Φ(-a) - a·φ(a)`.
    ErfSlope,
    /// The tanh GELU's slope: `1 - m` above 0 and `m` below, `m = S·(1 - a·v'(a)·(1 - S))`.
    TanhSlope,
}
use GeluTail as Tail;

impl GeluTail {
    /// The `nh` (of `e^{nh}`) below which the tail's `|m| < 2^-127`, so that it is computed
    /// as ±0: a subnormal product costs a microcode assist per lane on x86 (it made a GELU
    /// of `h = x·W` with large `h` several times slower), and the result is flushed anyway. Bounds of `|w|`
    /// before its scale `2^k`: the exact GELU, `|xc|·H(a)·p < 1` once `a > 13.29`; its
    /// slope, `(a/√(2π) + H)·p < 8`; the tanh GELU, `|xc|·E·p < 16` (`E = sigmoid(v) ≤ 1`);
    /// its slope, `E·p·(1 + q) < 512` (`q ≤ 265` at `a = 10.5`). Each threshold is half a
    /// step past the power of two that leaves `2^-128` of margin.
    pub fn vanishes_below(self, tanh: bool) -> f32 {
        let e = match (tanh, self) {
            (false, Tail::Gelu) => 127.5,
            (false, _) => 130.5,
            (true, Tail::TanhSlope) => 136.5,
            (true, _) => 131.5,
        };
        (-e * std::f64::consts::LN_2) as f32
    }
}

/// `math::gelu_tail`: `m = xc·F(a)·e^{nh}·(1 + nl)` with `F` the polynomials of
/// [`GELU_TANH_TAIL`] (`tanh`) or [`GELU_ERF_TAIL`] and `e^{nh} = p·2^k` (`nh ≥ -100` needs no clamp),
/// then `x - m` above 0 and `m` below (a slope: its own `m`, and `1 - m` above 0); subnormal
/// results flushed, `-inf` gives NaN (either infinity for a slope).
#[inline(always)]
fn gelu_tail<V: Lanes>((x, xc, a): (V, V, V), nh: V, nl: V, tanh: bool, form: Tail) -> V {
    let shift = SHIFT32 as f32;
    let s = nh.fma(V::splat(LOG2E as f32), V::splat(shift));
    let kf = s.add(V::splat(-shift));
    let k = V::isub(s.bits(), V::isplat(shift.to_bits() as i32));
    let r = kf.fma(V::splat(-LN2_HI as f32), nh);
    let r = kf.fma(V::splat(-LN2_LO as f32), r);
    let mut g = V::splat(EXP_G[EXP_G.len() - 1] as f32);
    for &c in EXP_G[..EXP_G.len() - 1].iter().rev() {
        g = g.fma(r, V::splat(c as f32));
    }
    let p = r.mul(r).fma(g, r).add(V::splat(1.0));
    // the interval of `a`: exponent and two leading mantissa bits of a + 4
    let top = V::ushr21(a.add(V::splat(4.0)).bits());
    let i = V::imin(V::isub(top, V::isplat(GELU_TAIL_FIRST)), V::isplat(7));
    let u = a.sub(V::lookup8(i, &GELU_TAIL_CENTER));
    let table = if tanh {
        &GELU_TANH_TAIL
    } else {
        &GELU_ERF_TAIL
    };
    let mut f = V::lookup8(i, &table[table.len() - 1]);
    for c in table[..table.len() - 1].iter().rev() {
        f = f.fma(u, V::lookup8(i, c));
    }
    let lead = match form {
        Tail::Gelu => xc.mul(f),
        Tail::ErfSlope => a.fma(V::splat(-FRAC_1_SQRT_2PI as f32), f),
        Tail::TanhSlope => f,
    };
    // w·(1 + nl), as w + w·nl so that x = -0 keeps its sign
    let w = lead.mul(p);
    let w = w.fma(nl, w);
    let n1 = V::sshr1(k);
    let n2 = V::isub(k, n1);
    // 2^k as two factors, the first 0 where the result vanishes: ±0 (the sign of `w`)
    // without a subnormal product
    let far = nh.lt(V::splat(form.vanishes_below(tanh)));
    let s1 = V::select(far, V::splat(0.0), pow2i::<V>(n1));
    let scale = |w: V| w.mul(s1).mul(pow2i::<V>(n2));
    let w = if form == Tail::TanhSlope {
        // S·(1 - q·(1 - S)), q = a·v'(a), scaled by 2^k last (S may be subnormal)
        let kk = (2.0 * (2.0 / std::f64::consts::PI).sqrt()) as f32;
        let c3 = (2.0 * (2.0 / std::f64::consts::PI).sqrt() * 3.0 * 0.044715) as f32;
        let q = a.mul(a.mul(a).fma(V::splat(c3), V::splat(kk)));
        let qr = q.mul(V::splat(1.0).sub(scale(w)));
        w.neg().fma(qr, w)
    } else {
        w
    };
    let m = scale(w);
    let above = match form {
        Tail::Gelu => x,
        Tail::ErfSlope | Tail::TanhSlope => V::splat(1.0),
    };
    let y = V::select(x.gt(V::splat(0.0)), above.sub(m), m);
    let tiny = y.abs().lt(V::splat(f32::MIN_POSITIVE));
    let y = V::select(tiny, y.mul(V::splat(0.0)), y);
    let nan = match form {
        Tail::Gelu => x.eq(V::splat(f32::NEG_INFINITY)),
        Tail::ErfSlope | Tail::TanhSlope => x.abs().eq(V::splat(f32::INFINITY)),
    };
    V::select(nan, V::splat(f32::NAN), y)
}

/// `math::gelu` (`Tail::Gelu`) or `math::gelu_slope`: from `x·Φ(-a) = x·H(a)·e^{-a²/2}`
/// (`a = |x|`; `e^{-a²/2}` with the exact split `a² = hi + lo`).
#[inline(always)]
fn gelu_erf<V: Lanes>(x: V, form: Tail) -> V {
    let xc = x.clamp(-GELU_ERF_END, GELU_ERF_END);
    let a = xc.abs();
    let a2 = a.mul(a);
    let half = V::splat(0.5);
    let nhi = a2.mul(half).neg();
    // -lo = a2 - a·a exactly
    let nlo = a.neg().fma(a, a2).mul(half);
    gelu_tail((x, xc, a), nhi, nlo, false, form)
}

/// `math::gelu_tanh` (`Tail::Gelu`) or `math::gelu_tanh_slope`: from
/// `x·sigmoid(-v) = x·E(a)·e^{-v}` with `v = 2u(a)` in double-f32 arithmetic (its rounding
/// error would be amplified by `e^{-v}`).
#[inline(always)]
fn gelu_tanh<V: Lanes>(x: V, form: Tail) -> V {
    let k = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
    let (c1h, c1l) = split(k);
    let (c2h, c2l) = split(k * 0.044715);
    let (c1h, c2h) = (V::splat(c1h), V::splat(c2h));
    let xc = x.clamp(-GELU_TANH_END, GELU_TANH_END);
    let a = xc.abs();
    let a2h = a.mul(a);
    let a2l = a.fma(a, a2h.neg());
    // c2·a² + c1 as bh + bl
    let ah = c2h.mul(a2h);
    let ae = c2h.fma(a2h, ah.neg());
    let al = c2h.fma(a2l, a2h.mul(V::splat(c2l))).add(ae);
    let bh = c1h.add(ah);
    let yv = bh.sub(c1h);
    let xv = bh.sub(yv);
    let be = c1h.sub(xv).add(ah.sub(yv));
    let bl = al.add(V::splat(c1l)).add(be);
    // v = a·b as vh + vl; -vl = vh - a·bh - a·bl (+0 at a = 0)
    let vh = a.mul(bh);
    let na = a.neg();
    let nvl = na.fma(bl, na.fma(bh, vh));
    gelu_tail((x, xc, a), vh.neg(), nvl, true, form)
}

/// `2^n` for lanes `n` in the normal exponent range.
#[inline(always)]
fn pow2i<V: Lanes>(n: V::I) -> V {
    V::from_bits(V::shl23(V::iadd(n, V::isplat(127))))
}

/// A GELU or its slope (the tanh form or the exact one, by strip op) of the `n` f32s at `src`
/// into `dst`, `V::N` lanes at a time and the tail one by one. Reading the source in the
/// loop, instead of copying it into `dst` first, keeps memory's latency under the
/// arithmetic.
///
/// # Safety
/// The CPU has the features of `V`, and the caller is compiled with them; `src` points to
/// `n` initialised f32s and `dst` to `n` writable ones, the same memory or disjoint.
#[inline(always)]
unsafe fn gelu_map<V: Lanes>(src: *const f32, dst: *mut f32, n: usize, op: StripOp) {
    // one loop per form, with the form a constant in it: a loop that tested the form in
    // each lane group kept 34 constants out of registers and took 5 jumps per 8 lanes
    // SAFETY: the caller's contract on `V`.
    unsafe {
        match op {
            StripOp::GeluTanh => gelu_loop::<V>(src, dst, n, true, Tail::Gelu),
            StripOp::GeluTanhSlope => gelu_loop::<V>(src, dst, n, true, Tail::TanhSlope),
            StripOp::GeluErfSlope => gelu_loop::<V>(src, dst, n, false, Tail::ErfSlope),
            _ => gelu_loop::<V>(src, dst, n, false, Tail::Gelu),
        }
    }
}

/// [`gelu_map`] of `xs` in place.
///
/// # Safety
/// The CPU has the features of `V`, and the caller is compiled with them.
#[inline(always)]
unsafe fn gelu_in_place<V: Lanes>(xs: &mut [f32], op: StripOp) {
    let p = xs.as_mut_ptr();
    // SAFETY: `p` points to `xs.len()` f32s, read and written through it alone.
    unsafe { gelu_map::<V>(p, p, xs.len(), op) }
}

/// [`gelu_map`] for one form.
///
/// # Safety
/// As [`gelu_map`].
#[inline(always)]
unsafe fn gelu_loop<V: Lanes>(src: *const f32, dst: *mut f32, n: usize, tanh: bool, form: Tail) {
    #[inline(always)]
    fn one<L: Lanes>(x: L, tanh: bool, form: Tail) -> L {
        if tanh {
            gelu_tanh(x, form)
        } else {
            gelu_erf(x, form)
        }
    }
    let mut i = 0;
    while i + V::N <= n {
        if i % 16 == 0 {
            // one line per 16 lanes, far enough ahead that the load finds it in cache
            prefetch(src.wrapping_add(i + PREFETCH_AHEAD) as *const u8);
        }
        // SAFETY: lanes `i..i + V::N` are in both ranges (each read before its own write
        // where the two are the same memory); the caller's contract on `V`.
        unsafe { one(V::load(src.add(i)), tanh, form).store(dst.add(i)) };
        i += V::N;
    }
    for i in i..n {
        // SAFETY: as above, one lane.
        unsafe { *dst.add(i) = one(*src.add(i), tanh, form) };
    }
}

/// Whether [`gelu_map`] evaluates `op`.
fn gelu_family(op: StripOp) -> bool {
    matches!(
        op,
        StripOp::GeluErf | StripOp::GeluTanh | StripOp::GeluErfSlope | StripOp::GeluTanhSlope
    )
}

/// How far ahead of a streaming read [`prefetch_ahead`] asks for lines, in f32s (8 KiB).
pub const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache line at `p` (a hint: any address, it reads nothing and never faults).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch cannot fault or change memory; SSE is baseline x86-64.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the two cache lines [`PREFETCH_AHEAD`] elements past `xs[i]`: the hardware's
/// prefetchers stop at each 4 KiB boundary and restart behind it, so long row sums measured
/// faster with it, on one thread and on two (BENCHMARKS.md). The address may lie past the
/// slice.
#[inline(always)]
fn prefetch_ahead(xs: &[f32], i: usize) {
    let p = xs.as_ptr().wrapping_add(i + PREFETCH_AHEAD) as *const u8;
    prefetch(p);
    prefetch(p.wrapping_add(64));
}

/// Thirty-two f64 partial sums (four AVX-512 vectors, eight AVX2 ones), added up at the end:
/// with two vectors, each add waited for the one before it and a thread read memory at
/// 16 bytes a cycle at most, below what one core draws from DRAM with loads in flight.
#[inline(always)]
fn sum_with(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; 32];
    let chunks = xs.chunks_exact(32);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 32);
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f64::from(x);
        }
    }
    let mut s = 0.0;
    for a in acc {
        s += a;
    }
    for &x in tail {
        s += f64::from(x);
    }
    s
}

/// The largest (`MAX`) or smallest element of `xs` in 32 lanes, NaN when any is; ties of
/// `-0` and `+0` give either.
#[inline(always)]
fn extreme_with<const MAX: bool>(xs: &[f32]) -> f32 {
    let init = if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let better = |x: f32, a: f32| if MAX { x > a } else { x < a };
    let mut acc = [init; 32];
    let mut nan = [0u32; 32];
    let chunks = xs.chunks_exact(32);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 32);
        for ((a, m), &x) in acc.iter_mut().zip(nan.iter_mut()).zip(c) {
            *m |= u32::from(x.is_nan());
            *a = if better(x, *a) { x } else { *a };
        }
    }
    let mut any = nan.iter().any(|&m| m != 0);
    let mut r = init;
    for x in acc.into_iter().chain(tail.iter().copied()) {
        any |= x.is_nan();
        r = if better(x, r) { x } else { r };
    }
    if any { f32::NAN } else { r }
}

/// softmax of `xs` into `out` (same length): `e = exp(x - max)`, then `e / Σe` in f64 rounded
/// once; log_softmax: `x - max - ln(Σe)` in f64. The max skips NaN, but a NaN's exponential
/// makes the sum and so the whole row NaN, as in the reference; a row of `-inf` is NaN too.
/// (So the max needs none of [`extreme_with`]'s NaN tracking, which measured slower on
/// large rows.)
#[inline(always)]
fn softmax_with(xs: &[f32], out: &mut [f32], log: bool) {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let mut m = f32::NEG_INFINITY;
    for &x in chunks.remainder() {
        m = if x > m { x } else { m };
    }
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 16);
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    for a in acc {
        m = if a > m { a } else { m };
    }
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = exp(x - m);
    }
    let s = sum_with(out);
    if log {
        let (m, lse) = (f64::from(m), s.ln());
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = (f64::from(x) - m - lse) as f32;
        }
    } else {
        let r = 1.0 / s;
        for o in out.iter_mut() {
            *o = (f64::from(*o) * r) as f32;
        }
    }
}

/// layer_norm of `xs` into `out` (same length): mean and biased variance in f64 (32 and 16
/// partial sums each), `(x - mean)·rstd·w + b` in f64, rounded once to f32.
#[inline(always)]
fn layer_norm_with(xs: &[f32], out: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) {
    let n = xs.len() as f64;
    let m = sum_with(xs) / n;
    let mut acc = [0.0f64; 16];
    let chunks = xs.chunks_exact(16);
    let mut var = 0.0;
    for &x in chunks.remainder() {
        let d = f64::from(x) - m;
        var += d * d;
    }
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            let d = f64::from(x) - m;
            *a += d * d;
        }
    }
    for a in acc {
        var += a;
    }
    let rstd = 1.0 / (var / n + eps).sqrt();
    // one loop per case, so that each vectorises without per-element tests
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, &x), &w), &b) in out.iter_mut().zip(xs).zip(w).zip(b) {
                *o = ((f64::from(x) - m) * rstd * f64::from(w) + f64::from(b)) as f32;
            }
        }
        (Some(w), None) => {
            for ((o, &x), &w) in out.iter_mut().zip(xs).zip(w) {
                *o = ((f64::from(x) - m) * rstd * f64::from(w)) as f32;
            }
        }
        (None, Some(b)) => {
            for ((o, &x), &b) in out.iter_mut().zip(xs).zip(b) {
                *o = ((f64::from(x) - m) * rstd + f64::from(b)) as f32;
            }
        }
        (None, None) => {
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = ((f64::from(x) - m) * rstd) as f32;
            }
        }
    }
}

/// `$each!(f)` with the scalar function of strip op `$op`, or `$gelu` for the GELUs.
macro_rules! by_op {
    ($op:expr, $each:ident, $gelu:expr) => {
        match $op {
            StripOp::Exp => $each!(exp),
            StripOp::Tanh => $each!(tanh),
            StripOp::Sigmoid => $each!(sigmoid),
            StripOp::Silu => $each!(silu),
            StripOp::Erf => $each!(erf),
            StripOp::GeluTanh
            | StripOp::GeluErf
            | StripOp::GeluErfSlope
            | StripOp::GeluTanhSlope => $gelu,
        }
    };
}

/// Plain `for` loops, not `for_each` with a closure: rustc may outline a generic
/// `for_each` out of the `#[target_feature]` caller, and the copy outside it computes every
/// `mul_add` with a software fma call (the exact GELU ran far slower that way).
#[inline(always)]
fn map_with(op: StripOp, xs: &mut [f32]) {
    macro_rules! each {
        ($f:ident) => {
            for x in xs {
                *x = $f(*x);
            }
        };
    }
    // SAFETY: one lane needs no features
    by_op!(op, each, unsafe { gelu_in_place::<f32>(xs, op) })
}

/// `dst = op(src)`, with the source's lines asked for ahead of the loop.
#[inline(always)]
fn map_from_with(op: StripOp, src: &[f32], dst: &mut [f32]) {
    const STEP: usize = 16;
    macro_rules! each {
        ($f:ident) => {{
            let (mut s, mut d) = (src.chunks_exact(STEP), dst.chunks_exact_mut(STEP));
            for (k, (o, x)) in (&mut d).zip(&mut s).enumerate() {
                prefetch(src.as_ptr().wrapping_add(k * STEP + PREFETCH_AHEAD) as *const u8);
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = $f(x);
                }
            }
            for (o, &x) in d.into_remainder().iter_mut().zip(s.remainder()) {
                *o = $f(x);
            }
        }};
    }
    let n = src.len().min(dst.len());
    // SAFETY: one lane needs no features; `n` f32s in each, disjoint (two borrows)
    by_op!(op, each, unsafe {
        gelu_map::<f32>(src.as_ptr(), dst.as_mut_ptr(), n, op)
    })
}

// ---------------------------------------------------------------------------------------------
// Dispatch

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Avx512,
    Avx2,
    Unavailable,
}

pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        // `SMELT_CPU=avx2` (or `baseline`) caps the helpers below what the CPU has, to
        // measure the paths of smaller CPUs on a larger one
        let cap = std::env::var("SMELT_CPU").unwrap_or_default();
        if cap == "baseline" {
            return Level::Unavailable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2
                && cap != "avx2"
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
            {
                return Level::Avx512;
            }
            if avx2 {
                return Level::Avx2;
            }
        }
        Level::Unavailable
    })
}

/// Whether this CPU runs the strip helpers natively (AVX2 + FMA at least).
pub fn available() -> bool {
    level() != Level::Unavailable
}

/// The widest vector instructions the strip helpers use here, for reports.
pub fn isa() -> &'static str {
    match level() {
        Level::Avx512 => "avx512",
        Level::Avx2 => "avx2+fma",
        Level::Unavailable => "none",
    }
}

/// One call's work: a map in place, a sum into the f64, or column sums.
enum Job<'a> {
    Map(StripOp, &'a mut [f32]),
    /// A map of `n` f32s into `dst`, the same memory as `src` or disjoint.
    MapFrom {
        op: StripOp,
        src: *const f32,
        dst: *mut f32,
        n: usize,
    },
    Sum(&'a [f32], &'a mut f64),
    /// The largest (`true`) or smallest element.
    Extreme(&'a [f32], &'a mut f32, bool),
    /// softmax (or log_softmax) of one row into the second slice.
    Softmax(&'a [f32], &'a mut [f32], bool),
    /// layer_norm of one row into `out`, with an optional weight and bias of its length.
    LayerNorm {
        xs: &'a [f32],
        out: &'a mut [f32],
        w: Option<&'a [f32]>,
        b: Option<&'a [f32]>,
        eps: f64,
    },
    /// `dst[c] = Σ_r src[r·stride + c]` over `rows` rows of `dst.len()` f32s.
    Cols {
        src: *const f32,
        stride: isize,
        rows: usize,
        dst: &'a mut [f64],
    },
}

#[inline(always)]
fn run_with(job: Job) {
    match job {
        Job::Map(op, xs) => map_with(op, xs),
        Job::MapFrom { op, src, dst, n } if std::ptr::eq(src, dst) => {
            // SAFETY: whoever made the job (`strip_math`, `apply_from`) promises `n` f32s at
            // `dst`, initialised and used by nothing else meanwhile; `src` is the same memory.
            map_with(op, unsafe { std::slice::from_raw_parts_mut(dst, n) })
        }
        // SAFETY: as above, and the two ranges of `n` f32s are disjoint (the same memory took
        // the arm above), so the shared and the mutable slice do not alias.
        Job::MapFrom { op, src, dst, n } => unsafe {
            map_from_with(
                op,
                std::slice::from_raw_parts(src, n),
                std::slice::from_raw_parts_mut(dst, n),
            )
        },
        Job::Sum(xs, out) => *out = sum_with(xs),
        Job::Extreme(xs, out, true) => *out = extreme_with::<true>(xs),
        Job::Extreme(xs, out, false) => *out = extreme_with::<false>(xs),
        Job::Softmax(xs, out, log) => softmax_with(xs, out, log),
        Job::LayerNorm { xs, out, w, b, eps } => layer_norm_with(xs, out, w, b, eps),
        Job::Cols {
            src,
            stride,
            rows,
            dst,
        } => {
            let n = dst.len();
            // SAFETY: whoever made the job (`col_sum`) promises that every row is readable.
            let row = |r: usize| unsafe {
                std::slice::from_raw_parts(src.wrapping_offset(r as isize * stride), n)
            };
            cols_with(dst, rows, row)
        }
    }
}

/// Adds `rows` rows into `dst`, zeroed first, in row order: the order of one f64 accumulator
/// per column, so the sums are bit-identical to a sequential loop. Four rows per pass over
/// `dst` keep its loads and stores off the critical path.
#[inline(always)]
fn cols_with<'a>(dst: &mut [f64], rows: usize, row: impl Fn(usize) -> &'a [f32]) {
    dst.fill(0.0);
    let mut r = 0;
    while r + 4 <= rows {
        let (a, b, c, d) = (row(r), row(r + 1), row(r + 2), row(r + 3));
        for ((((o, &a), &b), &c), &d) in dst.iter_mut().zip(a).zip(b).zip(c).zip(d) {
            *o = (((*o + f64::from(a)) + f64::from(b)) + f64::from(c)) + f64::from(d);
        }
        r += 4;
    }
    for r in r..rows {
        for (o, &x) in dst.iter_mut().zip(row(r)) {
            *o += f64::from(x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
fn run_avx512(job: Job) {
    match job {
        // SAFETY: compiled for AVX-512, which `level` saw
        Job::Map(op, xs) if gelu_family(op) => unsafe { gelu_in_place::<lanes::X16>(xs, op) },
        // SAFETY: as above; the job's maker promises the two ranges
        Job::MapFrom { op, src, dst, n } if gelu_family(op) => unsafe {
            gelu_map::<lanes::X16>(src, dst, n, op)
        },
        job => run_with(job),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2(job: Job) {
    match job {
        // SAFETY: compiled for AVX2 + FMA, which `level` saw
        Job::Map(op, xs) if gelu_family(op) => unsafe { gelu_in_place::<lanes::X8>(xs, op) },
        // SAFETY: as above; the job's maker promises the two ranges
        Job::MapFrom { op, src, dst, n } if gelu_family(op) => unsafe {
            gelu_map::<lanes::X8>(src, dst, n, op)
        },
        job => run_with(job),
    }
}

/// Runs `job` with the widest vectors this CPU has (the portable loop where [`available`] is
/// false: correct, but slow without a hardware fma).
fn run(job: Job) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw AVX-512 F/VL/DQ, AVX2 and FMA on this CPU.
        Level::Avx512 => unsafe { run_avx512(job) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw AVX2 and FMA on this CPU.
        Level::Avx2 => unsafe { run_avx2(job) },
        _ => run_with(job),
    }
}

/// The sum of `xs` in f64 (thirty-two partial sums; the order differs from a sequential sum
/// only far below f32 precision).
pub fn sum(xs: &[f32]) -> f64 {
    let mut s = 0.0;
    run(Job::Sum(xs, &mut s));
    s
}

/// The largest (`max`) or smallest element of `xs`: NaN when any is, `∓inf` for none.
pub fn extreme(xs: &[f32], max: bool) -> f32 {
    let mut r = 0.0;
    run(Job::Extreme(xs, &mut r, max));
    r
}

/// softmax (or, with `log`, log_softmax) of the row `xs` into `out`, of the same length.
pub fn softmax(xs: &[f32], out: &mut [f32], log: bool) {
    let n = xs.len().min(out.len());
    run(Job::Softmax(&xs[..n], &mut out[..n], log))
}

/// layer_norm of the row `xs` into `out` with an optional weight and bias (each as long as
/// the row; shorter slices shorten the row).
pub fn layer_norm(xs: &[f32], out: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) {
    let n = [
        Some(xs.len()),
        Some(out.len()),
        w.map(<[f32]>::len),
        b.map(<[f32]>::len),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(0);
    run(Job::LayerNorm {
        xs: &xs[..n],
        out: &mut out[..n],
        w: w.map(|w| &w[..n]),
        b: b.map(|b| &b[..n]),
        eps,
    })
}

/// Column sums of a row-major matrix: `dst[j] = Σ_r xs[r·stride + c0 + j]` over the
/// `xs.len() / stride` rows, in f64, rows in order. Does nothing unless `stride` divides
/// `xs.len()` and the columns `c0..c0 + dst.len()` lie within a row.
pub fn col_sums(xs: &[f32], stride: usize, c0: usize, dst: &mut [f64]) {
    let fits = stride > 0
        && xs.len().is_multiple_of(stride)
        && c0.checked_add(dst.len()).is_some_and(|e| e <= stride)
        && isize::try_from(stride).is_ok();
    if !fits || dst.is_empty() {
        return;
    }
    run(Job::Cols {
        src: xs[c0..].as_ptr(),
        stride: stride as isize,
        rows: xs.len() / stride,
        dst,
    });
}

/// Maps `op` over `xs` in place.
pub fn apply(op: StripOp, xs: &mut [f32]) {
    run(Job::Map(op, xs))
}

/// `dst = op(src)` over the shorter of the two: the same values as [`apply`] on a copy,
/// with the source read in the loop instead of copied first, which measured faster on
/// large inputs (BENCHMARKS.md).
pub fn apply_from(op: StripOp, src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    run(Job::MapFrom {
        op,
        src: src.as_ptr(),
        dst: dst.as_mut_ptr(),
        n,
    })
}

/// The helper generated code calls: `dst[..n] = op(src[..n])`. The two may be the same
/// memory or overlap (a kernel writing into its own input). The loop reads the source where
/// the two are the same memory or disjoint; a source that partly overlaps is first moved
/// into the destination (2 KiB at most) and mapped there. An unknown op code or a negative
/// count does nothing (generated code passes neither).
///
/// # Safety
/// `src` points to `n` initialised f32s, `dst` to `n` writable ones; nothing else touches
/// them during the call.
#[unsafe(export_name = "smelt_strip_math")]
pub unsafe extern "C" fn strip_math(op: i32, src: *const f32, dst: *mut f32, n: i64) {
    let (Some(op), Ok(n)) = (StripOp::from_code(op), usize::try_from(n)) else {
        return;
    };
    if n == 0 {
        return;
    }
    let (s, d, bytes) = (src as usize, dst as usize, n.saturating_mul(4));
    let disjoint = s.saturating_add(bytes) <= d || d.saturating_add(bytes) <= s;
    if disjoint || s == d {
        return run(Job::MapFrom { op, src, dst, n });
    }
    // SAFETY: the caller's contract; `copy` allows overlap.
    let xs = unsafe {
        std::ptr::copy(src, dst, n);
        std::slice::from_raw_parts_mut(dst, n)
    };
    apply(op, xs);
}

/// The strip sum generated code calls; a negative count sums nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s that nothing writes during the call.
#[unsafe(export_name = "smelt_strip_sum")]
pub unsafe extern "C" fn strip_sum(src: *const f32, n: i64) -> f64 {
    match usize::try_from(n) {
        // SAFETY: the caller's contract.
        Ok(n) if n > 0 => sum(unsafe { std::slice::from_raw_parts(src, n) }),
        _ => 0.0,
    }
}

/// The strip maximum generated code calls (see [`MAX_SYMBOL`]); a negative count has none.
///
/// # Safety
/// `src` points to `n` initialised f32s that nothing writes during the call.
#[unsafe(export_name = "smelt_strip_max")]
pub unsafe extern "C" fn strip_max(src: *const f32, n: i64) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { strip_extreme(src, n, true) }
}

/// The strip minimum generated code calls (see [`MAX_SYMBOL`]).
///
/// # Safety
/// As [`strip_max`].
#[unsafe(export_name = "smelt_strip_min")]
pub unsafe extern "C" fn strip_min(src: *const f32, n: i64) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { strip_extreme(src, n, false) }
}

/// # Safety
/// As [`strip_max`].
unsafe fn strip_extreme(src: *const f32, n: i64, max: bool) -> f32 {
    match usize::try_from(n) {
        // SAFETY: the caller's contract.
        Ok(n) if n > 0 => extreme(unsafe { std::slice::from_raw_parts(src, n) }, max),
        _ if max => f32::NEG_INFINITY,
        _ => f32::INFINITY,
    }
}

/// The row softmax generated code calls (see [`SOFTMAX_SYMBOL`]); a negative count does
/// nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s and `dst` to `n` writable ones that do not overlap
/// them; nothing else touches either during the call.
#[unsafe(export_name = "smelt_softmax_row")]
pub unsafe extern "C" fn softmax_row(src: *const f32, dst: *mut f32, n: i64, log: i32) {
    let Ok(n) = usize::try_from(n) else {
        return;
    };
    if n == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    let (xs, out) = unsafe {
        (
            std::slice::from_raw_parts(src, n),
            std::slice::from_raw_parts_mut(dst, n),
        )
    };
    softmax(xs, out, log != 0);
}

/// Completes this thread's streamed stores before its later stores (`sfence`): a kernel
/// that streamed calls it before returning its results.
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// The streamed copy generated code calls: `dst[..n] = src[..n]`, with non-temporal stores
/// from the first 32-byte boundary of `dst` on (plain stores before it and for the last
/// partial vector). A negative count copies nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s and `dst` to `n` writable ones that do not overlap
/// them; nothing else touches either during the call.
#[unsafe(export_name = "smelt_stream")]
pub unsafe extern "C" fn stream(src: *const f32, dst: *mut f32, n: i64) {
    let Ok(n) = usize::try_from(n) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX is present (AVX2 implies it); the caller's contract.
        unsafe { stream_avx(src, dst, n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// [`stream`] with 32-byte streaming stores.
///
/// # Safety
/// The CPU has AVX; `src` points to `n` initialised f32s and `dst` to `n` writable ones that
/// do not overlap them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(src: *const f32, dst: *mut f32, n: usize) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    let head = dst.align_offset(32).min(n);
    // SAFETY: `head <= n`, and the caller's contract gives `n` readable f32s at `src` and `n`
    // writable ones at `dst`, disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 8 <= n {
        // SAFETY: AVX by this fn's contract; lanes `i..i + 8 <= n` of both ranges; `dst + i`
        // is 32-byte aligned, as the streaming store needs (`head` reached the boundary, or
        // `head == n` and the loop does not run).
        unsafe { _mm256_stream_ps(dst.add(i), _mm256_loadu_ps(src.add(i))) };
        i += 8;
    }
    // SAFETY: the last `n - i` elements of both ranges, `i <= n`.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
}

/// The column sum generated code calls: `dst[c] = Σ_{r<rows} src[r·stride + c]` for
/// `c < cols`, in f64, rows in order. A negative count or a stride that does not fit a
/// pointer offset does nothing.
///
/// # Safety
/// For every `r < rows`, the `cols` f32s at `src + r·stride` are initialised and nothing
/// writes them during the call; `dst` points to `cols` writable f64s that nothing else uses.
#[unsafe(export_name = "smelt_col_sum")]
pub unsafe extern "C" fn col_sum(
    src: *const f32,
    stride: i64,
    cols: i64,
    rows: i64,
    dst: *mut f64,
) {
    let (Ok(cols), Ok(rows), Ok(stride)) = (
        usize::try_from(cols),
        usize::try_from(rows),
        isize::try_from(stride),
    ) else {
        return;
    };
    if cols == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, cols) };
    run(Job::Cols {
        src,
        stride,
        rows,
        dst,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        let mut xs = [0.0f32, 1.0, -1.0, 100.0, -200.0, f32::NAN];
        apply(StripOp::Exp, &mut xs);
        assert_eq!(xs[0], 1.0);
        assert!((xs[1] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
        assert!((xs[2] - 1.0 / std::f32::consts::E).abs() <= f32::EPSILON);
        assert_eq!(xs[3], f32::INFINITY);
        assert_eq!(xs[4], 0.0);
        assert!(xs[5].is_nan());
        let mut t = [0.5f32, -0.5, 20.0, -0.0];
        apply(StripOp::Tanh, &mut t);
        assert!((t[0] - 0.5f32.tanh()).abs() <= f32::EPSILON);
        assert_eq!(t[1], -t[0]);
        assert_eq!(t[2], 1.0);
        assert!(t[3] == 0.0 && t[3].is_sign_negative());
        let mut s = [0.0f32, 2.0];
        apply(StripOp::Sigmoid, &mut s);
        assert_eq!(s[0], 0.5);
        assert!((s[1] - 0.880_797_1).abs() <= f32::EPSILON);
    }

    /// Every build of the loops (AVX-512, AVX2, portable) gives the same bits.
    #[test]
    fn every_isa_gives_the_same_bits() {
        let xs: Vec<f32> = (0u32..1 << 16)
            .map(|i| f32::from_bits(i.wrapping_mul(65_521).rotate_left(7)))
            .chain([
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                88.72284,
                -103.97208,
            ])
            .collect();
        for op in StripOp::ALL {
            let mut want = xs.clone();
            map_with(op, &mut want);
            let mut got = xs.clone();
            apply(op, &mut got);
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let mut v = xs.clone();
                // SAFETY: AVX2 and FMA are present.
                unsafe { run_avx2(Job::Map(op, &mut v)) };
                same(op, &v, &want);
            }
            same(op, &got, &want);
        }
        let finite: Vec<f32> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        for log in [false, true] {
            let row = &finite[..1000.min(finite.len())];
            let mut want = vec![0.0; row.len()];
            softmax_with(row, &mut want, log);
            let mut got = vec![0.0; row.len()];
            softmax(row, &mut got, log);
            same(StripOp::Exp, &got, &want);
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: AVX2 and FMA are present.
                unsafe { run_avx2(Job::Softmax(row, &mut got, log)) };
                same(StripOp::Exp, &got, &want);
            }
        }
        let row = &finite[..1000.min(finite.len())];
        let wb: Vec<f32> = row.iter().map(|x| x.abs().min(3.0)).collect();
        for (w, b) in [
            (Some(&wb[..]), Some(&wb[..])),
            (None, Some(&wb[..])),
            (Some(&wb[..]), None),
            (None, None),
        ] {
            let mut want = vec![0.0; row.len()];
            layer_norm_with(row, &mut want, w, b, 1e-5);
            let mut got = vec![0.0; row.len()];
            layer_norm(row, &mut got, w, b, 1e-5);
            same(StripOp::Exp, &got, &want);
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let job = Job::LayerNorm {
                    xs: row,
                    out: &mut got,
                    w,
                    b,
                    eps: 1e-5,
                };
                // SAFETY: AVX2 and FMA are present.
                unsafe { run_avx2(job) };
                same(StripOp::Exp, &got, &want);
            }
        }
        let want = sum_with(&finite);
        assert_eq!(sum(&finite).to_bits(), want.to_bits());
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let mut s = 0.0;
            // SAFETY: AVX2 and FMA are present.
            unsafe { run_avx2(Job::Sum(&finite, &mut s)) };
            assert_eq!(s.to_bits(), want.to_bits());
        }
    }

    /// Mapping from a source (disjoint, the same memory, or partly overlapping the
    /// destination) gives the bits of mapping a copy in place, on every build of the loops,
    /// for lengths around the lane counts.
    #[test]
    fn maps_from_a_source_as_in_place() {
        let xs: Vec<f32> = (0u32..4099)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 20) as f32 - 8.0)
            .collect();
        for op in StripOp::ALL {
            for n in [0, 1, 7, 8, 15, 16, 17, 129, 4099] {
                let src = &xs[..n];
                let mut want = src.to_vec();
                map_with(op, &mut want);
                let mut got = vec![0.0; n];
                apply_from(op, src, &mut got);
                same(op, &got, &want);
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    let job = Job::MapFrom {
                        op,
                        src: src.as_ptr(),
                        dst: got.as_mut_ptr(),
                        n,
                    };
                    // SAFETY: AVX2 and FMA are present; two distinct buffers of `n` f32s.
                    unsafe { run_avx2(job) };
                    same(op, &got, &want);
                }
                // the same memory, and a destination one element past its source
                let mut buf = src.to_vec();
                buf.push(0.0);
                let p = buf.as_mut_ptr();
                // SAFETY: `buf` holds n + 1 f32s; the helper allows any overlap.
                unsafe { strip_math(op as i32, p, p, n as i64) };
                same(op, &buf[..n], &want);
                let mut buf = src.to_vec();
                buf.push(0.0);
                let p = buf.as_mut_ptr();
                // SAFETY: as above, both ranges inside `buf`.
                unsafe { strip_math(op as i32, p, p.add(1), n as i64) };
                same(op, &buf[1..], &want);
            }
        }
    }

    fn same(op: StripOp, a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            assert!(
                x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan(),
                "{op:?}"
            );
        }
    }

    #[test]
    fn sums_in_f64() {
        // 2^24 + 1 + 1 + ...: an f32 accumulator would lose every 1
        let mut xs = vec![1.0f32; 1000];
        xs[0] = 16_777_216.0;
        assert_eq!(sum(&xs), 16_777_216.0 + 999.0);
        assert_eq!(sum(&xs[..7]), 16_777_216.0 + 6.0);
        assert!(sum(&[1.0, f32::NAN, 2.0]).is_nan());
        assert_eq!(sum(&[f32::INFINITY, 1.0]), f64::INFINITY);
        // SAFETY: no element is read.
        assert_eq!(unsafe { strip_sum(std::ptr::null(), -3) }, 0.0);
    }

    /// Maxima and minima against a sequential fold, around the 32-lane chunks, on every
    /// ISA: a NaN anywhere gives NaN, infinities count, an empty run gives `∓inf`.
    #[test]
    fn extremes_match_a_sequential_fold() {
        let fold = |xs: &[f32], max: bool| {
            let init = if max {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            };
            let pick = |a: f32, x: f32| if max { a.max(x) } else { a.min(x) };
            if xs.iter().any(|x| x.is_nan()) {
                f32::NAN
            } else {
                xs.iter().copied().fold(init, pick)
            }
        };
        let check = |xs: &[f32]| {
            for max in [true, false] {
                let want = fold(xs, max);
                let mut got = vec![extreme(xs, max)];
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    let mut r = 0.0;
                    // SAFETY: AVX2 and FMA are present.
                    unsafe { run_avx2(Job::Extreme(xs, &mut r, max)) };
                    got.push(r);
                }
                for g in got {
                    assert!(
                        g == want || (g.is_nan() && want.is_nan()),
                        "max={max} n={}: {g} vs {want}",
                        xs.len()
                    );
                }
            }
        };
        for n in [0usize, 1, 7, 31, 32, 33, 64, 95, 257] {
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
                .collect();
            check(&xs);
            for at in [0, n / 2, n.saturating_sub(1)]
                .into_iter()
                .filter(|&a| a < n)
            {
                for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30] {
                    let mut ys = xs.clone();
                    ys[at] = v;
                    check(&ys);
                }
            }
        }
        // SAFETY: no element is read.
        unsafe {
            assert_eq!(strip_max(std::ptr::null(), -1), f32::NEG_INFINITY);
            assert_eq!(strip_min(std::ptr::null(), 0), f32::INFINITY);
        }
    }

    /// Column sums add rows in order, whatever the ISA, stride or row count.
    #[test]
    fn column_sums_add_rows_in_order() {
        let (rows, cols, stride) = (7usize, 37usize, 41usize);
        let xs: Vec<f32> = (0..rows * stride)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761) >> 2))
            .map(|x| if x.is_finite() { x } else { 1.5 })
            .collect();
        let want: Vec<f64> = (0..cols)
            .map(|c| (0..rows).fold(0.0f64, |s, r| s + f64::from(xs[r * stride + c])))
            .collect();
        let mut got = vec![f64::NAN; cols];
        // SAFETY: every row lies in `xs`, `got` holds `cols` f64s.
        unsafe {
            col_sum(
                xs.as_ptr(),
                stride as i64,
                cols as i64,
                rows as i64,
                got.as_mut_ptr(),
            )
        };
        assert_eq!(bits(&got), bits(&want));
        // rows walked backwards
        let last = xs[(rows - 1) * stride..].as_ptr();
        // SAFETY: as above, from the last row down.
        unsafe {
            col_sum(
                last,
                -(stride as i64),
                cols as i64,
                rows as i64,
                got.as_mut_ptr(),
            )
        };
        let back: Vec<f64> = (0..cols)
            .map(|c| {
                (0..rows)
                    .rev()
                    .fold(0.0f64, |s, r| s + f64::from(xs[r * stride + c]))
            })
            .collect();
        assert_eq!(bits(&got), bits(&back));
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let mut v = vec![f64::NAN; cols];
            let job = Job::Cols {
                src: xs.as_ptr(),
                stride: stride as isize,
                rows,
                dst: &mut v,
            };
            // SAFETY: AVX2 and FMA are present; the rows lie in `xs`.
            unsafe { run_avx2(job) };
            assert_eq!(bits(&v), bits(&want));
        }
        // no rows: zeros; bad counts: nothing written
        // SAFETY: no element is read; `got` holds `cols` f64s.
        unsafe { col_sum(std::ptr::null(), 0, cols as i64, 0, got.as_mut_ptr()) };
        assert!(got.iter().all(|&s| s == 0.0));
        // SAFETY: nothing is read or written.
        unsafe { col_sum(std::ptr::null(), 1, -1, 3, std::ptr::null_mut()) };
    }

    fn bits(xs: &[f64]) -> Vec<u64> {
        xs.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn bad_calls_do_nothing() {
        let mut xs = [1.0f32; 4];
        // SAFETY: four valid f32s.
        unsafe {
            strip_math(99, xs.as_ptr(), xs.as_mut_ptr(), 4);
            strip_math(0, xs.as_ptr(), xs.as_mut_ptr(), -1);
        }
        assert_eq!(xs, [1.0; 4]);
        // overlapping source and destination: the same as mapping a copy of the source
        let mut buf = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut want = [0.0f32, 1.0, 2.0, 3.0];
        apply(StripOp::Exp, &mut want);
        // SAFETY: both ranges lie in `buf`.
        unsafe { strip_math(0, buf.as_ptr(), buf.as_mut_ptr().add(2), 4) };
        assert_eq!(&buf[2..], &want);
    }
    #[test]
    fn stream_copies_every_element() {
        let src: Vec<f32> = (0..600).map(|i| i as f32 * 1.5 - 7.0).collect();
        for off in 0..9 {
            for n in [0usize, 1, 7, 8, 9, 31, 100, 513] {
                let mut dst = vec![-1.0f32; n + 20];
                // SAFETY: `src` holds 600 elements and `dst` `off + n` or more; disjoint.
                unsafe { stream(src.as_ptr(), dst.as_mut_ptr().add(off), n as i64) };
                fence();
                assert_eq!(&dst[off..off + n], &src[..n], "offset {off}, {n} elements");
                assert!(dst[..off].iter().chain(&dst[off + n..]).all(|&v| v == -1.0));
            }
        }
        let mut dst = [3.0f32; 4];
        // SAFETY: a negative count touches nothing.
        unsafe { stream(src.as_ptr(), dst.as_mut_ptr(), -2) };
        assert_eq!(dst, [3.0; 4]);
    }
}
