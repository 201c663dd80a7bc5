//! ONNX models in and out: [`load`] reads a `.onnx` file, [`Model::import`] turns its graph
//! into a smelt [`Graph`] for one binding of the inputs' shapes (symbolic dims such as
//! `batch` take the sizes of the inputs given), with the initializers as parameters.
//!
//! ```
//! # fn main() -> smelt::Result<()> {
//! use smelt::Tensor;
//! let model = smelt::onnx::load("tests/data/onnx_models/resnet18/model.onnx")?;
//! let x = Tensor::randn(&[1, 3, 64, 64], None)?;
//! let imported = model.import(&[("input", x.shape())])?;
//! let outputs = smelt::runtime::interp::run_positional(
//!     &imported.graph,
//!     &imported.bind(&[("input", x)])?,
//! )?;
//! assert_eq!(outputs[0].shape(), &[1, 10]);
//! # Ok(()) }
//! ```
//!
//! Each ONNX op is lowered once, by a function of the table in `ops` keyed by op type and
//! opset; nodes whose inputs are all known at import (shape arithmetic) are evaluated there.
//! The protobuf messages are declared in [`proto`] and decoded by prost.

mod elem;
mod export;
mod import;
mod ops;
pub mod proto;
mod symbolic;
pub mod tensor;

use crate::ir::graph::Graph;
use crate::{DType, Error, Result, Tensor, bail};
pub use export::{MAX_OPSET, MIN_OPSET, export};
use import::{Importer, initializer, sanitize};
use prost::Message;
use proto::{DimValue, ModelProto};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
pub use symbolic::SymbolicImport;

/// A decoded ONNX model with its initializers read.
#[derive(Debug)]
pub struct Model {
    proto: ModelProto,
    opset: i64,
    initializers: Vec<(String, Tensor)>,
}

/// One dim of a graph input's declared shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Size(usize),
    /// A named size (`dim_param`), the same wherever the name appears.
    Named(String),
    /// Any size.
    Unknown,
}

/// A graph input of a model (initializers excluded).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// The name written in the model.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its declared shape.
    pub dims: Vec<Dim>,
}

/// A model's graph imported for one binding of its inputs' shapes.
#[derive(Debug)]
pub struct Imported {
    /// The smelt graph: the model's inputs first, then one input per parameter.
    pub graph: Graph,
    /// The parameters: the graph input's name and its value.
    pub weights: Vec<(String, Tensor)>,
    /// For each model input: its ONNX name and the name of its graph input.
    pub inputs: Vec<(String, String)>,
    /// The ONNX names of the outputs, in order.
    pub outputs: Vec<String>,
    /// Inputs whose values the graph was specialized to (an op needed them at import: a
    /// shape or axes given as an input); [`Imported::bind`] refuses other values.
    pub specialized: Vec<(String, Tensor)>,
}

impl Imported {
    /// The graph's inputs in order: the model's inputs from `inputs` (by ONNX name), then the
    /// parameters.
    pub fn bind(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
        let mut by_name: HashMap<&str, &Tensor> = HashMap::new();
        for (onnx, graph) in &self.inputs {
            let t = inputs
                .iter()
                .find(|(n, _)| n == onnx || n == graph)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::Value(format!("missing input '{onnx}'")))?;
            by_name.insert(graph, t);
        }
        for (name, _) in inputs {
            if !self.inputs.iter().any(|(o, g)| o == name || g == name) {
                bail!(Value, "the model has no input named '{name}'");
            }
        }
        for (name, value) in &self.specialized {
            let given = inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t);
            if given.is_some_and(|t| !same_elements(t, value)) {
                bail!(
                    Value,
                    "input '{name}' was read when the model was imported (a shape or axes); \
                     import it again for other values"
                );
            }
        }
        for (name, t) in &self.weights {
            by_name.insert(name, t);
        }
        self.graph
            .inputs()
            .iter()
            .map(|&v| {
                let name = &self.graph.node(v).name;
                match by_name.get(name.as_str()) {
                    Some(t) => Ok((*t).clone()),
                    None => bail!(
                        Value,
                        "graph input '{name}' is neither a model input nor a weight"
                    ),
                }
            })
            .collect()
    }
}

/// Reads and decodes a `.onnx` file (external data is read from beside it).
pub fn load(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            p.to_path_buf()
        }
    });
    from_bytes(&bytes, dir.as_deref()).map_err(|e| prefix(e, &path.display().to_string()))
}

fn prefix(e: Error, name: &str) -> Error {
    match e {
        Error::Io(m) => Error::Io(m),
        other => Error::Value(format!("{name}: {other}")),
    }
}

