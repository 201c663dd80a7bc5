//! Shape and dtype inference of the control ops and the results read out of them.

use super::check_arity;
use crate::ir::op::{Op, TensorType};
use crate::{Result, bail};

/// The result type of a control op.
pub(super) fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let name = op.name();
    let one = |n| check_arity(name, inputs, n);
    match op {
        Op::Control(c) => {
            c.result_types(inputs)?;
            Ok(crate::ir::control::tuple_type())
        }
        Op::Result { ty, .. } => {
            one(1)?;
            if *inputs[0] != crate::ir::control::tuple_type() {
                bail!(Value, "result: the operand is not a control op");
            }
            Ok(ty.clone())
        }
        _ => unreachable!("{name} is not a control op"),
    }
}
