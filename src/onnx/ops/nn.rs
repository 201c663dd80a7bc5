//! Neural-network ops: `MatMul`, `Gemm`, `Conv`, pooling, normalisations, `Dropout`, `Einsum`.

use super::elementwise::cast_to;
use super::pool_taps::{Combine, Dim as TapDim, max_with_indices, pool_by_taps};
use super::shape::pad_axis;
use super::{axis, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

pub fn matmul(cx: &mut Cx) -> Result<Vec<Val>> {
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    one(cx.call("matmul", &[Some(a), Some(b)], &[])?)
}

pub fn gemm(cx: &mut Cx) -> Result<Vec<Val>> {
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    let c = cx.opt(2)?;
    let alpha = cx.float("alpha", 1.0)?;
    let beta = cx.float("beta", 1.0)?;
    let ta = cx.int("transA", 0)? != 0;
    let tb = cx.int("transB", 0)? != 0;
    if cx.rank(a) != 2 || cx.rank(b) != 2 {
        bail!(
            Value,
            "A {:?} and B {:?} must be 2-D",
            cx.shape(a),
            cx.shape(b)
        );
    }
    // the common case, a linear layer: y = a bᵀ + c
    let c_is_bias = c.is_none_or(|c| cx.rank(c) == 1 && cx.shape(c)[0] == cx.shape(b)[0]);
    if !ta && tb && alpha == 1.0 && beta == 1.0 && c_is_bias {
        return one(cx.call("linear", &[Some(a), Some(b), c], &[])?);
    }
    let a = if ta {
        cx.call("t", &[Some(a)], &[])?
    } else {
        a
    };
    let b = if tb {
        cx.call("t", &[Some(b)], &[])?
    } else {
        b
    };
    let mut y = cx.call("matmul", &[Some(a), Some(b)], &[])?;
    if alpha != 1.0 {
        let s = cx.scalar(alpha, cx.dtype(y))?;
        y = cx.call("mul", &[Some(y), Some(s)], &[])?;
    }
    if let Some(c) = c {
        let c = if beta != 1.0 {
            let s = cx.scalar(beta, cx.dtype(c))?;
            cx.call("mul", &[Some(c), Some(s)], &[])?
        } else {
            c
        };
        y = cx.call("add", &[Some(y), Some(c)], &[])?;
    }
    one(y)
}

pub fn einsum(cx: &mut Cx) -> Result<Vec<Val>> {
    let xs = cx.all()?;
    let eq = cx.string("equation")?.unwrap_or_default().replace(' ', "");
    let ops: Vec<Option<ValueId>> = xs.into_iter().map(Some).collect();
    one(cx.call("einsum", &ops, &[("equation", Attr::Str(eq))])?)
}

/// Spatial geometry shared by `Conv` and pooling: kernel, strides, dilations and the
/// padding resolved to (begin, end) per spatial dim.
struct Window {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    lo: Vec<i64>,
    hi: Vec<i64>,
}

/// The largest kernel size, stride, dilation or padding a window may have.
const MAX_WINDOW: i64 = 1 << 24;

fn window(cx: &Cx, spatial: &[usize], kernel: Vec<i64>) -> Result<Window> {
    let n = spatial.len();
    let strides = cx.ints("strides")?.unwrap_or_else(|| vec![1; n]);
    let dilations = cx.ints("dilations")?.unwrap_or_else(|| vec![1; n]);
    if kernel.len() != n || strides.len() != n || dilations.len() != n {
        bail!(Value, "kernel, strides and dilations must have {n} entries");
    }
    // the window arithmetic divides by strides and multiplies sizes: keep it in range
    let positive = |xs: &[i64]| xs.iter().all(|&x| (1..=MAX_WINDOW).contains(&x));
    if !positive(&kernel) || !positive(&strides) || !positive(&dilations) {
        bail!(
            Value,
            "kernel {kernel:?}, strides {strides:?} and dilations {dilations:?} must lie in \
             1..={MAX_WINDOW}"
        );
    }
    let auto = cx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let (lo, hi) = match auto.as_str() {
        "NOTSET" => {
            let p = cx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * n]);
            if p.len() != 2 * n {
                bail!(Value, "pads must have {} entries, got {}", 2 * n, p.len());
            }
            if p.iter().any(|&x| !(0..=MAX_WINDOW).contains(&x)) {
                bail!(Value, "pads {p:?} must lie in 0..={MAX_WINDOW}");
            }
            (p[..n].to_vec(), p[n..].to_vec())
        }
        "VALID" => (vec![0; n], vec![0; n]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let (mut lo, mut hi) = (vec![0; n], vec![0; n]);
            for i in 0..n {
                let size = spatial[i] as i64;
                let out = (size + strides[i] - 1) / strides[i];
                let span = (kernel[i] - 1) * dilations[i] + 1;
                let total = ((out - 1) * strides[i] + span - size).max(0);
                let small = total / 2;
                (lo[i], hi[i]) = if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
            }
            (lo, hi)
        }
        other => bail!(Value, "auto_pad '{other}' is not supported"),
    };
    Ok(Window {
        kernel,
        strides,
        dilations,
        lo,
        hi,
    })
}

