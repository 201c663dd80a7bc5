//! The graph IR and everything both eager tensors and graphs share: dtypes, shapes, ops.

pub mod attrs;
pub mod collective;
pub mod control;
pub mod conv;
pub mod dtype;
pub mod einsum;
pub mod graph;
pub mod op;
pub mod op_key;
pub mod shape;
pub mod sym;
pub mod text;
pub mod unary;
pub mod verify;

pub use graph::{Graph, Module, Node, NodeKind, ValueId};
pub use text::{SymbolicModule, parse_module, print_graph, print_module};
