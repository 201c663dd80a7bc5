//! The graph of a compiled training step: the traced loss, its gradients (autodiff), and on
//! top the optimiser's update written with the same operations, in the same order, as the
//! eager optimiser computes it, so the compiled step gives the eager step's numbers.
//!
//! Inputs of a step graph, in order: the data inputs, the parameters, the buffers (batch
//! norm's running statistics: state the forward reads and may write), then per updated
//! parameter the accumulated gradient (with accumulation), then per updated parameter the
//! optimiser's state (SGD: the momentum buffer; Adam: `exp_avg`, `exp_avg_sq` and, with
//! AMSGrad, `max_exp_avg_sq`), then the per-step scalars ([`StepConfig::scalars`]), 0-d
//! f64 values computed on the host each step (so a learning-rate schedule or Adam's bias
//! corrections never recompile).
//!
//! Outputs: the loss; then either the new accumulated gradients (a micro-batch that does not
//! update), or the updated parameters and the new state in input order; then, with
//! clipping, the gradients' total norm before clipping; then the new values of the buffers
//! the forward writes, in the buffers' order.

use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use crate::optim::{AdamConfig, SGDConfig};
use crate::passes::autodiff::autodiff;
use crate::{Result, bail};

/// The optimiser a compiled step applies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StepOptimizer {
    /// `torch.optim.SGD` (momentum, dampening, weight decay, Nesterov).
    Sgd(SGDConfig),
    /// `torch.optim.Adam` (L2 weight decay added to the gradient; AMSGrad).
    Adam(AdamConfig),
    /// `torch.optim.AdamW` (decoupled weight decay).
    AdamW(AdamConfig),
}

impl StepOptimizer {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            StepOptimizer::Sgd(c) => c.lr,
            StepOptimizer::Adam(c) | StepOptimizer::AdamW(c) => c.lr,
        }
    }

    /// Names of the state tensors kept per updated parameter.
    pub fn state_names(&self) -> &'static [&'static str] {
        match self {
            StepOptimizer::Sgd(c) if c.momentum != 0.0 => &["momentum_buffer"],
            StepOptimizer::Sgd(_) => &[],
            StepOptimizer::Adam(c) | StepOptimizer::AdamW(c) if c.amsgrad => {
                &["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
            }
            StepOptimizer::Adam(_) | StepOptimizer::AdamW(_) => &["exp_avg", "exp_avg_sq"],
        }
    }
}

/// A learning-rate schedule: the rate of each optimiser step, computed on the host and
/// passed to the compiled step as an input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    /// The optimiser's rate at every step.
    Constant,
    /// Linear warmup to the base rate over `warmup_steps` (step `s` < `warmup_steps` has
    /// `base · (s + 1) / warmup_steps`), then a half cosine down to `min_lr` at
    /// `total_steps`, and `min_lr` after.
    WarmupCosine {
        /// Steps of linear warmup.
        warmup_steps: u64,
        /// The step at which the cosine reaches `min_lr`.
        total_steps: u64,
        /// The final rate.
        min_lr: f64,
    },
}

