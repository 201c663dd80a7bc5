//! Reverse-mode automatic differentiation as a graph pass: a graph and the inputs to
//! differentiate go in; a graph that computes the same outputs followed by one gradient
//! output `grad_<input>` per input comes out.
//!
//! The gradient nodes are appended to a copy of the graph, so every forward value keeps its
//! node (and `ValueId`): eager autograd relies on that to feed the values it already has.
//! Each op's vector-Jacobian product lives in `vjp`.

mod control_grad;
pub(crate) mod graph_builder;
pub(crate) mod vjp;

use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::Op;
use crate::{Result, bail};
use graph_builder::Emit;
use std::collections::HashMap;

/// The gradient fed into the outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Seed {
    /// Ones for every floating-point output: the gradient of the sum of all outputs.
    #[default]
    Ones,
    /// One extra graph input `grad_out<i>` per floating-point output `i`, of its type.
    Inputs,
}

/// Gradients of the sum of all outputs of `g` with respect to the named inputs.
pub fn autodiff(g: &Graph, wrt: &[&str]) -> Result<Graph> {
    autodiff_with(g, wrt, Seed::Ones)
}

/// Options of the gradient pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradOptions {
    /// The gradient fed into the outputs.
    pub seed: Seed,
    /// Checkpointing of loops: a `scan` (or constant-trip `fori_loop`) saves the carries
    /// of every `checkpoint_every`-th step only (the largest divisor of its length up to
    /// it) and recomputes the others in the reverse pass; 1 saves every step's.
    pub checkpoint_every: usize,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions {
            seed: Seed::Ones,
            checkpoint_every: 1,
        }
    }
}

/// Gradients of the outputs of `g` with respect to the named inputs, seeded as `seed` says.
/// The result's outputs are `g`'s outputs, then `grad_<input>` for each input of `wrt`.
pub fn autodiff_with(g: &Graph, wrt: &[&str], seed: Seed) -> Result<Graph> {
    autodiff_opts(
        g,
        wrt,
        &GradOptions {
            seed,
            ..GradOptions::default()
        },
    )
}

/// [`autodiff_with`] with every option.
pub fn autodiff_opts(g: &Graph, wrt: &[&str], opts: &GradOptions) -> Result<Graph> {
    let seed = opts.seed;
    let mut out = g.clone();
    let mut targets = Vec::with_capacity(wrt.len());
    for name in wrt {
        let Some(v) = g
            .inputs()
            .iter()
            .copied()
            .find(|&v| g.node(v).name == *name)
        else {
            let names: Vec<&str> = g
                .inputs()
                .iter()
                .map(|&v| g.node(v).name.as_str())
                .collect();
            bail!(
                Value,
                "graph {} has no input named '{name}' (its inputs: {})",
                g.name,
                names.join(", ")
            );
        };
        let ty = &g.node(v).ty;
        if !ty.dtype.is_float() {
            bail!(
                DType,
                "only floating-point inputs have gradients, but %{name} is {}",
                ty.dtype
            );
        }
        targets.push(v);
    }
    let float_outputs: Vec<ValueId> = g
        .outputs()
        .iter()
        .copied()
        .filter(|&v| g.node(v).ty.dtype.is_float())
        .collect();
    let mut seeds = Vec::with_capacity(float_outputs.len());
    for (i, &o) in float_outputs.iter().enumerate() {
        let ty = g.node(o).ty.clone();
        let s = match seed {
            Seed::Ones => Emit { g: &mut out }.full(&ty.shape, 1.0, ty.dtype)?,
            Seed::Inputs => {
                let mut t = ty.clone();
                t.wrapped = false;
                out.add_input(&format!("grad_out{i}"), t)?
            }
        };
        seeds.push((o, s));
    }
    let grads = backward_with(&mut out, &seeds, &targets, opts.checkpoint_every)?;
    let mut outputs = g.outputs().to_vec();
    for ((name, &v), gv) in wrt.iter().zip(&targets).zip(grads) {
        let gv = match gv {
            Some(gv) => gv,
            None => {
                if let Some(op) = blocking_op(g, v) {
                    bail!(
                        Value,
                        "cannot differentiate with respect to %{name}: it reaches the outputs only through {op}, which has no gradient"
                    );
                }
                // Unused inputs have a zero gradient.
                let ty = g.node(v).ty.clone();
                Emit { g: &mut out }.full(&ty.shape, 0.0, ty.dtype)?
            }
        };
        outputs.push(out.add_op_named(Op::Contiguous, &[gv], &format!("grad_{name}"))?);
    }
    out.set_outputs(outputs);
    out.verify()?;
    Ok(out)
}

