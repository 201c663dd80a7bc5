//! Activation modules: parameter-free wrappers of the pointwise ops.

use crate::Result;
use crate::nn::Module;
use crate::runtime::Tensor;

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident, $s:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            training: bool,
        }

        impl Default for $name {
            fn default() -> Self {
                $name { training: true }
            }
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let $s = self;
                $body
            }
            fn named_parameters(&self) -> Vec<(String, Tensor)> {
                Vec::new()
            }
            fn train(&mut self, mode: bool) {
                self.training = mode;
            }
            fn is_training(&self) -> bool {
                self.training
            }
        }
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
}

impl ReLU {
    /// A new ReLU module.
    pub fn new() -> ReLU {
        ReLU::default()
    }
}
impl SiLU {
    /// A new SiLU module.
    pub fn new() -> SiLU {
        SiLU::default()
    }
}
impl Tanh {
    /// A new Tanh module.
    pub fn new() -> Tanh {
        Tanh::default()
    }
}
impl Sigmoid {
    /// A new Sigmoid module.
    pub fn new() -> Sigmoid {
        Sigmoid::default()
    }
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

impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.tanh_approximation {
            x.gelu_tanh()
        } else {
            x.gelu()
        }
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
    fn is_training(&self) -> bool {
        self.training
    }
}
