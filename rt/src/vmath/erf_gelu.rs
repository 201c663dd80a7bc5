//! The error function and the GELUs: `erf` as a scalar definition, the GELUs and their
//! slopes on [`Lanes`] (their tail looks up per-lane polynomials), mapped over buffers.

use super::StripOp;
use super::exp::{clamp, exp_parts, poly32, scale2n_from_one};
use super::rows::{PREFETCH_AHEAD, prefetch};
use crate::consts::{
    ERF_SMALL, ERFC_Q, ERFC_Q_CENTER, ERFC_SLOPE, EXP_G, FRAC_1_SQRT_2PI, GELU_ERF_END,
    GELU_ERF_TAIL, GELU_TAIL_CENTER, GELU_TAIL_FIRST, GELU_TANH_END, GELU_TANH_TAIL, LN2_HI,
    LN2_LO, LOG2E, SHIFT32,
};
use crate::lanes::Lanes;

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
pub(super) fn erf(x: f32) -> f32 {
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
pub(super) unsafe fn gelu_map<V: Lanes>(src: *const f32, dst: *mut f32, n: usize, op: StripOp) {
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
pub(super) unsafe fn gelu_in_place<V: Lanes>(xs: &mut [f32], op: StripOp) {
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
pub(super) fn gelu_family(op: StripOp) -> bool {
    matches!(
        op,
        StripOp::GeluErf | StripOp::GeluTanh | StripOp::GeluErfSlope | StripOp::GeluTanhSlope
    )
}
