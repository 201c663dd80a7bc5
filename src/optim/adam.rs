//! Adam and AdamW (decoupled weight decay), with optional AMSGrad.

use super::rule::{self, AdamScalars, AdamState, F32, TensorOps};
use super::{Optimizer, check_param, check_params, grad_of};
use crate::runtime::Tensor;
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

/// Per-parameter state: the step count and, once a step has made them, the moments
/// (zeros at first: contiguous, in storages of their own, as the one pass needs them).
#[derive(Default)]
struct State {
    step: u64,
    tensors: Option<AdamState<Tensor>>,
}

impl State {
    /// The moments of `p`, made on the first call.
    fn tensors(&mut self, p: &Tensor, amsgrad: bool) -> &AdamState<Tensor> {
        self.tensors
            .get_or_insert_with(|| AdamState::new(amsgrad, || Tensor::zeros(p.shape(), p.dtype())))
    }
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
        for (p, st) in self.params.iter().zip(self.state.iter_mut()) {
            let Some(grad) = grad_of(p)? else {
                continue;
            };
            st.step += 1;
            let k = AdamScalars::new(&c, self.decoupled, c.lr, st.step);
            let state = st.tensors(p, c.amsgrad).clone();
            if fused_f32(p, &grad, &state, &c, self.decoupled, k) {
                continue;
            }
            let (new_p, new) = rule::adam(&mut TensorOps, &c, self.decoupled, p, &grad, &state, k)?;
            // AdamW's decayed parameter is a tensor of its own
            if !new_p.shares_storage(p) {
                p.copy_(&new_p)?;
            }
            for (t, v) in state.iter().zip(new.iter()) {
                t.copy_(v)?;
            }
        }
        Ok(())
    }

    fn step_count(&self, i: usize) -> u64 {
        self.state.get(i).map_or(0, |s| s.step)
    }

    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![super::lr_entry(self.config.lr)];
        for (i, st) in self.state.iter().enumerate() {
            let Some(t) = &st.tensors else { continue };
            out.push((
                format!("state.{i}.step"),
                Tensor::from_vec(vec![st.step as i64], &[]).expect("one element"),
            ));
            let names = ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"];
            for (name, v) in names.iter().zip(t.iter()) {
                out.push((format!("state.{i}.{name}"), v.clone()));
            }
        }
        out
    }

    fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let names = ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"];
        let loaded = super::split_state(state, &self.params, &names)?;
        let mut fresh = Vec::with_capacity(self.params.len());
        for (p, entries) in self.params.iter().zip(&loaded.per_param) {
            let mut st = State::default();
            if !entries.is_empty() {
                let get = |n: &str| entries.iter().find(|(b, _)| *b == n).map(|(_, t)| *t);
                let Some(step) = get("step") else {
                    bail!(
                        Value,
                        "optimizer state: a parameter's buffers come without its step"
                    );
                };
                st.step = step.item_f64()? as u64;
                let buf = |n: &str| -> Result<Tensor> {
                    match get(n) {
                        Some(t) => super::buffer_from(p, t),
                        None => bail!(Value, "optimizer state: '{n}' is missing"),
                    }
                };
                let max = match (self.config.amsgrad, get("max_exp_avg_sq")) {
                    (true, _) => Some(buf("max_exp_avg_sq")?),
                    (false, None) => None,
                    (false, Some(_)) => bail!(
                        Value,
                        "optimizer state: max_exp_avg_sq given to an optimiser without AMSGrad"
                    ),
                };
                st.tensors = Some(AdamState {
                    exp_avg: buf("exp_avg")?,
                    exp_avg_sq: buf("exp_avg_sq")?,
                    max_exp_avg_sq: max,
                });
            }
            fresh.push(st);
        }
        self.state = fresh;
        if let Some(lr) = loaded.lr {
            self.config.lr = lr;
        }
        Ok(())
    }
}

/// The update of an f32 parameter in one pass over its elements: the rule on each element,
/// rounded to f32 as the tensor ops round ([`rule::F32`]), instead of a dozen tensor ops
/// that each read and write whole tensors (the optimiser's step was a seventh of an eager
/// GPT training step). False, with nothing done, unless the parameter and its gradient are
/// contiguous f32 tensors in storages of their own (the state is this optimiser's own
/// zeros: contiguous, in storages of their own).
fn fused_f32(
    p: &Tensor,
    g: &Tensor,
    s: &AdamState<Tensor>,
    c: &AdamConfig,
    decoupled: bool,
    k: AdamScalars<f64>,
) -> bool {
    use crate::ir::dtype::DType;
    let dense = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
    if !dense(p) || !dense(g) || p.shares_storage(g) {
        return false;
    }
    let n = p.numel();
    let writes: Vec<&Tensor> = std::iter::once(p).chain(s.iter()).collect();
    let acc = crate::runtime::access::lock(&[g], &writes);
    for t in &writes {
        t.storage().bump_version();
    }
    let k = k.map(|x| x as f32);
    // SAFETY: every tensor is a contiguous f32 tensor of `n` elements, locked above; `g`
    // is only read, and no two of the written ones share a storage.
    let (gs, ps, ms, vs, xs) = unsafe {
        let w = |i: usize| std::slice::from_raw_parts_mut(acc.write::<f32>(i), n);
        (
            std::slice::from_raw_parts(acc.read::<f32>(0), n),
            w(0),
            w(1),
            w(2),
            c.amsgrad.then(|| w(3)),
        )
    };
    let c = *c;
    let one = |p: f32, g: f32, state: AdamState<f32>| {
        let Ok(new) = rule::adam(&mut F32, &c, decoupled, &p, &g, &state, k) else {
            unreachable!("f32 arithmetic does not fail")
        };
        new
    };
    // one loop with AMSGrad and one without, so that neither asks per element (the compiler
    // vectorises both)
    match xs {
        Some(xs) => {
            for i in 0..n {
                let state = AdamState {
                    exp_avg: ms[i],
                    exp_avg_sq: vs[i],
                    max_exp_avg_sq: Some(xs[i]),
                };
                let (pv, new) = one(ps[i], gs[i], state);
                (ps[i], ms[i], vs[i]) = (pv, new.exp_avg, new.exp_avg_sq);
                if let Some(x) = new.max_exp_avg_sq {
                    xs[i] = x;
                }
            }
        }
        None => {
            for i in 0..n {
                let state = AdamState {
                    exp_avg: ms[i],
                    exp_avg_sq: vs[i],
                    max_exp_avg_sq: None,
                };
                let (pv, new) = one(ps[i], gs[i], state);
                (ps[i], ms[i], vs[i]) = (pv, new.exp_avg, new.exp_avg_sq);
            }
        }
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
            fn state_dict(&self) -> Vec<(String, Tensor)> {
                self.0.state_dict()
            }
            fn load_state_dict(&mut self, state: &[(String, Tensor)]) -> Result<()> {
                self.0.load_state_dict(state)
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
