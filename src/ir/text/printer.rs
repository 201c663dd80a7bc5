//! Graph → `.smelt` text. Anonymous scalar operands print inline; every other value gets a
//! statement with its type; attributes equal to PyTorch's defaults are left out.

use super::fmt_type;
use crate::ir::control::{Control, ControlKind};
use crate::ir::graph::{Graph, Module, NodeKind, ValueId};
use crate::ir::op::{Literal, Op};
use std::fmt::Write;

/// The text of one graph, followed by the bodies its control ops call (transitively), so
/// that the text parses back on its own.
pub fn print_graph(g: &Graph) -> String {
    print_graph_with(g, None)
}

/// How a `constant`'s elements are written: in full, or (for a key that names the graph,
/// not text to read back) as what `digest` makes of the literal.
type Digest<'a> = Option<&'a dyn Fn(&Literal) -> String>;

/// [`print_graph`], every constant's `data=[..]` replaced by `digest=` what `digest` makes
/// of it: a key for a graph whose constants are large (a traced model's weights), where
/// writing every element out in decimal costs seconds per 100 MB. Not text to parse.
pub(crate) fn print_graph_digest(g: &Graph, digest: &dyn Fn(&Literal) -> String) -> String {
    print_graph_with(g, Some(digest))
}

fn print_graph_with(g: &Graph, digest: Digest) -> String {
    let mut parts = vec![print_one(g, digest)];
    for b in Control::bodies_of(g) {
        if b.name != g.name {
            parts.push(print_one(&b, digest));
        }
    }
    parts.join("\n")
}

/// The text of one graph alone.
fn print_one(g: &Graph, digest: Digest) -> String {
    let mut s = String::new();
    let params: Vec<String> = g
        .inputs()
        .iter()
        .map(|&v| format!("%{}: {}", g.node(v).name, fmt_type(&g.node(v).ty)))
        .collect();
    let _ = writeln!(s, "graph {}({}) {{", g.name, params.join(", "));
    // names invented for unused results, counted over the whole graph so that two calls
    // never get the same one
    let mut fresh = 0usize;
    for v in g.topo_order() {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else {
            continue;
        };
        if n.is_inline_scalar() || matches!(op, Op::Result { .. }) {
            continue;
        }
        if let Op::Control(c) = op {
            let _ = writeln!(
                s,
                "  {} = {}({})",
                results(g, v, &mut fresh),
                c.name(),
                control_args(g, v, c).join(", ")
            );
            continue;
        }
        let args = match (op, digest) {
            (Op::Constant(lit), Some(d)) => vec![format!("digest={}", d(lit))],
            _ => call_args(g, v, op),
        };
        let _ = writeln!(
            s,
            "  %{}: {} = {}({})",
            n.name,
            fmt_type(&n.ty),
            op.name(),
            args.join(", ")
        );
    }
    let outs: Vec<String> = g.outputs().iter().map(|&v| operand(g, v)).collect();
    let _ = writeln!(s, "  return {}", outs.join(", "));
    s.push_str("}\n");
    s
}

/// The text of a module: its graphs separated by blank lines (and any body a graph calls
/// that the module does not hold, after them).
pub fn print_module(m: &Module) -> String {
    let mut parts: Vec<String> = m.graphs.iter().map(|g| print_one(g, None)).collect();
    let mut extra: Vec<String> = Vec::new();
    for g in &m.graphs {
        for b in Control::bodies_of(g) {
            if m.get(&b.name).is_none() && !extra.contains(&b.name) {
                extra.push(b.name.clone());
                parts.push(print_one(&b, None));
            }
        }
    }
    parts.join("\n")
}

/// `%a: f32[4], %b: i64[]`: the results of control node `t` (a result nothing uses gets a
/// fresh name, `%unused{fresh}` with `fresh` counting on).
fn results(g: &Graph, t: ValueId, fresh: &mut usize) -> String {
    let tys: Vec<&crate::ir::op::TensorType> =
        g.operands(t).iter().map(|&o| &g.node(o).ty).collect();
    let Some(Op::Control(c)) = g.node(t).op() else {
        return String::new();
    };
    let types = c.result_types(&tys).unwrap_or_default();
    g.results_of(t)
        .iter()
        .zip(&types)
        .map(|(r, ty)| {
            let name = match r {
                Some(v) => g.node(*v).name.clone(),
                None => loop {
                    let n = format!("unused{fresh}");
                    *fresh += 1;
                    if g.value(&n).is_none() {
                        break n;
                    }
                },
            };
            format!("%{name}: {}", fmt_type(ty))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn control_args(g: &Graph, t: ValueId, c: &Control) -> Vec<String> {
    let mut args: Vec<String> = g.operands(t).into_iter().map(|o| operand(g, o)).collect();
    for (role, b) in c.kind.body_names().iter().zip(&c.bodies) {
        args.push(format!("{role}=@{}", b.0.name));
    }
    if let ControlKind::Scan { carries, reverse } = c.kind {
        args.push(format!("carries={carries}"));
        args.push(format!("reverse={reverse}"));
    }
    args
}

fn operand(g: &Graph, v: ValueId) -> String {
    let n = g.node(v);
    match &n.kind {
        NodeKind::Op(Op::Scalar(s)) if n.is_inline_scalar() => s.to_string(),
        _ => format!("%{}", n.name),
    }
}

fn call_args(g: &Graph, v: ValueId, op: &Op) -> Vec<String> {
    let mut operands = g.operands(v).into_iter();
    let mut args: Vec<String> = match op.operand_slots() {
        Some(slots) => slots
            .iter()
            .map(|&present| match present {
                true => operands
                    .next()
                    .map_or_else(|| "none".into(), |o| operand(g, o)),
                false => "none".into(),
            })
            .collect(),
        None => Vec::new(),
    };
    args.extend(operands.map(|o| operand(g, o)));
    args.extend(
        op.printed_attrs()
            .into_iter()
            .map(|(name, a)| format!("{name}={a}")),
    );
    args
}
