//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use super::rule::{self, TensorOps};
use super::{Optimizer, check_param, check_params, grad_of};
use crate::runtime::Tensor;
use crate::{Result, bail};

/// Settings of `SGD`, PyTorch's defaults but for the learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SGDConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD).
    pub momentum: f64,
    /// Dampening of the momentum (`1 - dampening` scales each new gradient).
    pub dampening: f64,
    /// L2 penalty added to the gradient (`weight_decay * param`).
    pub weight_decay: f64,
    /// Nesterov momentum (needs momentum and zero dampening).
    pub nesterov: bool,
}

impl SGDConfig {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> SGDConfig {
        SGDConfig {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

/// `torch.optim.SGD`: with `g = grad + weight_decay·p`, the momentum buffer is `b = g` on
/// the first step and `b = momentum·b + (1 - dampening)·g` after; the update direction is
/// `g + momentum·b` (Nesterov) or `b`, and `p -= lr · direction` (`rule::sgd`, which the
/// compiled training step runs too).
pub struct SGD {
    params: Vec<Tensor>,
    config: SGDConfig,
    momentum_buffers: Vec<Option<Tensor>>,
}

impl SGD {
    /// An optimiser over `params`.
    pub fn new(params: Vec<Tensor>, config: SGDConfig) -> Result<SGD> {
        check_param(config.lr, "learning rate")?;
        check_param(config.momentum, "momentum value")?;
        check_param(config.weight_decay, "weight_decay value")?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            bail!(
                Value,
                "Nesterov momentum requires a momentum and zero dampening"
            );
        }
        check_params(&params)?;
        let n = params.len();
        Ok(SGD {
            params,
            config,
            momentum_buffers: vec![None; n],
        })
    }

    /// The settings.
    pub fn config(&self) -> &SGDConfig {
        &self.config
    }

    /// The momentum buffer of parameter `i`, once a step has created it.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.momentum_buffers.get(i).and_then(Option::as_ref)
    }
}

impl Optimizer for SGD {
    fn step(&mut self) -> Result<()> {
        let _g = crate::autograd::no_grad();
        let c = self.config;
        for (p, buf) in self.params.iter().zip(self.momentum_buffers.iter_mut()) {
            let Some(grad) = grad_of(p)? else {
                continue;
            };
            // the new parameter is written into `p` itself
            let (_, new_buf) = rule::sgd(&mut TensorOps, &c, p, &grad, buf.as_ref(), c.lr)?;
            *buf = match (buf.take(), new_buf) {
                // The buffer keeps its identity across steps, as PyTorch's does: a tensor
                // taken from `momentum_buffer` sees every later step.
                (Some(old), Some(b)) => {
                    old.copy_(&b)?;
                    Some(old)
                }
                // A fresh buffer: it must not alias the gradient it starts from.
                (None, Some(b)) => {
                    let own = Tensor::zeros(p.shape(), p.dtype());
                    own.copy_(&b)?;
                    Some(own)
                }
                (_, None) => None,
            };
        }
        Ok(())
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn lr(&self) -> f64 {
        self.config.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![super::lr_entry(self.config.lr)];
        for (i, b) in self.momentum_buffers.iter().enumerate() {
            if let Some(b) = b {
                out.push((format!("state.{i}.momentum_buffer"), b.clone()));
            }
        }
        out
    }
    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let loaded = super::split_state(state, &self.params, &["momentum_buffer"])?;
        let mut fresh = Vec::with_capacity(self.params.len());
        for (p, entries) in self.params.iter().zip(&loaded.per_param) {
            let buf = entries.iter().find(|(b, _)| *b == "momentum_buffer");
            fresh.push(buf.map(|(_, t)| super::buffer_from(p, t)).transpose()?);
        }
        self.momentum_buffers = fresh;
        if let Some(lr) = loaded.lr {
            self.config.lr = lr;
        }
        Ok(())
    }
}
