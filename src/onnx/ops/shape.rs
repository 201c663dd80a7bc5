//! Ops that move, index, pad or make tensors: `Reshape`, `Transpose`, `Concat`, `Slice`,
//! `Gather`, `Pad`, `Shape`, `Constant`, ...

use super::elementwise::cast_to;
use super::{axis, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val, ints_of};
use crate::onnx::tensor::checked_sizes;
use crate::{DType, Error, Result, Tensor, bail};

fn dims_i64(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// `x` reshaped to `shape` (concrete sizes).
fn reshape_to(cx: &mut Cx, x: ValueId, shape: &[usize]) -> Result<ValueId> {
    cx.call("reshape", &[Some(x)], &[("shape", list(&dims_i64(shape)))])
}

pub fn reshape(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(target) = cx.ints_input(1, "shape")? else {
        bail!(Value, "the shape input is required");
    };
    let allow_zero = cx.int("allowzero", 0)? != 0;
    let from = cx.shape(x);
    let mut shape: Vec<i64> = Vec::with_capacity(target.len());
    for (i, &d) in target.iter().enumerate() {
        shape.push(match d {
            0 if !allow_zero => *from.get(i).ok_or_else(|| {
                Error::Value(format!(
                    "shape {target:?}: a 0 at {i} copies no dim of {from:?}"
                ))
            })? as i64,
            d if d < -1 => bail!(Value, "shape {target:?} has a negative size {d}"),
            d => d,
        });
    }
    one(cx.call("reshape", &[Some(x)], &[("shape", list(&shape))])?)
}

pub fn flatten(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let r = shape.len() as i64;
    let a = cx.int("axis", 1)?;
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        bail!(Value, "axis {a} is out of range for rank {r}");
    }
    let outer: usize = shape[..a as usize].iter().product();
    let inner: usize = shape[a as usize..].iter().product();
    one(reshape_to(cx, x, &[outer, inner])?)
}

pub fn transpose(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let r = cx.rank(x);
    let perm = cx.ints("perm")?.unwrap_or_else(|| (0..r).rev().collect());
    one(cx.call("permute", &[Some(x)], &[("dims", list(&perm))])?)
}

/// The `axes` of `Squeeze`/`Unsqueeze`: an attribute before opset 13, an input from it.
fn axes_of(cx: &Cx) -> Result<Option<Vec<i64>>> {
    if cx.opset() >= 13 {
        cx.ints_input(1, "axes")
    } else {
        cx.ints("axes")
    }
}

pub fn squeeze(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let r = shape.len() as i64;
    let out: Vec<usize> = match axes_of(cx)? {
        None => shape.iter().copied().filter(|&d| d != 1).collect(),
        Some(a) => {
            let a: Vec<i64> = a.iter().map(|&d| axis(d, r)).collect::<Result<_>>()?;
            for &d in &a {
                match shape.get(d as usize) {
                    Some(1) => {}
                    Some(n) => bail!(Value, "cannot squeeze axis {d} of size {n}"),
                    // a rank-0 input has no axis 0 to squeeze
                    None => bail!(Value, "axis {d} is out of range for rank {r}"),
                }
            }
            (0..r)
                .filter(|d| !a.contains(d))
                .map(|d| shape[d as usize])
                .collect()
        }
    };
    one(reshape_to(cx, x, &out)?)
}

pub fn unsqueeze(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let Some(a) = axes_of(cx)? else {
        bail!(Value, "axes are required");
    };
    let r = (shape.len() + a.len()) as i64;
    let mut a: Vec<i64> = a.iter().map(|&d| axis(d, r)).collect::<Result<_>>()?;
    a.sort_unstable();
    if a.windows(2).any(|w| w[0] == w[1]) {
        bail!(Value, "axes {a:?} repeat an axis");
    }
    let mut rest = shape.iter();
    let out: Vec<usize> = (0..r)
        .map(|d| {
            if a.contains(&d) {
                1
            } else {
                *rest.next().expect("rank counted above")
            }
        })
        .collect();
    one(reshape_to(cx, x, &out)?)
}

pub fn concat(cx: &mut Cx) -> Result<Vec<Val>> {
    let xs = cx.all()?;
    let Some(&first) = xs.first() else {
        bail!(Value, "needs at least one input");
    };
    let a = axis(cx.int("axis", 0)?, cx.rank(first))?;
    if xs.len() == 1 {
        return one(cx.call("contiguous", &[Some(first)], &[])?);
    }
    let ops: Vec<Option<ValueId>> = xs.into_iter().map(Some).collect();
    one(cx.call("cat", &ops, &[("dim", Attr::Int(a))])?)
}