/// Pads `x`'s spatial dims explicitly by `lo`/`hi` with `value` (for paddings the op itself
/// cannot express).
fn pad_spatial(cx: &mut Cx, x: ValueId, w: &Window, value: f64) -> Result<ValueId> {
    let mut y = x;
    for i in 0..w.lo.len() {
        if w.lo[i] != 0 || w.hi[i] != 0 {
            y = pad_axis(cx, y, 2 + i as i64, w.lo[i], w.hi[i], "constant", value)?;
        }
    }
    Ok(y)
}

/// The operands of a convolution (input, weight, optional bias) and the input's and the
/// weight's shapes; inputs of other ranks than 1-D and 2-D convolutions take are an error.
#[allow(clippy::type_complexity)]
fn conv_operands(
    cx: &mut Cx,
    what: &str,
) -> Result<(ValueId, ValueId, Option<ValueId>, Vec<usize>, Vec<usize>)> {
    let (x, wt) = (cx.x(0)?, cx.x(1)?);
    let b = cx.opt(2)?;
    let (xs, ws) = conv_shapes(cx, x, wt, what)?;
    Ok((x, wt, b, xs, ws))
}

/// The input's and the weight's shapes of a 1-D or 2-D convolution.
fn conv_shapes(cx: &Cx, x: ValueId, wt: ValueId, what: &str) -> Result<(Vec<usize>, Vec<usize>)> {
    let (xs, ws) = (cx.shape(x), cx.shape(wt));
    if xs.len() < 3 || xs.len() > 4 {
        bail!(
            Value,
            "only 1-D and 2-D {what} are supported, got input {xs:?}"
        );
    }
    if ws.len() != xs.len() {
        bail!(
            Value,
            "a weight of shape {ws:?} for an input of shape {xs:?}"
        );
    }
    Ok((xs, ws))
}

pub fn conv(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, wt) = (cx.x(0)?, cx.x(1)?);
    let b = cx.opt(2)?;
    one(conv_of(cx, x, wt, b)?)
}

/// `Conv` of `x` by `wt` (plus `b`) with the node's window attributes.
pub(super) fn conv_of(cx: &mut Cx, x: ValueId, wt: ValueId, b: Option<ValueId>) -> Result<ValueId> {
    let (xs, ws) = conv_shapes(cx, x, wt, "convolutions")?;
    let kernel = cx
        .ints("kernel_shape")?
        .unwrap_or_else(|| ws[2..].iter().map(|&d| d as i64).collect());
    let w = window(cx, &xs[2..], kernel)?;
    let group = cx.int("group", 1)?;
    let (x, padding) = if w.lo == w.hi {
        (x, w.lo.clone())
    } else {
        (pad_spatial(cx, x, &w, 0.0)?, vec![0; w.lo.len()])
    };
    let name = if xs.len() == 3 { "conv1d" } else { "conv2d" };
    cx.call(
        name,
        &[Some(x), Some(wt), b],
        &[
            ("stride", list(&w.strides)),
            ("padding", list(&padding)),
            ("dilation", list(&w.dilations)),
            ("groups", Attr::Int(group)),
        ],
    )
}

/// Runs a 2-D pooling on a 1-D input `[N, C, L]` as `[N, C, 1, L]`.
fn pool(
    cx: &mut Cx,
    f: impl FnOnce(&mut Cx, ValueId, &Window) -> Result<ValueId>,
) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let xs = cx.shape(x);
    let Some(kernel) = cx.ints("kernel_shape")? else {
        bail!(Value, "kernel_shape is required");
    };
    let mut w = window(cx, &xs[2.min(xs.len())..], kernel)?;
    match xs.len() {
        4 => one(f(cx, x, &w)?),
        3 => {
            let mut s = xs.clone();
            s.insert(2, 1);
            let x2 = cx.call("reshape", &[Some(x)], &[("shape", list(&dims(&s)))])?;
            for v in [
                &mut w.kernel,
                &mut w.strides,
                &mut w.dilations,
                &mut w.lo,
                &mut w.hi,
            ] {
                v.insert(0, 0);
            }
            fix_1d(&mut w);
            let y = f(cx, x2, &w)?;
            let mut ys = cx.shape(y);
            ys.remove(2);
            one(cx.call("reshape", &[Some(y)], &[("shape", list(&dims(&ys)))])?)
        }
        _ => bail!(
            Value,
            "only 1-D and 2-D pooling is supported, got input {xs:?}"
        ),
    }
}

