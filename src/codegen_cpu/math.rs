//! Vectorised f32 math for the CPU backend: emitters that build Cranelift IR.
//!
//! Every emitter takes a [`FunctionBuilder`] and an `f32` value, scalar (`F32`) or vector
//! (`F32X4`), and returns the result value of the same type. Constants are splatted for
//! vectors; special cases are fixed up with `fcmp` + `select` (scalars) or `bitselect`
//! (vectors), so the code is branch-free except for the rare huge-argument path of sin/cos.
//!
//! | op | method | max ulp |
//! |----|--------|---------|
//! | `exp` | Cody-Waite by ln2, degree-7 polynomial, 2^k in two exponent steps; 0 below -105 without the underflowing product (an x86 microcode assist per lane, which made masked softmax rows full of -inf several times slower) | 0.94 |
//! | `expm1` | as `exp`, then `2·(s·p + (s - ½))` with `s = 2^(k-1)`: no cancellation | 1.32 |
//! | `log` | `x = m·2^e`, `m ∈ [√½, √2)`, `log1p(m-1)` by the atanh series in `s = f/(2+f)` | 0.81 |
//! | `log1p` | `log(1+x)` plus the exact rounding error of `1+x` divided by `1+x` | 1.44 |
//! | `tanh` | `expm1(2a) / (expm1(2a) + 2)`, `a = abs(x)`, with the sign of `x` | 2.26 |
//! | `sigmoid` | `e = exp(-abs(x))`; `1/(1+e)` or `e/(1+e)` (no overflow for `x < 0`) | 2.05 |
//! | `erf` | `x·P(x²)` for `abs(x) < 1`, else `1 - erfc(abs(x))` | 2.27 |
//! | `gelu` | `x·Φ(x)` from `x·Φ(-a) = x·H(a)·e^{-x²/2}`, `a = abs(x)`, `H` one of eight polynomials looked up per lane; subnormal results flushed to ±0 | 2.86 (3.48 on dense grids of [-14, 6]) |
//! | `gelu_tanh` | `x·sigmoid(2u)` from `x·sigmoid(-v) = x·E(a)·e^{-v}`, `v = 2u(a)` in double-f32 arithmetic, `E` one of eight polynomials looked up per lane; subnormal results flushed to ±0 | 3.03 (3.37 on dense grids of [-11, 6]) |
//! | `gelu_slope` | `Φ(x) + x·φ(x)` from the same tail: `(H(a) - a/√(2π))·e^{-x²/2}`, taken from 1 above 0; NaN at ±∞ | 2.97 ulp of the terms' sum (`Φ` and `xφ` cancel near -0.75) |
//! | `gelu_tanh_slope` | `S·(1 - a·v'(a)·(1 - S))`, `S = sigmoid(-v)` from the tanh GELU's tail, `2^k` applied last, taken from 1 above 0; NaN at ±∞ | 4.58 ulp of the terms' sum |
//! | `sin`, `cos` | f64 inside: Cody-Waite by π/2 (3 parts) up to 2^30, beyond an exact chunked product with 2/π (Payne-Hanek style); Taylor polynomials | 0.50 |
//! | `pow` | f64 inside: `2^(y·log2(abs(x)))`, then the C99/PyTorch special cases | 0.50 |
//! | `rsqrt` | `1 / sqrt(x)` (bit-identical to PyTorch's vectorised CPU kernel) | 1.48 |
//! | `sqrt` | native instruction (correctly rounded) | 0.50 |
//!
//! Errors are against the exact value (0.5 = correctly rounded), over every 1024th f32 bit
//! pattern (whole range, both signs, subnormals) plus special values, through both the F32X4 and
//! the scalar code: `cargo test --test cpu_math -- --nocapture` prints them.
//!
//! erf's tail (above 1) is `erfc(z) = e^{-z²}·t·Q(t)` with `t = 2/(2+z)` (kept as a double-f32 value),
//! `Q` a degree-9 polynomial in `t - 0.48` fitted at Chebyshev nodes on `z ∈ [0.5, 10.5]`;
//! `e^{-z²}` uses the exact split `z² = hi + lo`. Results that may be subnormal apply their
//! `2^k` scale last. No emitter calls libm: the chunked reduction keeps sin/cos accurate for
//! huge arguments without it.
//!
//! f64 math is not provided here: the backend computes f64 transcendentals by calling libm.
//!
//! In f32 vector loops, exp, tanh, sigmoid, silu, erf, both GELUs and their slopes usually run in strips instead
//! (`super::strip`): [`super::vmath`] ports these emitters to native 256/512-bit loops with
//! the same bits.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, I8, I8X16, I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use smelt_rt::consts::{
    ERF_SMALL, ERFC_Q, ERFC_Q_CENTER, ERFC_SLOPE, EXP_G, FRAC_1_SQRT_2PI, GELU_ERF_END,
    GELU_ERF_TAIL, GELU_TAIL_CENTER, GELU_TAIL_FIRST, GELU_TANH_END, GELU_TANH_TAIL, LN2_HI,
    LN2_LO, LOG2E, SHIFT32, SHIFT64, SIGMOID_GONE,
};

