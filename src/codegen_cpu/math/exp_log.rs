//! `exp`, `expm1`, `log`, `log1p`, and `tanh` and `sigmoid` built on them.

use super::B;
use super::primitives::{
    bitcast, clamp, copysign, fadd_c, fc, fcmpc, fma_c, fmul_c, ic, poly, pow2i, round_int_shifted,
    scale_by, scale2n, scale2n_factors, scale2n_from_one, sel, selc, small_uint_to_float, to_bits,
    two_sum_err, ty,
};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::F32;
use cranelift_codegen::ir::{InstBuilder, Value};
use smelt_rt::consts::{EXP_G, LN2_HI, LN2_LO, LOG2E, SHIFT32, SIGMOID_GONE};

// ---------------------------------------------------------------------------------------------
// exp, expm1

/// `x = k·ln2 + r`, `|r| ≤ ln2/2` (Cody-Waite: the product with the high part is exact in fma).
pub(super) fn reduce_ln2(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let shift = fc(b, t, SHIFT32);
    let l2e = fc(b, t, LOG2E);
    let s = b.ins().fma(x, l2e, shift);
    let (kf, k) = round_int_shifted(b, s);
    let r = fma_c(b, kf, -LN2_HI, x);
    let r = fma_c(b, kf, -LN2_LO, r);
    (r, k)
}

/// `expm1(r) = r + r²·G(r)` for `|r| ≤ ln2/2`, relative error ~1e-8.
pub(super) fn expm1_small(b: B, r: Value) -> Value {
    let g = poly(b, r, &EXP_G);
    let r2 = b.ins().fmul(r, r);
    b.ins().fma(r2, g, r)
}

/// `e^x = p·2^k` with `p ∈ [√½, √2]` and integer lanes `k` (for `scale2n`). Callers that
/// multiply the result by other factors apply `2^k` last, so no subnormal intermediate loses bits.
pub(super) fn exp_parts(b: B, x: Value) -> (Value, Value) {
    // Clamped inputs still overflow/underflow, and keep 2^k inside scale2n's range.
    // -110 (not just -104) so that p·2^k times a factor up to ~20 still underflows to 0.
    let xc = clamp(b, x, -110.0, 89.0);
    let (r, k) = reduce_ln2(b, xc);
    let p = expm1_small(b, r);
    (fadd_c(b, p, 1.0), k)
}

/// `e^x`. Overflows to +inf above ~88.72, underflows through subnormals to +0.
pub fn exp(b: B, x: Value) -> Value {
    let (p, k) = exp_parts(b, x);
    // below -105 the result rounds to 0; computing p·2^k there would underflow, which
    // costs a microcode assist per lane on x86 (softmax rows with -inf masks)
    let gone = fcmpc(b, FloatCC::LessThan, x, -105.0);
    let p = selc(b, gone, 0.0, p);
    scale2n(b, p, k)
}

/// `e^x - 1`, accurate near 0 (keeps the sign of zero).
pub fn expm1(b: B, x: Value) -> Value {
    let t = ty(b, x);
    let xc = clamp(b, x, -30.0, 89.0);
    let (r, k) = reduce_ln2(b, xc);
    let p = expm1_small(b, r);
    // e^x - 1 = 2·(s·p + (s - 1/2)) with s = 2^(k-1): no overflow at k = 128, exact steps.
    let it = ty(b, k);
    let one = ic(b, it, 1);
    let km1 = b.ins().isub(k, one);
    let s = pow2i(b, km1, t);
    let sm = fadd_c(b, s, -0.5);
    let y = b.ins().fma(s, p, sm);
    let y = b.ins().fadd(y, y);
    let zero = ic(b, it, 0);
    let k0 = b.ins().icmp(IntCC::Equal, k, zero);
    let y = sel(b, k0, p, y);
    let is0 = fcmpc(b, FloatCC::Equal, x, 0.0);
    sel(b, is0, x, y)
}

// ---------------------------------------------------------------------------------------------
// log, log1p

pub(super) const SQRT2: f64 = std::f64::consts::SQRT_2;

/// `log1p(f)` for `f ∈ [√½-1, √2-1]`: with `s = f/(2+f)`, `log1p(f) = 2·atanh(s)`, written as
/// `f - (f²/2 - s·(f²/2 + R(s²)))` so that the leading term `f` is exact.
pub(super) fn log1p_reduced(b: B, f: Value, atanh_coeffs: &[f64]) -> Value {
    let two_f = fadd_c(b, f, 2.0);
    let s = b.ins().fdiv(f, two_f);
    let z = b.ins().fmul(s, s);
    let pz = poly(b, z, atanh_coeffs);
    let r = b.ins().fmul(z, pz);
    let ff = b.ins().fmul(f, f);
    let hfsq = fmul_c(b, ff, 0.5);
    let hr = b.ins().fadd(hfsq, r);
    let shr = b.ins().fmul(s, hr);
    let d = b.ins().fsub(hfsq, shr);
    b.ins().fsub(f, d)
}

/// `2/3, 2/5, 2/7, ...`: the series of `2·atanh(s)/s - 2` in `z = s²`, divided by `z`.
pub(super) fn atanh_series(n: usize) -> Vec<f64> {
    (1..=n).map(|i| 2.0 / (2 * i + 1) as f64).collect()
}

