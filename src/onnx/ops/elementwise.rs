//! Pointwise ONNX ops: unary math and activations, binary arithmetic and comparisons,
//! `Where`, `Clip`, `Cast`.

use super::{held, list, one};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

/// A smelt op of one operand, no attributes.
fn unary(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    one(cx.call(name, &[Some(x)], &[])?)
}

/// A smelt op of two operands, no attributes.
fn binary(cx: &mut Cx, name: &str) -> Result<Vec<Val>> {
    let (x, y) = (cx.x(0)?, cx.x(1)?);
    one(cx.call(name, &[Some(x), Some(y)], &[])?)
}

macro_rules! simple {
    ($($f:ident => $how:ident $name:literal;)*) => {
        $(pub fn $f(cx: &mut Cx) -> Result<Vec<Val>> { $how(cx, $name) })*
    };
}

simple! {
    abs => unary "abs";
    acos => unary "acos";
    asin => unary "asin";
    atan => unary "atan";
    bitwise_not => unary "bitwise_not";
    ceil => unary "ceil";
    cos => unary "cos";
    erf => unary "erf";
    exp => unary "exp";
    floor => unary "floor";
    is_nan => unary "isnan";
    log => unary "log";
    mish => unary "mish";
    neg => unary "neg";
    not => unary "logical_not";
    reciprocal => unary "reciprocal";
    relu => unary "relu";
    round => unary "round";
    sigmoid => unary "sigmoid";
    sign => unary "sign";
    sin => unary "sin";
    sqrt => unary "sqrt";
    tanh => unary "tanh";
    hard_swish => unary "hardswish";
    add => binary "add";
    sub => binary "sub";
    mul => binary "mul";
    and => binary "logical_and";
    or => binary "logical_or";
    xor => binary "ne";
    bitwise_and => binary "bitwise_and";
    bitwise_or => binary "bitwise_or";
    bitwise_xor => binary "bitwise_xor";
    equal => binary "eq";
    greater => binary "gt";
    greater_or_equal => binary "ge";
    less => binary "lt";
    less_or_equal => binary "le";
}

pub fn identity(cx: &mut Cx) -> Result<Vec<Val>> {
    Ok(vec![cx.val(0)?])
}

pub fn div(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, y) = (cx.x(0)?, cx.x(1)?);
    // integer division truncates (C's `/`), as onnxruntime does
    let attrs: &[(&str, Attr)] = if cx.dtype(x).is_float() {
        &[]
    } else {
        &[("rounding_mode", Attr::Str("trunc".into()))]
    };
    one(cx.call("div", &[Some(x), Some(y)], attrs)?)
}

pub fn pow(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, y) = (cx.x(0)?, cx.x(1)?);
    let p = cx.call("pow", &[Some(x), Some(y)], &[])?;
    // the result has the base's type
    one(cast_to(cx, p, cx.dtype(x))?)
}

pub fn modulo(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, y) = (cx.x(0)?, cx.x(1)?);
    if cx.int("fmod", 0)? == 0 {
        return one(cx.call("remainder", &[Some(x), Some(y)], &[])?);
    }
    // fmod: the sign of the dividend, x - trunc(x / y) * y
    let q = cx.call(
        "div",
        &[Some(x), Some(y)],
        &[("rounding_mode", Attr::Str("trunc".into()))],
    )?;
    let qy = cx.call("mul", &[Some(q), Some(y)], &[])?;
    one(cx.call("sub", &[Some(x), Some(qy)], &[])?)
}

/// Folds a variadic op pairwise.
fn variadic(cx: &mut Cx, name: &str) -> Result<ValueId> {
    let xs = cx.all()?;
    let Some((&first, rest)) = xs.split_first() else {
        bail!(Value, "needs at least one input");
    };
    let mut acc = first;
    for &x in rest {
        acc = cx.call(name, &[Some(acc), Some(x)], &[])?;
    }
    if rest.is_empty() {
        // a lone input still needs its own value
        acc = cx.call("contiguous", &[Some(acc)], &[])?;
    }
    Ok(acc)
}

