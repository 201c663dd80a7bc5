//! The f64 reference formulas of the unary ops that compiled f64 code calls rather than
//! inlines, defined here once: the eager kernels (`UnaryOp::eval_f64`), JIT-compiled kernels
//! and ahead-of-time compiled models all compute them with these, so their f64 results agree
//! bit for bit. Each `smelt_unary_*` function is the C helper of one op, `(x, attr0, attr1)`
//! with the op's attributes as f64 codes (gelu's `approximate="tanh"` as 1).

use crate::consts::FRAC_1_SQRT_2PI;

/// `sqrt(2 / pi)`, the constant of the tanh form of GELU.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)`.
#[inline(always)]
pub fn silu(x: f64) -> f64 {
    x * (1.0 / (1.0 + (-x).exp()))
}

/// The error function.
#[inline(always)]
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// GELU, exact (`tanh` false: `x·Φ(x)`) or in PyTorch's tanh form.
#[inline(always)]
pub fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
        0.5 * x * (1.0 + inner.tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
    }
}

/// The derivative of [`gelu`] with the same form: `Φ(x) + x·φ(x)` (Φ from erfc, with no
/// cancellation below 0; NaN at ±∞ as PyTorch's), or for the tanh form
/// `σ + x·σ·(1-σ)·v'` with `σ = sigmoid(v)`, `v = 2u` (PyTorch's `(1 + tanh(u))/2 +
/// x/2·(1 - tanh²(u))·u'`, with `1 - σ` as `sigmoid(-v)`).
#[inline(always)]
pub fn gelu_slope(x: f64, tanh: bool) -> f64 {
    if tanh {
        let k = 2.0 * SQRT_2_OVER_PI;
        let v = k * (x + 0.044715 * x * x * x);
        let s = 1.0 / (1.0 + (-v).exp());
        let r = 1.0 / (1.0 + v.exp());
        let dv = k * (1.0 + 3.0 * 0.044715 * x * x);
        s + x * s * r * dv
    } else {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
            + x * (-0.5 * x * x).exp() * FRAC_1_SQRT_2PI
    }
}

/// `leaky_relu`: `x` above 0, `x · slope` otherwise.
#[inline(always)]
pub fn leaky_relu(x: f64, slope: f64) -> f64 {
    if x > 0.0 { x } else { x * slope }
}

/// `elu`: PyTorch's `x <= 0 ? alpha · expm1(x) : x`, NaN passing through.
#[inline(always)]
pub fn elu(x: f64, alpha: f64) -> f64 {
    if x.is_nan() || x > 0.0 {
        x
    } else {
        x.exp_m1() * alpha
    }
}

/// `softplus`: `log1p(e^(βx)) / β`, or `x` where `βx` exceeds the threshold.
#[inline(always)]
pub fn softplus(x: f64, beta: f64, threshold: f64) -> f64 {
    let bx = x * beta;
    if bx > threshold {
        x
    } else {
        bx.exp().ln_1p() / beta
    }
}

/// `hardtanh`: `min(max(x, lo), hi)`, NaN passing through.
#[inline(always)]
pub fn hardtanh(x: f64, lo: f64, hi: f64) -> f64 {
    let y = if lo > x { lo } else { x };
    if y > hi { hi } else { y }
}

/// `hardswish`: `x · min(max(x + 3, 0), 6) / 6`.
#[inline(always)]
pub fn hardswish(x: f64) -> f64 {
    let y = x + 3.0;
    let y = if 0.0 > y { 0.0 } else { y };
    let y = if y > 6.0 { 6.0 } else { y };
    x * y / 6.0
}

/// `mish`: `x · tanh(softplus(x))`.
#[inline(always)]
pub fn mish(x: f64) -> f64 {
    x * x.exp().ln_1p().tanh()
}

/// `logsigmoid`: `min(x, 0) - log1p(e^-|x|)`, with no overflow either way.
#[inline(always)]
pub fn logsigmoid(x: f64) -> f64 {
    let low = if x > 0.0 { 0.0 } else { x };
    low - (-x.abs()).exp().ln_1p()
}

macro_rules! helpers {
    ($($symbol:ident: |$x:ident, $a0:ident, $a1:ident| $body:expr;)*) => {
        $(
            #[doc = concat!("The C helper `", stringify!($symbol), "(x, attr0, attr1)`.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $symbol($x: f64, $a0: f64, $a1: f64) -> f64 {
                let _ = ($a0, $a1);
                $body
            }
        )*

        /// Every helper: its symbol and address.
        pub fn symbols() -> Vec<(&'static str, *const u8)> {
            vec![$((stringify!($symbol), $symbol as *const u8)),*]
        }
    };
}

