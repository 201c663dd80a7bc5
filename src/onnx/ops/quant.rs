//! Linear quantization: `QuantizeLinear`, `DequantizeLinear` (per tensor, per axis and
//! blocked), `DynamicQuantizeLinear`, and the integer products `MatMulInteger`,
//! `QLinearMatMul`, `ConvInteger` and `QLinearConv`. Integer products accumulate in f64,
//! exact while sums stay below 2^53 (an i32 accumulator overflows long before).

use super::elementwise::cast_to;
use super::held::cast_to_held;
use super::{axis, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::elem::{Held, held};
use crate::onnx::import::{Cx, Val};
use crate::onnx::proto::data_type;
use crate::onnx::tensor::dtype_of;
use crate::{DType, Result, bail};

/// The range of an integer quantized type, `None` for the float ones.
fn int_range(elem_type: i32) -> Result<Option<(f64, f64)>> {
    Ok(match elem_type {
        data_type::UINT8 => Some((0.0, 255.0)),
        data_type::INT8 => Some((-128.0, 127.0)),
        data_type::INT16 => Some((-32768.0, 32767.0)),
        data_type::INT32 => Some((i32::MIN as f64, i32::MAX as f64)),
        t => match held(t) {
            Some(h @ (Held::Unsigned(16) | Held::Narrow { .. })) => {
                h.int_range().map(|(lo, hi)| (lo as f64, hi as f64))
            }
            Some(Held::Float(_) | Held::Scale) => None,
            _ => bail!(
                DType,
                "{} is not a quantized type",
                crate::onnx::tensor::elem_type_name(t)
            ),
        },
    })
}

/// A scale or zero point shaped to broadcast against `x` of `shape`: a scalar as it is, a
/// vector along `axis`, or (`block_size` > 0) each element repeated over its block.
fn spread(cx: &mut Cx, p: ValueId, shape: &[usize], ax: i64, block: i64) -> Result<ValueId> {
    let ps = cx.shape(p);
    let n: usize = ps.iter().product();
    if ps.is_empty() {
        return Ok(p);
    }
    if n == 1 {
        return cx.call("reshape", &[Some(p)], &[("shape", list(&[]))]);
    }
    let rank = shape.len() as i64;
    let a = axis(ax, rank)? as usize;
    if block <= 0 {
        let mut dims = vec![1i64; shape.len()];
        dims[a] = n as i64;
        if ps.len() != 1 || shape[a] != n {
            bail!(
                Value,
                "a scale or zero point of shape {ps:?} does not fit axis {a} of {shape:?}"
            );
        }
        return cx.call("reshape", &[Some(p)], &[("shape", list(&dims))]);
    }
    let b = block as usize;
    if ps.len() != shape.len() || ps[a] * b < shape[a] || (ps[a] - 1) * b >= shape[a].max(1) {
        bail!(
            Value,
            "a blocked scale of shape {ps:?} does not fit {shape:?} in blocks of {b} on axis {a}"
        );
    }
    let u = cx.call("unsqueeze", &[Some(p)], &[("dim", Attr::Int(a as i64 + 1))])?;
    let mut wide: Vec<i64> = ps.iter().map(|&d| d as i64).collect();
    wide.insert(a + 1, block);
    let e = cx.call("expand", &[Some(u)], &[("size", list(&wide))])?;
    let mut flat: Vec<i64> = ps.iter().map(|&d| d as i64).collect();
    flat[a] *= block;
    let r = cx.call("reshape", &[Some(e)], &[("shape", list(&flat))])?;
    cx.call(
        "narrow",
        &[Some(r)],
        &[
            ("dim", Attr::Int(a as i64)),
            ("start", Attr::Int(0)),
            ("length", Attr::Int(shape[a] as i64)),
        ],
    )
}

/// Input `i` (a scale or zero point) spread over input 0's shape.
fn spread_input(cx: &mut Cx, i: usize, shape: &[usize]) -> Result<Option<ValueId>> {
    let Some(p) = cx.opt(i)? else {
        return Ok(None);
    };
    let (ax, block) = (cx.int("axis", 1)?, cx.int("block_size", 0)?);
    spread(cx, p, shape, ax, block).map(Some)
}

/// `round(q) + zp` clamped to `[lo, hi]`, in `q`'s float dtype widened to f32.
fn saturate_round(
    cx: &mut Cx,
    q: ValueId,
    zp: Option<ValueId>,
    lo: f64,
    hi: f64,
) -> Result<ValueId> {
    let work = if cx.dtype(q) == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let q = cast_to(cx, q, work)?;
    let mut r = cx.call("round", &[Some(q)], &[])?;
    if let Some(zp) = zp {
        let z = cast_to(cx, zp, work)?;
        r = cx.op("add", &[r, z])?;
    }
    cx.call(
        "clamp",
        &[Some(r)],
        &[("min", Attr::Float(lo)), ("max", Attr::Float(hi))],
    )
}

pub fn quantize_linear(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let target = if cx.has(2) {
        cx.elem_type(2)?
    } else {
        match cx.int("output_dtype", 0)? {
            0 => data_type::UINT8,
            t => t as i32,
        }
    };
    let scale = spread_input(cx, 1, &shape)?
        .ok_or_else(|| crate::Error::Value("input 1 (y_scale) is required".into()))?;
    let zp = spread_input(cx, 2, &shape)?;
    let (mut x, mut scale) = (x, scale);
    if let Some(p) = cx.attr("precision").map(|a| a.i as i32).filter(|&p| p != 0) {
        let d = dtype_of(p)?;
        x = cast_to(cx, x, d)?;
        scale = cast_to(cx, scale, d)?;
    }
    let q = cx.op("div", &[x, scale])?;
    let out = match (int_range(target)?, held(target)) {
        (Some((lo, hi)), _) => {
            let r = saturate_round(cx, q, zp, lo, hi)?;
            cast_to(cx, r, dtype_of(target)?)?
        }
        (None, Some(h @ Held::Float(f))) => {
            // float8 ignores the zero point (it must be 0); float4 adds it
            let q = match zp {
                Some(z) if f.bits == 4 => {
                    let z = cast_to(cx, z, cx.dtype(q))?;
                    cx.op("add", &[q, z])?
                }
                _ => q,
            };
            let saturate = cx.int("saturate", 1)? != 0 || f.bits == 4;
            cast_to_held(cx, q, h, saturate)?
        }
        _ => bail!(DType, "element type #{target} is not a quantized type"),
    };
    one(out)
}

pub fn dequantize_linear(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let float_x = matches!(held(cx.elem_type(0)?), Some(Held::Float(_)));
    let scale = spread_input(cx, 1, &shape)?
        .ok_or_else(|| crate::Error::Value("input 1 (x_scale) is required".into()))?;
    let scale_dtype = cx.dtype(scale);
    let work = if scale_dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let mut dx = cast_to(cx, x, work)?;
    if !float_x && let Some(zp) = spread_input(cx, 2, &shape)? {
        let z = cast_to(cx, zp, work)?;
        dx = cx.op("sub", &[dx, z])?;
    }
    let s = cast_to(cx, scale, work)?;
    let y = cx.op("mul", &[dx, s])?;
    let out = match cx.int("output_dtype", 0)? {
        0 => scale_dtype,
        t => dtype_of(t as i32)?,
    };
    one(cast_to(cx, y, out)?)
}

/// `x`'s reduction `op` over every element, as a 0-d value.
fn over_all(cx: &mut Cx, op: &str, x: ValueId) -> Result<ValueId> {
    let dims: Vec<i64> = (0..cx.rank(x)).collect();
    cx.call(
        op,
        &[Some(x)],
        &[("dim", list(&dims)), ("keepdim", Attr::Bool(false))],
    )
}

pub fn dynamic_quantize_linear(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let zero = cx.scalar(0.0, DType::F32)?;
    let xf = cast_to(cx, x, DType::F32)?;
    let hi = over_all(cx, "amax", xf)?;
    let hi = cx.op("maximum", &[hi, zero])?;
    let lo = over_all(cx, "amin", xf)?;
    let lo = cx.op("minimum", &[lo, zero])?;
    let span = cx.op("sub", &[hi, lo])?;
    let flat = cx.op("eq", &[hi, lo])?;
    let one_ = cx.scalar(1.0, DType::F32)?;
    let span = cx.call("where", &[Some(flat), Some(one_), Some(span)], &[])?;
    let q_span = cx.scalar(255.0, DType::F32)?;
    let scale = cx.op("div", &[span, q_span])?;
    let lo_steps = cx.op("div", &[lo, scale])?;
    let zp0 = cx.op("sub", &[zero, lo_steps])?;
    let zp = cx.call(
        "clamp",
        &[Some(zp0)],
        &[("min", Attr::Float(0.0)), ("max", Attr::Float(255.0))],
    )?;
    let zp = cx.call("round", &[Some(zp)], &[])?;
    let q = cx.op("div", &[xf, scale])?;
    let y = saturate_round(cx, q, Some(zp), 0.0, 255.0)?;
    let y = cast_to(cx, y, DType::U8)?;
    let scale_out = cast_to(cx, scale, cx.dtype(x))?;
    let zp_out = cast_to(cx, zp, DType::U8)?;
    Ok(vec![Val::node(y), Val::node(scale_out), Val::node(zp_out)])
}

/// Input `i` minus its zero point (input `z`, if given) in f64: the operand of an integer
/// product. The zero point broadcasts as NumPy aligns it (the ONNX reference), except that
/// `per_row` puts a vector on the first axis (a convolution weight's output channels).
fn centered(cx: &mut Cx, i: usize, z: usize, per_row: bool) -> Result<ValueId> {
    let x = cx.x(i)?;
    let xf = cast_to(cx, x, DType::F64)?;
    let Some(zp) = cx.opt(z)? else {
        return Ok(xf);
    };
    let mut zf = cast_to(cx, zp, DType::F64)?;
    let zs = cx.shape(zf);
    let n: usize = zs.iter().product();
    if zs.len() == 1 && n > 1 && per_row {
        let mut dims = vec![1i64; cx.rank(x) as usize];
        dims[0] = n as i64;
        zf = cx.call("reshape", &[Some(zf)], &[("shape", list(&dims))])?;
    }
    cx.op("sub", &[xf, zf])
}

pub fn matmul_integer(cx: &mut Cx) -> Result<Vec<Val>> {
    let a = centered(cx, 0, 2, false)?;
    let b = centered(cx, 1, 3, false)?;
    let c = cx.op("matmul", &[a, b])?;
    one(cast_to(cx, c, DType::I32)?)
}

/// `acc * (s_a * s_b / s_y) + zp_y`, rounded and clamped to the output type (the zero
/// point's, else input 0's).
fn requantize(
    cx: &mut Cx,
    acc: ValueId,
    s_a: usize,
    s_b: usize,
    s_y: usize,
    z_y: usize,
) -> Result<ValueId> {
    let (sa, sb, sy) = (cx.x(s_a)?, cx.x(s_b)?, cx.x(s_y)?);
    let mut sb = sb;
    let acc_rank = cx.rank(acc) as usize;
    let n_sb: usize = cx.shape(sb).iter().product();
    if n_sb > 1 && acc_rank == 4 {
        // a convolution's per-channel weight scale: along the output channels
        sb = cx.call(
            "reshape",
            &[Some(sb)],
            &[("shape", list(&[1, n_sb as i64, 1, 1]))],
        )?;
    }
    let m = cx.op("mul", &[sa, sb])?;
    let m = cx.op("div", &[m, sy])?;
    let m = cast_to(cx, m, DType::F64)?;
    let d = cx.op("mul", &[acc, m])?;
    let target = if cx.has(z_y) {
        cx.elem_type(z_y)?
    } else {
        cx.elem_type(0)?
    };
    let Some((lo, hi)) = int_range(target)? else {
        bail!(DType, "integer products give integer types only");
    };
    let zp = cx.opt(z_y)?;
    let r = saturate_round(cx, d, zp, lo, hi)?;
    cast_to(cx, r, dtype_of(target)?)
}

pub fn qlinear_matmul(cx: &mut Cx) -> Result<Vec<Val>> {
    let a = centered(cx, 0, 2, false)?;
    let b = centered(cx, 3, 5, false)?;
    let c = cx.op("matmul", &[a, b])?;
    one(requantize(cx, c, 1, 4, 6, 7)?)
}

pub fn conv_integer(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = centered(cx, 0, 2, false)?;
    let w = centered(cx, 1, 3, true)?;
    let y = super::nn::conv_of(cx, x, w, None)?;
    one(cast_to(cx, y, DType::I32)?)
}

pub fn qlinear_conv(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = centered(cx, 0, 2, false)?;
    let w = centered(cx, 3, 5, true)?;
    let b = match cx.opt(8)? {
        Some(b) => Some(cast_to(cx, b, DType::F64)?),
        None => None,
    };
    let y = super::nn::conv_of(cx, x, w, b)?;
    one(requantize(cx, y, 1, 4, 6, 7)?)
}
