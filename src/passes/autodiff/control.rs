//! Gradients of control ops, built from their bodies' gradients (`autodiff_with` on a body
//! graph, seeded by inputs):
//! - `cond`: a `cond` on the same predicate whose branches are the branches' gradients (the
//!   taken branch's gradient);
//! - `scan`: the forward scan run again, saving the carry before every step as an extra
//!   stacked output, then a scan in the opposite direction over (saved carries, xs, the
//!   ys' cotangents) whose body is the body's gradient and whose carries are the carries'
//!   cotangents;
//! - `fori_loop` with a constant trip count: the same, as a scan over `arange(lower, upper)`;
//! - `while_loop`: refused (its trip count is data), as in JAX.

use super::emit::Emit;
use super::{Seed, autodiff_with};
use crate::ir::control::{Control, ControlKind};
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, ValueId};
use crate::ir::op::{Op, TensorType};
use crate::{Result, bail};

/// The operand gradients of control node `t` given the cotangents of its results (`None`:
/// no gradient reaches that result). `need[i]`: operand `i` wants one.
pub(super) fn vjp(
    e: &mut Emit,
    c: &Control,
    t: ValueId,
    cots: &[Option<ValueId>],
    need: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let xs = e.g.operands(t);
    match c.kind {
        ControlKind::Cond => cond(e, c, &xs, cots, need),
        ControlKind::Scan { carries, reverse } => {
            scan(e, c.bodies[0].graph(), &xs, carries, reverse, cots, need)
        }
        ControlKind::ForiLoop => fori(e, c, &xs, cots, need),
        ControlKind::WhileLoop => bail!(
            Value,
            "while_loop is not differentiable (its trip count depends on the data, as in JAX): use fori_loop or scan with a fixed trip count"
        ),
    }
}

/// The cotangent of each result, zeros where none reached it (float results only).
fn cotangents(
    e: &mut Emit,
    types: &[TensorType],
    cots: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    types
        .iter()
        .zip(cots)
        .map(|(ty, c)| match (ty.dtype.is_float(), c) {
            (false, _) => Ok(None),
            (true, Some(c)) => Ok(Some(*c)),
            (true, None) => e.full(&ty.shape, 0.0, ty.dtype).map(Some),
        })
        .collect()
}

fn result_types(e: &Emit, c: &Control, xs: &[ValueId]) -> Result<Vec<TensorType>> {
    let tys: Vec<&TensorType> = xs.iter().map(|&x| &e.g.node(x).ty).collect();
    c.result_types(&tys)
}

/// The body's gradient graph named `name`: inputs `body`'s inputs then one cotangent per
/// float output; outputs the gradients of the inputs at `wrt` (positions).
fn body_vjp(body: &Graph, wrt: &[usize], name: &str) -> Result<Graph> {
    let names: Vec<String> = wrt
        .iter()
        .map(|&i| body.node(body.inputs()[i]).name.clone())
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut g = autodiff_with(body, &refs, Seed::Inputs)?;
    let n = body.outputs().len();
    let grads = g.outputs()[n..].to_vec();
    g.set_outputs(grads);
    g.name = name.to_string();
    Ok(g)
}

fn float_positions(e: &Emit, xs: &[ValueId], need: &[bool]) -> Vec<usize> {
    (0..xs.len())
        .filter(|&i| need.get(i).copied().unwrap_or(false) && e.g.node(xs[i]).ty.dtype.is_float())
        .collect()
}

fn cond(
    e: &mut Emit,
    c: &Control,
    xs: &[ValueId],
    cots: &[Option<ValueId>],
    need: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let types = result_types(e, c, xs)?;
    let cots = cotangents(e, &types, cots)?;
    // operand positions of the branches (after the predicate) that want a gradient
    let wrt: Vec<usize> = float_positions(e, xs, need)
        .into_iter()
        .filter(|&i| i > 0)
        .map(|i| i - 1)
        .collect();
    if wrt.is_empty() {
        return Ok(vec![None; xs.len()]);
    }
    let branches = c
        .bodies
        .iter()
        .map(|b| body_vjp(b.graph(), &wrt, &format!("{}_grad", b.0.name)))
        .collect::<Result<Vec<_>>>()?;
    let mut args = xs.to_vec();
    args.extend(cots.iter().flatten());
    let grads =
        e.g.add_control(Control::new(ControlKind::Cond, branches), &args, None)?;
    let mut out = vec![None; xs.len()];
    for (&i, gv) in wrt.iter().zip(grads) {
        out[i + 1] = Some(gv);
    }
    Ok(out)
}

