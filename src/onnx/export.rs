//! smelt graph → ONNX model. Each smelt op becomes one or a few standard ONNX ops (opset 13
//! or newer); ops ONNX lacks are decomposed, and an op with no ONNX form is an error naming
//! it. Operands are cast to the dtype the ONNX op needs where PyTorch's type promotion would
//! have mixed them; ops without operands (`full`, `arange`, constants) are evaluated and
//! stored as initializers, as are the parameters given with the graph.

use super::proto::{
    AttributeProto, DimValue, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto, attribute_type,
};
use super::tensor::{elem_type_of, from_tensor};
use crate::ir::conv::ConvPadding;
use crate::ir::dtype::{DType, PromoteArg, result_type};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, ScatterReduction, TensorType, UnaryOp};
use crate::runtime::interp;
use crate::{Error, Result, Tensor, bail};
use std::collections::{HashMap, HashSet};

/// The oldest opset the exporter writes.
pub const MIN_OPSET: i64 = 13;
/// The newest opset the exporter writes.
pub const MAX_OPSET: i64 = 21;

/// Exports `g` as an ONNX model of the standard ops at `opset`; graph inputs named in
/// `weights` become initializers holding those values.
pub fn export(g: &Graph, weights: &[(String, Tensor)], opset: i64) -> Result<ModelProto> {
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        bail!(
            Value,
            "opset {opset}: smelt exports opsets {MIN_OPSET} to {MAX_OPSET}"
        );
    }
    let mut e = Exporter {
        g,
        opset,
        nodes: Vec::new(),
        inits: Vec::new(),
        names: HashMap::new(),
        fresh: 0,
    };
    let weights: HashMap<&str, &Tensor> = weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut inputs = Vec::new();
    for v in g.topo_order() {
        let node = g.node(v);
        match &node.kind {
            NodeKind::Input { name } => match weights.get(name.as_str()) {
                Some(t) => {
                    if t.ttype().shape != node.ty.shape || t.dtype() != node.ty.dtype {
                        bail!(
                            Value,
                            "weight '{name}' is {} {:?}, but the graph's input is {} {:?}",
                            t.dtype(),
                            t.shape(),
                            node.ty.dtype,
                            node.ty.shape
                        );
                    }
                    e.inits.push(from_tensor(t, name)?);
                    e.names.insert(v, name.clone());
                }
                None => {
                    inputs.push(value_info(name, &node.ty));
                    e.names.insert(v, name.clone());
                }
            },
            NodeKind::Op(op) => {
                let out = e.op(v, op).map_err(|err| {
                    Error::Value(format!("export of '{}' (%{}): {err}", op.name(), node.name))
                })?;
                e.names.insert(v, out);
            }
        }
    }
    let mut outputs = Vec::new();
    let mut seen = HashSet::new();
    for &v in g.outputs() {
        let mut name = e.names[&v].clone();
        // an output listed twice, or one that is an input or initializer, gets its own name
        let is_source = !matches!(g.node(v).kind, NodeKind::Op(_)) || e.is_initializer(&name);
        if !seen.insert(name.clone()) || is_source {
            name = e.node("Identity", &[&name], vec![]);
            seen.insert(name.clone());
        }
        outputs.push(value_info(&name, &g.node(v).ty));
    }
    Ok(ModelProto {
        ir_version: 8,
        producer_name: "smelt".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            name: g.name.clone(),
            node: e.nodes,
            initializer: e.inits,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn value_info(name: &str, ty: &TensorType) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: elem_type_of(ty.dtype),
                shape: Some(TensorShapeProto {
                    dim: ty
                        .shape
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(DimValue::DimValue(d as i64)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: v,
        ..Default::default()
    }
}

fn float(name: &str, v: f64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f: v as f32,
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn dims(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// A dim counted from the end when negative.
fn norm(d: i64, rank: usize) -> i64 {
    if d < 0 { d + rank as i64 } else { d }
}

struct Exporter<'g> {
    g: &'g Graph,
    opset: i64,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    names: HashMap<ValueId, String>,
    fresh: usize,
}

use super::proto::TensorProto;

impl Exporter<'_> {
    fn is_initializer(&self, name: &str) -> bool {
        self.inits.iter().any(|t| t.name == name)
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.fresh += 1;
        format!("_{hint}_{}", self.fresh)
    }

    /// Adds a node of `op_type`; returns its (fresh) output's name.
    fn node(&mut self, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh(&op_type.to_lowercase());
        self.nodes.push(NodeProto {
            op_type: op_type.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            attribute: attrs,
            ..Default::default()
        });
        out
    }

    /// An initializer holding `t`; returns its name.
    fn init(&mut self, t: &Tensor) -> Result<String> {
        let name = self.fresh("const");
        self.inits.push(from_tensor(t, &name)?);
        Ok(name)
    }

    fn i64s(&mut self, v: &[i64]) -> Result<String> {
        self.init(&Tensor::from_slice(v, &[v.len()])?)
    }

    fn scalar(&mut self, v: f64, dtype: DType) -> Result<String> {
        self.init(&Tensor::scalar(v).to_dtype(dtype)?)
    }

    fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.node(v).ty
    }

    /// Operand `v` in `dtype` (a Cast where it has another).
    fn as_dtype(&mut self, v: ValueId, dtype: DType) -> String {
        let name = self.names[&v].clone();
        if self.ty(v).dtype == dtype {
            return name;
        }
        self.node(
            "Cast",
            &[&name],
            vec![int("to", elem_type_of(dtype) as i64)],
        )
    }

    fn cast(&mut self, name: &str, from: DType, to: DType) -> String {
        if from == to {
            return name.to_string();
        }
        self.node("Cast", &[name], vec![int("to", elem_type_of(to) as i64)])
    }

    /// The dtype PyTorch computes a pointwise op of `operands` in.
    fn common(&self, operands: &[ValueId]) -> DType {
        let args: Vec<PromoteArg> = operands
            .iter()
            .map(|&o| {
                let t = self.ty(o);
                PromoteArg {
                    dtype: t.dtype,
                    zero_dim: t.shape.is_empty(),
                    wrapped: t.wrapped,
                }
            })
            .collect();
        result_type(&args)
    }

    /// `x` reshaped to `shape`.
    fn reshape(&mut self, x: &str, shape: &[usize]) -> Result<String> {
        let s = self.i64s(&dims(shape))?;
        Ok(self.node("Reshape", &[x, &s], vec![]))
    }

    /// A reduction node with `axes` (an input from opset 18, 13 for ReduceSum).
    fn reduce(&mut self, op: &str, x: &str, axes: &[i64], keep: bool) -> Result<String> {
        let keep = int("keepdims", keep as i64);
        if op == "ReduceSum" || self.opset >= 18 {
            let a = self.i64s(axes)?;
            Ok(self.node(op, &[x, &a], vec![keep]))
        } else {
            Ok(self.node(op, &[x], vec![ints("axes", axes), keep]))
        }
    }

    fn op(&mut self, v: ValueId, op: &Op) -> Result<String> {
        let operands = self.g.operands(v);
        let out_ty = self.ty(v).clone();
        let rank_of = |e: &Self, i: usize| e.ty(operands[i]).shape.len();
        let name = |e: &Self, i: usize| e.names[&operands[i]].clone();
        // leaves: evaluated here and stored
        if operands.is_empty() && !matches!(op, Op::Control(_) | Op::AllReduce { .. }) {
            let mut leaf = Graph::new("leaf");
            let id = leaf.add_op(op.clone(), &[])?;
            leaf.set_outputs(vec![id]);
            let t = interp::run::<&str>(&leaf, &[])?.remove(0);
            return self.init(&t.to_dtype(out_ty.dtype)?);
        }
        Ok(match op {
            Op::Unary(u) => self.unary(*u, &operands, &out_ty)?,
            Op::Binary(b) => self.binary(*b, &operands, &out_ty)?,
            Op::Where => {
                let c = name(self, 0);
                let (x, y) = (
                    self.as_dtype(operands[1], out_ty.dtype),
                    self.as_dtype(operands[2], out_ty.dtype),
                );
                self.node("Where", &[&c, &x, &y], vec![])
            }
            Op::Clamp { min, max } => {
                let x = self.as_dtype(operands[0], out_ty.dtype);
                let lo = match min {
                    Some(s) => self.scalar(s.to_f64(), out_ty.dtype)?,
                    None => String::new(),
                };
                let hi = match max {
                    Some(s) => self.scalar(s.to_f64(), out_ty.dtype)?,
                    None => String::new(),
                };
                self.node("Clip", &[&x, &lo, &hi], vec![])
            }
            Op::To { dtype } => self.as_dtype(operands[0], *dtype),
            Op::MaskedFill { value } => {
                let x = self.as_dtype(operands[0], out_ty.dtype);
                let m = name(self, 1);
                let f = self.scalar(value.to_f64(), out_ty.dtype)?;
                self.node("Where", &[&m, &f, &x], vec![])
            }
            Op::Reduce { op, dim, keepdim } => {
                let r = rank_of(self, 0);
                let axes: Vec<i64> = match dim {
                    Some(d) => d.iter().map(|&a| norm(a, r)).collect(),
                    None => (0..r as i64).collect(),
                };
                let in_ty = self.ty(operands[0]).dtype;
                let reduce = |e: &mut Self, kind: &str, dt: DType| -> Result<String> {
                    let x = e.as_dtype(operands[0], dt);
                    if axes.is_empty() {
                        return Ok(e.node("Identity", &[&x], vec![]));
                    }
                    e.reduce(kind, &x, &axes, *keepdim)
                };
                match op {
                    ReduceOp::All | ReduceOp::Any => {
                        let kind = if *op == ReduceOp::All {
                            "ReduceMin"
                        } else {
                            "ReduceMax"
                        };
                        let x = self.as_dtype(operands[0], DType::Bool);
                        let i = self.cast(&x, DType::Bool, DType::I32);
                        let y = if axes.is_empty() {
                            i
                        } else {
                            self.reduce(kind, &i, &axes, *keepdim)?
                        };
                        self.cast(&y, DType::I32, DType::Bool)
                    }
                    _ => {
                        let kind = match op {
                            ReduceOp::Sum => "ReduceSum",
                            ReduceOp::Mean => "ReduceMean",
                            ReduceOp::Prod => "ReduceProd",
                            ReduceOp::Amax => "ReduceMax",
                            ReduceOp::Amin => "ReduceMin",
                            _ => "ReduceLogSumExp",
                        };
                        let _ = in_ty;
                        reduce(self, kind, out_ty.dtype)?
                    }
                }
            }
            Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => {
                let kind = if matches!(op, Op::ArgMax { .. }) {
                    "ArgMax"
                } else {
                    "ArgMin"
                };
                let mut x = name(self, 0);
                let axis = match dim {
                    Some(d) => norm(*d, rank_of(self, 0)),
                    None => {
                        let n = self.ty(operands[0]).shape.iter().product::<usize>();
                        x = self.reshape(&x, &[n])?;
                        0
                    }
                };
                let keep = *keepdim && dim.is_some();
                let y = self.node(
                    kind,
                    &[&x],
                    vec![int("axis", axis), int("keepdims", keep as i64)],
                );
                if *keepdim && dim.is_none() {
                    self.reshape(&y, &out_ty.shape)?
                } else {
                    y
                }
            }
            Op::Var {
                dim,
                correction,
                keepdim,
            }
            | Op::Std {
                dim,
                correction,
                keepdim,
            } => {
                let r = rank_of(self, 0);
                let axes: Vec<i64> = match dim {
                    Some(d) => d.iter().map(|&a| norm(a, r)).collect(),
                    None => (0..r as i64).collect(),
                };
                let shape = self.ty(operands[0]).shape.clone();
                let n: usize = axes.iter().map(|&a| shape[a as usize]).product();
                let x = self.as_dtype(operands[0], out_ty.dtype);
                let mean = self.reduce("ReduceMean", &x, &axes, true)?;
                let d = self.node("Sub", &[&x, &mean], vec![]);
                let sq = self.node("Mul", &[&d, &d], vec![]);
                let s = self.reduce("ReduceSum", &sq, &axes, *keepdim)?;
                let div = self.scalar((n as f64 - correction).max(0.0), out_ty.dtype)?;
                let var = self.node("Div", &[&s, &div], vec![]);
                if matches!(op, Op::Std { .. }) {
                    self.node("Sqrt", &[&var], vec![])
                } else {
                    var
                }
            }
            Op::Cumsum { dim } => {
                let x = self.as_dtype(operands[0], out_ty.dtype);
                let a = self.i64s(&[norm(*dim, rank_of(self, 0))])?;
                let a = self.reshape(&a, &[])?;
                self.node("CumSum", &[&x, &a], vec![])
            }
            Op::Softmax { dim } | Op::LogSoftmax { dim } => {
                let kind = if matches!(op, Op::Softmax { .. }) {
                    "Softmax"
                } else {
                    "LogSoftmax"
                };
                let x = self.as_dtype(operands[0], out_ty.dtype);
                self.node(kind, &[&x], vec![int("axis", norm(*dim, rank_of(self, 0)))])
            }
            Op::LayerNorm {
                normalized_shape,
                eps,
                has_weight,
                has_bias,
            } => {
                if self.opset < 17 {
                    bail!(Unsupported, "layer_norm needs opset 17 or newer");
                }
                let x = name(self, 0);
                let ones = Tensor::ones(normalized_shape, out_ty.dtype);
                let w = if *has_weight {
                    name(self, 1)
                } else {
                    self.init(&ones)?
                };
                let b = if *has_bias {
                    name(self, 1 + *has_weight as usize)
                } else {
                    String::new()
                };
                let axis = -(normalized_shape.len() as i64);
                self.node(
                    "LayerNormalization",
                    &[&x, &w, &b],
                    vec![int("axis", axis), float("epsilon", *eps)],
                )
            }
            Op::Matmul => {
                let (a, b) = (name(self, 0), name(self, 1));
                self.node("MatMul", &[&a, &b], vec![])
            }
            Op::Linear { has_bias } => {
                let (x, w) = (name(self, 0), name(self, 1));
                let bias = has_bias.then(|| name(self, 2));
                if rank_of(self, 0) == 2 {
                    let b = bias.unwrap_or_default();
                    self.node("Gemm", &[&x, &w, &b], vec![int("transB", 1)])
                } else {
                    let wt = self.node("Transpose", &[&w], vec![ints("perm", &[1, 0])]);
                    let y = self.node("MatMul", &[&x, &wt], vec![]);
                    match bias {
                        Some(b) => self.node("Add", &[&y, &b], vec![]),
                        None => y,
                    }
                }
            }
            Op::Attention {
                has_mask,
                is_causal,
                scale,
            } => self.attention(
                &operands,
                *has_mask,
                *is_causal,
                scale.map(|s| s.0),
                &out_ty,
            )?,
            Op::Einsum { equation } => {
                let xs: Vec<String> = (0..operands.len()).map(|i| name(self, i)).collect();
                let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
                self.node("Einsum", &refs, vec![string("equation", equation)])
            }
            Op::Reshape { .. }
            | Op::View { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. } => {
                let x = name(self, 0);
                self.reshape(&x, &out_ty.shape)?
            }
            Op::Contiguous => {
                let x = name(self, 0);
                self.node("Identity", &[&x], vec![])
            }
            Op::Permute { dims } => {
                let r = rank_of(self, 0);
                let perm: Vec<i64> = dims.iter().map(|&d| norm(d, r)).collect();
                let x = name(self, 0);
                self.node("Transpose", &[&x], vec![ints("perm", &perm)])
            }
            Op::Transpose { dim0, dim1 } => {
                let r = rank_of(self, 0);
                let mut perm: Vec<i64> = (0..r as i64).collect();
                perm.swap(norm(*dim0, r) as usize, norm(*dim1, r) as usize);
                let x = name(self, 0);
                self.node("Transpose", &[&x], vec![ints("perm", &perm)])
            }
            Op::T => {
                let r = rank_of(self, 0);
                let x = name(self, 0);
                if r < 2 {
                    self.node("Identity", &[&x], vec![])
                } else {
                    self.node("Transpose", &[&x], vec![ints("perm", &[1, 0])])
                }
            }
            Op::Expand { .. } => {
                let x = name(self, 0);
                let s = self.i64s(&dims(&out_ty.shape))?;
                self.node("Expand", &[&x, &s], vec![])
            }
            Op::Narrow { dim, start, length } => {
                let r = rank_of(self, 0);
                let n = self.ty(operands[0]).shape[norm(*dim, r) as usize] as i64;
                let s = if *start < 0 { start + n } else { *start };
                self.slice(&name(self, 0), norm(*dim, r), s, s + length, 1)?
            }
            Op::Select { dim, index } => {
                let r = rank_of(self, 0);
                let d = norm(*dim, r);
                let n = self.ty(operands[0]).shape[d as usize] as i64;
                let i = if *index < 0 { index + n } else { *index };
                let s = self.slice(&name(self, 0), d, i, i + 1, 1)?;
                self.reshape(&s, &out_ty.shape)?
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => {
                let r = rank_of(self, 0);
                let d = norm(*dim, r);
                let n = self.ty(operands[0]).shape[d as usize] as i64;
                let fix = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
                let s = start.map_or(0, fix);
                let e = end.map_or(n, fix);
                self.slice(&name(self, 0), d, s, e, *step)?
            }
            Op::Flip { dims } => {
                let r = rank_of(self, 0);
                let axes: Vec<i64> = dims.iter().map(|&d| norm(d, r)).collect();
                let k = axes.len();
                let starts = self.i64s(&vec![-1; k])?;
                let ends = self.i64s(&vec![i64::MIN; k])?;
                let ax = self.i64s(&axes)?;
                let steps = self.i64s(&vec![-1; k])?;
                let x = name(self, 0);
                self.node("Slice", &[&x, &starts, &ends, &ax, &steps], vec![])
            }
            Op::Repeat { repeats } => {
                let mut x = name(self, 0);
                let shape = self.ty(operands[0]).shape.clone();
                if repeats.len() > shape.len() {
                    let mut s = vec![1; repeats.len() - shape.len()];
                    s.extend(&shape);
                    x = self.reshape(&x, &s)?;
                }
                let r: Vec<i64> = repeats.iter().map(|&n| n as i64).collect();
                let r = self.i64s(&r)?;
                self.node("Tile", &[&x, &r], vec![])
            }
            Op::Cat { dim } => {
                let r = out_ty.shape.len();
                let xs: Vec<String> = operands
                    .iter()
                    .map(|&o| self.as_dtype(o, out_ty.dtype))
                    .collect();
                let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
                self.node("Concat", &refs, vec![int("axis", norm(*dim, r))])
            }
            Op::Stack { dim } => {
                let d = norm(*dim, out_ty.shape.len()) as usize;
                let mut xs = Vec::new();
                for &o in &operands {
                    let x = self.as_dtype(o, out_ty.dtype);
                    let mut s = self.ty(o).shape.clone();
                    s.insert(d, 1);
                    xs.push(self.reshape(&x, &s)?);
                }
                let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
                self.node("Concat", &refs, vec![int("axis", d as i64)])
            }
            Op::Tril { diagonal } | Op::Triu { diagonal } => {
                let upper = matches!(op, Op::Triu { .. });
                let x = name(self, 0);
                let k = self.i64s(&[*diagonal])?;
                let k = self.reshape(&k, &[])?;
                self.node("Trilu", &[&x, &k], vec![int("upper", upper as i64)])
            }
            Op::IndexSelect { dim } => {
                let r = rank_of(self, 0);
                let (x, i) = (name(self, 0), name(self, 1));
                self.node("Gather", &[&x, &i], vec![int("axis", norm(*dim, r))])
            }
            Op::Embedding => {
                let (i, w) = (name(self, 0), name(self, 1));
                self.node("Gather", &[&w, &i], vec![int("axis", 0)])
            }
            Op::Gather { dim } => {
                let r = rank_of(self, 0);
                let (x, i) = (name(self, 0), name(self, 1));
                self.node(
                    "GatherElements",
                    &[&x, &i],
                    vec![int("axis", norm(*dim, r))],
                )
            }
            Op::Scatter { dim } | Op::ScatterAdd { dim } => {
                let r = rank_of(self, 0);
                let x = name(self, 0);
                let i = name(self, 1);
                let src = self.as_dtype(operands[2], out_ty.dtype);
                let mut attrs = vec![int("axis", norm(*dim, r))];
                if matches!(op, Op::ScatterAdd { .. }) {
                    attrs.push(string("reduction", "add"));
                }
                self.node("ScatterElements", &[&x, &i, &src], attrs)
            }
            Op::ScatterReduce { dim, reduce } => {
                // ONNX has mul from opset 16, max and min from 18, and no mean
                let (reduction, since) = match reduce {
                    ScatterReduction::Sum => ("add", MIN_OPSET),
                    ScatterReduction::Prod => ("mul", 16),
                    ScatterReduction::Amax => ("max", 18),
                    ScatterReduction::Amin => ("min", 18),
                    ScatterReduction::Mean => bail!(
                        Unsupported,
                        "scatter_reduce(reduce=\"mean\") has no ONNX form"
                    ),
                };
                if self.opset < since {
                    bail!(
                        Unsupported,
                        "scatter_reduce(reduce=\"{}\") needs ONNX opset {since} or newer (exporting opset {})",
                        reduce.name(),
                        self.opset
                    );
                }
                let r = rank_of(self, 0);
                let (x, i) = (name(self, 0), name(self, 1));
                let src = self.as_dtype(operands[2], out_ty.dtype);
                let attrs = vec![int("axis", norm(*dim, r)), string("reduction", reduction)];
                self.node("ScatterElements", &[&x, &i, &src], attrs)
            }
            Op::Conv { conv, has_bias } => {
                let x = name(self, 0);
                let w = name(self, 1);
                let b = if *has_bias {
                    name(self, 2)
                } else {
                    String::new()
                };
                let n = conv.stride.len();
                let pads = match &conv.padding {
                    ConvPadding::Explicit(p) => {
                        let p = crate::ir::conv::spatial_list("padding", p, n)?;
                        [p.clone(), p].concat()
                    }
                    ConvPadding::Valid => vec![0; 2 * n],
                    ConvPadding::Same => {
                        // the total padding of "same" (stride 1), the odd element at the end
                        let ws = &self.ty(operands[1]).shape;
                        let dil = crate::ir::conv::spatial_list("dilation", &conv.dilation, n)?;
                        let total: Vec<i64> =
                            (0..n).map(|i| dil[i] * (ws[2 + i] as i64 - 1)).collect();
                        let lo: Vec<i64> = total.iter().map(|t| t / 2).collect();
                        let hi: Vec<i64> = total.iter().zip(&lo).map(|(t, l)| t - l).collect();
                        [lo, hi].concat()
                    }
                };
                let ks: Vec<i64> = dims(&self.ty(operands[1]).shape[2..]);
                self.node(
                    "Conv",
                    &[&x, &w, &b],
                    vec![
                        ints("kernel_shape", &ks),
                        ints(
                            "strides",
                            &crate::ir::conv::spatial_list("stride", &conv.stride, n)?,
                        ),
                        ints(
                            "dilations",
                            &crate::ir::conv::spatial_list("dilation", &conv.dilation, n)?,
                        ),
                        ints("pads", &pads),
                        int("group", conv.groups),
                    ],
                )
            }
            Op::MaxPool2d { pool } | Op::AvgPool2d { pool, .. } => {
                let x = name(self, 0);
                let p = &pool.padding;
                let mut attrs = vec![
                    ints("kernel_shape", &pool.kernel_size),
                    ints("strides", &pool.stride),
                    ints("pads", &[p[0], p[1], p[0], p[1]]),
                    int("ceil_mode", pool.ceil_mode as i64),
                ];
                let kind = match op {
                    Op::AvgPool2d {
                        count_include_pad, ..
                    } => {
                        attrs.push(int("count_include_pad", *count_include_pad as i64));
                        "AveragePool"
                    }
                    _ => {
                        attrs.push(ints("dilations", &pool.dilation));
                        "MaxPool"
                    }
                };
                self.node(kind, &[&x], attrs)
            }
            Op::AdaptiveAvgPool2d { .. } => {
                let x = name(self, 0);
                let ins = self.ty(operands[0]).shape.clone();
                let r = ins.len();
                let (ih, iw) = (ins[r - 2] as i64, ins[r - 1] as i64);
                let (oh, ow) = (out_ty.shape[r - 2] as i64, out_ty.shape[r - 1] as i64);
                if oh == 1 && ow == 1 {
                    self.reduce("ReduceMean", &x, &[r as i64 - 2, r as i64 - 1], true)?
                } else if ih % oh == 0 && iw % ow == 0 {
                    let k = [ih / oh, iw / ow];
                    self.node(
                        "AveragePool",
                        &[&x],
                        vec![ints("kernel_shape", &k), ints("strides", &k)],
                    )
                } else {
                    bail!(
                        Unsupported,
                        "adaptive_avg_pool2d to {oh}x{ow} from {ih}x{iw} has no ONNX form"
                    );
                }
            }
            Op::BatchNorm(a) => {
                if a.training || !a.has_running {
                    bail!(
                        Unsupported,
                        "batch_norm with batch statistics (training) has no ONNX inference form"
                    );
                }
                let [mean, var, w, b] = a.positions();
                let c = self.ty(operands[0]).shape[1];
                let x = name(self, 0);
                let ones = Tensor::ones(&[c], out_ty.dtype);
                let zeros = Tensor::zeros(&[c], out_ty.dtype);
                let w = match w {
                    Some(i) => name(self, i),
                    None => self.init(&ones)?,
                };
                let b = match b {
                    Some(i) => name(self, i),
                    None => self.init(&zeros)?,
                };
                let (m, va) = (
                    name(self, mean.expect("has_running")),
                    name(self, var.expect("has_running")),
                );
                self.node(
                    "BatchNormalization",
                    &[&x, &w, &b, &m, &va],
                    vec![float("epsilon", a.eps.0)],
                )
            }
            Op::Dropout { training, .. } => {
                if *training {
                    bail!(
                        Unsupported,
                        "dropout in training mode has no deterministic ONNX form"
                    );
                }
                let x = name(self, 0);
                self.node("Identity", &[&x], vec![])
            }
            other => bail!(Unsupported, "'{}' has no ONNX form", other.name()),
        })
    }

    fn slice(&mut self, x: &str, axis: i64, start: i64, end: i64, step: i64) -> Result<String> {
        let s = self.i64s(&[start])?;
        let e = self.i64s(&[end])?;
        let a = self.i64s(&[axis])?;
        let st = self.i64s(&[step])?;
        Ok(self.node("Slice", &[x, &s, &e, &a, &st], vec![]))
    }

    fn unary(&mut self, u: UnaryOp, operands: &[ValueId], out: &TensorType) -> Result<String> {
        let dt = if u.name() == "logical_not" || u.name() == "isnan" {
            self.ty(operands[0]).dtype
        } else {
            out.dtype
        };
        let x = self.as_dtype(operands[0], dt);
        let direct = match u.name() {
            "neg" => Some("Neg"),
            "abs" => Some("Abs"),
            "exp" => Some("Exp"),
            "log" => Some("Log"),
            "sqrt" => Some("Sqrt"),
            "sin" => Some("Sin"),
            "cos" => Some("Cos"),
            "asin" => Some("Asin"),
            "acos" => Some("Acos"),
            "atan" => Some("Atan"),
            "bitwise_not" if dt == DType::Bool => Some("Not"),
            "bitwise_not" => {
                self.bitwise_opset("bitwise_not")?;
                Some("BitwiseNot")
            }
            "tanh" => Some("Tanh"),
            "sigmoid" => Some("Sigmoid"),
            "relu" => Some("Relu"),
            "erf" => Some("Erf"),
            "floor" => Some("Floor"),
            "ceil" => Some("Ceil"),
            "round" => Some("Round"),
            "sign" => Some("Sign"),
            "reciprocal" => Some("Reciprocal"),
            "logical_not" => Some("Not"),
            "isnan" => Some("IsNaN"),
            "hardswish" => Some("HardSwish"),
            _ => None,
        };
        if let Some(kind) = direct {
            let x = if kind == "Not" {
                self.cast(&x, dt, DType::Bool)
            } else {
                x
            };
            return Ok(self.node(kind, &[&x], vec![]));
        }
        let attrs: HashMap<&str, crate::ir::attrs::Attr> =
            Op::Unary(u).attrs().into_iter().collect();
        let real = |n: &str| match attrs.get(n) {
            Some(crate::ir::attrs::Attr::Float(f)) => *f,
            Some(crate::ir::attrs::Attr::Int(i)) => *i as f64,
            _ => 0.0,
        };
        let d = out.dtype;
        Ok(match u.name() {
            "rsqrt" => {
                let s = self.node("Sqrt", &[&x], vec![]);
                self.node("Reciprocal", &[&s], vec![])
            }
            "square" => self.node("Mul", &[&x, &x], vec![]),
            "silu" => {
                let s = self.node("Sigmoid", &[&x], vec![]);
                self.node("Mul", &[&x, &s], vec![])
            }
            "log1p" => {
                let one = self.scalar(1.0, d)?;
                let a = self.node("Add", &[&x, &one], vec![]);
                self.node("Log", &[&a], vec![])
            }
            "expm1" => {
                let one = self.scalar(1.0, d)?;
                let e = self.node("Exp", &[&x], vec![]);
                self.node("Sub", &[&e, &one], vec![])
            }
            "leaky_relu" => self.node(
                "LeakyRelu",
                &[&x],
                vec![float("alpha", real("negative_slope"))],
            ),
            "elu" => self.node("Elu", &[&x], vec![float("alpha", real("alpha"))]),
            "hardtanh" => {
                let lo = self.scalar(real("min_val"), d)?;
                let hi = self.scalar(real("max_val"), d)?;
                self.node("Clip", &[&x, &lo, &hi], vec![])
            }
            "softplus" => {
                // log(1 + e^(beta x)) / beta; torch's linear tail above `threshold` agrees
                // to rounding
                let beta = real("beta");
                let b = self.scalar(beta, d)?;
                let bx = self.node("Mul", &[&x, &b], vec![]);
                let sp = self.node("Softplus", &[&bx], vec![]);
                self.node("Div", &[&sp, &b], vec![])
            }
            "mish" => {
                let sp = self.node("Softplus", &[&x], vec![]);
                let t = self.node("Tanh", &[&sp], vec![]);
                self.node("Mul", &[&x, &t], vec![])
            }
            "logsigmoid" => {
                let n = self.node("Neg", &[&x], vec![]);
                let sp = self.node("Softplus", &[&n], vec![]);
                self.node("Neg", &[&sp], vec![])
            }
            "gelu" => {
                let tanh = matches!(attrs.get("approximate"), Some(crate::ir::attrs::Attr::Str(s)) if s == "tanh");
                if self.opset >= 20 {
                    let mode = if tanh { "tanh" } else { "none" };
                    self.node("Gelu", &[&x], vec![string("approximate", mode)])
                } else if tanh {
                    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))
                    let c = self.scalar(0.044_715, d)?;
                    let k = self.scalar((2.0 / std::f64::consts::PI).sqrt(), d)?;
                    let half = self.scalar(0.5, d)?;
                    let one = self.scalar(1.0, d)?;
                    let x2 = self.node("Mul", &[&x, &x], vec![]);
                    let x3 = self.node("Mul", &[&x2, &x], vec![]);
                    let cx3 = self.node("Mul", &[&x3, &c], vec![]);
                    let inner = self.node("Add", &[&x, &cx3], vec![]);
                    let scaled = self.node("Mul", &[&inner, &k], vec![]);
                    let t = self.node("Tanh", &[&scaled], vec![]);
                    let t1 = self.node("Add", &[&t, &one], vec![]);
                    let hx = self.node("Mul", &[&x, &half], vec![]);
                    self.node("Mul", &[&hx, &t1], vec![])
                } else {
                    // 0.5 x (1 + erf(x / sqrt 2))
                    let r2 = self.scalar(std::f64::consts::SQRT_2, d)?;
                    let half = self.scalar(0.5, d)?;
                    let one = self.scalar(1.0, d)?;
                    let s = self.node("Div", &[&x, &r2], vec![]);
                    let e = self.node("Erf", &[&s], vec![]);
                    let e1 = self.node("Add", &[&e, &one], vec![]);
                    let hx = self.node("Mul", &[&x, &half], vec![]);
                    self.node("Mul", &[&hx, &e1], vec![])
                }
            }
            other => bail!(Unsupported, "'{other}' has no ONNX form"),
        })
    }

    /// ONNX's integer bitwise ops are opset 18's.
    fn bitwise_opset(&self, op: &str) -> Result<()> {
        if self.opset < 18 {
            bail!(
                Unsupported,
                "'{op}' of integers needs ONNX opset 18 or newer (exporting opset {})",
                self.opset
            );
        }
        Ok(())
    }

    fn binary(&mut self, b: BinaryOp, operands: &[ValueId], out: &TensorType) -> Result<String> {
        let common = self.common(operands);
        let x = self.as_dtype(operands[0], common);
        let y = self.as_dtype(operands[1], common);
        let simple = |k: &str| Some(k.to_string());
        let kind = match b {
            BinaryOp::Add => simple("Add"),
            BinaryOp::Sub => simple("Sub"),
            BinaryOp::Mul => simple("Mul"),
            BinaryOp::Div if common.is_float() => simple("Div"),
            BinaryOp::Maximum => simple("Max"),
            BinaryOp::Minimum => simple("Min"),
            BinaryOp::Eq => simple("Equal"),
            BinaryOp::Lt => simple("Less"),
            BinaryOp::Le => simple("LessOrEqual"),
            BinaryOp::Gt => simple("Greater"),
            BinaryOp::Ge => simple("GreaterOrEqual"),
            // bools take the logical ops; integers need opset 18
            BinaryOp::BitwiseAnd if common == DType::Bool => simple("And"),
            BinaryOp::BitwiseOr if common == DType::Bool => simple("Or"),
            BinaryOp::BitwiseXor if common == DType::Bool => simple("Xor"),
            BinaryOp::BitwiseAnd | BinaryOp::BitwiseOr | BinaryOp::BitwiseXor => {
                self.bitwise_opset(b.name())?;
                let kind = match b {
                    BinaryOp::BitwiseAnd => "BitwiseAnd",
                    BinaryOp::BitwiseOr => "BitwiseOr",
                    _ => "BitwiseXor",
                };
                simple(kind)
            }
            _ => None,
        };
        if let Some(k) = kind {
            return Ok(self.node(&k, &[&x, &y], vec![]));
        }
        Ok(match b {
            BinaryOp::Ne => {
                let e = self.node("Equal", &[&x, &y], vec![]);
                self.node("Not", &[&e], vec![])
            }
            BinaryOp::LogicalAnd | BinaryOp::LogicalOr => {
                let xb = self.cast(&x, common, DType::Bool);
                let yb = self.cast(&y, common, DType::Bool);
                let k = if b == BinaryOp::LogicalAnd {
                    "And"
                } else {
                    "Or"
                };
                self.node(k, &[&xb, &yb], vec![])
            }
            BinaryOp::Div => {
                // true division of integers: in floats
                let xf = self.cast(&x, common, out.dtype);
                let yf = self.cast(&y, common, out.dtype);
                self.node("Div", &[&xf, &yf], vec![])
            }
            BinaryOp::DivTrunc if !common.is_float() => self.node("Div", &[&x, &y], vec![]),
            BinaryOp::DivTrunc => {
                // trunc(q) = sign(q) floor(|q|)
                let q = self.node("Div", &[&x, &y], vec![]);
                let s = self.node("Sign", &[&q], vec![]);
                let a = self.node("Abs", &[&q], vec![]);
                let f = self.node("Floor", &[&a], vec![]);
                self.node("Mul", &[&s, &f], vec![])
            }
            BinaryOp::DivFloor if common.is_float() => {
                let q = self.node("Div", &[&x, &y], vec![]);
                self.node("Floor", &[&q], vec![])
            }
            BinaryOp::DivFloor => {
                // integers: the truncated quotient, one less where the signs differ and
                // the division is inexact
                let q = self.node("Div", &[&x, &y], vec![]);
                let r = self.node("Mod", &[&x, &y], vec![int("fmod", 0)]);
                let zero = self.scalar(0.0, common)?;
                let inexact = self.node("Equal", &[&r, &zero], vec![]);
                let inexact = self.node("Not", &[&inexact], vec![]);
                let qy = self.node("Mul", &[&q, &y], vec![]);
                let over = self.node("Greater", &[&qy, &x], vec![]);
                let fix = self.node("And", &[&inexact, &over], vec![]);
                let one = self.scalar(1.0, common)?;
                let q1 = self.node("Sub", &[&q, &one], vec![]);
                self.node("Where", &[&fix, &q1, &q], vec![])
            }
            BinaryOp::Remainder if common.is_float() => {
                // x - floor(x / y) y
                let q = self.node("Div", &[&x, &y], vec![]);
                let f = self.node("Floor", &[&q], vec![]);
                let fy = self.node("Mul", &[&f, &y], vec![]);
                self.node("Sub", &[&x, &fy], vec![])
            }
            BinaryOp::Remainder => self.node("Mod", &[&x, &y], vec![int("fmod", 0)]),
            BinaryOp::Pow => {
                let base = self.as_dtype(operands[0], out.dtype);
                let e = self.as_dtype(operands[1], out.dtype);
                self.node("Pow", &[&base, &e], vec![])
            }
            other => bail!(Unsupported, "'{}' has no ONNX form", other.name()),
        })
    }

    fn attention(
        &mut self,
        operands: &[ValueId],
        has_mask: bool,
        is_causal: bool,
        scale: Option<f64>,
        out: &TensorType,
    ) -> Result<String> {
        let d = out.dtype;
        let qs = self.ty(operands[0]).shape.clone();
        let ks = self.ty(operands[1]).shape.clone();
        let (l, s, e) = (qs[qs.len() - 2], ks[ks.len() - 2], qs[qs.len() - 1]);
        let q = self.names[&operands[0]].clone();
        let k = self.names[&operands[1]].clone();
        let v = self.names[&operands[2]].clone();
        let r = ks.len() as i64;
        let mut perm: Vec<i64> = (0..r).collect();
        perm.swap(r as usize - 2, r as usize - 1);
        let kt = self.node("Transpose", &[&k], vec![ints("perm", &perm)]);
        let scores = self.node("MatMul", &[&q, &kt], vec![]);
        let c = self.scalar(scale.unwrap_or(1.0 / (e as f64).sqrt()), d)?;
        let mut scores = self.node("Mul", &[&scores, &c], vec![]);
        let neg_inf = self.scalar(f64::NEG_INFINITY, d)?;
        if is_causal {
            let keep = Tensor::ones(&[l, s], DType::Bool).tril(0)?;
            let m = self.init(&keep)?;
            scores = self.node("Where", &[&m, &scores, &neg_inf], vec![]);
        }
        if has_mask {
            let m = self.names[&operands[3]].clone();
            scores = if self.ty(operands[3]).dtype == DType::Bool {
                self.node("Where", &[&m, &scores, &neg_inf], vec![])
            } else {
                let m = self.as_dtype(operands[3], d);
                self.node("Add", &[&scores, &m], vec![])
            };
        }
        let p = self.node("Softmax", &[&scores], vec![int("axis", -1)]);
        Ok(self.node("MatMul", &[&p, &v], vec![]))
    }
}
