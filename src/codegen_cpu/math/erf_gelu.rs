//! `erf` and the GELUs (erf and tanh forms) with their slopes.

use super::B;
use super::exp_log::{exp_parts, expm1_small, reduce_ln2};
use super::primitives::{
    bitcast, clamp, copysign, fadd_c, fc, fcmpc, fmul_c, ic, poly, scale_by, scale2n_factors,
    scale2n_from_one, sel, selc, to_bits, two_sum_err, ty,
};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F32X4, I8, I8X16};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};
use smelt_rt::consts::{
    ERF_SMALL, ERFC_Q, ERFC_Q_CENTER, ERFC_SLOPE, FRAC_1_SQRT_2PI, GELU_ERF_END, GELU_ERF_TAIL,
    GELU_TAIL_CENTER, GELU_TAIL_FIRST, GELU_TANH_END, GELU_TANH_TAIL,
};

use smelt_rt::vmath::GeluTail as Tail;

// ---------------------------------------------------------------------------------------------
// erf, erfc, gelu

/// `erf(x)` for `|x| ≤ 1`.
pub(super) fn erf_small(b: B, x: Value) -> Value {
    let u = b.ins().fmul(x, x);
    let p = poly(b, u, &ERF_SMALL);
    b.ins().fmul(x, p)
}

/// `erfc(z) = w·p·2^k` for `z ∈ [0.5, 10.5]`, given `z² = hi + lo` exactly (`e^{-hi} = p·2^k`).
pub(super) fn erfc_tail(b: B, z: Value, hi: Value, lo: Value) -> (Value, Value, Value) {
    let t = ty(b, z);
    let nhi = b.ins().fneg(hi);
    let (p, k) = exp_parts(b, nhi);
    // t = 2/(2+z) as t0 + c: the rounding of t would be amplified ~2.5× in erfc.
    let two = fc(b, t, 2.0);
    let d = b.ins().fadd(z, two);
    let dl = two_sum_err(b, z, two, d);
    let t0 = b.ins().fdiv(two, d);
    let nt0 = b.ins().fneg(t0);
    let rem = b.ins().fma(nt0, d, two);
    let rem = b.ins().fma(nt0, dl, rem);
    let c = b.ins().fdiv(rem, d);
    let ts = fadd_c(b, t0, -ERFC_Q_CENTER);
    let q = poly(b, ts, &ERFC_Q);
    // w = (t0 + c)·Q(t0 + c) ≈ t0·Q(t0) + c·S(t0), S = Q + t·Q' to a few digits: c is tiny
    let slope = poly(b, ts, &ERFC_SLOPE);
    let tq = b.ins().fmul(t0, q);
    let w = b.ins().fma(c, slope, tq);
    // e^{-lo} ≈ 1 - lo: lo is below half an ulp of hi.
    let nw = b.ins().fneg(w);
    let w = b.ins().fma(nw, lo, w);
    (w, p, k)
}

/// `z²` as an exact sum `hi + lo`.
pub(super) fn square_split(b: B, z: Value) -> (Value, Value) {
    let hi = b.ins().fmul(z, z);
    let nhi = b.ins().fneg(hi);
    let lo = b.ins().fma(z, z, nhi);
    (hi, lo)
}

/// The error function.
pub fn erf(b: B, x: Value) -> Value {
    let a = b.ins().fabs(x);
    let small = erf_small(b, x);
    // erf rounds to ±1 beyond 3.92.
    let z = clamp(b, a, 0.5, 4.0);
    let (hi, lo) = square_split(b, z);
    let (w, p, k) = erfc_tail(b, z, hi, lo);
    let wp = b.ins().fmul(w, p);
    let ec = scale2n_from_one(b, wp, k);
    let t = ty(b, x);
    let one = fc(b, t, 1.0);
    let big = b.ins().fsub(one, ec);
    let big = copysign(b, big, x);
    let is_small = fcmpc(b, FloatCC::LessThan, a, 1.0);
    sel(b, is_small, small, big)
}