pub fn max(cx: &mut Cx) -> Result<Vec<Val>> {
    one(variadic(cx, "maximum")?)
}

pub fn min(cx: &mut Cx) -> Result<Vec<Val>> {
    one(variadic(cx, "minimum")?)
}

pub fn sum(cx: &mut Cx) -> Result<Vec<Val>> {
    one(variadic(cx, "add")?)
}

pub fn mean(cx: &mut Cx) -> Result<Vec<Val>> {
    let n = (0..cx.n_inputs()).filter(|&i| cx.has(i)).count();
    let s = variadic(cx, "add")?;
    one(cx.with_scalar("div", s, n as f64)?)
}

pub fn where_(cx: &mut Cx) -> Result<Vec<Val>> {
    let (c, x, y) = (cx.x(0)?, cx.x(1)?, cx.x(2)?);
    one(cx.call("where", &[Some(c), Some(x), Some(y)], &[])?)
}

pub fn prelu(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, slope) = (cx.x(0)?, cx.x(1)?);
    let zero = cx.scalar(0.0, cx.dtype(x))?;
    let neg = cx.call("lt", &[Some(x), Some(zero)], &[])?;
    let scaled = cx.call("mul", &[Some(x), Some(slope)], &[])?;
    one(cx.call("where", &[Some(neg), Some(scaled), Some(x)], &[])?)
}

pub fn leaky_relu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 0.01)?;
    one(cx.call(
        "leaky_relu",
        &[Some(x)],
        &[("negative_slope", Attr::Float(a))],
    )?)
}

pub fn elu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 1.0)?;
    one(cx.call("elu", &[Some(x)], &[("alpha", Attr::Float(a))])?)
}

pub fn selu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 1.673_263_192_176_818_8)?;
    let g = cx.float("gamma", 1.050_701_022_148_132_3)?;
    let e = cx.call("elu", &[Some(x)], &[("alpha", Attr::Float(a))])?;
    one(cx.with_scalar("mul", e, g)?)
}

pub fn celu(cx: &mut Cx) -> Result<Vec<Val>> {
    // alpha * elu(x / alpha)
    let x = cx.x(0)?;
    let a = cx.float("alpha", 1.0)?;
    let s = cx.with_scalar("div", x, a)?;
    let e = cx.call("elu", &[Some(s)], &[])?;
    one(cx.with_scalar("mul", e, a)?)
}

pub fn thresholded_relu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 1.0)?;
    let above = cx.with_scalar("gt", x, a)?;
    let zero = cx.scalar(0.0, cx.dtype(x))?;
    one(cx.call("where", &[Some(above), Some(x), Some(zero)], &[])?)
}

pub fn hard_sigmoid(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 0.2)?;
    let b = cx.float("beta", 0.5)?;
    let ax = cx.with_scalar("mul", x, a)?;
    let y = cx.with_scalar("add", ax, b)?;
    one(cx.call(
        "clamp",
        &[Some(y)],
        &[("min", Attr::Float(0.0)), ("max", Attr::Float(1.0))],
    )?)
}

pub fn softplus(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    // log(1 + e^x) without torch's linear threshold
    one(cx.call(
        "softplus",
        &[Some(x)],
        &[("threshold", Attr::Float(f64::INFINITY))],
    )?)
}

pub fn softsign(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.call("abs", &[Some(x)], &[])?;
    let d = cx.with_scalar("add", a, 1.0)?;
    one(cx.call("div", &[Some(x), Some(d)], &[])?)
}

pub fn gelu(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let approx = cx.string("approximate")?.unwrap_or_else(|| "none".into());
    one(cx.call("gelu", &[Some(x)], &[("approximate", Attr::Str(approx))])?)
}

