//! Control flow that survives tracing: [`cond`], [`while_loop`], [`fori_loop`] and [`scan`]
//! (`jax.lax`'s, `torch.cond`'s). Called eagerly they run the closures as Rust control flow;
//! called under [`trace`](super::trace()) they also record one control op whose bodies are
//! the closures traced once each (on the carries' current values, which fixes their types),
//! so the loop stays a loop in the graph instead of N copies of its body. The same closure
//! code works both ways.
//!
//! Tensors a body reads from the enclosing trace (its inputs, parameters, earlier results)
//! become extra operands of the op (for loops, extra carries the body passes through), so
//! nothing traced is baked in as a constant.

use super::trace::{TracedBody, is_tracing, record_control, trace_body, untraced};
use crate::ir::control::{Control, ControlKind};
use crate::ir::graph::Graph;
use crate::ir::op::TensorType;
use crate::ir::text::fmt_type;
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `torch.cond` / `jax.lax.cond`: `then_fn(operands)` if `pred` (a one-element tensor) is
/// true, else `else_fn(operands)`. Under a trace both branches are traced and must return
/// the same types.
pub fn cond(
    pred: &Tensor,
    mut then_fn: impl FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
    mut else_fn: impl FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
    operands: &[Tensor],
) -> Result<Vec<Tensor>> {
    if pred.numel() != 1 || pred.dtype() != crate::ir::dtype::DType::Bool {
        bail!(
            Value,
            "cond: the predicate must be a bool tensor of one element, not {}",
            fmt_type(&pred.ttype())
        );
    }
    let taken = pred.item_f64()? != 0.0;
    if !is_tracing() {
        return if taken {
            then_fn(operands)
        } else {
            else_fn(operands)
        };
    }
    let mut then = trace_body(&fresh("cond_then"), operands, &[], &mut then_fn)?;
    let other = trace_body(&fresh("cond_else"), operands, &then.captures, &mut else_fn)?;
    // both branches take the operands, then every capture of either
    extend_captures(&mut then, &other.captures, false)?;
    let caps = other.captures;
    let results = untraced(|| {
        if taken {
            then_fn(operands)
        } else {
            else_fn(operands)
        }
    })?;
    // the op takes a bool[]: a one-element tensor of another shape is reshaped (traced)
    let pred_b = match pred.dim() {
        0 => pred.clone(),
        _ => pred.reshape::<i64>(&[])?,
    };
    let mut args: Vec<&Tensor> = vec![&pred_b];
    args.extend(operands);
    args.extend(&caps);
    let c = Control::new(ControlKind::Cond, vec![then.graph, other.graph]);
    record_control(c, &args, &results)?;
    Ok(results)
}

