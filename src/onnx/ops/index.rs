//! `GatherND`, `ScatterND`, `Compress` and `NonZero`: indexing by tuples of indices, read as
//! one linear index into the flattened leading dims.

use super::elementwise::cast_to;
use super::{axis, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, Tensor, bail};

fn dims(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

fn reshape(cx: &mut Cx, x: ValueId, shape: &[usize]) -> Result<ValueId> {
    cx.call("reshape", &[Some(x)], &[("shape", list(&dims(shape)))])
}

/// The linear index of each index tuple (the last dim of `idx`) into dims `sizes`, negative
/// entries counted from the end: `Σ idx[.., j] · stride_j`, of shape `idx.shape[..-1]`.
fn linear(cx: &mut Cx, idx: ValueId, sizes: &[usize]) -> Result<ValueId> {
    let idx = cast_to(cx, idx, DType::I64)?;
    let r = cx.rank(idx);
    let mut acc: Option<ValueId> = None;
    let mut stride: usize = sizes.iter().product();
    for (j, &n) in sizes.iter().enumerate() {
        stride /= n.max(1);
        let c = cx.call(
            "select",
            &[Some(idx)],
            &[("dim", Attr::Int(r - 1)), ("index", Attr::Int(j as i64))],
        )?;
        let zero = cx.scalar(0.0, DType::I64)?;
        let neg = cx.call("lt", &[Some(c), Some(zero)], &[])?;
        let size = cx.scalar(n as f64, DType::I64)?;
        let up = cx.call("add", &[Some(c), Some(size)], &[])?;
        let c = cx.call("where", &[Some(neg), Some(up), Some(c)], &[])?;
        let s = cx.scalar(stride as f64, DType::I64)?;
        let term = cx.call("mul", &[Some(c), Some(s)], &[])?;
        acc = Some(match acc {
            Some(a) => cx.call("add", &[Some(a), Some(term)], &[])?,
            None => term,
        });
    }
    match acc {
        Some(a) => Ok(a),
        None => bail!(Value, "index tuples of length 0"),
    }
}

pub fn gather_nd(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, idx) = (cx.x(0)?, cx.x(1)?);
    let (ds, is) = (cx.shape(x), cx.shape(idx));
    let b = cx.int("batch_dims", 0)? as usize;
    let Some(&k) = is.last() else {
        bail!(Value, "indices must have at least one dim");
    };
    if b + k > ds.len() || is.len() <= b || ds[..b] != is[..b] {
        bail!(
            Value,
            "indices {is:?} do not fit data {ds:?} with batch_dims {b}"
        );
    }
    let batch: usize = ds[..b].iter().product();
    let inner: usize = ds[b..b + k].iter().product();
    let mut lin = linear(cx, idx, &ds[b..b + k])?;
    if b > 0 {
        // each batch's tuples index its own block of `inner` rows
        let per: usize = is[b..is.len() - 1].iter().product();
        lin = reshape(cx, lin, &[batch, per])?;
        let base: Vec<i64> = (0..batch as i64).map(|i| i * inner as i64).collect();
        let base = cx.tensor(&Tensor::from_vec(base, &[batch, 1])?)?;
        lin = cx.call("add", &[Some(lin), Some(base)], &[])?;
    }
    let n: usize = is[..is.len() - 1].iter().product();
    let flat_idx = reshape(cx, lin, &[n])?;
    let mut rows = vec![batch * inner];
    rows.extend(&ds[b + k..]);
    let flat = reshape(cx, x, &rows)?;
    let picked = cx.call(
        "index_select",
        &[Some(flat), Some(flat_idx)],
        &[("dim", Attr::Int(0))],
    )?;
    let mut out = is[..is.len() - 1].to_vec();
    out.extend(&ds[b + k..]);
    one(reshape(cx, picked, &out)?)
}

