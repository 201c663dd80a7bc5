//! The optimizers of the `ai.onnx.preview.training` domain (`Adagrad`, `Adam`, `Momentum`):
//! one update of several tensors, each with its own gradient and state. Computed in f64 and
//! rounded once to each tensor's dtype (the reference's NumPy promotes to f64 too).

use super::elementwise::cast_to;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

/// The learning rate and step count as f64 values, and the number of tensors updated when
/// each takes `per` inputs.
fn common(cx: &mut Cx, per: usize) -> Result<(ValueId, ValueId, usize)> {
    let n = cx.n_inputs().saturating_sub(2);
    if n == 0 || !n.is_multiple_of(per) {
        bail!(
            Value,
            "{} inputs: R, T, then {per} groups of tensors",
            cx.n_inputs()
        );
    }
    let (r, t) = (cx.x(0)?, cx.x(1)?);
    Ok((
        cast_to(cx, r, DType::F64)?,
        cast_to(cx, t, DType::F64)?,
        n / per,
    ))
}

fn f64_input(cx: &mut Cx, i: usize) -> Result<(ValueId, DType)> {
    let x = cx.x(i)?;
    let d = cx.dtype(x);
    Ok((cast_to(cx, x, DType::F64)?, d))
}

fn k(cx: &mut Cx, v: f64) -> Result<ValueId> {
    cx.scalar(v, DType::F64)
}

/// `c * x + g`: the gradient with its L2 term.
fn regularized(cx: &mut Cx, x: ValueId, g: ValueId, c: f64) -> Result<ValueId> {
    let c = k(cx, c)?;
    let cx_ = cx.op("mul", &[x, c])?;
    cx.op("add", &[cx_, g])
}

pub fn adagrad(cx: &mut Cx) -> Result<Vec<Val>> {
    let (r, t, n) = common(cx, 3)?;
    let (decay, eps, norm) = (
        cx.float("decay_factor", 0.0)?,
        cx.float("epsilon", 0.0)?,
        cx.float("norm_coefficient", 0.0)?,
    );
    // r / (1 + t * decay)
    let d = k(cx, decay)?;
    let td = cx.op("mul", &[t, d])?;
    let one = k(cx, 1.0)?;
    let den = cx.op("add", &[one, td])?;
    let rate = cx.op("div", &[r, den])?;
    let (mut xs, mut hs) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (x, xd) = f64_input(cx, 2 + i)?;
        let (g, _) = f64_input(cx, 2 + n + i)?;
        let (h, hd) = f64_input(cx, 2 + 2 * n + i)?;
        let g = regularized(cx, x, g, norm)?;
        let gg = cx.op("mul", &[g, g])?;
        let h_new = cx.op("add", &[h, gg])?;
        let root = cx.call("sqrt", &[Some(h_new)], &[])?;
        let e = k(cx, eps)?;
        let root = cx.op("add", &[root, e])?;
        let step = cx.op("mul", &[rate, g])?;
        let step = cx.op("div", &[step, root])?;
        let x_new = cx.op("sub", &[x, step])?;
        xs.push(Val::node(cast_to(cx, x_new, xd)?));
        hs.push(Val::node(cast_to(cx, h_new, hd)?));
    }
    xs.extend(hs);
    Ok(xs)
}