impl LrSchedule {
    /// The rate of optimiser step `step` (counted from 0) for base rate `base`.
    pub fn lr(&self, base: f64, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant => base,
            LrSchedule::WarmupCosine {
                warmup_steps,
                total_steps,
                min_lr,
            } => {
                if step < warmup_steps {
                    return base * (step + 1) as f64 / warmup_steps as f64;
                }
                let span = total_steps.saturating_sub(warmup_steps).max(1) as f64;
                let progress = ((step - warmup_steps) as f64 / span).min(1.0);
                min_lr + (base - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// Everything a compiled step does after the backward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepConfig {
    /// The update.
    pub optimizer: StepOptimizer,
    /// Scale the gradients so that their joint 2-norm is at most this
    /// (`torch.nn.utils.clip_grad_norm_`), after accumulation.
    pub clip_grad_norm: Option<f64>,
    /// The learning rate of each step.
    pub schedule: LrSchedule,
    /// Micro-batches per optimiser step: each call runs one micro-batch and adds its
    /// gradient, the loss divided by this (so the update is the one of the whole batch
    /// when the loss is a mean); the last one of each group also updates.
    pub accumulation_steps: usize,
    /// Data-parallel training: average the gradients over the default process group
    /// (`distributed`) before clipping and the update, in buckets of at most this many
    /// bytes (parameters in reverse order, as `DistributedDataParallel`), one `all_reduce`
    /// step of the compiled graph each. Micro-batches that only accumulate do not
    /// communicate.
    pub all_reduce_bucket_bytes: Option<usize>,
}

impl StepConfig {
    /// SGD, no clipping, a constant rate, one batch per step.
    pub fn sgd(c: SGDConfig) -> StepConfig {
        StepConfig::with(StepOptimizer::Sgd(c))
    }
    /// Adam, no clipping, a constant rate, one batch per step.
    pub fn adam(c: AdamConfig) -> StepConfig {
        StepConfig::with(StepOptimizer::Adam(c))
    }
    /// AdamW, no clipping, a constant rate, one batch per step.
    pub fn adamw(c: AdamConfig) -> StepConfig {
        StepConfig::with(StepOptimizer::AdamW(c))
    }
    fn with(optimizer: StepOptimizer) -> StepConfig {
        StepConfig {
            optimizer,
            clip_grad_norm: None,
            schedule: LrSchedule::Constant,
            accumulation_steps: 1,
            all_reduce_bucket_bytes: None,
        }
    }
    /// With gradient clipping by global 2-norm.
    pub fn clip_grad_norm(mut self, max_norm: f64) -> StepConfig {
        self.clip_grad_norm = Some(max_norm);
        self
    }
    /// With a learning-rate schedule.
    pub fn schedule(mut self, s: LrSchedule) -> StepConfig {
        self.schedule = s;
        self
    }
    /// With `n` micro-batches per optimiser step.
    pub fn accumulate(mut self, n: usize) -> StepConfig {
        self.accumulation_steps = n;
        self
    }
    /// With the gradients averaged over the default process group before the update, in
    /// buckets of `DistributedDataParallel`'s default size (25 MB).
    pub fn all_reduce_gradients(self) -> StepConfig {
        self.all_reduce_bucket_bytes(
            (crate::distributed::DEFAULT_BUCKET_MB * 1024.0 * 1024.0) as usize,
        )
    }
    /// With the gradients averaged over the default process group in buckets of at most
    /// `bytes` (a gradient larger than that is a bucket of its own).
    pub fn all_reduce_bucket_bytes(mut self, bytes: usize) -> StepConfig {
        self.all_reduce_bucket_bytes = Some(bytes);
        self
    }

    /// Checks the settings with the eager optimisers' messages.
    pub fn check(&self) -> Result<()> {
        if self.accumulation_steps == 0 {
            bail!(Value, "accumulation_steps must be at least 1");
        }
        if let Some(m) = self.clip_grad_norm
            && (m.is_nan() || m < 0.0)
        {
            bail!(
                Value,
                "clip_grad_norm: max_norm must be non-negative, got {m}"
            );
        }
        if let LrSchedule::WarmupCosine { min_lr, .. } = self.schedule
            && (min_lr.is_nan() || min_lr < 0.0)
        {
            bail!(Value, "Invalid learning rate: {min_lr}");
        }
        Ok(())
    }

    /// Whether the rate is a graph input (else it is baked into the graph).
    fn lr_is_input(&self) -> bool {
        !matches!(
            (self.optimizer, self.schedule),
            (StepOptimizer::Sgd(_), LrSchedule::Constant)
        )
    }

    /// The names of the per-step scalar inputs of an updating graph.
    pub fn scalar_names(&self) -> Vec<&'static str> {
        match self.optimizer {
            StepOptimizer::Sgd(_) if self.lr_is_input() => vec!["lr"],
            StepOptimizer::Sgd(_) => vec![],
            StepOptimizer::Adam(_) | StepOptimizer::AdamW(_) => {
                vec!["step_size", "bias_correction2_sqrt", "decay"]
            }
        }
    }

    /// The per-step scalars of optimiser step `step` (counted from 0), in the order of
    /// [`StepConfig::scalar_names`], computed as the eager optimiser computes them.
    pub fn scalars(&self, step: u64) -> Vec<f64> {
        let lr = self.schedule.lr(self.optimizer.lr(), step);
        match self.optimizer {
            StepOptimizer::Sgd(_) if self.lr_is_input() => vec![lr],
            StepOptimizer::Sgd(_) => vec![],
            StepOptimizer::Adam(c) | StepOptimizer::AdamW(c) => {
                let t = (step + 1) as i32;
                let (b1, b2) = c.betas;
                let bias_correction1 = 1.0 - b1.powi(t);
                let bias_correction2 = 1.0 - b2.powi(t);
                let decoupled = matches!(self.optimizer, StepOptimizer::AdamW(_));
                let wd = c.weight_decay_for(decoupled);
                vec![
                    lr / bias_correction1,
                    bias_correction2.sqrt(),
                    1.0 - lr * wd,
                ]
            }
        }
    }
}

/// Which graph of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A micro-batch that adds its gradient to the accumulated one and does not update.
    Accumulate,
    /// The update. `first_step`: SGD with momentum and dampening starts its buffers from
    /// the gradient (the graph takes no buffers then).
    Update {
        /// The first optimiser step of SGD with dampening.
        first_step: bool,
    },
}

/// Whether each input of `g` reaches one of its outputs.
fn reaches_output(g: &Graph) -> Vec<bool> {
    let order = g.topo_order();
    let mut live: std::collections::HashSet<ValueId> = g.outputs().iter().copied().collect();
    for &v in order.iter().rev() {
        if live.contains(&v) {
            live.extend(g.operands(v));
        }
    }
    g.inputs().iter().map(|v| live.contains(v)).collect()
}

/// The step graph of a traced loss `forward` (inputs: `n_inputs` data inputs, then the
/// parameters named `params`, then any buffers; outputs: the scalar loss, then the new
/// values of the buffers the forward writes, at most one per buffer) for `phase` (see the
/// module's text for its inputs and outputs; the buffers' new values come last). Also
/// returns which parameters are updated (those the loss depends on; the others are left
/// alone, as the eager optimisers skip parameters without a gradient).
pub fn build_update_graph(
    forward: &Graph,
    n_inputs: usize,
    params: &[String],
    cfg: &StepConfig,
    phase: Phase,
) -> Result<(Graph, Vec<bool>)> {
    cfg.check()?;
    let n_fixed = n_inputs + params.len();
    let (n_in, n_out) = (forward.inputs().len(), forward.outputs().len());
    if n_in < n_fixed || n_out == 0 || n_out - 1 > n_in - n_fixed {
        bail!(
            Value,
            "a step graph needs {n_fixed} inputs and one output (then buffers and their new values), graph {} has {n_in} and {n_out}",
            forward.name,
        );
    }
    // Only the loss is differentiated; the buffers' new values ride along to the end.
    let carried = forward.outputs()[1..].to_vec();
    let mut forward = forward.clone();
    forward.set_outputs(vec![forward.outputs()[0]]);
    let updated: Vec<bool> = reaches_output(&forward)[n_inputs..n_fixed].to_vec();
    let wrt: Vec<&str> = params
        .iter()
        .zip(&updated)
        .filter(|(_, u)| **u)
        .map(|(n, _)| n.as_str())
        .collect();
    let mut g = autodiff(&forward, &wrt)?;
    let loss = g.outputs()[0];
    let mut grads: Vec<ValueId> = g.outputs()[1..].to_vec();
    let p: Vec<ValueId> = wrt
        .iter()
        .map(|n| {
            g.value(n)
                .ok_or_else(|| crate::Error::Value(format!("step graph: no parameter %{n}")))
        })
        .collect::<Result<_>>()?;

    // accumulation: each micro-batch adds gradient / n
    let n = cfg.accumulation_steps;
    if n > 1 {
        for (i, name) in wrt.iter().enumerate() {
            let ty = g.node(p[i]).ty.clone();
            let acc = g.add_input(&format!("grad_acc.{name}"), ty)?;
            let part = scaled(&mut g, grads[i], 1.0 / n as f64)?;
            grads[i] = bin(&mut g, BinaryOp::Add, acc, part)?;
        }
    }
    if phase == Phase::Accumulate {
        let mut outputs = vec![loss];
        for (name, &gr) in wrt.iter().zip(&grads) {
            outputs.push(g.add_op_named(Op::Contiguous, &[gr], &format!("new_grad_acc.{name}"))?);
        }
        outputs.extend(&carried);
        g.set_outputs(outputs);
        g.verify()?;
        return Ok((g, updated));
    }

    if let Some(cap) = cfg.all_reduce_bucket_bytes {
        all_reduce_buckets(&mut g, &mut grads, cap)?;
    }

    let first_step = phase == Phase::Update { first_step: true };
    // state inputs, per parameter in the optimiser's order
    let state_names = match cfg.optimizer {
        StepOptimizer::Sgd(c) if c.momentum != 0.0 && first_step => &[][..],
        o => o.state_names(),
    };
    let mut state: Vec<Vec<ValueId>> = Vec::with_capacity(wrt.len());
    for (i, name) in wrt.iter().enumerate() {
        let ty = g.node(p[i]).ty.clone();
        let mut s = Vec::new();
        for sn in state_names {
            s.push(g.add_input(&format!("{sn}.{name}"), ty.clone())?);
        }
        state.push(s);
    }
    let scalar_ty = TensorType::new(DType::F64, vec![]);
    let mut scalars = Vec::new();
    for sn in cfg.scalar_names() {
        scalars.push(g.add_input(sn, scalar_ty.clone())?);
    }

    // clipping by global norm, as clip_grad_norm_: the norm in f64
    let mut norm = None;
    if let Some(max_norm) = cfg.clip_grad_norm {
        let mut total = None;
        for &gr in &grads {
            let wide = g.add_op(Op::To { dtype: DType::F64 }, &[gr])?;
            let sq = g.add_op(Op::Unary(UnaryOp::Square), &[wide])?;
            let s = g.add_op(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    dim: None,
                    keepdim: false,
                },
                &[sq],
            )?;
            total = Some(match total {
                None => s,
                Some(t) => bin(&mut g, BinaryOp::Add, t, s)?,
            });
        }
        if let Some(t) = total {
            let nrm = g.add_op(Op::Unary(UnaryOp::Sqrt), &[t])?;
            let eps = g.add_scalar(Scalar::Float(1e-6))?;
            let den = bin(&mut g, BinaryOp::Add, nrm, eps)?;
            let mx = g.add_scalar(Scalar::Float(max_norm))?;
            let coef = bin(&mut g, BinaryOp::Div, mx, den)?;
            let coef = g.add_op(
                Op::Clamp {
                    min: None,
                    max: Some(Scalar::Float(1.0)),
                },
                &[coef],
            )?;
            for gr in grads.iter_mut() {
                *gr = bin(&mut g, BinaryOp::Mul, *gr, coef)?;
            }
            norm = Some(nrm);
        }
    }

