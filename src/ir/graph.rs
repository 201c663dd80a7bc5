//! The graph IR: a petgraph DAG whose nodes are values (graph inputs or op results, each with
//! its dtype and shape) and whose edges run from an operand to its user, weighted by the
//! operand's position.

use super::dtype::{DType, Scalar};
use super::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use crate::{Error, Result, bail};
use petgraph::Direction;
use petgraph::stable_graph::StableDiGraph;
use petgraph::visit::EdgeRef;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A value of a graph (the node that defines it).
pub type ValueId = petgraph::stable_graph::NodeIndex;

/// What defines a value.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// A named graph input.
    Input {
        /// The input's name.
        name: String,
    },
    /// The result of an op.
    Op(Op),
}

/// One value: how it is defined, its type, and its name (without the `%`).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Whether it is a graph input or an op's result.
    pub kind: NodeKind,
    /// Its dtype and shape.
    pub ty: TensorType,
    /// Its name in `.smelt` text.
    pub name: String,
}

impl Node {
    /// The op that defines this value, `None` for an input.
    pub fn op(&self) -> Option<&Op> {
        match &self.kind {
            NodeKind::Op(op) => Some(op),
            NodeKind::Input { .. } => None,
        }
    }

    /// True for an unnamed Python-scalar operand (printed inline as a bare number).
    pub fn is_inline_scalar(&self) -> bool {
        matches!(self.kind, NodeKind::Op(Op::Scalar(_))) && is_anonymous(&self.name)
    }
}

/// Names the text format cannot spell (`$3`) mark anonymous scalar nodes.
pub(crate) fn is_anonymous(name: &str) -> bool {
    name.starts_with('$')
}

