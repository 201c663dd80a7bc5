//! Small helpers of the f32 math emitters: constants, bit casts, selects, polynomials,
//! rounding and scaling by powers of two.

use super::B;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F32X4, F64, I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use smelt_rt::consts::{SHIFT32, SHIFT64};

// ---------------------------------------------------------------------------------------------
// Small helpers: constants, bit casts, selects, polynomials.

pub(super) fn ty(b: &FunctionBuilder, v: Value) -> Type {
    b.func.dfg.value_type(v)
}

/// The integer type with the lane layout of the float type `t`.
pub(super) fn int_of(t: Type) -> Type {
    match t {
        F32 => I32,
        F32X4 => I32X4,
        F64 => I64,
        _ => I64X2,
    }
}

/// A float constant of type `t` (splatted for vectors).
pub(super) fn fc(b: B, t: Type, v: f64) -> Value {
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
pub(super) fn ic(b: B, t: Type, v: i64) -> Value {
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

pub(super) fn bitcast(b: B, t: Type, v: Value) -> Value {
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    b.ins().bitcast(t, flags, v)
}

pub(super) fn to_bits(b: B, v: Value) -> Value {
    let t = int_of(ty(b, v));
    bitcast(b, t, v)
}

/// `m ? a : c` lane-wise; `m` comes from `fcmp`/`icmp` (or a combination with band/bor).
pub(super) fn sel(b: B, m: Value, a: Value, c: Value) -> Value {
    let t = ty(b, a);
    if t.is_vector() {
        let m = if ty(b, m) == t { m } else { bitcast(b, t, m) };
        b.ins().bitselect(m, a, c)
    } else {
        b.ins().select(m, a, c)
    }
}

/// `|mag|` with the sign bit of `sgn` (Cranelift has no vector `fcopysign` on x86-64).
pub(super) fn copysign(b: B, mag: Value, sgn: Value) -> Value {
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

pub(super) fn fcmp(b: B, cc: FloatCC, x: Value, y: Value) -> Value {
    b.ins().fcmp(cc, x, y)
}

/// Compare `x` with a constant.
pub(super) fn fcmpc(b: B, cc: FloatCC, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fcmp(cc, x, c)
}

/// `m ? c : x` with a constant `c`.
pub(super) fn selc(b: B, m: Value, c: f64, x: Value) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    sel(b, m, c, x)
}

/// Clamp into `[lo, hi]` by compare + select; NaN passes through unchanged.
pub(super) fn clamp(b: B, x: Value, lo: f64, hi: f64) -> Value {
    let m = fcmpc(b, FloatCC::GreaterThan, x, hi);
    let x = selc(b, m, hi, x);
    let m = fcmpc(b, FloatCC::LessThan, x, lo);
    selc(b, m, lo, x)
}

pub(super) fn fmul_c(b: B, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fmul(x, c)
}

pub(super) fn fadd_c(b: B, x: Value, c: f64) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fadd(x, c)
}

/// `x*c + y` with a constant `c`, fused.
pub(super) fn fma_c(b: B, x: Value, c: f64, y: Value) -> Value {
    let t = ty(b, x);
    let c = fc(b, t, c);
    b.ins().fma(x, c, y)
}

/// `c[0] + c[1] x + ... + c[n] x^n` by Horner's rule with fused multiply-adds.
pub(super) fn poly(b: B, x: Value, c: &[f64]) -> Value {
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
pub(super) fn two_sum_err(b: B, x: Value, y: Value, s: Value) -> Value {
    let yv = b.ins().fsub(s, x);
    let xv = b.ins().fsub(s, yv);
    let dy = b.ins().fsub(y, yv);
    let dx = b.ins().fsub(x, xv);
    b.ins().fadd(dx, dy)
}

/// `(nearest(x), nearest(x) as integer)` for `|x| < 2^22` (f32) or `2^51` (f64): the integer is
/// read from the low mantissa bits of `x + 1.5·2^p`, which avoids slow vector conversions.
pub(super) fn round_int(b: B, x: Value) -> (Value, Value) {
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
pub(super) fn round_int_shifted(b: B, s: Value) -> (Value, Value) {
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
pub(super) fn pow2i(b: B, n: Value, ft: Type) -> Value {
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
pub(super) fn scale2n(b: B, y: Value, n: Value) -> Value {
    let t = ty(b, y);
    let f = scale2n_factors(b, n, t, None);
    scale_by(b, y, f)
}

/// The two factors of `2^n` that [`scale2n`] multiplies by, the first 0 in the lanes of
/// `gone`: where the caller knows the result rounds to 0, it is ±0 (the sign of `y`) without
/// a subnormal product, which costs a microcode assist per lane on x86.
pub(super) fn scale2n_factors(b: B, n: Value, t: Type, gone: Option<Value>) -> (Value, Value) {
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
pub(super) fn scale_by(b: B, y: Value, (s1, s2): (Value, Value)) -> Value {
    let y = b.ins().fmul(y, s1);
    b.ins().fmul(y, s2)
}

/// `y · 2^n` for `|y| < 2` and `n ≤ 0`, where the caller adds it to 1 or takes it from 1: one
/// multiply by `2^max(n, -64)`. Where `n ≥ -64` this is [`scale2n`]'s value; below, both are
/// under 2^-63 and vanish next to 1 alike, and no lane computes a subnormal product.
pub(super) fn scale2n_from_one(b: B, y: Value, n: Value) -> Value {
    let t = ty(b, y);
    let it = ty(b, n);
    let lo = ic(b, it, -64);
    let n = b.ins().smax(n, lo);
    let s = pow2i(b, n, t);
    b.ins().fmul(y, s)
}

/// Lane-wise float of small non-negative integer lanes (< 2^23 for f32) by the exponent trick.
pub(super) fn small_uint_to_float(b: B, n: Value, ft: Type) -> Value {
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
