//! Conversions to the ONNX element types smelt holds in a wider dtype (`onnx::elem`): a float
//! rounds to the nearest float8/float4 value (ties to even) and saturates or overflows as
//! `Cast`'s `saturate` says; an integer wraps to its width; a float converted to int4/int2
//! truncates, and one out of range gives 0 (the ONNX reference's result); float8e8m0 takes
//! the exponent field of the f32 bits, rounded as `round_mode` says.

use super::elementwise::cast_to;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::elem::{Held, Minifloat};
use crate::onnx::import::Cx;
use crate::{DType, Result, bail};

/// `x` converted to held type `h`, in the dtype that holds it.
pub(super) fn cast_to_held(cx: &mut Cx, x: ValueId, h: Held, saturate: bool) -> Result<ValueId> {
    match h {
        Held::Float(f) => round_to(cx, x, f, saturate),
        Held::Unsigned(bits) => {
            let y = cast_to(cx, x, h.dtype())?;
            wrap_unsigned(cx, y, bits)
        }
        Held::Narrow { .. } => narrow(cx, x, h),
        Held::Scale => to_scale(cx, x, saturate),
    }
}

/// float8e8m0 from the bits of `x` as f32, as the ONNX reference converts
/// (`numpy_helper.to_float8e8m0`): the exponent field, raised by the node's `round_mode`
/// (`up` when the mantissa is not zero, `nearest` by its guard, round and sticky bits,
/// `down` never), held at the largest pattern under `saturate`; NaN and infinities give
/// NaN. The sign is ignored (ONNX leaves negative values unspecified).
fn to_scale(cx: &mut Cx, x: ValueId, saturate: bool) -> Result<ValueId> {
    let mode = cx.string("round_mode")?.unwrap_or_else(|| "up".into());
    let x = cast_to(cx, x, DType::F32)?;
    let bits = cx.call("view", &[Some(x)], &[("dtype", Attr::DType(DType::I32))])?;
    let bits = cx.with_scalar("bitwise_and", bits, f64::from(0x7fff_ffff))?;
    let exp = {
        let d = [("rounding_mode", Attr::Str("floor".into()))];
        let two23 = cx.scalar(f64::from(1u32 << 23), DType::I32)?;
        cx.call("div", &[Some(bits), Some(two23)], &d)?
    };
    let field = |cx: &mut Cx, mask: u32| -> Result<ValueId> {
        let m = cx.with_scalar("bitwise_and", bits, f64::from(mask))?;
        cx.with_scalar("ne", m, 0.0)
    };
    let and =
        |cx: &mut Cx, a: ValueId, b: ValueId| cx.call("logical_and", &[Some(a), Some(b)], &[]);
    let or = |cx: &mut Cx, a: ValueId, b: ValueId| cx.call("logical_or", &[Some(a), Some(b)], &[]);
    let special = cx.with_scalar("eq", exp, 255.0)?;
    let normal = cx.call("logical_not", &[Some(special)], &[])?;
    let raise = match mode.as_str() {
        "up" => {
            let frac = field(cx, 0x7f_ffff)?;
            Some(and(cx, frac, normal)?)
        }
        "nearest" => {
            let g = field(cx, 0x40_0000)?;
            let r = field(cx, 0x20_0000)?;
            let s = field(cx, 0x1f_ffff)?;
            let lsb = cx.with_scalar("gt", exp, 0.0)?;
            let rs = or(cx, r, s)?;
            let any = or(cx, rs, lsb)?;
            let up = and(cx, g, any)?;
            Some(and(cx, up, normal)?)
        }
        "down" => None,
        m => bail!(Value, "round_mode '{m}' is not one of up, down, nearest"),
    };
    let code = match raise {
        Some(raise) => {
            let raise = if saturate {
                let top = cx.with_scalar("eq", exp, 254.0)?;
                let below = cx.call("logical_not", &[Some(top)], &[])?;
                and(cx, raise, below)?
            } else {
                raise
            };
            let one = cast_to(cx, raise, DType::I32)?;
            cx.call("add", &[Some(exp), Some(one)], &[])?
        }
        None => exp,
    };
    // 2^(code-127) as f32 bits: the exponent field, or for code 0 the subnormal 2^-127
    let shifted = cx.with_scalar("mul", code, f64::from(1u32 << 23))?;
    let zero = cx.with_scalar("eq", code, 0.0)?;
    let sub = cx.scalar(f64::from(0x40_0000), DType::I32)?;
    let bits = cx.call("where", &[Some(zero), Some(sub), Some(shifted)], &[])?;
    let value = cx.call("view", &[Some(bits)], &[("dtype", Attr::DType(DType::F32))])?;
    let nan_code = cx.with_scalar("eq", code, 255.0)?;
    let nan = cx.scalar(f64::NAN, DType::F32)?;
    cx.call("where", &[Some(nan_code), Some(nan), Some(value)], &[])
}

