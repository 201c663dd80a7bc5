//! `If`, `Loop` and `Scan`, resolved at import: `If` imports the branch its condition picks,
//! `Loop` and `Scan` import their body once per iteration. So the condition and the trip
//! count must be known at import (constants, shape arithmetic, or graph inputs the import
//! is specialized to); a condition computed at run time is an error that says so.

use super::axis;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val, ints_of};
use crate::onnx::proto::GraphProto;
use crate::{Result, Tensor, bail};

/// The most iterations a loop is unrolled to.
const MAX_ITERATIONS: usize = 4096;

pub(super) fn body(cx: &Cx, name: &str) -> Result<GraphProto> {
    match cx.attr(name).and_then(|a| a.g.clone()) {
        Some(g) => Ok(g),
        None => bail!(Value, "the graph attribute '{name}' is missing"),
    }
}

/// Imports `g`'s nodes with its inputs bound to `inputs`, and returns its outputs.
pub(super) fn inline(cx: &mut Cx, g: &GraphProto, inputs: Vec<Val>) -> Result<Vec<Val>> {
    if g.input.len() != inputs.len() {
        bail!(
            Value,
            "the body takes {} inputs, {} given",
            g.input.len(),
            inputs.len()
        );
    }
    for (i, v) in g.input.iter().zip(inputs) {
        cx.imp.bind(&i.name, v);
    }
    for t in &g.initializer {
        let value = crate::onnx::tensor::to_tensor(t, None)?;
        cx.imp.bind(&t.name, Val::known(value));
    }
    cx.imp.nodes(g)?;
    g.output
        .iter()
        .map(|o| cx.imp.get(&o.name).cloned())
        .collect()
}

fn truth(v: &Val, what: &str) -> Result<bool> {
    match &v.known {
        Some(t) => Ok(ints_of(t)?.first().is_some_and(|&x| x != 0)),
        None => bail!(
            Value,
            "the {what} is computed at run time; smelt resolves it at import"
        ),
    }
}

pub fn if_(cx: &mut Cx) -> Result<Vec<Val>> {
    let Some(cond) = cx.ints_input(0, "condition")? else {
        bail!(Value, "the condition is required");
    };
    let branch = if cond.first().is_some_and(|&c| c != 0) {
        "then_branch"
    } else {
        "else_branch"
    };
    let g = body(cx, branch)?;
    inline(cx, &g, Vec::new())
}

pub fn loop_(cx: &mut Cx) -> Result<Vec<Val>> {
    let g = body(cx, "body")?;
    let trips = cx
        .ints_input(0, "trip count")?
        .and_then(|v| v.first().copied());
    let mut cond = match cx.ints_input(1, "loop condition")? {
        Some(c) => c.first().is_some_and(|&x| x != 0),
        None => true,
    };
    let mut carried: Vec<Val> = (2..cx.n_inputs())
        .map(|i| cx.val(i))
        .collect::<Result<_>>()?;
    let n = carried.len();
    let mut scans: Vec<Vec<ValueId>> = Vec::new();
    let mut i: i64 = 0;
    while cond && trips.is_none_or(|m| i < m) {
        if i as usize >= MAX_ITERATIONS {
            bail!(Value, "more than {MAX_ITERATIONS} iterations to unroll");
        }
        let mut inputs = vec![
            Val::known(Tensor::from_vec(vec![i], &[])?),
            Val::known(Tensor::from_vec(vec![cond], &[])?),
        ];
        inputs.extend(carried.iter().cloned());
        let outs = inline(cx, &g, inputs)?;
        if outs.len() < 1 + n {
            bail!(
                Value,
                "the body gives {} outputs, at least {} expected",
                outs.len(),
                1 + n
            );
        }
        cond = truth(&outs[0], "loop condition")?;
        carried = outs[1..1 + n].to_vec();
        let extra = &outs[1 + n..];
        if scans.is_empty() {
            scans = vec![Vec::new(); extra.len()];
        }
        for (k, v) in extra.iter().enumerate() {
            let id = materialize(cx, v)?;
            scans[k].push(id);
        }
        i += 1;
    }
    let mut results = carried;
    for s in scans {
        results.push(Val::node(stack(cx, &s, 0)?));
    }
    Ok(results)
}