pub fn split(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let a = axis(cx.int("axis", 0)?, shape.len() as i64)?;
    let n = shape[a as usize] as i64;
    let outputs = cx.node.output.len() as i64;
    let sizes = if cx.opset() >= 13 {
        cx.ints_input(1, "split")?
    } else {
        cx.ints("split")?
    };
    let sizes = match sizes {
        Some(s) if !s.is_empty() => s,
        _ => {
            let parts = if cx.opset() >= 18 {
                cx.int("num_outputs", outputs)?
            } else {
                outputs
            };
            if parts <= 0 {
                bail!(Value, "cannot split into {parts} parts");
            }
            // equal parts, the last one smaller when they do not divide the axis
            let each = (n + parts - 1) / parts;
            (0..parts).map(|i| (n - i * each).clamp(0, each)).collect()
        }
    };
    if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != n {
        bail!(
            Value,
            "split sizes {sizes:?} do not add up to the axis' size {n}"
        );
    }
    let mut start = 0;
    let mut outs = Vec::new();
    for s in sizes {
        let part = cx.call(
            "narrow",
            &[Some(x)],
            &[
                ("dim", Attr::Int(a)),
                ("start", Attr::Int(start)),
                ("length", Attr::Int(s)),
            ],
        )?;
        outs.push(Val::node(part));
        start += s;
    }
    Ok(outs)
}

pub fn slice(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let r = shape.len() as i64;
    let (starts, ends, axes, steps) = if cx.opset() < 10 {
        (
            cx.ints("starts")?.unwrap_or_default(),
            cx.ints("ends")?.unwrap_or_default(),
            cx.ints("axes")?,
            None,
        )
    } else {
        (
            cx.ints_input(1, "starts")?.unwrap_or_default(),
            cx.ints_input(2, "ends")?.unwrap_or_default(),
            cx.ints_input(3, "axes")?,
            cx.ints_input(4, "steps")?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        bail!(Value, "starts, ends, axes and steps differ in length");
    }
    let mut y = x;
    for i in 0..starts.len() {
        let a = axis(axes[i], r)?;
        let n = shape[a as usize] as i64;
        let step = steps[i];
        if step == 0 {
            bail!(Value, "a step of 0");
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
        let (s, e) = if step > 0 {
            (norm(starts[i]).clamp(0, n), norm(ends[i]).clamp(0, n))
        } else {
            (
                norm(starts[i]).clamp(-1, n - 1),
                norm(ends[i]).clamp(-1, n - 1),
            )
        };
        if step == 1 {
            if s == 0 && e >= n {
                continue;
            }
            let len = (e - s).max(0);
            y = cx.call(
                "narrow",
                &[Some(y)],
                &[
                    ("dim", Attr::Int(a)),
                    ("start", Attr::Int(s.min(n))),
                    ("length", Attr::Int(len)),
                ],
            )?;
        } else {
            let idx: Vec<i64> = if step > 0 {
                (s..e).step_by(step as usize).collect()
            } else {
                let mut v = Vec::new();
                let mut k = s;
                while k > e {
                    v.push(k);
                    k += step;
                }
                v
            };
            y = take(cx, y, a, &idx)?;
        }
    }
    if y == x {
        y = cx.call("contiguous", &[Some(x)], &[])?;
    }
    one(y)
}

/// The entries `idx` of `x` along `dim` (a constant index).
fn take(cx: &mut Cx, x: ValueId, dim: i64, idx: &[i64]) -> Result<ValueId> {
    let t = Tensor::from_slice(idx, &[idx.len()])?;
    let i = cx.tensor(&t)?;
    cx.call(
        "index_select",
        &[Some(x), Some(i)],
        &[("dim", Attr::Int(dim))],
    )
}

/// Indices with negative entries counted from the end of a dim of size `n`, as i64.
fn wrap_negative(cx: &mut Cx, idx: ValueId, n: usize) -> Result<ValueId> {
    let idx = cast_to(cx, idx, DType::I64)?;
    let zero = cx.scalar(0.0, DType::I64)?;
    let neg = cx.call("lt", &[Some(idx), Some(zero)], &[])?;
    let size = cx.scalar(n as f64, DType::I64)?;
    let shifted = cx.call("add", &[Some(idx), Some(size)], &[])?;
    cx.call("where", &[Some(neg), Some(shifted), Some(idx)], &[])
}

pub fn gather(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let a = axis(cx.int("axis", 0)?, shape.len() as i64)? as usize;
    let n = shape[a];
    let (idx, idx_shape) = match cx.known(1) {
        Some(t) => {
            let mut v = ints_of(t)?;
            for i in &mut v {
                if *i < -(n as i64) || *i >= n as i64 {
                    bail!(Value, "index {i} is out of range for a dim of size {n}");
                }
                if *i < 0 {
                    *i += n as i64;
                }
            }
            let s = t.shape().to_vec();
            let flat = Tensor::from_vec(v, &[s.iter().product()])?;
            (cx.tensor(&flat)?, s)
        }
        None => {
            let i = cx.x(1)?;
            let s = cx.shape(i);
            let w = wrap_negative(cx, i, n)?;
            (reshape_to(cx, w, &[s.iter().product()])?, s)
        }
    };
    let picked = cx.call(
        "index_select",
        &[Some(x), Some(idx)],
        &[("dim", Attr::Int(a as i64))],
    )?;
    let mut out = shape[..a].to_vec();
    out.extend(&idx_shape);
    out.extend(&shape[a + 1..]);
    one(reshape_to(cx, picked, &out)?)
}

pub fn gather_elements(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, i) = (cx.x(0)?, cx.x(1)?);
    let shape = cx.shape(x);
    let a = axis(cx.int("axis", 0)?, shape.len() as i64)?;
    let i = wrap_negative(cx, i, shape[a as usize])?;
    one(cx.call("gather", &[Some(x), Some(i)], &[("dim", Attr::Int(a))])?)
}

pub fn scatter_elements(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, i, u) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let shape = cx.shape(x);
    let a = axis(cx.int("axis", 0)?, shape.len() as i64)?;
    let i = wrap_negative(cx, i, shape[a as usize])?;
    one(super::index::scatter_with(cx, x, i, u, a)?)
}

