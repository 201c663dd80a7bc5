//! Graph → `.smelt` text. Anonymous scalar operands print inline; every other value gets a
//! statement with its type; attributes equal to PyTorch's defaults are left out.

use super::fmt_type;
use crate::ir::graph::{Graph, Module, NodeKind, ValueId};
use crate::ir::op::Op;
use std::fmt::Write;

/// The text of one graph.
pub fn print_graph(g: &Graph) -> String {
    let mut s = String::new();
    let params: Vec<String> = g
        .inputs()
        .iter()
        .map(|&v| format!("%{}: {}", g.node(v).name, fmt_type(&g.node(v).ty)))
        .collect();
    let _ = writeln!(s, "graph {}({}) {{", g.name, params.join(", "));
    for v in g.topo_order() {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else {
            continue;
        };
        if n.is_inline_scalar() {
            continue;
        }
        let _ = writeln!(
            s,
            "  %{}: {} = {}({})",
            n.name,
            fmt_type(&n.ty),
            op.name(),
            call_args(g, v, op).join(", ")
        );
    }
    let outs: Vec<String> = g.outputs().iter().map(|&v| operand(g, v)).collect();
    let _ = writeln!(s, "  return {}", outs.join(", "));
    s.push_str("}\n");
    s
}

/// The text of a module: its graphs separated by blank lines.
pub fn print_module(m: &Module) -> String {
    m.graphs
        .iter()
        .map(print_graph)
        .collect::<Vec<_>>()
        .join("\n")
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