    let mut new_params = Vec::with_capacity(wrt.len());
    let mut new_state = Vec::new();
    for (i, name) in wrt.iter().enumerate() {
        let (pi, gi) = (p[i], grads[i]);
        let (base, step, ns) = match cfg.optimizer {
            StepOptimizer::Sgd(c) => sgd(&mut g, c, pi, gi, &state[i], &scalars, first_step)?,
            StepOptimizer::Adam(c) => adam(&mut g, c, false, pi, gi, &state[i], &scalars)?,
            StepOptimizer::AdamW(c) => adam(&mut g, c, true, pi, gi, &state[i], &scalars)?,
        };
        // `p.sub_(step)`: the executor can write it into the parameter itself
        let sub = Op::Binary(BinaryOp::Sub);
        new_params.push(g.add_op_named(sub, &[base, step], &format!("new.{name}"))?);
        for (sn, v) in cfg.optimizer.state_names().iter().zip(ns) {
            // a state that is the gradient itself still gets its own output buffer
            new_state.push(g.add_op_named(Op::Contiguous, &[v], &format!("new_{sn}.{name}"))?);
        }
    }
    let mut outputs = vec![loss];
    outputs.extend(new_params);
    outputs.extend(new_state);
    outputs.extend(norm);
    outputs.extend(carried);
    g.set_outputs(outputs);
    g.verify()?;
    Ok((g, updated))
}