/// True for names the text format can spell after `%`: `[A-Za-z0-9_.]+`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// A tensor program: named inputs, op nodes, ordered outputs.
#[derive(Clone, Debug)]
pub struct Graph {
    /// The graph's name (`graph name(...)` in `.smelt` text).
    pub name: String,
    g: StableDiGraph<Node, usize>,
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    names: HashMap<String, ValueId>,
    next_name: usize,
    next_anon: usize,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            g: StableDiGraph::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            names: HashMap::new(),
            next_name: 0,
            next_anon: 0,
        }
    }

    /// Adds a named input of type `ty`.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        self.check_new_name(name)?;
        let v = self.g.add_node(Node {
            kind: NodeKind::Input {
                name: name.to_string(),
            },
            ty,
            name: name.to_string(),
        });
        self.names.insert(name.to_string(), v);
        self.inputs.push(v);
        Ok(v)
    }

    /// Adds `op` applied to `operands`, with a generated name; its type comes from `Op::infer`.
    /// Scalar ops get an anonymous name and print inline where used.
    pub fn add_op(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        let name = if matches!(op, Op::Scalar(_) | Op::Control(_)) {
            self.next_anon += 1;
            format!("${}", self.next_anon - 1)
        } else {
            self.fresh_name()
        };
        self.insert_op(op, operands, name)
    }

    /// Adds `op` applied to `operands` under the value name `name`.
    /// An anonymous name (`$3`, a scalar's or a control call's, copied from another graph)
    /// gets a fresh anonymous name instead.
    pub fn add_op_named(&mut self, op: Op, operands: &[ValueId], name: &str) -> Result<ValueId> {
        if is_anonymous(name) && matches!(op, Op::Scalar(_) | Op::Control(_)) {
            return self.add_op(op, operands);
        }
        self.check_new_name(name)?;
        self.insert_op(op, operands, name.to_string())
    }

    /// Adds control op `c` applied to `operands` and one `Result` value per result, named
    /// `names[i]` (generated names where `names` is `None`); returns the result values.
    pub fn add_control(
        &mut self,
        c: super::control::Control,
        operands: &[ValueId],
        names: Option<&[String]>,
    ) -> Result<Vec<ValueId>> {
        let tys: Vec<TensorType> = operands
            .iter()
            .map(|&o| match self.try_node(o) {
                Some(n) => Ok(n.ty.clone()),
                None => bail!(
                    Value,
                    "{}: operand {} is not a value of this graph",
                    c.name(),
                    o.index()
                ),
            })
            .collect::<Result<_>>()?;
        let results = c.result_types(&tys.iter().collect::<Vec<_>>())?;
        if let Some(n) = names
            && n.len() != results.len()
        {
            bail!(
                Value,
                "{} has {} result{} but {} name{} given",
                c.name(),
                results.len(),
                if results.len() == 1 { "" } else { "s" },
                n.len(),
                if n.len() == 1 { " is" } else { "s are" }
            );
        }
        if let Some(n) = names {
            for name in n {
                self.check_new_name(name)?;
            }
        }
        let t = self.add_op(Op::Control(Box::new(c)), operands)?;
        results
            .into_iter()
            .enumerate()
            .map(|(index, ty)| {
                let op = Op::Result { index, ty };
                match names {
                    Some(n) => self.add_op_named(op, &[t], &n[index]),
                    None => self.add_op(op, &[t]),
                }
            })
            .collect()
    }

    /// The control op of a `Result` value and the result's index.
    pub fn result_of(&self, v: ValueId) -> Option<(ValueId, usize)> {
        match self.try_node(v)?.op()? {
            Op::Result { index, .. } => Some((*self.operands(v).first()?, *index)),
            _ => None,
        }
    }

    /// The `Result` values of control node `t`, by result index (`None` where a result has
    /// no value: nothing used it).
    pub fn results_of(&self, t: ValueId) -> Vec<Option<ValueId>> {
        let n = match self.try_node(t).and_then(Node::op) {
            Some(Op::Control(c)) => {
                let tys: Vec<&TensorType> =
                    self.operands(t).iter().map(|&o| &self.g[o].ty).collect();
                c.result_types(&tys).map_or(0, |r| r.len())
            }
            _ => 0,
        };
        let mut out = vec![None; n];
        for u in self.users(t) {
            if let Some((_, i)) = self.result_of(u)
                && i < n
            {
                out[i] = Some(u);
            }
        }
        out
    }

    /// Reorders the inputs: `order[k]` is the position of the input that becomes input `k`
    /// (a permutation of `0..inputs().len()`).
    pub fn permute_inputs(&mut self, order: &[usize]) -> Result<()> {
        let mut seen = vec![false; self.inputs.len()];
        if order.len() != self.inputs.len()
            || order
                .iter()
                .any(|&i| i >= seen.len() || std::mem::replace(&mut seen[i], true))
        {
            bail!(
                Value,
                "graph {}: not a permutation of its inputs",
                self.name
            );
        }
        self.inputs = order.iter().map(|&i| self.inputs[i]).collect();
        Ok(())
    }

    /// Adds a Python-scalar operand node.
    pub fn add_scalar(&mut self, s: impl Into<Scalar>) -> Result<ValueId> {
        self.add_op(Op::Scalar(s.into()), &[])
    }

    fn insert_op(&mut self, op: Op, operands: &[ValueId], name: String) -> Result<ValueId> {
        for &o in operands {
            if !self.g.contains_node(o) {
                bail!(
                    Value,
                    "{}: operand {} is not a value of this graph",
                    op.name(),
                    o.index()
                );
            }
        }
        let ty = {
            let tys: Vec<&TensorType> = operands.iter().map(|&o| &self.g[o].ty).collect();
            op.infer(&tys)?
        };
        let v = self.g.add_node(Node {
            kind: NodeKind::Op(op),
            ty,
            name: name.clone(),
        });
        for (i, &o) in operands.iter().enumerate() {
            self.g.add_edge(o, v, i);
        }
        self.names.insert(name, v);
        Ok(v)
    }

    fn check_new_name(&self, name: &str) -> Result<()> {
        if !is_valid_name(name) {
            bail!(
                Value,
                "invalid value name '{name}': use letters, digits, '_' and '.'"
            );
        }
        if self.names.contains_key(name) {
            bail!(Value, "value %{name} defined twice");
        }
        Ok(())
    }

    fn fresh_name(&mut self) -> String {
        loop {
            let n = self.next_name.to_string();
            self.next_name += 1;
            if !self.names.contains_key(&n) {
                return n;
            }
        }
    }

    /// Makes generated names (`%17`) skip every numeric name of `other`, so that a pass
    /// copying `other`'s values under their names can add new values before them.
    pub fn avoid_names_of(&mut self, other: &Graph) {
        let top = other
            .names
            .keys()
            .filter_map(|n| n.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1);
        self.next_name = self.next_name.max(top);
    }

    /// Sets the graph's results, in order.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) {
        self.outputs = outputs;
    }

    /// The graph's inputs, in order.
    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }

    /// The graph's results, in order.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// The node defining `v`. Panics if `v` is not a value of this graph.
    pub fn node(&self, v: ValueId) -> &Node {
        &self.g[v]
    }

    /// The node defining `v`, if `v` is a value of this graph.
    pub fn try_node(&self, v: ValueId) -> Option<&Node> {
        self.g.node_weight(v)
    }

    /// The value named `name` (without `%`).
    pub fn value(&self, name: &str) -> Option<ValueId> {
        self.names.get(name).copied()
    }

    /// Whether value `v` may share memory with a graph input, as PyTorch's result would: an
    /// input itself, or a view, `reshape`, `flatten`, `contiguous` or same-dtype `to` of one
    /// (ops that may return their operand's memory). Any other op makes new memory.
    pub fn may_alias_input(&self, v: ValueId) -> bool {
        let mut v = v;
        loop {
            let Some(node) = self.try_node(v) else {
                return false;
            };
            let same = match node.op() {
                None => return true,
                Some(op) if op.keeps_elements() => true,
                Some(Op::To { .. }) => true,
                Some(_) => false,
            };
            let ops = self.operands(v);
            match (same, ops.first()) {
                (true, Some(&a)) if self.node(a).ty.dtype == node.ty.dtype => v = a,
                _ => return false,
            }
        }
    }

    /// The operands of `v` in operand order.
    pub fn operands(&self, v: ValueId) -> Vec<ValueId> {
        let mut e: Vec<(usize, ValueId)> = self
            .g
            .edges_directed(v, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        e.sort_by_key(|&(i, _)| i);
        e.into_iter().map(|(_, s)| s).collect()
    }

    /// The values that use `v` (each once, in no particular order).
    pub fn users(&self, v: ValueId) -> Vec<ValueId> {
        let mut u: Vec<ValueId> = self.g.neighbors_directed(v, Direction::Outgoing).collect();
        u.sort();
        u.dedup();
        u
    }

    /// Number of values (nodes), scalar operands included.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// Whether the graph has no values.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// Every node, operands before users; among ready nodes the earliest added comes first,
    /// so a graph built in order keeps its order. Nodes on a cycle are left out.
    pub fn topo_order(&self) -> Vec<ValueId> {
        let mut indeg: HashMap<ValueId, usize> = HashMap::new();
        let mut ready = BinaryHeap::new();
        for v in self.g.node_indices() {
            let d = self.g.edges_directed(v, Direction::Incoming).count();
            indeg.insert(v, d);
            if d == 0 {
                ready.push(Reverse(v));
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(v)) = ready.pop() {
            order.push(v);
            for e in self.g.edges_directed(v, Direction::Outgoing) {
                if let Some(d) = indeg.get_mut(&e.target()) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Reverse(e.target()));
                    }
                }
            }
        }
        order
    }

    /// The underlying petgraph graph (nodes = values, edge weight = operand position).
    pub fn petgraph(&self) -> &StableDiGraph<Node, usize> {
        &self.g
    }

    /// The underlying petgraph graph, for passes that rewrite in place. Node names must stay
    /// those of the name table; run `verify` afterwards.
    pub fn petgraph_mut(&mut self) -> &mut StableDiGraph<Node, usize> {
        &mut self.g
    }

    /// Checks the graph's invariants: unique valid names, inputs are exactly the input
    /// nodes, operand positions are `0..n`, every op's recorded type is what `Op::infer`
    /// gives, outputs exist, and there is no cycle.
    pub fn verify(&self) -> Result<()> {
        super::verify::verify(self)
    }

    /// Graphviz text of the graph: one node per value labelled with its name, op and type.
    /// The bodies of control ops are clusters of their own, each joined to the op that
    /// calls it by a dashed edge.
    pub fn to_dot(&self) -> String {
        let bodies = super::control::Control::bodies_of(self);
        let mut graphs: Vec<&Graph> = vec![self];
        graphs.extend(bodies.iter().map(|b| b.as_ref()));
        let mut s = String::from("digraph {\n    compound=true\n");
        let id = |gi: usize, v: ValueId| format!("g{gi}_{}", v.index());
        let mut calls = Vec::new();
        for (gi, g) in graphs.iter().enumerate() {
            if graphs.len() > 1 {
                s += &format!("    subgraph cluster_{gi} {{\n    label=\"@{}\"\n", g.name);
            }
            for v in g.topo_order() {
                let n = g.node(v);
                let what = match &n.kind {
                    NodeKind::Input { .. } => "input".to_string(),
                    NodeKind::Op(Op::Scalar(x)) => format!("scalar {x}"),
                    NodeKind::Op(op) => op.name().to_string(),
                };
                let label = format!("%{} = {}\\n{}", n.name, what, super::text::fmt_type(&n.ty));
                s += &format!(
                    "    {} [ label=\"{}\" ]\n",
                    id(gi, v),
                    label.replace('"', "\\\"")
                );
                if let Some(Op::Control(c)) = n.op() {
                    for (role, b) in c.kind.body_names().iter().zip(&c.bodies) {
                        if let Some(bi) = graphs.iter().position(|h| h.name == b.0.name) {
                            calls.push((id(gi, v), bi, role.to_string()));
                        }
                    }
                }
            }
            if graphs.len() > 1 {
                s += "    }\n";
            }
            for e in g.g.edge_indices() {
                if let Some((a, b)) = g.g.edge_endpoints(e) {
                    s += &format!(
                        "    {} -> {} [ label=\"{}\" ]\n",
                        id(gi, a),
                        id(gi, b),
                        g.g[e]
                    );
                }
            }
        }
        for (from, bi, role) in calls {
            if let Some(&first) = graphs[bi].inputs().first().or(graphs[bi].outputs().first()) {
                s += &format!(
                    "    {from} -> {} [ style=dashed, lhead=cluster_{bi}, label=\"{role}\" ]\n",
                    id(bi, first)
                );
            }
        }
        s.push_str("}\n");
        s
    }

    pub(crate) fn names(&self) -> &HashMap<String, ValueId> {
        &self.names
    }
}

