//! The gradients of the network layers: attention, layer and batch norm, convolution.

use super::{Grads, sum_keep};
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::passes::autodiff::graph_builder::Emit;
use crate::{Result, bail};

/// Attention's gradients: one `AttentionGrad` op whose result holds the three, unless an
/// additive mask wants a gradient too (that gradient is as large as the scores: the
/// primitives below compute it with the others).
pub(super) fn attention(
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

/// Attention's probabilities `softmax(q kᵀ · scale + mask)`: a bool mask and the causal
/// mask (`j <= i`, from positions, so that it fuses) set the masked scores to -inf, and a
/// row whose every key is masked out has zero probabilities, as the fused kernel gives.
/// Returns them with the scale used (`1/√E` by default).
fn attention_probs(
    e: &mut Emit,
    xs: &[ValueId],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<(ValueId, f64)> {
    let (q, k) = (xs[0], xs[1]);
    let qs = e.shape(q);
    let n = qs.len();
    let (l, s) = (qs[n - 2], e.shape(k)[n - 2]);
    let scale = scale.unwrap_or(1.0 / (qs[n - 1] as f64).sqrt());
    let kt = e.transpose_last(k)?;
    let qk = e.op(Op::Matmul, &[q, kt])?;
    // with no head dim every score is an empty sum, 0, whatever the scale (whose default,
    // 1/sqrt(0), is infinite): PyTorch scales q and k, which are empty, not the scores
    let mut scores = match qs[n - 1] {
        0 => qk,
        _ => e.mul_s(qk, scale)?,
    };
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
        let rows = positions(e, l)?;
        let rows = e.unsqueeze(rows, 1)?;
        let cols = positions(e, s)?;
        let keep = e.bin(BinaryOp::Le, cols, rows)?;
        scores = e.op(Op::Where, &[keep, scores, neg_inf])?;
    }
    let mut p = e.op(Op::Softmax { dim: -1 }, &[scores])?;
    if has_mask {
        // a fully masked row: softmax of -inf everywhere is NaN, the forward gives zeros
        let nan = e.unary(UnaryOp::IsNan, p)?;
        let z = e.scalar(0.0)?;
        p = e.op(Op::Where, &[nan, z, p])?;
    }
    Ok((p, scale))
}

/// `arange(n)` as int64.
fn positions(e: &mut Emit, n: usize) -> Result<ValueId> {
    e.op(
        Op::Arange {
            start: Scalar::Int(0),
            end: Scalar::Int(n as i64),
            step: Scalar::Int(1),
            dtype: Some(DType::I64),
        },
        &[],
    )
}

/// Attention written with matmul and softmax, `P v` (the `[.., L, S]` probabilities
/// materialised), for code without the fused kernel: half-precision operands compute in
/// f32 and round once, as the fused kernel does.
pub(crate) fn attention_forward(
    e: &mut Emit,
    xs: &[ValueId],
    has_mask: bool,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<ValueId> {
    let dtype = e.dtype(xs[0]);
    let wide = matches!(dtype, DType::F16 | DType::BF16);
    let mut args = xs.to_vec();
    if wide {
        for x in args.iter_mut().take(3) {
            *x = e.cast(*x, DType::F32)?;
        }
        if has_mask && !e.dtype(args[3]).is_bool() {
            args[3] = e.cast(args[3], DType::F32)?;
        }
    }
    let (p, _) = attention_probs(e, &args, has_mask, is_causal, scale)?;
    let out = e.op(Op::Matmul, &[p, args[2]])?;
    e.cast(out, dtype)
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
    let (p, scale) = attention_probs(e, xs, has_mask, is_causal, scale)?;
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

pub(super) fn layer_norm(
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
pub(super) fn conv_grads(
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
pub(super) fn batch_norm(
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
