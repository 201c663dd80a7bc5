//! Vector-Jacobian products: for each op, the gradients of its operands given the gradient
//! `g` of its result, written as new graph nodes. One function per op family. Gradients may
//! come back in the broadcast shape or another float dtype: the caller sums them back to the
//! operand's shape and casts them to its dtype.

use super::emit::Emit;
use crate::ir::collective::ReduceOp as Collective;
use crate::ir::dtype::Scalar;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::ir::shape::{reduction_dims, select_index, slice_range, wrap_dim};
use crate::{Result, bail};

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

/// Attention's gradients: one `AttentionGrad` op whose result holds the three, unless an
/// additive mask wants a gradient too (that gradient is as large as the scores: the
/// primitives below compute it with the others).
fn attention(
    e: &mut Emit,
    xs: &[ValueId],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    let mask_grad = has_mask && !e.dtype(xs[3]).is_bool() && needs.get(3) == Some(&true);
    if mask_grad || !needs[..3].contains(&true) {
        return attention_primitives(e, xs, has_mask, is_causal, scale, g, needs);
    }
    let mut args = vec![g, xs[0], xs[1], xs[2]];
    args.extend(has_mask.then(|| xs[3]));
    let op = Op::AttentionGrad {
        has_mask,
        is_causal,
        scale: scale.map(crate::ir::unary::Real),
    };
    let packed = e.op(op, &args)?;
    let mut out = split_packed(e, packed, &xs[..3])?
        .into_iter()
        .zip(needs)
        .map(|(gx, &n)| n.then_some(gx))
        .collect::<Vec<_>>();
    if has_mask {
        out.push(None);
    }
    Ok(out)
}

/// The gradients packed one after another in the 1-D `packed`, as views of the shapes of
/// `like`.
fn split_packed(e: &mut Emit, packed: ValueId, like: &[ValueId]) -> Result<Vec<ValueId>> {
    let mut start = 0;
    like.iter()
        .map(|&x| {
            let shape = e.shape(x);
            let n: usize = shape.iter().product();
            let part = e.op(
                Op::Narrow {
                    dim: 0,
                    start: start as i64,
                    length: n as i64,
                },
                &[packed],
            )?;
            start += n;
            e.reshape(part, &shape)
        })
        .collect()
}

/// Attention's gradients written with matmul and softmax, the probabilities recomputed (the
/// `[.., L, S]` matrix exists here, unlike in the forward): `dV = Pᵀ g`,
/// `dS = P ∘ (g Vᵀ − rowsum(g Vᵀ ∘ P))`, `dQ = dS K · scale`, `dK = dSᵀ Q · scale`; an
/// additive mask's gradient is `dS`, a bool one has none. Rows every key of which is masked
/// out have zero probabilities, as in the forward. For an additive mask's gradient, and for
/// backends without the fused op.
pub(crate) fn attention_primitives(
    e: &mut Emit,
    xs: &[ValueId],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    let (q, k, v) = (xs[0], xs[1], xs[2]);
    let qs = e.shape(q);
    let n = qs.len();
    let (l, s) = (qs[n - 2], e.shape(k)[n - 2]);
    let scale = scale.unwrap_or(1.0 / (qs[n - 1] as f64).sqrt());
    let kt = e.transpose_last(k)?;
    let qk = e.op(Op::Matmul, &[q, kt])?;
    let mut scores = e.mul_s(qk, scale)?;
    let neg_inf = e.scalar(f64::NEG_INFINITY)?;
    if has_mask {
        let m = xs[3];
        scores = if e.dtype(m).is_bool() {
            e.op(Op::Where, &[m, scores, neg_inf])?
        } else {
            e.add(scores, m)?
        };
    }
    if is_causal {
        let ones = e.full(&[l, s], 1.0, crate::ir::dtype::DType::Bool)?;
        let tril = e.op(Op::Tril { diagonal: 0 }, &[ones])?;
        scores = e.op(Op::Where, &[tril, scores, neg_inf])?;
    }
    let mut p = e.op(Op::Softmax { dim: -1 }, &[scores])?;
    if has_mask {
        // a fully masked row: softmax of -inf everywhere is NaN, the forward gives zeros
        let nan = e.unary(UnaryOp::IsNan, p)?;
        let z = e.scalar(0.0)?;
        p = e.op(Op::Where, &[nan, z, p])?;
    }
    let gv = if needs[2] {
        let pt = e.transpose_last(p)?;
        Some(e.op(Op::Matmul, &[pt, g])?)
    } else {
        None
    };
    let want_ds = needs[0] || needs[1] || (has_mask && needs.get(3).copied().unwrap_or(false));
    if !want_ds {
        return Ok(vec![None, None, gv, None]);
    }
    let vt = e.transpose_last(v)?;
    let dp = e.op(Op::Matmul, &[g, vt])?;
    let dpp = e.mul(dp, p)?;
    let row = e.op(sum_keep(-1), &[dpp])?;
    let centred = e.sub(dp, row)?;
    let ds = e.mul(p, centred)?;
    let dss = e.mul_s(ds, scale)?;
    let gq = if needs[0] {
        Some(e.op(Op::Matmul, &[dss, k])?)
    } else {
        None
    };
    let gk = if needs[1] {
        let dst = e.transpose_last(dss)?;
        Some(e.op(Op::Matmul, &[dst, q])?)
    } else {
        None
    };
    let gm = (has_mask && !e.dtype(xs[3]).is_bool()).then_some(ds);
    let mut out = vec![gq, gk, gv];
    if has_mask {
        out.push(gm);
    }
    Ok(out)
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

fn unary(e: &mut Emit, u: UnaryOp, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
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
        LogicalNot | IsNan => bail!(Value, "{} has no gradient", u.name()),
    }
}