/// The first op without a gradient on a path from `v` to an output, if `v` reaches one.
fn blocking_op(g: &Graph, v: ValueId) -> Option<&'static str> {
    let order = g.topo_order();
    let mut dep: HashMap<ValueId, bool> = HashMap::new();
    dep.insert(v, true);
    let mut first = None;
    for &n in &order {
        if n == v {
            continue;
        }
        let d = g
            .operands(n)
            .iter()
            .any(|o| dep.get(o).copied().unwrap_or(false));
        if d {
            dep.insert(n, true);
            if first.is_none()
                && !g.node(n).ty.dtype.is_float()
                && let Some(op) = g.node(n).op()
            {
                first = Some(op.name());
            }
        }
    }
    let reaches = g
        .outputs()
        .iter()
        .any(|o| dep.get(o).copied().unwrap_or(false));
    if reaches { first } else { None }
}

/// Appends the reverse sweep to `g`: `seeds` pairs values with their incoming gradients;
/// returns the gradient of each value of `wrt` (`None` when no gradient reaches it).
/// `wrt` may name any value, not only inputs.
pub(crate) fn backward(
    g: &mut Graph,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
) -> Result<Vec<Option<ValueId>>> {
    backward_with(g, seeds, wrt, 1)
}

/// [`backward`] with loops checkpointed every `every` steps ([`GradOptions`]).
fn backward_with(
    g: &mut Graph,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
    every: usize,
) -> Result<Vec<Option<ValueId>>> {
    let order = g.topo_order();
    // needs[v]: some value of `wrt` is v or flows into v through float values.
    let mut needs: HashMap<ValueId, bool> = HashMap::with_capacity(order.len());
    for &v in &order {
        // a control op's node is a marker (not float): it needs what its operands need,
        // and passes that on to its float results
        let carries = g.node(v).ty.dtype.is_float()
            || matches!(g.node(v).op(), Some(Op::Control(_)))
            || matches!(g.node(v).op(), Some(Op::Result { ty, .. }) if ty.dtype.is_float());
        let n = wrt.contains(&v)
            || (carries
                && g.operands(v)
                    .iter()
                    .any(|o| needs.get(o).copied().unwrap_or(false)));
        needs.insert(v, n);
    }
    let mut adj: HashMap<ValueId, ValueId> = HashMap::new();
    // cotangents of control ops' results, by control node and result index
    let mut results: HashMap<ValueId, Vec<Option<ValueId>>> = HashMap::new();
    let mut e = Emit { g };
    for &(v, s) in seeds {
        if needs.get(&v).copied().unwrap_or(false) {
            accumulate(&mut e, &mut adj, v, s)?;
        }
    }
    for &v in order.iter().rev() {
        if let Some((t, i)) = e.g.result_of(v) {
            if let Some(&gv) = adj.get(&v) {
                let slots = results
                    .entry(t)
                    .or_insert_with(|| vec![None; e.g.results_of(t).len()]);
                if let Some(s) = slots.get_mut(i) {
                    *s = Some(gv);
                }
            }
            continue;
        }
        let Some(op) = e.g.node(v).op().cloned() else {
            continue;
        };
        // a control op's gradient starts from its results' cotangents, any other op's
        // from its own
        let seed = match &op {
            Op::Control(_) => results.remove(&v).map(Cot::Results),
            _ => adj.get(&v).map(|&gv| Cot::Value(gv)),
        };
        let Some(seed) = seed else { continue };
        let xs = e.g.operands(v);
        let need: Vec<bool> = xs
            .iter()
            .map(|o| needs.get(o).copied().unwrap_or(false))
            .collect();
        if !need.iter().any(|&b| b) {
            continue;
        }
        let grads = match (&op, seed) {
            (Op::Control(c), Cot::Results(cots)) => {
                control_grad::vjp(&mut e, c, v, &cots, &need, every)?
            }
            (_, Cot::Value(gv)) => vjp::vjp(&mut e, &op, &xs, v, gv, &need)?,
            (_, Cot::Results(_)) => continue,
        };
        for ((&x, gx), n) in xs.iter().zip(grads).zip(need) {
            if let Some(gx) = gx
                && n
            {
                accumulate(&mut e, &mut adj, x, gx)?;
            }
        }
    }
    Ok(wrt.iter().map(|v| adj.get(v).copied()).collect())
}

/// What a node's gradient starts from.
enum Cot {
    /// Its own cotangent.
    Value(ValueId),
    /// A control op's: one per result (`None` where none reached it).
    Results(Vec<Option<ValueId>>),
}

/// Adds `gx` (summed to `x`'s shape, cast to its dtype) to the gradient of `x`.
fn accumulate(
    e: &mut Emit,
    adj: &mut HashMap<ValueId, ValueId>,
    x: ValueId,
    gx: ValueId,
) -> Result<()> {
    let ty = e.ty(x);
    if !ty.dtype.is_float() {
        return Ok(());
    }
    let s = e.sum_to(gx, &ty.shape)?;
    let s = if e.shape(s) != ty.shape {
        e.expand(s, &ty.shape)?
    } else {
        s
    };
    let s = e.cast(s, ty.dtype)?;
    let total = match adj.get(&x) {
        Some(&prev) => e.add(prev, s)?,
        None => s,
    };
    adj.insert(x, total);
    Ok(())
}
