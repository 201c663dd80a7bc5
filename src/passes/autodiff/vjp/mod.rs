//! Vector-Jacobian products: for each op, the gradients of its operands given the gradient
//! `g` of its result, written as new graph nodes. One function per op family. Gradients may
//! come back in the broadcast shape or another float dtype: the caller sums them back to the
//! operand's shape and casts them to its dtype.

mod linalg;
mod nn;
mod pointwise;
mod reduce;
mod views;

use super::graph_builder::Emit;
use crate::ir::collective::ReduceOp as Collective;
use crate::ir::graph::ValueId;
use crate::ir::op::{Op, ReduceOp, UnaryOp};
use crate::ir::shape::{select_index, slice_range, wrap_dim};
use crate::{Result, bail};

use linalg::{einsum, matmul};
use nn::{attention, batch_norm, conv_grads, layer_norm};
use pointwise::{binary, clamp, unary};
use reduce::{reduce, var_std};
use views::{cat, diagonal, repeat};

pub(crate) use nn::{attention_forward, attention_primitives};

/// Per-operand gradients (`None`: no gradient flows to that operand).
pub(crate) type Grads = Vec<Option<ValueId>>;

/// The operand gradients of `y = op(xs)` for the result gradient `g`. `needs[i]` says
/// whether operand `i` wants a gradient (rules skip the work for the others).
pub(crate) fn vjp(
    e: &mut Emit,
    op: &Op,
    xs: &[ValueId],
    y: ValueId,
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    match op {
        Op::Scalar(_) | Op::Constant(_) | Op::Full { .. } | Op::Arange { .. } => Ok(vec![]),
        Op::Control(_) | Op::Result { .. } => Err(crate::Error::Unsupported(format!(
            "{}: control ops are differentiated as a whole by autodiff::control",
            op.name()
        ))),
        Op::ViewDtype { .. } => Err(crate::Error::Unsupported(
            "view(dtype) has no gradient".into(),
        )),
        Op::ScatterReduce { reduce, .. } => Err(crate::Error::Unsupported(format!(
            "scatter_reduce(reduce=\"{}\") has no gradient in smelt yet",
            reduce.name()
        ))),
        Op::Unary(u) => Ok(vec![Some(unary(e, *u, xs[0], y, g)?)]),
        Op::Binary(b) => binary(e, *b, xs[0], xs[1], y, g, needs),
        Op::Where => {
            let z = e.scalar(0.0)?;
            let gx = e.op(Op::Where, &[xs[0], g, z])?;
            let gy = e.op(Op::Where, &[xs[0], z, g])?;
            Ok(vec![None, Some(gx), Some(gy)])
        }
        Op::Clamp { min, max } => clamp(e, *min, *max, xs[0], g),
        Op::To { .. } | Op::Contiguous => Ok(vec![Some(g)]),
        Op::MaskedFill { .. } => {
            let z = e.scalar(0.0)?;
            Ok(vec![Some(e.op(Op::Where, &[xs[1], z, g])?), None])
        }
        Op::Reduce { op, dim, .. } => reduce(e, *op, dim, xs[0], y, g),
        Op::Var {
            dim, correction, ..
        }
        | Op::Std {
            dim, correction, ..
        } => var_std(
            e,
            matches!(op, Op::Std { .. }),
            dim,
            *correction,
            xs[0],
            y,
            g,
        ),
        Op::Cumsum { dim } => {
            let d = wrap_dim(*dim, e.ty(xs[0]).ndim())? as i64;
            let dims = if e.ty(xs[0]).ndim() == 0 {
                vec![]
            } else {
                vec![d]
            };
            let f = e.op(Op::Flip { dims: dims.clone() }, &[g])?;
            let c = e.op(Op::Cumsum { dim: d }, &[f])?;
            Ok(vec![Some(e.op(Op::Flip { dims }, &[c])?)])
        }
        Op::Attention {
            has_mask,
            is_causal,
            scale,
        } => attention(
            e,
            xs,
            *has_mask,
            *is_causal,
            scale.map(|s| s.get()),
            g,
            needs,
        ),
        Op::Softmax { dim } => {
            let gy = e.mul(g, y)?;
            let s = e.op(sum_keep(*dim), &[gy])?;
            let d = e.sub(g, s)?;
            Ok(vec![Some(e.mul(y, d)?)])
        }
        Op::LogSoftmax { dim } => {
            let p = e.unary(UnaryOp::Exp, y)?;
            let s = e.op(sum_keep(*dim), &[g])?;
            let ps = e.mul(p, s)?;
            Ok(vec![Some(e.sub(g, ps)?)])
        }
        Op::LayerNorm {
            normalized_shape,
            eps,
            has_weight,
            has_bias,
        } => layer_norm(
            e,
            normalized_shape.len(),
            *eps,
            *has_weight,
            *has_bias,
            xs,
            g,
        ),
        Op::Matmul => {
            let (ga, gb) = matmul(e, xs[0], xs[1], g, needs[0], needs[1])?;
            Ok(vec![ga, gb])
        }
        Op::Linear { has_bias } if e.ty(xs[0]).ndim() > 2 => {
            // x: [.., in] (a batch of sequences): fold the leading dims into one row count,
            // so each gradient is one GEMM, [N, out] · [out, in] and [out, N] · [N, in].
            let shape = e.shape(xs[0]);
            let (lead, inner) = shape.split_at(shape.len() - 1);
            let rows: usize = lead.iter().product();
            let outs = *e.shape(g).last().unwrap_or(&0);
            let x2 = e.reshape(xs[0], &[rows, inner[0]])?;
            let g2 = e.reshape(g, &[rows, outs])?;
            let gx = if needs[0] {
                let m = e.op(Op::Matmul, &[g2, xs[1]])?;
                Some(e.reshape(m, &shape)?)
            } else {
                None
            };
            let gw = if needs[1] {
                let gt = e.op(Op::T, &[g2])?;
                Some(e.op(Op::Matmul, &[gt, x2])?)
            } else {
                None
            };
            let mut out = vec![gx, gw];
            if *has_bias {
                out.push(Some(g));
            }
            Ok(out)
        }
        Op::Linear { has_bias } => {
            // y = x · wᵀ (+ b): the matmul rule with wᵀ as right operand.
            let wt = e.op(Op::T, &[xs[1]])?;
            let two_d = e.ty(xs[0]).ndim() == 2;
            let (gx, gwt) = matmul(e, xs[0], wt, g, needs[0], needs[1] && !two_d)?;
            let gw = if needs[1] && two_d {
                // gᵀ · x is w's gradient in w's own layout (a GEMM straight into [out, in]
                // rather than a transposed view of (xᵀ · g)).
                let gt = e.op(Op::T, &[g])?;
                Some(e.op(Op::Matmul, &[gt, xs[0]])?)
            } else {
                gwt.map(|v| e.op(Op::T, &[v])).transpose()?
            };
            let mut out = vec![gx, gw];
            if *has_bias {
                out.push(Some(g));
            }
            Ok(out)
        }
        Op::Einsum { equation } => einsum(e, equation, xs, g, needs),
        Op::Reshape { .. }
        | Op::View { .. }
        | Op::Flatten { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. } => {
            let s = e.shape(xs[0]);
            Ok(vec![Some(e.reshape(g, &s)?)])
        }
        Op::Permute { dims } => {
            let n = dims.len();
            let w: Vec<usize> = dims
                .iter()
                .map(|&d| wrap_dim(d, n))
                .collect::<Result<_>>()?;
            let mut inv = vec![0i64; n];
            for (i, &d) in w.iter().enumerate() {
                inv[d] = i as i64;
            }
            Ok(vec![Some(e.op(Op::Permute { dims: inv }, &[g])?)])
        }
        Op::Transpose { .. } | Op::T | Op::Flip { .. } | Op::Tril { .. } | Op::Triu { .. } => {
            Ok(vec![Some(e.op(op.clone(), &[g])?)])
        }
        Op::Expand { .. } => Ok(vec![Some(g)]),
        Op::Narrow { dim, start, .. } => {
            let shape = e.shape(xs[0]);
            let d = wrap_dim(*dim, shape.len())?;
            let s = if *start < 0 {
                (*start + shape[d] as i64) as usize
            } else {
                *start as usize
            };
            Ok(vec![Some(e.place_slice(g, &shape, d, s, 1)?)])
        }
        Op::Select { dim, index } => {
            let shape = e.shape(xs[0]);
            let (d, i) = select_index(&shape, *dim, *index)?;
            let u = e.unsqueeze(g, d as i64)?;
            Ok(vec![Some(e.place_slice(u, &shape, d, i, 1)?)])
        }
        Op::Slice {
            dim,
            start,
            end,
            step,
        } => {
            let shape = e.shape(xs[0]);
            let (d, s, _) = slice_range(&shape, *dim, *start, *end, *step)?;
            Ok(vec![Some(e.place_slice(
                g,
                &shape,
                d,
                s,
                *step as usize,
            )?)])
        }
        Op::Diagonal { offset, dim1, dim2 } => diagonal(e, xs[0], g, *offset, *dim1, *dim2),
        Op::Repeat { repeats } => repeat(e, repeats, xs[0], g),
        Op::Cat { dim } => cat(e, xs, g, *dim),
        Op::Stack { dim } => {
            let d = wrap_dim(*dim, e.ty(xs[0]).ndim() + 1)? as i64;
            (0..xs.len())
                .map(|i| {
                    e.op(
                        Op::Select {
                            dim: d,
                            index: i as i64,
                        },
                        &[g],
                    )
                    .map(Some)
                })
                .collect()
        }
        Op::IndexSelect { dim } => {
            let z = e.zeros_like(xs[0])?;
            let idx = flat_index(e, xs[1])?;
            Ok(vec![
                Some(e.op(Op::IndexAdd { dim: *dim }, &[z, idx, g])?),
                None,
            ])
        }
        Op::Gather { dim } => {
            let z = e.zeros_like(xs[0])?;
            Ok(vec![
                Some(e.op(Op::ScatterAdd { dim: *dim }, &[z, xs[1], g])?),
                None,
            ])
        }
        Op::Scatter { dim } | Op::ScatterAdd { dim } => {
            let gx = if matches!(op, Op::Scatter { .. }) && needs[0] {
                // Overwritten positions get no gradient from the old values.
                let zt = e.ty(xs[1]).shape;
                let z = e.full(&zt, 0.0, e.dtype(g))?;
                Some(e.op(Op::Scatter { dim: *dim }, &[g, xs[1], z])?)
            } else {
                Some(g)
            };
            let gs = if needs[2] {
                let gg = e.op(Op::Gather { dim: *dim }, &[g, xs[1]])?;
                let src = e.shape(xs[2]);
                Some(pad_to(e, gg, &src)?)
            } else {
                None
            };
            Ok(vec![gx, None, gs])
        }
        Op::IndexAdd { dim } => {
            let gs = if needs[2] {
                let idx = flat_index(e, xs[1])?;
                let s = e.op(Op::IndexSelect { dim: *dim }, &[g, idx])?;
                let src = e.shape(xs[2]);
                Some(e.reshape(s, &src)?)
            } else {
                None
            };
            Ok(vec![Some(g), None, gs])
        }
        Op::Embedding => {
            let w = e.ty(xs[1]).shape;
            let z = e.zeros_like(xs[1])?;
            let idx = flat_index(e, xs[0])?;
            let n = e.ty(idx).numel();
            let g2 = e.reshape(g, &[n, w[1]])?;
            Ok(vec![
                None,
                Some(e.op(Op::IndexAdd { dim: 0 }, &[z, idx, g2])?),
            ])
        }
        Op::ArgMax { .. } | Op::ArgMin { .. } => Ok(vec![None]),
        Op::Conv { conv, has_bias } => conv_grads(e, conv, *has_bias, xs, g, needs),
        Op::MaxPool2d { pool } => Ok(vec![Some(
            e.op(Op::MaxPool2dGrad { pool: pool.clone() }, &[g, xs[0]])?,
        )]),
        Op::AvgPool2d {
            pool,
            count_include_pad,
        } => Ok(vec![Some(e.op(
            Op::AvgPool2dGrad {
                pool: pool.clone(),
                count_include_pad: *count_include_pad,
                input_size: e.shape(xs[0]),
            },
            &[g],
        )?)]),
        Op::AdaptiveAvgPool2d { .. } => Ok(vec![Some(e.op(
            Op::AdaptiveAvgPool2dGrad {
                input_size: e.shape(xs[0]),
            },
            &[g],
        )?)]),
        Op::ConvInputGrad { .. }
        | Op::AttentionGrad { .. }
        | Op::ConvWeightGrad { .. }
        | Op::MaxPool2dGrad { .. }
        | Op::AvgPool2dGrad { .. }
        | Op::AdaptiveAvgPool2dGrad { .. } => {
            bail!(
                Unsupported,
                "{}: a second derivative is not supported",
                op.name()
            )
        }
        Op::BatchNorm(bn) => batch_norm(e, bn, xs, g),
        // the same mask, scaled the same way
        Op::Dropout { .. } => Ok(vec![Some(e.op(op.clone(), &[g])?)]),
        // every rank's output depends on every rank's input with weight 1 (or 1/world):
        // the gradient is the same reduction of the output gradients
        Op::AllReduce {
            op: Collective::Sum | Collective::Avg,
        } => Ok(vec![Some(e.op(op.clone(), &[g])?)]),
        Op::AllReduce { op } => bail!(
            Unsupported,
            "all_reduce({}) has no gradient (only sum and avg do)",
            op.name()
        ),
    }
}

fn sum_keep(dim: i64) -> Op {
    Op::Reduce {
        op: ReduceOp::Sum,
        dim: Some(vec![dim]),
        keepdim: true,
    }
}

/// An index as a 1-D vector (what `index_add` takes).
fn flat_index(e: &mut Emit, idx: ValueId) -> Result<ValueId> {
    let n = e.ty(idx).numel();
    e.reshape(idx, &[n])
}

/// Zero-pads `v` at the end of each dim up to `shape`.
fn pad_to(e: &mut Emit, mut v: ValueId, shape: &[usize]) -> Result<ValueId> {
    for d in 0..shape.len() {
        let cur = e.shape(v);
        if cur[d] != shape[d] {
            let mut target = cur.clone();
            target[d] = shape[d];
            v = e.place_slice(v, &target, d, 0, 1)?;
        }
    }
    Ok(v)
}
