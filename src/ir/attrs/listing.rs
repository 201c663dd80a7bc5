//! `Op::attrs`: an op's attributes listed back in text order, and those the printer
//! writes.

use super::{Attr, optional_slots};
use crate::ir::conv::{ConvAttrs, ConvPadding, PoolAttrs};
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{Literal, Op, ReduceOp};

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

impl Op {
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
            Op::To { dtype } | Op::ViewDtype { dtype } => vec![("dtype", Attr::DType(*dtype))],
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
            Op::ScatterReduce { dim, reduce } => vec![
                ("dim", Attr::Int(*dim)),
                ("reduce", Attr::Str(reduce.name().into())),
            ],
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
