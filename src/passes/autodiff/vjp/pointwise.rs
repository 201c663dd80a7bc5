//! The gradients of the pointwise ops: unary, binary and `clamp`.

use super::Grads;
use crate::ir::dtype::Scalar;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op, UnaryOp};
use crate::passes::autodiff::graph_builder::Emit;
use crate::{Result, bail};

pub(super) fn unary(
    e: &mut Emit,
    u: UnaryOp,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<ValueId> {
    use UnaryOp::*;
    match u {
        Neg => e.neg(g),
        Abs => {
            let s = e.unary(Sign, x)?;
            e.mul(g, s)
        }
        Exp => e.mul(g, y),
        Log => e.div(g, x),
        Log1p => {
            let d = e.add_s(x, 1.0)?;
            e.div(g, d)
        }
        Expm1 => {
            let d = e.add_s(y, 1.0)?;
            e.mul(g, d)
        }
        Sqrt => {
            let d = e.mul_s(y, 2.0)?;
            e.div(g, d)
        }
        Rsqrt => {
            let y2 = e.mul(y, y)?;
            let y3 = e.mul(y2, y)?;
            let d = e.mul_s(y3, -0.5)?;
            e.mul(g, d)
        }
        Sin => {
            let c = e.unary(Cos, x)?;
            e.mul(g, c)
        }
        Cos => {
            let s = e.unary(Sin, x)?;
            let n = e.neg(s)?;
            e.mul(g, n)
        }
        Tanh => {
            let y2 = e.mul(y, y)?;
            let d = e.rsub_s(1.0, y2)?;
            e.mul(g, d)
        }
        Sigmoid => {
            let one_m = e.rsub_s(1.0, y)?;
            let d = e.mul(y, one_m)?;
            e.mul(g, d)
        }
        Relu => {
            let pos = e.bin_s(BinaryOp::Gt, y, 0.0)?;
            e.keep_where(pos, g)
        }
        Gelu { tanh } => {
            let d = e.unary(GeluSlope { tanh }, x)?;
            e.mul(g, d)
        }
        // φ(x)·(2 - x²)
        GeluSlope { tanh: false } => {
            let x2 = e.mul(x, x)?;
            let ex = e.mul_s(x2, -0.5)?;
            let ep = e.unary(Exp, ex)?;
            let pdf = e.mul_s(ep, crate::ir::unary::FRAC_1_SQRT_2PI)?;
            let two_m = e.rsub_s(2.0, x2)?;
            let d = e.mul(pdf, two_m)?;
            e.mul(g, d)
        }
        // σ(1-σ)·(2v' + x·((1-2σ)·v'² + v'')), σ = sigmoid(v), v = K(x + C x³)
        GeluSlope { tanh: true } => {
            const C: f64 = 0.044715;
            let k = 2.0 * crate::ir::unary::SQRT_2_OVER_PI;
            let x2 = e.mul(x, x)?;
            let x3 = e.mul(x2, x)?;
            let c3 = e.mul_s(x3, C)?;
            let inner = e.add(x, c3)?;
            let v = e.mul_s(inner, k)?;
            let s = e.unary(Sigmoid, v)?;
            let one_m = e.rsub_s(1.0, s)?;
            let ss = e.mul(s, one_m)?;
            let x2c = e.mul_s(x2, 3.0 * C)?;
            let dv0 = e.add_s(x2c, 1.0)?;
            let dv = e.mul_s(dv0, k)?;
            let ddv = e.mul_s(x, 6.0 * C * k)?;
            let two_s = e.mul_s(s, 2.0)?;
            let one_m2 = e.rsub_s(1.0, two_s)?;
            let dv2 = e.mul(dv, dv)?;
            let t0 = e.mul(one_m2, dv2)?;
            let t1 = e.add(t0, ddv)?;
            let t2 = e.mul(x, t1)?;
            let dv_2 = e.mul_s(dv, 2.0)?;
            let t3 = e.add(dv_2, t2)?;
            let d = e.mul(ss, t3)?;
            e.mul(g, d)
        }
        Silu => {
            let s = e.unary(Sigmoid, x)?;
            let one_m = e.rsub_s(1.0, s)?;
            let xo = e.mul(x, one_m)?;
            let p = e.add_s(xo, 1.0)?;
            let d = e.mul(s, p)?;
            e.mul(g, d)
        }
        Erf => {
            let x2 = e.mul(x, x)?;
            let n = e.neg(x2)?;
            let ex = e.unary(Exp, n)?;
            let d = e.mul_s(ex, 2.0 / std::f64::consts::PI.sqrt())?;
            e.mul(g, d)
        }
        Floor | Ceil | Round | Sign => e.zeros_like(g),
        Reciprocal => {
            let y2 = e.mul(y, y)?;
            let n = e.neg(y2)?;
            e.mul(g, n)
        }
        Square => {
            let d = e.mul_s(x, 2.0)?;
            e.mul(g, d)
        }
        // PyTorch's backward formulas (derivatives.yaml), NaN taking the same branch
        LeakyRelu { negative_slope } => {
            let pos = e.bin_s(BinaryOp::Gt, x, 0.0)?;
            let neg = e.mul_s(g, negative_slope.get())?;
            e.op(Op::Where, &[pos, g, neg])
        }
        Elu { alpha } => {
            let le = e.bin_s(BinaryOp::Le, x, 0.0)?;
            let ex = e.unary(Exp, x)?;
            let d = e.mul_s(ex, alpha.get())?;
            let neg = e.mul(g, d)?;
            e.op(Op::Where, &[le, neg, g])
        }
        Softplus { beta, threshold } => {
            let bx = e.mul_s(x, beta.get())?;
            let linear = e.bin_s(BinaryOp::Gt, bx, threshold.get())?;
            let z = e.unary(Exp, bx)?;
            let z1 = e.add_s(z, 1.0)?;
            let gz = e.mul(g, z)?;
            let soft = e.div(gz, z1)?;
            e.op(Op::Where, &[linear, g, soft])
        }
        Hardtanh { min_val, max_val } => {
            let lo = e.bin_s(BinaryOp::Le, x, min_val.get())?;
            let hi = e.bin_s(BinaryOp::Ge, x, max_val.get())?;
            let out = e.bin(BinaryOp::LogicalOr, lo, hi)?;
            let z = e.scalar(0.0)?;
            e.op(Op::Where, &[out, z, g])
        }
        Hardswish => {
            let x3 = e.bin_s(BinaryOp::Div, x, 3.0)?;
            let d = e.add_s(x3, 0.5)?;
            let mid = e.mul(g, d)?;
            let le3 = e.bin_s(BinaryOp::Le, x, 3.0)?;
            let inner = e.op(Op::Where, &[le3, mid, g])?;
            let low = e.bin_s(BinaryOp::Lt, x, -3.0)?;
            let z = e.scalar(0.0)?;
            e.op(Op::Where, &[low, z, inner])
        }
        Mish => {
            let s = e.unary(Sigmoid, x)?;
            let ex = e.unary(Exp, x)?;
            let sp = e.unary(Log1p, ex)?;
            let t = e.unary(Tanh, sp)?;
            let t2 = e.mul(t, t)?;
            let sech2 = e.rsub_s(1.0, t2)?;
            let xs = e.mul(x, s)?;
            let b = e.mul(xs, sech2)?;
            let d = e.add(t, b)?;
            e.mul(g, d)
        }
        LogSigmoid => {
            let nx = e.neg(x)?;
            let d = e.unary(Sigmoid, nx)?;
            e.mul(g, d)
        }
        // PyTorch: g·rsqrt(1 - x²), its negation, g / (1 + x²)
        Asin | Acos => {
            let x2 = e.mul(x, x)?;
            let d = e.rsub_s(1.0, x2)?;
            let r = e.unary(Rsqrt, d)?;
            let r = if u == Acos { e.neg(r)? } else { r };
            e.mul(g, r)
        }
        Atan => {
            let x2 = e.mul(x, x)?;
            let d = e.add_s(x2, 1.0)?;
            e.div(g, d)
        }
        LogicalNot | IsNan | BitwiseNot => bail!(Value, "{} has no gradient", u.name()),
    }
}

pub(super) fn binary(
    e: &mut Emit,
    b: BinaryOp,
    a: ValueId,
    c: ValueId,
    y: ValueId,
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    use BinaryOp::*;
    let (na, nc) = (needs[0], needs[1]);
    Ok(match b {
        Add => vec![Some(g), Some(g)],
        Sub => vec![Some(g), nc.then(|| e.neg(g)).transpose()?],
        Mul => vec![
            na.then(|| e.mul(g, c)).transpose()?,
            nc.then(|| e.mul(g, a)).transpose()?,
        ],
        Div => {
            let ga = na.then(|| e.div(g, c)).transpose()?;
            let gc = if nc {
                // -g·a/c², as PyTorch computes it.
                let c2 = e.mul(c, c)?;
                let q = e.div(a, c2)?;
                let gq = e.mul(g, q)?;
                Some(e.neg(gq)?)
            } else {
                None
            };
            vec![ga, gc]
        }
        Pow => {
            let ga = if na {
                Some(pow_base(e, a, c, g)?)
            } else {
                None
            };
            let gc = if nc {
                // g·y·log(a), zero where a == 0 and the exponent is >= 0.
                let la = e.unary(UnaryOp::Log, a)?;
                let yl = e.mul(y, la)?;
                let v = e.mul(g, yl)?;
                let az = e.bin_s(Eq, a, 0.0)?;
                let cp = e.bin_s(Ge, c, 0.0)?;
                let m = e.bin(LogicalAnd, az, cp)?;
                let z = e.scalar(0.0)?;
                Some(e.op(Op::Where, &[m, z, v])?)
            } else {
                None
            };
            vec![ga, gc]
        }
        Maximum | Minimum => {
            // Ties split the gradient evenly, as PyTorch does.
            let win = e.bin(if b == Maximum { Gt } else { Lt }, a, c)?;
            let tie = e.bin(Eq, a, c)?;
            let dt = e.dtype(g);
            let w = e.mask(win, dt)?;
            let t = e.mask(tie, dt)?;
            let th = e.mul_s(t, 0.5)?;
            let wa = e.add(w, th)?;
            let ga = e.mul(g, wa)?;
            let wc = e.rsub_s(1.0, wa)?;
            // 1 - wa is 1 where a loses; NaN comparisons give neither side a gradient.
            let lose = e.bin(if b == Maximum { Lt } else { Gt }, a, c)?;
            let either = e.bin(LogicalOr, lose, tie)?;
            let wc = e.keep_where(either, wc)?;
            let gc = e.mul(g, wc)?;
            vec![Some(ga), Some(gc)]
        }
        Remainder => {
            let gc = if nc {
                let q = e.div(a, c)?;
                let f = e.unary(UnaryOp::Floor, q)?;
                let gf = e.mul(g, f)?;
                Some(e.neg(gf)?)
            } else {
                None
            };
            vec![Some(g), gc]
        }
        // PyTorch: a rounded quotient has a zero gradient, as comparisons do
        DivFloor | DivTrunc | Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | BitwiseAnd
        | BitwiseOr | BitwiseXor => vec![None, None],
    })
}

/// d(a^c)/da · g = g·c·a^(c-1), zero where the exponent is 0.
fn pow_base(e: &mut Emit, a: ValueId, c: ValueId, g: ValueId) -> Result<ValueId> {
    if let Some(s) = e.scalar_value(c) {
        let s = s.to_f64();
        if s == 0.0 {
            return e.zeros_like(g);
        }
        let em1 = e.g.add_scalar(Scalar::Float(s - 1.0))?;
        let p = e.bin(BinaryOp::Pow, a, em1)?;
        let ps = e.mul_s(p, s)?;
        return e.mul(g, ps);
    }
    let cm1 = e.add_s(c, -1.0)?;
    let p = e.bin(BinaryOp::Pow, a, cm1)?;
    let cp = e.mul(c, p)?;
    let v = e.mul(g, cp)?;
    let cz = e.bin_s(BinaryOp::Eq, c, 0.0)?;
    let z = e.scalar(0.0)?;
    e.op(Op::Where, &[cz, z, v])
}

pub(super) fn clamp(
    e: &mut Emit,
    min: Option<Scalar>,
    max: Option<Scalar>,
    x: ValueId,
    g: ValueId,
) -> Result<Grads> {
    // The gradient passes where min <= x <= max.
    let mut keep: Option<ValueId> = None;
    for (bound, cmp) in [(min, BinaryOp::Ge), (max, BinaryOp::Le)] {
        if let Some(s) = bound {
            let sv = e.g.add_scalar(s)?;
            let m = e.bin(cmp, x, sv)?;
            keep = Some(match keep {
                Some(k) => e.bin(BinaryOp::LogicalAnd, k, m)?,
                None => m,
            });
        }
    }
    Ok(vec![match keep {
        Some(k) => Some(e.keep_where(k, g)?),
        None => Some(g),
    }])
}
