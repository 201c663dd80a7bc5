//! `Op::from_call`: an op built from its text name, operand slots and attributes.

use super::args::Args;
use super::{
    Attr, CallError, CallResult, binary_from_name, err, optional_positions, reduce_from_name,
};
use crate::ir::conv::BatchNormAttrs;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, Literal, Op, ReduceOp, UnaryOp};
use crate::ir::unary::Real;
use crate::{Error, Result};
use std::sync::Arc;

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
            dtype: Some(
                a.opt_dtype("dtype")?
                    .unwrap_or(crate::ir::dtype::DEFAULT_FLOAT),
            ),
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
        "view" => match a.opt_dtype("dtype")? {
            Some(dtype) => Op::ViewDtype { dtype },
            None => Op::View {
                shape: a.int_list("shape")?,
            },
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
        "scatter_reduce" => {
            let dim = a.int("dim", None)?;
            let reduce = a.string("reduce", None)?;
            if !a.bool("include_self", true)? {
                return err(
                    Some("include_self"),
                    "scatter_reduce: include_self=false is not supported".into(),
                );
            }
            match crate::ir::op::ScatterReduction::parse(&reduce) {
                Ok(reduce) => Op::ScatterReduce { dim, reduce },
                Err(e) => return err(Some("reduce"), format!("scatter_reduce: {e}")),
            }
        }
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
            match crate::ir::collective::ReduceOp::parse(&op) {
                Ok(op) => Op::AllReduce { op },
                Err(e) => return err(Some("op"), format!("all_reduce: {e}")),
            }
        }
        _ => return err(None, format!("unknown op '{name}'")),
    })
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
    let n = crate::ir::shape::numel(&shape);
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
        DType::F16 => out.extend_from_slice(&smelt_rt::scalar::f16_from_f64(f(&v)).to_le_bytes()),
        DType::BF16 => out.extend_from_slice(&smelt_rt::scalar::bf16_from_f64(f(&v)).to_le_bytes()),
        DType::F32 => out.extend_from_slice(&(f(&v) as f32).to_le_bytes()),
        DType::F64 => out.extend_from_slice(&f(&v).to_le_bytes()),
    }
}