/// A value as a graph node (a known one becomes a constant or a parameter).
pub(super) fn materialize(cx: &mut Cx, v: &Val) -> Result<ValueId> {
    match (&v.known, v.id) {
        (_, Some(id)) => Ok(id),
        (Some(t), None) => cx.tensor(t),
        (None, None) => bail!(Value, "internal: a value with neither node nor elements"),
    }
}

fn stack(cx: &mut Cx, xs: &[ValueId], dim: i64) -> Result<ValueId> {
    if xs.is_empty() {
        bail!(
            Value,
            "a scan output of zero iterations has no shape to take"
        );
    }
    let ops: Vec<Option<ValueId>> = xs.iter().copied().map(Some).collect();
    cx.call("stack", &ops, &[("dim", Attr::Int(dim))])
}

/// One step of a scan body on `inputs`: its first `n` outputs (the carried states) and the
/// rest (the scanned outputs) as graph values.
fn body_step(
    cx: &mut Cx,
    g: &GraphProto,
    inputs: Vec<Val>,
    n: usize,
) -> Result<(Vec<Val>, Vec<ValueId>)> {
    let outs = inline(cx, g, inputs)?;
    if outs.len() < n {
        bail!(
            Value,
            "the body gives {} outputs, at least {n} expected",
            outs.len()
        );
    }
    let ys = outs[n..]
        .iter()
        .map(|v| materialize(cx, v))
        .collect::<Result<Vec<_>>>()?;
    Ok((outs[..n].to_vec(), ys))
}

/// `Scan` of opset 8: input 0 is the optional `sequence_lens`, the states and scan inputs
/// lead with a batch axis (the scan axis is 1), and the body runs on each batch element in
/// turn. Sequences shorter than the scan axis are not supported.
pub fn scan_8(cx: &mut Cx) -> Result<Vec<Val>> {
    let g = body(cx, "body")?;
    let m = cx.int("num_scan_inputs", 0)? as usize;
    let total = cx.n_inputs().saturating_sub(1);
    if m == 0 || m > total {
        bail!(Value, "num_scan_inputs {m} does not fit {total} inputs");
    }
    let n = total - m;
    let dirs = cx.ints("directions")?.unwrap_or_else(|| vec![0; m]);
    let states: Vec<ValueId> = (1..=n).map(|i| cx.x(i)).collect::<Result<_>>()?;
    let xs: Vec<ValueId> = (n + 1..=total).map(|i| cx.x(i)).collect::<Result<_>>()?;
    let lead = |cx: &Cx, v: ValueId, k: usize| cx.shape(v).get(k).copied();
    let Some(batch) = lead(cx, xs[0], 0) else {
        bail!(Value, "scan inputs need a batch axis");
    };
    let Some(len) = lead(cx, xs[0], 1) else {
        bail!(Value, "scan inputs need a sequence axis");
    };
    if xs
        .iter()
        .any(|&x| lead(cx, x, 0) != Some(batch) || lead(cx, x, 1) != Some(len))
    {
        bail!(Value, "scan inputs of different batch or sequence lengths");
    }
    if cx.has(0) {
        match cx.ints_input(0, "sequence_lens")? {
            Some(l) if l.iter().all(|&k| k == len as i64) => {}
            _ => bail!(
                Unsupported,
                "sequence_lens other than the full length {len} are not supported"
            ),
        }
    }
    if batch.saturating_mul(len) > MAX_ITERATIONS {
        bail!(Value, "more than {MAX_ITERATIONS} iterations to unroll");
    }
    let select = |cx: &mut Cx, x: ValueId, dim: i64, i: usize| {
        cx.call(
            "select",
            &[Some(x)],
            &[("dim", Attr::Int(dim)), ("index", Attr::Int(i as i64))],
        )
    };
    let mut finals: Vec<Vec<ValueId>> = vec![Vec::new(); n];
    let mut scanned: Vec<Vec<ValueId>> = Vec::new();
    for b in 0..batch {
        let mut carried: Vec<Val> = Vec::new();
        for &st in &states {
            carried.push(Val::node(select(cx, st, 0, b)?));
        }
        let mut per_step: Vec<Vec<ValueId>> = Vec::new();
        for t in 0..len {
            let mut inputs = carried.clone();
            for (j, &x) in xs.iter().enumerate() {
                let i = if dirs.get(j).copied().unwrap_or(0) != 0 {
                    len - 1 - t
                } else {
                    t
                };
                let row = select(cx, x, 0, b)?;
                inputs.push(Val::node(select(cx, row, 0, i)?));
            }
            let (next, ys) = body_step(cx, &g, inputs, n)?;
            carried = next;
            per_step.push(ys);
        }
        for (k, v) in carried.iter().enumerate() {
            finals[k].push(materialize(cx, v)?);
        }
        let k = per_step.first().map_or(0, Vec::len);
        if scanned.is_empty() {
            scanned = vec![Vec::new(); k];
        }
        for (j, col) in scanned.iter_mut().enumerate() {
            let steps: Vec<ValueId> = per_step.iter().map(|s| s[j]).collect();
            col.push(stack(cx, &steps, 0)?);
        }
    }
    let mut results = Vec::new();
    for col in finals.iter().chain(&scanned) {
        results.push(Val::node(stack(cx, col, 0)?));
    }
    Ok(results)
}

