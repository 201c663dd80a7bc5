//! [`CompiledLoop`]: many optimiser steps in one compiled call.
//!
//! The step graph of [`CompiledStep`](super::CompiledStep) (forward, backward, update)
//! becomes the body of a `scan`: the parameters and the optimiser's state are its carries,
//! the batches (stacked along a new leading dim) and each step's scalars (learning rate,
//! Adam's bias corrections, computed on the host as the eager optimiser computes them) are
//! the scanned inputs, and the per-step losses come out stacked. One call runs `N` steps
//! without returning to Rust between them: an epoch compiles once, whatever its length's
//! trip count (the body is compiled once).

use super::update::{Phase, StepConfig, StepOptimizer, build_update_graph};
use crate::autograd::no_grad;
use crate::exec::{CompileOptions, CompiledFn};
use crate::ir::control::{Control, ControlKind};
use crate::ir::graph::Graph;
use crate::ir::op::TensorType;
use crate::jit::{TraceOptions, trace_with};
use crate::runtime::Tensor;
use crate::{Result, bail};

/// A training loop compiled into one function: each call runs one optimiser step per
/// leading index of its stacked batches.
pub struct CompiledLoop {
    params: Vec<(String, Tensor)>,
    /// The optimiser's state, per updated parameter its `state_names` in order.
    state: Vec<Tensor>,
    config: StepConfig,
    /// Steps run so far (the scalars of the next call start here).
    steps: u64,
    /// Steps per call and the types of one batch.
    len: usize,
    batch: Vec<TensorType>,
    graph: Graph,
    f: CompiledFn,
}

impl CompiledLoop {
    /// Traces `loss_fn` on one batch `example_batch`, builds its training step with
    /// `config` and compiles a loop of `steps_per_call` such steps. Gradient accumulation
    /// and SGD with momentum and dampening (whose first step differs) are refused: use
    /// [`CompiledStep`](super::CompiledStep) for them.
    pub fn new<F>(
        loss_fn: F,
        example_batch: &[Tensor],
        params: Vec<(String, Tensor)>,
        config: StepConfig,
        steps_per_call: usize,
        opts: &CompileOptions,
    ) -> Result<CompiledLoop>
    where
        F: Fn(&[Tensor]) -> Result<Tensor>,
    {
        config.check()?;
        if config.accumulation_steps > 1 {
            bail!(
                Value,
                "CompiledLoop: gradient accumulation is not supported (use CompiledStep)"
            );
        }
        if let StepOptimizer::Sgd(c) = config.optimizer
            && c.momentum != 0.0
            && c.dampening != 0.0
        {
            bail!(
                Value,
                "CompiledLoop: SGD with momentum and dampening starts differently on its first step (use CompiledStep)"
            );
        }
        if steps_per_call == 0 {
            bail!(Value, "CompiledLoop: steps_per_call must be at least 1");
        }
        let forward = {
            let _off = no_grad();
            let opts = params
                .iter()
                .fold(TraceOptions::new().name("train_step"), |o, (n, t)| {
                    o.param(n, t)
                });
            trace_with(|xs| Ok(vec![loss_fn(xs)?]), example_batch, opts)?
                .graph()
                .clone()
        };
        let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
        let n_in = example_batch.len();
        let (step, updated) = build_update_graph(
            &forward,
            n_in,
            &names,
            &config,
            Phase::Update { first_step: false },
        )?;
        let n_state = config.optimizer.state_names().len() * updated.iter().filter(|u| **u).count();
        let n_scalars = config.scalar_names().len();
        let clip = usize::from(config.clip_grad_norm.is_some());
        let body = scan_body(&step, n_in, &updated, n_state, n_scalars, clip)?;
        // the loop: carries (params, state), xs (stacked batches, stacked scalars)
        let mut g = Graph::new("train_loop");
        let mut carries = Vec::new();
        for (name, p) in &params {
            carries.push(g.add_input(name, p.ttype())?);
        }
        let state_types: Vec<TensorType> = step.inputs()[n_in + params.len()..][..n_state]
            .iter()
            .map(|&v| step.node(v).ty.clone())
            .collect();
        for (i, t) in state_types.iter().enumerate() {
            carries.push(g.add_input(&format!("state{i}"), t.clone())?);
        }
        let mut xs = Vec::new();
        for (i, b) in example_batch.iter().enumerate() {
            let mut shape = vec![steps_per_call];
            shape.extend(b.shape());
            xs.push(g.add_input(&format!("batch{i}"), TensorType::new(b.dtype(), shape))?);
        }
        for name in config.scalar_names() {
            let ty = TensorType::new(crate::ir::dtype::DType::F64, vec![steps_per_call]);
            xs.push(g.add_input(name, ty)?);
        }
        let n_carries = carries.len();
        let mut args = carries;
        args.extend(xs);
        let kind = ControlKind::Scan {
            carries: n_carries,
            reverse: false,
        };
        let results = g.add_control(Control::new(kind, vec![body]), &args, None)?;
        g.set_outputs(results);
        g.verify()?;
        let f = CompiledFn::compile(&g, opts)?;
        let state = state_types
            .iter()
            .map(|t| Tensor::zeros(&t.shape, t.dtype))
            .collect();
        Ok(CompiledLoop {
            params,
            state,
            config,
            steps: 0,
            len: steps_per_call,
            batch: example_batch.iter().map(Tensor::ttype).collect(),
            graph: g,
            f,
        })
    }

