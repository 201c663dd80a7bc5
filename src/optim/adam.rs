//! Adam and AdamW (decoupled weight decay), with optional AMSGrad.

use super::{Optimizer, check_param, check_params, grad_of};
use crate::runtime::Tensor;
use crate::runtime::kernels::pointwise::max_nan;
use crate::{Result, bail};

/// Settings of `Adam`/`AdamW`; `Default` is PyTorch's defaults (lr 1e-3, betas
/// (0.9, 0.999), eps 1e-8, and each optimiser's own weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay rates of the running averages of the gradient and of its square.
    pub betas: (f64, f64),
    /// Added to the denominator for numerical stability.
    pub eps: f64,
    /// `None`: PyTorch's default of the optimiser, 0 for `Adam` and 1e-2 for `AdamW`.
    pub weight_decay: Option<f64>,
    /// Use the maximum of past squared-gradient averages (AMSGrad).
    pub amsgrad: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: None,
            amsgrad: false,
        }
    }
}

impl AdamConfig {
    /// The defaults with learning rate `lr`.
    pub fn new(lr: f64) -> AdamConfig {
        AdamConfig {
            lr,
            ..Default::default()
        }
    }

    /// The weight decay in force: the one set, else PyTorch's default for the optimiser.
    pub fn weight_decay_for(&self, decoupled: bool) -> f64 {
        self.weight_decay
            .unwrap_or(if decoupled { 1e-2 } else { 0.0 })
    }

    fn check(&self) -> Result<()> {
        check_param(self.lr, "learning rate")?;
        check_param(self.eps, "epsilon value")?;
        if let Some(wd) = self.weight_decay {
            check_param(wd, "weight_decay value")?;
        }
        for (i, b) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&b) {
                bail!(Value, "Invalid beta parameter at index {i}: {b}");
            }
        }
        Ok(())
    }
}

/// Per-parameter state: step count, first and second moments, and their running max.
#[derive(Default)]
struct State {
    step: u64,
    exp_avg: Option<Tensor>,
    exp_avg_sq: Option<Tensor>,
    max_exp_avg_sq: Option<Tensor>,
}

/// The shared update; `decoupled` selects AdamW's weight decay.
struct AdamCore {
    params: Vec<Tensor>,
    config: AdamConfig,
    state: Vec<State>,
    decoupled: bool,
}

impl AdamCore {
    fn new(params: Vec<Tensor>, config: AdamConfig, decoupled: bool) -> Result<AdamCore> {
        config.check()?;
        check_params(&params)?;
        let state = params.iter().map(|_| State::default()).collect();
        Ok(AdamCore {
            params,
            config,
            state,
            decoupled,
        })
    }

    fn step(&mut self) -> Result<()> {
        let _g = crate::autograd::no_grad();
        let c = self.config;
        let (b1, b2) = c.betas;
        for (p, st) in self.params.iter().zip(self.state.iter_mut()) {
            let Some(raw_grad) = grad_of(p)? else {
                continue;
            };
            st.step += 1;
            let wd = c.weight_decay_for(self.decoupled);
            let zeros = || Tensor::zeros(p.shape(), p.dtype());
            let t = st.step as i32;
            let bias_correction1 = 1.0 - b1.powi(t);
            let bias_correction2 = 1.0 - b2.powi(t);
            let k = Coeffs {
                decay: (self.decoupled && wd != 0.0).then_some(1.0 - c.lr * wd),
                l2: (!self.decoupled && wd != 0.0).then_some(wd),
                betas: (b1, b2),
                root_bc2: bias_correction2.sqrt(),
                eps: c.eps,
                step_size: c.lr / bias_correction1,
            };
            if fused_f32(p, &raw_grad, st, c.amsgrad, &k) {
                continue;
            }
            let mut grad = raw_grad;
            if let Some(d) = k.decay {
                p.mul_scalar_(d)?;
            }
            if let Some(wd) = k.l2 {
                grad = grad.add(&p.mul_scalar(wd)?)?;
            }
            let m = st.exp_avg.get_or_insert_with(zeros);
            m.mul_scalar_(b1)?.add_(&grad.mul_scalar(1.0 - b1)?)?;
            let v = st.exp_avg_sq.get_or_insert_with(zeros);
            v.mul_scalar_(b2)?
                .add_(&grad.square()?.mul_scalar(1.0 - b2)?)?;
            let second = if c.amsgrad {
                let vmax = st.max_exp_avg_sq.get_or_insert_with(zeros);
                vmax.copy_(&vmax.maximum(v)?)?;
                vmax.clone()
            } else {
                v.clone()
            };
            let denom = second.sqrt()?.div_scalar(k.root_bc2)?.add_scalar(c.eps)?;
            p.sub_(&m.div(&denom)?.mul_scalar(k.step_size)?)?;
        }
        Ok(())
    }

    fn step_count(&self, i: usize) -> u64 {
        self.state.get(i).map_or(0, |s| s.step)
    }
}