/// What an update computes for one parameter: the value the step is subtracted from (the
/// parameter, or AdamW's decayed parameter), the step, and the new state.
type Update = (ValueId, ValueId, Vec<ValueId>);

/// `optim::SGD::step` for one parameter (with momentum, the new buffer as state).
fn sgd(
    g: &mut Graph,
    c: SGDConfig,
    p: ValueId,
    grad: ValueId,
    state: &[ValueId],
    scalars: &[ValueId],
    first_step: bool,
) -> Result<Update> {
    let mut d = grad;
    if c.weight_decay != 0.0 {
        let wd = scaled(g, p, c.weight_decay)?;
        d = bin(g, BinaryOp::Add, d, wd)?;
    }
    let mut bufs = Vec::new();
    if c.momentum != 0.0 {
        let b = if first_step {
            d
        } else {
            let kept = scaled(g, state[0], c.momentum)?;
            let fresh = scaled(g, d, 1.0 - c.dampening)?;
            bin(g, BinaryOp::Add, kept, fresh)?
        };
        d = if c.nesterov {
            let m = scaled(g, b, c.momentum)?;
            bin(g, BinaryOp::Add, d, m)?
        } else {
            b
        };
        bufs.push(b);
    }
    let step = match scalars.first() {
        Some(&lr) => bin(g, BinaryOp::Mul, d, lr)?,
        None => scaled(g, d, c.lr)?,
    };
    Ok((p, step, bufs))
}

