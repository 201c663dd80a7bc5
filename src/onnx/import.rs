//! ONNX graph → smelt graph, for one binding of the inputs' shapes.
//!
//! Every ONNX value is either a node of the smelt graph or a tensor known at import (an
//! initializer, a `Constant`, a `Shape`, or any node all of whose inputs are known: such a
//! node is run at import on the reference interpreter instead of being added to the graph).
//! That folds the shape arithmetic exporters write (`Shape` → `Gather` → `Concat` →
//! `Reshape`) into plain attributes. A known tensor that a graph op uses becomes an inline
//! constant when small, and a parameter (a graph input bound from the model's weights)
//! otherwise.

use super::ops::{self, Lower};
use super::proto::{AttributeProto, GraphProto, NodeProto, attribute_type};
use super::tensor::{dtype_of, to_tensor};
use crate::ir::attrs::Attr;
use crate::ir::graph::{Graph, ValueId, is_valid_name};
use crate::ir::op::{Op, TensorType};
use crate::runtime::interp;
use crate::{DType, Error, Result, Scalar, Tensor, bail};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Known tensors of at most this many elements used by graph ops are inlined as constants;
/// larger ones become parameters.
const INLINE_MAX: usize = 64;

/// A node whose inputs are known is run at import unless its results hold more than this
/// many elements and four times as many as its inputs.
const FOLD_MIN_ELEMS: usize = 1 << 16;

/// No value of an imported graph may hold more bytes than this (a hostile file claiming a
/// huge shape is refused before anything is allocated).
const VALUE_MAX_BYTES: usize = 1 << 36;

/// An ONNX value during import.
#[derive(Clone, Debug, Default)]
pub struct Val {
    /// Its node in the graph, once it has one.
    pub(super) id: Option<ValueId>,
    /// Its elements, when known at import.
    pub(super) known: Option<Tensor>,
}

impl Val {
    /// A value known at import.
    pub fn known(t: Tensor) -> Val {
        Val {
            id: None,
            known: Some(t),
        }
    }

    /// A node of the graph.
    pub fn node(id: ValueId) -> Val {
        Val {
            id: Some(id),
            known: None,
        }
    }
}

/// The graph being built and what is known about each ONNX value.
pub(super) struct Importer {
    pub(super) g: Graph,
    vals: HashMap<String, Val>,
    /// Parameters made from known tensors: (graph input name, tensor).
    pub(super) weights: Vec<(String, Tensor)>,
    used: HashSet<String>,
    pub(super) opset: i64,
    /// Every known tensor becomes an inline constant (the scratch graphs of folding).
    inline_all: bool,
    /// Importing at sample sizes of symbols: a fold whose result is larger than its inputs
    /// (an `Expand` to the batch) stays an op, whose sizes the symbols can then write.
    pub(super) sampling: bool,
    /// When sampling: the ONNX values computed from the inputs' sizes.
    from_sizes: HashSet<String>,
    /// The values of graph inputs given at import, by ONNX name: an op that needs an
    /// operand's value at import (a shape, axes) may read it from here.
    pub(super) values: HashMap<String, Tensor>,
    /// The inputs whose values were read at import (the graph is only valid for them).
    pub(super) specialized: std::cell::RefCell<Vec<String>>,
    /// Values computed at import from given input values, by ONNX name.
    computed: std::cell::RefCell<HashMap<String, Tensor>>,
    /// The ONNX name of each graph input made for a model input, by graph name.
    onnx_names: HashMap<String, String>,
    /// ONNX element types smelt holds in a wider dtype (`elem::held`), by ONNX value name;
    /// every other value's type is its dtype's.
    pub(super) elem_types: HashMap<String, i32>,
}

impl Importer {
    pub(super) fn new(name: &str, opset: i64) -> Importer {
        let name = sanitize(name);
        Importer {
            g: Graph::new(if name.is_empty() { "main" } else { &name }),
            vals: HashMap::new(),
            weights: Vec::new(),
            used: HashSet::new(),
            opset,
            inline_all: false,
            sampling: false,
            from_sizes: HashSet::new(),
            values: HashMap::new(),
            specialized: Default::default(),
            computed: Default::default(),
            onnx_names: HashMap::new(),
            elem_types: HashMap::new(),
        }
    }