/// The scalars of one parameter's update.
struct Coeffs {
    /// AdamW: `p *= decay` first.
    decay: Option<f64>,
    /// Adam's weight decay: `g += l2·p`.
    l2: Option<f64>,
    betas: (f64, f64),
    /// `sqrt(1 - β2ᵗ)`.
    root_bc2: f64,
    eps: f64,
    /// `lr / (1 - β1ᵗ)`.
    step_size: f64,
}

/// The update of an f32 parameter in one pass over its elements: the tensor path's ops in
/// its order, each rounded to f32 as the tensor ops round, instead of a dozen tensor ops
/// that each read and write whole tensors (the optimiser's step was a seventh of an eager
/// GPT training step). The state is created here on the first step. False, with nothing
/// done, unless the parameter and its gradient are contiguous f32 tensors in storages of
/// their own (the state is this optimiser's own zeros: contiguous, in storages of its own).
fn fused_f32(p: &Tensor, g: &Tensor, st: &mut State, amsgrad: bool, k: &Coeffs) -> bool {
    use crate::ir::dtype::DType;
    let dense = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
    if !dense(p) || !dense(g) || p.shares_storage(g) {
        return false;
    }
    let fresh = || Tensor::zeros(p.shape(), DType::F32);
    let m = st.exp_avg.get_or_insert_with(fresh).clone();
    let v = st.exp_avg_sq.get_or_insert_with(fresh).clone();
    let vmax = amsgrad.then(|| st.max_exp_avg_sq.get_or_insert_with(fresh).clone());
    let n = p.numel();
    let writes: Vec<&Tensor> = [p, &m, &v].into_iter().chain(vmax.as_ref()).collect();
    let acc = crate::runtime::access::lock(&[g], &writes);
    for t in &writes {
        t.storage().bump_version();
    }
    let f = |x: f64| x as f32;
    let (b1, b2) = (f(k.betas.0), f(k.betas.1));
    let (c1, c2) = (f(1.0 - k.betas.0), f(1.0 - k.betas.1));
    let (decay, l2) = (k.decay.map(f), k.l2.map(f));
    let (root_bc2, eps, step) = (f(k.root_bc2), f(k.eps), f(k.step_size));
    // SAFETY: every tensor is a contiguous f32 tensor of `n` elements, locked above; `g`
    // is only read, and no two of the written ones share a storage.
    let (gs, ps, ms, vs, mut xs) = unsafe {
        let w = |i: usize| std::slice::from_raw_parts_mut(acc.write::<f32>(i), n);
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n),
            w(0),
            w(1),
            w(2),
            amsgrad.then(|| w(3)),
        )
    };
    for i in 0..n {
        let mut pv = ps[i];
        let mut gv = gs[i];
        if let Some(d) = decay {
            pv *= d;
        }
        if let Some(wd) = l2 {
            gv += pv * wd;
        }
        let mv = ms[i] * b1 + gv * c1;
        let vv = vs[i] * b2 + gv * gv * c2;
        // `maximum(vmax, v)` of the tensor path, NaN and the sign of zero included
        let second = match &xs {
            Some(xs) => max_nan(f64::from(xs[i]), f64::from(vv)) as f32,
            None => vv,
        };
        if let Some(xs) = xs.as_deref_mut() {
            xs[i] = second;
        }
        let denom = second.sqrt() / root_bc2 + eps;
        ps[i] = pv - mv / denom * step;
        ms[i] = mv;
        vs[i] = vv;
    }
    true
}

macro_rules! adam_optimizer {
    ($(#[$doc:meta])* $name:ident, $decoupled:expr) => {
        $(#[$doc])*
        pub struct $name(AdamCore);

        impl $name {
            /// An optimiser over `params`.
            pub fn new(params: Vec<Tensor>, config: AdamConfig) -> Result<$name> {
                AdamCore::new(params, config, $decoupled).map($name)
            }
            /// The settings.
            pub fn config(&self) -> &AdamConfig {
                &self.0.config
            }
            /// The weight decay in force (the default's value when none was set).
            pub fn weight_decay(&self) -> f64 {
                self.0.config.weight_decay_for($decoupled)
            }
            /// How many steps parameter `i` has taken.
            pub fn step_count(&self, i: usize) -> u64 {
                self.0.step_count(i)
            }
        }

        impl Optimizer for $name {
            fn step(&mut self) -> Result<()> {
                self.0.step()
            }
            fn params(&self) -> &[Tensor] {
                &self.0.params
            }
            fn lr(&self) -> f64 {
                self.0.config.lr
            }
            fn set_lr(&mut self, lr: f64) {
                self.0.config.lr = lr;
            }
        }
    };
}

adam_optimizer!(
    /// `torch.optim.Adam`: `g += weight_decay·p`; `m = β1·m + (1-β1)·g`,
    /// `v = β2·v + (1-β2)·g²`; `p -= lr/(1-β1ᵗ) · m / (sqrt(v)/sqrt(1-β2ᵗ) + eps)`, with `v`
    /// replaced by its running maximum under AMSGrad.
    Adam,
    false
);

adam_optimizer!(
    /// `torch.optim.AdamW`: Adam with decoupled weight decay, `p *= 1 - lr·weight_decay`
    /// before the Adam update; weight decay 1e-2 unless the config sets one, as PyTorch.
    AdamW,
    true
);