pub fn scatter_nd(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, idx, upd) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    let (ds, is) = (cx.shape(x), cx.shape(idx));
    let Some(&k) = is.last() else {
        bail!(Value, "indices must have at least one dim");
    };
    if k > ds.len() {
        bail!(
            Value,
            "index tuples of length {k} for data of rank {}",
            ds.len()
        );
    }
    let rows: usize = ds[..k].iter().product();
    let width: usize = ds[k..].iter().product();
    let q: usize = is[..is.len() - 1].iter().product();
    let lin = linear(cx, idx, &ds[..k])?;
    let lin = reshape(cx, lin, &[q, 1])?;
    let lin = cx.call(
        "expand",
        &[Some(lin)],
        &[("size", list(&[q as i64, width as i64]))],
    )?;
    let flat = reshape(cx, x, &[rows, width])?;
    let src = reshape(cx, upd, &[q, width])?;
    let y = scatter_with(cx, flat, lin, src, 0)?;
    one(reshape(cx, y, &ds)?)
}

/// `x` with `src` scattered along `dim` at `index`, combined as the node's `reduction`
/// says (`none`, `add`, `mul`, `max`, `min`), the scatter of `ScatterElements` and
/// `ScatterND`.
pub(super) fn scatter_with(
    cx: &mut Cx,
    x: ValueId,
    index: ValueId,
    src: ValueId,
    dim: i64,
) -> Result<ValueId> {
    let operands = [Some(x), Some(index), Some(src)];
    let reduce = match cx.string("reduction")?.as_deref() {
        None | Some("none") => return cx.call("scatter", &operands, &[("dim", Attr::Int(dim))]),
        // scatter_add has CUDA kernels and AOT copy steps of its own
        Some("add") => return cx.call("scatter_add", &operands, &[("dim", Attr::Int(dim))]),
        Some("mul") => "prod",
        Some("max") => "amax",
        Some("min") => "amin",
        Some(r) => bail!(
            Value,
            "reduction '{r}' is not one of none, add, mul, max, min"
        ),
    };
    let attrs = [
        ("dim", Attr::Int(dim)),
        ("reduce", Attr::Str(reduce.into())),
    ];
    cx.call("scatter_reduce", &operands, &attrs)
}

pub fn compress(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let Some(cond) = cx.ints_input(1, "condition")? else {
        bail!(Value, "the condition input is required");
    };
    let shape = cx.shape(x);
    let (src, dim, n) = match cx.attr("axis") {
        Some(_) => {
            let a = axis(cx.int("axis", 0)?, shape.len() as i64)?;
            (x, a, shape[a as usize])
        }
        None => {
            let n = shape.iter().product();
            (reshape(cx, x, &[n])?, 0, n)
        }
    };
    if cond.len() > n {
        bail!(
            Value,
            "a condition of {} entries for an axis of {n}",
            cond.len()
        );
    }
    let picked: Vec<i64> = (0..cond.len() as i64)
        .filter(|&i| cond[i as usize] != 0)
        .collect();
    let idx = cx.tensor(&Tensor::from_slice(&picked, &[picked.len()])?)?;
    one(cx.call(
        "index_select",
        &[Some(src), Some(idx)],
        &[("dim", Attr::Int(dim))],
    )?)
}

pub fn non_zero(cx: &mut Cx) -> Result<Vec<Val>> {
    let Some(values) = cx.floats_input(0, "input")? else {
        bail!(Value, "the input is required");
    };
    let shape = match cx.known(0) {
        Some(t) => t.shape().to_vec(),
        None => {
            let x = cx.x(0)?;
            cx.shape(x)
        }
    };
    // the multi-indices of the nonzero elements, in row-major order, one column each
    let hits: Vec<usize> = (0..values.len()).filter(|&i| values[i] != 0.0).collect();
    let r = shape.len();
    let mut out = vec![0i64; r * hits.len()];
    for (col, &flat) in hits.iter().enumerate() {
        let mut rest = flat;
        for d in (0..r).rev() {
            out[d * hits.len() + col] = (rest % shape[d]) as i64;
            rest /= shape[d];
        }
    }
    Ok(vec![Val::known(Tensor::from_vec(out, &[r, hits.len()])?)])
}