/// Decodes a model from its bytes; `dir` is where external data lives (`None` refuses it).
pub fn from_bytes(bytes: &[u8], dir: Option<&Path>) -> Result<Model> {
    let proto = ModelProto::decode(bytes)
        .map_err(|e| Error::Value(format!("not a valid ONNX model: {e}")))?;
    let opset = proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(0, |o| o.version);
    let Some(graph) = &proto.graph else {
        bail!(Value, "the model has no graph");
    };
    if let Some(s) = graph.sparse_initializer.first() {
        let name = s.values.as_ref().map_or("", |v| v.name.as_str());
        bail!(Value, "sparse initializer '{name}' is not supported");
    }
    let initializers = graph
        .initializer
        .iter()
        .map(|t| Ok((t.name.clone(), initializer(t, dir)?)))
        .collect::<Result<_>>()?;
    Ok(Model {
        proto,
        opset,
        initializers,
    })
}

/// Writes output `t` as a `.npy` file in ONNX element type `elem_type`: a type smelt holds in
/// a wider dtype is written in its own where NumPy has it (uint16, uint32, uint64), the
/// sub-byte integers as int8/uint8 and the float8/float4 formats as float32 (exact).
pub fn write_output(path: impl AsRef<Path>, t: &Tensor, elem_type: i32) -> Result<()> {
    match elem::held(elem_type) {
        Some(elem::Held::Unsigned(bits)) => crate::runtime::npy::write_npy_unsigned(path, t, bits),
        _ => crate::runtime::npy::write_npy(path, t),
    }
}

/// Reads a file holding one serialized `TensorProto` (the ONNX test suite's `.pb` data).
pub fn read_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let t = proto::TensorProto::decode(bytes.as_slice())
        .map_err(|e| Error::Value(format!("{}: not an ONNX tensor: {e}", path.display())))?;
    tensor::to_tensor(&t, None).map_err(|e| prefix(e, &path.display().to_string()))
}

impl Model {
    /// The opset of the standard ops the model is written against (0 for a model that
    /// imports none, such as one of only preview training ops).
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// The decoded protobuf.
    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The initializers, by name.
    pub fn initializers(&self) -> &[(String, Tensor)] {
        &self.initializers
    }

    fn graph_proto(&self) -> &proto::GraphProto {
        self.proto.graph.as_ref().expect("checked by from_bytes")
    }

