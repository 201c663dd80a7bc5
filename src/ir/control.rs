//! Control flow as graph ops (`jax.lax` semantics): `cond`, `while_loop`, `fori_loop` and
//! `scan`, whose bodies are other graphs of the same `.smelt` file.
//!
//! A control op has several results. In the graph it is one node of [`tuple_type`] (a
//! zero-element marker that no kernel reads) followed by one
//! [`Op::Result`](super::op::Op::Result) node per result, each carrying its type; the text
//! format writes both as `%a, %b = op(...)`.
//!
//! Operands and bodies:
//! - `cond(pred, operands..)`, bodies `[then, else]`: `pred` is `bool[]`; both branches take
//!   the operands and return the same types, which are the results;
//! - `while_loop(carry..)`, bodies `[cond, body]`: `cond(carry..) -> bool[]`,
//!   `body(carry..) -> carry..`; results: the final carries;
//! - `fori_loop(lower, upper, carry..)`, body `[body]`: `lower`/`upper` are `i64[]` values
//!   (a bare integer is an inline scalar); `body(i: i64[], carry..) -> carry..`;
//! - `scan(carry.., xs..)`, body `[body]`: the `carries` first operands are carries, the rest
//!   are sliced along dim 0 (all of one length); `body(carry.., x_t..) -> (carry.., y_t..)`;
//!   results: the final carries, then the `y_t` stacked along a new dim 0.

use super::dtype::DType;
use super::graph::Graph;
use super::op::TensorType;
use crate::{Result, bail};
use std::sync::Arc;

/// The type of a control op's own node: a zero-element marker; its values are the
/// [`Op::Result`](super::op::Op::Result) nodes that follow it.
pub fn tuple_type() -> TensorType {
    TensorType::new(DType::Bool, vec![0])
}

/// Which control op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ControlKind {
    /// `cond(pred, operands.., then=@t, else=@e)`.
    Cond,
    /// `while_loop(carry.., cond=@c, body=@b)`.
    WhileLoop,
    /// `fori_loop(lower, upper, carry.., body=@b)`.
    ForiLoop,
    /// `scan(carry.., xs.., body=@b, carries=n, reverse=r)`.
    Scan {
        /// How many leading operands are carries.
        carries: usize,
        /// Walk the xs from the last slice to the first (the stacked ys keep xs' order).
        reverse: bool,
    },
}

impl ControlKind {
    /// The op's name in `.smelt` text.
    pub fn name(self) -> &'static str {
        match self {
            ControlKind::Cond => "cond",
            ControlKind::WhileLoop => "while_loop",
            ControlKind::ForiLoop => "fori_loop",
            ControlKind::Scan { .. } => "scan",
        }
    }

    /// The attribute names of the bodies, in order.
    pub fn body_names(self) -> &'static [&'static str] {
        match self {
            ControlKind::Cond => &["then", "else"],
            ControlKind::WhileLoop => &["cond", "body"],
            ControlKind::ForiLoop | ControlKind::Scan { .. } => &["body"],
        }
    }
}

/// The names of the control ops.
pub const CONTROL_OPS: [&str; 4] = ["cond", "while_loop", "fori_loop", "scan"];

/// A body graph, shared between the ops (and copies of graphs) that call it.
#[derive(Clone, Debug)]
pub struct Body(pub Arc<Graph>);

impl Body {
    /// Wraps a graph.
    pub fn new(g: Graph) -> Body {
        Body(Arc::new(g))
    }
    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.0
    }
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || super::text::print_graph(&self.0) == super::text::print_graph(&other.0)
    }
}

// A body travels (in a schedule stored by the disk cache) as its `.smelt` text.
impl serde::Serialize for Body {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&super::text::print_graph(&self.0))
    }
}

impl<'de> serde::Deserialize<'de> for Body {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Body, D::Error> {
        let text = String::deserialize(d)?;
        let m = super::text::parse_module(&text, "<body>").map_err(serde::de::Error::custom)?;
        let g =
            m.graphs.into_iter().next().ok_or_else(|| {
                serde::de::Error::custom("a body's text holds no graph".to_string())
            })?;
        Ok(Body::new(g))
    }
}

/// A control op: its kind and its bodies (in [`ControlKind::body_names`] order).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Control {
    /// Which op.
    pub kind: ControlKind,
    /// The bodies.
    pub bodies: Vec<Body>,
}