pub fn shrink(cx: &mut Cx) -> Result<Vec<Val>> {
    // x < -lambd: x + bias; x > lambd: x - bias; else 0
    let x = cx.x(0)?;
    let l = cx.float("lambd", 0.5)?;
    let b = cx.float("bias", 0.0)?;
    let lo = cx.with_scalar("lt", x, -l)?;
    let hi = cx.with_scalar("gt", x, l)?;
    let plus = cx.with_scalar("add", x, b)?;
    let minus = cx.with_scalar("sub", x, b)?;
    let zero = cx.scalar(0.0, cx.dtype(x))?;
    let inner = cx.call("where", &[Some(hi), Some(minus), Some(zero)], &[])?;
    one(cx.call("where", &[Some(lo), Some(plus), Some(inner)], &[])?)
}

pub fn tan(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let s = cx.call("sin", &[Some(x)], &[])?;
    let c = cx.call("cos", &[Some(x)], &[])?;
    one(cx.call("div", &[Some(s), Some(c)], &[])?)
}

/// `(e^x + sign * e^-x) / 2`.
fn exp_pair(cx: &mut Cx, sign: f64) -> Result<ValueId> {
    let x = cx.x(0)?;
    let e = cx.call("exp", &[Some(x)], &[])?;
    let n = cx.call("neg", &[Some(x)], &[])?;
    let en = cx.call("exp", &[Some(n)], &[])?;
    let s = if sign > 0.0 {
        cx.call("add", &[Some(e), Some(en)], &[])?
    } else {
        cx.call("sub", &[Some(e), Some(en)], &[])?
    };
    cx.with_scalar("mul", s, 0.5)
}

pub fn sinh(cx: &mut Cx) -> Result<Vec<Val>> {
    one(exp_pair(cx, -1.0)?)
}

pub fn cosh(cx: &mut Cx) -> Result<Vec<Val>> {
    one(exp_pair(cx, 1.0)?)
}

/// `log(x + sqrt(x² + sign))`.
fn log_root(cx: &mut Cx, sign: f64) -> Result<ValueId> {
    let x = cx.x(0)?;
    let sq = cx.call("square", &[Some(x)], &[])?;
    let s = cx.with_scalar("add", sq, sign)?;
    let r = cx.call("sqrt", &[Some(s)], &[])?;
    let a = cx.call("add", &[Some(x), Some(r)], &[])?;
    cx.call("log", &[Some(a)], &[])
}

pub fn asinh(cx: &mut Cx) -> Result<Vec<Val>> {
    one(log_root(cx, 1.0)?)
}

pub fn acosh(cx: &mut Cx) -> Result<Vec<Val>> {
    one(log_root(cx, -1.0)?)
}

pub fn atanh(cx: &mut Cx) -> Result<Vec<Val>> {
    // log((1 + x) / (1 - x)) / 2
    let x = cx.x(0)?;
    let p = cx.with_scalar("add", x, 1.0)?;
    let n = cx.call("neg", &[Some(x)], &[])?;
    let m = cx.with_scalar("add", n, 1.0)?;
    let q = cx.call("div", &[Some(p), Some(m)], &[])?;
    let l = cx.call("log", &[Some(q)], &[])?;
    one(cx.with_scalar("mul", l, 0.5)?)
}

pub fn is_inf(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let pos = cx.int("detect_positive", 1)? != 0;
    let neg = cx.int("detect_negative", 1)? != 0;
    let p = cx.with_scalar("eq", x, f64::INFINITY)?;
    let n = cx.with_scalar("eq", x, f64::NEG_INFINITY)?;
    one(match (pos, neg) {
        (true, true) => cx.call("logical_or", &[Some(p), Some(n)], &[])?,
        (true, false) => p,
        (false, true) => n,
        (false, false) => cx.call(
            "full",
            &[],
            &[
                (
                    "size",
                    list(&cx.shape(x).iter().map(|&d| d as i64).collect::<Vec<_>>()),
                ),
                ("fill_value", Attr::Bool(false)),
            ],
        )?,
    })
}

/// `x` converted to `dtype` (itself when it has it already).
pub(super) fn cast_to(cx: &mut Cx, x: ValueId, dtype: DType) -> Result<ValueId> {
    if cx.dtype(x) == dtype {
        return Ok(x);
    }
    cx.call("to", &[Some(x)], &[("dtype", Attr::DType(dtype))])
}