/// `jax.lax.while_loop`: while `cond_fn(carries)` (a one-element tensor) is true, `carries =
/// body(carries)`; returns the final carries. Every iteration must keep each carry's dtype
/// and shape. Not differentiable when traced (as in JAX: the trip count is data).
pub fn while_loop(
    init: &[Tensor],
    mut cond_fn: impl FnMut(&[Tensor]) -> Result<Tensor>,
    mut body: impl FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let run = |cond_fn: &mut dyn FnMut(&[Tensor]) -> Result<Tensor>,
               body: &mut dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>>|
     -> Result<Vec<Tensor>> {
        let mut carries = init.to_vec();
        while truth(&cond_fn(&carries)?, "while_loop: the condition")? {
            let next = body(&carries)?;
            check_carries("while_loop", &carries, &next)?;
            carries = next;
        }
        Ok(carries)
    };
    if !is_tracing() {
        return run(&mut cond_fn, &mut body);
    }
    let mut b = trace_body(&fresh("while_body"), init, &[], &mut body)?;
    check_body_types("while_loop", init, &b.graph)?;
    let mut as_vec = |c: &[Tensor]| cond_fn(c).map(|t| vec![t]);
    let mut c = trace_body(&fresh("while_cond"), init, &b.captures, &mut as_vec)?;
    extend_captures(&mut b, &c.captures, true)?;
    c.captures.clone_from(&b.captures);
    let out = c.graph.outputs().to_vec();
    if out.len() != 1 || !is_bool_scalar(&c.graph.node(out[0]).ty) {
        bail!(
            Value,
            "while_loop: the condition must return one bool[] tensor, not {}",
            out.iter()
                .map(|&v| fmt_type(&c.graph.node(v).ty))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let results = untraced(|| run(&mut cond_fn, &mut body))?;
    let caps = b.captures.clone();
    let mut args: Vec<&Tensor> = init.iter().collect();
    args.extend(&caps);
    let mut all = results.clone();
    all.extend(caps.iter().cloned());
    let ctl = Control::new(ControlKind::WhileLoop, vec![c.graph, b.graph]);
    record_control(ctl, &args, &all)?;
    Ok(results)
}

/// `jax.lax.fori_loop`: `carries = body(i, carries)` for `i` in `lower..upper` (an i64 0-d
/// tensor); returns the final carries.
pub fn fori_loop(
    lower: i64,
    upper: i64,
    init: &[Tensor],
    mut body: impl FnMut(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let run = |body: &mut IndexedBody| {
        let mut carries = init.to_vec();
        for i in lower..upper {
            let next = body(&Tensor::scalar(i), &carries)?;
            check_carries("fori_loop", &carries, &next)?;
            carries = next;
        }
        Ok(carries)
    };
    if !is_tracing() {
        return run(&mut body);
    }
    let mut examples = vec![Tensor::scalar(lower)];
    examples.extend(init.iter().cloned());
    let mut with_i = |xs: &[Tensor]| body(&xs[0], &xs[1..]);
    let mut b = trace_body(&fresh("fori_body"), &examples, &[], &mut with_i)?;
    check_body_types("fori_loop", init, &b.graph)?;
    extend_captures(&mut b, &[], true)?;
    let results = untraced(|| run(&mut body))?;
    let (lo, hi) = (Tensor::wrapped(lower.into()), Tensor::wrapped(upper.into()));
    let mut args: Vec<&Tensor> = vec![&lo, &hi];
    args.extend(init);
    args.extend(&b.captures);
    let mut all = results.clone();
    all.extend(b.captures.iter().cloned());
    record_control(
        Control::new(ControlKind::ForiLoop, vec![b.graph]),
        &args,
        &all,
    )?;
    Ok(results)
}

/// `jax.lax.scan`: for each slice `x_t` of the `xs` along dim 0 (from the last when
/// `reverse`), `(carries, y_t) = body(carries, x_t)`; returns the final carries and the
/// `y_t` stacked along a new dim 0 (in the xs' order).
pub fn scan(
    init: &[Tensor],
    xs: &[Tensor],
    mut body: impl FnMut(&[Tensor], &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
    reverse: bool,
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let Some(first) = xs.first() else {
        bail!(Value, "scan: expects at least one xs tensor to scan over");
    };
    let len = match first.shape().first() {
        Some(&n) => n,
        None => bail!(Value, "scan: xs 0 is 0-d; xs are sliced along dim 0"),
    };
    for (i, x) in xs.iter().enumerate() {
        if x.shape().first() != Some(&len) {
            bail!(
                Value,
                "scan: xs {i} has shape {:?} but the xs have length {len} along dim 0",
                x.shape()
            );
        }
    }
    let n = init.len();
    let mut flat = |v: &[Tensor]| -> Result<Vec<Tensor>> {
        let (c, y) = body(&v[..n], &v[n..])?;
        let mut out = c;
        out.extend(y);
        Ok(out)
    };
    let slice_at =
        |t: usize| -> Result<Vec<Tensor>> { xs.iter().map(|x| x.select(0, t as i64)).collect() };
    // eager: the loop itself; ys stacked at the end
    let run = |flat: &mut dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>>| {
        let mut carries = init.to_vec();
        let mut ys: Vec<Vec<Tensor>> = Vec::new();
        for step in 0..len {
            let t = if reverse { len - 1 - step } else { step };
            let mut inputs = carries.clone();
            inputs.extend(slice_at(t)?);
            let mut out = flat(&inputs)?;
            if out.len() < n {
                bail!(
                    Value,
                    "scan: the body returns {} carries, expected {n}",
                    out.len()
                );
            }
            let y = out.split_off(n);
            check_carries("scan", &carries, &out)?;
            carries = out;
            ys.push(y);
        }
        if reverse {
            ys.reverse();
        }
        Ok((carries, ys))
    };
    let examples = || -> Result<Vec<Tensor>> {
        let mut e = init.to_vec();
        if len > 0 {
            e.extend(slice_at(0)?);
        } else {
            e.extend(xs.iter().map(|x| Tensor::zeros(&x.shape()[1..], x.dtype())));
        }
        Ok(e)
    };
    let stack = |ys: Vec<Vec<Tensor>>, types: &[TensorType]| -> Result<Vec<Tensor>> {
        (0..types.len())
            .map(|k| {
                if ys.is_empty() {
                    let mut shape = vec![0];
                    shape.extend(&types[k].shape);
                    return Ok(Tensor::zeros(&shape, types[k].dtype));
                }
                let parts: Vec<&Tensor> = ys.iter().map(|y| &y[k]).collect();
                Tensor::stack(&parts, 0)
            })
            .collect()
    };
    if !is_tracing() {
        // the ys' types: from the first step, or from a run on zeros when there is none
        let (carries, ys) = run(&mut flat)?;
        let types: Vec<TensorType> = match ys.first() {
            Some(y) => y.iter().map(Tensor::ttype).collect(),
            None => flat(&examples()?)?[n..].iter().map(Tensor::ttype).collect(),
        };
        return Ok((carries, stack(ys, &types)?));
    }
    let mut b = trace_body(&fresh("scan_body"), &examples()?, &[], &mut flat)?;
    check_body_types("scan", init, &b.graph)?;
    let y_types: Vec<TensorType> = b.graph.outputs()[n..]
        .iter()
        .map(|&v| b.graph.node(v).ty.clone())
        .collect();
    // captures become carries: inputs (carries, captures, x_t), outputs (carries, captures, y_t)
    let k = b.captures.len();
    let nx = xs.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.extend(n + nx..n + nx + k);
    order.extend(n..n + nx);
    b.graph.permute_inputs(&order)?;
    let mut outs = b.graph.outputs().to_vec();
    let cap_inputs: Vec<_> = b.graph.inputs()[n..n + k].to_vec();
    let ys_out = outs.split_off(n);
    outs.extend(cap_inputs);
    outs.extend(ys_out);
    b.graph.set_outputs(outs);
    let (carries, ys) = untraced(|| run(&mut flat))?;
    let ys = untraced(|| stack(ys, &y_types))?;
    let mut args: Vec<&Tensor> = init.iter().collect();
    args.extend(&b.captures);
    args.extend(xs);
    let mut all = carries.clone();
    all.extend(b.captures.iter().cloned());
    all.extend(ys.iter().cloned());
    let kind = ControlKind::Scan {
        carries: n + k,
        reverse,
    };
    record_control(Control::new(kind, vec![b.graph]), &args, &all)?;
    Ok((carries, ys))
}

/// Gives body `b` inputs for the captures of `more` it lacks (it reads none of them); with
/// `pass`, returns every capture unchanged after its outputs (a loop's extra carries).
fn extend_captures(b: &mut TracedBody, more: &[Tensor], pass: bool) -> Result<()> {
    for t in &more[b.captures.len().min(more.len())..] {
        let name = format!("capture{}", b.captures.len());
        b.graph.add_input(&name, t.ttype())?;
        b.captures.push(t.clone());
    }
    if pass {
        let k = b.captures.len();
        let ins = b.graph.inputs().to_vec();
        let mut outs = b.graph.outputs().to_vec();
        outs.extend(&ins[ins.len() - k..]);
        b.graph.set_outputs(outs);
    }
    b.graph.verify()
}

/// The traced body's first outputs against the carries.
fn check_body_types(op: &str, init: &[Tensor], g: &Graph) -> Result<()> {
    let outs = g.outputs();
    if outs.len() < init.len() {
        bail!(
            Value,
            "{op}: the body returns {} values but there are {} carries",
            outs.len(),
            init.len()
        );
    }
    for (i, (t, &o)) in init.iter().zip(outs).enumerate() {
        let got = &g.node(o).ty;
        if got.dtype != t.dtype() || got.shape != t.shape() {
            bail!(
                Value,
                "{op}: carry {i} changes from {} to {} in the body",
                fmt_type(&t.ttype()),
                fmt_type(got)
            );
        }
    }
    Ok(())
}

/// An eager iteration keeps every carry's dtype and shape.
fn check_carries(op: &str, before: &[Tensor], after: &[Tensor]) -> Result<()> {
    if before.len() != after.len() {
        bail!(
            Value,
            "{op}: the body returns {} carries, expected {}",
            after.len(),
            before.len()
        );
    }
    for (i, (a, b)) in before.iter().zip(after).enumerate() {
        if a.dtype() != b.dtype() || a.shape() != b.shape() {
            bail!(
                Value,
                "{op}: carry {i} changes from {} to {} in the body",
                fmt_type(&a.ttype()),
                fmt_type(&b.ttype())
            );
        }
    }
    Ok(())
}

fn truth(t: &Tensor, what: &str) -> Result<bool> {
    if t.numel() != 1 {
        bail!(Value, "{what} must have one element, not {}", t.numel());
    }
    Ok(t.item_f64()? != 0.0)
}

fn is_bool_scalar(t: &TensorType) -> bool {
    t.dtype == crate::ir::dtype::DType::Bool && t.shape.is_empty()
}

/// A loop body that also takes the step's index.
type IndexedBody<'a> = dyn FnMut(&Tensor, &[Tensor]) -> Result<Vec<Tensor>> + 'a;

/// A body name no other body of this process has.
fn fresh(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{what}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