pub fn expand(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(target) = cx.ints_input(1, "shape")? else {
        bail!(Value, "the shape input is required");
    };
    // bidirectional broadcast: the result has the larger of the two sizes in each dim
    let from = dims_i64(&cx.shape(x));
    let r = from.len().max(target.len());
    let pad = |v: &[i64]| -> Vec<i64> {
        let mut p = vec![1; r - v.len()];
        p.extend_from_slice(v);
        p
    };
    let (f, t) = (pad(&from), pad(&target));
    let mut out = Vec::with_capacity(r);
    for (&a, &b) in f.iter().zip(&t) {
        out.push(match (a, b) {
            (a, b) if a == b => a,
            (1, b) => b,
            (a, 1) => a,
            _ => bail!(Value, "cannot broadcast {from:?} to {target:?}"),
        });
    }
    let y = cx.call("expand", &[Some(x)], &[("size", list(&out))])?;
    one(cx.call("contiguous", &[Some(y)], &[])?)
}

pub fn tile(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(reps) = cx.ints_input(1, "repeats")? else {
        bail!(Value, "the repeats input is required");
    };
    if reps.iter().any(|&r| r < 0) {
        bail!(Value, "negative repeats {reps:?}");
    }
    one(cx.call("repeat", &[Some(x)], &[("repeats", list(&reps))])?)
}

pub fn shape(cx: &mut Cx) -> Result<Vec<Val>> {
    let dims = match cx.known(0) {
        Some(t) => dims_i64(t.shape()),
        None => {
            let x = cx.x(0)?;
            dims_i64(&cx.shape(x))
        }
    };
    let r = dims.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clampi(cx.int("start", 0)?);
    let e = clampi(cx.int("end", r)?);
    let part = if s < e {
        dims[s..e].to_vec()
    } else {
        Vec::new()
    };
    let n = part.len();
    Ok(vec![Val::known(Tensor::from_vec(part, &[n])?)])
}

pub fn size(cx: &mut Cx) -> Result<Vec<Val>> {
    let n = match cx.known(0) {
        Some(t) => t.numel(),
        None => {
            let x = cx.x(0)?;
            cx.shape(x).iter().product()
        }
    };
    Ok(vec![Val::known(Tensor::from_vec(vec![n as i64], &[])?)])
}

