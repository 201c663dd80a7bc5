//! Losses: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss`, decomposed into a
//! `gather` of the targets' entries, masks for `ignore_index` and the reduction.

use super::elementwise::cast_to;
use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, bail};

pub fn nll_loss(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let loss = nll(cx, x)?;
    Ok(vec![Val::node(loss)])
}

pub fn softmax_cross_entropy_loss(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    if cx.rank(x) < 2 {
        bail!(
            Value,
            "the input must be [N, C] or [N, C, d1, ...], got {:?}",
            cx.shape(x)
        );
    }
    let log_prob = cx.call("log_softmax", &[Some(x)], &[("dim", Attr::Int(1))])?;
    let loss = nll(cx, log_prob)?;
    Ok(vec![Val::node(loss), Val::node(log_prob)])
}

/// The negative log-likelihood of log-probabilities `x` `[N, C, d..]` at the targets (input 1,
/// `[N, d..]`), weighted by input 2 (`[C]`) when given, then reduced.
fn nll(cx: &mut Cx, x: ValueId) -> Result<ValueId> {
    let t = cx.x(1)?;
    let weight = cx.opt(2)?;
    let (xs, ts) = (cx.shape(x), cx.shape(t));
    if xs.len() < 2 || ts.len() != xs.len() - 1 || ts[0] != xs[0] || ts[1..] != xs[2..] {
        bail!(
            Value,
            "the input must be [N, C, d1, ...] and the target [N, d1, ...], got {xs:?} and {ts:?}"
        );
    }
    if cx.dtype(t).is_float() {
        bail!(Value, "the target must hold integers, got {}", cx.dtype(t));
    }
    let reduction = cx.string("reduction")?.unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        bail!(
            Value,
            "reduction '{reduction}' is not one of none, sum, mean"
        );
    }
    let ignore = match cx.attr("ignore_index") {
        Some(_) => Some(cx.int("ignore_index", 0)?),
        None => None,
    };
    let dt = cx.dtype(x);
    let mut t = cast_to(cx, t, DType::I64)?;
    // ignored targets may lie outside [0, C): gather at 0 instead and mask the result
    let ignored = match ignore {
        Some(i) => {
            let iv = cx.scalar(i as f64, DType::I64)?;
            let m = cx.call("eq", &[Some(t), Some(iv)], &[])?;
            let zero = cx.scalar(0.0, DType::I64)?;
            t = cx.call("where", &[Some(m), Some(zero), Some(t)], &[])?;
            Some(m)
        }
        None => None,
    };
    let ti = cx.call("unsqueeze", &[Some(t)], &[("dim", Attr::Int(1))])?;
    let g = cx.call("gather", &[Some(x), Some(ti)], &[("dim", Attr::Int(1))])?;
    let g = cx.call("squeeze", &[Some(g)], &[("dim", Attr::Int(1))])?;
    let mut loss = cx.call("neg", &[Some(g)], &[])?;
    // the per-element weight: weight[target], 0 where ignored (`None`: all ones)
    let mut w = match weight {
        Some(wt) => {
            let n: usize = ts.iter().product();
            let flat = cx.call("reshape", &[Some(t)], &[("shape", list(&[n as i64]))])?;
            let wg = cx.call(
                "index_select",
                &[Some(wt), Some(flat)],
                &[("dim", Attr::Int(0))],
            )?;
            let dims: Vec<i64> = ts.iter().map(|&d| d as i64).collect();
            Some(cx.call("reshape", &[Some(wg)], &[("shape", list(&dims))])?)
        }
        None => None,
    };
    if let Some(m) = ignored {
        let zero = cx.scalar(0.0, dt)?;
        let keep = match w {
            Some(w) => w,
            None => cx.scalar(1.0, dt)?,
        };
        w = Some(cx.call("where", &[Some(m), Some(zero), Some(keep)], &[])?);
    }
    if let Some(w) = w {
        loss = cx.call("mul", &[Some(loss), Some(w)], &[])?;
    }
    match reduction.as_str() {
        "none" => Ok(loss),
        "sum" => cx.call("sum", &[Some(loss)], &[]),
        _ => match w {
            // the mean over the weights of the targets taken into account (`w` has the
            // target's shape)
            Some(w) => {
                let num = cx.call("sum", &[Some(loss)], &[])?;
                let den = cx.call("sum", &[Some(w)], &[])?;
                cx.call("div", &[Some(num), Some(den)], &[])
            }
            None => cx.call("mean", &[Some(loss)], &[]),
        },
    }
}
