//! Op attributes as they appear in text: `Op::from_call` builds an op from its name, its
//! positional operand slots and `name=value` attributes (PyTorch's defaults fill the rest);
//! `Op::attrs` lists an op's attributes back.

use super::conv::{BatchNormAttrs, ConvAttrs, ConvPadding, PoolAttrs};
use super::dtype::{DType, Scalar};
use super::op::{BinaryOp, Literal, Op, ReduceOp, UnaryOp};
use super::unary::Real;
use crate::{Error, Result};
use std::fmt;
use std::sync::Arc;

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

fn ints(xs: &[i64]) -> Attr {
    Attr::List(xs.iter().map(|&x| Attr::Int(x)).collect())
}

fn usizes(xs: &[usize]) -> Attr {
    Attr::List(xs.iter().map(|&x| Attr::Int(x as i64)).collect())
}

fn scalar(s: Scalar) -> Attr {
    match s {
        Scalar::Bool(b) => Attr::Bool(b),
        Scalar::Int(i) => Attr::Int(i),
        Scalar::Float(x) => Attr::Float(x),
    }
}

fn opt<T>(v: &Option<T>, f: impl Fn(&T) -> Attr) -> Attr {
    v.as_ref().map_or(Attr::None, f)
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

/// The attributes of one call, consumed as the op's constructor reads them.
struct Args<'a> {
    op: &'a str,
    attrs: Vec<(&'a str, &'a Attr)>,
}

