//! The convolutional family's door: adapts ranks (an unbatched input is a batch of one,
//! `conv1d` runs on 3-D tensors), resolves geometries and calls the convolution and pooling
//! kernels; `batch_norm` and `dropout` are computed here.

use super::{conv, copy, pool, views};
use crate::ir::conv::{BatchNormAttrs, dropout_keep};
use crate::ir::op::{Op, TensorType};
use crate::tensor::Tensor;
use crate::tensor::element::Element;
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

/// `batch_norm`: per channel, `(x - mean) · w / sqrt(var + eps) + b`, with the batch's
/// mean and biased variance when training, else the running statistics. `x` is read in its
/// memory order (NCHW, or NHWC for channels_last, whose result is channels_last too);
/// statistics accumulate in f64 (two passes: the mean, then squared deviations), each
/// element is computed in f64 and rounded once. Channels (NCHW) or blocks of pixels (NHWC)
/// run in parallel.
fn batch_norm(bn: &BatchNormAttrs, inputs: &[&Tensor]) -> Result<Tensor> {
    use rayon::prelude::*;
    let x = inputs[0];
    let [rm, rv, w, b] = bn
        .positions()
        .map(|p| p.map(|i| copy::to_f64_vec(inputs[i])));
    let shape = x.shape().to_vec();
    let c = shape[1];
    let n = shape[0];
    let inner: usize = shape[2..].iter().product();
    let nhwc = x.dim() == 4 && !x.is_contiguous() && conv::is_channels_last(&shape, x.strides());
    // the elements in memory order: [N, C, inner] or [N, H, W, C]
    let (dense, dense_shape) = if nhwc {
        let s = [shape[0], shape[2], shape[3], shape[1]];
        let v = views::eval(
            &Op::Permute {
                dims: vec![0, 2, 3, 1],
            },
            x,
            &TensorType::new(x.dtype(), s.to_vec()),
        )?;
        (copy::contiguous(&v)?, s.to_vec())
    } else {
        (copy::contiguous(x)?, shape.clone())
    };
    let count = (n * inner) as f64;
    // the dense buffer as runs of one channel: NCHW planes of `inner` elements (plane `p` is
    // channel `p % c`), or NHWC rows of `c` elements (element `j` of a row is channel `j`)
    let (run, rows_per_task) = if nhwc {
        (c.max(1), (1 << 14) / c.max(1) + 1)
    } else {
        (inner.max(1), 1)
    };
    let channel_sums = |xs: &[f64], f: &(dyn Fn(usize, f64) -> f64 + Sync)| -> Vec<f64> {
        let parts: Vec<Vec<f64>> = xs
            .par_chunks(run * rows_per_task)
            .enumerate()
            .map(|(k, task)| {
                let mut acc = vec![0.0; c];
                for (r, row) in task.chunks(run).enumerate() {
                    if nhwc {
                        for (ch, &v) in row.iter().enumerate() {
                            acc[ch] += f(ch, v);
                        }
                    } else {
                        let ch = (k * rows_per_task + r) % c;
                        acc[ch] += row.iter().map(|&v| f(ch, v)).sum::<f64>();
                    }
                }
                acc
            })
            .collect();
        let mut total = vec![0.0; c];
        for p in parts {
            for (t, v) in total.iter_mut().zip(p) {
                *t += v;
            }
        }
        total
    };
    let stats = |xs: &[f64]| -> Vec<(f64, f64)> {
        let mean: Vec<f64> = channel_sums(xs, &|_, v| v)
            .iter()
            .map(|s| s / count)
            .collect();
        let var = channel_sums(xs, &|ch, v| (v - mean[ch]) * (v - mean[ch]));
        mean.iter().zip(var).map(|(&m, q)| (m, q / count)).collect()
    };
    crate::dispatch_float!(x.dtype(), T => {
        let xs: Vec<f64> = dense.with_slice::<T, _>(|s| s.par_iter().map(|v| v.to_f64()).collect())?;
        let st: Vec<(f64, f64)> = if bn.training {
            stats(&xs)
        } else {
            match (&rm, &rv) {
                (Some(m), Some(v)) => m.iter().copied().zip(v.iter().copied()).collect(),
                _ => bail!(
                    Value,
                    "running_mean and running_var must be defined in evaluation mode"
                ),
            }
        };
        let affine: Vec<(f64, f64, f64)> = (0..c)
            .map(|ch| {
                let scale = w.as_ref().map_or(1.0, |w| w[ch]) / (st[ch].1 + bn.eps.get()).sqrt();
                (st[ch].0, scale, b.as_ref().map_or(0.0, |b| b[ch]))
            })
            .collect();
        let mut ys: Vec<T> = vec![T::from_f64(0.0); xs.len()];
        ys.par_chunks_mut(run)
            .zip(xs.par_chunks(run))
            .enumerate()
            .for_each(|(r, (out, row))| {
                for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                    let (m, s, sh) = affine[if nhwc { j } else { r % c }];
                    *o = T::from_f64((v - m) * s + sh);
                }
            });
        let y = Tensor::from_vec(ys, &dense_shape)?;
        if nhwc {
            views::eval(
                &Op::Permute {
                    dims: vec![0, 3, 1, 2],
                },
                &y,
                &TensorType::new(x.dtype(), shape.clone()),
            )
        } else {
            Ok(y)
        }
    }, else bail!(DType, "\"batch_norm\" not implemented for '{}'", x.dtype().scalar_name()))
}

/// `dropout` with its counter-based mask: element `i` (in logical order) kept as
/// [`dropout_keep`] says, scaled by `1 / (1 - p)`.
fn dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
    let ys = copy::to_f64_vec(x)
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