/// Structural equality: same name, inputs, op nodes (matched by value name) with the same
/// op, attributes, type and operands in order, and same outputs. Anonymous scalar operands
/// compare by value, not by name or node index.
impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        let named = |g: &Graph| {
            g.g.node_indices()
                .filter(|&v| !g.g[v].is_inline_scalar())
                .count()
        };
        let same_value = |a: ValueId, b: ValueId| {
            let (na, nb) = (&self.g[a], &other.g[b]);
            if na.is_inline_scalar() || nb.is_inline_scalar() {
                na.is_inline_scalar()
                    && nb.is_inline_scalar()
                    && na.kind == nb.kind
                    && na.ty == nb.ty
            } else {
                na.name == nb.name
            }
        };
        if self.name != other.name
            || named(self) != named(other)
            || self.inputs.len() != other.inputs.len()
            || self.outputs.len() != other.outputs.len()
        {
            return false;
        }
        let ins = self.inputs.iter().zip(&other.inputs);
        if !ins.clone().all(|(&a, &b)| self.g[a] == other.g[b]) {
            return false;
        }
        if !self
            .outputs
            .iter()
            .zip(&other.outputs)
            .all(|(&a, &b)| same_value(a, b))
        {
            return false;
        }
        self.g
            .node_indices()
            .filter(|&v| !self.g[v].is_inline_scalar())
            .all(|v| {
                let n = &self.g[v];
                let Some(w) = other.value(&n.name) else {
                    return false;
                };
                let m = &other.g[w];
                let (oa, ob) = (self.operands(v), other.operands(w));
                n.kind == m.kind
                    && n.ty == m.ty
                    && oa.len() == ob.len()
                    && oa.iter().zip(&ob).all(|(&a, &b)| same_value(a, b))
            })
    }
}