impl<'a> Args<'a> {
    fn take(&mut self, name: &str) -> Option<&'a Attr> {
        let i = self.attrs.iter().position(|(n, _)| *n == name)?;
        Some(self.attrs.remove(i).1)
    }

    fn bad<T>(&self, name: &str, want: &str, got: &Attr) -> CallResult<T> {
        err(
            Some(name),
            format!(
                "attribute '{name}' of '{}' expects {want}, got {} ({got})",
                self.op,
                got.kind()
            ),
        )
    }

    fn missing<T>(&self, name: &str) -> CallResult<T> {
        err(
            None,
            format!("'{}' requires the attribute '{name}'", self.op),
        )
    }

    fn int_of(&self, name: &str, a: &Attr) -> CallResult<i64> {
        match a {
            Attr::Int(i) => Ok(*i),
            Attr::Bool(b) => Ok(*b as i64),
            _ => self.bad(name, "an int", a),
        }
    }

    fn int(&mut self, name: &str, default: Option<i64>) -> CallResult<i64> {
        match (self.take(name), default) {
            (Some(a), _) => self.int_of(name, a),
            (None, Some(d)) => Ok(d),
            (None, None) => self.missing(name),
        }
    }

    fn opt_int(&mut self, name: &str) -> CallResult<Option<i64>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(a) => self.int_of(name, a).map(Some),
        }
    }

    fn float(&mut self, name: &str, default: f64) -> CallResult<f64> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Float(x)) => Ok(*x),
            Some(Attr::Int(i)) => Ok(*i as f64),
            Some(a) => self.bad(name, "a number", a),
        }
    }

    fn opt_float(&mut self, name: &str) -> CallResult<Option<f64>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Float(x)) => Ok(Some(*x)),
            Some(Attr::Int(i)) => Ok(Some(*i as f64)),
            Some(a) => self.bad(name, "a number or none", a),
        }
    }

    fn bool(&mut self, name: &str, default: bool) -> CallResult<bool> {
        match self.take(name) {
            None => Ok(default),
            Some(Attr::Bool(b)) => Ok(*b),
            Some(a) => self.bad(name, "true or false", a),
        }
    }

    fn string(&mut self, name: &str, default: Option<&str>) -> CallResult<String> {
        match (self.take(name), default) {
            (Some(Attr::Str(s)), _) => Ok(s.clone()),
            (Some(a), _) => self.bad(name, "a string", a),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => self.missing(name),
        }
    }

    fn opt_dtype(&mut self, name: &str) -> CallResult<Option<DType>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::DType(d)) => Ok(Some(*d)),
            Some(a) => self.bad(name, "a dtype", a),
        }
    }

    fn dtype(&mut self, name: &str) -> CallResult<DType> {
        match self.opt_dtype(name)? {
            Some(d) => Ok(d),
            None => self.missing(name),
        }
    }

    fn int_list_of(&self, name: &str, a: &Attr) -> CallResult<Vec<i64>> {
        match a {
            Attr::List(xs) => xs
                .iter()
                .map(|x| {
                    self.int_of(name, x)
                        .or_else(|_| self.bad(name, "a list of ints", a))
                })
                .collect(),
            _ => self.bad(name, "a list of ints", a),
        }
    }

    fn int_list(&mut self, name: &str) -> CallResult<Vec<i64>> {
        match self.take(name) {
            Some(a) => self.int_list_of(name, a),
            None => self.missing(name),
        }
    }

    /// An int or a list of ints (`stride=2`, `stride=[2, 1]`), broadcast to `n` entries as
    /// PyTorch's `_pair`; `default` when left out (or `none`).
    fn int_or_list(&mut self, name: &str, n: usize, default: &[i64]) -> CallResult<Vec<i64>> {
        let xs = match self.take(name) {
            None | Some(Attr::None) => return Ok(default.to_vec()),
            Some(Attr::List(l)) if l.is_empty() => return Ok(default.to_vec()),
            Some(a @ Attr::List(_)) => self.int_list_of(name, a)?,
            Some(a) => vec![self.int_of(name, a)?],
        };
        crate::ir::conv::spatial_list(name, &xs, n).or_else(|e| err(Some(name), e.to_string()))
    }

    /// A convolution's `padding`: an int, a list, `"same"` or `"valid"`.
    fn conv_padding(&mut self, n: usize) -> CallResult<ConvPadding> {
        match self.take("padding") {
            Some(Attr::Str(s)) => match s.as_str() {
                "same" => Ok(ConvPadding::Same),
                "valid" => Ok(ConvPadding::Valid),
                _ => err(Some("padding"), format!("Invalid padding string: '{s}'")),
            },
            Some(a) => {
                let xs = match a {
                    Attr::List(_) => self.int_list_of("padding", a)?,
                    other => vec![self.int_of("padding", other)?],
                };
                crate::ir::conv::spatial_list("padding", &xs, n)
                    .map(ConvPadding::Explicit)
                    .or_else(|e| err(Some("padding"), e.to_string()))
            }
            None => Ok(ConvPadding::Explicit(vec![0; n])),
        }
    }

    fn conv_attrs(&mut self, n: usize) -> CallResult<ConvAttrs> {
        Ok(ConvAttrs {
            stride: self.int_or_list("stride", n, &vec![1; n])?,
            padding: self.conv_padding(n)?,
            dilation: self.int_or_list("dilation", n, &vec![1; n])?,
            groups: self.int("groups", Some(1))?,
        })
    }

    fn pool_attrs(&mut self, dilation: bool) -> CallResult<PoolAttrs> {
        let kernel_size = self.int_or_list("kernel_size", 2, &[])?;
        if kernel_size.is_empty() {
            return self.missing("kernel_size");
        }
        Ok(PoolAttrs {
            stride: self.int_or_list("stride", 2, &kernel_size)?,
            padding: self.int_or_list("padding", 2, &[0, 0])?,
            dilation: if dilation {
                self.int_or_list("dilation", 2, &[1, 1])?
            } else {
                vec![1, 1]
            },
            ceil_mode: self.bool("ceil_mode", false)?,
            kernel_size,
        })
    }

    fn size_list(&mut self, name: &str) -> CallResult<Vec<usize>> {
        let a = self.take(name);
        let xs = match a {
            Some(a) => self.int_list_of(name, a)?,
            None => return self.missing(name),
        };
        xs.iter()
            .map(|&x| {
                usize::try_from(x).or_else(|_| {
                    err(
                        Some(name),
                        format!(
                            "attribute '{name}' of '{}' must not be negative, got {x}",
                            self.op
                        ),
                    )
                })
            })
            .collect()
    }

    /// An int or a list of ints; `none` or absent is `None`.
    fn dims(&mut self, name: &str) -> CallResult<Option<Vec<i64>>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Int(i)) => Ok(Some(vec![*i])),
            Some(a @ Attr::List(_)) => self.int_list_of(name, a).map(Some),
            Some(a) => self.bad(name, "an int or a list of ints", a),
        }
    }

    fn opt_scalar(&mut self, name: &str) -> CallResult<Option<Scalar>> {
        match self.take(name) {
            None | Some(Attr::None) => Ok(None),
            Some(Attr::Int(i)) => Ok(Some(Scalar::Int(*i))),
            Some(Attr::Float(x)) => Ok(Some(Scalar::Float(*x))),
            Some(Attr::Bool(b)) => Ok(Some(Scalar::Bool(*b))),
            Some(a) => self.bad(name, "a number", a),
        }
    }

    fn scalar(&mut self, name: &str, default: Option<Scalar>) -> CallResult<Scalar> {
        match (self.opt_scalar(name)?, default) {
            (Some(s), _) | (None, Some(s)) => Ok(s),
            (None, None) => self.missing(name),
        }
    }

    /// Fails on any attribute the constructor did not read.
    fn finish(self) -> CallResult<()> {
        match self.attrs.first() {
            Some((n, _)) => err(
                Some(n),
                format!("unknown attribute '{n}' for op '{}'", self.op),
            ),
            None => Ok(()),
        }
    }
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

