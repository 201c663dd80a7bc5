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

mod erf_gelu;
mod exp_log;
mod primitives;
mod trig_pow;

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Type, Value};
use cranelift_frontend::FunctionBuilder;

type B<'a, 'b> = &'a mut FunctionBuilder<'b>;

pub use erf_gelu::{erf, gelu, gelu_slope, gelu_tanh, gelu_tanh_slope};
pub use exp_log::{exp, expm1, log, log1p, sigmoid, tanh};
use primitives::{fc, fcmp, sel, ty};
pub use trig_pow::{cos, pow, sin};

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
