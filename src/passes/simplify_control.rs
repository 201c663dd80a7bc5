//! Simplification of control ops in the graph that calls them (their bodies go through the
//! whole pipeline when they are compiled):
//! - a `cond` on a constant predicate becomes the taken branch, inlined;
//! - a `fori_loop` with constant bounds and at most [`ControlOptions::unroll`] iterations is
//!   unrolled (so is one of zero iterations: its results are its carries);
//! - loop-invariant values (computed only from carries the body passes through unchanged)
//!   are hoisted out: computed once before the loop and passed in as new pass-through
//!   carries;
//! - carries whose results nobody reads, and that no read result or loop condition depends
//!   on, are removed (with a scan's unread per-step outputs).

use super::simplify::{copy_op, live_values, start_copy};
use crate::Result;
use crate::ir::control::{Body, Control, ControlKind};
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{Literal, Op, TensorType};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Limits of control-flow simplification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlOptions {
    /// Largest constant trip count of a `fori_loop` that is unrolled.
    pub unroll: usize,
}

impl Default for ControlOptions {
    fn default() -> ControlOptions {
        ControlOptions { unroll: 4 }
    }
}

/// Simplifies every control op of `g` (not inside its bodies).
pub fn simplify_control(g: &Graph, opts: &ControlOptions) -> Result<Graph> {
    let (mut out, mut map) = start_copy(g)?;
    // inlined and hoisted values are added before some of `g`'s are copied
    out.avoid_names_of(g);
    let outputs: HashSet<ValueId> = g.outputs().iter().copied().collect();
    // control nodes replaced by something else: their results are mapped (or unread, gone)
    let mut replaced: HashSet<ValueId> = HashSet::new();
    for v in g.topo_order() {
        let gone = g.result_of(v).is_some_and(|(t, _)| replaced.contains(&t));
        if map.contains_key(&v) || gone {
            continue;
        }
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else { continue };
        let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
        let Op::Control(c) = op else {
            map.insert(v, copy_op(&mut out, g, v, &args)?);
            continue;
        };
        // the op's result values, and which of them are read
        let results = g.results_of(v);
        let read: Vec<bool> = results
            .iter()
            .map(|r| r.is_some_and(|r| outputs.contains(&r) || !g.users(r).is_empty()))
            .collect();
        let Some(new_results) = simplify(&mut out, c, &args, &read, opts)? else {
            // unchanged: its results are copied (under their names) as any op
            map.insert(v, copy_op(&mut out, g, v, &args)?);
            continue;
        };
        replaced.insert(v);
        for (r, nv) in results.iter().zip(new_results) {
            if let (Some(r), Some(nv)) = (r, nv) {
                map.insert(*r, nv);
            }
        }
    }
    // a result nobody reads may have been dropped with its carry
    let outs = g
        .outputs()
        .iter()
        .map(|o| {
            map.get(o)
                .copied()
                .ok_or_else(|| crate::Error::Value("control: an output lost its value".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    out.set_outputs(outs);
    let out = super::dce(&out)?;
    out.verify()?;
    Ok(out)
}

/// The values replacing the results of `c` applied to `args` (`None` for a result nobody
/// reads that is gone), or `None` when nothing simplifies.
fn simplify(
    g: &mut Graph,
    c: &Control,
    args: &[ValueId],
    read: &[bool],
    opts: &ControlOptions,
) -> Result<Option<Vec<Option<ValueId>>>> {
    let types: Vec<TensorType> = args.iter().map(|&a| g.node(a).ty.clone()).collect();
    let want = c.result_types(&types.iter().collect::<Vec<_>>())?;
    match c.kind {
        ControlKind::Cond => {
            let Some(p) = constant_int(g, args[0]) else {
                return Ok(None);
            };
            let body = &super::decompose(c.bodies[if p != 0 { 0 } else { 1 }].graph())?;
            Ok(inline(g, body, &args[1..], &want)?.map(|v| v.into_iter().map(Some).collect()))
        }
        ControlKind::ForiLoop => {
            if let (Some(lo), Some(hi)) = (constant_int(g, args[0]), constant_int(g, args[1]))
                && hi.saturating_sub(lo) <= opts.unroll as i64
            {
                let mut carries = args[2..].to_vec();
                let body = &super::decompose(c.bodies[0].graph())?;
                for i in lo..hi {
                    let iv = g.add_op(Op::Constant(i64_literal(i)), &[])?;
                    let mut ins = vec![iv];
                    ins.extend(&carries);
                    match inline(g, body, &ins, &want)? {
                        Some(next) => carries = next,
                        None => return Ok(None),
                    }
                }
                return Ok(Some(carries.into_iter().map(Some).collect()));
            }
            restructure(g, c, args, read)
        }
        ControlKind::WhileLoop | ControlKind::Scan { .. } => restructure(g, c, args, read),
    }
}

/// The integer value of a constant 0-d operand (a Python scalar or a captured constant).
fn constant_int(g: &Graph, v: ValueId) -> Option<i64> {
    match g.node(v).op()? {
        Op::Scalar(Scalar::Bool(b)) => Some(*b as i64),
        Op::Scalar(Scalar::Int(i)) => Some(*i),
        Op::Constant(l) if l.shape.is_empty() => match l.dtype {
            DType::Bool => Some((*l.bytes.first()? != 0) as i64),
            DType::I64 => Some(i64::from_le_bytes(l.bytes.get(..8)?.try_into().ok()?)),
            _ => None,
        },
        _ => None,
    }
}

fn i64_literal(i: i64) -> Literal {
    Literal {
        dtype: DType::I64,
        shape: vec![],
        bytes: Arc::new(i.to_le_bytes().to_vec()),
    }
}

/// Copies `body` into `g` on `args`; its outputs, or `None` when their types are not `want`
/// (an argument's type promotes differently from the input it stands for). The callers
/// pass the body decomposed: this pass runs after `decompose`, and the body's composite
/// ops would otherwise reach the fusion pass whole.
fn inline(
    g: &mut Graph,
    body: &Graph,
    args: &[ValueId],
    want: &[TensorType],
) -> Result<Option<Vec<ValueId>>> {
    let mut map: HashMap<ValueId, ValueId> = body
        .inputs()
        .iter()
        .copied()
        .zip(args.iter().copied())
        .collect();
    for v in body.topo_order() {
        let NodeKind::Op(op) = &body.node(v).kind else {
            continue;
        };
        let ops: Vec<ValueId> = body.operands(v).iter().map(|o| map[o]).collect();
        map.insert(v, g.add_op(op.clone(), &ops)?);
    }
    let outs: Vec<ValueId> = body.outputs().iter().map(|o| map[o]).collect();
    let same = outs
        .iter()
        .zip(want)
        .all(|(&o, w)| g.node(o).ty.dtype == w.dtype && g.node(o).ty.shape == w.shape);
    Ok(same.then_some(outs))
}

/// A loop's layout: where its carries sit among the operands and the bodies' inputs and
/// outputs.
struct Layout {
    /// Operands before the carries (fori_loop's bounds).
    lead_args: usize,
    /// Body inputs before the carries (fori_loop's counter).
    lead_ins: usize,
    /// Carries.
    n: usize,
}

fn layout(c: &Control, args: usize) -> Layout {
    match c.kind {
        ControlKind::ForiLoop => Layout {
            lead_args: 2,
            lead_ins: 1,
            n: args - 2,
        },
        ControlKind::Scan { carries, .. } => Layout {
            lead_args: 0,
            lead_ins: 0,
            n: carries,
        },
        _ => Layout {
            lead_args: 0,
            lead_ins: 0,
            n: args,
        },
    }
}

/// The loop body (the last body; a while_loop's condition is the first).
fn loop_body(c: &Control) -> &Graph {
    c.bodies[c.bodies.len() - 1].graph()
}

/// Hoists loop invariants out of a loop and removes its dead carries; `None` when neither
/// applies.
fn restructure(
    g: &mut Graph,
    c: &Control,
    args: &[ValueId],
    read: &[bool],
) -> Result<Option<Vec<Option<ValueId>>>> {
    let l = layout(c, args.len());
    let body = loop_body(c);
    // 1. hoisting: the carries the body returns unchanged, and what depends only on them
    let pass: Vec<bool> = (0..l.n)
        .map(|i| body.outputs()[i] == body.inputs()[l.lead_ins + i])
        .collect();
    let mut invariant: HashSet<ValueId> = HashSet::new();
    for (i, &p) in pass.iter().enumerate() {
        if p {
            invariant.insert(body.inputs()[l.lead_ins + i]);
        }
    }
    let order = body.topo_order();
    for &v in &order {
        let Some(op) = body.node(v).op() else {
            continue;
        };
        let ops = body.operands(v);
        let pure = !matches!(op, Op::Dropout { .. } | Op::Control(_) | Op::Result { .. })
            && !op.communicates();
        if pure && ops.iter().all(|o| invariant.contains(o)) {
            invariant.insert(v);
        }
    }
    let body_outs: HashSet<ValueId> = body
        .outputs()
        .iter()
        .enumerate()
        .filter(|&(i, _)| i >= l.n || !pass[i])
        .map(|(_, &o)| o)
        .collect();
    let hoist: Vec<ValueId> = order
        .iter()
        .copied()
        .filter(|&v| {
            let Some(op) = body.node(v).op() else {
                return false;
            };
            let worth = !body.operands(v).is_empty() && !op.keeps_elements();
            // a wrapped number promotes differently from the tensor input it would become
            invariant.contains(&v)
                && worth
                && !body.node(v).ty.wrapped
                && (body_outs.contains(&v) || body.users(v).iter().any(|u| !invariant.contains(u)))
        })
        .collect();
    // 2. the values computed before the loop, and the loop with them as new carries
    let n_old = l.n;
    let (mut c, mut args, mut read) = (c.clone(), args.to_vec(), read.to_vec());
    let hoisted = !hoist.is_empty();
    if hoisted {
        let mut outer: HashMap<ValueId, ValueId> = HashMap::new();
        for (i, &p) in pass.iter().enumerate() {
            if p {
                outer.insert(body.inputs()[l.lead_ins + i], args[l.lead_args + i]);
            }
        }
        for &v in &order {
            if invariant.contains(&v) && body.node(v).op().is_some() && !outer.contains_key(&v) {
                let ops: Vec<ValueId> = body.operands(v).iter().map(|o| outer[o]).collect();
                let op = body.node(v).op().cloned().unwrap_or(Op::Contiguous);
                outer.insert(v, g.add_op(op, &ops)?);
            }
        }
        let new_args: Vec<ValueId> = hoist.iter().map(|h| outer[h]).collect();
        (c, args, read) = with_hoisted(&c, &args, &read, &l, &hoist, &new_args)?;
    }
    // 3. dead carries
    let l = layout(&c, args.len());
    let keep = live_carries(&c, &l, &read);
    let pruned = keep.iter().any(|&k| !k) || !scan_ys_read(&c, &l, &read);
    if !hoisted && !pruned {
        return Ok(None);
    }
    let (c, args, index) = prune(&c, &args, &l, &keep, &read)?;
    let vs = g.add_control(c, &args, None)?;
    // the original results: carries, then (scan) ys, which now follow the hoisted carries
    let k = hoist.len();
    Ok(Some(
        (0..read.len() - k)
            .map(|i| {
                let j = if i < n_old { i } else { i + k };
                index.get(j).copied().flatten().map(|r| vs[r])
            })
            .collect(),
    ))
}

/// The loop with `hoist` (values of its body) passed in as new carries `new_args`.
fn with_hoisted(
    c: &Control,
    args: &[ValueId],
    read: &[bool],
    l: &Layout,
    hoist: &[ValueId],
    new_args: &[ValueId],
) -> Result<(Control, Vec<ValueId>, Vec<bool>)> {
    let k = hoist.len();
    let rebody = |g: &Graph, replace: bool| -> Result<Graph> {
        let mut b = Graph::new(&format!("{}_hoisted", g.name));
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for &v in g.inputs() {
            let n = g.node(v);
            map.insert(v, b.add_input(&n.name, n.ty.clone())?);
        }
        let mut new_ins = Vec::with_capacity(k);
        for (j, &h) in hoist.iter().enumerate() {
            let name = format!("hoisted{j}");
            let ty = loop_body(c).node(h).ty.clone();
            let ty = TensorType::new(ty.dtype, ty.shape);
            let v = b.add_input(&name, ty)?;
            new_ins.push(v);
            if replace {
                map.insert(h, v);
            }
        }
        for v in g.topo_order() {
            if map.contains_key(&v) || g.node(v).op().is_none() {
                continue;
            }
            let ops: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
            map.insert(v, copy_op(&mut b, g, v, &ops)?);
        }
        // inputs: lead, carries, hoisted, then the rest (scan's xs)
        let total = b.inputs().len();
        let first_extra = total - k;
        let split = l.lead_ins + l.n;
        let mut order: Vec<usize> = (0..split).collect();
        order.extend(first_extra..total);
        order.extend(split..first_extra);
        b.permute_inputs(&order)?;
        let mut outs: Vec<ValueId> = g.outputs().iter().map(|o| map[o]).collect();
        if replace {
            // a loop body: carries, the hoisted values passed through, then ys
            let rest = outs.split_off(l.n.min(outs.len()));
            outs.extend(&new_ins);
            outs.extend(rest);
        }
        b.set_outputs(outs);
        super::dce(&b)
    };
    let bodies = match c.kind {
        ControlKind::WhileLoop => vec![
            rebody(c.bodies[0].graph(), false)?,
            rebody(loop_body(c), true)?,
        ],
        _ => vec![rebody(loop_body(c), true)?],
    };
    let kind = match c.kind {
        ControlKind::Scan { carries, reverse } => ControlKind::Scan {
            carries: carries + k,
            reverse,
        },
        other => other,
    };
    let split = l.lead_args + l.n;
    let mut new_args_all = args[..split].to_vec();
    new_args_all.extend(new_args);
    new_args_all.extend(&args[split..]);
    let mut new_read = read[..l.n].to_vec();
    new_read.extend(std::iter::repeat_n(false, k));
    new_read.extend(&read[l.n..]);
    Ok((
        Control {
            kind,
            bodies: bodies.into_iter().map(Body::new).collect(),
        },
        new_args_all,
        new_read,
    ))
}

/// Which carries stay: those read after the loop, those a while_loop's condition reads, and
/// those any staying carry or read per-step output depends on.
fn live_carries(c: &Control, l: &Layout, read: &[bool]) -> Vec<bool> {
    let body = loop_body(c);
    let carry_of = |g: &Graph, deps: &HashSet<ValueId>| -> Vec<usize> {
        (0..l.n)
            .filter(|&i| deps.contains(&g.inputs()[l.lead_ins + i]))
            .collect()
    };
    let mut keep: Vec<bool> = read[..l.n].to_vec();
    if let ControlKind::WhileLoop = c.kind {
        let cg = c.bodies[0].graph();
        for i in carry_of(cg, &live_values(cg)) {
            keep[i] = true;
        }
    }
    let ys: Vec<usize> = (l.n..read.len()).filter(|&i| read[i]).collect();
    loop {
        let mut roots: Vec<ValueId> = (0..l.n)
            .filter(|&i| keep[i])
            .map(|i| body.outputs()[i])
            .collect();
        roots.extend(ys.iter().map(|&i| body.outputs()[i]));
        let deps = ancestors(body, &roots);
        let mut changed = false;
        for i in carry_of(body, &deps) {
            if !keep[i] {
                keep[i] = true;
                changed = true;
            }
        }
        if !changed {
            return keep;
        }
    }
}

/// Whether every per-step output of a scan is read (other loops have none).
fn scan_ys_read(c: &Control, l: &Layout, read: &[bool]) -> bool {
    !matches!(c.kind, ControlKind::Scan { .. }) || read[l.n..].iter().all(|&r| r)
}

fn ancestors(g: &Graph, roots: &[ValueId]) -> HashSet<ValueId> {
    let mut seen = HashSet::new();
    let mut stack = roots.to_vec();
    while let Some(v) = stack.pop() {
        if seen.insert(v) {
            stack.extend(g.operands(v));
        }
    }
    seen
}

/// The loop without the carries `keep` drops (nor a scan's unread ys); also returns, for
/// each old result index, its new index.
fn prune(
    c: &Control,
    args: &[ValueId],
    l: &Layout,
    keep: &[bool],
    read: &[bool],
) -> Result<(Control, Vec<ValueId>, Vec<Option<usize>>)> {
    let is_scan = matches!(c.kind, ControlKind::Scan { .. });
    let keep_y: Vec<bool> = read[l.n..].iter().map(|&r| r || !is_scan).collect();
    let rebody = |g: &Graph, with_outputs: bool| -> Result<Graph> {
        let mut b = Graph::new(&format!("{}_pruned", g.name));
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for (i, &v) in g.inputs().iter().enumerate() {
            let carry = i.checked_sub(l.lead_ins).filter(|&k| k < l.n);
            if carry.is_some_and(|k| !keep[k]) {
                continue;
            }
            let n = g.node(v);
            map.insert(v, b.add_input(&n.name, n.ty.clone())?);
        }
        let outs: Vec<ValueId> = if with_outputs {
            g.outputs()
                .iter()
                .enumerate()
                .filter(|&(i, _)| if i < l.n { keep[i] } else { keep_y[i - l.n] })
                .map(|(_, &o)| o)
                .collect()
        } else {
            g.outputs().to_vec()
        };
        let live = ancestors(g, &outs);
        for v in g.topo_order() {
            if map.contains_key(&v) || g.node(v).op().is_none() || !live.contains(&v) {
                continue;
            }
            let ops = g
                .operands(v)
                .iter()
                .map(|o| map.get(o).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    crate::Error::Value("control: a kept value reads a dropped carry".into())
                })?;
            map.insert(v, copy_op(&mut b, g, v, &ops)?);
        }
        b.set_outputs(outs.iter().map(|o| map[o]).collect());
        Ok(b)
    };
    let bodies = match c.kind {
        ControlKind::WhileLoop => vec![
            rebody(c.bodies[0].graph(), false)?,
            rebody(loop_body(c), true)?,
        ],
        _ => vec![rebody(loop_body(c), true)?],
    };
    let kept = keep.iter().filter(|&&k| k).count();
    let kind = match c.kind {
        ControlKind::Scan { reverse, .. } => ControlKind::Scan {
            carries: kept,
            reverse,
        },
        other => other,
    };
    let mut new_args = args[..l.lead_args].to_vec();
    for i in 0..l.n {
        if keep[i] {
            new_args.push(args[l.lead_args + i]);
        }
    }
    new_args.extend(&args[l.lead_args + l.n..]);
    let mut index = Vec::with_capacity(read.len());
    let mut next = 0;
    for i in 0..read.len() {
        let stays = if i < l.n { keep[i] } else { keep_y[i - l.n] };
        index.push(stays.then_some(next));
        next += stays as usize;
    }
    Ok((
        Control {
            kind,
            bodies: bodies.into_iter().map(Body::new).collect(),
        },
        new_args,
        index,
    ))
}