/// The inserted leading spatial dim of a 1-D pooling: a window of 1, stride 1, no padding.
fn fix_1d(w: &mut Window) {
    w.kernel[0] = 1;
    w.strides[0] = 1;
    w.dilations[0] = 1;
    w.lo[0] = 0;
    w.hi[0] = 0;
}

fn dims(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// Whether a pooling's padding is what PyTorch's pooling takes: the same on both sides and at
/// most half the window.
fn torch_padding(w: &Window) -> bool {
    w.lo == w.hi && w.lo.iter().zip(&w.kernel).all(|(&p, &k)| 2 * p <= k)
}

/// Input 0 of a pooling and its window, as the tap-by-tap path takes them.
fn pool_window(cx: &mut Cx) -> Result<(ValueId, Window, Vec<TapDim>)> {
    let x = cx.x(0)?;
    let xs = cx.shape(x);
    let Some(kernel) = cx.ints("kernel_shape")? else {
        bail!(Value, "kernel_shape is required");
    };
    if xs.len() < 3 {
        bail!(
            Value,
            "pooling needs an input of rank 3 or more, got {xs:?}"
        );
    }
    let w = window(cx, &xs[2..], kernel)?;
    let dims = tap_dims(&w);
    Ok((x, w, dims))
}

/// `MaxPool` with its `Indices` output, tap by tap.
fn max_pool_with_indices(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, _, dims) = pool_window(cx)?;
    let ceil = cx.int("ceil_mode", 0)? != 0;
    let col_major = cx.int("storage_order", 0)? != 0;
    let (v, i) = max_with_indices(cx, x, &dims, ceil, col_major)?;
    Ok(vec![Val::node(v), Val::node(i)])
}

fn tap_dims(w: &Window) -> Vec<TapDim> {
    (0..w.kernel.len())
        .map(|i| TapDim {
            kernel: w.kernel[i],
            stride: w.strides[i],
            dilation: w.dilations[i],
            lo: w.lo[i],
            hi: w.hi[i],
        })
        .collect()
}

/// The pooling of input 0 tap by tap (`pool_taps`) where the 2-D kernels cannot run it:
/// a 3-D window, or a dilated one when `dilated` says the kernel lacks dilation.
fn by_taps(cx: &mut Cx, dilated: bool, how: Combine) -> Result<Option<Vec<Val>>> {
    let (x, w, dims) = pool_window(cx)?;
    let xs = cx.shape(x);
    let needed = xs.len() == 5 || dilated && w.dilations.iter().any(|&d| d != 1);
    if !needed {
        return Ok(None);
    }
    let ceil = cx.int("ceil_mode", 0)? != 0;
    Ok(Some(one(pool_by_taps(cx, x, &dims, ceil, how)?)?))
}

pub fn max_pool(cx: &mut Cx) -> Result<Vec<Val>> {
    if cx.node.output.get(1).is_some_and(|n| !n.is_empty()) {
        return max_pool_with_indices(cx);
    }
    if let Some(y) = by_taps(cx, false, Combine::Max)? {
        return Ok(y);
    }
    let ceil = cx.int("ceil_mode", 0)? != 0;
    pool(cx, |cx, x, w| {
        let (x, padding) = if torch_padding(w) {
            (x, w.lo.clone())
        } else {
            (pad_spatial(cx, x, w, f64::NEG_INFINITY)?, vec![0; 2])
        };
        cx.call(
            "max_pool2d",
            &[Some(x)],
            &[
                ("kernel_size", list(&w.kernel)),
                ("stride", list(&w.strides)),
                ("padding", list(&padding)),
                ("dilation", list(&w.dilations)),
                ("ceil_mode", Attr::Bool(ceil)),
            ],
        )
    })
}

pub fn average_pool(cx: &mut Cx) -> Result<Vec<Val>> {
    let ceil = cx.int("ceil_mode", 0)? != 0;
    let include = cx.int("count_include_pad", 0)? != 0;
    if let Some(y) = by_taps(
        cx,
        true,
        Combine::Mean {
            include_pad: include,
        },
    )? {
        return Ok(y);
    }
    pool(cx, |cx, x, w| {
        if w.dilations.iter().any(|&d| d != 1) {
            bail!(Value, "dilated average pooling is not supported");
        }
        let avg = |cx: &mut Cx, v: ValueId, padding: &[i64], include: bool| {
            cx.call(
                "avg_pool2d",
                &[Some(v)],
                &[
                    ("kernel_size", list(&w.kernel)),
                    ("stride", list(&w.strides)),
                    ("padding", list(padding)),
                    ("ceil_mode", Attr::Bool(ceil)),
                    ("count_include_pad", Attr::Bool(include)),
                ],
            )
        };
        if torch_padding(w) {
            return avg(cx, x, &w.lo, include);
        }
        let padded = pad_spatial(cx, x, w, 0.0)?;
        let sums = avg(cx, padded, &[0, 0], true)?;
        if include {
            return Ok(sums);
        }
        // the mean over the real elements: pooled values over pooled ones of a padded mask
        let ones = cx.call(
            "ones",
            &[],
            &[
                ("size", list(&dims(&cx.shape(x)))),
                ("dtype", Attr::DType(cx.dtype(x))),
            ],
        )?;
        let mask = pad_spatial(cx, ones, w, 0.0)?;
        let counts = avg(cx, mask, &[0, 0], true)?;
        cx.call("div", &[Some(sums), Some(counts)], &[])
    })
}

