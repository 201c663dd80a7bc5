//! Weight initialisation (`torch.nn.init`): in-place fills with PyTorch's fan and gain rules.
//!
//! Every fill draws from the global generator (`smelt::manual_seed`) and runs with gradient
//! recording off, as PyTorch's initialisers do.

use crate::runtime::Tensor;
use crate::runtime::random::with_global;
use crate::{Result, bail};

/// Which fan the Kaiming initialisers preserve the variance of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    /// Preserve the variance of the forward pass (`mode="fan_in"`).
    FanIn,
    /// Preserve the variance of the backward pass (`mode="fan_out"`).
    FanOut,
}

/// The non-linearities `calculate_gain` knows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    /// Identity (gain 1).
    Linear,
    /// Sigmoid (gain 1).
    Sigmoid,
    /// Tanh (gain 5/3).
    Tanh,
    /// ReLU (gain √2).
    Relu,
    /// Leaky ReLU with this negative slope (PyTorch's default is 0.01).
    LeakyRelu(f64),
    /// SELU (gain 3/4).
    Selu,
}

/// The recommended gain for a non-linearity (`nn.init.calculate_gain`).
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight: dims 1 and 0 times the receptive field (the product of
/// the remaining dims), as `_calculate_fan_in_and_fan_out`.
pub fn calculate_fan_in_and_fan_out(t: &Tensor) -> Result<(usize, usize)> {
    if t.dim() < 2 {
        bail!(
            Value,
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        );
    }
    let receptive: usize = t.shape()[2..].iter().product();
    Ok((t.shape()[1] * receptive, t.shape()[0] * receptive))
}

fn fan(t: &Tensor, mode: FanMode) -> Result<usize> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    Ok(match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    })
}

fn require_float(t: &Tensor, name: &str) -> Result<()> {
    if !t.dtype().is_float() {
        bail!(
            DType,
            "{name}: expected a floating-point tensor, got {}",
            t.dtype().torch_name()
        );
    }
    Ok(())
}

/// Fills `t` with samples of U(low, high) (`nn.init.uniform_`).
pub fn uniform_(t: &Tensor, low: f64, high: f64) -> Result<&Tensor> {
    require_float(t, "uniform_")?;
    if low > high {
        bail!(
            Value,
            "uniform_ expects to return a [from, to) range, but found from={low} > to={high}"
        );
    }
    let _g = crate::autograd::no_grad();
    let u = with_global(|g| Tensor::rand_with(t.shape(), Some(crate::DType::F64), g))?;
    t.copy_(&u.mul_scalar(high - low)?.add_scalar(low)?)
}

/// Fills `t` with samples of N(mean, std²) (`nn.init.normal_`).
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<&Tensor> {
    require_float(t, "normal_")?;
    if std.is_nan() || std < 0.0 {
        bail!(Value, "normal expects std >= 0.0, but found std {std}");
    }
    let _g = crate::autograd::no_grad();
    let n = with_global(|g| Tensor::randn_with(t.shape(), Some(crate::DType::F64), g))?;
    t.copy_(&n.mul_scalar(std)?.add_scalar(mean)?)
}

/// Fills `t` with `value` (`nn.init.constant_`).
pub fn constant_(t: &Tensor, value: f64) -> Result<&Tensor> {
    let _g = crate::autograd::no_grad();
    t.fill_(value)
}

/// Fills `t` with zeros (`nn.init.zeros_`).
pub fn zeros_(t: &Tensor) -> Result<&Tensor> {
    let _g = crate::autograd::no_grad();
    t.fill_(0)
}

/// Fills `t` with ones (`nn.init.ones_`).
pub fn ones_(t: &Tensor) -> Result<&Tensor> {
    let _g = crate::autograd::no_grad();
    t.fill_(1)
}

/// Xavier/Glorot uniform: U(-a, a) with `a = gain * sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<&Tensor> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    let std = gain * (2.0 / (fan_in + fan_out) as f64).sqrt();
    let a = 3f64.sqrt() * std;
    uniform_(t, -a, a)
}

/// Xavier/Glorot normal: N(0, std²) with `std = gain * sqrt(2 / (fan_in + fan_out))`.
pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<&Tensor> {
    let (fan_in, fan_out) = calculate_fan_in_and_fan_out(t)?;
    let std = gain * (2.0 / (fan_in + fan_out) as f64).sqrt();
    normal_(t, 0.0, std)
}

/// Kaiming/He uniform: U(-b, b) with `b = gain * sqrt(3 / fan)`, where the gain is that of
/// `nonlinearity` (`a` is the leaky-ReLU slope when `nonlinearity` is `LeakyRelu`, as in
/// PyTorch's `kaiming_uniform_(t, a, mode, nonlinearity)`).
pub fn kaiming_uniform_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<&Tensor> {
    if t.numel() == 0 {
        // PyTorch warns that initialising an empty tensor is a no-op.
        calculate_fan_in_and_fan_out(t)?;
        return Ok(t);
    }
    let bound = kaiming_std(t, a, mode, nonlinearity)? * 3f64.sqrt();
    uniform_(t, -bound, bound)
}

/// Kaiming/He normal: N(0, std²) with `std = gain / sqrt(fan)`.
pub fn kaiming_normal_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<&Tensor> {
    if t.numel() == 0 {
        calculate_fan_in_and_fan_out(t)?;
        return Ok(t);
    }
    let std = kaiming_std(t, a, mode, nonlinearity)?;
    normal_(t, 0.0, std)
}

fn kaiming_std(t: &Tensor, a: f64, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f64> {
    let fan = fan(t, mode)?;
    let nonlinearity = match nonlinearity {
        Nonlinearity::LeakyRelu(_) => Nonlinearity::LeakyRelu(a),
        other => other,
    };
    Ok(calculate_gain(nonlinearity) / (fan as f64).sqrt())
}
