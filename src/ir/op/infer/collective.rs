//! Shape and dtype inference of the collective ops.

use super::check_arity;
use crate::Result;
use crate::ir::op::{Op, TensorType};

/// The result type of a collective op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    match op {
        Op::AllReduce { op } => {
            one(1)?;
            op.check(inputs[0].dtype, name)?;
            Ok(inputs[0].clone())
        }
        _ => unreachable!("{name} is not a collective op"),
    }
}
