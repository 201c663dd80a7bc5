//! Shape and dtype inference of the indexing ops: `index_select`, `gather`, `scatter`, `index_add` and `embedding`.

use super::check_arity;
use crate::ir::dtype::DType;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::wrap_dim;
use crate::{Result, bail};

/// The result type of an indexing op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
    match op {
        Op::IndexSelect { dim } => {
            one(2)?;
            let (x, idx) = (inputs[0], inputs[1]);
            let d = wrap_dim(*dim, x.ndim())?;
            if !is_index_dtype(idx.dtype) {
                bail!(
                    DType,
                    "index_select(): Expected dtype int32/int64 for index but got: {}",
                    idx.dtype.scalar_name()
                );
            }
            if idx.ndim() > 1 {
                bail!(Shape, "index_select(): Index is supposed to be a vector");
            }
            let mut s = x.shape.clone();
            if !s.is_empty() {
                s[d] = idx.numel();
            }
            out(x.dtype, s)
        }
        Op::Gather { dim } => {
            one(2)?;
            let (x, idx) = (inputs[0], inputs[1]);
            let d = wrap_dim(*dim, x.ndim())?;
            check_index_dtype("gather", idx.dtype)?;
            check_same_ndim("gather", x, idx)?;
            for i in 0..idx.ndim() {
                if i != d && idx.shape[i] > x.shape[i] {
                    bail!(
                        Shape,
                        "Size does not match at dimension {i} expected index {:?} to be smaller than self {:?} apart from dimension {d}",
                        idx.shape,
                        x.shape
                    );
                }
            }
            out(x.dtype, idx.shape.clone())
        }
        Op::Scatter { dim } | Op::ScatterAdd { dim } | Op::ScatterReduce { dim, .. } => {
            one(3)?;
            let (x, idx, src) = (inputs[0], inputs[1], inputs[2]);
            let d = wrap_dim(*dim, x.ndim())?;
            check_index_dtype(name, idx.dtype)?;
            if src.dtype != x.dtype {
                bail!(
                    DType,
                    "{name}(): Expected self.dtype to be equal to src.dtype"
                );
            }
            check_same_ndim(name, x, idx)?;
            check_same_ndim(name, src, idx)?;
            for i in 0..idx.ndim() {
                if idx.shape[i] > src.shape[i] || (i != d && idx.shape[i] > x.shape[i]) {
                    bail!(
                        Shape,
                        "Expected index {:?} to be smaller than self {:?} apart from dimension {d} and to be smaller size than src {:?}",
                        idx.shape,
                        x.shape,
                        src.shape
                    );
                }
            }
            out(x.dtype, x.shape.clone())
        }
        Op::IndexAdd { dim } => {
            one(3)?;
            let (x, idx, src) = (inputs[0], inputs[1], inputs[2]);
            let d = wrap_dim(*dim, x.ndim())?;
            if !is_index_dtype(idx.dtype) {
                bail!(DType, "index_add_(): Expected dtype int32/int64 for index");
            }
            if idx.ndim() > 1 {
                bail!(Shape, "index_add_(): Index is supposed to be a vector");
            }
            if src.dtype != x.dtype {
                bail!(
                    DType,
                    "index_add_(): self ({}) and source ({}) must have the same scalar type",
                    x.dtype.scalar_name(),
                    src.dtype.scalar_name()
                );
            }
            let mut expect = x.shape.clone();
            if !expect.is_empty() {
                expect[d] = idx.numel();
            }
            if src.shape != expect && !(x.ndim() == 0 && src.numel() == idx.numel()) {
                bail!(
                    Shape,
                    "index_add_(): source of shape {:?} does not match self of shape {:?} with {} indices along dim {d}",
                    src.shape,
                    x.shape,
                    idx.numel()
                );
            }
            out(x.dtype, x.shape.clone())
        }
        Op::Embedding => {
            one(2)?;
            let (idx, w) = (inputs[0], inputs[1]);
            if !is_index_dtype(idx.dtype) {
                bail!(
                    DType,
                    "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {} instead",
                    idx.dtype.torch_name()
                );
            }
            if w.ndim() != 2 {
                bail!(Shape, "'weight' must be 2-D");
            }
            let mut s = idx.shape.clone();
            s.push(w.shape[1]);
            out(w.dtype, s)
        }
        _ => unreachable!("{name} is not an indexing op"),
    }
}

fn is_index_dtype(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}

fn check_index_dtype(name: &str, d: DType) -> Result<()> {
    if d != DType::I64 {
        bail!(
            DType,
            "{name}(): Expected dtype int64 for index, but got {}",
            d.scalar_name()
        );
    }
    Ok(())
}

fn check_same_ndim(name: &str, a: &TensorType, idx: &TensorType) -> Result<()> {
    if a.ndim() != idx.ndim() && !(a.ndim() <= 1 && idx.ndim() <= 1) {
        bail!(
            Shape,
            "Index tensor must have the same number of dimensions as {} tensor",
            if name == "gather" { "input" } else { "self" }
        );
    }
    Ok(())
}
