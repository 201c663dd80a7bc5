//! [`CompiledStep`]: one compiled graph per training step.
//!
//! The loss function is traced once with the parameters as named graph inputs; the autodiff
//! pass appends the gradients of the loss with respect to them; the optimiser's update
//! (SGD, Adam or AdamW, exactly as `optim` computes it, after optional clipping by global
//! norm) is appended on top ([`super::update`]), and the graph's outputs become the loss,
//! the updated parameters and the optimiser's new state. The whole graph goes through the
//! ordinary pass pipeline, so the update fuses with the pointwise tail of the backward.
//! Learning-rate schedules and Adam's bias corrections are inputs of the graph, so they
//! never recompile; gradient accumulation compiles a second graph that only adds a
//! micro-batch's gradient.
//!
//! A call writes the updated parameters into the parameter tensors (the tensors a module
//! and an eager optimiser hold), so compiled and eager steps can be mixed: the update
//! kernel stores into them directly where the executor allows it
//! (`CompiledFn::call_into`), otherwise the new values are copied back. The optimiser's
//! state lives in the step: the outputs of one call are the inputs of the next.
//!
//! Buffers ([`CompiledStep::with_buffers`]: a module's `named_buffers`, such as batch norm's
//! running statistics) are inputs of the graph too; the in-place writes the forward makes
//! into them are traced as outputs, and each call writes the new values back, so the
//! running statistics move exactly as in eager training.

use super::update::{Phase, StepConfig, StepOptimizer, build_update_graph};
use crate::autograd::no_grad;
use crate::exec::{CompileOptions, CompiledFn};
use crate::ir::dtype::DType;
use crate::ir::graph::Graph;
use crate::ir::op::TensorType;
use crate::jit::TraceOptions;
use crate::jit::trace::trace_with_buffers;
use crate::optim::SGDConfig;
use crate::runtime::{Element, MemoryFormat, Tensor};
use crate::{Result, bail};

/// A training step (forward, loss, backward, optimiser update) compiled into one function.
///
/// Compiled code has fixed shapes: a batch of other shapes (the smaller last batch of a
/// `DataLoader` without `drop_last`) traces and compiles another specialisation on first
/// use, kept beside the first ([`CompiledStep::MAX_SPECIALISATIONS`] at most).
pub struct CompiledStep<'f> {
    loss_fn: LossFn<'f>,
    opts: CompileOptions,
    /// One per input types seen; the first is the example inputs'.
    variants: Vec<Variant>,
    n_inputs: usize,
    params: Vec<(String, Tensor)>,
    /// Module state the forward reads and may write (running statistics).
    buffers: Vec<(String, Tensor)>,
    /// Which buffers the forward writes (their new values end the outputs).
    written: Vec<bool>,
    /// Which parameters the loss depends on (the others are left alone, as the eager
    /// optimisers skip parameters without a gradient).
    updated: Vec<bool>,
    /// The optimiser's state, per updated parameter its `state_names` in order.
    state: Vec<Tensor>,
    /// The gradients accumulated over this step's micro-batches (with accumulation).
    acc: Vec<Tensor>,
    config: StepConfig,
    /// Optimiser steps run so far.
    steps: u64,
    /// Micro-batches run since the last update.
    micro: usize,
    /// The gradients' norm before clipping, at the last update.
    last_norm: Option<f64>,
    /// Whether a parameter is large enough to be updated in place.
    large: bool,
}

/// The loss function a step keeps, to trace batches of other shapes.
type LossFn<'f> = Box<dyn Fn(&[Tensor]) -> Result<Tensor> + 'f>;

/// The step compiled for one set of input types.
struct Variant {
    inputs: Vec<TensorType>,
    graph: Graph,
    f: CompiledFn,
    /// The graph for the first step when it differs (SGD momentum with dampening: the
    /// buffer starts as the gradient itself, not a damped one).
    first: Option<(Graph, CompiledFn)>,
    /// The graph of a micro-batch that only accumulates (with accumulation).
    accumulate: Option<(Graph, CompiledFn)>,
}

impl<'f> CompiledStep<'f> {
    /// How many input-type specialisations a step keeps.
    pub const MAX_SPECIALISATIONS: usize = 4;