fn global(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let r = cx.rank(x);
    let spatial: Vec<i64> = (2..r).collect();
    one(cx.call(
        name,
        &[Some(x)],
        &[("dim", list(&spatial)), ("keepdim", Attr::Bool(true))],
    )?)
}

pub fn global_average_pool(cx: &mut Cx) -> Result<Vec<Val>> {
    global(cx, "mean")
}

pub fn global_max_pool(cx: &mut Cx) -> Result<Vec<Val>> {
    global(cx, "amax")
}

pub fn batch_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, scale, b, mean, var) = (cx.x(0)?, cx.x(1)?, cx.x(2)?, cx.x(3)?, cx.x(4)?);
    let eps = cx.float("epsilon", 1e-5)?;
    let training = cx.int("training_mode", 0)? != 0;
    if !training {
        if cx.node.output.iter().skip(1).any(|o| !o.is_empty()) {
            bail!(
                Value,
                "running statistics are outputs only in training mode (opset 14)"
            );
        }
        return one(cx.call(
            "batch_norm",
            &[Some(x), Some(mean), Some(var), Some(scale), Some(b)],
            &[("training", Attr::Bool(false)), ("eps", Attr::Float(eps))],
        )?);
    }
    if cx.opset() < 14 {
        bail!(
            Value,
            "training mode is supported from opset 14 (training_mode=1)"
        );
    }
    // the batch's statistics over every dim but the channels (biased variance), the
    // running ones moved towards them by 1 - momentum
    let momentum = cx.float("momentum", 0.9)?;
    let r = cx.rank(x);
    let dims: Vec<i64> = (0..r).filter(|&d| d != 1).collect();
    let reduce = |cx: &mut Cx, op: &str, v: ValueId, extra: &[(&str, Attr)]| {
        let mut attrs = vec![("dim", list(&dims)), ("keepdim", Attr::Bool(false))];
        attrs.extend(extra.iter().cloned());
        cx.call(op, &[Some(v)], &attrs)
    };
    let batch_mean = reduce(cx, "mean", x, &[])?;
    let batch_var = reduce(cx, "var", x, &[("correction", Attr::Int(0))])?;
    let y = cx.call(
        "batch_norm",
        &[
            Some(x),
            Some(batch_mean),
            Some(batch_var),
            Some(scale),
            Some(b),
        ],
        &[("training", Attr::Bool(false)), ("eps", Attr::Float(eps))],
    )?;
    let dtype = cx.dtype(x);
    let running = |cx: &mut Cx, old: ValueId, new: ValueId| -> Result<ValueId> {
        let m = cx.scalar(momentum, cx.dtype(old))?;
        let k = cx.scalar(1.0 - momentum, cx.dtype(new))?;
        let a = cx.call("mul", &[Some(old), Some(m)], &[])?;
        let c = cx.call("mul", &[Some(new), Some(k)], &[])?;
        let s = cx.call("add", &[Some(a), Some(c)], &[])?;
        super::elementwise::cast_to(cx, s, dtype)
    };
    let new_mean = running(cx, mean, batch_mean)?;
    let new_var = running(cx, var, batch_var)?;
    Ok(vec![Val::node(y), Val::node(new_mean), Val::node(new_var)])
}

/// `v` of shape `[C]` reshaped to broadcast over dim 1 of a rank-`r` tensor.
fn per_channel(cx: &mut Cx, v: ValueId, r: usize) -> Result<ValueId> {
    if r < 2 {
        bail!(Value, "the input has rank {r}, so no channel dim (dim 1)");
    }
    let mut s = vec![1i64; r];
    s[1] = -1;
    cx.call("reshape", &[Some(v)], &[("shape", list(&s))])
}