/// GELU, exact form `x·Φ(x) = x/2·(1 + erf(x/√2))`. Like PyTorch, `gelu(-inf)` is NaN.
///
/// With `a = |x|` and `H(a) = erfc(a/√2)·e^{a²/2}/2`, `x·Φ(-a) = x·H(a)·e^{-a²/2}` is the
/// result below 0 and what is taken from `x` above (`gelu_tail`); `e^{-a²/2}` uses the
/// exact split `a² = hi + lo`. No erf, no division.
pub fn gelu(b: B, x: Value) -> Value {
    if ty(b, x) == F32 {
        return on_lane0(b, x, gelu);
    }
    gelu_erf_form(b, x, Tail::Gelu)
}

/// The slope of the exact GELU, `Φ(x) + x·φ(x)` (what its gradient multiplies by), from the
/// same tail: `Φ(-a) - a·φ(a) = (H(a) - a/√(2π))·e^{-a²/2}`, taken from 1 above 0. NaN at ±∞,
/// as PyTorch's `x·φ(x)` gives there.
pub fn gelu_slope(b: B, x: Value) -> Value {
    if ty(b, x) == F32 {
        return on_lane0(b, x, gelu_slope);
    }
    gelu_erf_form(b, x, Tail::ErfSlope)
}

/// The exact GELU's `e^{-a²/2}` argument as `nhi + nlo` (the exact split of `a²`), then
/// [`gelu_tail`].
pub(super) fn gelu_erf_form(b: B, x: Value, form: Tail) -> Value {
    let xc = clamp(b, x, -f64::from(GELU_ERF_END), f64::from(GELU_ERF_END));
    let a = b.ins().fabs(xc);
    let a2 = b.ins().fmul(a, a);
    let t = ty(b, x);
    let half = fc(b, t, 0.5);
    let hi = b.ins().fmul(a2, half);
    let nhi = b.ins().fneg(hi);
    // -lo = a2 - a·a exactly
    let na = b.ins().fneg(a);
    let nlo = b.ins().fma(na, a, a2);
    let nlo = b.ins().fmul(nlo, half);
    gelu_tail(b, (x, xc, a), nhi, nlo, false, form)
}

/// GELU, tanh form `x/2·(1 + tanh(u))`, `u = √(2/π)(x + 0.044715x³)`: `x·sigmoid(2u)`,
/// from `x·sigmoid(-v) = x·E(a)·e^{-v}` with `v = 2u(a)` in double-f32 arithmetic (its
/// rounding error would be amplified by `e^{-v}`) and `gelu_tail`. Like PyTorch,
/// `gelu_tanh(-inf)` is NaN.
pub fn gelu_tanh(b: B, x: Value) -> Value {
    if ty(b, x) == F32 {
        return on_lane0(b, x, gelu_tanh);
    }
    gelu_tanh_form(b, x, Tail::Gelu)
}

/// The slope of the tanh GELU, `σ + x·σ(1-σ)·v'(x)` with `σ = sigmoid(v)`, `v = 2u`: with
/// `S = sigmoid(-v(a))` from the tail, `S·(1 - a·v'(a)·(1 - S))`, taken from 1 above 0. NaN
/// at ±∞, as PyTorch's formula gives there.
pub fn gelu_tanh_slope(b: B, x: Value) -> Value {
    if ty(b, x) == F32 {
        return on_lane0(b, x, gelu_tanh_slope);
    }
    gelu_tanh_form(b, x, Tail::TanhSlope)
}

/// The tanh GELU's `v = 2u(a)` as `vh + vl` in double-f32 arithmetic, then [`gelu_tail`].
pub(super) fn gelu_tanh_form(b: B, x: Value, form: Tail) -> Value {
    let k = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
    let (c1h, c1l) = split_const(k);
    let (c2h, c2l) = split_const(k * 0.044715);
    let t = ty(b, x);
    let xc = clamp(b, x, -f64::from(GELU_TANH_END), f64::from(GELU_TANH_END));
    let a = b.ins().fabs(xc);
    let (a2h, a2l) = square_split(b, a);
    // A = c2·a²
    let c2hv = fc(b, t, c2h);
    let ah = b.ins().fmul(c2hv, a2h);
    let nah = b.ins().fneg(ah);
    let ae = b.ins().fma(c2hv, a2h, nah);
    let c2la = fmul_c(b, a2h, c2l);
    let al = b.ins().fma(c2hv, a2l, c2la);
    let al = b.ins().fadd(al, ae);
    // B = c1 + A
    let c1hv = fc(b, t, c1h);
    let bh = b.ins().fadd(c1hv, ah);
    let be = two_sum_err(b, c1hv, ah, bh);
    let bl = fadd_c(b, al, c1l);
    let bl = b.ins().fadd(bl, be);
    // v = a·B as vh + vl; -vl = vh - a·bh - a·bl (+0 at a = 0)
    let vh = b.ins().fmul(a, bh);
    let na = b.ins().fneg(a);
    let nvl = b.ins().fma(na, bh, vh);
    let nvl = b.ins().fma(na, bl, nvl);
    let nvh = b.ins().fneg(vh);
    gelu_tail(b, (x, xc, a), nvh, nvl, true, form)
}

