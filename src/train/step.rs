//! [`CompiledStep`]: one compiled graph per training step.
//!
//! The loss function is traced once with the parameters as named graph inputs; the autodiff
//! pass appends the gradients of the loss with respect to them; the SGD update (weight
//! decay, momentum, dampening, Nesterov, exactly as `optim::SGD` computes it) is appended
//! on top, and the graph's outputs become the loss, the updated parameters and the updated
//! momentum buffers. The whole graph goes through the ordinary pass pipeline, so the update
//! fuses with the pointwise tail of the backward.
//!
//! A call writes the updated parameters into the parameter tensors (the tensors a module
//! and an eager optimiser hold), so compiled and eager steps can be mixed: the update
//! kernel stores into them directly where the executor allows it
//! (`CompiledFn::call_into`), otherwise the new values are copied back. The momentum
//! buffers live in the step: the outputs of one call are the inputs of the next.

use crate::autograd::no_grad;
use crate::exec::{CompileOptions, CompiledFn};
use crate::ir::dtype::DType;
use crate::ir::dtype::Scalar;
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{BinaryOp, Op, TensorType};
use crate::jit::{TraceOptions, trace_with};
use crate::optim::SGDConfig;
use crate::passes::autodiff::autodiff;
use crate::runtime::{Element, Tensor};
use crate::{Result, bail};