impl Op {
    /// Builds an op from its text name, its positional operand slots (`true` for a tensor,
    /// `false` for `none`) and its `name=value` attributes; left-out attributes take
    /// PyTorch's defaults. Errors name the unknown op or the offending attribute.
    pub fn from_call(name: &str, slots: &[bool], attrs: &[(&str, Attr)]) -> Result<Op> {
        Op::from_call_detailed(name, slots, attrs).map_err(|e| Error::Value(e.msg))
    }

    /// `from_call` whose error says which attribute it concerns (for positioned messages).
    pub fn from_call_detailed(
        name: &str,
        slots: &[bool],
        attrs: &[(&str, Attr)],
    ) -> std::result::Result<Op, CallError> {
        let mut seen: Vec<&str> = Vec::new();
        for (n, _) in attrs {
            if seen.contains(n) {
                return err(Some(n), format!("attribute '{n}' given twice"));
            }
            seen.push(n);
        }
        let mut a = Args {
            op: name,
            attrs: attrs.iter().map(|(n, v)| (*n, v)).collect(),
        };
        let op = build(name, slots, &mut a)?;
        a.finish()?;
        let optional = optional_positions(&op);
        if let Some(i) = (0..slots.len()).find(|&i| !slots[i] && !optional.contains(&i)) {
            return err(
                None,
                format!("'{name}' needs a tensor as operand {i}, got none"),
            );
        }
        Ok(op)
    }