/// `x` reduced modulo 2^bits (nothing for 64 bits, held in i64 as its bit pattern).
pub(super) fn wrap_unsigned(cx: &mut Cx, x: ValueId, bits: u32) -> Result<ValueId> {
    if bits >= 64 {
        return Ok(x);
    }
    let m = cx.scalar((1u64 << bits) as f64, cx.dtype(x))?;
    cx.call("remainder", &[Some(x), Some(m)], &[])
}

/// The nearest value of format `f`: the quantum of `x`'s binade (a chain of comparisons, one
/// per binade), then `round(x / q) * q`, both steps exact in the working float.
fn round_to(cx: &mut Cx, x: ValueId, f: Minifloat, saturate: bool) -> Result<ValueId> {
    let work = if cx.dtype(x) == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let x = cast_to(cx, x, work)?;
    let a = cx.call("abs", &[Some(x)], &[])?;
    let m = f.mantissa as i32;
    let mut q = cx.scalar(2f64.powi(f.emin - m), work)?;
    for e in f.emin + 1..=f.emax() {
        let ge = cx.with_scalar("ge", a, 2f64.powi(e))?;
        let qe = cx.scalar(2f64.powi(e - m), work)?;
        q = cx.op("where", &[ge, qe, q])?;
    }
    let steps = cx.op("div", &[x, q])?;
    let steps = cx.call("round", &[Some(steps)], &[])?;
    let mut r = cx.op("mul", &[steps, q])?;
    let ra = cx.call("abs", &[Some(r)], &[])?;
    let over = cx.with_scalar("gt", ra, f.max)?;
    let sign = cx.call("sign", &[Some(x)], &[])?;
    let limit = if saturate || !(f.inf || f.nan) {
        cx.with_scalar("mul", sign, f.max)?
    } else if f.inf {
        cx.with_scalar("mul", sign, f64::INFINITY)?
    } else {
        cx.scalar(f64::NAN, work)?
    };
    r = cx.op("where", &[over, limit, r])?;
    if !f.neg_zero {
        let zero = cx.with_scalar("eq", r, 0.0)?;
        let pos = cx.scalar(0.0, work)?;
        r = cx.op("where", &[zero, pos, r])?;
    }
    if !f.nan {
        // a format without NaN: the reference gives -0 for it
        let nan = cx.call("isnan", &[Some(x)], &[])?;
        let z = cx.scalar(-0.0, work)?;
        r = cx.op("where", &[nan, z, r])?;
    }
    cast_to(cx, r, DType::F32)
}

/// `x` as int4/int2/uint4/uint2: floats truncate (0 out of range), integers wrap.
fn narrow(cx: &mut Cx, x: ValueId, h: Held) -> Result<ValueId> {
    let (lo, hi) = h
        .int_range()
        .ok_or_else(|| crate::Error::DType(format!("{h:?} is not an integer type")))?;
    let src = cx.dtype(x);
    if src.is_float() {
        let above = cx.with_scalar("gt", x, lo as f64 - 1.0)?;
        let below = cx.with_scalar("lt", x, hi as f64 + 1.0)?;
        let inside = cx.op("logical_and", &[above, below])?;
        let zero = cx.scalar(0.0, src)?;
        let y = cx.op("where", &[inside, x, zero])?;
        return cast_to(cx, y, h.dtype());
    }
    if src == DType::Bool {
        return cast_to(cx, x, h.dtype());
    }
    let w = cast_to(cx, x, DType::I64)?;
    let shifted = cx.with_scalar("sub", w, lo as f64)?;
    let m = cx.with_scalar("remainder", shifted, (hi - lo + 1) as f64)?;
    let y = cx.with_scalar("add", m, lo as f64)?;
    cast_to(cx, y, h.dtype())
}