pub fn cast(cx: &mut Cx) -> Result<Vec<Val>> {
    let Some(to) = cx.attr("to").map(|a| a.i as i32) else {
        bail!(Value, "attribute 'to' is required");
    };
    convert(cx, to)
}

pub fn cast_like(cx: &mut Cx) -> Result<Vec<Val>> {
    let to = cx.elem_type(1)?;
    convert(cx, to)
}

/// Input 0 converted to ONNX element type `to`.
fn convert(cx: &mut Cx, to: i32) -> Result<Vec<Val>> {
    let dtype = crate::onnx::tensor::dtype_of(to)?;
    let x = cx.x(0)?;
    match crate::onnx::elem::held(to) {
        Some(h) => {
            let saturate = cx.int("saturate", 1)? != 0;
            one(held::cast_to_held(cx, x, h, saturate)?)
        }
        None if cx.dtype(x) == dtype => identity(cx),
        None => one(cast_to(cx, x, dtype)?),
    }
}

/// `BitCast`: the bits of input 0 read as type `to`, of the same width. Between integer
/// types (bool included) that is the wrapping conversion to the target's width; with a
/// float on either side, smelt's `view(dtype)`. The float8/float4 types smelt holds in
/// f32 are refused.
pub fn bit_cast(cx: &mut Cx) -> Result<Vec<Val>> {
    use crate::onnx::elem::{Held, held};
    let Some(to) = cx.attr("to").map(|a| a.i as i32) else {
        bail!(Value, "attribute 'to' is required");
    };
    let from = cx.elem_type(0)?;
    let width = |code: i32| -> Result<(u32, Option<Held>, DType)> {
        let d = crate::onnx::tensor::dtype_of(code)?;
        Ok(match held(code) {
            Some(h) => (h.file_bits(), Some(h), d),
            None => (d.size() as u32 * 8, None, d),
        })
    };
    let ((wf, hf, df), (wt, ht, dt)) = (width(from)?, width(to)?);
    if wf != wt {
        bail!(
            Value,
            "BitCast needs types of one width: element type {from} has {wf} bits, {to} has {wt}"
        );
    }
    let minifloat = |h: Option<Held>| matches!(h, Some(Held::Float(_) | Held::Scale));
    if minifloat(hf) || minifloat(ht) {
        bail!(
            Unsupported,
            "BitCast of the float8/float4 types smelt holds in f32 is not supported"
        );
    }
    let x = cx.x(0)?;
    if df.is_float() || dt.is_float() {
        return one(cx.call("view", &[Some(x)], &[("dtype", Attr::DType(dt))])?);
    }
    one(match ht {
        Some(h) => held::cast_to_held(cx, x, h, true)?,
        None => cast_to(cx, x, dt)?,
    })
}