    /// Runs `steps_per_call` optimiser steps: `batches[i]` stacks data input `i` of every
    /// step along a new dim 0. Writes the final parameters into the parameter tensors and
    /// returns the losses of the steps (before each step's update), stacked.
    pub fn run(&mut self, batches: &[Tensor]) -> Result<Tensor> {
        if batches.len() != self.batch.len() {
            bail!(
                Value,
                "CompiledLoop: expected {} stacked inputs, got {}",
                self.batch.len(),
                batches.len()
            );
        }
        for (i, (b, t)) in batches.iter().zip(&self.batch).enumerate() {
            if b.dtype() != t.dtype
                || b.shape().first() != Some(&self.len)
                || b.shape()[1..] != t.shape[..]
            {
                bail!(
                    Value,
                    "CompiledLoop: stacked input {i} must be {}[{},{}], got {}",
                    t.dtype.name(),
                    self.len,
                    t.shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    crate::ir::text::fmt_type(&b.ttype())
                );
            }
        }
        let mut args: Vec<Tensor> = self.params.iter().map(|(_, p)| p.clone()).collect();
        args.extend(self.state.iter().cloned());
        args.extend(batches.iter().cloned());
        let per_step: Vec<Vec<f64>> = (0..self.len as u64)
            .map(|k| self.config.scalars(self.steps + k))
            .collect();
        for j in 0..self.config.scalar_names().len() {
            let col: Vec<f64> = per_step.iter().map(|s| s[j]).collect();
            args.push(Tensor::from_vec(col, &[self.len])?);
        }
        let mut outs = self.f.call(&args)?.into_iter();
        {
            let _off = no_grad();
            for (_, p) in &self.params {
                let new = outs
                    .next()
                    .ok_or_else(|| crate::Error::Value("CompiledLoop: missing output".into()))?;
                if !new.shares_storage(p) {
                    p.copy_(&new)?;
                }
            }
        }
        for s in self.state.iter_mut() {
            if let Some(new) = outs.next() {
                *s = new;
            }
        }
        self.steps += self.len as u64;
        outs.next()
            .ok_or_else(|| crate::Error::Value("CompiledLoop: missing losses".into()))
    }

    /// The loop's graph: a `scan` over the training step.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The compiled loop.
    pub fn compiled(&self) -> &CompiledFn {
        &self.f
    }

    /// Optimiser steps run so far.
    pub fn steps_done(&self) -> u64 {
        self.steps
    }
}

/// The scan body made of step graph `step` (inputs: data, params, state, scalars; outputs:
/// loss, updated params, new state, [norm]): inputs (params, state, data, scalars), outputs
/// (new params, a parameter the loss does not reach passed through; new state; loss; [norm]).
fn scan_body(
    step: &Graph,
    n_in: usize,
    updated: &[bool],
    n_state: usize,
    n_scalars: usize,
    clip: usize,
) -> Result<Graph> {
    let mut b = step.clone();
    b.name = "train_step".into();
    let n_p = updated.len();
    if b.inputs().len() != n_in + n_p + n_state + n_scalars {
        bail!(Value, "CompiledLoop: the step graph has unexpected inputs");
    }
    let mut order: Vec<usize> = (n_in..n_in + n_p + n_state).collect();
    order.extend(0..n_in);
    order.extend(n_in + n_p + n_state..n_in + n_p + n_state + n_scalars);
    b.permute_inputs(&order)?;
    let outs = b.outputs().to_vec();
    let n_upd = updated.iter().filter(|u| **u).count();
    if outs.len() != 1 + n_upd + n_state + clip {
        bail!(Value, "CompiledLoop: the step graph has unexpected outputs");
    }
    let mut new_outs = Vec::with_capacity(outs.len() + n_p);
    let mut next = 1;
    for (i, &u) in updated.iter().enumerate() {
        if u {
            new_outs.push(outs[next]);
            next += 1;
        } else {
            new_outs.push(b.inputs()[i]);
        }
    }
    new_outs.extend(&outs[next..next + n_state]);
    new_outs.push(outs[0]);
    new_outs.extend(&outs[next + n_state..]);
    b.set_outputs(new_outs);
    b.verify()?;
    Ok(b)
}