use smelt_rt::vmath::GeluTail as Tail;

type B<'a, 'b> = &'a mut FunctionBuilder<'b>;

// ---------------------------------------------------------------------------------------------
// Small helpers: constants, bit casts, selects, polynomials.

fn ty(b: &FunctionBuilder, v: Value) -> Type {
    b.func.dfg.value_type(v)
}

/// The integer type with the lane layout of the float type `t`.
fn int_of(t: Type) -> Type {
    match t {
        F32 => I32,
        F32X4 => I32X4,
        F64 => I64,
        _ => I64X2,
    }
}

/// A float constant of type `t` (splatted for vectors).
fn fc(b: B, t: Type, v: f64) -> Value {
    let s = if t.lane_type() == F32 {
        b.ins().f32const(v as f32)
    } else {
        b.ins().f64const(v)
    };
    if t.is_vector() {
        b.ins().splat(t, s)
    } else {
        s
    }
}

/// An integer constant of type `t` (splatted for vectors).
fn ic(b: B, t: Type, v: i64) -> Value {
    let lane = t.lane_type();
    let v = if lane == I32 {
        i64::from(v as i32 as u32)
    } else {
        v
    };
    let s = b.ins().iconst(lane, v);
    if t.is_vector() {
        b.ins().splat(t, s)
    } else {
        s
    }
}

fn bitcast(b: B, t: Type, v: Value) -> Value {
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    b.ins().bitcast(t, flags, v)
}

fn to_bits(b: B, v: Value) -> Value {
    let t = int_of(ty(b, v));
    bitcast(b, t, v)
}

/// `m ? a : c` lane-wise; `m` comes from `fcmp`/`icmp` (or a combination with band/bor).
fn sel(b: B, m: Value, a: Value, c: Value) -> Value {
    let t = ty(b, a);
    if t.is_vector() {
        let m = if ty(b, m) == t { m } else { bitcast(b, t, m) };
        b.ins().bitselect(m, a, c)
    } else {
        b.ins().select(m, a, c)
    }
}

/// `|mag|` with the sign bit of `sgn` (Cranelift has no vector `fcopysign` on x86-64).
fn copysign(b: B, mag: Value, sgn: Value) -> Value {
    let t = ty(b, mag);
    let m = to_bits(b, mag);
    let s = to_bits(b, sgn);
    let it = ty(b, m);
    let sign = if t.lane_type() == F32 {
        i64::from(i32::MIN)
    } else {
        i64::MIN
    };
    let sign = ic(b, it, sign);
    let m = b.ins().band_not(m, sign);
    let s = b.ins().band(s, sign);
    let r = b.ins().bor(m, s);
    bitcast(b, t, r)
}

fn fcmp(b: B, cc: FloatCC, x: Value, y: Value) -> Value {
    b.ins().fcmp(cc, x, y)
}

/// Compare `x` with a constant.
fn fcmpc(b: B, cc: FloatCC, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fcmp(cc, x, c)
}

/// `m ? c : x` with a constant `c`.
fn selc(b: B, m: Value, c: f64, x: Value) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    sel(b, m, c, x)
}

/// Clamp into `[lo, hi]` by compare + select; NaN passes through unchanged.
fn clamp(b: B, x: Value, lo: f64, hi: f64) -> Value {
    let m = fcmpc(b, FloatCC::GreaterThan, x, hi);
    let x = selc(b, m, hi, x);
    let m = fcmpc(b, FloatCC::LessThan, x, lo);
    selc(b, m, lo, x)
}

fn fmul_c(b: B, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fmul(x, c)
}

fn fadd_c(b: B, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fadd(x, c)
}

/// `x*c + y` with a constant `c`, fused.
fn fma_c(b: B, x: Value, c: f64, y: Value) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fma(x, c, y)
}

