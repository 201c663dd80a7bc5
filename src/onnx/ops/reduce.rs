//! Reductions, `ArgMax`/`ArgMin`, `CumSum`, `Softmax`, `LogSoftmax` and `TopK`.

use super::elementwise::cast_to;
use super::{axis, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

/// The axes a reduction runs over: the `axes` input (from `input_since`) or attribute, all of
/// them when absent or empty, or none (`noop_with_empty_axes`).
fn axes(cx: &Cx, x: ValueId, input_since: i64) -> Result<Option<Vec<i64>>> {
    let given = if cx.opset() >= input_since {
        cx.ints_input(1, "axes")?
    } else {
        cx.ints("axes")?
    };
    let rank = cx.rank(x);
    match given {
        Some(a) if !a.is_empty() => Ok(Some(
            a.iter().map(|&d| axis(d, rank)).collect::<Result<_>>()?,
        )),
        _ if cx.int("noop_with_empty_axes", 0)? != 0 => Ok(None),
        _ => Ok(Some((0..rank).collect())),
    }
}

/// `name` over the reduction's axes, then `post` (a unary op or nothing); the result keeps
/// the input's dtype.
fn reduce(
    cx: &mut Cx,
    name: &str,
    input_since: i64,
    pre: Option<&str>,
    post: Option<&str>,
) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let keep = cx.int("keepdims", 1)? != 0;
    let Some(dims) = axes(cx, x, input_since)? else {
        let y = cx.call("contiguous", &[Some(x)], &[])?;
        return one(y);
    };
    let shape = cx.shape(x);
    if dims.iter().any(|&d| shape[d as usize] == 0) {
        return one(empty_reduction(cx, x, name, post, &dims, keep)?);
    }
    let mut y = match pre {
        Some(p) => cx.call(p, &[Some(x)], &[])?,
        None => x,
    };
    if name == "prod" {
        // torch.prod takes one dim: reduce one at a time, highest first
        let mut sorted = dims.clone();
        sorted.sort_unstable();
        for &d in sorted.iter().rev() {
            y = cx.call(
                "prod",
                &[Some(y)],
                &[("dim", Attr::Int(d)), ("keepdim", Attr::Bool(keep))],
            )?;
        }
        if dims.is_empty() {
            y = cx.call("contiguous", &[Some(y)], &[])?;
        }
    } else if dims.is_empty() {
        y = cx.call("contiguous", &[Some(y)], &[])?;
    } else {
        y = cx.call(
            name,
            &[Some(y)],
            &[("dim", list(&dims)), ("keepdim", Attr::Bool(keep))],
        )?;
    }
    if let Some(p) = post {
        y = cx.call(p, &[Some(y)], &[])?;
    }
    one(cast_to(cx, y, cx.dtype(x))?)
}

/// A reduction over an empty set: its identity (ONNX's definition: 0 for sums, 1 for
/// products, -inf for maxima and log-sums, +inf for minima).
fn empty_reduction(
    cx: &mut Cx,
    x: ValueId,
    name: &str,
    post: Option<&str>,
    dims: &[i64],
    keep: bool,
) -> Result<ValueId> {
    let dtype = cx.dtype(x);
    let value = match (name, post) {
        ("sum", Some("log")) | ("logsumexp", _) | ("amax", _) => f64::NEG_INFINITY,
        ("amin", _) => f64::INFINITY,
        ("prod", _) => 1.0,
        ("sum", _) => 0.0,
        _ => f64::NAN,
    };
    let fill = if dtype.is_bool() {
        Attr::Bool(value > 0.0)
    } else if dtype.is_float() {
        Attr::Float(value)
    } else if value.is_infinite() {
        // the integer bound of that sign
        Attr::Int(if value > 0.0 {
            dtype_max(dtype)
        } else {
            dtype_min(dtype)
        })
    } else {
        Attr::Int(value as i64)
    };
    let out: Vec<i64> = cx
        .shape(x)
        .iter()
        .enumerate()
        .filter_map(|(d, &n)| match (dims.contains(&(d as i64)), keep) {
            (false, _) => Some(n as i64),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    cx.call(
        "full",
        &[],
        &[
            ("size", list(&out)),
            ("fill_value", fill),
            ("dtype", Attr::DType(dtype)),
        ],
    )
}

fn dtype_max(d: crate::DType) -> i64 {
    use crate::DType::*;
    match d {
        U8 => u8::MAX as i64,
        I8 => i8::MAX as i64,
        I16 => i16::MAX as i64,
        I32 => i32::MAX as i64,
        _ => i64::MAX,
    }
}

fn dtype_min(d: crate::DType) -> i64 {
    use crate::DType::*;
    match d {
        U8 => 0,
        I8 => i8::MIN as i64,
        I16 => i16::MIN as i64,
        I32 => i32::MIN as i64,
        _ => i64::MIN,
    }
}

pub fn reduce_sum(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "sum", 13, None, None)
}

pub fn reduce_mean(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "mean", 18, None, None)
}