    /// The graph inputs a caller gives (those that are not initializers), in order.
    pub fn inputs(&self) -> Result<Vec<Input>> {
        let inits: std::collections::HashSet<&str> =
            self.initializers.iter().map(|(n, _)| n.as_str()).collect();
        self.graph_proto()
            .input
            .iter()
            .filter(|i| !inits.contains(i.name.as_str()))
            .map(|i| {
                let tt = i
                    .r#type
                    .as_ref()
                    .and_then(|t| t.tensor_type.as_ref())
                    .ok_or_else(|| {
                        Error::Value(format!(
                            "input '{}' is not a tensor (sequences, maps and optional values \
                             are not supported)",
                            i.name
                        ))
                    })?;
                let dtype = tensor::dtype_of(tt.elem_type)
                    .map_err(|e| Error::DType(format!("input '{}': {e}", i.name)))?;
                let dims = tt.shape.as_ref().map_or_else(Vec::new, |s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(DimValue::DimValue(v)) if *v >= 0 => Dim::Size(*v as usize),
                            Some(DimValue::DimParam(p)) if !p.is_empty() => Dim::Named(p.clone()),
                            _ => Dim::Unknown,
                        })
                        .collect()
                });
                Ok(Input {
                    name: i.name.clone(),
                    dtype,
                    dims,
                })
            })
            .collect()
    }

    /// The ONNX element type of each graph output, in order (0 where the model leaves it
    /// undeclared). [`write_output`] writes an output in it.
    pub fn output_elem_types(&self) -> Vec<i32> {
        self.graph_proto()
            .output
            .iter()
            .map(|o| {
                o.r#type
                    .as_ref()
                    .and_then(|t| t.tensor_type.as_ref())
                    .map_or(0, |tt| tt.elem_type)
            })
            .collect()
    }

    /// The graph for inputs of the given shapes (by ONNX input name). An input left out takes
    /// its declared shape, each named or unknown dim being 1.
    pub fn import(&self, shapes: &[(&str, &[usize])]) -> Result<Imported> {
        self.import_with(shapes, HashMap::new(), false)
    }

    /// The graph for these inputs (by ONNX input name): their shapes, and their values where
    /// an op needs one at import (a shape, axes or pads given as a graph input; the graph is
    /// then only valid for that value, see [`Imported::specialized`]).
    pub fn import_for(&self, inputs: &[(&str, &Tensor)]) -> Result<Imported> {
        let shapes: Vec<(&str, &[usize])> = inputs.iter().map(|(n, t)| (*n, t.shape())).collect();
        let values = inputs
            .iter()
            .map(|(n, t)| (n.to_string(), (*t).clone()))
            .collect();
        self.import_with(&shapes, values, false)
    }

    /// The import for `shapes` and, where given, input `values`; `sampling` when the sizes
    /// are samples of symbols (`Model::import_symbolic`).
    fn import_with(
        &self,
        shapes: &[(&str, &[usize])],
        values: HashMap<String, Tensor>,
        sampling: bool,
    ) -> Result<Imported> {
        let graph = self.graph_proto();
        let mut imp = Importer::new(&graph.name, self.opset);
        imp.values = values;
        imp.sampling = sampling;
        let mut bound: HashMap<String, (usize, String)> = HashMap::new();
        let mut inputs = Vec::new();
        for input in self.inputs()? {
            let shape = match shapes.iter().find(|(n, _)| *n == input.name) {
                Some((_, s)) => {
                    check_shape(&input, s, &mut bound)?;
                    s.to_vec()
                }
                None => input
                    .dims
                    .iter()
                    .map(|d| match d {
                        Dim::Size(n) => *n,
                        Dim::Named(p) => bound.get(p).map_or(1, |b| b.0),
                        Dim::Unknown => 1,
                    })
                    .collect(),
            };
            let ty = crate::ir::op::TensorType::new(input.dtype, shape);
            let gname = imp.add_input(&input.name, ty)?;
            inputs.push((input.name.clone(), gname));
        }
        for (name, _) in shapes {
            if !inputs.iter().any(|(o, _)| o == name) {
                bail!(Value, "the model has no input named '{name}'");
            }
        }
        for (name, t) in &self.initializers {
            if !inputs.iter().any(|(o, _)| o == name) {
                imp.bind(name, import::Val::known(t.clone()));
            }
        }
        for t in &graph.initializer {
            imp.set_elem_type(&t.name, t.data_type);
        }
        for i in &graph.input {
            if let Some(tt) = i.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) {
                imp.set_elem_type(&i.name, tt.elem_type);
            }
        }
        imp.nodes(graph)?;
        let mut outs = Vec::new();
        let mut names = Vec::new();
        for o in &graph.output {
            let mut v = imp.materialize(&o.name)?;
            if let Some(tt) = o.r#type.as_ref().and_then(|t| t.tensor_type.as_ref())
                && tt.elem_type != 0
            {
                let want = tensor::dtype_of(tt.elem_type)?;
                if imp.g.node(v).ty.dtype != want {
                    v = imp.g.add_op(crate::ir::op::Op::To { dtype: want }, &[v])?;
                }
            }
            outs.push(v);
            names.push(o.name.clone());
        }
        imp.g.set_outputs(outs);
        imp.g.verify()?;
        let specialized = imp
            .specialized
            .take()
            .into_iter()
            .map(|n| {
                let t = imp.values[&n].clone();
                (n, t)
            })
            .collect();
        Ok(Imported {
            graph: imp.g,
            weights: imp.weights,
            inputs,
            outputs: names,
            specialized,
        })
    }
}

/// Whether two tensors hold the same dtype, shape and elements.
fn same_elements(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && matches!((a.to_bytes(), b.to_bytes()), (Ok(x), Ok(y)) if x == y)
}

/// Checks a given shape against an input's declared dims, binding named dims.
fn check_shape(
    input: &Input,
    shape: &[usize],
    bound: &mut HashMap<String, (usize, String)>,
) -> Result<()> {
    if !input.dims.is_empty() && input.dims.len() != shape.len() {
        bail!(
            Value,
            "input '{}' has rank {} in the model, but a tensor of shape {shape:?} was given",
            input.name,
            input.dims.len()
        );
    }
    for (d, &n) in input.dims.iter().zip(shape) {
        match d {
            Dim::Size(s) if *s != n => bail!(
                Value,
                "input '{}' has shape {:?} in the model, but {shape:?} was given",
                input.name,
                input.dims
            ),
            Dim::Named(p) => match bound.get(p) {
                Some((m, from)) if *m != n => bail!(
                    Value,
                    "dimension '{p}' is {m} from input '{from}' but {n} from input '{}'",
                    input.name
                ),
                Some(_) => {}
                None => {
                    bound.insert(p.clone(), (n, input.name.clone()));
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// The ONNX op types smelt imports, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    ops::supported()
}

/// The name a graph input gets for an ONNX name (characters the `.smelt` format cannot spell
/// become `_`).
pub fn graph_name(onnx_name: &str) -> String {
    sanitize(onnx_name)
}