/// `c[0] + c[1] x + ... + c[n] x^n` by Horner's rule with fused multiply-adds.
fn poly(b: B, x: Value, c: &[f64]) -> Value {
    let t = ty(b, x);
    let (last, rest) = c.split_last().unwrap_or((&0.0, &[]));
    let mut acc = fc(b, t, *last);
    for &ci in rest.iter().rev() {
        let k = fc(b, t, ci);
        acc = b.ins().fma(acc, x, k);
    }
    acc
}

/// The exact rounding error of `s = fl(a + b)` (Knuth's TwoSum): `a + b = s + err`.
fn two_sum_err(b: B, x: Value, y: Value, s: Value) -> Value {
    let yv = b.ins().fsub(s, x);
    let xv = b.ins().fsub(s, yv);
    let dy = b.ins().fsub(y, yv);
    let dx = b.ins().fsub(x, xv);
    b.ins().fadd(dx, dy)
}

/// `(nearest(x), nearest(x) as integer)` for `|x| < 2^22` (f32) or `2^51` (f64): the integer is
/// read from the low mantissa bits of `x + 1.5·2^p`, which avoids slow vector conversions.
fn round_int(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let shift = if t.lane_type() == F32 {
        SHIFT32
    } else {
        SHIFT64
    };
    let s = fadd_c(b, x, shift);
    round_int_shifted(b, s)
}

/// As [`round_int`] for an already shifted value `s = x + 1.5·2^p` (e.g. from an fma).
fn round_int_shifted(b: B, s: Value) -> (Value, Value) {
    let t = ty(b, s);
    let (shift, shift_bits) = if t.lane_type() == F32 {
        (SHIFT32, i64::from((SHIFT32 as f32).to_bits()))
    } else {
        (SHIFT64, SHIFT64.to_bits() as i64)
    };
    let kf = fadd_c(b, s, -shift);
    let bits = to_bits(b, s);
    let it = ty(b, bits);
    let sb = ic(b, it, shift_bits);
    (kf, b.ins().isub(bits, sb))
}

/// `2^n` for integer lanes `n` in the normal exponent range (f32: [-126, 127]).
fn pow2i(b: B, n: Value, ft: Type) -> Value {
    let it = ty(b, n);
    let (bias, mant) = if ft.lane_type() == F32 {
        (127, 23)
    } else {
        (1023, 52)
    };
    let biased = {
        let c = ic(b, it, bias);
        b.ins().iadd(n, c)
    };
    let bits = b.ins().ishl_imm_u(biased, mant);
    bitcast(b, ft, bits)
}

/// `y · 2^n` for f32 lanes and `n ∈ [-252, 254]`, rounded once: the scale is applied in two
/// steps so that neither factor overflows and results in the subnormal range round correctly.
fn scale2n(b: B, y: Value, n: Value) -> Value {
    let t = ty(b, y);
    let f = scale2n_factors(b, n, t, None);
    scale_by(b, y, f)
}

/// The two factors of `2^n` that [`scale2n`] multiplies by, the first 0 in the lanes of
/// `gone`: where the caller knows the result rounds to 0, it is ±0 (the sign of `y`) without
/// a subnormal product, which costs a microcode assist per lane on x86.
fn scale2n_factors(b: B, n: Value, t: Type, gone: Option<Value>) -> (Value, Value) {
    let n1 = b.ins().sshr_imm_u(n, 1);
    let n2 = b.ins().isub(n, n1);
    let s1 = pow2i(b, n1, t);
    let s1 = match gone {
        Some(m) => {
            let zero = fc(b, t, 0.0);
            sel(b, m, zero, s1)
        }
        None => s1,
    };
    (s1, pow2i(b, n2, t))
}

/// `y · s1 · s2`, the factors of [`scale2n_factors`].
fn scale_by(b: B, y: Value, (s1, s2): (Value, Value)) -> Value {
    let y = b.ins().fmul(y, s1);
    b.ins().fmul(y, s2)
}

/// `y · 2^n` for `|y| < 2` and `n ≤ 0`, where the caller adds it to 1 or takes it from 1: one
/// multiply by `2^max(n, -64)`. Where `n ≥ -64` this is [`scale2n`]'s value; below, both are
/// under 2^-63 and vanish next to 1 alike, and no lane computes a subnormal product.
fn scale2n_from_one(b: B, y: Value, n: Value) -> Value {
    let t = ty(b, y);
    let it = ty(b, n);
    let lo = ic(b, it, -64);
    let n = b.ins().smax(n, lo);
    let s = pow2i(b, n, t);
    b.ins().fmul(y, s)
}