helpers! {
    smelt_unary_exp: |x, _a, _b| x.exp();
    smelt_unary_log: |x, _a, _b| x.ln();
    smelt_unary_log1p: |x, _a, _b| x.ln_1p();
    smelt_unary_expm1: |x, _a, _b| x.exp_m1();
    smelt_unary_sin: |x, _a, _b| x.sin();
    smelt_unary_cos: |x, _a, _b| x.cos();
    smelt_unary_asin: |x, _a, _b| x.asin();
    smelt_unary_acos: |x, _a, _b| x.acos();
    smelt_unary_atan: |x, _a, _b| x.atan();
    smelt_unary_tanh: |x, _a, _b| x.tanh();
    smelt_unary_sigmoid: |x, _a, _b| sigmoid(x);
    smelt_unary_silu: |x, _a, _b| silu(x);
    smelt_unary_erf: |x, _a, _b| erf(x);
    smelt_unary_gelu: |x, a, _b| gelu(x, a != 0.0);
    smelt_unary_gelu_slope: |x, a, _b| gelu_slope(x, a != 0.0);
    smelt_unary_leaky_relu: |x, a, _b| leaky_relu(x, a);
    smelt_unary_elu: |x, a, _b| elu(x, a);
    smelt_unary_softplus: |x, a, b| softplus(x, a, b);
    smelt_unary_hardtanh: |x, a, b| hardtanh(x, a, b);
    smelt_unary_hardswish: |x, _a, _b| hardswish(x);
    smelt_unary_mish: |x, _a, _b| mish(x);
    smelt_unary_logsigmoid: |x, _a, _b| logsigmoid(x);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(smelt_unary_exp(0.0, 0.0, 0.0), 1.0);
        assert_eq!(smelt_unary_sigmoid(0.0, 0.0, 0.0), 0.5);
        assert_eq!(smelt_unary_gelu(0.0, 0.0, 0.0), 0.0);
        // gelu(1) = Φ(1) = 0.841344746068543 (exact form)
        assert!((smelt_unary_gelu(1.0, 0.0, 0.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
        // the tanh form at 1: 0.5·(1 + tanh(sqrt(2/π)·1.044715)) = 0.8411919906082768
        assert!((smelt_unary_gelu(1.0, 1.0, 0.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
        // d/dx gelu at 0 is Φ(0) = 1/2 in both forms
        assert_eq!(smelt_unary_gelu_slope(0.0, 0.0, 0.0), 0.5);
        assert_eq!(smelt_unary_gelu_slope(0.0, 1.0, 0.0), 0.5);
        assert_eq!(symbols().len(), 22);
        // asin(1) = π/2, acos(-1) = π, atan(1) = π/4
        use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, PI};
        assert!((smelt_unary_asin(1.0, 0.0, 0.0) - FRAC_PI_2).abs() < 1e-15);
        assert!((smelt_unary_acos(-1.0, 0.0, 0.0) - PI).abs() < 1e-15);
        assert!((smelt_unary_atan(1.0, 0.0, 0.0) - FRAC_PI_4).abs() < 1e-15);
        assert!(smelt_unary_asin(1.5, 0.0, 0.0).is_nan());
        // known values: softplus(0) = ln 2, logsigmoid(0) = -ln 2, mish(0) = 0,
        // hardswish(1) = 4/6, elu(-inf) = -alpha, hardtanh(5) = 1
        assert_eq!(softplus(0.0, 1.0, 20.0), std::f64::consts::LN_2);
        assert_eq!(logsigmoid(0.0), -std::f64::consts::LN_2);
        assert_eq!(mish(0.0), 0.0);
        assert_eq!(hardswish(1.0), 4.0 / 6.0);
        assert_eq!(elu(f64::NEG_INFINITY, 1.5), -1.5);
        assert_eq!(hardtanh(5.0, -1.0, 1.0), 1.0);
        assert!(elu(f64::NAN, 1.0).is_nan() && hardtanh(f64::NAN, -1.0, 1.0).is_nan());
        assert_eq!(leaky_relu(-2.0, 0.01), -0.02);
        // far from 0, no overflow: logsigmoid(-800) = -800, softplus(800) = 800
        assert_eq!(logsigmoid(-800.0), -800.0);
        assert_eq!(softplus(800.0, 1.0, 20.0), 800.0);
    }
}