/// Splits positive normal `x` into `(e, f)` with `x = 2^e·(1+f)`, `1+f ∈ [√½, √2)`, `e` as float.
pub(super) fn split_exponent(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let (mant_bits, mant_mask, one_bits, bias) = if t.lane_type() == F32 {
        (23, 0x7f_ffff_i64, i64::from(1f32.to_bits()), 127.0)
    } else {
        (52, (1i64 << 52) - 1, 1f64.to_bits() as i64, 1023.0)
    };
    let bits = to_bits(b, x);
    let it = ty(b, bits);
    let ex = b.ins().ushr_imm_u(bits, mant_bits);
    let mask = ic(b, it, mant_mask);
    let mb = b.ins().band(bits, mask);
    let one = ic(b, it, one_bits);
    let mb = b.ins().bor(mb, one);
    let m = bitcast(b, t, mb);
    let big = fcmpc(b, FloatCC::GreaterThan, m, SQRT2);
    let half_m = fmul_c(b, m, 0.5);
    let m = sel(b, big, half_m, m);
    let e = small_uint_to_float(b, ex, t);
    let e = fadd_c(b, e, -bias);
    let one_f = fc(b, t, 1.0);
    let zero_f = fc(b, t, 0.0);
    let inc = sel(b, big, one_f, zero_f);
    let e = b.ins().fadd(e, inc);
    let f = fadd_c(b, m, -1.0);
    (e, f)
}

/// `log(x) + c` for f32 `x`, without special-case fixups (`c` is a small correction or 0).
pub(super) fn log_core(b: B, x: Value, c: Option<Value>) -> Value {
    let t = ty(b, x);
    // Subnormals: scale into the normal range first.
    let sub = fcmpc(b, FloatCC::LessThan, x, f64::from(f32::MIN_POSITIVE));
    let xs = fmul_c(b, x, 8388608.0);
    let x = sel(b, sub, xs, x);
    let (e, f) = split_exponent(b, x);
    let m23 = fc(b, t, -23.0);
    let zero = fc(b, t, 0.0);
    let eadj = sel(b, sub, m23, zero);
    let e = b.ins().fadd(e, eadj);
    let mut l = log1p_reduced(b, f, &atanh_series(4));
    if let Some(c) = c {
        l = b.ins().fadd(l, c);
    }
    let l = fma_c(b, e, LN2_LO, l);
    fma_c(b, e, LN2_HI, l)
}

/// log special cases on the argument `u`: NaN or negative → NaN, 0 → -inf, +inf → +inf.
pub(super) fn log_fixups(b: B, u: Value, y: Value) -> Value {
    let inf = fcmpc(b, FloatCC::Equal, u, f64::INFINITY);
    let y = selc(b, inf, f64::INFINITY, y);
    let zero = fcmpc(b, FloatCC::Equal, u, 0.0);
    let y = selc(b, zero, f64::NEG_INFINITY, y);
    // NaN unless `u >= 0` (which NaN fails): AArch64 has no vector compare for
    // "unordered or less than", so the ordered one picks `y` instead
    let ok = fcmpc(b, FloatCC::GreaterThanOrEqual, u, 0.0);
    let nan = fc(b, ty(b, y), f64::NAN);
    sel(b, ok, y, nan)
}

/// Natural logarithm.
pub fn log(b: B, x: Value) -> Value {
    let y = log_core(b, x, None);
    log_fixups(b, x, y)
}

/// `log(1 + x)`, accurate near 0 (keeps the sign of zero).
pub fn log1p(b: B, x: Value) -> Value {
    let t = ty(b, x);
    let one = fc(b, t, 1.0);
    let u = b.ins().fadd(one, x);
    // log(1+x) = log(u) + log(1 + err/u) ≈ log(u) + err/u, err the rounding error of 1+x.
    let err = two_sum_err(b, one, x, u);
    let c = b.ins().fdiv(err, u);
    let y = log_core(b, u, Some(c));
    let y = log_fixups(b, u, y);
    let is0 = fcmpc(b, FloatCC::Equal, x, 0.0);
    sel(b, is0, x, y)
}

// ---------------------------------------------------------------------------------------------
// tanh, sigmoid

/// Hyperbolic tangent: `sign(x)·t/(t+2)` with `t = expm1(2|x|)`.
pub fn tanh(b: B, x: Value) -> Value {
    let a = b.ins().fabs(x);
    // tanh(10) rounds to 1; clamping keeps t finite.
    let a = clamp(b, a, 0.0, 10.0);
    let a2 = b.ins().fadd(a, a);
    let t = expm1(b, a2);
    let d = fadd_c(b, t, 2.0);
    let y = b.ins().fdiv(t, d);
    copysign(b, y, x)
}

/// Logistic sigmoid `1/(1+e^{-x})`; no overflow or cancellation for large `|x|`: below 0 it
/// is `e/(1+e)` with `e = e^{x} = p·2^k`, and `2^k` is applied last (the result may be
/// subnormal).
pub fn sigmoid(b: B, x: Value) -> Value {
    let t = ty(b, x);
    let a = b.ins().fabs(x);
    let na = b.ins().fneg(a);
    let (p, k) = exp_parts(b, na);
    let pos = fcmpc(b, FloatCC::GreaterThanOrEqual, x, 0.0);
    // both branches run in every lane: neither may compute a subnormal product where its
    // result does not need one (a microcode assist per lane on x86, 6x the time)
    let e = scale2n_from_one(b, p, k);
    let one = fc(b, t, 1.0);
    let den = b.ins().fadd(one, e);
    let y_pos = b.ins().fdiv(one, den);
    let q = b.ins().fdiv(p, den);
    let it = ty(b, k);
    let gone = ic(b, it, i64::from(SIGMOID_GONE));
    let gone = b.ins().icmp(IntCC::SignedLessThan, k, gone);
    let f = scale2n_factors(b, k, t, Some(gone));
    let y_neg = scale_by(b, q, f);
    sel(b, pos, y_pos, y_neg)
}