pub fn reduce_max(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "amax", 18, None, None)
}

pub fn reduce_min(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "amin", 18, None, None)
}

pub fn reduce_prod(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "prod", 18, None, None)
}

pub fn reduce_l1(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "sum", 18, Some("abs"), None)
}

pub fn reduce_l2(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "sum", 18, Some("square"), Some("sqrt"))
}

pub fn reduce_log_sum(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "sum", 18, None, Some("log"))
}

pub fn reduce_log_sum_exp(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "logsumexp", 18, None, None)
}

pub fn reduce_sum_square(cx: &mut Cx) -> Result<Vec<Val>> {
    reduce(cx, "sum", 18, Some("square"), None)
}

fn arg(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let rank = cx.rank(x);
    let a = axis(cx.int("axis", 0)?, rank)?;
    let keep = Attr::Bool(cx.int("keepdims", 1)? != 0);
    if cx.int("select_last_index", 0)? == 0 {
        return one(cx.call(
            name,
            &[Some(x)],
            &[("dim", Attr::Int(a)), ("keepdim", keep)],
        )?);
    }
    // the last extreme: the first one of the flipped tensor, counted from the end
    let f = cx.call("flip", &[Some(x)], &[("dims", list(&[a]))])?;
    let i = cx.call(
        name,
        &[Some(f)],
        &[("dim", Attr::Int(a)), ("keepdim", keep)],
    )?;
    let n = cx.shape(x)[a as usize] as f64;
    let last = cx.scalar(n - 1.0, cx.dtype(i))?;
    one(cx.call("sub", &[Some(last), Some(i)], &[])?)
}

pub fn argmax(cx: &mut Cx) -> Result<Vec<Val>> {
    arg(cx, "argmax")
}

pub fn argmin(cx: &mut Cx) -> Result<Vec<Val>> {
    arg(cx, "argmin")
}

pub fn cumsum(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(a) = cx.ints_input(1, "axis")? else {
        bail!(Value, "the axis input is required");
    };
    let a = axis(a[0], cx.rank(x))?;
    let reverse = cx.int("reverse", 0)? != 0;
    let exclusive = cx.int("exclusive", 0)? != 0;
    let flip = |cx: &mut Cx, v: ValueId| cx.call("flip", &[Some(v)], &[("dims", list(&[a]))]);
    let src = if reverse { flip(cx, x)? } else { x };
    let mut y = cx.call("cumsum", &[Some(src)], &[("dim", Attr::Int(a))])?;
    if exclusive {
        y = cx.call("sub", &[Some(y), Some(src)], &[])?;
    }
    if reverse {
        y = flip(cx, y)?;
    }
    one(cast_to(cx, y, cx.dtype(x))?)
}

/// Softmax-like ops before opset 13: the input seen as 2-D `[prod(:axis), prod(axis:)]`.
fn coerced(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let rank = shape.len() as i64;
    let a = if rank == 0 {
        0
    } else {
        axis(cx.int("axis", 1)?, rank)?
    } as usize;
    let inner: usize = shape[a..].iter().product();
    let outer: usize = shape[..a].iter().product();
    let flat = cx.call(
        "reshape",
        &[Some(x)],
        &[("shape", list(&[outer as i64, inner as i64]))],
    )?;
    let y = cx.call(name, &[Some(flat)], &[("dim", Attr::Int(1))])?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    one(cx.call("reshape", &[Some(y)], &[("shape", list(&dims))])?)
}

fn along(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = axis(cx.int("axis", -1)?, cx.rank(x))?;
    one(cx.call(name, &[Some(x)], &[("dim", Attr::Int(a))])?)
}