    /// The op's attributes in text order (defaults included; the printer drops those equal
    /// to the default).
    pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Op::Scalar(s) => vec![("value", scalar(*s))],
            Op::Constant(lit) => vec![
                ("dtype", Attr::DType(lit.dtype)),
                ("shape", usizes(&lit.shape)),
                ("data", literal_data(lit)),
            ],
            Op::Full {
                size,
                fill_value,
                dtype,
            } => vec![
                ("size", usizes(size)),
                ("fill_value", scalar(*fill_value)),
                ("dtype", opt(dtype, |d| Attr::DType(*d))),
            ],
            Op::Arange {
                start,
                end,
                step,
                dtype,
            } => vec![
                ("start", scalar(*start)),
                ("end", scalar(*end)),
                ("step", scalar(*step)),
                ("dtype", opt(dtype, |d| Attr::DType(*d))),
            ],
            Op::Unary(u) => u.attrs(),
            Op::Clamp { min, max } => vec![
                ("min", opt(min, |s| scalar(*s))),
                ("max", opt(max, |s| scalar(*s))),
            ],
            Op::To { dtype } => vec![("dtype", Attr::DType(*dtype))],
            Op::MaskedFill { value } => vec![("value", scalar(*value))],
            Op::Reduce {
                op: ReduceOp::Prod,
                dim,
                keepdim,
            } => vec![
                (
                    "dim",
                    opt(dim, |d| d.first().map_or(Attr::None, |&x| Attr::Int(x))),
                ),
                ("keepdim", Attr::Bool(*keepdim)),
            ],
            Op::Reduce { dim, keepdim, .. } => vec![
                ("dim", opt(dim, |d| ints(d))),
                ("keepdim", Attr::Bool(*keepdim)),
            ],
            Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => vec![
                ("dim", opt(dim, |d| Attr::Int(*d))),
                ("keepdim", Attr::Bool(*keepdim)),
            ],
            Op::Var {
                dim,
                correction,
                keepdim,
            }
            | Op::Std {
                dim,
                correction,
                keepdim,
            } => vec![
                ("dim", opt(dim, |d| ints(d))),
                ("correction", Attr::Float(*correction)),
                ("keepdim", Attr::Bool(*keepdim)),
            ],
            Op::Cumsum { dim } | Op::Softmax { dim } | Op::LogSoftmax { dim } => {
                vec![("dim", Attr::Int(*dim))]
            }
            Op::LayerNorm {
                normalized_shape,
                eps,
                ..
            } => vec![
                ("normalized_shape", usizes(normalized_shape)),
                ("eps", Attr::Float(*eps)),
            ],
            Op::Einsum { equation } => vec![("equation", Attr::Str(equation.clone()))],
            Op::Attention {
                is_causal, scale, ..
            }
            | Op::AttentionGrad {
                is_causal, scale, ..
            } => vec![
                ("is_causal", Attr::Bool(*is_causal)),
                ("scale", opt(scale, |s| Attr::Float(s.get()))),
            ],
            Op::Reshape { shape } | Op::View { shape } => vec![("shape", ints(shape))],
            Op::Permute { dims } | Op::Flip { dims } => vec![("dims", ints(dims))],
            Op::Transpose { dim0, dim1 } => {
                vec![("dim0", Attr::Int(*dim0)), ("dim1", Attr::Int(*dim1))]
            }
            Op::Expand { size } => vec![("size", ints(size))],
            Op::Squeeze { dim } => vec![("dim", opt(dim, |d| ints(d)))],
            Op::Unsqueeze { dim }
            | Op::Cat { dim }
            | Op::Stack { dim }
            | Op::IndexSelect { dim }
            | Op::Gather { dim }
            | Op::Scatter { dim }
            | Op::ScatterAdd { dim }
            | Op::IndexAdd { dim } => vec![("dim", Attr::Int(*dim))],
            Op::Flatten { start_dim, end_dim } => vec![
                ("start_dim", Attr::Int(*start_dim)),
                ("end_dim", Attr::Int(*end_dim)),
            ],
            Op::Narrow { dim, start, length } => vec![
                ("dim", Attr::Int(*dim)),
                ("start", Attr::Int(*start)),
                ("length", Attr::Int(*length)),
            ],
            Op::Select { dim, index } => {
                vec![("dim", Attr::Int(*dim)), ("index", Attr::Int(*index))]
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => vec![
                ("dim", Attr::Int(*dim)),
                ("start", opt(start, |x| Attr::Int(*x))),
                ("end", opt(end, |x| Attr::Int(*x))),
                ("step", Attr::Int(*step)),
            ],
            Op::Diagonal { offset, dim1, dim2 } => vec![
                ("offset", Attr::Int(*offset)),
                ("dim1", Attr::Int(*dim1)),
                ("dim2", Attr::Int(*dim2)),
            ],
            Op::Repeat { repeats } => vec![("repeats", usizes(repeats))],
            Op::Tril { diagonal } | Op::Triu { diagonal } => {
                vec![("diagonal", Attr::Int(*diagonal))]
            }
            Op::Binary(b) => match b.rounding_mode() {
                Some(m) => vec![("rounding_mode", Attr::Str(m.into()))],
                None => vec![],
            },
            Op::Where | Op::Matmul | Op::Linear { .. } | Op::T | Op::Contiguous | Op::Embedding => {
                vec![]
            }
            Op::Conv { conv, .. } => conv_attrs(conv),
            Op::ConvInputGrad { conv, input_size } => {
                let mut v = vec![("input_size", usizes(input_size))];
                v.extend(conv_attrs(conv));
                v
            }
            Op::ConvWeightGrad { conv, weight_size } => {
                let mut v = vec![("weight_size", usizes(weight_size))];
                v.extend(conv_attrs(conv));
                v
            }
            Op::MaxPool2d { pool } | Op::MaxPool2dGrad { pool } => pool_attrs(pool, true),
            Op::AvgPool2d {
                pool,
                count_include_pad,
            } => {
                let mut v = pool_attrs(pool, false);
                v.push(("count_include_pad", Attr::Bool(*count_include_pad)));
                v
            }
            Op::AvgPool2dGrad {
                pool,
                count_include_pad,
                input_size,
            } => {
                let mut v = vec![("input_size", usizes(input_size))];
                v.extend(pool_attrs(pool, false));
                v.push(("count_include_pad", Attr::Bool(*count_include_pad)));
                v
            }
            Op::AdaptiveAvgPool2d { output_size } => vec![("output_size", dims(output_size))],
            Op::AdaptiveAvgPool2dGrad { input_size } => vec![("input_size", usizes(input_size))],
            Op::BatchNorm(bn) => vec![
                ("training", Attr::Bool(bn.training)),
                ("momentum", Attr::Float(bn.momentum.get())),
                ("eps", Attr::Float(bn.eps.get())),
            ],
            Op::AllReduce { op } => vec![("op", Attr::Str(op.name().into()))],
            Op::Dropout { p, training, seed } => vec![
                ("p", Attr::Float(p.get())),
                ("training", Attr::Bool(*training)),
                ("seed", Attr::Int(*seed as i64)),
            ],
            // bodies print as `name=@graph` (the text printer writes control ops itself)
            Op::Control(c) => match c.kind {
                crate::ir::control::ControlKind::Scan { carries, reverse } => vec![
                    ("carries", Attr::Int(carries as i64)),
                    ("reverse", Attr::Bool(reverse)),
                ],
                _ => vec![],
            },
            Op::Result { index, .. } => vec![("index", Attr::Int(*index as i64))],
        }
    }

    /// The operand slots the printer writes: `None` when every slot is a tensor, else one
    /// `bool` per slot (`false` prints as `none`), trailing absent slots dropped.
    pub fn operand_slots(&self) -> Option<Vec<bool>> {
        let mut s = optional_slots(self)?;
        while s.last() == Some(&false) {
            s.pop();
        }
        Some(s)
    }

    /// The attributes worth printing: those that differ from PyTorch's defaults.
    pub fn printed_attrs(&self) -> Vec<(&'static str, Attr)> {
        let all = self.attrs();
        let slots = self.operand_slots().unwrap_or_default();
        let mut keep = all.clone();
        for (name, _) in &all {
            let without: Vec<(&str, Attr)> = keep
                .iter()
                .filter(|(n, _)| n != name)
                .map(|(n, a)| (*n, a.clone()))
                .collect();
            if Op::from_call_detailed(self.name(), &slots, &without).as_ref() == Ok(self) {
                keep.retain(|(n, _)| n != name);
            }
        }
        keep
    }
}