pub fn instance_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, scale, b) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let eps = cx.float("epsilon", 1e-5)?;
    let r = cx.rank(x) as usize;
    let spatial = list(&(2..r as i64).collect::<Vec<_>>());
    let keep = ("keepdim", Attr::Bool(true));
    let mean = cx.call(
        "mean",
        &[Some(x)],
        &[("dim", spatial.clone()), keep.clone()],
    )?;
    let var = cx.call(
        "var",
        &[Some(x)],
        &[("dim", spatial), ("correction", Attr::Int(0)), keep],
    )?;
    let e = cx.scalar(eps, cx.dtype(x))?;
    let ve = cx.call("add", &[Some(var), Some(e)], &[])?;
    let inv = cx.call("rsqrt", &[Some(ve)], &[])?;
    let c = cx.call("sub", &[Some(x), Some(mean)], &[])?;
    let n = cx.call("mul", &[Some(c), Some(inv)], &[])?;
    let s = per_channel(cx, scale, r)?;
    let bb = per_channel(cx, b, r)?;
    let y = cx.call("mul", &[Some(n), Some(s)], &[])?;
    one(cx.call("add", &[Some(y), Some(bb)], &[])?)
}

/// Mean and `1 / sqrt(var + eps)` over the dims from `a` on, kept as size 1, in f32 or
/// wider (`stash_type`).
fn moments(cx: &mut Cx, x: ValueId, a: usize, eps: f64) -> Result<(ValueId, ValueId)> {
    let r = cx.rank(x);
    let dims = list(&(a as i64..r).collect::<Vec<_>>());
    let keep = ("keepdim", Attr::Bool(true));
    let xs = if cx.dtype(x) == DType::F64 {
        x
    } else {
        cast_to(cx, x, DType::F32)?
    };
    let mean = cx.call("mean", &[Some(xs)], &[("dim", dims.clone()), keep.clone()])?;
    let var = cx.call(
        "var",
        &[Some(xs)],
        &[("dim", dims), ("correction", Attr::Int(0)), keep],
    )?;
    let e = cx.scalar(eps, cx.dtype(xs))?;
    let ve = cx.call("add", &[Some(var), Some(e)], &[])?;
    Ok((mean, cx.call("rsqrt", &[Some(ve)], &[])?))
}

pub fn layer_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let scale = cx.x(1)?;
    let b = cx.opt(2)?;
    let shape = cx.shape(x);
    let a = axis(cx.int("axis", -1)?, shape.len() as i64)? as usize;
    let eps = cx.float("epsilon", 1e-5)?;
    let normalized: Vec<usize> = shape[a..].to_vec();
    let attrs = [
        ("normalized_shape", list(&dims(&normalized))),
        ("eps", Attr::Float(eps)),
    ];
    let exact = |cx: &Cx, v: Option<ValueId>| v.is_none_or(|v| cx.shape(v) == normalized);
    let y = if exact(cx, Some(scale)) && exact(cx, b) {
        cx.call("layer_norm", &[Some(x), Some(scale), b], &attrs)?
    } else {
        // a scale or bias that only broadcasts to the normalised shape
        let n = cx.call("layer_norm", &[Some(x), None, None], &attrs)?;
        let mut y = cx.call("mul", &[Some(n), Some(scale)], &[])?;
        if let Some(b) = b {
            y = cx.call("add", &[Some(y), Some(b)], &[])?;
        }
        y
    };
    let mut outs = vec![Val::node(y)];
    if cx.node.output.iter().skip(1).any(|o| !o.is_empty()) {
        let (mean, inv) = moments(cx, x, a, eps)?;
        outs.push(Val::node(mean));
        outs.push(Val::node(inv));
    }
    Ok(outs)
}

pub fn rms_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, scale) = (cx.x(0)?, cx.x(1)?);
    let r = cx.rank(x);
    let a = axis(cx.int("axis", -1)?, r)?;
    let eps = cx.float("epsilon", 1e-5)?;
    let xs = if cx.dtype(x) == DType::F64 {
        x
    } else {
        cast_to(cx, x, DType::F32)?
    };
    let sq = cx.call("square", &[Some(xs)], &[])?;
    let ms = cx.call(
        "mean",
        &[Some(sq)],
        &[
            ("dim", list(&(a..r).collect::<Vec<_>>())),
            ("keepdim", Attr::Bool(true)),
        ],
    )?;
    let e = cx.scalar(eps, cx.dtype(xs))?;
    let me = cx.call("add", &[Some(ms), Some(e)], &[])?;
    let inv = cx.call("rsqrt", &[Some(me)], &[])?;
    let n = cx.call("mul", &[Some(xs), Some(inv)], &[])?;
    let n = cast_to(cx, n, cx.dtype(x))?;
    one(cx.call("mul", &[Some(n), Some(scale)], &[])?)
}

