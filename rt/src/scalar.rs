//! Scalar helpers that generated kernels call by name: f64 math without a Cranelift
//! instruction, f16/bf16 conversions, integer power. Each is `extern "C"`, re-entrant and
//! touches only its arguments.

use half::{bf16, f16};

/// PyTorch's floor division of floats (`div_floor_floating`, Python's `//`) in the
/// precision of `F`: the quotient of `a - fmod(a, b)`, corrected so that rounding error
/// never moves it across an integer. A zero divisor gives IEEE `a / b`.
pub fn div_floor_float<F: Float>(a: F, b: F) -> F {
    if b == F::zero() {
        return a / b;
    }
    // `%` on floats is C's fmod: exact, with the dividend's sign
    let m = a % b;
    let mut div = (a - m) / b;
    if m != F::zero() && (b < F::zero()) != (m < F::zero()) {
        div = div - F::one();
    }
    if div == F::zero() {
        return F::zero().copysign(a / b);
    }
    let fl = div.floor();
    let half = F::one() / (F::one() + F::one());
    if div - fl > half { fl + F::one() } else { fl }
}

/// The float operations [`div_floor_float`] needs, for f32 and f64.
pub trait Float:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Rem<Output = Self>
{
    /// 0.
    fn zero() -> Self;
    /// 1.
    fn one() -> Self;
    /// Rounds down.
    fn floor(self) -> Self;
    /// `self` with the sign of `sign`.
    fn copysign(self, sign: Self) -> Self;
}

macro_rules! float {
    ($t:ty) => {
        impl Float for $t {
            fn zero() -> $t {
                0.0
            }
            fn one() -> $t {
                1.0
            }
            fn floor(self) -> $t {
                <$t>::floor(self)
            }
            fn copysign(self, sign: $t) -> $t {
                <$t>::copysign(self, sign)
            }
        }
    };
}
float!(f32);
float!(f64);

/// `a^b` in f64.
#[unsafe(export_name = "smelt_pow")]
pub extern "C" fn pow(a: f64, b: f64) -> f64 {
    a.powf(b)
}
/// C's `fmod`.
#[unsafe(export_name = "smelt_fmod")]
pub extern "C" fn fmod(a: f64, b: f64) -> f64 {
    a % b
}
/// [`div_floor_float`] in f64.
#[unsafe(export_name = "smelt_div_floor")]
pub extern "C" fn div_floor(a: f64, b: f64) -> f64 {
    div_floor_float(a, b)
}
/// [`div_floor_float`] in f32.
#[unsafe(export_name = "smelt_div_floor_f32")]
pub extern "C" fn div_floor_f32(a: f32, b: f32) -> f32 {
    div_floor_float(a, b)
}
/// f64 to f16 as PyTorch converts it (`c10::Half(float(x))`): to f32 first, then to f16,
/// each rounded to nearest even. Every f64-to-f16 conversion in smelt goes through it.
/// `half`'s `from_f64` does not do for this: it rounds from the f64's top 32 bits only (or
/// through f32 where the CPU has F16C), so its result depends on the machine.
pub fn f16_from_f64(x: f64) -> f16 {
    f16::from_f32(x as f32)
}
/// f64 to bf16 as PyTorch converts it, through f32 (see [`f16_from_f64`]).
pub fn bf16_from_f64(x: f64) -> bf16 {
    bf16::from_f32(x as f32)
}
/// [`f16_from_f64`], held in an f32.
#[unsafe(export_name = "smelt_f64_to_f16")]
pub extern "C" fn f64_to_f16(x: f64) -> f32 {
    f16_from_f64(x).to_f32()
}
/// [`bf16_from_f64`], held in an f32.
#[unsafe(export_name = "smelt_f64_to_bf16")]
pub extern "C" fn f64_to_bf16(x: f64) -> f32 {
    bf16_from_f64(x).to_f32()
}
/// Bits of an f32 that holds an f16 value exactly.
#[unsafe(export_name = "smelt_f32_to_f16_bits")]
pub extern "C" fn f32_to_f16_bits(x: f32) -> u32 {
    u32::from(f16::from_f32(x).to_bits())
}
/// The f32 of f16 bits.
#[unsafe(export_name = "smelt_f16_bits_to_f32")]
pub extern "C" fn f16_bits_to_f32(b: u32) -> f32 {
    f16::from_bits(b as u16).to_f32()
}
/// [`pow_int`] for generated code.
#[unsafe(export_name = "smelt_pow_i64")]
pub extern "C" fn pow_i64(a: i64, b: i64) -> i64 {
    pow_int(a, b)
}

/// Integer power by squaring, wrapping; negative exponents give PyTorch's integer results
/// (`1`, `±1` for a base of -1, else 0). The eager kernel and compiled code share it.
#[inline]
pub fn pow_int(mut a: i64, mut b: i64) -> i64 {
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

    #[test]
    fn floor_division_follows_python() {
        assert_eq!(div_floor_float(7.0f64, -2.0), -4.0);
        assert_eq!(div_floor_float(-7.0f32, 2.0), -4.0);
        assert!(div_floor_float(-0.5f64, 2.0).is_sign_negative());
        assert_eq!(div_floor_float(1.0f64, 0.0), f64::INFINITY);
    }
}