    /// Traces `loss_fn` on `example_inputs` (the data of one batch: inputs, targets...)
    /// with `params` as named parameters, appends its backward and the SGD update `config`
    /// and compiles the result. `loss_fn` must return a one-element floating-point loss;
    /// batches of other shapes compile their own specialisation when they first come.
    pub fn new<F>(
        loss_fn: F,
        example_inputs: &[Tensor],
        params: Vec<(String, Tensor)>,
        config: SGDConfig,
        opts: &CompileOptions,
    ) -> Result<CompiledStep<'f>>
    where
        F: Fn(&[Tensor]) -> Result<Tensor> + 'f,
    {
        Self::with_config(
            loss_fn,
            example_inputs,
            params,
            StepConfig::sgd(config),
            opts,
        )
    }

    /// [`CompiledStep::new`] with any [`StepConfig`]: SGD, Adam or AdamW, clipping by
    /// global norm, a learning-rate schedule, gradient accumulation.
    pub fn with_config<F>(
        loss_fn: F,
        example_inputs: &[Tensor],
        params: Vec<(String, Tensor)>,
        config: StepConfig,
        opts: &CompileOptions,
    ) -> Result<CompiledStep<'f>>
    where
        F: Fn(&[Tensor]) -> Result<Tensor> + 'f,
    {
        Self::with_buffers(loss_fn, example_inputs, params, Vec::new(), config, opts)
    }

    /// [`CompiledStep::with_config`] with the module's buffers (`named_buffers()`): graph
    /// inputs like the parameters, never differentiated; what the forward writes into them
    /// in place (batch norm's running mean, variance and batch count in training mode) is
    /// written back after every call, micro-batches included, as eager training does.
    pub fn with_buffers<F>(
        loss_fn: F,
        example_inputs: &[Tensor],
        params: Vec<(String, Tensor)>,
        buffers: Vec<(String, Tensor)>,
        config: StepConfig,
        opts: &CompileOptions,
    ) -> Result<CompiledStep<'f>>
    where
        F: Fn(&[Tensor]) -> Result<Tensor> + 'f,
    {
        // Validates the settings with the eager optimisers' checks and messages.
        let tensors = || params.iter().map(|(_, p)| p.clone()).collect();
        match config.optimizer {
            StepOptimizer::Sgd(c) => drop(crate::optim::SGD::new(tensors(), c)?),
            StepOptimizer::Adam(c) => drop(crate::optim::Adam::new(tensors(), c)?),
            StepOptimizer::AdamW(c) => drop(crate::optim::AdamW::new(tensors(), c)?),
        }
        config.check()?;
        if config.all_reduce_bucket_bytes.is_some() && !crate::distributed::is_initialized() {
            bail!(
                Distributed,
                "the training step all-reduces its gradients, but the default process group has not been initialized (call distributed::init_process_group first)"
            );
        }
        let loss_fn: LossFn<'f> = Box::new(loss_fn);
        let (variant, updated, written) =
            build_variant(&loss_fn, example_inputs, &params, &buffers, &config, opts)?;
        let kept: Vec<&Tensor> = params
            .iter()
            .zip(&updated)
            .filter(|(_, u)| **u)
            .map(|((_, p), _)| p)
            .collect();
        let zeros = |p: &Tensor| Tensor::zeros(p.shape(), p.dtype());
        let n_state = config.optimizer.state_names().len();
        let state = kept
            .iter()
            .flat_map(|p| (0..n_state).map(|_| zeros(p)))
            .collect();
        let acc = if config.accumulation_steps > 1 {
            kept.iter().map(|p| zeros(p)).collect()
        } else {
            Vec::new()
        };
        Ok(CompiledStep {
            loss_fn,
            opts: opts.clone(),
            variants: vec![variant],
            n_inputs: example_inputs.len(),
            large: params.iter().any(|(_, p)| p.numel() > SMALL_PARAM),
            params,
            buffers,
            written,
            updated,
            state,
            acc,
            config,
            steps: 0,
            micro: 0,
            last_norm: None,
        })
    }

