//! Gradients of control ops, built from their bodies' gradients (`autodiff_opts` on a body
//! graph, seeded by inputs):
//! - `cond`: a `cond` on the same predicate whose branches are the branches' gradients (the
//!   taken branch's gradient);
//! - `scan`: the forward scan made to also return the carry before every step as an extra
//!   stacked output, then a scan in the opposite direction over (saved carries, xs, the
//!   ys' cotangents) whose body is the body's gradient and whose carries are the carries'
//!   cotangents;
//! - `fori_loop` with a constant trip count: the same, as a scan over `arange(lower, upper)`;
//! - `while_loop`: refused (its trip count is data), as in JAX.

use super::graph_builder::Emit;
use super::{GradOptions, Seed, autodiff_opts};
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
    every: usize,
) -> Result<Vec<Option<ValueId>>> {
    let xs = e.g.operands(t);
    match c.kind {
        ControlKind::Cond => cond(e, c, &xs, cots, need, every),
        ControlKind::Scan { carries, reverse } => scan(
            e,
            c.bodies[0].graph(),
            &xs,
            carries,
            reverse,
            cots,
            need,
            every,
            Some(t),
        ),
        ControlKind::ForiLoop => fori(e, c, &xs, cots, need, every),
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
fn body_vjp(body: &Graph, wrt: &[usize], name: &str, every: usize) -> Result<Graph> {
    let names: Vec<String> = wrt
        .iter()
        .map(|&i| body.node(body.inputs()[i]).name.clone())
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let opts = GradOptions {
        seed: Seed::Inputs,
        checkpoint_every: every,
    };
    let mut g = autodiff_opts(body, &refs, &opts)?;
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
    every: usize,
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
        .map(|b| body_vjp(b.graph(), &wrt, &format!("{}_grad", b.0.name), every))
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
    every: usize,
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
    let g = scan(e, &body, &sxs, k - 1, false, cots, &sneed, every, None)?;
    let mut out = vec![None, None];
    out.extend(g.into_iter().take(k - 1));
    Ok(out)
}

/// Where the pieces of a scan body's gradient sit.
struct ReverseBody {
    /// Inputs (cot of float carries.., carries.., xs.., cot of float ys..); outputs
    /// (gradients of the float carries.., of the float xs..).
    graph: Graph,
    /// Positions (among the body's inputs) of the float carries and of the float xs.
    gc: Vec<usize>,
    gx: Vec<usize>,
    /// Whether each body output (carries, then ys) is float.
    float_out: Vec<bool>,
}

/// The reverse-scan body of scan body `body` with `n` carries.
fn reverse_body(body: &Graph, n: usize, every: usize) -> Result<ReverseBody> {
    let body_in: Vec<TensorType> = body
        .inputs()
        .iter()
        .map(|&v| body.node(v).ty.clone())
        .collect();
    let float_in: Vec<usize> = (0..body_in.len())
        .filter(|&i| body_in[i].dtype.is_float())
        .collect();
    let mut grad = body_vjp(body, &float_in, &format!("{}_grad", body.name), every)?;
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
    // its outputs: the float carries' gradients (carried), then the float xs'
    let grads = grad.outputs().to_vec();
    let (gc, gx): (Vec<usize>, Vec<usize>) = float_in.iter().partition(|&&i| i < n);
    let pick = |want: &[usize]| -> Vec<ValueId> {
        float_in
            .iter()
            .zip(&grads)
            .filter(|(i, _)| want.contains(i))
            .map(|(_, &g)| g)
            .collect()
    };
    let mut outs = pick(&gc);
    outs.extend(pick(&gx));
    grad.set_outputs(outs);
    if gc.len() != fc {
        bail!(
            Value,
            "scan: the body's float carries and float carry outputs differ"
        );
    }
    Ok(ReverseBody {
        graph: grad,
        gc,
        gx,
        float_out,
    })
}

/// `body` returning only its carries, and then (with `saving`) each step's incoming
/// carries as per-step outputs.
fn carries_only(body: &Graph, n: usize, saving: bool, name: &str) -> Graph {
    let mut g = body.clone();
    g.name = name.to_string();
    let mut outs = g.outputs()[..n].to_vec();
    if saving {
        outs.extend(g.inputs()[..n].iter().copied());
    }
    g.set_outputs(outs);
    g
}

fn scan_kind(carries: usize, reverse: bool) -> ControlKind {
    ControlKind::Scan { carries, reverse }
}

/// `x` of shape `[T, ..]` as `[T / k, k, ..]` (`k` divides `T`).
fn split_rows(e: &mut Emit, x: ValueId, k: usize) -> Result<ValueId> {
    let s = e.shape(x);
    let mut shape = vec![(s[0] / k.max(1)) as i64, k as i64];
    shape.extend(s[1..].iter().map(|&d| d as i64));
    e.op(Op::Reshape { shape }, &[x])
}

/// `x` of shape `[a, b, ..]` as `[a·b, ..]`.
fn merge_rows(e: &mut Emit, x: ValueId) -> Result<ValueId> {
    let s = e.shape(x);
    let mut shape = vec![(s[0] * s[1]) as i64];
    shape.extend(s[2..].iter().map(|&d| d as i64));
    e.op(Op::Reshape { shape }, &[x])
}

/// The largest divisor of `len` that is at most `every`.
fn chunk_size(len: usize, every: usize) -> usize {
    (1..=every.min(len).max(1))
        .rev()
        .find(|&d| len.is_multiple_of(d))
        .unwrap_or(1)
}

/// The gradient of a scan: saving every incoming carry (`every <= 1`: the scan node `orig`,
/// when given, is made to save them itself, so its forward runs once), or, checkpointed,
/// only every `k`-th (`k` the largest divisor of the length up to `every`): the loop then
/// runs in chunks of `k` steps, and each chunk's carries are recomputed from its first one
/// during the reverse pass.
#[allow(clippy::too_many_arguments)]
fn scan(
    e: &mut Emit,
    body: &Graph,
    xs: &[ValueId],
    n: usize,
    reverse: bool,
    cots: &[Option<ValueId>],
    need: &[bool],
    every: usize,
    orig: Option<ValueId>,
) -> Result<Vec<Option<ValueId>>> {
    let wrt = float_positions(e, xs, need);
    if wrt.is_empty() {
        return Ok(vec![None; xs.len()]);
    }
    let kind = scan_kind(n, reverse);
    let fwd = Control::new(kind, vec![body.clone()]);
    let types = result_types(e, &fwd, xs)?;
    let cots = cotangents(e, &types, cots)?;
    let rb = reverse_body(body, n, every)?;
    let fc = rb.gc.len();
    let mut carried: Vec<ValueId> = Vec::new();
    for (i, c) in cots[..n].iter().enumerate() {
        if rb.float_out[i] {
            carried.push(
                c.ok_or_else(|| crate::Error::Value("scan: a missing carry cotangent".into()))?,
            );
        }
    }
    let dys: Vec<ValueId> = cots[n..].iter().flatten().copied().collect();
    let len = e.shape(xs[n]).first().copied().unwrap_or(0);
    let k = chunk_size(len, every);
    let back_kind = scan_kind(fc, !reverse);
    let res = if k <= 1 {
        // 1. every step's incoming carries: saved by the forward scan itself, or by a
        // second forward that computes only them
        let saved = match orig {
            Some(t) => save_carries(e, t, body, n)?,
            None => {
                let saving = carries_only(body, n, true, &format!("{}_saving", body.name));
                let fwd =
                    e.g.add_control(Control::new(kind, vec![saving]), xs, None)?;
                fwd[n..].to_vec()
            }
        };
        // 2. the reverse scan: carries (cot c), xs (saved c, x, cot y)
        let mut args = carried;
        args.extend(&saved);
        args.extend(&xs[n..]);
        args.extend(&dys);
        e.g.add_control(Control::new(back_kind, vec![rb.graph]), &args, None)?
    } else {
        // chunks of k steps: xs and dys as [len / k, k, ..]
        let xc = xs[n..]
            .iter()
            .map(|&x| split_rows(e, x, k))
            .collect::<Result<Vec<_>>>()?;
        let dyc = dys
            .iter()
            .map(|&d| split_rows(e, d, k))
            .collect::<Result<Vec<_>>>()?;
        let inner = carries_only(body, n, false, &format!("{}_chunk", body.name));
        let inner_saving = carries_only(body, n, true, &format!("{}_chunk_saving", body.name));
        // 1. the forward in chunks, saving each chunk's incoming carries
        let mut outer = Graph::new(&format!("{}_chunks", body.name));
        let ins = chunk_inputs(&mut outer, body, n, k, 0)?;
        let r = outer.add_control(Control::new(kind, vec![inner]), &ins, None)?;
        let mut outs = r[..n].to_vec();
        outs.extend(&ins[..n]);
        outer.set_outputs(outs);
        let mut args = xs[..n].to_vec();
        args.extend(&xc);
        let fwd =
            e.g.add_control(Control::new(kind, vec![outer]), &args, None)?;
        // 2. per chunk, in reverse: its carries recomputed, then its steps reversed
        let mut back = Graph::new(&format!("{}_chunks_grad", body.name));
        let dc: Vec<ValueId> = rb
            .gc
            .iter()
            .map(|&i| {
                let ty = body.node(body.inputs()[i]).ty.clone();
                back.add_input(&format!("cot{i}"), TensorType::new(ty.dtype, ty.shape))
            })
            .collect::<Result<_>>()?;
        let ins = chunk_inputs(&mut back, body, n, k, rb.float_out.len() - n)?;
        let (c0, rest) = ins.split_at(n);
        let (xk, dyk) = rest.split_at(xs.len() - n);
        let mut sargs = c0.to_vec();
        sargs.extend(xk);
        let saved = back.add_control(Control::new(kind, vec![inner_saving]), &sargs, None)?;
        let mut bargs = dc;
        bargs.extend(&saved[n..]);
        bargs.extend(xk);
        bargs.extend(dyk);
        let r = back.add_control(Control::new(back_kind, vec![rb.graph]), &bargs, None)?;
        back.set_outputs(r);
        let mut args = carried;
        args.extend(&fwd[n..]);
        args.extend(&xc);
        args.extend(&dyc);
        let mut r =
            e.g.add_control(Control::new(back_kind, vec![back]), &args, None)?;
        for v in r[fc..].iter_mut() {
            *v = merge_rows(e, *v)?;
        }
        r
    };
    let mut out = vec![None; xs.len()];
    for (j, &i) in rb.gc.iter().enumerate() {
        out[i] = Some(res[j]);
    }
    for (j, &i) in rb.gx.iter().enumerate() {
        out[i] = Some(res[fc + j]);
    }
    Ok(out)
}

/// Makes scan node `t` (body `body`, `n` carries) also return every step's incoming carries
/// as per-step outputs after its own: its node and its results stay what they were, so the
/// forward values keep their nodes; returns the new results.
fn save_carries(e: &mut Emit, t: ValueId, body: &Graph, n: usize) -> Result<Vec<ValueId>> {
    let mut saving = body.clone();
    saving.name = format!("{}_saving", body.name);
    let mut outs = saving.outputs().to_vec();
    outs.extend(saving.inputs()[..n].iter().copied());
    saving.set_outputs(outs);
    let Some(Op::Control(c)) = e.g.node(t).op().cloned() else {
        bail!(
            Value,
            "scan: the node to save carries in is not a control op"
        );
    };
    let before = e.g.results_of(t).len();
    let saving = Control::new(c.kind, vec![saving]);
    let tys: Vec<TensorType> = e.g.operands(t).iter().map(|&o| e.ty(o)).collect();
    let all = saving.result_types(&tys.iter().collect::<Vec<_>>())?;
    e.g.petgraph_mut()[t].kind = crate::ir::graph::NodeKind::Op(Op::Control(Box::new(saving)));
    (before..all.len())
        .map(|i| {
            e.op(
                Op::Result {
                    index: i,
                    ty: all[i].clone(),
                },
                &[t],
            )
        })
        .collect()
}

/// Inputs added to a chunked body: the carries, each x as a chunk `[k, ..]`, then (at most
/// `dys`) cotangent chunks of the float ys.
fn chunk_inputs(
    g: &mut Graph,
    body: &Graph,
    n: usize,
    k: usize,
    dys: usize,
) -> Result<Vec<ValueId>> {
    let mut ins = Vec::new();
    for (i, &v) in body.inputs().iter().enumerate() {
        let ty = &body.node(v).ty;
        let mut shape = ty.shape.clone();
        if i >= n {
            shape.insert(0, k);
        }
        ins.push(g.add_input(&format!("in{i}"), TensorType::new(ty.dtype, shape))?);
    }
    let float_ys: Vec<TensorType> = body.outputs()[n..]
        .iter()
        .map(|&v| body.node(v).ty.clone())
        .filter(|t| t.dtype.is_float())
        .collect();
    for (j, t) in float_ys.iter().take(dys).enumerate() {
        let mut shape = t.shape.clone();
        shape.insert(0, k);
        ins.push(g.add_input(&format!("dy{j}"), TensorType::new(t.dtype, shape))?);
    }
    Ok(ins)
}