pub fn constant(cx: &mut Cx) -> Result<Vec<Val>> {
    let t = if let Some(t) = cx.tensor_attr("value")? {
        t
    } else if cx.attr("value_float").is_some() {
        Tensor::from_vec(vec![cx.float("value_float", 0.0)? as f32], &[])?
    } else if cx.attr("value_int").is_some() {
        Tensor::from_vec(vec![cx.int("value_int", 0)?], &[])?
    } else if let Some(v) = cx.floats("value_floats")? {
        let n = v.len();
        Tensor::from_vec(v, &[n])?
    } else if let Some(v) = cx.ints("value_ints")? {
        let n = v.len();
        Tensor::from_vec(v, &[n])?
    } else {
        bail!(
            Value,
            "a Constant needs a value (sparse and string values are not supported)"
        );
    };
    Ok(vec![Val::known(t)])
}

pub fn constant_of_shape(cx: &mut Cx) -> Result<Vec<Val>> {
    let Some(dims) = cx.ints_input(0, "shape")? else {
        bail!(Value, "the shape input is required");
    };
    let value = match cx.tensor_attr("value")? {
        Some(v) if v.numel() == 1 => v,
        Some(_) => bail!(Value, "the value must hold one element"),
        None => Tensor::from_vec(vec![0f32], &[1])?,
    };
    let dtype = value.dtype();
    let (shape, n) = checked_sizes(&dims, dtype.size(), "ConstantOfShape")?;
    let fill = value.to_dtype(DType::F64)?.to_vec::<f64>()?[0];
    let fill_attr = match dtype {
        DType::Bool => Attr::Bool(fill != 0.0),
        d if d.is_float() => Attr::Float(fill),
        _ => Attr::Int(fill as i64),
    };
    let y = cx.call(
        "full",
        &[],
        &[
            ("size", list(&dims_i64(&shape))),
            ("fill_value", fill_attr),
            ("dtype", Attr::DType(dtype)),
        ],
    )?;
    let _ = n;
    one(y)
}

pub fn eye_like(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    if shape.len() != 2 {
        bail!(Value, "expects a 2-D input, got {shape:?}");
    }
    let dtype = cx.dtype_attr("dtype")?.unwrap_or(cx.dtype(x));
    let k = cx.int("k", 0)?;
    let (rows, cols) = (shape[0] as i64, shape[1] as i64);
    let mut v = vec![0f64; shape[0] * shape[1]];
    for r in 0..rows {
        let c = r + k;
        if (0..cols).contains(&c) {
            v[(r * cols + c) as usize] = 1.0;
        }
    }
    let t = Tensor::from_vec(v, &shape)?.to_dtype(dtype)?;
    Ok(vec![Val::known(t)])
}

pub fn range(cx: &mut Cx) -> Result<Vec<Val>> {
    let dtype = {
        let x = cx.x(0)?;
        cx.dtype(x)
    };
    let get = |cx: &Cx, i: usize, what: &str| -> Result<f64> {
        cx.floats_input(i, what)?
            .and_then(|v| v.first().copied())
            .ok_or_else(|| Error::Value(format!("the {what} is required")))
    };
    let (start, limit, delta) = (
        get(cx, 0, "start")?,
        get(cx, 1, "limit")?,
        get(cx, 2, "delta")?,
    );
    if delta == 0.0 {
        bail!(Value, "a delta of 0");
    }
    let n = ((limit - start) / delta).ceil().max(0.0) as usize;
    if n > 1 << 28 {
        bail!(Value, "a range of {n} elements is too large");
    }
    // ONNX's definition: start + i * delta, in the inputs' type
    let v: Vec<f64> = (0..n).map(|i| start + i as f64 * delta).collect();
    Ok(vec![Val::known(
        Tensor::from_vec(v, &[n])?.to_dtype(dtype)?,
    )])
}

pub fn trilu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let k = cx
        .ints_input(1, "k")?
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    let name = if cx.int("upper", 1)? != 0 {
        "triu"
    } else {
        "tril"
    };
    one(cx.call(name, &[Some(x)], &[("diagonal", Attr::Int(k))])?)
}

