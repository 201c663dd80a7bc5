//! Conversions to the ONNX element types smelt holds in a wider dtype (`onnx::elem`): a float
//! rounds to the nearest float8/float4 value (ties to even) and saturates or overflows as
//! `Cast`'s `saturate` says; an integer wraps to its width; a float converted to int4/int2
//! truncates, and one out of range gives 0 (the ONNX reference's result).

use super::elementwise::cast_to;
use crate::ir::graph::ValueId;
use crate::onnx::elem::{Held, Minifloat};
use crate::onnx::import::Cx;
use crate::{DType, Result};

/// `x` converted to held type `h`, in the dtype that holds it.
pub(super) fn cast_to_held(cx: &mut Cx, x: ValueId, h: Held, saturate: bool) -> Result<ValueId> {
    match h {
        Held::Float(f) => round_to(cx, x, f, saturate),
        Held::Unsigned(bits) => {
            let y = cast_to(cx, x, h.dtype())?;
            wrap_unsigned(cx, y, bits)
        }
        Held::Narrow { .. } => narrow(cx, x, h),
    }
}

/// `x` reduced modulo 2^bits (nothing for 64 bits, held in i64 as its bit pattern).
pub(super) fn wrap_unsigned(cx: &mut Cx, x: ValueId, bits: u32) -> Result<ValueId> {
    if bits >= 64 {
        return Ok(x);
    }
    let m = cx.scalar((1u64 << bits) as f64, cx.dtype(x))?;
    cx.call("remainder", &[Some(x), Some(m)], &[])
}

fn binary(cx: &mut Cx, name: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
    cx.call(name, &[Some(x), Some(y)], &[])
}

fn with(cx: &mut Cx, name: &str, x: ValueId, s: f64) -> Result<ValueId> {
    let c = cx.scalar(s, cx.dtype(x))?;
    binary(cx, name, x, c)
}

fn select(cx: &mut Cx, c: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
    cx.call("where", &[Some(c), Some(a), Some(b)], &[])
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
        let ge = with(cx, "ge", a, 2f64.powi(e))?;
        let qe = cx.scalar(2f64.powi(e - m), work)?;
        q = select(cx, ge, qe, q)?;
    }
    let steps = binary(cx, "div", x, q)?;
    let steps = cx.call("round", &[Some(steps)], &[])?;
    let mut r = binary(cx, "mul", steps, q)?;
    let ra = cx.call("abs", &[Some(r)], &[])?;
    let over = with(cx, "gt", ra, f.max)?;
    let sign = cx.call("sign", &[Some(x)], &[])?;
    let limit = if saturate || !(f.inf || f.nan) {
        with(cx, "mul", sign, f.max)?
    } else if f.inf {
        with(cx, "mul", sign, f64::INFINITY)?
    } else {
        cx.scalar(f64::NAN, work)?
    };
    r = select(cx, over, limit, r)?;
    if !f.neg_zero {
        let zero = with(cx, "eq", r, 0.0)?;
        let pos = cx.scalar(0.0, work)?;
        r = select(cx, zero, pos, r)?;
    }
    if !f.nan {
        // a format without NaN: the reference gives -0 for it
        let nan = cx.call("isnan", &[Some(x)], &[])?;
        let z = cx.scalar(-0.0, work)?;
        r = select(cx, nan, z, r)?;
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
        let above = with(cx, "gt", x, lo as f64 - 1.0)?;
        let below = with(cx, "lt", x, hi as f64 + 1.0)?;
        let inside = binary(cx, "logical_and", above, below)?;
        let zero = cx.scalar(0.0, src)?;
        let y = select(cx, inside, x, zero)?;
        return cast_to(cx, y, h.dtype());
    }
    if src == DType::Bool {
        return cast_to(cx, x, h.dtype());
    }
    let w = cast_to(cx, x, DType::I64)?;
    let shifted = with(cx, "sub", w, lo as f64)?;
    let m = with(cx, "remainder", shifted, (hi - lo + 1) as f64)?;
    let y = with(cx, "add", m, lo as f64)?;
    cast_to(cx, y, h.dtype())
}