pub fn group_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, scale, b) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let shape = cx.shape(x);
    let g = cx.int("num_groups", 0)?;
    let eps = cx.float("epsilon", 1e-5)?;
    if shape.len() < 2 || g <= 0 || shape[1] as i64 % g != 0 {
        bail!(
            Value,
            "num_groups {g} does not divide the channels of {shape:?}"
        );
    }
    let (n, c) = (shape[0] as i64, shape[1] as i64);
    let grouped = cx.call("reshape", &[Some(x)], &[("shape", list(&[n, g, -1]))])?;
    let (mean, inv) = moments(cx, grouped, 2, eps)?;
    let gx = cast_to(cx, grouped, cx.dtype(mean))?;
    let centred = cx.call("sub", &[Some(gx), Some(mean)], &[])?;
    let normed = cx.call("mul", &[Some(centred), Some(inv)], &[])?;
    let normed = cast_to(cx, normed, cx.dtype(x))?;
    let back = cx.call(
        "reshape",
        &[Some(normed)],
        &[("shape", list(&dims(&shape)))],
    )?;
    // opset 18 gives one scale per group, opset 21 one per channel
    let per_channel = |cx: &mut Cx, v: ValueId| -> Result<ValueId> {
        let v = if cx.shape(v) == [g as usize] && g != c {
            let col = cx.call("reshape", &[Some(v)], &[("shape", list(&[g, 1]))])?;
            let e = cx.call("expand", &[Some(col)], &[("size", list(&[g, c / g]))])?;
            cx.call("reshape", &[Some(e)], &[("shape", list(&[c]))])?
        } else {
            v
        };
        self::per_channel(cx, v, shape.len())
    };
    let s = per_channel(cx, scale)?;
    let bb = per_channel(cx, b)?;
    let y = cx.call("mul", &[Some(back), Some(s)], &[])?;
    one(cx.call("add", &[Some(y), Some(bb)], &[])?)
}

pub fn mean_variance_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let r = cx.rank(x);
    let axes: Vec<i64> = cx
        .ints("axes")?
        .unwrap_or_else(|| vec![0, 2, 3])
        .iter()
        .map(|&a| axis(a, r))
        .collect::<Result<_>>()?;
    let keep = ("keepdim", Attr::Bool(true));
    let mean = cx.call("mean", &[Some(x)], &[("dim", list(&axes)), keep.clone()])?;
    let c = cx.call("sub", &[Some(x), Some(mean)], &[])?;
    let sq = cx.call("square", &[Some(c)], &[])?;
    let var = cx.call("mean", &[Some(sq)], &[("dim", list(&axes)), keep])?;
    let e = cx.scalar(1e-9, cx.dtype(x))?;
    let ve = cx.call("add", &[Some(var), Some(e)], &[])?;
    let sd = cx.call("sqrt", &[Some(ve)], &[])?;
    one(cx.call("div", &[Some(c), Some(sd)], &[])?)
}

pub fn lp_norm(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = axis(cx.int("axis", -1)?, cx.rank(x))?;
    let p = cx.int("p", 2)?;
    let keep = [("dim", list(&[a])), ("keepdim", Attr::Bool(true))];
    let norm = match p {
        1 => {
            let ab = cx.call("abs", &[Some(x)], &[])?;
            cx.call("sum", &[Some(ab)], &keep)?
        }
        2 => {
            let sq = cx.call("square", &[Some(x)], &[])?;
            let s = cx.call("sum", &[Some(sq)], &keep)?;
            cx.call("sqrt", &[Some(s)], &[])?
        }
        _ => bail!(Value, "p = {p}: only 1 and 2 are defined"),
    };
    // a zero vector stays zero
    let zero = cx.scalar(0.0, cx.dtype(norm))?;
    let is_zero = cx.call("eq", &[Some(norm), Some(zero)], &[])?;
    let one_ = cx.scalar(1.0, cx.dtype(norm))?;
    let safe = cx.call("where", &[Some(is_zero), Some(one_), Some(norm)], &[])?;
    one(cx.call("div", &[Some(x), Some(safe)], &[])?)
}

pub fn dropout(cx: &mut Cx) -> Result<Vec<Val>> {
    if cx.opset() >= 12 && cx.has(2) {
        let training = cx.ints_input(2, "training_mode")?;
        let ratio = if cx.has(1) {
            cx.floats_input(1, "ratio")?
        } else {
            Some(vec![0.5])
        };
        // training with a ratio of 0 drops nothing; any other ratio draws a random mask
        let drops = ratio.is_none_or(|r| r.iter().any(|&p| p != 0.0));
        if training.is_none_or(|t| t.iter().any(|&b| b != 0)) && drops {
            bail!(
                Value,
                "training mode with a ratio above 0 is not supported (inference only)"
            );
        }
    }
    let x = cx.x(0)?;
    let y = cx.call("contiguous", &[Some(x)], &[])?;
    let mut outs = vec![Val::node(y)];
    if cx.node.output.get(1).is_some_and(|n| !n.is_empty()) {
        let mask = cx.call(
            "full",
            &[],
            &[
                ("size", list(&dims(&cx.shape(x)))),
                ("fill_value", Attr::Bool(true)),
            ],
        )?;
        outs.push(Val::node(mask));
    }
    Ok(outs)
}

