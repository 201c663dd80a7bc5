//! The graph of a compiled training step: the traced loss, its gradients (autodiff), and on
//! top the optimiser's update: the eager optimiser's own rule (`optim::rule`) run on graph
//! values, so the compiled step has the same operations in the same order and gives the
//! eager step's numbers.
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
use crate::optim::rule::{self, AdamScalars, AdamState, Arith};
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
                let decoupled = matches!(self.optimizer, StepOptimizer::AdamW(_));
                let k = AdamScalars::new(&c, decoupled, lr, step + 1);
                vec![k.step_size, k.bias_correction2_sqrt, k.decay]
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
        let ops = &mut GraphOps { g: &mut g, name };
        let (new_p, ns): (ValueId, Vec<ValueId>) = match cfg.optimizer {
            StepOptimizer::Sgd(c) => {
                let lr = scalars.first().map_or(Num::Const(c.lr), |&v| Num::Input(v));
                let (new_p, buf) = rule::sgd(ops, &c, &pi, &gi, state[i].first(), lr)?;
                (new_p, buf.into_iter().collect())
            }
            StepOptimizer::Adam(c) | StepOptimizer::AdamW(c) => {
                let decoupled = matches!(cfg.optimizer, StepOptimizer::AdamW(_));
                let st = match (state[i].as_slice(), c.amsgrad) {
                    (&[m, v], false) => AdamState {
                        exp_avg: m,
                        exp_avg_sq: v,
                        max_exp_avg_sq: None,
                    },
                    (&[m, v, max], true) => AdamState {
                        exp_avg: m,
                        exp_avg_sq: v,
                        max_exp_avg_sq: Some(max),
                    },
                    (s, _) => bail!(
                        Value,
                        "compiled step: parameter {name} has {} Adam state inputs",
                        s.len()
                    ),
                };
                let k = AdamScalars {
                    step_size: scalars[0],
                    bias_correction2_sqrt: scalars[1],
                    decay: scalars[2],
                }
                .map(Num::Input);
                let (new_p, ns) = rule::adam(ops, &c, decoupled, &pi, &gi, &st, k)?;
                (new_p, ns.into_vec())
            }
        };
        new_params.push(new_p);
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

/// A scalar of an update in the graph: a setting, added where it is used, or an input.
#[derive(Clone, Copy)]
enum Num {
    Const(f64),
    Input(ValueId),
}

/// The update rules' arithmetic on graph values: each operation appended to the step graph.
/// The new parameter is named `new.{name}`: the executor can write it into the parameter
/// itself.
struct GraphOps<'a> {
    g: &'a mut Graph,
    name: &'a str,
}

impl GraphOps<'_> {
    fn scalar(&mut self, s: Num) -> Result<ValueId> {
        match s {
            Num::Const(c) => self.g.add_scalar(Scalar::Float(c)),
            Num::Input(v) => Ok(v),
        }
    }
    fn with_scalar(&mut self, op: BinaryOp, x: ValueId, s: Num) -> Result<ValueId> {
        let s = self.scalar(s)?;
        bin(self.g, op, x, s)
    }
}

impl Arith for GraphOps<'_> {
    type T = ValueId;
    type S = Num;
    fn constant(&mut self, c: f64) -> Num {
        Num::Const(c)
    }
    fn add(&mut self, x: &ValueId, y: &ValueId) -> Result<ValueId> {
        bin(self.g, BinaryOp::Add, *x, *y)
    }
    fn div(&mut self, x: &ValueId, y: &ValueId) -> Result<ValueId> {
        bin(self.g, BinaryOp::Div, *x, *y)
    }
    fn maximum(&mut self, x: &ValueId, y: &ValueId) -> Result<ValueId> {
        bin(self.g, BinaryOp::Maximum, *x, *y)
    }
    fn square(&mut self, x: &ValueId) -> Result<ValueId> {
        self.g.add_op(Op::Unary(UnaryOp::Square), &[*x])
    }
    fn sqrt(&mut self, x: &ValueId) -> Result<ValueId> {
        self.g.add_op(Op::Unary(UnaryOp::Sqrt), &[*x])
    }
    fn add_s(&mut self, x: &ValueId, s: Num) -> Result<ValueId> {
        self.with_scalar(BinaryOp::Add, *x, s)
    }
    fn mul_s(&mut self, x: &ValueId, s: Num) -> Result<ValueId> {
        self.with_scalar(BinaryOp::Mul, *x, s)
    }
    fn div_s(&mut self, x: &ValueId, s: Num) -> Result<ValueId> {
        self.with_scalar(BinaryOp::Div, *x, s)
    }
    fn descend(&mut self, p: &ValueId, step: &ValueId) -> Result<ValueId> {
        let sub = Op::Binary(BinaryOp::Sub);
        self.g
            .add_op_named(sub, &[*p, *step], &format!("new.{}", self.name))
    }
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
