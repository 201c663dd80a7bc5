//! Shape and dtype inference of the network layers and their gradients: layer and batch norm, attention, convolution, pooling, dropout.

use super::check_arity;
use crate::ir::op::{Op, TensorType, not_implemented};
use crate::ir::shape::broadcast_shapes;
use crate::{Result, bail};

/// The result type of a network layer op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::LayerNorm {
            normalized_shape,
            has_weight,
            has_bias,
            ..
        } => {
            one(1 + *has_weight as usize + *has_bias as usize)?;
            let x = inputs[0];
            let k = normalized_shape.len();
            if k == 0 || x.ndim() < k || x.shape[x.ndim() - k..] != normalized_shape[..] {
                bail!(
                    Shape,
                    "Given normalized_shape={normalized_shape:?}, expected input with shape [*, {}], but got input of size{:?}",
                    normalized_shape
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    x.shape
                );
            }
            if !x.dtype.is_float() {
                return Err(not_implemented(name, x.dtype));
            }
            for (i, p) in inputs[1..].iter().enumerate() {
                let what = if i == 0 && *has_weight {
                    "weight"
                } else {
                    "bias"
                };
                if p.shape != *normalized_shape {
                    bail!(
                        Shape,
                        "Expected {what} to be of same shape as normalized_shape, but got {what} of shape {:?} and normalized_shape = {normalized_shape:?}",
                        p.shape
                    );
                }
                if p.dtype != x.dtype {
                    bail!(
                        DType,
                        "expected scalar type {} but found {}",
                        x.dtype.scalar_name(),
                        p.dtype.scalar_name()
                    );
                }
            }
            out(x.dtype, x.shape.clone())
        }
        Op::Attention { has_mask, .. } => {
            one(3 + *has_mask as usize)?;
            attention_type(inputs, *has_mask)
        }
        Op::AttentionGrad { has_mask, .. } => {
            one(4 + *has_mask as usize)?;
            let y = attention_type(&inputs[1..], *has_mask)?;
            grad_matches(name, inputs[0], &y)?;
            let n: usize = inputs[1..4].iter().map(|t| t.numel()).sum();
            Ok(TensorType::new(inputs[1].dtype, vec![n]))
        }
        Op::Conv { conv, has_bias } => {
            one(2 + *has_bias as usize)?;
            let bias = has_bias.then(|| inputs[2]);
            crate::ir::conv::conv_type(conv, inputs[0], inputs[1], bias)
        }
        Op::ConvInputGrad { conv, input_size } => {
            one(2)?;
            let x = TensorType::new(inputs[1].dtype, input_size.clone());
            conv_grad_type(op, conv, inputs[0], &x, inputs[1])?;
            Ok(x)
        }
        Op::ConvWeightGrad { conv, weight_size } => {
            one(2)?;
            let w = TensorType::new(inputs[1].dtype, weight_size.clone());
            conv_grad_type(op, conv, inputs[0], inputs[1], &w)?;
            Ok(w)
        }
        Op::MaxPool2d { pool } => {
            one(1)?;
            pool.pool_type(name, inputs[0])
        }
        Op::AvgPool2d { pool, .. } => {
            one(1)?;
            pool.pool_type(name, inputs[0])
        }
        Op::MaxPool2dGrad { pool } => {
            one(2)?;
            let y = pool.pool_type("max_pool2d", inputs[1])?;
            grad_matches(name, inputs[0], &y)?;
            Ok(inputs[1].clone())
        }
        Op::AvgPool2dGrad {
            pool, input_size, ..
        } => {
            one(1)?;
            let x = TensorType::new(inputs[0].dtype, input_size.clone());
            grad_matches(name, inputs[0], &pool.pool_type("avg_pool2d", &x)?)?;
            Ok(x)
        }
        Op::AdaptiveAvgPool2d { output_size } => {
            one(1)?;
            crate::ir::conv::adaptive_pool_type(output_size, inputs[0])
        }
        Op::AdaptiveAvgPool2dGrad { input_size } => {
            one(1)?;
            let g = inputs[0];
            let x = TensorType::new(g.dtype, input_size.clone());
            let nd = g.ndim();
            if nd < 2 {
                bail!(
                    Shape,
                    "{name}: expected a 3-D or 4-D gradient, got {:?}",
                    g.shape
                );
            }
            let size = [g.shape[nd - 2] as i64, g.shape[nd - 1] as i64];
            grad_matches(name, g, &crate::ir::conv::adaptive_pool_type(&size, &x)?)?;
            Ok(x)
        }
        Op::BatchNorm(bn) => {
            let [_, _, w, b] = bn.positions();
            one(1 + 2 * bn.has_running as usize + w.is_some() as usize + b.is_some() as usize)?;
            bn.infer(inputs)
        }
        Op::Dropout { p, .. } => {
            one(1)?;
            crate::ir::conv::check_dropout(p.get())?;
            if !inputs[0].dtype.is_float() {
                return Err(not_implemented(name, inputs[0].dtype));
            }
            Ok(inputs[0].clone())
        }
        _ => unreachable!("{name} is not a network layer op"),
    }
}

