//! The graph IR and everything both eager tensors and graphs share: dtypes, shapes, ops.

pub mod dtype;
pub mod einsum;
pub mod op;
pub mod shape;