/// Lane-wise float of small non-negative integer lanes (< 2^23 for f32) by the exponent trick.
fn small_uint_to_float(b: B, n: Value, ft: Type) -> Value {
    let it = ty(b, n);
    let (magic, magic_bits) = if ft.lane_type() == F32 {
        (8388608.0, i64::from(8388608f32.to_bits()))
    } else {
        (4503599627370496.0, 4503599627370496f64.to_bits() as i64)
    };
    let mb = ic(b, it, magic_bits);
    let bits = b.ins().bor(n, mb);
    let f = bitcast(b, ft, bits);
    fadd_c(b, f, -magic)
}

// ---------------------------------------------------------------------------------------------
// exp, expm1

/// `x = k·ln2 + r`, `|r| ≤ ln2/2` (Cody-Waite: the product with the high part is exact in fma).
fn reduce_ln2(b: B, x: Value) -> (Value, Value) {
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
fn expm1_small(b: B, r: Value) -> Value {
    let g = poly(b, r, &EXP_G);
    let r2 = b.ins().fmul(r, r);
    b.ins().fma(r2, g, r)
}

/// `e^x = p·2^k` with `p ∈ [√½, √2]` and integer lanes `k` (for `scale2n`). Callers that
/// multiply the result by other factors apply `2^k` last, so no subnormal intermediate loses bits.
fn exp_parts(b: B, x: Value) -> (Value, Value) {
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

const SQRT2: f64 = std::f64::consts::SQRT_2;

/// `log1p(f)` for `f ∈ [√½-1, √2-1]`: with `s = f/(2+f)`, `log1p(f) = 2·atanh(s)`, written as
/// `f - (f²/2 - s·(f²/2 + R(s²)))` so that the leading term `f` is exact.
fn log1p_reduced(b: B, f: Value, atanh_coeffs: &[f64]) -> Value {
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
fn atanh_series(n: usize) -> Vec<f64> {
    (1..=n).map(|i| 2.0 / (2 * i + 1) as f64).collect()
}

/// Splits positive normal `x` into `(e, f)` with `x = 2^e·(1+f)`, `1+f ∈ [√½, √2)`, `e` as float.
fn split_exponent(b: B, x: Value) -> (Value, Value) {
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
fn log_core(b: B, x: Value, c: Option<Value>) -> Value {
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
fn log_fixups(b: B, u: Value, y: Value) -> Value {
    let inf = fcmpc(b, FloatCC::Equal, u, f64::INFINITY);
    let y = selc(b, inf, f64::INFINITY, y);
    let zero = fcmpc(b, FloatCC::Equal, u, 0.0);
    let y = selc(b, zero, f64::NEG_INFINITY, y);
    let bad = fcmpc(b, FloatCC::UnorderedOrLessThan, u, 0.0);
    selc(b, bad, f64::NAN, y)
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

// ---------------------------------------------------------------------------------------------
// erf, erfc, gelu

/// `erf(x)` for `|x| ≤ 1`.
fn erf_small(b: B, x: Value) -> Value {
    let u = b.ins().fmul(x, x);
    let p = poly(b, u, &ERF_SMALL);
    b.ins().fmul(x, p)
}

/// `erfc(z) = w·p·2^k` for `z ∈ [0.5, 10.5]`, given `z² = hi + lo` exactly (`e^{-hi} = p·2^k`).
fn erfc_tail(b: B, z: Value, hi: Value, lo: Value) -> (Value, Value, Value) {
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
fn square_split(b: B, z: Value) -> (Value, Value) {
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
/// result below 0 and what is taken from `x` above ([`gelu_tail`]); `e^{-a²/2}` uses the
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
fn gelu_erf_form(b: B, x: Value, form: Tail) -> Value {
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
/// rounding error would be amplified by `e^{-v}`) and [`gelu_tail`]. Like PyTorch,
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
fn gelu_tanh_form(b: B, x: Value, form: Tail) -> Value {
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
fn on_lane0(b: B, x: Value, f: fn(B, Value) -> Value) -> Value {
    let v = b.ins().splat(F32X4, x);
    let y = f(b, v);
    b.ins().extractlane(y, 0)
}

/// The GELUs' last steps (and their slopes', see [`Tail`], shared with the native helpers): `m = xc·F(a)·e^{nh}·(1 + nl)`,
/// `F` one of the eight polynomials of [`GELU_TANH_TAIL`] (`tanh`) or [`GELU_ERF_TAIL`] picked per lane by the exponent and two leading
/// mantissa bits of `a + 4`, `e^{nh} = p·2^k` (`nh ≥ -100` needs no clamp) with `2^k`
/// applied last; subnormal results flushed, `-inf` gives NaN (either infinity for a slope).
fn gelu_tail(
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
struct TableIndex {
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
fn flush_subnormal(b: B, y: Value) -> Value {
    let a = b.ins().fabs(y);
    let tiny = fcmpc(b, FloatCC::LessThan, a, f64::from(f32::MIN_POSITIVE));
    let z = fmul_c(b, y, 0.0);
    sel(b, tiny, z, y)
}

fn neg_inf_to_nan(b: B, x: Value, y: Value) -> Value {
    let m = fcmpc(b, FloatCC::Equal, x, f64::NEG_INFINITY);
    selc(b, m, f64::NAN, y)
}

/// `(hi, lo)` f32 pair with `hi + lo ≈ c` to ~48 bits.
fn split_const(c: f64) -> (f64, f64) {
    let hi = f64::from(c as f32);
    (hi, f64::from((c - hi) as f32))
}

// ---------------------------------------------------------------------------------------------
// f64 helpers for sin/cos/pow: widen f32 lanes, compute, narrow once.

fn shuffle_bytes(b: B, x: Value, y: Value, mask: [u8; 16]) -> Value {
    let t = ty(b, x);
    let xb = bitcast(b, I8X16, x);
    let yb = bitcast(b, I8X16, y);
    let imm = b
        .func
        .dfg
        .immediates
        .push(ConstantData::from(mask.to_vec()));
    let r = b.ins().shuffle(xb, yb, imm);
    bitcast(b, t, r)
}

const HIGH_HALF: [u8; 16] = [8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15];
const LOW_HALVES: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23];

/// Applies `f` to the f64 widening of f32 lanes `xs` (scalars or F32X4 as two F64X2 halves),
/// and rounds its f64 result once back to f32.
fn via_f64(b: B, xs: &[Value], f: &mut dyn FnMut(B, &[Value]) -> Value) -> Value {
    let t = ty(b, xs[0]);
    if !t.is_vector() {
        let wide: Vec<Value> = xs.iter().map(|&x| b.ins().fpromote(F64, x)).collect();
        let r = f(b, &wide);
        return b.ins().fdemote(F32, r);
    }
    let lo: Vec<Value> = xs.iter().map(|&x| b.ins().fvpromote_low(x)).collect();
    let hi: Vec<Value> = xs
        .iter()
        .map(|&x| {
            let h = shuffle_bytes(b, x, x, HIGH_HALF);
            b.ins().fvpromote_low(h)
        })
        .collect();
    let rl = f(b, &lo);
    let rh = f(b, &hi);
    let dl = b.ins().fvdemote(rl);
    let dh = b.ins().fvdemote(rh);
    shuffle_bytes(b, dl, dh, LOW_HALVES)
}

// ---------------------------------------------------------------------------------------------
// sin, cos

/// π/2 in three f64 parts (Cody-Waite); with fma each product with `k` is exact.
const PIO2: [f64; 3] = [
    std::f64::consts::FRAC_PI_2,
    6.123_233_995_736_766e-17,
    -1.497_384_904_859_169_8e-33,
];
const FRAC_2_PI: f64 = std::f64::consts::FRAC_2_PI;

/// 2/π in 24-bit chunks: chunk j holds bits 24j+1 ..= 24j+24 after the binary point, so the
/// product of an f32 (24-bit significand) with a chunk is exact in f64.
const TWO_OVER_PI_CHUNKS: [f64; 9] = [
    0.636_619_746_685_028_1,
    2.568_255_297_319_410_6e-8,
    2.937_095_214_933_759e-16,
    3.254_379_400_173_245_6e-23,
    1.208_961_370_882_853_7e-29,
    5.667_556_795_740_071e-37,
    2.620_403_111_209_721_5e-44,
    7.053_957_680_880_629e-52,
    1.582_624_282_116_559e-58,
];

/// `x` at or below this magnitude uses the 3-part Cody-Waite reduction.
const CODY_WAITE_MAX: f64 = 1073741824.0; // 2^30

/// `x = (q + 4n)·π/2 + r`, `|r| ≲ π/4`, for f64 lanes holding f32 values of moderate size.
fn reduce_pio2_cw(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let shift = fc(b, t, SHIFT64);
    let k2 = fc(b, t, FRAC_2_PI);
    let s = b.ins().fma(x, k2, shift);
    let (kf, q) = round_int_shifted(b, s);
    let mut r = x;
    for p in PIO2 {
        r = fma_c(b, kf, -p, r);
    }
    (r, q)
}

/// As [`reduce_pio2_cw`] for any f32 value (Payne-Hanek style): `x·(2/π)` is summed exactly
/// chunk by chunk modulo 4, with the rounding errors of the running sum kept apart.
fn reduce_pio2_big(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let mut hi = fc(b, t, 0.0);
    let mut lo = fc(b, t, 0.0);
    let mod4 = |b: B, v: Value| {
        // v - 4·nearest(v/4): exact, result in [-2, 2].
        let q = fmul_c(b, v, 0.25);
        let n = b.ins().nearest(q);
        fma_c(b, n, -4.0, v)
    };
    for c in TWO_OVER_PI_CHUNKS {
        let p = fmul_c(b, x, c);
        let f = mod4(b, p);
        let s = b.ins().fadd(hi, f);
        let e = two_sum_err(b, hi, f, s);
        lo = b.ins().fadd(lo, e);
        hi = mod4(b, s);
    }
    let (kf, q) = round_int(b, hi);
    let frac = b.ins().fsub(hi, kf);
    let frac = b.ins().fadd(frac, lo);
    let r = fmul_c(b, frac, PIO2[0]);
    (r, q)
}

/// Reduction by π/2: the chunked path runs only when some lane exceeds `CODY_WAITE_MAX`
/// (or is inf), behind one well-predicted branch.
fn reduce_pio2(b: B, x: Value) -> (Value, Value) {
    let t = ty(b, x);
    let it = int_of(t);
    let (r_fast, q_fast) = reduce_pio2_cw(b, x);
    let a = b.ins().fabs(x);
    let big = fcmpc(b, FloatCC::GreaterThan, a, CODY_WAITE_MAX);
    let any = if t.is_vector() {
        b.ins().vany_true(big)
    } else {
        big
    };
    let slow = b.create_block();
    let join = b.create_block();
    let r = b.append_block_param(join, t);
    let q = b.append_block_param(join, it);
    b.ins()
        .brif(any, slow, &[], join, &[r_fast.into(), q_fast.into()]);
    b.switch_to_block(slow);
    b.seal_block(slow);
    let (r_slow, q_slow) = reduce_pio2_big(b, x);
    b.ins().jump(join, &[r_slow.into(), q_slow.into()]);
    b.switch_to_block(join);
    b.seal_block(join);
    (r, q)
}

/// `sin r` for `|r| ≲ π/4` (Taylor to r^13, error < 1e-12).
fn sin_poly(b: B, r: Value) -> Value {
    let z = b.ins().fmul(r, r);
    let p = poly(
        b,
        z,
        &[
            -1.0 / 6.0,
            1.0 / 120.0,
            -1.0 / 5040.0,
            1.0 / 362880.0,
            -1.0 / 39916800.0,
            1.0 / 6227020800.0,
        ],
    );
    let rz = b.ins().fmul(r, z);
    b.ins().fma(rz, p, r)
}

/// `cos r` for `|r| ≲ π/4` (Taylor to r^14).
fn cos_poly(b: B, r: Value) -> Value {
    let z = b.ins().fmul(r, r);
    let p = poly(
        b,
        z,
        &[
            1.0 / 24.0,
            -1.0 / 720.0,
            1.0 / 40320.0,
            -1.0 / 3628800.0,
            1.0 / 479001600.0,
            -1.0 / 87178291200.0,
        ],
    );
    let t = ty(b, r);
    let one = fc(b, t, 1.0);
    let c = fma_c(b, z, -0.5, one);
    let z2 = b.ins().fmul(z, z);
    b.ins().fma(z2, p, c)
}

/// sin (`quarter = 0`) or cos (`quarter = 1`) of f64 lanes: `sin(x + quarter·π/2)`.
fn sin_cos_f64(b: B, x: Value, quarter: i64) -> Value {
    let t = ty(b, x);
    let (r, q) = reduce_pio2(b, x);
    let it = ty(b, q);
    let qc = ic(b, it, quarter);
    let q = b.ins().iadd(q, qc);
    let s = sin_poly(b, r);
    let c = cos_poly(b, r);
    let one = ic(b, it, 1);
    let odd = b.ins().band(q, one);
    let odd = b.ins().icmp(IntCC::Equal, odd, one);
    let v = sel(b, odd, c, s);
    // Quadrants 2 and 3 flip the sign: move bit 1 of q to the sign bit.
    let two = ic(b, it, 2);
    let q2 = b.ins().band(q, two);
    let sign = b.ins().ishl_imm_u(q2, 62);
    let vb = to_bits(b, v);
    let vb = b.ins().bxor(vb, sign);
    bitcast(b, t, vb)
}

/// Sine; accurate over the whole f32 range (huge arguments are reduced exactly).
pub fn sin(b: B, x: Value) -> Value {
    let y = via_f64(b, &[x], &mut |b, v| sin_cos_f64(b, v[0], 0));
    // sin(-0) = -0 (the polynomial would give +0).
    let is0 = fcmpc(b, FloatCC::Equal, x, 0.0);
    sel(b, is0, x, y)
}

/// Cosine; accurate over the whole f32 range.
pub fn cos(b: B, x: Value) -> Value {
    via_f64(b, &[x], &mut |b, v| sin_cos_f64(b, v[0], 1))
}

// ---------------------------------------------------------------------------------------------
// pow

/// `log2(a)` for f64 lanes holding positive normal values (error ~1e-16 relative).
fn log2_f64(b: B, a: Value) -> Value {
    let (e, f) = split_exponent(b, a);
    let l = log1p_reduced(b, f, &atanh_series(8));
    fma_c(b, l, LOG2E, e)
}

/// `2^v` for f64 lanes, `|v| ≤ 1000` (error ~1e-15 relative).
fn exp2_f64(b: B, v: Value) -> Value {
    let t = ty(b, v);
    let (kf, k) = round_int(b, v);
    let r = b.ins().fsub(v, kf);
    let u = fmul_c(b, r, std::f64::consts::LN_2);
    let c: Vec<f64> = (0..=12)
        .scan(1.0, |f, i| {
            if i > 0 {
                *f /= i as f64;
            }
            Some(*f)
        })
        .collect();
    let p = poly(b, u, &c);
    let s = pow2i(b, k, t);
    b.ins().fmul(p, s)
}

/// `|x|^y` in f64 for f64 lanes holding f32 values.
fn pow_abs_f64(b: B, x: Value, y: Value) -> Value {
    let a = b.ins().fabs(x);
    let l = log2_f64(b, a);
    let z = fcmpc(b, FloatCC::Equal, a, 0.0);
    let l = selc(b, z, f64::NEG_INFINITY, l);
    let inf = fcmpc(b, FloatCC::Equal, a, f64::INFINITY);
    let l = selc(b, inf, f64::INFINITY, l);
    let nan = fcmp(b, FloatCC::Unordered, a, a);
    let l = sel(b, nan, a, l);
    let v = b.ins().fmul(y, l);
    // The f32 result is 0 or inf well inside ±200.
    let v = clamp(b, v, -200.0, 200.0);
    exp2_f64(b, v)
}

/// `x^y` with the C99 / PyTorch special cases: `x^0 = 1` and `1^y = 1` (even for NaN),
/// `(-1)^±inf = 1`, negative `x` with non-integer `y` → NaN, negative `x` with odd integer `y`
/// → negative result, `0^y` and `inf^y` with the signs of C99 `pow`.
pub fn pow(b: B, x: Value, y: Value) -> Value {
    let r = via_f64(b, &[x, y], &mut |b, v| pow_abs_f64(b, v[0], v[1]));
    let ty_ = ty(b, x);
    let ty_trunc = b.ins().trunc(y);
    let y_int = fcmp(b, FloatCC::Equal, ty_trunc, y);
    let hy = fmul_c(b, y, 0.5);
    let hy_trunc = b.ins().trunc(hy);
    let y_even = fcmp(b, FloatCC::Equal, hy_trunc, hy);
    let y_odd = b.ins().band_not(y_int, y_even);
    let x_neg = fcmpc(b, FloatCC::LessThan, x, 0.0);
    // The sign of x matters for odd y, also for x = -0.
    let x_bits = to_bits(b, x);
    let it = int_of(ty_);
    let zero_i = ic(b, it, 0);
    let x_signed = b.ins().icmp(IntCC::SignedLessThan, x_bits, zero_i);
    let flip = b.ins().band(x_signed, y_odd);
    let nr = b.ins().fneg(r);
    let r = sel(b, flip, nr, r);
    // A negative finite base to a non-integer power is NaN; -inf to one is inf or 0 (C99).
    let x_ninf = fcmpc(b, FloatCC::Equal, x, f64::NEG_INFINITY);
    let x_neg_finite = b.ins().band_not(x_neg, x_ninf);
    let non_int = b.ins().band_not(x_neg_finite, y_int);
    let r = selc(b, non_int, f64::NAN, r);
    let ax = b.ins().fabs(x);
    let ax1 = fcmpc(b, FloatCC::Equal, ax, 1.0);
    let ay = b.ins().fabs(y);
    let yinf = fcmpc(b, FloatCC::Equal, ay, f64::INFINITY);
    let m1inf = b.ins().band(ax1, yinf);
    let r = selc(b, m1inf, 1.0, r);
    let x1 = fcmpc(b, FloatCC::Equal, x, 1.0);
    let r = selc(b, x1, 1.0, r);
    let y0 = fcmpc(b, FloatCC::Equal, y, 0.0);
    selc(b, y0, 1.0, r)
}

// ---------------------------------------------------------------------------------------------
// sqrt, rsqrt

/// Square root (native, correctly rounded).
pub fn sqrt(b: B, x: Value) -> Value {
    b.ins().sqrt(x)
}

/// `1/sqrt(x)` (two correctly rounded steps: ≤ 1 ulp). `rsqrt(-0) = -inf` as in PyTorch.
pub fn rsqrt(b: B, x: Value) -> Value {
    let t = ty(b, x);
    let s = b.ins().sqrt(x);
    let one = fc(b, t, 1.0);
    b.ins().fdiv(one, s)
}

/// The signature shared by the unary emitters.
pub type UnaryEmitter = fn(&mut FunctionBuilder, Value) -> Value;

/// Every unary emitter by name (for tests and dispatch tables).
pub const UNARY: &[(&str, UnaryEmitter)] = &[
    ("exp", exp),
    ("expm1", expm1),
    ("log", log),
    ("log1p", log1p),
    ("tanh", tanh),
    ("sigmoid", sigmoid),
    ("erf", erf),
    ("gelu", gelu),
    ("gelu_tanh", gelu_tanh),
    ("gelu_slope", gelu_slope),
    ("gelu_tanh_slope", gelu_tanh_slope),
    ("sin", sin),
    ("cos", cos),
    ("sqrt", sqrt),
    ("rsqrt", rsqrt),
];

/// The composite activations' formulas ([`crate::ir::unary::FloatMath`]) on f32 scalars or
/// F32X4 vectors of type `ty`, with this file's f32 functions.
pub struct ClifMath<'a, 'b> {
    /// The Cranelift function builder the instructions are emitted into.
    pub b: B<'a, 'b>,
    /// `F32` or `F32X4`: the type of the values computed.
    pub ty: Type,
}

impl crate::ir::unary::FloatMath for ClifMath<'_, '_> {
    type V = Value;
    type M = Value;
    fn lit(&mut self, c: f64) -> Value {
        fc(self.b, self.ty, c)
    }
    fn add(&mut self, a: Value, c: Value) -> Value {
        self.b.ins().fadd(a, c)
    }
    fn sub(&mut self, a: Value, c: Value) -> Value {
        self.b.ins().fsub(a, c)
    }
    fn mul(&mut self, a: Value, c: Value) -> Value {
        self.b.ins().fmul(a, c)
    }
    fn div(&mut self, a: Value, c: Value) -> Value {
        self.b.ins().fdiv(a, c)
    }
    fn neg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }
    fn abs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }
    fn gt(&mut self, a: Value, c: Value) -> Value {
        fcmp(self.b, FloatCC::GreaterThan, a, c)
    }
    fn is_nan(&mut self, a: Value) -> Value {
        fcmp(self.b, FloatCC::Unordered, a, a)
    }
    fn select(&mut self, m: Value, a: Value, c: Value) -> Value {
        sel(self.b, m, a, c)
    }
    fn exp(&mut self, a: Value) -> Value {
        exp(self.b, a)
    }
    fn expm1(&mut self, a: Value) -> Value {
        expm1(self.b, a)
    }
    fn log1p(&mut self, a: Value) -> Value {
        log1p(self.b, a)
    }
    fn tanh(&mut self, a: Value) -> Value {
        tanh(self.b, a)
    }
}