/// Checks a convolution gradient's operands: the forward convolution of `x` by `w` has the
/// gradient's type, and both gradient ops take batched operands.
fn conv_grad_type(
    op: &Op,
    conv: &crate::ir::conv::ConvAttrs,
    g: &TensorType,
    x: &TensorType,
    w: &TensorType,
) -> Result<()> {
    if x.ndim() != conv.spatial() + 2 {
        bail!(
            Shape,
            "{}: expected a batched input of {} dims, got {:?}",
            op.name(),
            conv.spatial() + 2,
            x.shape
        );
    }
    let y = crate::ir::conv::conv_type(conv, x, w, None)?;
    grad_matches(op.name(), g, &y)
}

/// A gradient operand must have its forward result's type.
fn grad_matches(name: &str, g: &TensorType, y: &TensorType) -> Result<()> {
    if g.shape != y.shape || g.dtype != y.dtype {
        bail!(
            Shape,
            "{name}: expected a gradient of type {}{:?}, got {}{:?}",
            y.dtype,
            y.shape,
            g.dtype,
            g.shape
        );
    }
    Ok(())
}

/// The result type of attention over q, k, v (and a mask): checks PyTorch's rules.
fn attention_type(inputs: &[&TensorType], has_mask: bool) -> Result<TensorType> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let name = "scaled_dot_product_attention";
    if !q.dtype.is_float() {
        bail!(
            DType,
            "{name}: expected a floating-point query, got {}",
            q.dtype.scalar_name()
        );
    }
    if k.dtype != q.dtype || v.dtype != q.dtype {
        bail!(
            DType,
            "Expected query, key, and value to have the same dtype, but got query.dtype: {} key.dtype: {} and value.dtype: {} instead.",
            q.dtype.scalar_name(),
            k.dtype.scalar_name(),
            v.dtype.scalar_name()
        );
    }
    if q.ndim() < 2 || k.ndim() != q.ndim() || v.ndim() != q.ndim() {
        bail!(
            Shape,
            "{name}: query, key and value must have the same number of dims, at least 2; got {:?}, {:?} and {:?}",
            q.shape,
            k.shape,
            v.shape
        );
    }
    let n = q.ndim();
    let (l, e) = (q.shape[n - 2], q.shape[n - 1]);
    let (s, ek) = (k.shape[n - 2], k.shape[n - 1]);
    if q.shape[..n - 2] != k.shape[..n - 2] || q.shape[..n - 2] != v.shape[..n - 2] {
        bail!(
            Shape,
            "{name}: query, key and value must have the same batch dims; got {:?}, {:?} and {:?}",
            q.shape,
            k.shape,
            v.shape
        );
    }
    if ek != e || v.shape[n - 2] != s {
        bail!(
            Shape,
            "{name}: key must be [.., {s}, {e}] and value [.., {s}, Ev] for a query [.., {l}, {e}]; got key {:?} and value {:?}",
            k.shape,
            v.shape
        );
    }
    if has_mask {
        let m = inputs[3];
        if !m.dtype.is_bool() && m.dtype != q.dtype {
            bail!(
                DType,
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: {} and query.dtype: {} instead.",
                m.dtype.scalar_name(),
                q.dtype.scalar_name()
            );
        }
        let mut scores = q.shape[..n - 2].to_vec();
        scores.extend([l, s]);
        if broadcast_shapes(&m.shape, &scores).ok().as_ref() != Some(&scores) {
            bail!(
                Shape,
                "{name}: attn_mask of shape {:?} does not broadcast to the scores' shape {:?}",
                m.shape,
                scores
            );
        }
    }
    let mut shape = q.shape[..n - 1].to_vec();
    shape.push(v.shape[n - 1]);
    Ok(TensorType::new(q.dtype, shape))
}