    /// The specialisation for `inputs`' types, compiled now if none fits.
    fn variant_for(&mut self, inputs: &[Tensor]) -> Result<usize> {
        let types: Vec<TensorType> = inputs.iter().map(Tensor::ttype).collect();
        let same = |v: &Variant| {
            v.inputs.len() == types.len()
                && v.inputs
                    .iter()
                    .zip(&types)
                    .all(|(a, b)| a.dtype == b.dtype && a.shape == b.shape)
        };
        if let Some(i) = self.variants.iter().position(same) {
            return Ok(i);
        }
        let (v, updated, written) = build_variant(
            &self.loss_fn,
            inputs,
            &self.params,
            &self.buffers,
            &self.config,
            &self.opts,
        )?;
        if updated != self.updated || written != self.written {
            bail!(
                Value,
                "the training step: with inputs of other shapes the loss depends on other parameters or writes other buffers"
            );
        }
        if self.variants.len() >= Self::MAX_SPECIALISATIONS {
            // keep the example's; drop the oldest other one
            self.variants.remove(1);
        }
        self.variants.push(v);
        Ok(self.variants.len() - 1)
    }

    /// Runs one step on a batch: returns the loss (before the update) and writes the
    /// updated parameters into the parameter tensors. With accumulation over `n`
    /// micro-batches, each call takes one micro-batch and every `n`-th call updates.
    pub fn step(&mut self, inputs: &[Tensor]) -> Result<Tensor> {
        if inputs.len() != self.n_inputs {
            bail!(
                Value,
                "the training step takes {} input{} but {} {} given",
                self.n_inputs,
                if self.n_inputs == 1 { "" } else { "s" },
                inputs.len(),
                if inputs.len() == 1 { "was" } else { "were" }
            );
        }
        let vi = self.variant_for(inputs)?;
        let variant = &self.variants[vi];
        let mut args: Vec<Tensor> = inputs.to_vec();
        args.extend(self.params.iter().map(|(_, p)| p.clone()));
        args.extend(self.buffers.iter().map(|(_, b)| b.clone()));
        args.extend(self.acc.iter().cloned());
        if self.micro + 1 < self.config.accumulation_steps {
            let Some((_, f)) = &variant.accumulate else {
                bail!(Value, "the training step has no accumulation graph");
            };
            let mut outs = f.call(&args)?;
            self.write_buffers(&mut outs)?;
            let mut outs = outs.into_iter();
            let loss = outs.next().unwrap_or_else(|| Tensor::scalar(f32::NAN));
            self.acc = outs.collect();
            self.micro += 1;
            return Ok(loss);
        }
        let first_call = self.steps == 0 && variant.first.is_some();
        let f = match (&variant.first, first_call) {
            (Some((_, f)), true) => f,
            _ => {
                args.extend(self.state.iter().cloned());
                &variant.f
            }
        };
        for x in self.config.scalars(self.steps) {
            args.push(Tensor::from_vec(vec![x], &[])?);
        }
        // Large updated parameters are written into the parameters themselves where the
        // executor can do so safely; the others are copied back below (for small ones
        // the copy costs less than the in-place bookkeeping).
        let mut outs = if self.large {
            let mut into: Vec<Option<&Tensor>> = vec![None];
            into.extend(
                self.params
                    .iter()
                    .zip(&self.updated)
                    .filter(|(_, u)| **u)
                    .map(|((_, p), _)| (p.numel() > SMALL_PARAM).then_some(p)),
            );
            // the optimiser's state too (not on the first SGD step, whose graph takes none)
            if !first_call {
                into.extend(
                    self.state
                        .iter()
                        .map(|s| (s.numel() > SMALL_PARAM).then_some(s)),
                );
            }
            f.call_into(&args, &into)?
        } else {
            f.call(&args)?
        };
        self.write_buffers(&mut outs)?;
        let n_upd = self.updated.iter().filter(|u| **u).count();
        let want = 1 + n_upd + self.state.len() + usize::from(self.config.clip_grad_norm.is_some());
        if outs.len() != want {
            bail!(
                Value,
                "the step graph returned {} outputs, expected {want}",
                outs.len()
            );
        }
        let mut it = outs.into_iter();
        let loss = it.next().unwrap_or_else(|| Tensor::scalar(f32::NAN));
        {
            let _off = no_grad();
            for ((_, p), _) in self.params.iter().zip(&self.updated).filter(|(_, u)| **u) {
                if let Some(new) = it.next()
                    && !new.shares_storage(p)
                {
                    write_back(p, &new)?;
                }
            }
        }
        for s in self.state.iter_mut() {
            if let Some(new) = it.next() {
                *s = new;
            }
        }
        if let Some(norm) = it.next() {
            self.last_norm = Some(norm.item_f64()?);
        }
        for a in &self.acc {
            a.zero_()?;
        }
        self.micro = 0;
        self.steps += 1;
        Ok(loss)
    }