/// A vector emitter applied to a scalar: lane 0 of its splat (the table lookups are vector
/// shuffles).
pub(super) fn on_lane0(b: B, x: Value, f: fn(B, Value) -> Value) -> Value {
    let v = b.ins().splat(F32X4, x);
    let y = f(b, v);
    b.ins().extractlane(y, 0)
}

/// The GELUs' last steps (and their slopes', see [`Tail`], shared with the native helpers): `m = xc·F(a)·e^{nh}·(1 + nl)`,
/// `F` one of the eight polynomials of [`GELU_TANH_TAIL`] (`tanh`) or [`GELU_ERF_TAIL`] picked per lane by the exponent and two leading
/// mantissa bits of `a + 4`, `e^{nh} = p·2^k` (`nh ≥ -100` needs no clamp) with `2^k`
/// applied last; subnormal results flushed, `-inf` gives NaN (either infinity for a slope).
pub(super) fn gelu_tail(
    b: B,
    (x, xc, a): (Value, Value, Value),
    nh: Value,
    nl: Value,
    tanh: bool,
    form: Tail,
) -> Value {
    let (r, k) = reduce_ln2(b, nh);
    let p = expm1_small(b, r);
    let p = fadd_c(b, p, 1.0);
    let a4 = fadd_c(b, a, 4.0);
    let bits = to_bits(b, a4);
    let top = b.ins().ushr_imm_u(bits, 21);
    let it = ty(b, top);
    let first = ic(b, it, i64::from(GELU_TAIL_FIRST));
    let i = b.ins().isub(top, first);
    let seven = ic(b, it, 7);
    let i = b.ins().smin(i, seven);
    let lanes = TableIndex::new(b, i);
    let ctr = lanes.lookup(b, &GELU_TAIL_CENTER);
    let u = b.ins().fsub(a, ctr);
    let table = if tanh {
        &GELU_TANH_TAIL
    } else {
        &GELU_ERF_TAIL
    };
    let (last, rest) = table.split_last().unwrap_or((&[0.0; 8], &[]));
    let mut f = lanes.lookup(b, last);
    for c in rest.iter().rev() {
        let c = lanes.lookup(b, c);
        f = b.ins().fma(f, u, c);
    }
    let t = ty(b, x);
    let lead = match form {
        Tail::Gelu => b.ins().fmul(xc, f),
        // F(a) - a/√(2π)
        Tail::ErfSlope => {
            let c = fc(b, t, -FRAC_1_SQRT_2PI);
            b.ins().fma(a, c, f)
        }
        Tail::TanhSlope => f,
    };
    // w·(1 + nl), as w + w·nl so that x = -0 keeps its sign
    let w = b.ins().fmul(lead, p);
    let w = b.ins().fma(w, nl, w);
    // 2^k as two factors, the first 0 where the result vanishes
    let far = fcmpc(
        b,
        FloatCC::LessThan,
        nh,
        f64::from(form.vanishes_below(tanh)),
    );
    let factors = scale2n_factors(b, k, t, Some(far));
    let w = if form == Tail::TanhSlope {
        // S·(1 - q·(1 - S)), q = a·v'(a), v' = K·(1 + 3·0.044715·a²), scaled by 2^k last:
        // S itself may be subnormal where the slope is not (near x = -10)
        let kk = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
        let s = scale_by(b, w, factors);
        let a2 = b.ins().fmul(a, a);
        let c3 = fc(b, t, kk * 3.0 * 0.044715);
        let kv = fc(b, t, kk);
        let dv = b.ins().fma(a2, c3, kv);
        let q = b.ins().fmul(a, dv);
        let one = fc(b, t, 1.0);
        let rest = b.ins().fsub(one, s);
        let qr = b.ins().fmul(q, rest);
        let nw = b.ins().fneg(w);
        b.ins().fma(nw, qr, w)
    } else {
        w
    };
    let m = scale_by(b, w, factors);
    let pos = fcmpc(b, FloatCC::GreaterThan, x, 0.0);
    let above = match form {
        Tail::Gelu => x,
        Tail::ErfSlope | Tail::TanhSlope => fc(b, t, 1.0),
    };
    let am = b.ins().fsub(above, m);
    let y = sel(b, pos, am, m);
    let y = flush_subnormal(b, y);
    match form {
        Tail::Gelu => neg_inf_to_nan(b, x, y),
        Tail::ErfSlope | Tail::TanhSlope => {
            let ax = b.ins().fabs(x);
            let inf = fcmpc(b, FloatCC::Equal, ax, f64::INFINITY);
            selc(b, inf, f64::NAN, y)
        }
    }
}