pub fn pad(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let r = shape.len();
    let mode = cx.string("mode")?.unwrap_or_else(|| "constant".into());
    let (pads, value, axes) = if cx.opset() < 11 {
        let pads = cx.ints(if cx.opset() < 2 { "paddings" } else { "pads" })?;
        (pads, cx.float("value", 0.0)?, None)
    } else {
        let v = cx
            .floats_input(2, "constant value")?
            .and_then(|v| v.first().copied());
        (
            cx.ints_input(1, "pads")?,
            v.unwrap_or(0.0),
            cx.ints_input(3, "axes")?,
        )
    };
    let Some(pads) = pads else {
        bail!(Value, "pads are required");
    };
    let axes: Vec<i64> = match axes {
        Some(a) => a
            .iter()
            .map(|&d| axis(d, r as i64))
            .collect::<Result<_>>()?,
        None => (0..r as i64).collect(),
    };
    if pads.len() != 2 * axes.len() {
        bail!(Value, "{} pads for {} axes", pads.len(), axes.len());
    }
    let mut y = x;
    for (k, &a) in axes.iter().enumerate() {
        let (lo, hi) = (pads[k], pads[k + axes.len()]);
        if lo != 0 || hi != 0 {
            y = pad_axis(cx, y, a, lo, hi, &mode, value)?;
        }
    }
    if y == x {
        y = cx.call("contiguous", &[Some(x)], &[])?;
    }
    one(y)
}

/// Pads (or, for negative amounts, crops) dim `a` of `x` by `lo` before and `hi` after.
pub(super) fn pad_axis(
    cx: &mut Cx,
    x: ValueId,
    a: i64,
    lo: i64,
    hi: i64,
    mode: &str,
    value: f64,
) -> Result<ValueId> {
    let n = cx.shape(x)[a as usize] as i64;
    if mode == "constant" {
        let mut y = x;
        if lo < 0 || hi < 0 {
            let s = (-lo).max(0);
            let len = n - s - (-hi).max(0);
            if len < 0 {
                bail!(
                    Value,
                    "pads {lo}, {hi} crop more than the axis' {n} elements"
                );
            }
            y = cx.call(
                "narrow",
                &[Some(y)],
                &[
                    ("dim", Attr::Int(a)),
                    ("start", Attr::Int(s)),
                    ("length", Attr::Int(len)),
                ],
            )?;
        }
        let mut parts = Vec::new();
        let dtype = cx.dtype(x);
        let fill = match dtype {
            DType::Bool => Attr::Bool(value != 0.0),
            d if d.is_float() => Attr::Float(value),
            _ => Attr::Int(value as i64),
        };
        let block = |cx: &mut Cx, k: i64| -> Result<ValueId> {
            let mut s = dims_i64(&cx.shape(y));
            s[a as usize] = k;
            cx.call(
                "full",
                &[],
                &[
                    ("size", list(&s)),
                    ("fill_value", fill.clone()),
                    ("dtype", Attr::DType(dtype)),
                ],
            )
        };
        if lo > 0 {
            parts.push(Some(block(cx, lo)?));
        }
        parts.push(Some(y));
        if hi > 0 {
            parts.push(Some(block(cx, hi)?));
        }
        if parts.len() == 1 {
            return Ok(y);
        }
        return cx.call("cat", &parts, &[("dim", Attr::Int(a))]);
    }
    if n == 0 {
        bail!(Value, "cannot pad an empty axis in '{mode}' mode");
    }
    let source = |i: i64| -> Result<i64> {
        Ok(match mode {
            "edge" => i.clamp(0, n - 1),
            "wrap" => i.rem_euclid(n),
            "reflect" => {
                if n == 1 {
                    0
                } else {
                    let p = 2 * (n - 1);
                    let m = i.rem_euclid(p);
                    if m < n { m } else { p - m }
                }
            }
            other => bail!(Value, "pad mode '{other}' is not supported"),
        })
    };
    let idx: Vec<i64> = (-lo..n + hi).map(source).collect::<Result<_>>()?;
    take(cx, x, a, &idx)
}

/// `DepthToSpace`/`SpaceToDepth` as reshape, permute, reshape.
fn regroup(
    cx: &mut Cx,
    x: ValueId,
    split: &[usize],
    perm: &[i64],
    out: &[usize],
) -> Result<ValueId> {
    let s = reshape_to(cx, x, split)?;
    let p = cx.call("permute", &[Some(s)], &[("dims", list(perm))])?;
    reshape_to(cx, p, out)
}