/// `ReverseSequence`: along `time_axis`, the first `sequence_lens[b]` elements of each batch
/// entry `b` reversed, the rest kept, as one `gather` by computed indices.
pub fn reverse_sequence(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, lens) = (cx.x(0)?, cx.x(1)?);
    let shape = cx.shape(x);
    let rank = shape.len() as i64;
    if rank < 2 {
        bail!(Value, "the input should have rank 2 or more, got {shape:?}");
    }
    let t_axis = axis(cx.int("time_axis", 0)?, rank)? as usize;
    let b_axis = axis(cx.int("batch_axis", 1)?, rank)? as usize;
    if t_axis == b_axis || t_axis > 1 || b_axis > 1 {
        bail!(
            Value,
            "time_axis and batch_axis should be 0 and 1 in some order"
        );
    }
    if cx.shape(lens) != [shape[b_axis]] {
        bail!(
            Value,
            "sequence_lens of shape {:?} for a batch of {}",
            cx.shape(lens),
            shape[b_axis]
        );
    }
    let lens = cast_to(cx, lens, DType::I64)?;
    let t = cx.call(
        "arange",
        &[],
        &[
            ("start", Attr::Int(0)),
            ("end", Attr::Int(shape[t_axis] as i64)),
            ("step", Attr::Int(1)),
            ("dtype", Attr::DType(DType::I64)),
        ],
    )?;
    // t along the time axis, lengths along the batch axis, 1 elsewhere
    let mut t_dims = vec![1i64; shape.len()];
    t_dims[t_axis] = shape[t_axis] as i64;
    let mut l_dims = vec![1i64; shape.len()];
    l_dims[b_axis] = shape[b_axis] as i64;
    let t = cx.call("reshape", &[Some(t)], &[("shape", list(&t_dims))])?;
    let l = cx.call("reshape", &[Some(lens)], &[("shape", list(&l_dims))])?;
    let one_ = cx.scalar(1.0, DType::I64)?;
    let last = cx.call("sub", &[Some(l), Some(one_)], &[])?;
    let back = cx.call("sub", &[Some(last), Some(t)], &[])?;
    let inside = cx.call("lt", &[Some(t), Some(l)], &[])?;
    let idx = cx.call("where", &[Some(inside), Some(back), Some(t)], &[])?;
    let full: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let idx = cx.call("expand", &[Some(idx)], &[("size", list(&full))])?;
    one(cx.call(
        "gather",
        &[Some(x), Some(idx)],
        &[("dim", Attr::Int(t_axis as i64))],
    )?)
}

/// `TensorScatter`: `update` written into `past_cache` along `axis` from each batch entry's
/// write index (wrapping round the axis in `circular` mode): every cache position takes the
/// update element `position - write_index` where that falls inside the update.
pub fn tensor_scatter(cx: &mut Cx) -> Result<Vec<Val>> {
    let (past, update) = (cx.x(0)?, cx.x(1)?);
    let (ps, us) = (cx.shape(past), cx.shape(update));
    let rank = ps.len() as i64;
    let a = axis(cx.int("axis", -2)?, rank)? as usize;
    if a == 0
        || us.len() != ps.len()
        || (0..ps.len()).any(|i| i != a && ps[i] != us[i])
        || us[a] > ps[a]
    {
        bail!(
            Value,
            "an update of shape {us:?} for a cache of shape {ps:?} along axis {a}"
        );
    }
    let circular = match cx.string("mode")?.as_deref().unwrap_or("linear") {
        "linear" => false,
        "circular" => true,
        other => bail!(Value, "mode '{other}' should be linear or circular"),
    };
    let (len, new) = (ps[a] as i64, us[a] as i64);
    let p = cx.call(
        "arange",
        &[],
        &[
            ("start", Attr::Int(0)),
            ("end", Attr::Int(len)),
            ("step", Attr::Int(1)),
            ("dtype", Attr::DType(DType::I64)),
        ],
    )?;
    let mut p_dims = vec![1i64; ps.len()];
    p_dims[a] = len;
    let p = cx.call("reshape", &[Some(p)], &[("shape", list(&p_dims))])?;
    let mut off = p;
    if let Some(w) = cx.opt(2)? {
        let w = cast_to(cx, w, DType::I64)?;
        let mut w_dims = vec![1i64; ps.len()];
        w_dims[0] = ps[0] as i64;
        let w = cx.call("reshape", &[Some(w)], &[("shape", list(&w_dims))])?;
        off = cx.call("sub", &[Some(p), Some(w)], &[])?;
    }
    if circular {
        let l = cx.scalar(len as f64, DType::I64)?;
        off = cx.call("remainder", &[Some(off), Some(l)], &[])?;
    }
    let zero = cx.scalar(0.0, DType::I64)?;
    let n = cx.scalar(new as f64, DType::I64)?;
    let ge = cx.call("ge", &[Some(off), Some(zero)], &[])?;
    let lt = cx.call("lt", &[Some(off), Some(n)], &[])?;
    let inside = cx.call("logical_and", &[Some(ge), Some(lt)], &[])?;
    let idx = cx.call(
        "clamp",
        &[Some(off)],
        &[("min", Attr::Int(0)), ("max", Attr::Int((new - 1).max(0)))],
    )?;
    let mut full: Vec<i64> = us.iter().map(|&d| d as i64).collect();
    full[a] = len;
    let idx = cx.call("expand", &[Some(idx)], &[("size", list(&full))])?;
    let inside = cx.call("expand", &[Some(inside)], &[("size", list(&full))])?;
    if new == 0 {
        return one(cx.call("contiguous", &[Some(past)], &[])?);
    }
    let taken = cx.call(
        "gather",
        &[Some(update), Some(idx)],
        &[("dim", Attr::Int(a as i64))],
    )?;
    one(cx.call("where", &[Some(inside), Some(taken), Some(past)], &[])?)
}