pub fn softmax_v1(cx: &mut Cx) -> Result<Vec<Val>> {
    coerced(cx, "softmax")
}

pub fn softmax(cx: &mut Cx) -> Result<Vec<Val>> {
    along(cx, "softmax")
}

pub fn log_softmax_v1(cx: &mut Cx) -> Result<Vec<Val>> {
    coerced(cx, "log_softmax")
}

pub fn log_softmax(cx: &mut Cx) -> Result<Vec<Val>> {
    along(cx, "log_softmax")
}

/// One at the first maximum along `dim`, zero elsewhere, in `x`'s dtype.
fn hardmax_along(cx: &mut Cx, x: ValueId, dim: i64) -> Result<ValueId> {
    let n = cx.shape(x)[dim as usize];
    let i = cx.call(
        "argmax",
        &[Some(x)],
        &[("dim", Attr::Int(dim)), ("keepdim", Attr::Bool(true))],
    )?;
    let mut s = vec![1i64; cx.rank(x) as usize];
    s[dim as usize] = n as i64;
    let r = cx.call(
        "arange",
        &[],
        &[
            ("end", Attr::Int(n as i64)),
            ("dtype", Attr::DType(crate::DType::I64)),
        ],
    )?;
    let r = cx.call("reshape", &[Some(r)], &[("shape", list(&s))])?;
    let hit = cx.call("eq", &[Some(r), Some(i)], &[])?;
    cast_to(cx, hit, cx.dtype(x))
}

pub fn hardmax_v1(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let a = if shape.is_empty() {
        0
    } else {
        axis(cx.int("axis", 1)?, shape.len() as i64)?
    } as usize;
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a..].iter().product();
    let flat = cx.call(
        "reshape",
        &[Some(x)],
        &[("shape", list(&[outer as i64, inner as i64]))],
    )?;
    let y = hardmax_along(cx, flat, 1)?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    one(cx.call("reshape", &[Some(y)], &[("shape", list(&dims))])?)
}

pub fn hardmax(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = axis(cx.int("axis", -1)?, cx.rank(x))?;
    one(hardmax_along(cx, x, a)?)
}

/// The most elements along its axis a `CumProd` is unrolled over.
const CUMPROD_MAX: usize = 1024;