    /// Writes the buffers' new values, the last outputs of a call, back into the buffers.
    fn write_buffers(&self, outs: &mut Vec<Tensor>) -> Result<()> {
        let n = self.written.iter().filter(|w| **w).count();
        if outs.len() < n {
            bail!(
                Value,
                "the step graph returned {} outputs, fewer than its {n} buffers",
                outs.len()
            );
        }
        let new = outs.split_off(outs.len() - n);
        let _off = no_grad();
        let written = self.buffers.iter().zip(&self.written).filter(|(_, w)| **w);
        for (((_, b), _), v) in written.zip(&new) {
            b.copy_(v)?;
        }
        Ok(())
    }

    /// The buffers, with their names.
    pub fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    /// The step graph of the example inputs' shapes (inputs, parameters, buffers, then the
    /// optimiser's state; outputs the loss, the updated parameters, the new state, then the
    /// buffers' new values: see the `update` module of `train`).
    pub fn graph(&self) -> &Graph {
        &self.variants[0].graph
    }

    /// The compiled function of that step graph (its schedule shows what fused).
    pub fn compiled(&self) -> &CompiledFn {
        &self.variants[0].f
    }

    /// How many input-shape specialisations are compiled (1 until a batch of other shapes).
    pub fn specialisations(&self) -> usize {
        self.variants.len()
    }

    /// The parameters, with their names.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The momentum buffer of parameter `i`, once a step has made it (as
    /// `SGD::momentum_buffer`).
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.optimizer_state(i, "momentum_buffer")
    }

    /// State `name` of parameter `i` once a step has made it: `momentum_buffer` (SGD),
    /// `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` (Adam, AdamW), as PyTorch names them.
    pub fn optimizer_state(&self, i: usize, name: &str) -> Option<&Tensor> {
        if self.steps == 0 || !self.updated.get(i).copied().unwrap_or(false) {
            return None;
        }
        let names = self.config.optimizer.state_names();
        let k = names.iter().position(|n| *n == name)?;
        let j = self.updated[..i].iter().filter(|u| **u).count();
        self.state.get(j * names.len() + k)
    }

    /// The gradients' global norm before clipping, at the last update (with clipping).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.last_norm
    }

    /// The learning rate the next update uses (the schedule's rate at that step).
    pub fn lr(&self) -> f64 {
        self.config
            .schedule
            .lr(self.config.optimizer.lr(), self.steps)
    }

    /// The update settings.
    pub fn config(&self) -> &StepConfig {
        &self.config
    }

    /// Optimiser steps run so far (updates, not micro-batches).
    pub fn steps_done(&self) -> u64 {
        self.steps
    }
}

