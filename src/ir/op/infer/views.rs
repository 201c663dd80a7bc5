//! Shape and dtype inference of the ops that rearrange elements: views, `repeat`, `cat`, `stack`, `flip`, `tril`.

use super::check_arity;
use crate::ir::dtype::result_type;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::{
    Shape, diagonal_shape, expand_shape, flatten_shape, infer_size, narrow_range, permute_shape,
    select_index, slice_range, wrap_dim, wrap_dims,
};
use crate::{Error, Result, bail};

/// The result type of a view or layout op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::Reshape { shape } | Op::View { shape } => {
            one(1)?;
            let x = inputs[0];
            out(x.dtype, infer_size(shape, x.numel())?)
        }
        Op::Permute { dims } => {
            one(1)?;
            let x = inputs[0];
            out(x.dtype, permute_shape(&x.shape, dims)?)
        }
        Op::Transpose { dim0, dim1 } => {
            one(1)?;
            let x = inputs[0];
            let (a, b) = (wrap_dim(*dim0, x.ndim())?, wrap_dim(*dim1, x.ndim())?);
            let mut s = x.shape.clone();
            if !s.is_empty() {
                s.swap(a, b);
            }
            out(x.dtype, s)
        }
        Op::T => {
            one(1)?;
            let x = inputs[0];
            if x.ndim() > 2 {
                bail!(
                    Shape,
                    "t() expects a tensor with <= 2 dimensions, but self is {}D",
                    x.ndim()
                );
            }
            out(x.dtype, x.shape.iter().rev().copied().collect::<Shape>())
        }
        Op::Expand { size } => {
            one(1)?;
            let x = inputs[0];
            out(x.dtype, expand_shape(&x.shape, size)?)
        }
        Op::Squeeze { dim } => {
            one(1)?;
            let x = inputs[0];
            let dims = match dim {
                None => (0..x.ndim()).collect(),
                Some(d) => wrap_dims(d, x.ndim())?,
            };
            let s: Shape = x
                .shape
                .iter()
                .enumerate()
                .filter(|&(i, &n)| !(n == 1 && dims.contains(&i)))
                .map(|(_, &n)| n)
                .collect();
            out(x.dtype, s)
        }
        Op::Unsqueeze { dim } => {
            one(1)?;
            let x = inputs[0];
            let d = wrap_dim(*dim, x.ndim() + 1)?;
            let mut s = x.shape.clone();
            s.insert(d, 1);
            out(x.dtype, s)
        }
        Op::Flatten { start_dim, end_dim } => {
            one(1)?;
            let x = inputs[0];
            out(x.dtype, flatten_shape(&x.shape, *start_dim, *end_dim)?)
        }
        Op::Narrow { dim, start, length } => {
            one(1)?;
            let x = inputs[0];
            let (d, _) = narrow_range(&x.shape, *dim, *start, *length)?;
            let mut s = x.shape.clone();
            s[d] = *length as usize;
            out(x.dtype, s)
        }
        Op::Select { dim, index } => {
            one(1)?;
            let x = inputs[0];
            let (d, _) = select_index(&x.shape, *dim, *index)?;
            let mut s = x.shape.clone();
            s.remove(d);
            out(x.dtype, s)
        }
        Op::Slice {
            dim,
            start,
            end,
            step,
        } => {
            one(1)?;
            let x = inputs[0];
            let (d, _, len) = slice_range(&x.shape, *dim, *start, *end, *step)?;
            let mut s = x.shape.clone();
            s[d] = len;
            out(x.dtype, s)
        }
        Op::Diagonal { offset, dim1, dim2 } => {
            one(1)?;
            let x = inputs[0];
            out(x.dtype, diagonal_shape(&x.shape, *offset, *dim1, *dim2)?)
        }
        Op::Contiguous => {
            one(1)?;
            out(inputs[0].dtype, inputs[0].shape.clone())
        }
        Op::Repeat { repeats } => {
            one(1)?;
            let x = inputs[0];
            if repeats.len() < x.ndim() {
                bail!(
                    Shape,
                    "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
                );
            }
            let lead = repeats.len() - x.ndim();
            let s: Shape = repeats
                .iter()
                .enumerate()
                .map(|(i, &r)| if i < lead { r } else { r * x.shape[i - lead] })
                .collect();
            out(x.dtype, s)
        }
        Op::Cat { dim } => cat_type(inputs, *dim),
        Op::Stack { dim } => {
            let first = inputs
                .first()
                .ok_or_else(|| Error::Value("stack expects a non-empty TensorList".into()))?;
            for (i, t) in inputs.iter().enumerate() {
                if t.shape != first.shape {
                    bail!(
                        Shape,
                        "stack expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {i}",
                        first.shape,
                        t.shape
                    );
                }
            }
            let d = wrap_dim(*dim, first.ndim() + 1)?;
            let mut s = first.shape.clone();
            s.insert(d, inputs.len());
            let dtype = result_type(&inputs.iter().map(|t| t.promote_arg()).collect::<Vec<_>>());
            out(dtype, s)
        }
        Op::Flip { dims } => {
            one(1)?;
            wrap_dims(dims, inputs[0].ndim())?;
            out(inputs[0].dtype, inputs[0].shape.clone())
        }
        Op::Tril { .. } | Op::Triu { .. } => {
            one(1)?;
            let x = inputs[0];
            if x.ndim() < 2 {
                bail!(
                    Shape,
                    "{name}: input tensor must have at least 2 dimensions"
                );
            }
            out(x.dtype, x.shape.clone())
        }
        _ => unreachable!("{name} is not a view or layout op"),
    }
}

fn cat_type(inputs: &[&TensorType], dim: i64) -> Result<TensorType> {
    if inputs.is_empty() {
        bail!(Value, "torch.cat(): expected a non-empty list of Tensors");
    }
    // PyTorch skips legacy empty 1-D tensors of shape [0].
    let parts: Vec<(usize, &&TensorType)> = inputs
        .iter()
        .enumerate()
        .filter(|(_, t)| !(t.ndim() == 1 && t.shape[0] == 0))
        .collect();
    let dtype = result_type(&inputs.iter().map(|t| t.promote_arg()).collect::<Vec<_>>());
    let Some((_, first)) = parts.first() else {
        return Ok(TensorType::new(dtype, vec![0]));
    };
    if first.ndim() == 0 {
        bail!(
            Shape,
            "zero-dimensional tensor (at position 0) cannot be concatenated"
        );
    }
    let d = wrap_dim(dim, first.ndim())?;
    let mut shape = first.shape.clone();
    shape[d] = 0;
    for &(i, t) in &parts {
        if t.ndim() != first.ndim() {
            bail!(
                Shape,
                "Tensors must have same number of dimensions: got {} and {}",
                first.ndim(),
                t.ndim()
            );
        }
        for j in 0..t.ndim() {
            if j != d && t.shape[j] != first.shape[j] {
                bail!(
                    Shape,
                    "Sizes of tensors must match except in dimension {d}. Expected size {} but got size {} for tensor number {i} in the list.",
                    first.shape[j],
                    t.shape[j]
                );
            }
        }
        shape[d] += t.shape[d];
    }
    Ok(TensorType::new(dtype, shape))
}