/// Byte indices that pick lane `i` (0..8) of an eight-entry f32 table, per lane of an `I32X4`.
pub(super) struct TableIndex {
    low: Value,
    high: Value,
}

impl TableIndex {
    fn new(b: B, i: Value) -> Self {
        // lane bytes 4i, 4i+1, 4i+2, 4i+3
        let it = ty(b, i);
        let spread = ic(b, it, 0x0404_0404);
        let bytes = b.ins().imul(i, spread);
        let offs = ic(b, it, 0x0302_0100);
        let bytes = b.ins().iadd(bytes, offs);
        let low = bitcast(b, I8X16, bytes);
        // entries 4..8 from the second half: `swizzle` gives 0 for indices from 16 up, so the
        // lanes of the other half vanish in each
        let sixteen = b.ins().iconst(I8, 16);
        let sixteen = b.ins().splat(I8X16, sixteen);
        let high = b.ins().isub(low, sixteen);
        TableIndex { low, high }
    }

    fn lookup(&self, b: B, t: &[f32; 8]) -> Value {
        let half = |b: B, part: &[f32]| {
            let bytes: Vec<u8> = part.iter().flat_map(|v| v.to_le_bytes()).collect();
            let c = b.func.dfg.constants.insert(ConstantData::from(bytes));
            b.ins().vconst(I8X16, c)
        };
        let lo = half(b, &t[..4]);
        let hi = half(b, &t[4..]);
        let lo = b.ins().swizzle(lo, self.low);
        let hi = b.ins().swizzle(hi, self.high);
        let r = b.ins().bor(lo, hi);
        bitcast(b, F32X4, r)
    }
}

/// PyTorch's GELU formulas give `-inf · 0 = NaN` at `x = -inf`.
/// `y`, or `±0` with the sign of `y` where `|y|` is below the smallest normal f32. PyTorch's
/// GELU formulas, `x/2·(1 + erf(..))` and `x/2·(1 + tanh(..))`, give exactly ±0 long before
/// the exact value turns subnormal. Returning the subnormal would be more exact but slows all
/// later arithmetic on it: an Intel CPU takes a microcode assist for every subnormal
/// operand, and a matmul over such activations measured much slower.
pub(super) fn flush_subnormal(b: B, y: Value) -> Value {
    let a = b.ins().fabs(y);
    let tiny = fcmpc(b, FloatCC::LessThan, a, f64::from(f32::MIN_POSITIVE));
    let z = fmul_c(b, y, 0.0);
    sel(b, tiny, z, y)
}

pub(super) fn neg_inf_to_nan(b: B, x: Value, y: Value) -> Value {
    let m = fcmpc(b, FloatCC::Equal, x, f64::NEG_INFINITY);
    selc(b, m, f64::NAN, y)
}

/// `(hi, lo)` f32 pair with `hi + lo ≈ c` to ~48 bits.
pub(super) fn split_const(c: f64) -> (f64, f64) {
    let hi = f64::from(c as f32);
    (hi, f64::from((c - hi) as f32))
}