    /// Records ONNX value `name`'s element type where smelt holds it in a wider dtype.
    pub(super) fn set_elem_type(&mut self, name: &str, elem_type: i32) {
        if super::elem::held(elem_type).is_some() {
            self.elem_types.insert(name.to_string(), elem_type);
        }
    }

    /// The ONNX element type of value `name`.
    pub(super) fn elem_type(&self, name: &str) -> Result<i32> {
        if let Some(&t) = self.elem_types.get(name) {
            return Ok(t);
        }
        let v = self.get(name)?;
        let dtype = match (&v.known, v.id) {
            (Some(t), _) => t.dtype(),
            (None, Some(id)) => self.g.node(id).ty.dtype,
            (None, None) => return Err(undefined(name)),
        };
        Ok(super::tensor::elem_type_of(dtype))
    }

    /// The element type of `node`'s first output where it is one smelt holds in a wider
    /// dtype: set by a cast, or kept from the first input by ops that move elements.
    fn output_elem_type(&self, node: &NodeProto) -> Option<i32> {
        let first = node.input.first().filter(|n| !n.is_empty());
        match node.op_type.as_str() {
            "Cast" => node
                .attribute
                .iter()
                .find(|a| a.name == "to")
                .map(|a| a.i as i32),
            "CastLike" => self.elem_types.get(node.input.get(1)?).copied(),
            "QuantizeLinear" => match node.input.get(2).filter(|n| !n.is_empty()) {
                Some(zp) => self.elem_types.get(zp).copied(),
                None => node
                    .attribute
                    .iter()
                    .find(|a| a.name == "output_dtype")
                    .map(|a| a.i as i32),
            },
            "Constant" => node
                .attribute
                .iter()
                .find(|a| a.name == "value")
                .and_then(|a| a.t.as_ref())
                .map(|t| t.data_type),
            "Identity" | "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Transpose"
            | "Expand" | "Tile" | "Slice" | "Gather" | "Concat" | "Add" | "Sub" | "Mul" | "Div"
            | "Mod" | "Max" | "Min" | "BitShift" => self.elem_types.get(first?).copied(),
            _ => None,
        }
    }

