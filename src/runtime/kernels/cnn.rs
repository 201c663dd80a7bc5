//! The convolutional family's door: adapts ranks (an unbatched input is a batch of one,
//! `conv1d` runs on 3-D tensors), resolves geometries and calls the convolution and pooling
//! kernels; `batch_norm` and `dropout` are computed here.

use super::{conv, copy, pool, views};
use crate::ir::conv::{BatchNormAttrs, dropout_keep};
use crate::ir::op::{Op, TensorType};
use crate::runtime::tensor::Tensor;
use crate::{Result, bail};

/// `x` with a batch dim of one in front (a view).
fn batched(x: &Tensor) -> Result<Tensor> {
    let mut shape = vec![1];
    shape.extend_from_slice(x.shape());
    views::eval(
        &Op::Unsqueeze { dim: 0 },
        x,
        &TensorType::new(x.dtype(), shape),
    )
}

/// `t` without its batch dim of one (a view).
fn unbatched(t: Tensor) -> Result<Tensor> {
    let shape = t.shape()[1..].to_vec();
    views::eval(
        &Op::Squeeze { dim: Some(vec![0]) },
        &t,
        &TensorType::new(t.dtype(), shape),
    )
}

/// `out` with a batch dim of one in front.
fn batched_type(out: &TensorType) -> TensorType {
    let mut shape = vec![1];
    shape.extend_from_slice(&out.shape);
    TensorType::new(out.dtype, shape)
}

/// Runs `f` on batched operands when `x` (of `rank` dims when batched) lacks its batch dim.
fn with_batch(
    rank: usize,
    x: &Tensor,
    rest: &[&Tensor],
    out: &TensorType,
    f: impl FnOnce(&Tensor, &[Tensor], &TensorType) -> Result<Tensor>,
) -> Result<Tensor> {
    if x.dim() == rank {
        let rest: Vec<Tensor> = rest.iter().map(|t| (*t).clone()).collect();
        return f(x, &rest, out);
    }
    let xb = batched(x)?;
    let rest: Vec<Tensor> = rest.iter().map(|t| batched(t)).collect::<Result<_>>()?;
    unbatched(f(&xb, &rest, &batched_type(out))?)
}

/// Evaluates one op of the family.
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    match op {
        Op::Conv { conv: attrs, .. } => {
            let geo = attrs.geometry(&inputs[1].shape()[2..])?;
            let (w, bias) = (inputs[1], inputs.get(2).copied());
            with_batch(attrs.spatial() + 2, inputs[0], &[], out, |x, _, out| {
                conv::forward(x, w, bias, &geo, out)
            })
        }
        Op::ConvInputGrad { conv: attrs, .. } => {
            let geo = attrs.geometry(&inputs[1].shape()[2..])?;
            conv::backward_input(inputs[0], inputs[1], &geo, out)
        }
        Op::ConvWeightGrad {
            conv: attrs,
            weight_size,
        } => {
            let geo = attrs.geometry(&weight_size[2..])?;
            conv::backward_weight(inputs[0], inputs[1], &geo, out)
        }
        Op::MaxPool2d { pool: attrs } => {
            let geo = attrs.geometry()?;
            with_batch(4, inputs[0], &[], out, |x, _, out| {
                pool::max_pool2d(x, &geo, out)
            })
        }
        Op::MaxPool2dGrad { pool: attrs } => {
            let geo = attrs.geometry()?;
            with_batch(4, inputs[1], &[inputs[0]], out, |x, g, out| {
                pool::max_pool2d_backward(&g[0], x, &geo, out)
            })
        }
        Op::AvgPool2d {
            pool: attrs,
            count_include_pad,
        } => {
            let geo = attrs.geometry()?;
            with_batch(4, inputs[0], &[], out, |x, _, out| {
                pool::avg_pool2d(x, &geo, *count_include_pad, out)
            })
        }
        Op::AvgPool2dGrad {
            pool: attrs,
            count_include_pad,
            ..
        } => {
            let geo = attrs.geometry()?;
            with_batch(4, inputs[0], &[], out, |g, _, out| {
                pool::avg_pool2d_backward(g, &geo, *count_include_pad, out)
            })
        }
        Op::AdaptiveAvgPool2d { .. } => with_batch(4, inputs[0], &[], out, |x, _, out| {
            pool::adaptive_avg_pool2d(x, out)
        }),
        Op::AdaptiveAvgPool2dGrad { .. } => with_batch(4, inputs[0], &[], out, |g, _, out| {
            pool::adaptive_avg_pool2d_backward(g, out)
        }),
        Op::BatchNorm(bn) => batch_norm(bn, inputs),
        Op::Dropout { p, training, seed } => {
            if !*training || p.get() == 0.0 {
                return copy::clone_format(inputs[0]);
            }
            dropout(inputs[0], p.get(), *seed)
        }
        _ => bail!(Value, "{}: not an op of the convolution family", op.name()),
    }
}

/// Values in `x`'s logical order, as a tensor of `x`'s dtype laid out as `x` is when `x` is
/// channels_last (PyTorch keeps the memory format through pointwise and normalisation ops).
fn like(x: &Tensor, values: Vec<f64>) -> Result<Tensor> {
    let t = copy::cast(&Tensor::from_vec(values, x.shape())?, x.dtype())?;
    if x.dim() == 4 && conv::is_channels_last(x.shape(), x.strides()) {
        return copy::to_channels_last(&t);
    }
    Ok(t)
}

/// `batch_norm` in f64: per channel, `(x - mean) / sqrt(var + eps) * w + b` with the batch's
/// biased variance when training, else the running statistics.
fn batch_norm(bn: &BatchNormAttrs, inputs: &[&Tensor]) -> Result<Tensor> {
    let x = inputs[0];
    let [rm, rv, w, b] = bn.positions().map(|p| p.map(|i| inputs[i].to_f64_vec()));
    let shape = x.shape();
    let c = shape[1];
    let inner: usize = shape[2..].iter().product();
    let n = shape[0];
    let xs = x.to_f64_vec();
    let count = (n * inner) as f64;
    let mut ys = vec![0.0; xs.len()];
    for ch in 0..c {
        let at = |i: usize, j: usize| (i * c + ch) * inner + j;
        let (mean, var) = if bn.training {
            let mut s = 0.0;
            for i in 0..n {
                s += (0..inner).map(|j| xs[at(i, j)]).sum::<f64>();
            }
            let mean = s / count;
            let mut q = 0.0;
            for i in 0..n {
                q += (0..inner)
                    .map(|j| (xs[at(i, j)] - mean).powi(2))
                    .sum::<f64>();
            }
            (mean, q / count)
        } else {
            match (&rm, &rv) {
                (Some(m), Some(v)) => (m[ch], v[ch]),
                _ => bail!(
                    Value,
                    "running_mean and running_var must be defined in evaluation mode"
                ),
            }
        };
        let scale = w.as_ref().map_or(1.0, |w| w[ch]) / (var + bn.eps.get()).sqrt();
        let shift = b.as_ref().map_or(0.0, |b| b[ch]);
        for i in 0..n {
            for j in 0..inner {
                ys[at(i, j)] = (xs[at(i, j)] - mean) * scale + shift;
            }
        }
    }
    like(x, ys)
}

/// `dropout` with its counter-based mask: element `i` (in logical order) kept as
/// [`dropout_keep`] says, scaled by `1 / (1 - p)`.
fn dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
    let ys = x
        .to_f64_vec()
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if dropout_keep(seed, i as u64, p) {
                v * scale
            } else {
                0.0
            }
        })
        .collect();
    like(x, ys)
}