pub fn adam(cx: &mut Cx) -> Result<Vec<Val>> {
    let (r, t, n) = common(cx, 4)?;
    let (alpha, beta, eps) = (
        cx.float("alpha", 0.9)?,
        cx.float("beta", 0.999)?,
        cx.float("epsilon", 0.0)?,
    );
    let (norm, post) = (
        cx.float("norm_coefficient", 0.0)?,
        cx.float("norm_coefficient_post", 0.0)?,
    );
    // r * sqrt(1 - beta^t) / (1 - alpha^t) after the first step, r at it
    let one = k(cx, 1.0)?;
    let (a, b) = (k(cx, alpha)?, k(cx, beta)?);
    let bt = cx.op("pow", &[b, t])?;
    let at = cx.op("pow", &[a, t])?;
    let nb = cx.op("sub", &[one, bt])?;
    let nb = cx.call("sqrt", &[Some(nb)], &[])?;
    let na = cx.op("sub", &[one, at])?;
    let adj = cx.op("mul", &[r, nb])?;
    let adj = cx.op("div", &[adj, na])?;
    let zero = k(cx, 0.0)?;
    let started = cx.op("gt", &[t, zero])?;
    let rate = cx.call("where", &[Some(started), Some(adj), Some(r)], &[])?;
    let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (x, _) = f64_input(cx, 2 + i)?;
        let (g, _) = f64_input(cx, 2 + n + i)?;
        let (v, _) = f64_input(cx, 2 + 2 * n + i)?;
        let (h, _) = f64_input(cx, 2 + 3 * n + i)?;
        let g = regularized(cx, x, g, norm)?;
        let (ka, kb) = (k(cx, alpha)?, k(cx, 1.0 - alpha)?);
        let va = cx.op("mul", &[v, ka])?;
        let gb = cx.op("mul", &[g, kb])?;
        let v_new = cx.op("add", &[va, gb])?;
        let (kbeta, k1b) = (k(cx, beta)?, k(cx, 1.0 - beta)?);
        let hb = cx.op("mul", &[h, kbeta])?;
        let gg = cx.op("mul", &[g, g])?;
        let gg = cx.op("mul", &[gg, k1b])?;
        let h_new = cx.op("add", &[hb, gg])?;
        let root = cx.call("sqrt", &[Some(h_new)], &[])?;
        let e = k(cx, eps)?;
        let root = cx.op("add", &[root, e])?;
        let step = cx.op("div", &[v_new, root])?;
        let step = cx.op("mul", &[rate, step])?;
        let x_new = cx.op("sub", &[x, step])?;
        let keep = k(cx, 1.0 - post)?;
        let x_final = cx.op("mul", &[x_new, keep])?;
        // the reference writes every Adam output as float32
        xs.push(Val::node(cast_to(cx, x_final, DType::F32)?));
        vs.push(Val::node(cast_to(cx, v_new, DType::F32)?));
        hs.push(Val::node(cast_to(cx, h_new, DType::F32)?));
    }
    xs.extend(vs);
    xs.extend(hs);
    Ok(xs)
}

pub fn momentum(cx: &mut Cx) -> Result<Vec<Val>> {
    let (r, t, n) = common(cx, 3)?;
    let (alpha, beta, norm) = (
        cx.float("alpha", 0.0)?,
        cx.float("beta", 0.0)?,
        cx.float("norm_coefficient", 0.0)?,
    );
    let nesterov = match cx.string("mode")?.as_deref().unwrap_or("standard") {
        "standard" => false,
        "nesterov" => true,
        other => bail!(Value, "mode '{other}' should be standard or nesterov"),
    };
    // beta after the first step, 1 at it
    let zero = k(cx, 0.0)?;
    let started = cx.op("gt", &[t, zero])?;
    let (b, one) = (k(cx, beta)?, k(cx, 1.0)?);
    let beta_t = cx.call("where", &[Some(started), Some(b), Some(one)], &[])?;
    let (mut xs, mut vs) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (x, xd) = f64_input(cx, 2 + i)?;
        let (g, _) = f64_input(cx, 2 + n + i)?;
        let (v, vd) = f64_input(cx, 2 + 2 * n + i)?;
        let g = regularized(cx, x, g, norm)?;
        let a = k(cx, alpha)?;
        let va = cx.op("mul", &[v, a])?;
        let gb = cx.op("mul", &[g, beta_t])?;
        let v_new = cx.op("add", &[va, gb])?;
        let dir = if nesterov {
            let av = cx.op("mul", &[v_new, a])?;
            cx.op("add", &[g, av])?
        } else {
            v_new
        };
        let step = cx.op("mul", &[r, dir])?;
        let x_new = cx.op("sub", &[x, step])?;
        xs.push(Val::node(cast_to(cx, x_new, xd)?));
        vs.push(Val::node(cast_to(cx, v_new, vd)?));
    }
    xs.extend(vs);
    Ok(xs)
}
