//! The `.smelt` text format (docs/ir-format.md): printer and parser.

mod lexer;
mod parser;
mod printer;
mod symbolic;

use super::op::TensorType;

pub use parser::parse_module;
pub(crate) use printer::print_graph_digest;
pub use printer::{print_graph, print_module};
pub use symbolic::SymbolicModule;

/// A type as written in text: `f32[2,3]`, `f32[]` for 0-d.
pub fn fmt_type(t: &TensorType) -> String {
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype.name(), dims.join(","))
}
