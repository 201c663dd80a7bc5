//! `sin`, `cos` and `pow`, computed in f64 inside: f32 lanes widened, computed, narrowed once.

use super::B;
use super::exp_log::{atanh_series, log1p_reduced, split_exponent};
use super::primitives::{
    bitcast, clamp, fc, fcmp, fcmpc, fma_c, fmul_c, ic, int_of, poly, pow2i, round_int,
    round_int_shifted, sel, selc, to_bits, two_sum_err, ty,
};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I8X16};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};
use smelt_rt::consts::{LOG2E, SHIFT64};

// ---------------------------------------------------------------------------------------------
// f64 helpers for sin/cos/pow: widen f32 lanes, compute, narrow once.

pub(super) fn shuffle_bytes(b: B, x: Value, y: Value, mask: [u8; 16]) -> Value {
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

pub(super) const HIGH_HALF: [u8; 16] = [8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15];
pub(super) const LOW_HALVES: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23];

/// Applies `f` to the f64 widening of f32 lanes `xs` (scalars or F32X4 as two F64X2 halves),
/// and rounds its f64 result once back to f32.
pub(super) fn via_f64(b: B, xs: &[Value], f: &mut dyn FnMut(B, &[Value]) -> Value) -> Value {
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
pub(super) const PIO2: [f64; 3] = [
    std::f64::consts::FRAC_PI_2,
    6.123_233_995_736_766e-17,
    -1.497_384_904_859_169_8e-33,
];
pub(super) const FRAC_2_PI: f64 = std::f64::consts::FRAC_2_PI;

/// 2/π in 24-bit chunks: chunk j holds bits 24j+1 ..= 24j+24 after the binary point, so the
/// product of an f32 (24-bit significand) with a chunk is exact in f64.
pub(super) const TWO_OVER_PI_CHUNKS: [f64; 9] = [
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
pub(super) const CODY_WAITE_MAX: f64 = 1073741824.0; // 2^30

/// `x = (q + 4n)·π/2 + r`, `|r| ≲ π/4`, for f64 lanes holding f32 values of moderate size.
pub(super) fn reduce_pio2_cw(b: B, x: Value) -> (Value, Value) {
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
pub(super) fn reduce_pio2_big(b: B, x: Value) -> (Value, Value) {
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
pub(super) fn reduce_pio2(b: B, x: Value) -> (Value, Value) {
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
pub(super) fn sin_poly(b: B, r: Value) -> Value {
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
pub(super) fn cos_poly(b: B, r: Value) -> Value {
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
pub(super) fn sin_cos_f64(b: B, x: Value, quarter: i64) -> Value {
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
pub(super) fn log2_f64(b: B, a: Value) -> Value {
    let (e, f) = split_exponent(b, a);
    let l = log1p_reduced(b, f, &atanh_series(8));
    fma_c(b, l, LOG2E, e)
}

/// `2^v` for f64 lanes, `|v| ≤ 1000` (error ~1e-15 relative).
pub(super) fn exp2_f64(b: B, v: Value) -> Value {
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
pub(super) fn pow_abs_f64(b: B, x: Value, y: Value) -> Value {
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