/// A `.smelt` file: one or more graphs; the first is the entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// The graphs, entry first.
    pub graphs: Vec<Graph>,
}

impl Module {
    /// The first graph. Panics on a module without graphs (the parser never makes one).
    pub fn entry(&self) -> &Graph {
        &self.graphs[0]
    }

    /// The graph called `name`.
    pub fn get(&self, name: &str) -> Option<&Graph> {
        self.graphs.iter().find(|g| g.name == name)
    }

    /// The graph called `name`, or the first when `name` is None (the command line's
    /// `--graph`).
    pub fn pick(&self, name: Option<&str>) -> Result<&Graph> {
        match name {
            Some(n) => self.graph(n),
            None => self
                .graphs
                .first()
                .ok_or_else(|| Error::Value("the model has no graph".into())),
        }
    }

    /// The graph called `name`, or an error listing the graphs there are.
    pub fn graph(&self, name: &str) -> Result<&Graph> {
        self.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.graphs.iter().map(|g| g.name.as_str()).collect();
            Error::Value(format!(
                "no graph named '{name}' (the file has: {})",
                names.join(", ")
            ))
        })
    }
}

/// Builds a graph op by op with methods named like the ops; `finish` verifies the result.
///
/// ```
/// use smelt::ir::graph::GraphBuilder;
/// use smelt::DType;
/// let mut b = GraphBuilder::new("mlp");
/// let x = b.input("x", DType::F32, &[2, 3]).unwrap();
/// let r = b.relu(x).unwrap();
/// let y = b.mul_scalar(r, 0.5).unwrap();
/// let g = b.finish(&[y]).unwrap();
/// assert_eq!(g.outputs().len(), 1);
/// ```
pub struct GraphBuilder {
    g: Graph,
}

impl GraphBuilder {
    /// Starts an empty graph called `name`.
    pub fn new(name: &str) -> GraphBuilder {
        GraphBuilder {
            g: Graph::new(name),
        }
    }

