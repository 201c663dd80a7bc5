//! `BinaryOp`, the pointwise ops of two operands: their names, result dtypes, and the
//! integer division rules they share with the run time.

use super::{TensorType, not_implemented};
use crate::ir::dtype::{DType, Scalar, result_type};
use crate::{Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
/// A pointwise op of two broadcast operands.
pub enum BinaryOp {
    /// `torch.add`: `a + b`.
    Add,
    /// `torch.sub`: `a - b` (refused for two bools).
    Sub,
    /// `torch.mul`: `a * b`.
    Mul,
    /// `torch.div`: true division (integers give the default float).
    Div,
    /// `torch.pow`: `a ** b`.
    Pow,
    /// `torch.maximum`: the larger element (NaN propagates).
    Maximum,
    /// `torch.minimum`: the smaller element (NaN propagates).
    Minimum,
    /// `torch.remainder`: Python's `%` (the result has the divisor's sign).
    Remainder,
    /// `torch.div(a, b, rounding_mode="floor")` (`torch.floor_divide`): the quotient
    /// rounded down, in the operands' common dtype (Python's `//`).
    DivFloor,
    /// `torch.div(a, b, rounding_mode="trunc")`: the quotient rounded toward zero, in the
    /// operands' common dtype.
    DivTrunc,
    /// `torch.eq`: `a == b`, as bool.
    Eq,
    /// `torch.ne`: `a != b`, as bool.
    Ne,
    /// `torch.lt`: `a < b`, as bool.
    Lt,
    /// `torch.le`: `a <= b`, as bool.
    Le,
    /// `torch.gt`: `a > b`, as bool.
    Gt,
    /// `torch.ge`: `a >= b`, as bool.
    Ge,
    /// `torch.logical_and`: both nonzero, as bool.
    LogicalAnd,
    /// `torch.logical_or`: either nonzero, as bool.
    LogicalOr,
    /// `torch.bitwise_and` (`&`): integers and bools only.
    BitwiseAnd,
    /// `torch.bitwise_or` (`|`): integers and bools only.
    BitwiseOr,
    /// `torch.bitwise_xor` (`^`): integers and bools only.
    BitwiseXor,
}

pub use smelt_rt::scalar::div_floor_float;

/// Floor division of integers (`div_floor_integer`), wrapping (`MIN // -1` is `MIN`); the
/// caller refuses a zero divisor.
pub fn div_floor_int(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Truncating division of integers (C's `/`), wrapping; the caller refuses a zero divisor.
pub fn div_trunc_int(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_div(b) }
}

/// PyTorch's checks of `alpha` in `add(x, y, alpha=)` and `sub` against the operands'
/// common dtype: a bool `alpha` only for bool results, a float one only for float results.
pub fn check_alpha(alpha: Scalar, common: DType) -> Result<()> {
    if matches!(alpha, Scalar::Bool(_)) && common != DType::Bool {
        bail!(Value, "Boolean alpha only supported for Boolean results.");
    }
    if matches!(alpha, Scalar::Float(_)) && !common.is_float() {
        bail!(
            Value,
            "For integral input tensors, argument alpha must not be a floating point number."
        );
    }
    Ok(())
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: &'static [BinaryOp] = {
        use BinaryOp::*;
        &[
            Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder, DivFloor, DivTrunc, Eq, Ne, Lt,
            Le, Gt, Ge, LogicalAnd, LogicalOr, BitwiseAnd, BitwiseOr, BitwiseXor,
        ]
    };

    /// The op's name in `.smelt` text and messages (`add`); the rounding divisions are
    /// `div` with a `rounding_mode` attribute.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div | DivFloor | DivTrunc => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Remainder => "remainder",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
        }
    }

    /// The `rounding_mode` attribute of a division (`None` for every other op).
    pub fn rounding_mode(self) -> Option<&'static str> {
        match self {
            BinaryOp::DivFloor => Some("floor"),
            BinaryOp::DivTrunc => Some("trunc"),
            _ => None,
        }
    }

    /// Whether the op compares (`eq`, `lt`, ...): its result is bool.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    /// Whether the op is `bitwise_and`, `bitwise_or` or `bitwise_xor`.
    pub fn is_bitwise(self) -> bool {
        use BinaryOp::*;
        matches!(self, BitwiseAnd | BitwiseOr | BitwiseXor)
    }

    /// Whether the op is `logical_and` or `logical_or` (bool result).
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::LogicalAnd | BinaryOp::LogicalOr)
    }

    /// The dtype both operands are converted to before the op runs.
    pub fn compute_dtype(self, a: &TensorType, b: &TensorType) -> Result<DType> {
        use BinaryOp::*;
        let common = result_type(&[a.promote_arg(), b.promote_arg()]);
        Ok(match self {
            Div if !common.is_float() => crate::ir::dtype::DEFAULT_FLOAT,
            Sub if common.is_bool() => bail!(
                DType,
                "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
            ),
            Remainder if common.is_bool() => return Err(not_implemented("remainder", common)),
            DivFloor if common.is_bool() => return Err(not_implemented("div_floor_cpu", common)),
            DivTrunc if common.is_bool() => return Err(not_implemented("div_trunc_cpu", common)),
            Pow if common.is_bool() => DType::I64,
            BitwiseAnd | BitwiseOr | BitwiseXor if common.is_float() => {
                let kernel = format!("{}_cpu", self.name());
                return Err(not_implemented(&kernel, common));
            }
            _ => common,
        })
    }

    /// The result dtype: the compute dtype, or bool for comparisons and logical ops.
    pub fn out_dtype(self, a: &TensorType, b: &TensorType) -> Result<DType> {
        let c = self.compute_dtype(a, b)?;
        Ok(if self.is_comparison() || self.is_logical() {
            DType::Bool
        } else {
            c
        })
    }
}
