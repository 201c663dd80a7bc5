//! Native vector math for strips (`smelt::codegen_cpu::strip`): f32 transcendentals mapped over a buffer
//! by loops that rustc vectorises for AVX-512 or AVX2 + FMA, chosen once at run time.
//!
//! Cranelift emits 128-bit vectors only, and a transcendental costs some forty instructions per
//! vector: in a fused kernel it, not memory, sets the pace. These loops run the same math 8 or
//! 16 lanes at a time. Each function is a port of its emitter in `smelt::codegen_cpu::math`: the same
//! constants and the same IEEE operations in the same order (fused multiply-adds where the
//! emitter fuses), so a strip's results are bit-identical to the inline code's
//! (`tests/cpu_math.rs` checks every op over its whole range).
//!
//! Without AVX2 + FMA (or off x86-64) [`available`] is false and kernels keep the inline code:
//! a software fma would make these loops slower than Cranelift's.
//!
//! The streamed copy (`stream`) moves a stack row to a large output with non-temporal AVX
//! stores (`smelt::codegen_cpu::stream`); kernels stream only where [`available`] is true.
//!
//! The column sum (`col_sum`) serves rows as lanes (`smelt::codegen_cpu::lanes`). It only adds
//! converted f32s and needs no fma, so it runs its portable build wherever AVX2 is missing.

mod dispatch;
mod erf_gelu;
mod exp;
mod rows;
mod symbols;
#[cfg(test)]
mod tests;

pub(crate) use dispatch::{Level, level};
pub use dispatch::{
    apply, apply_from, available, col_sums, extreme, isa, layer_norm, softmax, sum,
};
pub use erf_gelu::GeluTail;
pub use rows::{PREFETCH_AHEAD, prefetch};
pub use symbols::{
    COL_SUM_SYMBOL, MAX_SYMBOL, MIN_SYMBOL, SOFTMAX_SYMBOL, STREAM_SYMBOL, SUM_SYMBOL, SYMBOL,
    col_sum, fence, softmax_row, stream, strip_math, strip_max, strip_min, strip_sum,
};

/// An op a strip helper evaluates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StripOp {
    /// `exp(x)`.
    Exp = 0,
    /// `tanh(x)`.
    Tanh = 1,
    /// `1 / (1 + exp(-x))`.
    Sigmoid = 2,
    /// `x * sigmoid(x)`.
    Silu = 3,
    /// GELU with the tanh approximation (`approximate="tanh"`).
    GeluTanh = 4,
    /// GELU, exact form `x·Φ(x)` (`approximate="none"`).
    GeluErf = 5,
    /// The error function.
    Erf = 6,
    /// The exact GELU's slope `Φ(x) + x·φ(x)` (its gradient multiplies by it).
    GeluErfSlope = 7,
    /// The tanh GELU's slope.
    GeluTanhSlope = 8,
}

impl StripOp {
    /// Every strip op, in discriminant order.
    pub const ALL: [StripOp; 9] = [
        StripOp::Exp,
        StripOp::Tanh,
        StripOp::Sigmoid,
        StripOp::Silu,
        StripOp::GeluTanh,
        StripOp::GeluErf,
        StripOp::Erf,
        StripOp::GeluErfSlope,
        StripOp::GeluTanhSlope,
    ];

    /// The strip op of a code generated kernels pass.
    pub fn from_code(c: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|&op| op as i32 == c)
    }
}