fn build(name: &str, slots: &[bool], a: &mut Args) -> CallResult<Op> {
    let op_name = a.op;
    let mut get = |n: &'static str| a.take(n).cloned();
    match UnaryOp::from_name(name, &mut get) {
        Ok(Some(u)) => return Ok(Op::Unary(u)),
        Ok(None) => {}
        Err((n, msg)) => return err(Some(n), format!("attribute '{n}' of '{op_name}' {msg}")),
    }
    if let Some(b) = binary_from_name(name) {
        if b != BinaryOp::Div {
            return Ok(Op::Binary(b));
        }
        // torch.div's rounding_mode: None (true division), "trunc" or "floor"
        return Ok(Op::Binary(match a.take("rounding_mode") {
            None => BinaryOp::Div,
            Some(Attr::Str(m)) if m == "floor" => BinaryOp::DivFloor,
            Some(Attr::Str(m)) if m == "trunc" => BinaryOp::DivTrunc,
            Some(Attr::Str(m)) => {
                return err(
                    Some("rounding_mode"),
                    format!(
                        "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{m}'"
                    ),
                );
            }
            Some(_) => {
                return err(
                    Some("rounding_mode"),
                    "attribute 'rounding_mode' of 'div' expects \"trunc\" or \"floor\"".into(),
                );
            }
        }));
    }
    if let Some(r) = reduce_from_name(name) {
        let dim = a.dims("dim")?;
        if r == ReduceOp::Prod && dim.as_ref().is_some_and(|d| d.len() != 1) {
            return err(
                Some("dim"),
                "attribute 'dim' of 'prod' expects one int".into(),
            );
        }
        let keepdim = a.bool("keepdim", false)?;
        return Ok(Op::Reduce {
            op: r,
            dim,
            keepdim,
        });
    }
    Ok(match name {
        "scalar" => Op::Scalar(a.scalar("value", None)?),
        "constant" => constant(a)?,
        "full" => Op::Full {
            size: a.size_list("size")?,
            fill_value: a.scalar("fill_value", None)?,
            dtype: a.opt_dtype("dtype")?,
        },
        "zeros" | "ones" => Op::Full {
            size: a.size_list("size")?,
            fill_value: Scalar::Int((name == "ones") as i64),
            dtype: Some(a.opt_dtype("dtype")?.unwrap_or(super::dtype::DEFAULT_FLOAT)),
        },
        "arange" => Op::Arange {
            start: a.scalar("start", Some(Scalar::Int(0)))?,
            end: a.scalar("end", None)?,
            step: a.scalar("step", Some(Scalar::Int(1)))?,
            dtype: a.opt_dtype("dtype")?,
        },
        "where" => Op::Where,
        "clamp" => Op::Clamp {
            min: a.opt_scalar("min")?,
            max: a.opt_scalar("max")?,
        },
        "to" => Op::To {
            dtype: a.dtype("dtype")?,
        },
        "masked_fill" => Op::MaskedFill {
            value: a.scalar("value", None)?,
        },
        "argmax" | "argmin" => {
            let dim = a.opt_int("dim")?;
            let keepdim = a.bool("keepdim", false)?;
            if name == "argmax" {
                Op::ArgMax { dim, keepdim }
            } else {
                Op::ArgMin { dim, keepdim }
            }
        }
        "var" | "std" => {
            let dim = a.dims("dim")?;
            let correction = a.float("correction", 1.0)?;
            let keepdim = a.bool("keepdim", false)?;
            if name == "var" {
                Op::Var {
                    dim,
                    correction,
                    keepdim,
                }
            } else {
                Op::Std {
                    dim,
                    correction,
                    keepdim,
                }
            }
        }
        "cumsum" => Op::Cumsum {
            dim: a.int("dim", None)?,
        },
        "softmax" => Op::Softmax {
            dim: a.int("dim", None)?,
        },
        "log_softmax" => Op::LogSoftmax {
            dim: a.int("dim", None)?,
        },
        "layer_norm" => Op::LayerNorm {
            normalized_shape: a.size_list("normalized_shape")?,
            eps: a.float("eps", 1e-5)?,
            has_weight: slots.get(1).copied().unwrap_or(false),
            has_bias: slots.get(2).copied().unwrap_or(false),
        },
        "matmul" => Op::Matmul,
        "linear" => Op::Linear {
            has_bias: slots.get(2).copied().unwrap_or(false),
        },
        "einsum" => Op::Einsum {
            equation: a.string("equation", None)?,
        },
        "scaled_dot_product_attention" => {
            if a.float("dropout_p", 0.0)? != 0.0 {
                return err(
                    Some("dropout_p"),
                    "scaled_dot_product_attention: dropout_p other than 0 is not supported".into(),
                );
            }
            Op::Attention {
                has_mask: slots.get(3).copied().unwrap_or(false),
                is_causal: a.bool("is_causal", false)?,
                scale: a.opt_float("scale")?.map(crate::ir::unary::Real),
            }
        }
        "scaled_dot_product_attention_backward" => Op::AttentionGrad {
            has_mask: slots.get(4).copied().unwrap_or(false),
            is_causal: a.bool("is_causal", false)?,
            scale: a.opt_float("scale")?.map(crate::ir::unary::Real),
        },
        "reshape" => Op::Reshape {
            shape: a.int_list("shape")?,
        },
        "view" => Op::View {
            shape: a.int_list("shape")?,
        },
        "permute" => Op::Permute {
            dims: a.int_list("dims")?,
        },
        "transpose" => Op::Transpose {
            dim0: a.int("dim0", None)?,
            dim1: a.int("dim1", None)?,
        },
        "t" => Op::T,
        "expand" => Op::Expand {
            size: a.int_list("size")?,
        },
        "squeeze" => Op::Squeeze {
            dim: a.dims("dim")?,
        },
        "unsqueeze" => Op::Unsqueeze {
            dim: a.int("dim", None)?,
        },
        "flatten" => Op::Flatten {
            start_dim: a.int("start_dim", Some(0))?,
            end_dim: a.int("end_dim", Some(-1))?,
        },
        "narrow" => Op::Narrow {
            dim: a.int("dim", None)?,
            start: a.int("start", None)?,
            length: a.int("length", None)?,
        },
        "select" => Op::Select {
            dim: a.int("dim", None)?,
            index: a.int("index", None)?,
        },
        "slice" => Op::Slice {
            dim: a.int("dim", Some(0))?,
            start: a.opt_int("start")?,
            end: a.opt_int("end")?,
            step: a.int("step", Some(1))?,
        },
        "diagonal" => Op::Diagonal {
            offset: a.int("offset", Some(0))?,
            dim1: a.int("dim1", Some(0))?,
            dim2: a.int("dim2", Some(1))?,
        },
        "contiguous" => Op::Contiguous,
        "repeat" => Op::Repeat {
            repeats: a.size_list("repeats")?,
        },
        "cat" => Op::Cat {
            dim: a.int("dim", Some(0))?,
        },
        "stack" => Op::Stack {
            dim: a.int("dim", Some(0))?,
        },
        "flip" => Op::Flip {
            dims: a.int_list("dims")?,
        },
        "tril" => Op::Tril {
            diagonal: a.int("diagonal", Some(0))?,
        },
        "triu" => Op::Triu {
            diagonal: a.int("diagonal", Some(0))?,
        },
        "index_select" => Op::IndexSelect {
            dim: a.int("dim", None)?,
        },
        "gather" => Op::Gather {
            dim: a.int("dim", None)?,
        },
        "scatter" => Op::Scatter {
            dim: a.int("dim", None)?,
        },
        "scatter_add" => Op::ScatterAdd {
            dim: a.int("dim", None)?,
        },
        "index_add" => Op::IndexAdd {
            dim: a.int("dim", None)?,
        },
        "embedding" => Op::Embedding,
        "conv1d" | "conv2d" => Op::Conv {
            conv: a.conv_attrs(if name == "conv1d" { 1 } else { 2 })?,
            has_bias: slots.get(2).copied().unwrap_or(false),
        },
        "convolution_backward_input" => {
            let input_size = a.size_list("input_size")?;
            Op::ConvInputGrad {
                conv: a.conv_attrs(input_size.len().saturating_sub(2).max(1))?,
                input_size,
            }
        }
        "convolution_backward_weight" => {
            let weight_size = a.size_list("weight_size")?;
            Op::ConvWeightGrad {
                conv: a.conv_attrs(weight_size.len().saturating_sub(2).max(1))?,
                weight_size,
            }
        }
        "max_pool2d" => Op::MaxPool2d {
            pool: a.pool_attrs(true)?,
        },
        "max_pool2d_backward" => Op::MaxPool2dGrad {
            pool: a.pool_attrs(true)?,
        },
        "avg_pool2d" => Op::AvgPool2d {
            pool: a.pool_attrs(false)?,
            count_include_pad: a.bool("count_include_pad", true)?,
        },
        "avg_pool2d_backward" => Op::AvgPool2dGrad {
            input_size: a.size_list("input_size")?,
            pool: a.pool_attrs(false)?,
            count_include_pad: a.bool("count_include_pad", true)?,
        },
        "adaptive_avg_pool2d" => {
            let output_size = a.int_or_list("output_size", 2, &[])?;
            if output_size.is_empty() {
                return a.missing("output_size");
            }
            Op::AdaptiveAvgPool2d { output_size }
        }
        "adaptive_avg_pool2d_backward" => Op::AdaptiveAvgPool2dGrad {
            input_size: a.size_list("input_size")?,
        },
        "batch_norm" => {
            let slot = |i: usize| slots.get(i).copied().unwrap_or(false);
            if slot(1) != slot(2) {
                return err(
                    None,
                    "batch_norm: give both running_mean and running_var, or neither".into(),
                );
            }
            Op::BatchNorm(BatchNormAttrs {
                has_running: slot(1),
                has_weight: slot(3),
                has_bias: slot(4),
                training: a.bool("training", false)?,
                momentum: Real(a.float("momentum", 0.1)?),
                eps: Real(a.float("eps", 1e-5)?),
            })
        }
        "dropout" => {
            let seed = a.int("seed", Some(0))?;
            Op::Dropout {
                p: Real(a.float("p", 0.5)?),
                training: a.bool("training", true)?,
                seed: seed as u64,
            }
        }
        "all_reduce" => {
            let op = a.string("op", Some("sum"))?;
            match super::collective::ReduceOp::parse(&op) {
                Ok(op) => Op::AllReduce { op },
                Err(e) => return err(Some("op"), format!("all_reduce: {e}")),
            }
        }
        _ => return err(None, format!("unknown op '{name}'")),
    })
}