/// Traces, differentiates and compiles the step for `inputs`' types; also returns which
/// parameters are updated and which buffers are written.
fn build_variant(
    loss_fn: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    params: &[(String, Tensor)],
    buffers: &[(String, Tensor)],
    config: &StepConfig,
    opts: &CompileOptions,
) -> Result<(Variant, Vec<bool>, Vec<bool>)> {
    let (forward, written) = trace_forward(&loss_fn, inputs, params, buffers)?;
    let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
    let n = inputs.len();
    // example inputs in channels_last keep the step's convolutions in NHWC
    let mut opts = opts.clone();
    for (t, &v) in inputs.iter().zip(forward.inputs()) {
        let name = &forward.node(v).name;
        if t.suggest_memory_format() == MemoryFormat::ChannelsLast
            && !opts.channels_last_inputs().contains(name)
        {
            opts.passes.fuse.channels_last_inputs.push(name.clone());
        }
    }
    let build = |phase| -> Result<(Graph, CompiledFn, Vec<bool>)> {
        let (g, updated) = build_update_graph(&forward, n, &names, config, phase)?;
        let f = CompiledFn::compile(&g, &opts)?;
        Ok((g, f, updated))
    };
    let (graph, f, updated) = build(Phase::Update { first_step: false })?;
    let first = match config.optimizer {
        StepOptimizer::Sgd(c) if c.momentum != 0.0 && c.dampening != 0.0 => {
            let (g, f, _) = build(Phase::Update { first_step: true })?;
            Some((g, f))
        }
        _ => None,
    };
    let accumulate = if config.accumulation_steps > 1 {
        let (g, f, _) = build(Phase::Accumulate)?;
        Some((g, f))
    } else {
        None
    };
    let variant = Variant {
        inputs: inputs.iter().map(Tensor::ttype).collect(),
        graph,
        f,
        first,
        accumulate,
    };
    Ok((variant, updated, written))
}

/// Traces the loss with gradient recording off (the trace needs no tape); also returns
/// which buffers the forward writes.
fn trace_forward<F>(
    loss_fn: &F,
    example_inputs: &[Tensor],
    params: &[(String, Tensor)],
    buffers: &[(String, Tensor)],
) -> Result<(Graph, Vec<bool>)>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let _off = no_grad();
    let opts = params
        .iter()
        .fold(TraceOptions::new().name("train_step"), |o, (n, t)| {
            o.param(n, t)
        });
    let loss = |xs: &[Tensor]| Ok(vec![loss_fn(xs)?]);
    let (g, written) = trace_with_buffers(&loss, example_inputs, &opts, buffers)?;
    let out = g.node(g.outputs()[0]).ty.clone();
    if out.shape.iter().product::<usize>() != 1 {
        bail!(
            Value,
            "grad can be implicitly created only for scalar outputs"
        );
    }
    if !out.dtype.is_float() {
        bail!(
            Value,
            "grad can be implicitly created only for real scalar outputs but got {}",
            out.dtype.torch_name()
        );
    }
    Ok((g, written))
}

/// The SGD step graph of a traced loss `forward` (inputs: `n_inputs` data inputs, then the
/// parameters named `params`; one scalar output): the loss, then the SGD-updated value of
/// every parameter the loss depends on, then (with momentum) their new momentum buffers.
/// With momentum, the graph takes one buffer per updated parameter after the parameters,
/// except for the `first_step` graph, which starts the buffers from the gradients. Also
/// returns which parameters are updated. ([`build_update_graph`] for every optimiser.)
pub fn build_step_graph(
    forward: &Graph,
    n_inputs: usize,
    params: &[String],
    config: &SGDConfig,
    first_step: bool,
) -> Result<(Graph, Vec<bool>)> {
    let cfg = StepConfig::sgd(*config);
    build_update_graph(
        forward,
        n_inputs,
        params,
        &cfg,
        Phase::Update { first_step },
    )
}

/// Parameters up to this many elements are written back with a plain slice copy (the
/// in-place op's bookkeeping costs more than the copy for them).
const SMALL_PARAM: usize = 1 << 14;

/// Writes the updated value `new` into the parameter `p` (gradient recording is off).
fn write_back(p: &Tensor, new: &Tensor) -> Result<()> {
    let plain = p.is_contiguous()
        && new.is_contiguous()
        && p.numel() <= SMALL_PARAM
        && p.shape() == new.shape()
        && p.dtype() == new.dtype()
        && !p.shares_storage(new);
    match p.dtype() {
        DType::F32 if plain => copy_slice::<f32>(p, new),
        DType::F64 if plain => copy_slice::<f64>(p, new),
        _ => p.copy_(new).map(|_| ()),
    }
}

fn copy_slice<T: Element>(p: &Tensor, new: &Tensor) -> Result<()> {
    p.with_slice_mut(|dst: &mut [T]| new.with_slice(|src: &[T]| dst.copy_from_slice(src)))?
}