fn binary(
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
        DivFloor | DivTrunc | Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr => {
            vec![None, None]
        }
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

fn clamp(
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

fn reduce(
    e: &mut Emit,
    op: ReduceOp,
    dim: &Option<Vec<i64>>,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<Grads> {
    let shape = e.shape(x);
    let dims = reduction_dims(dim, shape.len())?;
    let count: usize = dims.iter().map(|&d| shape[d]).product();
    let gx = match op {
        ReduceOp::Sum => e.unreduce(g, &shape, &dims)?,
        ReduceOp::Mean => {
            let u = e.unreduce(g, &shape, &dims)?;
            e.mul_s(u, 1.0 / count as f64)?
        }
        ReduceOp::Prod => {
            // Product of the other elements, exact when the slice holds zeros: with one
            // zero only that element gets the product of the rest, with more none does.
            let dt = e.dtype(x);
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let zero = e.bin_s(BinaryOp::Eq, x, 0.0)?;
            let one = e.scalar(1.0)?;
            let nz = e.op(Op::Where, &[zero, one, x])?;
            let pnz = e.reduce(ReduceOp::Prod, nz, &dims, true)?;
            let zm = e.mask(zero, dt)?;
            let cnt = e.sum_dims(zm, &dims, true)?;
            let single = e.bin_s(BinaryOp::Eq, cnt, 1.0)?;
            let at_zero = e.keep_where(single, pnz)?;
            let others = e.div(yk, x)?;
            let w = e.op(Op::Where, &[zero, at_zero, others])?;
            e.mul(gk, w)?
        }
        ReduceOp::Amax | ReduceOp::Amin => {
            // Ties share the gradient evenly.
            let dt = e.dtype(x);
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let hit = e.bin(BinaryOp::Eq, x, yk)?;
            let m = e.mask(hit, dt)?;
            let cnt = e.sum_dims(m, &dims, true)?;
            let w = e.div(m, cnt)?;
            e.mul(gk, w)?
        }
        ReduceOp::LogSumExp => {
            let gk = e.keep(g, &shape, &dims)?;
            let yk = e.keep(y, &shape, &dims)?;
            let d = e.sub(x, yk)?;
            let p = e.unary(UnaryOp::Exp, d)?;
            e.mul(gk, p)?
        }
        ReduceOp::All | ReduceOp::Any => return Ok(vec![None]),
    };
    Ok(vec![Some(gx)])
}

fn var_std(
    e: &mut Emit,
    std: bool,
    dim: &Option<Vec<i64>>,
    correction: f64,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<Grads> {
    let shape = e.shape(x);
    let dims = reduction_dims(dim, shape.len())?;
    let n: usize = dims.iter().map(|&d| shape[d]).product();
    let denom = (n as f64 - correction).max(0.0);
    let gk = e.keep(g, &shape, &dims)?;
    let mean = e.reduce(ReduceOp::Mean, x, &dims, true)?;
    let xc = e.sub(x, mean)?;
    let gx = if std {
        // d std = (x - mean) / (denom · std)
        let yk = e.keep(y, &shape, &dims)?;
        let d = e.mul_s(yk, denom)?;
        let q = e.div(xc, d)?;
        e.mul(gk, q)?
    } else {
        let q = e.mul_s(xc, 2.0 / denom)?;
        e.mul(gk, q)?
    };
    Ok(vec![Some(gx)])
}

fn layer_norm(
    e: &mut Emit,
    k: usize,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
    xs: &[ValueId],
    g: ValueId,
) -> Result<Grads> {
    let x = xs[0];
    let nd = e.ty(x).ndim();
    let dims: Vec<usize> = (nd - k..nd).collect();
    let (xhat, gx) = normalized_grad(e, x, &dims, eps, has_weight.then(|| xs[1]), g)?;
    let mut out = vec![Some(gx)];
    if has_weight {
        out.push(Some(e.mul(g, xhat)?));
    }
    if has_bias {
        out.push(Some(g));
    }
    Ok(out)
}

/// Gradients of a convolution: a transposed convolution for the input, a correlation of the
/// input with the gradient for the weight, and the gradient summed over all but the
/// channels for the bias. An unbatched input is differentiated as a batch of one.
fn conv_grads(
    e: &mut Emit,
    conv: &crate::ir::conv::ConvAttrs,
    has_bias: bool,
    xs: &[ValueId],
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    let unbatched = e.ty(xs[0]).ndim() == conv.spatial() + 1;
    let (x, gb) = if unbatched {
        (e.unsqueeze(xs[0], 0)?, e.unsqueeze(g, 0)?)
    } else {
        (xs[0], g)
    };
    let mut out = vec![None, None];
    if needs[0] {
        let input_size = e.shape(x);
        let gx = e.op(
            Op::ConvInputGrad {
                conv: conv.clone(),
                input_size,
            },
            &[gb, xs[1]],
        )?;
        out[0] = Some(if unbatched { e.squeeze(gx, 0)? } else { gx });
    }
    if needs[1] {
        let weight_size = e.shape(xs[1]);
        out[1] = Some(e.op(
            Op::ConvWeightGrad {
                conv: conv.clone(),
                weight_size,
            },
            &[gb, x],
        )?);
    }
    if has_bias {
        let nd = e.ty(gb).ndim();
        let dims: Vec<usize> = (0..nd).filter(|&d| d != 1).collect();
        out.push(Some(e.sum_dims(gb, &dims, false)?));
    }
    Ok(out)
}

/// The normalisation over `dims` of `x` (`xhat`, with the biased variance plus `eps`) and
/// the gradient of `x` given the result's gradient `g` and the scale `w` (layer norm and
/// training-mode batch norm): `rstd · (gy - mean(gy) - xhat · mean(gy · xhat))`, `gy = g·w`.
fn normalized_grad(
    e: &mut Emit,
    x: ValueId,
    dims: &[usize],
    eps: f64,
    w: Option<ValueId>,
    g: ValueId,
) -> Result<(ValueId, ValueId)> {
    let mu = e.reduce(ReduceOp::Mean, x, dims, true)?;
    let xc = e.sub(x, mu)?;
    let sq = e.mul(xc, xc)?;
    let var = e.reduce(ReduceOp::Mean, sq, dims, true)?;
    let ve = e.add_s(var, eps)?;
    let rstd = e.unary(UnaryOp::Rsqrt, ve)?;
    let xhat = e.mul(xc, rstd)?;
    let gy = match w {
        Some(w) => e.mul(g, w)?,
        None => g,
    };
    let m1 = e.reduce(ReduceOp::Mean, gy, dims, true)?;
    let gyx = e.mul(gy, xhat)?;
    let m2 = e.reduce(ReduceOp::Mean, gyx, dims, true)?;
    let t = e.mul(xhat, m2)?;
    let d0 = e.sub(gy, m1)?;
    let d = e.sub(d0, t)?;
    Ok((xhat, e.mul(rstd, d)?))
}

/// Gradients of `batch_norm`. Training: the layer-norm formula over every dim but the
/// channels; evaluation: a per-channel affine map of `x`. The running statistics get none.
fn batch_norm(
    e: &mut Emit,
    bn: &crate::ir::conv::BatchNormAttrs,
    xs: &[ValueId],
    g: ValueId,
) -> Result<Grads> {
    let x = xs[0];
    let shape = e.shape(x);
    let nd = shape.len();
    let dims = crate::ir::conv::BatchNormAttrs::reduced_dims(nd);
    // a per-channel vector as [C, 1, ..] so it broadcasts against [N, C, ..]
    let mut chan = vec![shape[1]];
    chan.extend(std::iter::repeat_n(1, nd - 2));
    let [rm, rv, w, b] = bn.positions();
    let w = match w {
        Some(i) => Some(e.reshape(xs[i], &chan)?),
        None => None,
    };
    let (xhat, gx) = if bn.training {
        normalized_grad(e, x, &dims, bn.eps.get(), w, g)?
    } else {
        let (Some(rm), Some(rv)) = (rm, rv) else {
            bail!(
                Value,
                "running_mean and running_var must be defined in evaluation mode"
            );
        };
        let mean = e.reshape(xs[rm], &chan)?;
        let var = e.reshape(xs[rv], &chan)?;
        let ve = e.add_s(var, bn.eps.get())?;
        let rstd = e.unary(UnaryOp::Rsqrt, ve)?;
        let xc = e.sub(x, mean)?;
        let xhat = e.mul(xc, rstd)?;
        let scale = match w {
            Some(w) => e.mul(w, rstd)?,
            None => rstd,
        };
        (xhat, e.mul(g, scale)?)
    };
    let mut out = vec![Some(gx)];
    if bn.has_running {
        out.extend([None, None]);
    }
    if bn.has_weight {
        let gw = e.mul(g, xhat)?;
        out.push(Some(e.sum_dims(gw, &dims, false)?));
    }
    if b.is_some() {
        out.push(Some(e.sum_dims(g, &dims, false)?));
    }
    Ok(out)
}

/// Gradients of `matmul(a, b)` for PyTorch's 1-D, 2-D and batched cases.
fn matmul(
    e: &mut Emit,
    a: ValueId,
    b: ValueId,
    g: ValueId,
    na: bool,
    nb: bool,
) -> Result<(Option<ValueId>, Option<ValueId>)> {
    let (ra, rb) = (e.ty(a).ndim(), e.ty(b).ndim());
    let mm = |e: &mut Emit, x, y| e.op(Op::Matmul, &[x, y]);
    let (mut ga, mut gb) = (None, None);
    match (ra, rb) {
        (1, 1) => {
            if na {
                ga = Some(e.mul(g, b)?);
            }
            if nb {
                gb = Some(e.mul(g, a)?);
            }
        }
        (1, _) => {
            let gu = e.unsqueeze(g, -2)?;
            if na {
                let bt = e.transpose_last(b)?;
                let r = mm(e, gu, bt)?;
                ga = Some(e.squeeze(r, -2)?);
            }
            if nb {
                let au = e.unsqueeze(a, -1)?;
                gb = Some(mm(e, au, gu)?);
            }
        }
        (_, 1) => {
            let gu = e.unsqueeze(g, -1)?;
            if na {
                let bu = e.unsqueeze(b, 0)?;
                ga = Some(mm(e, gu, bu)?);
            }
            if nb {
                let at = e.transpose_last(a)?;
                let r = mm(e, at, gu)?;
                gb = Some(e.squeeze(r, -1)?);
            }
        }
        _ => {
            if na {
                let bt = e.transpose_last(b)?;
                ga = Some(mm(e, g, bt)?);
            }
            if nb && rb == 2 {
                // b is shared by a's whole batch (a 3-D activation times a weight): fold the
                // batch into the rows, one [k, rows] · [rows, n] GEMM instead of a batch of
                // products and a sum over it
                let sa = e.shape(a);
                let (rows, k) = (sa[..ra - 1].iter().product::<usize>(), sa[ra - 1]);
                let n = *e.shape(g).last().unwrap_or(&0);
                let a2 = e.reshape(a, &[rows, k])?;
                let g2 = e.reshape(g, &[rows, n])?;
                let at = e.op(Op::T, &[a2])?;
                gb = Some(mm(e, at, g2)?);
            } else if nb {
                let at = e.transpose_last(a)?;
                gb = Some(mm(e, at, g)?);
            }
        }
    }
    Ok((ga, gb))
}

/// Each operand's gradient is another einsum: the result gradient contracted with the other
/// operands onto the operand's subscripts; labels only that operand has are broadcast back.
fn einsum(
    e: &mut Emit,
    equation: &str,
    xs: &[ValueId],
    g: ValueId,
    needs: &[bool],
) -> Result<Grads> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains('.') {
        bail!(
            Value,
            "einsum gradient: equations with '...' are not supported ({equation})"
        );
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), r.to_string()),
        None => {
            // Implicit output: the labels used once, in alphabetical order.
            let mut once: Vec<char> = eq
                .chars()
                .filter(|c| c.is_alphabetic() && eq.matches(*c).count() == 1)
                .collect();
            once.sort_unstable();
            (eq.clone(), once.into_iter().collect())
        }
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    let mut out = Vec::with_capacity(xs.len());
    for (i, term) in terms.iter().enumerate() {
        if !needs.get(i).copied().unwrap_or(false) {
            out.push(None);
            continue;
        }
        let all: Vec<char> = term.chars().collect();
        // A repeated subscript reads a diagonal: differentiate with respect to the diagonal
        // (each label once), then place that gradient back on the diagonal below.
        let mut chars: Vec<char> = Vec::new();
        for &c in &all {
            if !chars.contains(&c) {
                chars.push(c);
            }
        }
        let full_shape = e.shape(xs[i]);
        let shape: Vec<usize> = chars
            .iter()
            .map(|c| full_shape[all.iter().position(|a| a == c).unwrap_or(0)])
            .collect();
        let others: Vec<usize> = (0..terms.len()).filter(|&j| j != i).collect();
        let known = |c: &char| rhs.contains(*c) || others.iter().any(|&j| terms[j].contains(*c));
        let kept: String = chars.iter().filter(|c| known(c)).collect();
        let mut parts = vec![rhs.clone()];
        parts.extend(others.iter().map(|&j| terms[j].to_string()));
        let geq = format!("{}->{kept}", parts.join(","));
        let mut operands = vec![g];
        operands.extend(others.iter().map(|&j| xs[j]));
        let r = e.op(Op::Einsum { equation: geq }, &operands)?;
        let missing: Vec<usize> = (0..chars.len()).filter(|&j| !known(&chars[j])).collect();
        let r = if missing.is_empty() {
            r
        } else {
            e.unreduce(r, &shape, &missing)?
        };
        let r = if chars.len() == all.len() {
            r
        } else {
            onto_diagonal(e, r, &chars, &all, &shape, &eq)?
        };
        out.push(Some(r));
    }
    Ok(out)
}

/// `d` (subscripts `uniq`, each label once) placed on the diagonals of an operand with
/// subscripts `all` (some labels repeated): zero off the diagonals. Each repeat of a label
/// becomes a fresh label tied to the first by an identity matrix, in one einsum.
fn onto_diagonal(
    e: &mut Emit,
    d: ValueId,
    uniq: &[char],
    all: &[char],
    shape: &[usize],
    eq: &str,
) -> Result<ValueId> {
    let mut fresh = ('a'..='z')
        .chain('A'..='Z')
        .filter(|c| !eq.contains(*c))
        .collect::<Vec<char>>()
        .into_iter();
    let mut target = String::new();
    let mut terms = vec![uniq.iter().collect::<String>()];
    let mut operands = vec![d];
    let dtype = e.dtype(d);
    for (j, &c) in all.iter().enumerate() {
        if !all[..j].contains(&c) {
            target.push(c);
            continue;
        }
        let Some(f) = fresh.next() else {
            bail!(
                Value,
                "einsum gradient: too many repeated subscripts ({eq})"
            );
        };
        target.push(f);
        terms.push(format!("{c}{f}"));
        let n = shape[uniq.iter().position(|u| *u == c).unwrap_or(0)];
        operands.push(identity(e, n, dtype)?);
    }
    let equation = format!("{}->{target}", terms.join(","));
    e.op(Op::Einsum { equation }, &operands)
}

/// The `n`×`n` identity matrix of `dtype`: `arange(n)[:, None] == arange(n)`.
fn identity(e: &mut Emit, n: usize, dtype: crate::ir::dtype::DType) -> Result<ValueId> {
    let r = e.op(
        Op::Arange {
            start: Scalar::Int(0),
            end: Scalar::Int(n as i64),
            step: Scalar::Int(1),
            dtype: None,
        },
        &[],
    )?;
    let col = e.unsqueeze(r, 1)?;
    let eye = e.bin(BinaryOp::Eq, col, r)?;
    e.cast(eye, dtype)
}

fn repeat(e: &mut Emit, repeats: &[usize], x: ValueId, g: ValueId) -> Result<Grads> {
    // Split each dim of the result into (repeat, size) and sum over the repeat axes.
    let xs = e.shape(x);
    let lead = repeats.len() - xs.len();
    let mut split = Vec::new();
    let mut sum_axes = Vec::new();
    for (i, &r) in repeats.iter().enumerate() {
        sum_axes.push(split.len());
        split.push(r);
        if i >= lead {
            split.push(xs[i - lead]);
        }
    }
    let r = e.reshape(g, &split)?;
    let s = if sum_axes.is_empty() {
        r
    } else {
        e.sum_dims(r, &sum_axes, false)?
    };
    Ok(vec![Some(e.reshape(s, &xs)?)])
}

fn cat(e: &mut Emit, xs: &[ValueId], g: ValueId, dim: i64) -> Result<Grads> {
    let legacy_empty = |e: &Emit, v: ValueId| {
        let s = e.shape(v);
        s.len() == 1 && s[0] == 0
    };
    let Some(first) = xs.iter().find(|&&v| !legacy_empty(e, v)) else {
        return Ok(vec![None; xs.len()]);
    };
    let d = wrap_dim(dim, e.ty(*first).ndim())?;
    let mut offset = 0usize;
    let mut out = Vec::with_capacity(xs.len());
    for &v in xs {
        if legacy_empty(e, v) {
            out.push(None);
            continue;
        }
        let len = e.shape(v)[d];
        out.push(Some(e.op(
            Op::Narrow {
                dim: d as i64,
                start: offset as i64,
                length: len as i64,
            },
            &[g],
        )?));
        offset += len;
    }
    Ok(out)
}

/// The diagonal's gradient laid back on the (dim1, dim2) plane: the gradient padded to the
/// rows, broadcast along the columns and masked to the cells with `col - row == offset`.
fn diagonal(
    e: &mut Emit,
    x: ValueId,
    g: ValueId,
    offset: i64,
    dim1: i64,
    dim2: i64,
) -> Result<Grads> {
    let shape = e.shape(x);
    let n = shape.len();
    let (a, b) = (wrap_dim(dim1, n)?, wrap_dim(dim2, n)?);
    let (rows, cols) = (shape[a], shape[b]);
    let gl = e.shape(g);
    let last = gl.len() - 1;
    // Diagonal element k sits at row k + max(-offset, 0).
    let row0 = (-offset).max(0) as usize;
    let mut padded_shape = gl.clone();
    padded_shape[last] = rows;
    let padded = e.place_slice(g, &padded_shape, last, row0, 1)?;
    let col = e.unsqueeze(padded, -1)?;
    let mut plane = padded_shape.clone();
    plane.push(cols);
    let wide = e.expand(col, &plane)?;
    let arange = |e: &mut Emit, len: usize| {
        e.op(
            Op::Arange {
                start: Scalar::Int(0),
                end: Scalar::Int(len as i64),
                step: Scalar::Int(1),
                dtype: Some(crate::DType::I64),
            },
            &[],
        )
    };
    let r = arange(e, rows)?;
    let c = arange(e, cols)?;
    let ru = e.unsqueeze(r, 1)?;
    let diff = e.sub(c, ru)?;
    let off = e.g.add_scalar(Scalar::Int(offset))?;
    let on = e.bin(BinaryOp::Eq, diff, off)?;
    let masked = e.keep_where(on, wide)?;
    // Dims are now (the others in order, a, b): move them back to x's order.
    let others: Vec<usize> = (0..n).filter(|&i| i != a && i != b).collect();
    let mut order = others.clone();
    order.push(a);
    order.push(b);
    let mut inv = vec![0i64; n];
    for (pos, &d) in order.iter().enumerate() {
        inv[d] = pos as i64;
    }
    Ok(vec![Some(e.op(Op::Permute { dims: inv }, &[masked])?)])
}
