//! Optimisers (`torch.optim`): SGD, Adam and AdamW with PyTorch's update formulas.
//!
//! An optimiser holds the parameter tensors themselves (shared storage), reads their
//! `.grad` on `step()` and updates them in place with gradient recording off. Parameters
//! without a gradient are skipped, as in PyTorch.

mod adam;
mod grad_scaler;
pub(crate) mod rule;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW};
pub use grad_scaler::GradScaler;
pub use sgd::{SGD, SGDConfig};

use crate::runtime::Tensor;
use crate::{Result, bail};

/// What every optimiser offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    /// The parameters being optimised.
    fn params(&self) -> &[Tensor];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Changes the learning rate (what schedulers do).
    fn set_lr(&mut self, lr: f64);

    /// The state a resumed run needs, named as PyTorch's `optimizer.state_dict()` flattens
    /// it: `param_groups.0.lr`, then per parameter `i` that has state `state.{i}.step` and
    /// its buffers (`state.{i}.exp_avg`, `state.{i}.momentum_buffer`, ...). The buffers are
    /// the optimiser's own tensors, not copies. `nn::state_dict::save_safetensors` writes it.
    fn state_dict(&self) -> Vec<(String, Tensor)>;

    /// Restores what [`Optimizer::state_dict`] gave (the buffers are copied in; a parameter
    /// with no entries starts fresh). An unknown name, a parameter index out of range or a
    /// buffer whose shape is not its parameter's is an error that names it.
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()>;

    /// Clears every parameter's gradient (`zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for p in self.params() {
            p.set_grad(None);
        }
    }
}

/// The learning rate's entry of a state dict.
pub(crate) fn lr_entry(lr: f64) -> (String, Tensor) {
    (
        "param_groups.0.lr".into(),
        Tensor::from_vec(vec![lr], &[]).expect("one element"),
    )
}

/// A state dict split by parameter: the learning rate, if given, and for each parameter
/// index its named entries. `buffers` are the names a parameter's state may hold.
pub(crate) struct Loaded<'a> {
    pub lr: Option<f64>,
    pub per_param: Vec<Vec<(&'a str, &'a Tensor)>>,
}

/// Splits `state` for `params`, refusing unknown names, indices out of range and buffers
/// whose shape is not their parameter's.
pub(crate) fn split_state<'a>(
    state: &'a [(String, Tensor)],
    params: &[Tensor],
    buffers: &[&str],
) -> Result<Loaded<'a>> {
    let mut out = Loaded {
        lr: None,
        per_param: vec![Vec::new(); params.len()],
    };
    for (name, t) in state {
        if name == "param_groups.0.lr" {
            out.lr = Some(t.item_f64()?);
            continue;
        }
        let parsed = name
            .strip_prefix("state.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(i, b)| Some((i.parse::<usize>().ok()?, b)));
        let Some((i, buffer)) = parsed else {
            bail!(Value, "optimizer state: unknown entry '{name}'");
        };
        if buffer != "step" && !buffers.contains(&buffer) {
            bail!(Value, "optimizer state: unknown entry '{name}'");
        }
        let Some(p) = params.get(i) else {
            bail!(
                Value,
                "optimizer state: '{name}' is for parameter {i}, there are {}",
                params.len()
            );
        };
        if buffer != "step" && t.shape() != p.shape() {
            bail!(
                Shape,
                "optimizer state: '{name}' has shape {:?}, its parameter {:?}",
                t.shape(),
                p.shape()
            );
        }
        out.per_param[i].push((buffer, t));
    }
    Ok(out)
}

/// A fresh buffer for `p` holding `src`'s values (in `p`'s dtype).
pub(crate) fn buffer_from(p: &Tensor, src: &Tensor) -> Result<Tensor> {
    let own = Tensor::zeros(p.shape(), p.dtype());
    own.copy_(src)?;
    Ok(own)
}

pub(crate) fn check_param(value: f64, name: &str) -> Result<()> {
    if value.is_nan() || value < 0.0 {
        bail!(Value, "Invalid {name}: {value}");
    }
    Ok(())
}

/// Checks that every parameter is a floating-point tensor.
pub(crate) fn check_params(params: &[Tensor]) -> Result<()> {
    for p in params {
        if !p.dtype().is_float() {
            bail!(
                DType,
                "optimizer can only optimize Tensors of floating point dtype, but one of the params is {}",
                p.dtype().torch_name()
            );
        }
    }
    Ok(())
}

/// The gradient of `p` when it has one, checked against `p`'s shape.
pub(crate) fn grad_of(p: &Tensor) -> Result<Option<Tensor>> {
    match p.grad() {
        Some(g) if g.shape() != p.shape() => bail!(
            Shape,
            "the gradient of shape {:?} does not match its parameter of shape {:?}",
            g.shape(),
            p.shape()
        ),
        other => Ok(other),
    }
}