    /// A fresh graph name made from `name` (invalid characters become `_`).
    pub(super) fn fresh(&mut self, name: &str) -> String {
        let base = match sanitize(name) {
            s if s.is_empty() => "v".to_string(),
            s => s,
        };
        let mut n = base.clone();
        let mut k = 1;
        while self.used.contains(&n) || self.g.value(&n).is_some() {
            n = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(n.clone());
        n
    }

    /// Binds an ONNX value name.
    pub(super) fn bind(&mut self, name: &str, v: Val) {
        self.vals.insert(name.to_string(), v);
    }

    /// Adds a graph input for ONNX input `name`; returns its graph name.
    pub(super) fn add_input(&mut self, name: &str, ty: TensorType) -> Result<String> {
        let gname = self.fresh(name);
        let id = self.g.add_input(&gname, ty)?;
        self.bind(name, Val::node(id));
        self.onnx_names.insert(gname.clone(), name.to_string());
        Ok(gname)
    }

    /// The value named `name`, with its graph node made if it was only known.
    pub(super) fn materialize(&mut self, name: &str) -> Result<ValueId> {
        let v = self
            .vals
            .get(name)
            .cloned()
            .ok_or_else(|| undefined(name))?;
        if let Some(id) = v.id {
            return Ok(id);
        }
        let Some(t) = v.known else {
            bail!(
                Value,
                "internal: the value '{name}' is neither a node nor known"
            );
        };
        let id = self.constant(name, &t)?;
        if let Some(entry) = self.vals.get_mut(name) {
            entry.id = Some(id);
        }
        Ok(id)
    }

    /// A graph node holding `t`: inline when small, a parameter otherwise.
    pub(super) fn constant(&mut self, name: &str, t: &Tensor) -> Result<ValueId> {
        if self.sampling
            && self.from_sizes.contains(name)
            && let Some(id) = self.sized_constant(t)?
        {
            return Ok(id);
        }
        if self.inline_all || t.numel() <= INLINE_MAX {
            return self
                .g
                .add_op(Op::Constant(crate::runtime::literal(t)?), &[]);
        }
        let gname = self.fresh(name);
        let id = self.g.add_input(&gname, t.ttype())?;
        self.weights.push((gname, t.clone()));
        Ok(id)
    }

    /// When sampling, a known tensor computed from the inputs' sizes, written as the op that
    /// makes it where it has such a pattern (every element equal: `full`; a range along its
    /// last dim, the same in every row: `arange`, expanded), so that its sizes are
    /// attributes the symbols can write rather than data; `None` otherwise.
    fn sized_constant(&mut self, t: &Tensor) -> Result<Option<ValueId>> {
        let v = t.to_f64_vec();
        let dtype = t.dtype();
        let shape = t.shape().to_vec();
        if v.len() < 2 || v.len() != t.numel() {
            return Ok(None);
        }
        let scalar = |x: f64| match dtype {
            DType::Bool => Scalar::Bool(x != 0.0),
            d if d.is_float() => Scalar::Float(x),
            _ => Scalar::Int(x as i64),
        };
        if v.iter().all(|x| x.to_bits() == v[0].to_bits()) {
            let full = Op::Full {
                size: shape,
                fill_value: scalar(v[0]),
                dtype: Some(dtype),
            };
            return self.g.add_op(full, &[]).map(Some);
        }
        let n = shape.last().copied().unwrap_or(0);
        let (a, d) = (v[0], v.get(1).map_or(0.0, |x| x - v[0]));
        let whole = |x: f64| x.fract() == 0.0 && x.abs() < (1u64 << 52) as f64;
        let ranged = n >= 2
            && dtype != DType::Bool
            && whole(a)
            && whole(d)
            && d != 0.0
            && v.iter()
                .enumerate()
                .all(|(i, &x)| x == a + (i % n) as f64 * d);
        if !ranged {
            return Ok(None);
        }
        let range = Op::Arange {
            start: Scalar::Int(a as i64),
            end: Scalar::Int((a + n as f64 * d) as i64),
            step: Scalar::Int(d as i64),
            dtype: Some(dtype),
        };
        let mut id = self.g.add_op(range, &[])?;
        if shape.len() > 1 {
            let size = shape.iter().map(|&s| s as i64).collect();
            id = self.g.add_op(Op::Expand { size }, &[id])?;
        }
        Ok(Some(id))
    }

    /// Records that the graph holds only for the given value of input `name`.
    fn specialize(&self, name: &str) {
        let mut s = self.specialized.borrow_mut();
        if !s.iter().any(|n| n == name) {
            s.push(name.to_string());
        }
    }

    /// The elements of graph value `name`, computed at import on the reference interpreter
    /// from the given values of the inputs it depends on (the import is then specialized to
    /// them); `None` where one of those inputs has no given value.
    fn computed(&self, name: &str) -> Result<Option<Tensor>> {
        if let Some(t) = self.computed.borrow().get(name) {
            return Ok(Some(t.clone()));
        }
        let Some(id) = self.vals.get(name).and_then(|v| v.id) else {
            return Ok(None);
        };
        if self.values.is_empty() {
            return Ok(None);
        }
        // the model inputs the value depends on: the import is specialized to those only
        let mut ancestors = std::collections::HashSet::new();
        let mut stack = vec![id];
        while let Some(v) = stack.pop() {
            if ancestors.insert(v) {
                stack.extend(self.g.operands(v));
            }
        }
        let mut g = self.g.clone();
        g.set_outputs(vec![id]);
        let g = crate::passes::simplify::dce(&g)?;
        let mut inputs = Vec::new();
        let mut used = Vec::new();
        for &v in g.inputs() {
            let gname = g.node(v).name.clone();
            let t = if let Some((_, w)) = self.weights.iter().find(|(n, _)| *n == gname) {
                w.clone()
            } else if let Some(o) = self.onnx_names.get(&gname)
                && let Some(t) = self.values.get(o)
            {
                if self.g.value(&gname).is_some_and(|a| ancestors.contains(&a)) {
                    used.push(o.clone());
                }
                t.clone()
            } else {
                return Ok(None);
            };
            inputs.push((gname, t));
        }
        let t = interp::run(&g, &inputs)?.remove(0);
        for n in used {
            self.specialize(&n);
        }
        self.computed
            .borrow_mut()
            .insert(name.to_string(), t.clone());
        Ok(Some(t))
    }

    pub(super) fn get(&self, name: &str) -> Result<&Val> {
        self.vals.get(name).ok_or_else(|| undefined(name))
    }

    /// Imports the nodes of `graph` in order.
    pub(super) fn nodes(&mut self, graph: &GraphProto) -> Result<()> {
        for (index, node) in graph.node.iter().enumerate() {
            self.node(node, index)
                .map_err(|e| in_node(e, node, index))?;
        }
        Ok(())
    }

    fn node(&mut self, node: &NodeProto, index: usize) -> Result<()> {
        let lower = match node.domain.as_str() {
            "" | "ai.onnx" => {
                if self.opset == 0 {
                    bail!(Value, "the model imports no version of the standard ops");
                }
                ops::find(&node.op_type, self.opset)
            }
            d @ (ops::TRAINING_DOMAIN | ops::PREVIEW_DOMAIN) => ops::find_preview(d, &node.op_type),
            other => bail!(
                Value,
                "ONNX op '{}' of domain '{other}' ({}) is not supported",
                node.op_type,
                node_label(node, index)
            ),
        };
        let lower = lower.ok_or_else(|| {
            Error::Value(format!(
                "ONNX op '{}' (opset {}, {}) is not supported",
                node.op_type,
                self.opset,
                node_label(node, index)
            ))
        })?;
        for name in node.input.iter().filter(|n| !n.is_empty()) {
            self.get(name)?;
        }
        let all_known = node
            .input
            .iter()
            .filter(|n| !n.is_empty())
            .all(|n| self.vals[n].known.is_some());
        let folded = if all_known && !ops::never_folded(&node.op_type) {
            self.fold(lower, node)?
        } else {
            None
        };
        let outs = match folded {
            Some(outs) => outs,
            None => lower(&mut Cx { imp: self, node })?,
        };
        if self.sampling && self.computed_from_sizes(node) {
            let outputs = node.output.iter().filter(|n| !n.is_empty()).cloned();
            self.from_sizes.extend(outputs);
        }
        let wanted = node.output.iter().filter(|n| !n.is_empty()).count();
        for (i, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let v = outs.get(i).cloned().ok_or_else(|| {
                Error::Value(format!(
                    "ONNX op '{}' gives {} output{} here, but the node names {wanted}",
                    node.op_type,
                    outs.len(),
                    if outs.len() == 1 { "" } else { "s" }
                ))
            })?;
            self.check_size(&v)?;
            self.bind(name, v);
        }
        if let (Some(t), Some(out)) = (self.output_elem_type(node), node.output.first()) {
            self.set_elem_type(out, t);
        }
        Ok(())
    }

    /// Whether `node`'s results depend on the inputs' sizes: the shape of a value that is not
    /// a constant, or anything computed from such a result.
    fn computed_from_sizes(&self, node: &NodeProto) -> bool {
        let inputs = node.input.iter().filter(|n| !n.is_empty());
        match node.op_type.as_str() {
            "Shape" | "Size" => inputs
                .into_iter()
                .any(|n| self.from_sizes.contains(n) || self.vals[n].known.is_none()),
            _ => inputs.into_iter().any(|n| self.from_sizes.contains(n)),
        }
    }

    /// Refuses a value larger than any graph should hold.
    fn check_size(&self, v: &Val) -> Result<()> {
        let ty = match (&v.known, v.id) {
            (Some(t), _) => t.ttype(),
            (None, Some(id)) => self.g.node(id).ty.clone(),
            (None, None) => return Ok(()),
        };
        let bytes = ty
            .shape
            .iter()
            .try_fold(ty.dtype.size(), |n, &d| n.checked_mul(d));
        if bytes.is_none_or(|b| b > VALUE_MAX_BYTES) {
            bail!(
                Value,
                "a value of {} {:?} is larger than smelt holds ({VALUE_MAX_BYTES} bytes)",
                ty.dtype,
                ty.shape
            );
        }
        Ok(())
    }

    /// Runs `lower` on known inputs: in a scratch graph whose inputs are inline constants,
    /// evaluated on the reference interpreter. `None` where the results would be much larger
    /// than the inputs (`ConstantOfShape`, `Expand`, `Tile`): those stay ops of the graph
    /// rather than becoming large parameters.
    fn fold(&mut self, lower: Lower, node: &NodeProto) -> Result<Option<Vec<Val>>> {
        let mut scratch = Importer::new("fold", self.opset);
        scratch.inline_all = true;
        let mut in_elems = 0;
        for name in node.input.iter().filter(|n| !n.is_empty()) {
            let v = self.vals[name].clone_known();
            in_elems += v.known.as_ref().map_or(0, Tensor::numel);
            scratch.bind(name, v);
            if let Some(&t) = self.elem_types.get(name) {
                scratch.elem_types.insert(name.clone(), t);
            }
        }
        let outs = lower(&mut Cx {
            imp: &mut scratch,
            node,
        })?;
        let mut ids = Vec::new();
        let mut out_elems = 0usize;
        for v in &outs {
            scratch.check_size(v)?;
            match (&v.known, v.id) {
                (Some(t), _) => out_elems = out_elems.saturating_add(t.numel()),
                (None, Some(id)) => {
                    ids.push(id);
                    let n: usize = scratch.g.node(id).ty.shape.iter().product();
                    out_elems = out_elems.saturating_add(n);
                }
                (None, None) => bail!(Value, "internal: an output is neither known nor a node"),
            }
        }
        if ids.is_empty() {
            // known results only; any node ids they carry belong to the scratch graph
            return Ok(Some(outs.iter().map(Val::clone_known).collect()));
        }
        // when sampling, what is computed from the sizes stays an op unless it is a shape
        // (a few elements): folded, a larger result would be data that varies with them
        let sized = self.sampling && self.computed_from_sizes(node);
        let limit = match (self.sampling, sized) {
            (true, true) => 8,
            (true, false) => INLINE_MAX.max(in_elems),
            (false, _) => FOLD_MIN_ELEMS.max(in_elems.saturating_mul(4)),
        };
        if out_elems > limit {
            return Ok(None);
        }
        scratch.g.set_outputs(ids.clone());
        let mut results = interp::run::<&str>(&scratch.g, &[])?.into_iter();
        Ok(Some(
            outs.into_iter()
                .map(|v| match v.known {
                    Some(t) => Val::known(t),
                    None => Val::known(results.next().expect("one result per output")),
                })
                .collect(),
        ))
    }
}

impl Val {
    fn clone_known(&self) -> Val {
        Val {
            id: None,
            known: self.known.clone(),
        }
    }
}

/// `name` with every character the text format cannot spell replaced by `_`.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    debug_assert!(s.is_empty() || is_valid_name(&s));
    s
}