/// `Col2Im`: each column's block added back at its place in the padded image (one
/// `index_add` by target positions computed at import), then the padding cropped.
pub fn col2im(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let xs = cx.shape(x);
    let (Some(image), Some(block)) = (
        cx.ints_input(1, "image_shape")?,
        cx.ints_input(2, "block_shape")?,
    ) else {
        bail!(Value, "image_shape and block_shape are required");
    };
    let k = image.len();
    if k == 0 || block.len() != k || xs.len() != 3 || image.iter().chain(&block).any(|&d| d <= 0) {
        bail!(
            Value,
            "an input of shape {xs:?} for image {image:?} and block {block:?}"
        );
    }
    let strides = cx.ints("strides")?.unwrap_or_else(|| vec![1; k]);
    let dilations = cx.ints("dilations")?.unwrap_or_else(|| vec![1; k]);
    let pads = cx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
    if strides.len() != k || dilations.len() != k || pads.len() != 2 * k {
        bail!(
            Value,
            "strides, dilations and pads should have {k}, {k} and {} entries",
            2 * k
        );
    }
    let padded: Vec<i64> = (0..k).map(|i| image[i] + pads[i] + pads[k + i]).collect();
    let outs: Vec<i64> = (0..k)
        .map(|i| (padded[i] - ((block[i] - 1) * dilations[i] + 1)) / strides[i] + 1)
        .collect();
    let taps: i64 = block.iter().product();
    let places: i64 = outs.iter().product();
    if outs.iter().any(|&o| o <= 0) || xs[1] as i64 % taps != 0 || xs[2] as i64 != places {
        bail!(
            Value,
            "an input of shape {xs:?} does not hold blocks {block:?} over {places} places"
        );
    }
    let c = xs[1] as i64 / taps;
    super::import_elems(
        (taps as usize).checked_mul(places as usize),
        "the Col2Im positions",
    )?;
    // the padded image position of (tap, place), row-major over both
    let mut index = Vec::with_capacity((taps * places) as usize);
    for t in 0..taps {
        for p in 0..places {
            let (mut tr, mut pr, mut flat, mut stride) = (t, p, 0i64, 1i64);
            for i in (0..k).rev() {
                let (kt, kp) = (tr % block[i], pr % outs[i]);
                tr /= block[i];
                pr /= outs[i];
                flat += (kp * strides[i] + kt * dilations[i]) * stride;
                stride *= padded[i];
            }
            index.push(flat);
        }
    }
    let n = xs[0] as i64;
    let total: i64 = padded.iter().product();
    let idx = cx.tensor(&Tensor::from_vec(index, &[(taps * places) as usize])?)?;
    let src = cx.call(
        "reshape",
        &[Some(x)],
        &[("shape", list(&[n, c, taps * places]))],
    )?;
    let zeros = cx.call(
        "zeros",
        &[],
        &[
            ("size", list(&[n, c, total])),
            ("dtype", Attr::DType(cx.dtype(x))),
        ],
    )?;
    let sum = cx.call(
        "index_add",
        &[Some(zeros), Some(idx), Some(src)],
        &[("dim", Attr::Int(2))],
    )?;
    let mut shape = vec![n, c];
    shape.extend(&padded);
    let mut y = cx.call("reshape", &[Some(sum)], &[("shape", list(&shape))])?;
    for i in 0..k {
        if pads[i] != 0 || pads[k + i] != 0 {
            y = cx.call(
                "narrow",
                &[Some(y)],
                &[
                    ("dim", Attr::Int(2 + i as i64)),
                    ("start", Attr::Int(pads[i])),
                    ("length", Attr::Int(image[i])),
                ],
            )?;
        }
    }
    one(cx.call("contiguous", &[Some(y)], &[])?)
}