/// `BitShift`: a product or floor quotient by `2^y`, wrapped to the width of a held type.
/// A shift outside `[0, width)` moves every bit out: 0, or for a right shift of a negative
/// signed value, -1.
pub fn bit_shift(cx: &mut Cx) -> Result<Vec<Val>> {
    let (x, y) = (cx.x(0)?, cx.x(1)?);
    let held = crate::onnx::elem::held(cx.elem_type(0)?);
    let dtype = cx.dtype(x);
    if dtype.is_float() || dtype == DType::Bool {
        bail!(DType, "BitShift of {dtype}");
    }
    let width = match held {
        Some(crate::onnx::elem::Held::Unsigned(bits)) => bits as f64,
        _ => (dtype.size() * 8) as f64,
    };
    let neg = cx.with_scalar("lt", y, 0.0)?;
    let wide = cx.with_scalar("ge", y, width)?;
    let outside = cx.call("logical_or", &[Some(neg), Some(wide)], &[])?;
    let zero = cx.scalar(0.0, cx.dtype(y))?;
    let safe = cx.call("where", &[Some(outside), Some(zero), Some(y)], &[])?;
    let two = cx.scalar(2.0, cx.dtype(y))?;
    let p = cx.call("pow", &[Some(two), Some(safe)], &[])?;
    let direction = cx.string("direction")?.unwrap_or_default();
    let (r, fill) = match direction.as_str() {
        "LEFT" => (
            cx.call("mul", &[Some(x), Some(p)], &[])?,
            cx.scalar(0.0, dtype)?,
        ),
        "RIGHT" => {
            let r = cx.call(
                "div",
                &[Some(x), Some(p)],
                &[("rounding_mode", Attr::Str("floor".into()))],
            )?;
            let negative = cx.with_scalar("lt", x, 0.0)?;
            let (m1, z) = (cx.scalar(-1.0, dtype)?, cx.scalar(0.0, dtype)?);
            (
                r,
                cx.call("where", &[Some(negative), Some(m1), Some(z)], &[])?,
            )
        }
        other => bail!(Value, "direction '{other}' should be LEFT or RIGHT"),
    };
    let r = match held {
        Some(crate::onnx::elem::Held::Unsigned(bits)) => held::wrap_unsigned(cx, r, bits)?,
        _ => r,
    };
    let r = cast_to(cx, r, dtype)?;
    one(cx.call("where", &[Some(outside), Some(fill), Some(r)], &[])?)
}

pub fn clip(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let float = cx.dtype(x).is_float();
    let bound = |v: f64| {
        if float {
            Attr::Float(v)
        } else {
            Attr::Int(v as i64)
        }
    };
    let (lo, hi) = if cx.opset() < 11 {
        (
            cx.attr("min").map(|_| cx.float("min", 0.0)).transpose()?,
            cx.attr("max").map(|_| cx.float("max", 0.0)).transpose()?,
        )
    } else {
        let get = |cx: &Cx, i: usize| -> Result<Option<f64>> {
            Ok(cx
                .floats_input(i, "bound")?
                .and_then(|v| v.first().copied()))
        };
        match (
            (!cx.has(1) || cx.known(1).is_some()),
            (!cx.has(2) || cx.known(2).is_some()),
        ) {
            (true, true) => (get(cx, 1)?, get(cx, 2)?),
            _ => {
                // bounds computed at run time: max(x, lo) then min(., hi)
                let mut y = x;
                if let Some(lo) = cx.opt(1)? {
                    y = cx.call("maximum", &[Some(y), Some(lo)], &[])?;
                }
                if let Some(hi) = cx.opt(2)? {
                    y = cx.call("minimum", &[Some(y), Some(hi)], &[])?;
                }
                return one(y);
            }
        }
    };
    let mut attrs = Vec::new();
    if let Some(lo) = lo {
        attrs.push(("min", bound(lo)));
    }
    if let Some(hi) = hi {
        attrs.push(("max", bound(hi)));
    }
    if attrs.is_empty() {
        return identity(cx);
    }
    let y = cx.call("clamp", &[Some(x)], &attrs)?;
    one(cast_to(cx, y, cx.dtype(x))?)
}

pub fn swish(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let a = cx.float("alpha", 1.0)?;
    let ax = cx.with_scalar("mul", x, a)?;
    let s = cx.call("sigmoid", &[Some(ax)], &[])?;
    one(cx.call("mul", &[Some(x), Some(s)], &[])?)
}

/// `SwiGLU(a, b)`: `a * sigmoid(alpha * a) * b`.
pub fn swiglu(cx: &mut Cx) -> Result<Vec<Val>> {
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    if cx.shape(a) != cx.shape(b) {
        bail!(
            Value,
            "inputs of shapes {:?} and {:?} (SwiGLU does not broadcast)",
            cx.shape(a),
            cx.shape(b)
        );
    }
    let alpha = cx.float("alpha", 1.0)?;
    let za = cx.with_scalar("mul", a, alpha)?;
    let s = cx.call("sigmoid", &[Some(za)], &[])?;
    let swish = cx.call("mul", &[Some(a), Some(s)], &[])?;
    one(cx.call("mul", &[Some(swish), Some(b)], &[])?)
}