pub fn depth_to_space(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let s = cx.shape(x);
    let b = cx.int("blocksize", 0)? as usize;
    if s.len() != 4 || b == 0 || !s[1].is_multiple_of(b * b) {
        bail!(
            Value,
            "needs a 4-D input whose channels divide by blocksize², got {s:?}"
        );
    }
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let oc = c / (b * b);
    let out = [n, oc, h * b, w * b];
    let y = if cx.string("mode")?.as_deref() == Some("CRD") {
        regroup(cx, x, &[n, oc, b, b, h, w], &[0, 1, 4, 2, 5, 3], &out)?
    } else {
        regroup(cx, x, &[n, b, b, oc, h, w], &[0, 3, 4, 1, 5, 2], &out)?
    };
    one(y)
}

pub fn space_to_depth(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let s = cx.shape(x);
    let b = cx.int("blocksize", 0)? as usize;
    if s.len() != 4 || b == 0 || !s[2].is_multiple_of(b) || !s[3].is_multiple_of(b) {
        bail!(
            Value,
            "needs a 4-D input whose height and width divide by blocksize, got {s:?}"
        );
    }
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    // DCR: channel (bh * b + bw) * C + c; CRD: channel c * b² + bh * b + bw
    let perm: &[i64] = if cx.string("mode")?.as_deref() == Some("CRD") {
        &[0, 1, 3, 5, 2, 4]
    } else {
        &[0, 3, 5, 1, 2, 4]
    };
    let y = regroup(
        cx,
        x,
        &[n, c, h / b, b, w / b, b],
        perm,
        &[n, c * b * b, h / b, w / b],
    )?;
    one(y)
}

pub fn one_hot(cx: &mut Cx) -> Result<Vec<Val>> {
    let (idx, values) = (cx.x(0)?, cx.x(2)?);
    let Some(depth) = cx
        .floats_input(1, "depth")?
        .and_then(|v| v.first().copied())
    else {
        bail!(Value, "the depth input is required");
    };
    let depth = depth as i64;
    if depth <= 0 {
        bail!(Value, "depth {depth} must be positive");
    }
    let r = cx.rank(idx) + 1;
    let a = axis(cx.int("axis", -1)?, r)?;
    let i = cast_to(cx, idx, DType::I64)?;
    let i = wrap_negative(cx, i, depth as usize)?;
    let i = cx.call("unsqueeze", &[Some(i)], &[("dim", Attr::Int(a))])?;
    let mut s = vec![1i64; r as usize];
    s[a as usize] = depth;
    let classes = cx.call(
        "arange",
        &[],
        &[
            ("end", Attr::Int(depth)),
            ("dtype", Attr::DType(DType::I64)),
        ],
    )?;
    let classes = cx.call("reshape", &[Some(classes)], &[("shape", list(&s))])?;
    let hit = cx.call("eq", &[Some(i), Some(classes)], &[])?;
    let off = cx.call(
        "select",
        &[Some(values)],
        &[("dim", Attr::Int(0)), ("index", Attr::Int(0))],
    )?;
    let on = cx.call(
        "select",
        &[Some(values)],
        &[("dim", Attr::Int(0)), ("index", Attr::Int(1))],
    )?;
    one(cx.call("where", &[Some(hit), Some(on), Some(off)], &[])?)
}

/// `CenterCropPad`: each named axis cropped or zero-padded to the size given, centred (an
/// odd difference puts the extra element at the end).
pub fn center_crop_pad(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let rank = cx.rank(x);
    let Some(sizes) = cx.ints_input(1, "shape")? else {
        bail!(Value, "input 1 (shape) is required");
    };
    let axes = match cx.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, rank))
            .collect::<Result<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    if axes.len() != sizes.len() {
        bail!(Value, "{} sizes for {} axes", sizes.len(), axes.len());
    }
    let mut y = x;
    for (&a, &want) in axes.iter().zip(&sizes) {
        let have = cx.shape(y)[a as usize] as i64;
        if want < 0 {
            bail!(Value, "size {want} for axis {a} is negative");
        }
        // positive: pad; negative: crop
        let d = want - have;
        let (lo, hi) = if d >= 0 {
            (d / 2, d - d / 2)
        } else {
            (-((-d) / 2), -((-d) - (-d) / 2))
        };
        if lo != 0 || hi != 0 {
            y = pad_axis(cx, y, a, lo, hi, "constant", 0.0)?;
        }
    }
    if y == x {
        y = cx.call("contiguous", &[Some(x)], &[])?;
    }
    one(y)
}