fn fori(
    e: &mut Emit,
    c: &Control,
    xs: &[ValueId],
    cots: &[Option<ValueId>],
    need: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let bound = |v: ValueId| -> Option<i64> {
        match e.g.node(v).op() {
            Some(Op::Scalar(s)) => Some(s.to_f64() as i64),
            Some(Op::Constant(l)) if l.dtype == DType::I64 && l.bytes.len() == 8 => {
                Some(i64::from_le_bytes(l.bytes[..8].try_into().ok()?))
            }
            _ => None,
        }
    };
    let (Some(lo), Some(hi)) = (bound(xs[0]), bound(xs[1])) else {
        bail!(
            Value,
            "fori_loop is differentiable only with a constant trip count (integer bounds), as in JAX; its bounds here are values"
        );
    };
    // the same loop as a scan over i in lower..upper: body (carries.., i) -> (carries..)
    let mut body = c.bodies[0].graph().clone();
    let k = body.inputs().len();
    let order: Vec<usize> = (1..k).chain(std::iter::once(0)).collect();
    body.permute_inputs(&order)?;
    let n = (hi - lo).max(0) as usize;
    let steps = e.op(
        Op::Arange {
            start: lo.into(),
            end: (lo + n as i64).into(),
            step: 1i64.into(),
            dtype: Some(DType::I64),
        },
        &[],
    )?;
    let mut sxs: Vec<ValueId> = xs[2..].to_vec();
    sxs.push(steps);
    let mut sneed: Vec<bool> = need[2..].to_vec();
    sneed.push(false);
    let g = scan(e, &body, &sxs, k - 1, false, cots, &sneed)?;
    let mut out = vec![None, None];
    out.extend(g.into_iter().take(k - 1));
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn scan(
    e: &mut Emit,
    body: &Graph,
    xs: &[ValueId],
    n: usize,
    reverse: bool,
    cots: &[Option<ValueId>],
    need: &[bool],
) -> Result<Vec<Option<ValueId>>> {
    let wrt = float_positions(e, xs, need);
    if wrt.is_empty() {
        return Ok(vec![None; xs.len()]);
    }
    let kind = ControlKind::Scan {
        carries: n,
        reverse,
    };
    let fwd = Control::new(kind, vec![body.clone()]);
    let types = result_types(e, &fwd, xs)?;
    let cots = cotangents(e, &types, cots)?;
    // 1. the forward again, saving every step's incoming carries as extra ys
    let mut saving = body.clone();
    saving.name = format!("{}_saving", body.name);
    let mut outs = saving.outputs().to_vec();
    outs.extend(saving.inputs()[..n].iter().copied());
    saving.set_outputs(outs);
    let fwd_results =
        e.g.add_control(Control::new(kind, vec![saving]), xs, None)?;
    let m = types.len() - n;
    let saved = &fwd_results[n + m..];
    // 2. the body's gradient with respect to its float carries and float xs
    let body_in: Vec<TensorType> = body
        .inputs()
        .iter()
        .map(|&v| body.node(v).ty.clone())
        .collect();
    let float_in: Vec<usize> = (0..body_in.len())
        .filter(|&i| body_in[i].dtype.is_float())
        .collect();
    let mut grad = body_vjp(body, &float_in, &format!("{}_grad", body.name))?;
    // its inputs: (c.., x.., cot of float c'.., cot of float y..); a scan body wants the
    // carried cotangents first: (cot c'.., c.., x.., cot y..)
    let k = body_in.len();
    let float_out: Vec<bool> = body
        .outputs()
        .iter()
        .map(|&v| body.node(v).ty.dtype.is_float())
        .collect();
    let fc = float_out[..n].iter().filter(|&&f| f).count();
    let fy = float_out[n..].iter().filter(|&&f| f).count();
    let mut order: Vec<usize> = (k..k + fc).collect();
    order.extend(0..k);
    order.extend(k + fc..k + fc + fy);
    grad.permute_inputs(&order)?;
    // its outputs: the gradients of the float inputs; carried: those of float carries
    let grads = grad.outputs().to_vec();
    let (gc, gx): (Vec<usize>, Vec<usize>) = float_in.iter().partition(|&&i| i < n);
    let mut outs: Vec<ValueId> = Vec::new();
    for (j, &i) in float_in.iter().enumerate() {
        if i < n {
            outs.push(grads[j]);
        }
    }
    for (j, &i) in float_in.iter().enumerate() {
        if i >= n {
            outs.push(grads[j]);
        }
    }
    grad.set_outputs(outs);
    // the float carries' cotangents must line up with the float carries' gradients
    if gc.len() != fc {
        bail!(
            Value,
            "scan: the body's float carries and float carry outputs differ"
        );
    }
    // 3. the reverse scan: carries (cot c), xs (saved c, x, cot y)
    let mut args: Vec<ValueId> = Vec::new();
    for (i, c) in cots[..n].iter().enumerate() {
        if float_out[i] {
            args.push(
                c.ok_or_else(|| crate::Error::Value("scan: a missing carry cotangent".into()))?,
            );
        }
    }
    args.extend(saved.iter().copied());
    args.extend(xs[n..].iter().copied());
    args.extend(cots[n..].iter().flatten());
    let back = Control::new(
        ControlKind::Scan {
            carries: fc,
            reverse: !reverse,
        },
        vec![grad],
    );
    let res = e.g.add_control(back, &args, None)?;
    let mut out = vec![None; xs.len()];
    for (j, &i) in gc.iter().enumerate() {
        out[i] = Some(res[j]);
    }
    for (j, &i) in gx.iter().enumerate() {
        out[i] = Some(res[fc + j]);
    }
    Ok(out)
}