pub fn lp_pool(cx: &mut Cx) -> Result<Vec<Val>> {
    let p = cx.int("p", 2)? as f64;
    if let Some(y) = by_taps(cx, true, Combine::Lp(p))? {
        return Ok(y);
    }
    let ceil = cx.int("ceil_mode", 0)? != 0;
    pool(cx, |cx, x, w| {
        if w.dilations.iter().any(|&d| d != 1) {
            bail!(Value, "dilated Lp pooling is not supported");
        }
        // (Σ |x|^p)^(1/p): a window's mean of |x|^p times its size (padding adds zeros)
        let ab = cx.call("abs", &[Some(x)], &[])?;
        let pe = cx.scalar(p, cx.dtype(x))?;
        let xp = cx.call("pow", &[Some(ab), Some(pe)], &[])?;
        let (xp, padding) = if torch_padding(w) {
            (xp, w.lo.clone())
        } else {
            (pad_spatial(cx, xp, w, 0.0)?, vec![0; 2])
        };
        let m = cx.call(
            "avg_pool2d",
            &[Some(xp)],
            &[
                ("kernel_size", list(&w.kernel)),
                ("stride", list(&w.strides)),
                ("padding", list(&padding)),
                ("ceil_mode", Attr::Bool(ceil)),
                ("count_include_pad", Attr::Bool(true)),
            ],
        )?;
        let k = cx.scalar(w.kernel.iter().product::<i64>() as f64, cx.dtype(x))?;
        let s = cx.call("mul", &[Some(m), Some(k)], &[])?;
        let inv = cx.scalar(1.0 / p, cx.dtype(x))?;
        cx.call("pow", &[Some(s), Some(inv)], &[])
    })
}

pub fn conv_transpose(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, wt, b, xs, ws) = conv_operands(cx, "transposed convolutions")?;
    let n = xs.len() - 2;
    let group = cx.int("group", 1)?;
    let kernel = cx
        .ints("kernel_shape")?
        .unwrap_or_else(|| ws[2..].iter().map(|&d| d as i64).collect());
    let strides = cx.ints("strides")?.unwrap_or_else(|| vec![1; n]);
    let dilations = cx.ints("dilations")?.unwrap_or_else(|| vec![1; n]);
    let extra = cx.ints("output_padding")?.unwrap_or_else(|| vec![0; n]);
    if [kernel.len(), strides.len(), dilations.len(), extra.len()] != [n; 4] {
        bail!(
            Value,
            "kernel, strides, dilations and output_padding must have {n} entries"
        );
    }
    // the whole output (no padding), then cropped by the pads
    let mut full: Vec<i64> = (0..n)
        .map(|i| {
            strides[i] * (xs[2 + i] as i64 - 1) + (kernel[i] - 1) * dilations[i] + 1 + extra[i]
        })
        .collect();
    let auto = cx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let output_shape = cx.ints("output_shape")?;
    let (lo, hi): (Vec<i64>, Vec<i64>) = if let Some(os) = output_shape.filter(|_| auto != "VALID")
    {
        let os = &os[os.len().saturating_sub(n)..];
        for i in 0..n {
            // an output larger than the whole one: up to stride - 1 more positions exist
            if os[i] > full[i] && os[i] - full[i] < strides[i] {
                full[i] = os[i];
            }
        }
        let upper = auto != "SAME_LOWER";
        (0..n)
            .map(|i| {
                let total = full[i] - os[i];
                if upper {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .unzip()
    } else {
        match auto.as_str() {
            "SAME_UPPER" | "SAME_LOWER" => (0..n)
                .map(|i| {
                    let total = full[i] - xs[2 + i] as i64 * strides[i];
                    if auto == "SAME_UPPER" {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    }
                })
                .unzip(),
            "VALID" => (vec![0; n], vec![0; n]),
            _ => {
                let p = cx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * n]);
                if p.len() != 2 * n {
                    bail!(Value, "pads must have {} entries", 2 * n);
                }
                (p[..n].to_vec(), p[n..].to_vec())
            }
        }
    };
    let c_out = ws[1] as i64 * group;
    let mut input_size = vec![xs[0] as i64, c_out];
    input_size.extend(&full);
    let mut y = cx.call(
        "convolution_backward_input",
        &[Some(x), Some(wt)],
        &[
            ("input_size", list(&input_size)),
            ("stride", list(&strides)),
            ("padding", list(&vec![0; n])),
            ("dilation", list(&dilations)),
            ("groups", Attr::Int(group)),
        ],
    )?;
    for i in 0..n {
        if lo[i] != 0 || hi[i] != 0 {
            let len = full[i] - lo[i] - hi[i];
            if lo[i] < 0 || hi[i] < 0 || len < 0 {
                bail!(
                    Value,
                    "pads {:?}/{:?} do not fit an output of {:?}",
                    lo,
                    hi,
                    full
                );
            }
            y = cx.call(
                "narrow",
                &[Some(y)],
                &[
                    ("dim", Attr::Int(2 + i as i64)),
                    ("start", Attr::Int(lo[i])),
                    ("length", Attr::Int(len)),
                ],
            )?;
        }
    }
    if let Some(b) = b {
        let bb = per_channel(cx, b, xs.len())?;
        y = cx.call("add", &[Some(y), Some(bb)], &[])?;
    }
    one(y)
}

