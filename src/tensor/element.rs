//! Rust element types behind each dtype, their conversions, and dtype dispatch.

use crate::ir::dtype::DType;
use half::{bf16, f16};

/// A Rust type that stores one element of a dtype. Conversions follow C casts as PyTorch
/// does: float to int truncates toward zero (through i64, so out-of-range values wrap like
/// the hardware conversion), int to narrower int wraps, anything to bool is `!= 0`.
pub trait Element: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// The value as f64 (exact for every dtype but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// The f64 `v` converted with C cast semantics.
    fn from_f64(v: f64) -> Self;
    /// The value as i64 (floats truncate toward zero).
    fn to_i64(self) -> i64;
    /// The i64 `v` converted with C cast semantics (narrower ints wrap).
    fn from_i64(v: i64) -> Self;
    /// Zero of this type (`false` for bool).
    fn zero() -> Self {
        Self::from_i64(0)
    }
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { (v as i64) as $t }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
int_element!(u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as i64 as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}

macro_rules! half_element {
    ($($t:ty => $d:ident, $from:path),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)] fn to_f64(self) -> f64 { self.to_f64() }
            // through f32, as PyTorch converts (`smelt_rt::scalar::f16_from_f64`)
            #[inline(always)] fn from_f64(v: f64) -> Self { $from(v) }
            #[inline(always)] fn to_i64(self) -> i64 { self.to_f64() as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { $from(v as f64) }
        }
    )*};
}
half_element!(
    f16 => F16, smelt_rt::scalar::f16_from_f64,
    bf16 => BF16, smelt_rt::scalar::bf16_from_f64
);

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
#[macro_export]
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {{
        use $crate::ir::dtype::DType as __D;
        match $dtype {
            __D::Bool => {
                type $T = bool;
                $body
            }
            __D::U8 => {
                type $T = u8;
                $body
            }
            __D::I8 => {
                type $T = i8;
                $body
            }
            __D::I16 => {
                type $T = i16;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            __D::BF16 => {
                type $T = half::bf16;
                $body
            }
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
        }
    }};
}

/// Like `dispatch!`, for float dtypes only; other dtypes evaluate `$else`.
#[macro_export]
macro_rules! dispatch_float {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {{
        use $crate::ir::dtype::DType as __D;
        match $dtype {
            __D::F16 => {
                type $T = half::f16;
                $body
            }
            __D::BF16 => {
                type $T = half::bf16;
                $body
            }
            __D::F32 => {
                type $T = f32;
                $body
            }
            __D::F64 => {
                type $T = f64;
                $body
            }
            _ => $other,
        }
    }};
}

/// Like `dispatch!`, for bool and the integer dtypes only; other dtypes evaluate `$else`.
#[macro_export]
macro_rules! dispatch_int {
    ($dtype:expr, $T:ident => $body:expr, else $other:expr) => {{
        use $crate::ir::dtype::DType as __D;
        match $dtype {
            __D::Bool => {
                type $T = bool;
                $body
            }
            __D::U8 => {
                type $T = u8;
                $body
            }
            __D::I8 => {
                type $T = i8;
                $body
            }
            __D::I16 => {
                type $T = i16;
                $body
            }
            __D::I32 => {
                type $T = i32;
                $body
            }
            __D::I64 => {
                type $T = i64;
                $body
            }
            _ => $other,
        }
    }};
}

/// Converts a scalar to how it is stored in `dtype`, then back to f64: the value a kernel of
/// that dtype really computes with (`x * 0.1` in f32 multiplies by `0.1f32`).
pub fn round_to_dtype(v: f64, dtype: DType) -> f64 {
    dispatch!(dtype, T => T::from_f64(v).to_f64())
}