pub fn cumprod(cx: &mut Cx) -> Result<Vec<Val>> {
    // smelt has no running product: one multiply per position along the axis
    let x = cx.x(0)?;
    let Some(a) = cx.ints_input(1, "axis")? else {
        bail!(Value, "the axis input is required");
    };
    let a = axis(a[0], cx.rank(x))?;
    let n = cx.shape(x)[a as usize];
    if n > CUMPROD_MAX {
        bail!(
            Value,
            "a running product over {n} elements (at most {CUMPROD_MAX})"
        );
    }
    let reverse = cx.int("reverse", 0)? != 0;
    let exclusive = cx.int("exclusive", 0)? != 0;
    let at = |cx: &mut Cx, i: usize| {
        cx.call(
            "narrow",
            &[Some(x)],
            &[
                ("dim", Attr::Int(a)),
                ("start", Attr::Int(i as i64)),
                ("length", Attr::Int(1)),
            ],
        )
    };
    let order: Vec<usize> = if reverse {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    let mut parts: Vec<(usize, ValueId)> = Vec::with_capacity(n);
    let mut acc: Option<ValueId> = None;
    for &i in &order {
        let xi = at(cx, i)?;
        let next = match acc {
            Some(p) => cx.call("mul", &[Some(p), Some(xi)], &[])?,
            None => xi,
        };
        let out = match (exclusive, acc) {
            (false, _) => next,
            (true, Some(p)) => p,
            (true, None) => {
                let shape: Vec<i64> = cx.shape(xi).iter().map(|&d| d as i64).collect();
                cx.call(
                    "ones",
                    &[],
                    &[("size", list(&shape)), ("dtype", Attr::DType(cx.dtype(x)))],
                )?
            }
        };
        acc = Some(next);
        parts.push((i, out));
    }
    parts.sort_by_key(|(i, _)| *i);
    let ops: Vec<Option<ValueId>> = parts.into_iter().map(|(_, v)| Some(v)).collect();
    if ops.is_empty() {
        return one(cx.call("contiguous", &[Some(x)], &[])?);
    }
    one(cx.call("cat", &ops, &[("dim", Attr::Int(a))])?)
}

/// The largest `k` a `TopK` is unrolled to.
const MAX_TOP_K: usize = 256;

/// `TopK`: `k` rounds, each taking the largest (smallest) element not yet taken along the
/// axis and, among equal ones, the lowest index; values and indices come out sorted, as
/// ONNX allows for `sorted=0` too. Integers compare in f64 (exact below 2^53).
pub fn top_k(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let rank = shape.len() as i64;
    // K is an attribute before opset 10, an input from it
    let k = if cx.opset() < 10 {
        Some(vec![cx.int("k", -1)?])
    } else {
        cx.ints_input(1, "K")?
    };
    let k = match k.as_deref() {
        Some([k]) if *k >= 0 => *k as usize,
        other => bail!(Value, "K should be one non-negative integer, got {other:?}"),
    };
    let a = super::axis(cx.int("axis", -1)?, rank)?;
    let len = shape.get(a as usize).copied().unwrap_or(1);
    if k > len {
        bail!(
            Value,
            "K = {k} is more than the {len} elements along axis {a}"
        );
    }
    if k > MAX_TOP_K {
        bail!(Value, "K = {k} (TopK is unrolled; at most {MAX_TOP_K})");
    }
    let largest = cx.int("largest", 1)? != 0;
    let work = if cx.dtype(x) == DType::F64 || !cx.dtype(x).is_float() {
        DType::F64
    } else {
        cx.dtype(x)
    };
    let xv = cast_to(cx, x, work)?;
    let iota = cx.call(
        "arange",
        &[],
        &[
            ("start", Attr::Int(0)),
            ("end", Attr::Int(len as i64)),
            ("step", Attr::Int(1)),
            ("dtype", Attr::DType(DType::I64)),
        ],
    )?;
    let mut dims = vec![1i64; shape.len()];
    dims[a as usize] = len as i64;
    let iota = cx.call("reshape", &[Some(iota)], &[("shape", list(&dims))])?;
    let full: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut taken = cx.call(
        "full",
        &[],
        &[("size", list(&full)), ("fill_value", Attr::Bool(false))],
    )?;
    let (pick, far) = if largest {
        ("amax", f64::NEG_INFINITY)
    } else {
        ("amin", f64::INFINITY)
    };
    let far = cx.scalar(far, work)?;
    let keep = [("dim", Attr::Int(a)), ("keepdim", Attr::Bool(true))];
    let (mut vals, mut idxs) = (Vec::with_capacity(k), Vec::with_capacity(k));
    for _ in 0..k {
        let open = cx.call("where", &[Some(taken), Some(far), Some(xv)], &[])?;
        let best = cx.call(pick, &[Some(open)], &[("dim", list(&[a])), keep[1].clone()])?;
        let hit = cx.call("eq", &[Some(xv), Some(best)], &[])?;
        let free = cx.call("logical_not", &[Some(taken)], &[])?;
        let cand = cx.call("logical_and", &[Some(hit), Some(free)], &[])?;
        let cand = cast_to(cx, cand, DType::I32)?;
        // the first candidate: the lowest index among equal values
        let idx = cx.call("argmax", &[Some(cand)], &keep)?;
        let v = cx.call("gather", &[Some(x), Some(idx)], &[("dim", Attr::Int(a))])?;
        let now = cx.call("eq", &[Some(iota), Some(idx)], &[])?;
        taken = cx.call("logical_or", &[Some(taken), Some(now)], &[])?;
        vals.push(Some(v));
        idxs.push(Some(idx));
    }
    if k == 0 {
        let mut empty = full.clone();
        empty[a as usize] = 0;
        let v = cx.call(
            "zeros",
            &[],
            &[("size", list(&empty)), ("dtype", Attr::DType(cx.dtype(x)))],
        )?;
        let i = cx.call(
            "zeros",
            &[],
            &[("size", list(&empty)), ("dtype", Attr::DType(DType::I64))],
        )?;
        return Ok(vec![Val::node(v), Val::node(i)]);
    }
    let v = cx.call("cat", &vals, &[("dim", Attr::Int(a))])?;
    let i = cx.call("cat", &idxs, &[("dim", Attr::Int(a))])?;
    Ok(vec![Val::node(v), Val::node(i)])
}