/// `LRN`: `x / (bias + alpha / size * s)^beta`, `s` the sum of squares over a window of
/// `size` channels around each one (zero beyond the edges).
pub fn lrn(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    if cx.rank(x) < 3 {
        bail!(
            Value,
            "LRN needs an input of rank 3 or more, got {:?}",
            cx.shape(x)
        );
    }
    let size = cx.int("size", 0)?;
    if size < 1 {
        bail!(Value, "size should be at least 1, got {size}");
    }
    let (alpha, beta, bias) = (
        cx.float("alpha", 1e-4)?,
        cx.float("beta", 0.75)?,
        cx.float("bias", 1.0)?,
    );
    let channels = cx.shape(x)[1] as i64;
    let sq = cx.call("mul", &[Some(x), Some(x)], &[])?;
    let (before, after) = ((size - 1) / 2, (size - 1) - (size - 1) / 2);
    let padded = super::shape::pad_axis(cx, sq, 1, before, after, "constant", 0.0)?;
    let shifted = |cx: &mut Cx, k: i64| {
        cx.call(
            "narrow",
            &[Some(padded)],
            &[
                ("dim", Attr::Int(1)),
                ("start", Attr::Int(k)),
                ("length", Attr::Int(channels)),
            ],
        )
    };
    let mut s = shifted(cx, 0)?;
    for k in 1..size {
        let part = shifted(cx, k)?;
        s = cx.call("add", &[Some(s), Some(part)], &[])?;
    }
    let dtype = cx.dtype(x);
    let k = cx.scalar(alpha / size as f64, dtype)?;
    let scaled = cx.call("mul", &[Some(s), Some(k)], &[])?;
    let b = cx.scalar(bias, dtype)?;
    let base = cx.call("add", &[Some(scaled), Some(b)], &[])?;
    let p = cx.scalar(beta, dtype)?;
    let d = cx.call("pow", &[Some(base), Some(p)], &[])?;
    one(cx.call("div", &[Some(x), Some(d)], &[])?)
}

/// `CausalConvWithState`: a depthwise 1-D convolution over the past state (zeros when
/// absent) followed by the input, optionally through SiLU; the second output is the last
/// `k - 1` steps, the next call's state.
pub fn causal_conv_with_state(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, wt) = (cx.x(0)?, cx.x(1)?);
    let b = cx.opt(2)?;
    let (xs, ws) = (cx.shape(x), cx.shape(wt));
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || ws[2] == 0 {
        bail!(
            Value,
            "input {xs:?} and weight {ws:?} should be [B, C, L] and [C, 1, k]"
        );
    }
    let k = ws[2] as i64;
    let past = match cx.opt(3)? {
        Some(p) => p,
        None => cx.call(
            "zeros",
            &[],
            &[
                ("size", list(&[xs[0] as i64, xs[1] as i64, k - 1])),
                ("dtype", Attr::DType(cx.dtype(x))),
            ],
        )?,
    };
    if cx.shape(past) != [xs[0], xs[1], k as usize - 1] {
        bail!(
            Value,
            "past_state of shape {:?} for a kernel of {k}",
            cx.shape(past)
        );
    }
    let padded = cx.call("cat", &[Some(past), Some(x)], &[("dim", Attr::Int(2))])?;
    let mut y = cx.call(
        "conv1d",
        &[Some(padded), Some(wt), b],
        &[
            ("stride", list(&[1])),
            ("padding", list(&[0])),
            ("dilation", list(&[1])),
            ("groups", Attr::Int(xs[1] as i64)),
        ],
    )?;
    match cx.string("activation")?.as_deref().unwrap_or("none") {
        "none" => {}
        "silu" | "swish" => y = cx.call("silu", &[Some(y)], &[])?,
        other => bail!(Value, "activation '{other}' should be none, silu or swish"),
    }
    let total = cx.shape(padded)[2] as i64;
    let present = cx.call(
        "narrow",
        &[Some(padded)],
        &[
            ("dim", Attr::Int(2)),
            ("start", Attr::Int(total - (k - 1))),
            ("length", Attr::Int(k - 1)),
        ],
    )?;
    let present = cx.call("contiguous", &[Some(present)], &[])?;
    Ok(vec![Val::node(y), Val::node(present)])
}
