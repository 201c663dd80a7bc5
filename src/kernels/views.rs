//! Movement ops: new layouts over the same storage. Only `reshape` of an incompatible layout
//! and `repeat` copy.

use super::copy;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::{wrap_dim, wrap_dims};
use crate::tensor::Tensor;
use crate::{Result, bail};

pub fn eval(op: &Op, x: &Tensor, out: &TensorType) -> Result<Tensor> {
    let l = x.layout();
    Ok(match op {
        Op::View { .. } => match l.view(&out.shape) {
            Some(v) => x.with_layout(v),
            None => bail!(
                Shape,
                "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead."
            ),
        },
        Op::Reshape { .. } | Op::Flatten { .. } => match l.view(&out.shape) {
            Some(v) => x.with_layout(v),
            None => {
                let c = copy::contiguous(x)?;
                let v = c.layout().view(&out.shape);
                c.with_layout(v.unwrap_or_else(|| crate::layout::Layout::contiguous(&out.shape)))
            }
        },
        Op::Permute { dims } => x.with_layout(l.permute(&wrap_dims(dims, x.dim())?)),
        Op::Transpose { dim0, dim1 } => {
            x.with_layout(l.transpose(wrap_dim(*dim0, x.dim())?, wrap_dim(*dim1, x.dim())?))
        }
        Op::T => {
            if x.dim() == 2 {
                x.with_layout(l.transpose(0, 1))
            } else {
                x.clone()
            }
        }
        Op::Expand { .. } => x.with_layout(l.expand(&out.shape)),
        Op::Squeeze { dim } => {
            let dims = match dim {
                None => (0..x.dim()).collect(),
                Some(d) => wrap_dims(d, x.dim())?,
            };
            x.with_layout(l.squeeze(&dims))
        }
        Op::Unsqueeze { dim } => x.with_layout(l.unsqueeze(wrap_dim(*dim, x.dim() + 1)?)),
        Op::Narrow { dim, start, length } => x.with_layout(l.narrow(*dim, *start, *length)?),
        Op::Select { dim, index } => x.with_layout(l.select(*dim, *index)?),
        Op::Slice {
            dim,
            start,
            end,
            step,
        } => x.with_layout(l.slice(*dim, *start, *end, *step)?),
        Op::Diagonal { offset, dim1, dim2 } => x.with_layout(l.diagonal(*offset, *dim1, *dim2)?),
        Op::Repeat { repeats } => {
            // x.repeat(r) reads x viewed as [1, s0, 1, s1, ...] expanded to [r0, s0, r1, s1, ...]
            let lead = repeats.len() - x.dim();
            let mut shape = vec![1usize; lead];
            shape.extend_from_slice(x.shape());
            let base = x.with_layout(l.expand(&shape));
            let mut inter = Vec::with_capacity(2 * shape.len());
            let mut inter_target = Vec::with_capacity(2 * shape.len());
            for (i, &s) in shape.iter().enumerate() {
                inter.push(1);
                inter.push(s);
                inter_target.push(repeats[i]);
                inter_target.push(s);
            }
            let v = base.layout().view(&inter).unwrap_or_else(|| {
                // unsqueezing size-1 dims always works as a view
                crate::layout::Layout::contiguous(&inter)
            });
            let wide = base.with_layout(v.expand(&inter_target));
            // always a fresh buffer: repeat never aliases its input, even when it tiles once
            let c = copy::cast_new(&wide, wide.dtype())?;
            c.with_layout(crate::layout::Layout::contiguous(&out.shape))
        }
        _ => unreachable!("views::eval called with {}", op.name()),
    })
}
