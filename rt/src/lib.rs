//! smelt's run-time library: what compiled CPU code calls while it runs, with no compiler in
//! it (no Cranelift, egg or petgraph).
//!
//! - [`scalar`] and [`vmath`]: the math helpers generated kernels call by name;
//! - [`unary_f64`]: the f64 formulas of the unary ops compiled code calls, defined once for
//!   eager kernels, the JIT and ahead-of-time models;
//! - [`copy`]: strided and indexed copies, the data-movement library ops of compiled models;
//! - [`scan`]: running sums (`cumsum`);
//! - [`conv`] and [`pool`]: convolutions, pooling and their gradients, for eager tensors and
//!   compiled models alike;
//! - [`threads`]: how many threads a library kernel may take, and how it enters rayon;
//! - [`gemm`]: strided, batched matrix products ([`panels`]: their f32 path on AVX2);
//! - [`hot`]: calls during which the thread pool's workers poll for work;
//! - [`model`]: the entry point of ahead-of-time compiled models: it checks the CPU, lays
//!   out the buffers in the caller's scratch, runs the kernels over threads and the GEMMs,
//!   and copies the outputs out.
//!
//! The JIT links this crate as a Rust library; a C program that links an ahead-of-time
//! compiled model links it as `libsmelt_rt.a`.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
// The vector kernels (panels, tiles, strips) are x86-64's; on other machines (AArch64
// models) the portable loops run, and the x86 kernels' shared helpers go unused.
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

pub mod consts;
pub mod conv;
pub mod copy;
pub mod dropout;
pub mod gemm;
pub mod hot;
mod lanes;
pub mod libcalls;
pub mod model;
pub mod panels;
pub mod pool;
pub mod ranges;
pub mod scalar;
pub mod scan;
pub mod threads;
pub mod tiles;
pub mod unary_f64;
pub mod vmath;

pub use half;

/// The element types of tensors, for the library routines that take any of them (scatters
/// that add, running sums): in this order, their position is their code in a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// f32.
    F32,
    /// f64.
    F64,
    /// u8.
    U8,
    /// i8.
    I8,
    /// i16.
    I16,
    /// i32.
    I32,
    /// i64.
    I64,
    /// bool.
    Bool,
}

impl ElemType {
    /// Every element type, in the order of their codes.
    pub const ALL: [ElemType; 10] = [
        ElemType::F16,
        ElemType::BF16,
        ElemType::F32,
        ElemType::F64,
        ElemType::U8,
        ElemType::I8,
        ElemType::I16,
        ElemType::I32,
        ElemType::I64,
        ElemType::Bool,
    ];

    /// Its code: its position in [`ElemType::ALL`].
    pub fn code(self) -> u64 {
        ElemType::ALL.iter().position(|&e| e == self).unwrap_or(0) as u64
    }

    /// The element type of `code`, if any.
    pub fn of_code(code: u64) -> Option<ElemType> {
        ElemType::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::U8 | ElemType::I8 | ElemType::Bool => 1,
            ElemType::F16 | ElemType::BF16 | ElemType::I16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::F64 | ElemType::I64 => 8,
        }
    }
}

/// The C signature of a helper, for a code generator that imports it.
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
    /// `(i32, pointer, pointer, i64)`, no result: a strip helper ([`vmath`]).
    Strip,
    /// `(pointer, i64) -> f64`: a strip sum ([`vmath`]).
    StripSum,
    /// `(pointer, i64) -> f32`: a strip maximum or minimum ([`vmath`]).
    StripExtreme,
    /// `(pointer, i64, i64, i64, pointer)`, no result: a column sum ([`vmath`]).
    ColSum,
    /// `(pointer, pointer, i64)`, no result: a streamed copy ([`vmath`]).
    Stream,
    /// `(pointer, pointer, i64, i32)`, no result: softmax or log_softmax of a row ([`vmath`]).
    SoftmaxRow,
}

/// Every helper this library exports to generated code: symbol, address, signature.
pub fn helpers() -> Vec<(&'static str, *const u8, Sig)> {
    use Sig::*;
    vec![
        ("smelt_pow", scalar::pow as *const u8, F64F64F64),
        ("smelt_fmod", scalar::fmod as *const u8, F64F64F64),
        ("smelt_div_floor", scalar::div_floor as *const u8, F64F64F64),
        (
            "smelt_div_floor_f32",
            scalar::div_floor_f32 as *const u8,
            F32F32F32,
        ),
        ("smelt_f64_to_f16", scalar::f64_to_f16 as *const u8, F64F32),
        (
            "smelt_f64_to_bf16",
            scalar::f64_to_bf16 as *const u8,
            F64F32,
        ),
        (
            "smelt_f32_to_f16_bits",
            scalar::f32_to_f16_bits as *const u8,
            F32U32,
        ),
        (
            "smelt_f16_bits_to_f32",
            scalar::f16_bits_to_f32 as *const u8,
            U32F32,
        ),
        ("smelt_pow_i64", scalar::pow_i64 as *const u8, I64I64I64),
        (vmath::SYMBOL, vmath::strip_math as *const u8, Strip),
        (vmath::SUM_SYMBOL, vmath::strip_sum as *const u8, StripSum),
        (
            vmath::MAX_SYMBOL,
            vmath::strip_max as *const u8,
            StripExtreme,
        ),
        (
            vmath::MIN_SYMBOL,
            vmath::strip_min as *const u8,
            StripExtreme,
        ),
        (vmath::COL_SUM_SYMBOL, vmath::col_sum as *const u8, ColSum),
        (vmath::STREAM_SYMBOL, vmath::stream as *const u8, Stream),
        (
            vmath::SOFTMAX_SYMBOL,
            vmath::softmax_row as *const u8,
            SoftmaxRow,
        ),
    ]
    .into_iter()
    .chain(unary_f64::symbols().into_iter().map(|(n, p)| (n, p, Unary)))
    .collect()
}