/// `MaxUnpool`: zeros of the output's shape with each value written at its flat index (the
/// `Indices` of a `MaxPool`), one `scatter` over the flattened output.
pub fn max_unpool(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, idx) = (cx.x(0)?, cx.x(1)?);
    let xs = cx.shape(x);
    if xs.len() < 3 || cx.shape(idx) != xs {
        bail!(
            Value,
            "values {xs:?} and indices {:?} should match, rank 3 or more",
            cx.shape(idx)
        );
    }
    let k = xs.len() - 2;
    // the indices address the shape the pooling implies; output_shape pads it at the end
    let Some(kernel) = cx.ints("kernel_shape")? else {
        bail!(Value, "kernel_shape is required");
    };
    let strides = cx.ints("strides")?.unwrap_or_else(|| vec![1; k]);
    let pads = cx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
    if kernel.len() != k || strides.len() != k || pads.len() != 2 * k {
        bail!(
            Value,
            "kernel_shape, strides and pads do not fit {k} spatial dims"
        );
    }
    let mut shape = vec![xs[0] as i64, xs[1] as i64];
    shape.extend(
        (0..k).map(|i| (xs[2 + i] as i64 - 1) * strides[i] + kernel[i] - pads[i] - pads[k + i]),
    );
    let wanted = match cx.ints_input(2, "output_shape")? {
        Some(s) if s.len() == xs.len() && s.iter().all(|&d| d >= 0) => Some(s),
        Some(s) => bail!(
            Value,
            "output_shape {s:?} for an input of rank {}",
            xs.len()
        ),
        None => None,
    };
    let total = shape.iter().try_fold(1i64, |n, &d| n.checked_mul(d));
    let Some(total) = total.filter(|&t| t >= 0) else {
        bail!(Value, "output shape {shape:?} is too large");
    };
    let n: i64 = xs.iter().map(|&d| d as i64).product();
    let flat_x = cx.call("reshape", &[Some(x)], &[("shape", list(&[n]))])?;
    let flat_i = cx.call("reshape", &[Some(idx)], &[("shape", list(&[n]))])?;
    let flat_i = cast_to(cx, flat_i, DType::I64)?;
    let zeros = cx.call(
        "zeros",
        &[],
        &[
            ("size", list(&[total])),
            ("dtype", Attr::DType(cx.dtype(x))),
        ],
    )?;
    let y = cx.call(
        "scatter",
        &[Some(zeros), Some(flat_i), Some(flat_x)],
        &[("dim", Attr::Int(0))],
    )?;
    let mut y = cx.call("reshape", &[Some(y)], &[("shape", list(&shape))])?;
    if let Some(w) = wanted {
        for (i, (&have, &want)) in shape.iter().zip(&w).enumerate() {
            if have != want {
                y = super::shape::pad_axis(cx, y, i as i64, 0, want - have, "constant", 0.0)?;
            }
        }
    }
    one(y)
}