fn undefined(name: &str) -> Error {
    Error::Value(format!(
        "the value '{name}' is used before any input, initializer or earlier node defines it \
         (a missing input, or a cycle)"
    ))
}

fn node_label(node: &NodeProto, index: usize) -> String {
    if node.name.is_empty() {
        format!("node #{index}")
    } else {
        format!("node '{}'", node.name)
    }
}

/// Prefixes an error with the node it came from, unless it names it already.
fn in_node(e: Error, node: &NodeProto, index: usize) -> Error {
    let label = node_label(node, index);
    let msg = e.to_string();
    if msg.contains(&label) {
        return e;
    }
    Error::Value(format!("{} ({label}): {msg}", node.op_type))
}

/// What a lowering function sees: the importer and the node it lowers.
pub struct Cx<'a> {
    pub(super) imp: &'a mut Importer,
    pub(super) node: &'a NodeProto,
}

impl Cx<'_> {
    /// The opset of the standard ops the model imports.
    pub fn opset(&self) -> i64 {
        self.imp.opset
    }

    /// The number of inputs the node names (absent optional ones included).
    pub fn n_inputs(&self) -> usize {
        self.node.input.len()
    }

    /// Whether input `i` is given.
    pub fn has(&self, i: usize) -> bool {
        self.node.input.get(i).is_some_and(|n| !n.is_empty())
    }

    /// Input `i` as a graph value (an error when absent).
    pub fn x(&mut self, i: usize) -> Result<ValueId> {
        match self.opt(i)? {
            Some(v) => Ok(v),
            None => bail!(Value, "input {i} is required"),
        }
    }

    /// Input `i` as a graph value, `None` when absent.
    pub fn opt(&mut self, i: usize) -> Result<Option<ValueId>> {
        if !self.has(i) {
            return Ok(None);
        }
        let name = self.node.input[i].clone();
        self.imp.materialize(&name).map(Some)
    }

    /// Every input, as graph values (for variadic ops).
    pub fn all(&mut self) -> Result<Vec<ValueId>> {
        let present: Vec<usize> = (0..self.n_inputs()).filter(|&i| self.has(i)).collect();
        present.into_iter().map(|i| self.x(i)).collect()
    }

    /// Input `i`'s value as given, known or not (an error when absent).
    pub fn val(&self, i: usize) -> Result<Val> {
        if !self.has(i) {
            bail!(Value, "input {i} is required");
        }
        self.imp.get(&self.node.input[i]).cloned()
    }

    /// Input `i`'s ONNX element type.
    pub fn elem_type(&self, i: usize) -> Result<i32> {
        if !self.has(i) {
            bail!(Value, "input {i} is required");
        }
        self.imp.elem_type(&self.node.input[i])
    }

    /// Input `i`'s elements when known at import.
    pub fn known(&self, i: usize) -> Option<&Tensor> {
        if !self.has(i) {
            return None;
        }
        self.imp
            .vals
            .get(&self.node.input[i])
            .and_then(|v| v.known.as_ref())
    }

    /// Input `i`'s elements for an op that needs them at import: known, or the value of a
    /// graph input given at import (the graph is then specialized to that value).
    fn needed(&self, i: usize, what: &str) -> Result<Option<Tensor>> {
        if !self.has(i) {
            return Ok(None);
        }
        if let Some(t) = self.known(i) {
            return Ok(Some(t.clone()));
        }
        let name = &self.node.input[i];
        if let Some(t) = self.imp.values.get(name) {
            self.imp.specialize(name);
            return Ok(Some(t.clone()));
        }
        if let Some(t) = self.imp.computed(name)? {
            return Ok(Some(t));
        }
        bail!(
            Value,
            "the {what} (input {i}, '{name}') must be known when the model is imported, \
             but it is computed from the inputs' values"
        )
    }

    /// Input `i`'s elements as integers; it must be known at import (a shape, axes, ...).
    pub fn ints_input(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        self.needed(i, what)?.as_ref().map(ints_of).transpose()
    }

    /// Input `i`'s elements as floats; it must be known at import.
    pub fn floats_input(&self, i: usize, what: &str) -> Result<Option<Vec<f64>>> {
        self.needed(i, what)?
            .map(|t| t.to_dtype(DType::F64)?.contiguous()?.to_vec::<f64>())
            .transpose()
    }

    /// The type of a graph value.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.imp.g.node(v).ty
    }

    /// The sizes of a graph value.
    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.ty(v).shape.clone()
    }

    /// The rank of a graph value.
    pub fn rank(&self, v: ValueId) -> i64 {
        self.ty(v).shape.len() as i64
    }

    /// The dtype of a graph value.
    pub fn dtype(&self, v: ValueId) -> DType {
        self.ty(v).dtype
    }

    /// The smelt op `name` (its `.smelt` text name) applied to `operands` (`None`: an
    /// optional operand left out) with `attrs`.
    pub fn call(
        &mut self,
        name: &str,
        operands: &[Option<ValueId>],
        attrs: &[(&str, Attr)],
    ) -> Result<ValueId> {
        let slots: Vec<bool> = operands.iter().map(Option::is_some).collect();
        let op = Op::from_call(name, &slots, attrs)?;
        let present: Vec<ValueId> = operands.iter().flatten().copied().collect();
        self.imp.g.add_op(op, &present)
    }

    /// The smelt op `name` on `operands`, every one present, without attributes (the
    /// common case of [`Cx::call`]).
    pub fn op(&mut self, name: &str, operands: &[ValueId]) -> Result<ValueId> {
        let present: Vec<Option<ValueId>> = operands.iter().map(|&v| Some(v)).collect();
        self.call(name, &present, &[])
    }

    /// `x name s`, `s` a 0-d constant of `x`'s dtype (`with_scalar("mul", x, 0.5)`).
    pub fn with_scalar(&mut self, name: &str, x: ValueId, s: f64) -> Result<ValueId> {
        let c = self.scalar(s, self.dtype(x))?;
        self.op(name, &[x, c])
    }

    /// A 0-d constant `value` of dtype `dtype` (converted from f64, so integers up to 2^53
    /// are exact).
    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<ValueId> {
        let t = Tensor::from_vec(vec![value], &[])?.to_dtype(dtype)?;
        self.imp
            .g
            .add_op(Op::Constant(crate::runtime::literal(&t)?), &[])
    }

    /// A constant tensor (inline when small, a parameter otherwise).
    pub fn tensor(&mut self, t: &Tensor) -> Result<ValueId> {
        let name = self.node.output.first().cloned().unwrap_or_default();
        self.imp.constant(&format!("{name}_const"), t)
    }

    /// The attribute `name`, if the node has it.
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name == name)
    }

    /// An integer attribute.
    pub fn int(&self, name: &str, default: i64) -> Result<i64> {
        match self.attr(name) {
            None => Ok(default),
            Some(a) if a.r#type == attribute_type::INT || a.r#type == 0 => Ok(a.i),
            Some(_) => bail!(Value, "attribute '{name}' should be an integer"),
        }
    }

    /// A float attribute.
    pub fn float(&self, name: &str, default: f64) -> Result<f64> {
        match self.attr(name) {
            None => Ok(default),
            Some(a) if a.r#type == attribute_type::FLOAT || a.r#type == 0 => Ok(a.f as f64),
            Some(_) => bail!(Value, "attribute '{name}' should be a float"),
        }
    }

    /// An integer-list attribute.
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == attribute_type::INTS || a.r#type == 0 => {
                Ok(Some(a.ints.clone()))
            }
            Some(_) => bail!(Value, "attribute '{name}' should be a list of integers"),
        }
    }

    /// A float-list attribute.
    pub fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == attribute_type::FLOATS || a.r#type == 0 => {
                Ok(Some(a.floats.clone()))
            }
            Some(_) => bail!(Value, "attribute '{name}' should be a list of floats"),
        }
    }

    /// A string attribute.
    pub fn string(&self, name: &str) -> Result<Option<String>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == attribute_type::STRING || a.r#type == 0 => {
                Ok(Some(String::from_utf8_lossy(&a.s).into_owned()))
            }
            Some(_) => bail!(Value, "attribute '{name}' should be a string"),
        }
    }

    /// A string-list attribute.
    pub fn strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == attribute_type::STRINGS || a.r#type == 0 => Ok(Some(
                a.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )),
            Some(_) => bail!(Value, "attribute '{name}' should be a list of strings"),
        }
    }

    /// A tensor attribute, decoded.
    pub fn tensor_attr(&self, name: &str) -> Result<Option<Tensor>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) => match &a.t {
                Some(t) if a.r#type == attribute_type::TENSOR || a.r#type == 0 => {
                    to_tensor(t, None).map(Some)
                }
                _ => bail!(Value, "attribute '{name}' should be a tensor"),
            },
        }
    }

    /// An element-type attribute (`Cast`'s `to`).
    pub fn dtype_attr(&self, name: &str) -> Result<Option<DType>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) => dtype_of(a.i as i32).map(Some),
        }
    }
}

/// A known tensor's elements as integers.
pub fn ints_of(t: &Tensor) -> Result<Vec<i64>> {
    if t.dtype().is_float() {
        bail!(DType, "expected integers, got a tensor of {}", t.dtype());
    }
    t.to_dtype(DType::I64)?.contiguous()?.to_vec::<i64>()
}

/// Reads a model's external data relative to `dir` (see [`to_tensor`]).
pub(super) fn initializer(t: &super::proto::TensorProto, dir: Option<&Path>) -> Result<Tensor> {
    to_tensor(t, dir)
}