/// `optim::Adam`/`AdamW::step` for one parameter (the new moments as state).
fn adam(
    g: &mut Graph,
    c: AdamConfig,
    decoupled: bool,
    p: ValueId,
    grad: ValueId,
    state: &[ValueId],
    scalars: &[ValueId],
) -> Result<Update> {
    let (step_size, bc2_sqrt, decay) = (scalars[0], scalars[1], scalars[2]);
    let (b1, b2) = c.betas;
    let wd = c.weight_decay_for(decoupled);
    let mut p = p;
    let mut grad = grad;
    if wd != 0.0 {
        if decoupled {
            p = bin(g, BinaryOp::Mul, p, decay)?;
        } else {
            let d = scaled(g, p, wd)?;
            grad = bin(g, BinaryOp::Add, grad, d)?;
        }
    }
    let m_kept = scaled(g, state[0], b1)?;
    let m_new = scaled(g, grad, 1.0 - b1)?;
    let m = bin(g, BinaryOp::Add, m_kept, m_new)?;
    let v_kept = scaled(g, state[1], b2)?;
    let sq = g.add_op(Op::Unary(UnaryOp::Square), &[grad])?;
    let v_new = scaled(g, sq, 1.0 - b2)?;
    let v = bin(g, BinaryOp::Add, v_kept, v_new)?;
    let mut out = vec![m, v];
    let second = if c.amsgrad {
        let vmax = bin(g, BinaryOp::Maximum, state[2], v)?;
        out.push(vmax);
        vmax
    } else {
        v
    };
    let root = g.add_op(Op::Unary(UnaryOp::Sqrt), &[second])?;
    let scaled_root = bin(g, BinaryOp::Div, root, bc2_sqrt)?;
    let eps = g.add_scalar(Scalar::Float(c.eps))?;
    let denom = bin(g, BinaryOp::Add, scaled_root, eps)?;
    let ratio = bin(g, BinaryOp::Div, m, denom)?;
    let step = bin(g, BinaryOp::Mul, ratio, step_size)?;
    Ok((p, step, out))
}

/// Replaces each gradient by its average over the ranks: gradients in reverse order, grouped
/// into buckets of one dtype and at most `cap` bytes; a bucket of several is flattened and
/// joined, reduced by one `all_reduce`, and read back through views of the result.
fn all_reduce_buckets(g: &mut Graph, grads: &mut [ValueId], cap: usize) -> Result<()> {
    let avg = Op::AllReduce {
        op: crate::ir::collective::ReduceOp::Avg,
    };
    let sizes: Vec<(usize, DType)> = grads
        .iter()
        .map(|&v| {
            let ty = &g.node(v).ty;
            (ty.numel() * ty.dtype.size(), ty.dtype)
        })
        .collect();
    let buckets = crate::distributed::buckets(&sizes, cap);
    for b in buckets {
        if let [i] = b[..] {
            grads[i] = g.add_op(avg.clone(), &[grads[i]])?;
            continue;
        }
        let flat: Vec<ValueId> = b
            .iter()
            .map(|&i| g.add_op(Op::Reshape { shape: vec![-1] }, &[grads[i]]))
            .collect::<Result<_>>()?;
        let joined = g.add_op(Op::Cat { dim: 0 }, &flat)?;
        let reduced = g.add_op(avg.clone(), &[joined])?;
        let mut start = 0i64;
        for &i in &b {
            let ty = g.node(grads[i]).ty.clone();
            let length = ty.numel() as i64;
            let part = g.add_op(
                Op::Narrow {
                    dim: 0,
                    start,
                    length,
                },
                &[reduced],
            )?;
            let shape = ty.shape.iter().map(|&d| d as i64).collect();
            grads[i] = g.add_op(Op::Reshape { shape }, &[part])?;
            start += length;
        }
    }
    Ok(())
}

fn bin(g: &mut Graph, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
    g.add_op(Op::Binary(op), &[x, y])
}

/// `x * s` with `s` a Python-style number, as `Tensor::mul_scalar` records it.
fn scaled(g: &mut Graph, x: ValueId, s: f64) -> Result<ValueId> {
    let s = g.add_scalar(Scalar::Float(s))?;
    bin(g, BinaryOp::Mul, x, s)
}