/// Per-dim sizes as PyTorch users write them: one int when every dim has the same size.
fn dims(xs: &[i64]) -> Attr {
    match xs {
        [first, rest @ ..] if rest.iter().all(|x| x == first) => Attr::Int(*first),
        _ => ints(xs),
    }
}

fn conv_attrs(c: &ConvAttrs) -> Vec<(&'static str, Attr)> {
    let padding = match &c.padding {
        ConvPadding::Explicit(p) => dims(p),
        ConvPadding::Same => Attr::Str("same".into()),
        ConvPadding::Valid => Attr::Str("valid".into()),
    };
    vec![
        ("stride", dims(&c.stride)),
        ("padding", padding),
        ("dilation", dims(&c.dilation)),
        ("groups", Attr::Int(c.groups)),
    ]
}

fn pool_attrs(p: &PoolAttrs, dilation: bool) -> Vec<(&'static str, Attr)> {
    let mut v = vec![
        ("kernel_size", dims(&p.kernel_size)),
        ("stride", dims(&p.stride)),
        ("padding", dims(&p.padding)),
    ];
    if dilation {
        v.push(("dilation", dims(&p.dilation)));
    }
    v.push(("ceil_mode", Attr::Bool(p.ceil_mode)));
    v
}

/// `constant(dtype=, shape=, data=[...])`: the elements in row-major order.
fn constant(a: &mut Args) -> CallResult<Op> {
    let dtype = a.dtype("dtype")?;
    let shape = a.size_list("shape")?;
    let data = match a.take("data") {
        Some(Attr::List(xs)) => xs,
        Some(other) => return a.bad("data", "a list of numbers", other),
        None => return a.missing("data"),
    };
    let n = super::shape::numel(&shape);
    if data.len() != n {
        return err(
            Some("data"),
            format!(
                "constant: {} elements given for shape {shape:?}, which holds {n}",
                data.len()
            ),
        );
    }
    let mut bytes = Vec::with_capacity(n * dtype.size());
    for x in data {
        let v = match x {
            Attr::Int(i) if !dtype.is_float() => Elem::I(*i),
            Attr::Bool(b) => Elem::I(*b as i64),
            Attr::Int(i) => Elem::F(*i as f64),
            Attr::Float(f) if dtype.is_float() => Elem::F(*f),
            other => return a.bad("data", &format!("{} elements", dtype.name()), other),
        };
        push_elem(&mut bytes, dtype, v);
    }
    Ok(Op::Constant(Literal {
        dtype,
        shape,
        bytes: Arc::new(bytes),
    }))
}