    /// Adds a named input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<ValueId> {
        self.g
            .add_input(name, TensorType::new(dtype, shape.to_vec()))
    }

    /// Adds any op.
    pub fn op(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        self.g.add_op(op, operands)
    }

    /// Adds any op under a chosen value name.
    pub fn named(&mut self, name: &str, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        self.g.add_op_named(op, operands, name)
    }

    /// A Python-scalar operand.
    pub fn scalar(&mut self, s: impl Into<Scalar>) -> Result<ValueId> {
        self.g.add_scalar(s)
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.node(v).ty
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.g
    }

    /// Applies the unary op `u` to `x`.
    pub fn unary(&mut self, u: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op(Op::Unary(u), &[x])
    }

    /// Applies the binary op `b` to `x` and `y` (broadcasting).
    pub fn binary(&mut self, b: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(Op::Binary(b), &[x, y])
    }

    /// `b(x, s)` with a Python-scalar right operand.
    pub fn binary_scalar(
        &mut self,
        b: BinaryOp,
        x: ValueId,
        s: impl Into<Scalar>,
    ) -> Result<ValueId> {
        let s = self.scalar(s)?;
        self.binary(b, x, s)
    }

    /// `relu(x)`.
    pub fn relu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Relu, x)
    }
    /// `-x`.
    pub fn neg(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Neg, x)
    }
    /// `exp(x)`.
    pub fn exp(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Exp, x)
    }
    /// `tanh(x)`.
    pub fn tanh(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Tanh, x)
    }
    /// `sigmoid(x)`.
    pub fn sigmoid(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Sigmoid, x)
    }
    /// `x + y`.
    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Add, x, y)
    }
    /// `x - y`.
    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, x, y)
    }
    /// `x * y`.
    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, x, y)
    }
    /// `x / y` (true division).
    pub fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, x, y)
    }
    /// `x + s`, `s` a wrapped Python number.
    pub fn add_scalar(&mut self, x: ValueId, s: impl Into<Scalar>) -> Result<ValueId> {
        self.binary_scalar(BinaryOp::Add, x, s)
    }
    /// `x * s`, `s` a wrapped Python number.
    pub fn mul_scalar(&mut self, x: ValueId, s: impl Into<Scalar>) -> Result<ValueId> {
        self.binary_scalar(BinaryOp::Mul, x, s)
    }
    /// `matmul(x, y)`.
    pub fn matmul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(Op::Matmul, &[x, y])
    }
    /// `linear(x, weight, bias)`, bias optional.
    pub fn linear(&mut self, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        match bias {
            Some(b) => self.op(Op::Linear { has_bias: true }, &[x, w, b]),
            None => self.op(Op::Linear { has_bias: false }, &[x, w]),
        }
    }
    /// `sum(x, dim=dims, keepdim=)`; an empty `dims` sums everything.
    pub fn sum(&mut self, x: ValueId, dims: &[i64], keepdim: bool) -> Result<ValueId> {
        let dim = (!dims.is_empty()).then(|| dims.to_vec());
        self.op(
            Op::Reduce {
                op: ReduceOp::Sum,
                dim,
                keepdim,
            },
            &[x],
        )
    }
    /// `softmax(x, dim)`.
    pub fn softmax(&mut self, x: ValueId, dim: i64) -> Result<ValueId> {
        self.op(Op::Softmax { dim }, &[x])
    }
    /// `x.reshape(shape)` (one `-1` allowed).
    pub fn reshape(&mut self, x: ValueId, shape: &[i64]) -> Result<ValueId> {
        self.op(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[x],
        )
    }
    /// `x.transpose(dim0, dim1)`.
    pub fn transpose(&mut self, x: ValueId, dim0: i64, dim1: i64) -> Result<ValueId> {
        self.op(Op::Transpose { dim0, dim1 }, &[x])
    }
    /// `x.permute(dims)`.
    pub fn permute(&mut self, x: ValueId, dims: &[i64]) -> Result<ValueId> {
        self.op(
            Op::Permute {
                dims: dims.to_vec(),
            },
            &[x],
        )
    }
    /// `x.to(dtype)`.
    pub fn to(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        self.op(Op::To { dtype }, &[x])
    }
    /// `where(cond, x, y)`.
    pub fn where_(&mut self, cond: ValueId, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(Op::Where, &[cond, x, y])
    }

    /// Sets the outputs and returns the verified graph.
    pub fn finish(mut self, outputs: &[ValueId]) -> Result<Graph> {
        self.g.set_outputs(outputs.to_vec());
        self.g.verify()?;
        Ok(self.g)
    }
}
