//! `Det`: LU elimination with partial pivoting, unrolled over the matrix size known at
//! import and computed in f64, as LAPACK's `getrf` (NumPy's `det`) orders it.

use super::list;
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::onnx::import::{Cx, Val};
use crate::{DType, Result, Tensor, bail};

/// The largest matrix side `Det` unrolls (the graph grows with the square of it).
const MAX_SIDE: usize = 64;

pub fn det(cx: &mut Cx) -> Result<Vec<Val>> {
    let x = cx.x(0)?;
    let shape = cx.shape(x);
    let dt = cx.dtype(x);
    if !dt.is_float() {
        bail!(DType, "Det of {dt}");
    }
    let r = shape.len();
    if r < 2 || shape[r - 1] != shape[r - 2] {
        bail!(
            Value,
            "Det needs square matrices in the last two axes, got {shape:?}"
        );
    }
    let n = shape[r - 1];
    if n > MAX_SIDE {
        bail!(
            Unsupported,
            "Det of {n}x{n} matrices (smelt unrolls up to {MAX_SIDE})"
        );
    }
    let batch: Vec<i64> = shape[..r - 2].iter().map(|&d| d as i64).collect();
    if n == 0 {
        // the empty product
        let attrs = [
            ("size", list(&batch)),
            ("fill_value", Attr::Float(1.0)),
            ("dtype", Attr::DType(dt)),
        ];
        return Ok(vec![Val::node(cx.call("full", &[], &attrs)?)]);
    }
    let mut a = super::elementwise::cast_to(cx, x, DType::F64)?;
    // row numbers as a column, for the masks and the row swap
    let rows = cx.tensor(&Tensor::from_vec(
        (0..n as i64).collect::<Vec<_>>(),
        &[n, 1],
    )?)?;
    let mut sign: Option<ValueId> = None;
    for k in 0..n {
        let narrow = |cx: &mut Cx, v: ValueId, dim: i64, start: usize| {
            let attrs = [
                ("dim", Attr::Int(dim)),
                ("start", Attr::Int(start as i64)),
                ("length", Attr::Int(1)),
            ];
            cx.call("narrow", &[Some(v)], &attrs)
        };
        // the pivot: the largest magnitude in column k at or below row k
        let col = narrow(cx, a, -1, k)?;
        let mag = cx.call("abs", &[Some(col)], &[])?;
        let above = cx.with_scalar("lt", rows, k as f64)?;
        let minus = cx.scalar(-1.0, DType::F64)?;
        let mag = cx.call("where", &[Some(above), Some(minus), Some(mag)], &[])?;
        let keep = [("dim", Attr::Int(-2)), ("keepdim", Attr::Bool(true))];
        let p = cx.call("argmax", &[Some(mag)], &keep)?;
        // swap rows k and p
        let is_k = cx.with_scalar("eq", rows, k as f64)?;
        let is_p = cx.call("eq", &[Some(rows), Some(p)], &[])?;
        let kk = cx.scalar(k as f64, DType::I64)?;
        let from = cx.call("where", &[Some(is_p), Some(kk), Some(rows)], &[])?;
        let from = cx.call("where", &[Some(is_k), Some(p), Some(from)], &[])?;
        let mut size = batch.clone();
        size.extend([n as i64, n as i64]);
        let from = cx.call("expand", &[Some(from)], &[("size", list(&size))])?;
        a = cx.call("gather", &[Some(a), Some(from)], &[("dim", Attr::Int(-2))])?;
        // each swap flips the sign
        let same = cx.with_scalar("eq", p, k as f64)?;
        let (one, neg) = (cx.scalar(1.0, DType::F64)?, cx.scalar(-1.0, DType::F64)?);
        let s = cx.call("where", &[Some(same), Some(one), Some(neg)], &[])?;
        sign = Some(match sign {
            Some(t) => cx.call("mul", &[Some(t), Some(s)], &[])?,
            None => s,
        });
        // eliminate below the pivot (a zero pivot leaves its column: the product is 0)
        let row_k = narrow(cx, a, -2, k)?;
        let pivot = narrow(cx, row_k, -1, k)?;
        let col = narrow(cx, a, -1, k)?;
        let q = cx.call("div", &[Some(col), Some(pivot)], &[])?;
        let below = cx.with_scalar("gt", rows, k as f64)?;
        let zero_pivot = cx.with_scalar("eq", pivot, 0.0)?;
        let zero = cx.scalar(0.0, DType::F64)?;
        let f = cx.call("where", &[Some(below), Some(q), Some(zero)], &[])?;
        let f = cx.call("where", &[Some(zero_pivot), Some(zero), Some(f)], &[])?;
        let update = cx.call("mul", &[Some(f), Some(row_k)], &[])?;
        a = cx.call("sub", &[Some(a), Some(update)], &[])?;
    }
    let diag = cx.call(
        "diagonal",
        &[Some(a)],
        &[("dim1", Attr::Int(-2)), ("dim2", Attr::Int(-1))],
    )?;
    let prod = cx.call(
        "prod",
        &[Some(diag)],
        &[("dim", Attr::Int(-1)), ("keepdim", Attr::Bool(false))],
    )?;
    let sign = sign.expect("n >= 1");
    let sign = cx.call("reshape", &[Some(sign)], &[("shape", list(&batch))])?;
    let det = cx.call("mul", &[Some(prod), Some(sign)], &[])?;
    Ok(vec![Val::node(super::elementwise::cast_to(cx, det, dt)?)])
}