/// A training step (forward, loss, backward, SGD update) compiled into one function.
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
    /// Which parameters the loss depends on (the others are left alone, as SGD skips
    /// parameters without a gradient).
    updated: Vec<bool>,
    /// Momentum buffers of the updated parameters, in order (empty without momentum).
    buffers: Vec<Tensor>,
    config: SGDConfig,
    steps: u64,
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
    /// The graph for the first step when it differs (momentum with dampening: the buffer
    /// starts as the gradient itself, not a damped one).
    first: Option<(Graph, CompiledFn)>,
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
        // Validates the settings with the eager optimiser's checks and messages.
        crate::optim::SGD::new(params.iter().map(|(_, p)| p.clone()).collect(), config)?;
        let loss_fn: LossFn<'f> = Box::new(loss_fn);
        let (variant, updated) = build_variant(&loss_fn, example_inputs, &params, &config, opts)?;
        let buffers = if config.momentum != 0.0 {
            params
                .iter()
                .zip(&updated)
                .filter(|(_, u)| **u)
                .map(|((_, p), _)| Tensor::zeros(p.shape(), p.dtype()))
                .collect()
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
            updated,
            buffers,
            config,
            steps: 0,
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
        let (v, updated) = build_variant(
            &self.loss_fn,
            inputs,
            &self.params,
            &self.config,
            &self.opts,
        )?;
        if updated != self.updated {
            bail!(
                Value,
                "the training step: with inputs of other shapes the loss depends on other parameters"
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
    /// updated parameters into the parameter tensors.
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
        let first_call = self.steps == 0 && variant.first.is_some();
        let mut args: Vec<Tensor> = inputs.to_vec();
        args.extend(self.params.iter().map(|(_, p)| p.clone()));
        let f = match (&variant.first, first_call) {
            (Some((_, f)), true) => f,
            _ => {
                args.extend(self.buffers.iter().cloned());
                &variant.f
            }
        };
        // Large updated parameters are written into the parameters themselves where the
        // executor can do so safely; the others are copied back below (for small ones
        // the copy costs less than the in-place bookkeeping).
        let outs = if self.large {
            let mut into: Vec<Option<&Tensor>> = vec![None];
            into.extend(
                self.params
                    .iter()
                    .zip(&self.updated)
                    .filter(|(_, u)| **u)
                    .map(|((_, p), _)| (p.numel() > SMALL_PARAM).then_some(p)),
            );
            f.call_into(&args, &into)?
        } else {
            f.call(&args)?
        };
        let n_upd = self.updated.iter().filter(|u| **u).count();
        if outs.len() != 1 + n_upd + self.buffers.len() {
            bail!(
                Value,
                "the step graph returned {} outputs, expected {}",
                outs.len(),
                1 + n_upd + self.buffers.len()
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
        for b in self.buffers.iter_mut() {
            if let Some(new) = it.next() {
                *b = new;
            }
        }
        self.steps += 1;
        Ok(loss)
    }

    /// The step graph of the example inputs' shapes: inputs, then parameters, then
    /// momentum buffers; outputs the loss, the updated parameters and the updated buffers.
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
        if self.steps == 0 || !self.updated.get(i).copied().unwrap_or(false) {
            return None;
        }
        let j = self.updated[..i].iter().filter(|u| **u).count();
        self.buffers.get(j)
    }

    /// The update settings.
    pub fn config(&self) -> &SGDConfig {
        &self.config
    }

    /// Steps run so far.
    pub fn steps_done(&self) -> u64 {
        self.steps
    }
}

/// Traces, differentiates and compiles the step for `inputs`' types; also returns which
/// parameters are updated.
fn build_variant(
    loss_fn: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    inputs: &[Tensor],
    params: &[(String, Tensor)],
    config: &SGDConfig,
    opts: &CompileOptions,
) -> Result<(Variant, Vec<bool>)> {
    let forward = trace_forward(&loss_fn, inputs, params)?;
    let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
    let (graph, updated) = build_step_graph(&forward, inputs.len(), &names, config, false)?;
    let f = CompiledFn::compile(&graph, opts)?;
    let first = if config.momentum != 0.0 && config.dampening != 0.0 {
        let (g, _) = build_step_graph(&forward, inputs.len(), &names, config, true)?;
        let f = CompiledFn::compile(&g, opts)?;
        Some((g, f))
    } else {
        None
    };
    let variant = Variant {
        inputs: inputs.iter().map(Tensor::ttype).collect(),
        graph,
        f,
        first,
    };
    Ok((variant, updated))
}

/// Traces the loss with gradient recording off (the trace needs no tape).
fn trace_forward<F>(
    loss_fn: &F,
    example_inputs: &[Tensor],
    params: &[(String, Tensor)],
) -> Result<Graph>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
{
    let _off = no_grad();
    let opts = params
        .iter()
        .fold(TraceOptions::new().name("train_step"), |o, (n, t)| {
            o.param(n, t)
        });
    let traced = trace_with(|xs| Ok(vec![loss_fn(xs)?]), example_inputs, opts)?;
    let g = traced.graph().clone();
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
    Ok(g)
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
/// parameters named `params`; one scalar output): the loss, then the SGD-updated value of
/// every parameter the loss depends on, then (with momentum) their new momentum buffers.
/// With momentum, the graph takes one buffer per updated parameter after the parameters,
/// except for the `first_step` graph, which starts the buffers from the gradients. Also
/// returns which parameters are updated.
pub fn build_step_graph(
    forward: &Graph,
    n_inputs: usize,
    params: &[String],
    config: &SGDConfig,
    first_step: bool,
) -> Result<(Graph, Vec<bool>)> {
    if forward.inputs().len() != n_inputs + params.len() || forward.outputs().len() != 1 {
        bail!(
            Value,
            "a step graph needs {} inputs and one output, graph {} has {} and {}",
            n_inputs + params.len(),
            forward.name,
            forward.inputs().len(),
            forward.outputs().len()
        );
    }
    let reach = reaches_output(forward);
    let updated: Vec<bool> = reach[n_inputs..].to_vec();
    let wrt: Vec<&str> = params
        .iter()
        .zip(&updated)
        .filter(|(_, u)| **u)
        .map(|(n, _)| n.as_str())
        .collect();
    let mut g = autodiff(forward, &wrt)?;
    let loss = g.outputs()[0];
    let grads: Vec<ValueId> = g.outputs()[1..].to_vec();
    let c = *config;
    let with_momentum = c.momentum != 0.0;
    let mut new_params = Vec::with_capacity(wrt.len());
    let mut new_bufs = Vec::with_capacity(wrt.len());
    for (name, &grad) in wrt.iter().zip(&grads) {
        let Some(p) = g.value(name) else {
            bail!(Value, "step graph: no parameter input %{name}");
        };
        // The same operations, in the same order, as `optim::SGD::step`.
        let mut d = grad;
        if c.weight_decay != 0.0 {
            let wd = scaled(&mut g, p, c.weight_decay)?;
            d = bin(&mut g, BinaryOp::Add, d, wd)?;
        }
        if with_momentum {
            let ty = g.node(p).ty.clone();
            let b = if first_step {
                d
            } else {
                let buf = g.add_input(&format!("momentum_buffer.{name}"), ty)?;
                let kept = scaled(&mut g, buf, c.momentum)?;
                let fresh = scaled(&mut g, d, 1.0 - c.dampening)?;
                bin(&mut g, BinaryOp::Add, kept, fresh)?
            };
            d = if c.nesterov {
                let m = scaled(&mut g, b, c.momentum)?;
                bin(&mut g, BinaryOp::Add, d, m)?
            } else {
                b
            };
            new_bufs.push(b);
        }
        let step = scaled(&mut g, d, c.lr)?;
        new_params.push(g.add_op_named(
            Op::Binary(BinaryOp::Sub),
            &[p, step],
            &format!("new.{name}"),
        )?);
    }
    let mut outputs = vec![loss];
    outputs.extend(new_params);
    for (name, b) in wrt.iter().zip(new_bufs) {
        // A buffer that is the gradient itself still gets its own output buffer.
        outputs.push(g.add_op_named(Op::Contiguous, &[b], &format!("new_buffer.{name}"))?);
    }
    g.set_outputs(outputs);
    g.verify()?;
    Ok((g, updated))
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

fn bin(g: &mut Graph, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
    g.add_op(Op::Binary(op), &[x, y])
}

/// `x * s` with `s` a Python-style number, as `Tensor::mul_scalar` records it.
fn scaled(g: &mut Graph, x: ValueId, s: f64) -> Result<ValueId> {
    let s = g.add_scalar(Scalar::Float(s))?;
    bin(g, BinaryOp::Mul, x, s)
}