pub fn scan(cx: &mut Cx) -> Result<Vec<Val>> {
    let g = body(cx, "body")?;
    let m = cx.int("num_scan_inputs", 0)? as usize;
    let total = cx.n_inputs();
    if m == 0 || m > total {
        bail!(Value, "num_scan_inputs {m} does not fit {total} inputs");
    }
    let n = total - m;
    let in_axes = cx.ints("scan_input_axes")?.unwrap_or_else(|| vec![0; m]);
    if in_axes.len() != m {
        bail!(
            Value,
            "{} scan_input_axes for {m} scan inputs",
            in_axes.len()
        );
    }
    let in_dirs = cx
        .ints("scan_input_directions")?
        .unwrap_or_else(|| vec![0; m]);
    let mut states: Vec<Val> = (0..n).map(|i| cx.val(i)).collect::<Result<_>>()?;
    let mut xs = Vec::new();
    let mut len = None;
    for (j, &in_axis) in in_axes.iter().enumerate().take(m) {
        let x = cx.x(n + j)?;
        let a = axis(in_axis, cx.rank(x))?;
        let l = cx.shape(x)[a as usize];
        if len.is_some_and(|k| k != l) {
            bail!(Value, "scan inputs of different lengths");
        }
        len = Some(l);
        xs.push((x, a, in_dirs.get(j).copied().unwrap_or(0) != 0));
    }
    let len = len.unwrap_or(0);
    if len > MAX_ITERATIONS {
        bail!(Value, "more than {MAX_ITERATIONS} iterations to unroll");
    }
    let mut outs_per_step: Vec<Vec<ValueId>> = Vec::new();
    for t in 0..len {
        let mut inputs = states.clone();
        for &(x, a, reverse) in &xs {
            let i = if reverse { len - 1 - t } else { t };
            let e = cx.call(
                "select",
                &[Some(x)],
                &[("dim", Attr::Int(a)), ("index", Attr::Int(i as i64))],
            )?;
            inputs.push(Val::node(e));
        }
        let (next, ys) = body_step(cx, &g, inputs, n)?;
        states = next;
        outs_per_step.push(ys);
    }
    let k = outs_per_step.first().map_or(0, Vec::len);
    let out_axes = cx.ints("scan_output_axes")?.unwrap_or_else(|| vec![0; k]);
    let out_dirs = cx
        .ints("scan_output_directions")?
        .unwrap_or_else(|| vec![0; k]);
    let mut results = states;
    for j in 0..k {
        let mut col: Vec<ValueId> = outs_per_step.iter().map(|s| s[j]).collect();
        if out_dirs.get(j).copied().unwrap_or(0) != 0 {
            col.reverse();
        }
        let r = cx.rank(col[0]) + 1;
        let a = axis(out_axes.get(j).copied().unwrap_or(0), r)?;
        results.push(Val::node(stack(cx, &col, a)?));
    }
    Ok(results)
}

/// `OptionalHasElement` of a plain tensor: whether the input is given.
pub fn optional_has_element(cx: &mut Cx) -> Result<Vec<Val>> {
    let present = cx.has(0);
    Ok(vec![Val::known(Tensor::from_vec(vec![present], &[])?)])
}

/// `OptionalGetElement` of a plain tensor: the tensor.
pub fn optional_get_element(cx: &mut Cx) -> Result<Vec<Val>> {
    if !cx.has(0) {
        bail!(Value, "the optional input is empty");
    }
    Ok(vec![cx.val(0)?])
}
