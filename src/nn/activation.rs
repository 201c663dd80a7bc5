//! Activation modules: parameter-free wrappers of the pointwise ops.

use crate::nn::module::stateless_module;

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident $({ $($(#[$fdoc:meta])* $f:ident : f64 = $def:expr),+ })?
        => |$x:ident, $s:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            $($($(#[$fdoc])* pub $f: f64,)+)?
            training: bool,
        }

        impl Default for $name {
            /// PyTorch's defaults.
            fn default() -> Self {
                $name { $($($f: $def,)+)? training: true }
            }
        }

        impl $name {
            /// The module with PyTorch's defaults.
            pub fn new() -> $name {
                $name::default()
            }
            $(
            /// The module with these attributes (PyTorch's constructor arguments, in order).
            pub fn with($($f: f64),+) -> $name {
                $name { $($f,)+ training: true }
            }
            )?
        }

        stateless_module!($name, |$s, $x| $body);
    )*};
}

activation! {
    /// `max(x, 0)` (`nn.ReLU`).
    ReLU => |x, _s| x.relu();
    /// `x * sigmoid(x)` (`nn.SiLU`).
    SiLU => |x, _s| x.silu();
    /// `tanh(x)` (`nn.Tanh`).
    Tanh => |x, _s| x.tanh();
    /// `1 / (1 + e^-x)` (`nn.Sigmoid`).
    Sigmoid => |x, _s| x.sigmoid();
    /// `x > 0 ? x : negative_slope * x` (`nn.LeakyReLU`).
    LeakyReLU {
        /// Slope for negative inputs.
        negative_slope: f64 = 0.01
    } => |x, s| x.leaky_relu(s.negative_slope);
    /// `x > 0 ? x : alpha * (e^x - 1)` (`nn.ELU`).
    ELU {
        /// Scale of the negative part.
        alpha: f64 = 1.0
    } => |x, s| x.elu(s.alpha);
    /// `log(1 + e^(beta x)) / beta`, linear where `beta x > threshold` (`nn.Softplus`).
    Softplus {
        /// Sharpness.
        beta: f64 = 1.0,
        /// Above this `beta x` the result is `x`.
        threshold: f64 = 20.0
    } => |x, s| x.softplus(s.beta, s.threshold);
    /// `clamp(x, min_val, max_val)` (`nn.Hardtanh`).
    Hardtanh {
        /// Lower bound.
        min_val: f64 = -1.0,
        /// Upper bound.
        max_val: f64 = 1.0
    } => |x, s| x.hardtanh(s.min_val, s.max_val);
    /// `x * relu6(x + 3) / 6` (`nn.Hardswish`).
    Hardswish => |x, _s| x.hardswish();
    /// `x * tanh(softplus(x))` (`nn.Mish`).
    Mish => |x, _s| x.mish();
    /// `log(sigmoid(x))`, computed stably (`nn.LogSigmoid`).
    LogSigmoid => |x, _s| x.logsigmoid();
}

/// GELU (`nn.GELU`): the exact erf form, or the tanh approximation (`approximate="tanh"`).
#[derive(Clone, Debug)]
pub struct GELU {
    /// Use the tanh approximation.
    pub tanh_approximation: bool,
    training: bool,
}

impl Default for GELU {
    fn default() -> Self {
        GELU {
            tanh_approximation: false,
            training: true,
        }
    }
}

impl GELU {
    /// The exact GELU.
    pub fn new() -> GELU {
        GELU::default()
    }
    /// GELU with PyTorch's `approximate="tanh"` formula.
    pub fn tanh() -> GELU {
        GELU {
            tanh_approximation: true,
            training: true,
        }
    }
}

stateless_module!(GELU, |s, x| if s.tanh_approximation {
    x.gelu_tanh()
} else {
    x.gelu()
});
