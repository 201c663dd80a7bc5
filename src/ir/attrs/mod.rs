//! Op attributes as they appear in text: `Op::from_call` builds an op from its name, its
//! positional operand slots and `name=value` attributes (PyTorch's defaults fill the rest);
//! `Op::attrs` lists an op's attributes back.

mod args;
mod from_call;
mod listing;

use super::dtype::DType;
use super::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use std::fmt;

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// A string (an einsum equation).
    Str(String),
    /// A dtype (`f32`).
    DType(DType),
    /// A list of attributes (sizes, dims).
    List(Vec<Attr>),
    /// Python's `None`: an optional attribute left out.
    None,
    /// `@name`: a graph of the same file (a control op's body).
    Graph(String),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Float(x) => super::dtype::fmt_float(*x, f),
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Str(s) => write!(f, "\"{}\"", escape(s)),
            Attr::DType(d) => f.write_str(d.name()),
            Attr::None => f.write_str("none"),
            Attr::Graph(g) => write!(f, "@{g}"),
            Attr::List(xs) => {
                f.write_str("[")?;
                for (i, x) in xs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Escapes `"` and `\` and control characters for a string literal.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

impl Attr {
    fn kind(&self) -> &'static str {
        match self {
            Attr::Int(_) => "an int",
            Attr::Float(_) => "a float",
            Attr::Bool(_) => "a bool",
            Attr::Str(_) => "a string",
            Attr::DType(_) => "a dtype",
            Attr::List(_) => "a list",
            Attr::None => "none",
            Attr::Graph(_) => "a graph",
        }
    }
}

/// An error from `from_call`: the attribute it concerns (if one) and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct CallError {
    /// The attribute's name, if the error concerns one.
    pub attr: Option<String>,
    /// The message.
    pub msg: String,
}

type CallResult<T> = std::result::Result<T, CallError>;

fn err<T>(attr: Option<&str>, msg: String) -> CallResult<T> {
    Err(CallError {
        attr: attr.map(str::to_string),
        msg,
    })
}

fn binary_from_name(name: &str) -> Option<BinaryOp> {
    BinaryOp::ALL.iter().copied().find(|b| b.name() == name)
}

fn reduce_from_name(name: &str) -> Option<ReduceOp> {
    ReduceOp::ALL.iter().copied().find(|r| r.name() == name)
}

/// The ops other than the unary, binary and reduction families, by name (aliases `zeros`
/// and `ones` included).
const STRUCTURAL_OPS: &[&str] = &[
    "scalar",
    "constant",
    "full",
    "zeros",
    "ones",
    "arange",
    "where",
    "clamp",
    "to",
    "masked_fill",
    "argmax",
    "argmin",
    "var",
    "std",
    "cumsum",
    "softmax",
    "log_softmax",
    "layer_norm",
    "matmul",
    "linear",
    "einsum",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "reshape",
    "view",
    "permute",
    "transpose",
    "t",
    "expand",
    "squeeze",
    "unsqueeze",
    "flatten",
    "narrow",
    "select",
    "slice",
    "diagonal",
    "contiguous",
    "repeat",
    "cat",
    "stack",
    "flip",
    "tril",
    "triu",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_add",
    "embedding",
    "conv1d",
    "conv2d",
    "convolution_backward_input",
    "convolution_backward_weight",
    "max_pool2d",
    "max_pool2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool2d_backward",
    "batch_norm",
    "dropout",
    "all_reduce",
];

/// Every op name the text format knows: the structural ops and each family's table.
pub fn op_names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = STRUCTURAL_OPS.to_vec();
    v.extend(UnaryOp::ALL.iter().map(|u| u.name()));
    v.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    v.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    v
}

/// Operand positions that may be `none`.
fn optional_positions(op: &Op) -> &'static [usize] {
    match op {
        Op::Linear { .. } => &[2],
        Op::LayerNorm { .. } => &[1, 2],
        Op::Attention { .. } => &[3],
        Op::AttentionGrad { .. } => &[4],
        Op::Conv { .. } => &[2],
        Op::BatchNorm(_) => &[1, 2, 3, 4],
        _ => &[],
    }
}

/// The op's operand slots when some may be `none`: `true` for a present tensor.
fn optional_slots(op: &Op) -> Option<Vec<bool>> {
    match op {
        Op::Linear { has_bias } => Some(vec![true, true, *has_bias]),
        Op::Attention { has_mask, .. } => Some(vec![true, true, true, *has_mask]),
        Op::AttentionGrad { has_mask, .. } => Some(vec![true, true, true, true, *has_mask]),
        Op::Conv { has_bias, .. } => Some(vec![true, true, *has_bias]),
        Op::BatchNorm(bn) => Some(vec![
            true,
            bn.has_running,
            bn.has_running,
            bn.has_weight,
            bn.has_bias,
        ]),
        Op::LayerNorm {
            has_weight,
            has_bias,
            ..
        } => Some(vec![true, *has_weight, *has_bias]),
        _ => None,
    }
}