fn types(g: &Graph, values: &[super::graph::ValueId]) -> Vec<TensorType> {
    values.iter().map(|&v| plain(&g.node(v).ty)).collect()
}

/// A type without the "wrapped Python number" flag: a body's `i64[]` input accepts an
/// inline integer.
fn plain(t: &TensorType) -> TensorType {
    TensorType::new(t.dtype, t.shape.clone())
}

/// `%name` of input `i` of body `g`, for messages.
fn param(g: &Graph, i: usize) -> String {
    g.inputs()
        .get(i)
        .map_or_else(|| "?".into(), |&v| format!("%{}", g.node(v).name))
}

fn same(a: &TensorType, b: &TensorType) -> bool {
    a.dtype == b.dtype && a.shape == b.shape
}

fn fmt(t: &TensorType) -> String {
    super::text::fmt_type(t)
}

fn fmt_list(ts: &[TensorType]) -> String {
    let v: Vec<String> = ts.iter().map(fmt).collect();
    format!("({})", v.join(", "))
}

impl Control {
    /// A control op of `kind` over `bodies`.
    pub fn new(kind: ControlKind, bodies: Vec<Graph>) -> Control {
        Control {
            kind,
            bodies: bodies.into_iter().map(Body::new).collect(),
        }
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// The body called `which` (`then`, `else`, `cond`, `body`).
    pub fn body(&self, which: &str) -> Option<&Graph> {
        let i = self.kind.body_names().iter().position(|n| *n == which)?;
        self.bodies.get(i).map(Body::graph)
    }

    /// How many operands are carries (loops) or branch operands (cond).
    pub fn carry_count(&self, operands: usize) -> usize {
        match self.kind {
            ControlKind::Cond => operands.saturating_sub(1),
            ControlKind::WhileLoop => operands,
            ControlKind::ForiLoop => operands.saturating_sub(2),
            ControlKind::Scan { carries, .. } => carries.min(operands),
        }
    }

    /// The types of the results for operands of types `inputs`, after checking the bodies'
    /// signatures against them: the one typing rule of control ops.
    pub fn result_types(&self, inputs: &[&TensorType]) -> Result<Vec<TensorType>> {
        let name = self.name();
        let want = self.kind.body_names().len();
        if self.bodies.len() != want {
            bail!(
                Value,
                "{name}: expects {want} bod{} but got {}",
                if want == 1 { "y" } else { "ies" },
                self.bodies.len()
            );
        }
        let ins: Vec<TensorType> = inputs.iter().map(|t| plain(t)).collect();
        let scalar = |t: &TensorType, what: &str, d: DType| -> Result<()> {
            if t.dtype != d || !t.shape.is_empty() {
                bail!(
                    Value,
                    "{name}: {what} must be {}[] but is {}",
                    d.name(),
                    fmt(t)
                );
            }
            Ok(())
        };
        match self.kind {
            ControlKind::Cond => {
                let Some((pred, ops)) = ins.split_first() else {
                    bail!(Value, "cond: expects a predicate operand");
                };
                scalar(pred, "the predicate", DType::Bool)?;
                let then = self.check_body(0, ops, None)?;
                let other = self.check_body(1, ops, None)?;
                if then.len() != other.len() || then.iter().zip(&other).any(|(a, b)| !same(a, b)) {
                    bail!(
                        Value,
                        "cond: the branches return different types: @{} returns {} but @{} returns {}",
                        self.bodies[0].0.name,
                        fmt_list(&then),
                        self.bodies[1].0.name,
                        fmt_list(&other)
                    );
                }
                Ok(then)
            }
            ControlKind::WhileLoop => {
                let c = self.check_body(0, &ins, None)?;
                if c.len() != 1 || !same(&c[0], &TensorType::new(DType::Bool, vec![])) {
                    bail!(
                        Value,
                        "while_loop: cond @{} must return one bool[] but returns {}",
                        self.bodies[0].0.name,
                        fmt_list(&c)
                    );
                }
                self.check_body(1, &ins, Some(&ins))?;
                Ok(ins)
            }
            ControlKind::ForiLoop => {
                if ins.len() < 2 {
                    bail!(Value, "fori_loop: expects lower and upper bounds");
                }
                scalar(&ins[0], "lower", DType::I64)?;
                scalar(&ins[1], "upper", DType::I64)?;
                let carries = &ins[2..];
                let mut body_in = vec![TensorType::new(DType::I64, vec![])];
                body_in.extend(carries.iter().cloned());
                self.check_body(0, &body_in, Some(carries))?;
                Ok(carries.to_vec())
            }
            ControlKind::Scan { carries, .. } => {
                if carries > ins.len() {
                    bail!(
                        Value,
                        "scan: carries={carries} but only {} operands are given",
                        ins.len()
                    );
                }
                let (cs, xs) = ins.split_at(carries);
                let Some(first) = xs.first() else {
                    bail!(Value, "scan: expects at least one xs operand to scan over");
                };
                let Some(&len) = first.shape.first() else {
                    bail!(
                        Value,
                        "scan: xs operand 0 is 0-d; xs are sliced along dim 0"
                    );
                };
                let mut body_in = cs.to_vec();
                for (i, x) in xs.iter().enumerate() {
                    if x.shape.first() != Some(&len) {
                        bail!(
                            Value,
                            "scan: xs operand {i} is {} but the xs have length {len} along dim 0",
                            fmt(x)
                        );
                    }
                    body_in.push(TensorType::new(x.dtype, x.shape[1..].to_vec()));
                }
                let outs = self.check_body(0, &body_in, None)?;
                if outs.len() < carries {
                    bail!(
                        Value,
                        "scan: body @{} returns {} values but there are {carries} carries",
                        self.bodies[0].0.name,
                        outs.len()
                    );
                }
                for (i, (o, c)) in outs.iter().zip(cs).enumerate() {
                    if !same(o, c) {
                        let g = self.bodies[0].graph();
                        bail!(
                            Value,
                            "scan: body @{} changes carry {i} ({}) from {} to {}",
                            g.name,
                            param(g, i),
                            fmt(c),
                            fmt(o)
                        );
                    }
                }
                let mut res = cs.to_vec();
                for y in &outs[carries..] {
                    let mut shape = vec![len];
                    shape.extend(&y.shape);
                    res.push(TensorType::new(y.dtype, shape));
                }
                Ok(res)
            }
        }
    }

    /// Checks that body `i` takes `inputs` (and returns `outputs`, when given); returns its
    /// output types.
    fn check_body(
        &self,
        i: usize,
        inputs: &[TensorType],
        outputs: Option<&[TensorType]>,
    ) -> Result<Vec<TensorType>> {
        let name = self.name();
        let role = self.kind.body_names()[i];
        let g = self.bodies[i].graph();
        let got = types(g, g.inputs());
        if got.len() != inputs.len() || got.iter().zip(inputs).any(|(a, b)| !same(a, b)) {
            bail!(
                Value,
                "{name}: {role} @{} takes {} but is given {}",
                g.name,
                fmt_list(&got),
                fmt_list(inputs)
            );
        }
        let outs = types(g, g.outputs());
        if let Some(want) = outputs {
            if outs.len() != want.len() {
                bail!(
                    Value,
                    "{name}: {role} @{} returns {} values but there are {} carries",
                    g.name,
                    outs.len(),
                    want.len()
                );
            }
            // the carries are the body's last inputs (a fori_loop's index comes first)
            let first = inputs.len() - want.len();
            for (k, (o, w)) in outs.iter().zip(want).enumerate() {
                if !same(o, w) {
                    bail!(
                        Value,
                        "{name}: {role} @{} changes carry {k} ({}) from {} to {}",
                        g.name,
                        param(g, first + k),
                        fmt(w),
                        fmt(o)
                    );
                }
            }
        }
        Ok(outs)
    }

    /// Every body reached from `g` (bodies of bodies too), each once, in first-use order.
    pub fn bodies_of(g: &Graph) -> Vec<Arc<Graph>> {
        let mut out: Vec<Arc<Graph>> = Vec::new();
        collect_bodies(g, &mut out);
        out
    }
}

fn collect_bodies(g: &Graph, out: &mut Vec<Arc<Graph>>) {
    for v in g.topo_order() {
        if let Some(super::op::Op::Control(c)) = g.node(v).op() {
            for b in &c.bodies {
                if out
                    .iter()
                    .any(|h| Arc::ptr_eq(h, &b.0) || h.name == b.0.name)
                {
                    continue;
                }
                out.push(b.0.clone());
                collect_bodies(&b.0, out);
            }
        }
    }
}