enum Elem {
    I(i64),
    F(f64),
}

fn push_elem(out: &mut Vec<u8>, d: DType, v: Elem) {
    use half::{bf16, f16};
    let f = |v: &Elem| match v {
        Elem::I(i) => *i as f64,
        Elem::F(x) => *x,
    };
    let i = |v: &Elem| match v {
        Elem::I(i) => *i,
        Elem::F(x) => *x as i64,
    };
    match d {
        DType::Bool => out.push((i(&v) != 0) as u8),
        DType::U8 => out.push(i(&v) as u8),
        DType::I8 => out.push(i(&v) as i8 as u8),
        DType::I16 => out.extend_from_slice(&(i(&v) as i16).to_le_bytes()),
        DType::I32 => out.extend_from_slice(&(i(&v) as i32).to_le_bytes()),
        DType::I64 => out.extend_from_slice(&i(&v).to_le_bytes()),
        DType::F16 => out.extend_from_slice(&f16::from_f64(f(&v)).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f64(f(&v)).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(f(&v) as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&f(&v).to_le_bytes()),
    }
}

/// The elements of a literal as attribute values (exact for every dtype).
fn literal_data(lit: &Literal) -> Attr {
    use half::{bf16, f16};
    let b = &lit.bytes[..];
    let size = lit.dtype.size();
    let elems = b.chunks_exact(size).map(|c| match lit.dtype {
        DType::Bool => Attr::Bool(c[0] != 0),
        DType::U8 => Attr::Int(c[0] as i64),
        DType::I8 => Attr::Int(c[0] as i8 as i64),
        DType::I16 => Attr::Int(i16::from_le_bytes([c[0], c[1]]) as i64),
        DType::I32 => Attr::Int(i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
        DType::I64 => Attr::Int(i64::from_le_bytes(to8(c))),
        DType::F16 => Attr::Float(f16::from_le_bytes([c[0], c[1]]).to_f64()),
        DType::BF16 => Attr::Float(bf16::from_le_bytes([c[0], c[1]]).to_f64()),
        DType::F32 => Attr::Float(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
        DType::F64 => Attr::Float(f64::from_le_bytes(to8(c))),
    });
    Attr::List(elems.collect())
}

fn to8(c: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(&c[..8]);
    a
}
