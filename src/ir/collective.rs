//! How the values of the ranks of a process group combine: the reduce ops of
//! `distributed`'s collectives and of the `all_reduce` graph op, defined here so that the
//! IR can name them without importing the distributed floor.

use super::dtype::DType;
use crate::{Result, bail};

/// How the values of the ranks combine (`torch.distributed.ReduceOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// The sum (for bool, logical or, as PyTorch).
    Sum,
    /// The mean over the ranks: the sum divided by the world size (floating dtypes only).
    Avg,
    /// The largest value (for bool, logical or).
    Max,
    /// The smallest value (for bool, logical and).
    Min,
    /// The product (for bool, logical and).
    Product,
}

impl ReduceOp {
    /// Every reduce op.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Product,
    ];

    /// PyTorch's name for it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Product => "product",
        }
    }

    /// The op named `name` (`"sum"`, `"avg"`, `"max"`, `"min"`, `"product"`).
    pub fn parse(name: &str) -> Result<ReduceOp> {
        match ReduceOp::ALL.iter().find(|o| o.name() == name) {
            Some(o) => Ok(*o),
            None => bail!(
                Value,
                "unknown reduce op \"{name}\": expected sum, avg, max, min or product"
            ),
        }
    }

    /// Refuses a reduction PyTorch refuses: averages of integers and bools.
    pub fn check(self, dtype: DType, what: &str) -> Result<()> {
        if self == ReduceOp::Avg && !dtype.is_float() {
            bail!(
                DType,
                "{what}: ReduceOp.AVG needs a floating-point tensor, got {dtype}"
            );
        }
        Ok(())
    }
}
