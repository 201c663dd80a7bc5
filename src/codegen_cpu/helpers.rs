//! Host functions that generated kernels call: f64 math (each unary op's reference formula,
//! [`UnaryOp::f64_helper`], so f64 results are bit-identical to eager ones), f16 conversions,
//! integer power.
//!
//! Every function is `extern "C"` and re-entrant, and touches only its arguments (the strip
//! helpers of [`super::vmath`] the buffers they are given); [`symbols`] lists them with their
//! Cranelift signatures so a JIT can import them by name.

use crate::ir::op::UnaryOp;
use half::{bf16, f16};

/// The parameter and result kinds of a helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sig {
    /// `(f64, f64) -> f64`
    F64F64F64,
    /// `(f32, f32) -> f32`
    F32F32F32,
    /// `(f64, f64, f64) -> f64`: a unary op's reference formula with its two attributes.
    Unary,
    /// `f64 -> f32`
    F64F32,
    /// `f32 -> u32`
    F32U32,
    /// `u32 -> f32`
    U32F32,
    /// `(i64, i64) -> i64`
    I64I64I64,
    /// `(i32, pointer, pointer, i64)`, no result: a strip helper ([`super::vmath`]).
    Strip,
    /// `(pointer, i64) -> f64`: a strip sum ([`super::vmath`]).
    StripSum,
    /// `(pointer, i64, i64, i64, pointer)`, no result: a column sum ([`super::vmath`]).
    ColSum,
    /// `(pointer, pointer, i64)`, no result: a streamed copy ([`super::vmath`]).
    Stream,
}

extern "C" fn pow(a: f64, b: f64) -> f64 {
    a.powf(b)
}
extern "C" fn fmod(a: f64, b: f64) -> f64 {
    a % b
}
extern "C" fn div_floor(a: f64, b: f64) -> f64 {
    crate::ir::op::div_floor_float(a, b)
}
extern "C" fn div_floor_f32(a: f32, b: f32) -> f32 {
    crate::ir::op::div_floor_float(a, b)
}
/// f64 to f16 as the eager kernels convert (`half`'s `from_f64`), held in an f32.
extern "C" fn f64_to_f16(x: f64) -> f32 {
    f16::from_f64(x).to_f32()
}
extern "C" fn f64_to_bf16(x: f64) -> f32 {
    bf16::from_f64(x).to_f32()
}
/// Bits of an f32 that holds an f16 value exactly.
extern "C" fn f32_to_f16_bits(x: f32) -> u32 {
    u32::from(f16::from_f32(x).to_bits())
}
extern "C" fn f16_bits_to_f32(b: u32) -> f32 {
    f16::from_bits(b as u16).to_f32()
}
/// Integer power by squaring, wrapping; negative exponents as PyTorch's integer `pow`.
extern "C" fn pow_i64(mut a: i64, mut b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 if b % 2 != 0 => -1,
            -1 => 1,
            _ => 0,
        };
    }
    let mut r: i64 = 1;
    while b != 0 {
        if b & 1 == 1 {
            r = r.wrapping_mul(a);
        }
        b >>= 1;
        a = a.wrapping_mul(a);
    }
    r
}

/// Every helper: symbol name, address, signature.
pub fn symbols() -> Vec<(&'static str, *const u8, Sig)> {
    use Sig::*;
    let unary = UnaryOp::ALL
        .iter()
        .map(|u| (u.helper_symbol(), u.f64_helper() as *const u8, Unary));
    unary
        .chain([
            ("smelt_pow", pow as *const u8, F64F64F64),
            ("smelt_fmod", fmod as *const u8, F64F64F64),
            ("smelt_div_floor", div_floor as *const u8, F64F64F64),
            ("smelt_div_floor_f32", div_floor_f32 as *const u8, F32F32F32),
            ("smelt_f64_to_f16", f64_to_f16 as *const u8, F64F32),
            ("smelt_f64_to_bf16", f64_to_bf16 as *const u8, F64F32),
            (
                "smelt_f32_to_f16_bits",
                f32_to_f16_bits as *const u8,
                F32U32,
            ),
            (
                "smelt_f16_bits_to_f32",
                f16_bits_to_f32 as *const u8,
                U32F32,
            ),
            ("smelt_pow_i64", pow_i64 as *const u8, I64I64I64),
            (
                super::vmath::SYMBOL,
                super::vmath::strip_math as *const u8,
                Strip,
            ),
            (
                super::vmath::SUM_SYMBOL,
                super::vmath::strip_sum as *const u8,
                StripSum,
            ),
            (
                super::vmath::COL_SUM_SYMBOL,
                super::vmath::col_sum as *const u8,
                ColSum,
            ),
            (
                super::vmath::STREAM_SYMBOL,
                super::vmath::stream as *const u8,
                Stream,
            ),
        ])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_power_follows_pytorch() {
        assert_eq!(pow_i64(3, 4), 81);
        assert_eq!(pow_i64(-1, -3), -1);
        assert_eq!(pow_i64(-1, -2), 1);
        assert_eq!(pow_i64(2, -1), 0);
        assert_eq!(pow_i64(2, 64), 0);
    }

    #[test]
    fn half_conversions_round_to_nearest_even() {
        // f16: 65519 is below the overflow threshold 65520, which ties to even (infinity)
        assert_eq!(f64_to_f16(65519.0), 65504.0);
        assert_eq!(f64_to_f16(65520.0), f32::INFINITY);
        // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7
        assert_eq!(f64_to_bf16(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(f16_bits_to_f32(f32_to_f16_bits(-2.5)), -2.5);
    }
}
