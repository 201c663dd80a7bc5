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

macro_rules! helpers {
    ($($symbol:ident: |$x:ident, $a0:ident| $body:expr;)*) => {
        $(
            #[doc = concat!("The C helper `", stringify!($symbol), "(x, attr0, attr1)`.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $symbol($x: f64, $a0: f64, _attr1: f64) -> f64 {
                let _ = $a0;
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
    smelt_unary_exp: |x, _a| x.exp();
    smelt_unary_log: |x, _a| x.ln();
    smelt_unary_log1p: |x, _a| x.ln_1p();
    smelt_unary_expm1: |x, _a| x.exp_m1();
    smelt_unary_sin: |x, _a| x.sin();
    smelt_unary_cos: |x, _a| x.cos();
    smelt_unary_tanh: |x, _a| x.tanh();
    smelt_unary_sigmoid: |x, _a| sigmoid(x);
    smelt_unary_silu: |x, _a| silu(x);
    smelt_unary_erf: |x, _a| erf(x);
    smelt_unary_gelu: |x, a| gelu(x, a != 0.0);
    smelt_unary_gelu_slope: |x, a| gelu_slope(x, a != 0.0);
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
        assert_eq!(symbols().len(), 12);
    }
}
