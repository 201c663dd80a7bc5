//! The graph verifier: every graph the parser, the builder and the tracer hand out passes it.

use super::graph::{Graph, NodeKind, ValueId, is_anonymous, is_valid_name};
use super::op::TensorType;
use super::text::fmt_type;
use crate::{Result, bail};
use petgraph::Direction;
use std::collections::HashSet;

/// Checks names, inputs, operand positions, types, outputs and acyclicity.
pub fn verify(g: &Graph) -> Result<()> {
    check_names(g)?;
    check_inputs(g)?;
    if petgraph::algo::is_cyclic_directed(g.petgraph()) {
        bail!(Value, "graph {}: the graph has a cycle", g.name);
    }
    for v in g.topo_order() {
        check_node(g, v)?;
    }
    check_outputs(g)
}

fn check_names(g: &Graph) -> Result<()> {
    let pg = g.petgraph();
    let mut seen = HashSet::new();
    for v in pg.node_indices() {
        let n = &pg[v];
        let anon_scalar = is_anonymous(&n.name) && n.is_inline_scalar();
        if !anon_scalar && !is_valid_name(&n.name) {
            bail!(Value, "graph {}: invalid value name '{}'", g.name, n.name);
        }
        if !seen.insert(n.name.as_str()) {
            bail!(Value, "graph {}: value %{} defined twice", g.name, n.name);
        }
        if g.names().get(&n.name) != Some(&v) {
            bail!(
                Value,
                "graph {}: name table out of date for %{}",
                g.name,
                n.name
            );
        }
    }
    if g.names().len() != pg.node_count() {
        bail!(Value, "graph {}: name table out of date", g.name);
    }
    Ok(())
}

fn check_inputs(g: &Graph) -> Result<()> {
    let pg = g.petgraph();
    let listed: HashSet<ValueId> = g.inputs().iter().copied().collect();
    if listed.len() != g.inputs().len() {
        bail!(Value, "graph {}: an input is listed twice", g.name);
    }
    for &v in g.inputs() {
        match pg.node_weight(v).map(|n| &n.kind) {
            Some(NodeKind::Input { name }) if *name == pg[v].name => {}
            _ => bail!(
                Value,
                "graph {}: input {} is not an input node",
                g.name,
                v.index()
            ),
        }
    }
    for v in pg.node_indices() {
        if matches!(pg[v].kind, NodeKind::Input { .. }) && !listed.contains(&v) {
            bail!(
                Value,
                "graph {}: input node %{} is not listed as an input",
                g.name,
                pg[v].name
            );
        }
    }
    Ok(())
}

fn check_node(g: &Graph, v: ValueId) -> Result<()> {
    let pg = g.petgraph();
    let n = &pg[v];
    let mut pos: Vec<usize> = pg
        .edges_directed(v, Direction::Incoming)
        .map(|e| *e.weight())
        .collect();
    pos.sort_unstable();
    if pos.iter().enumerate().any(|(i, &p)| i != p) {
        bail!(
            Value,
            "graph {}: %{} has operand positions {pos:?}, expected 0..{}",
            g.name,
            n.name,
            pos.len()
        );
    }
    let op = match &n.kind {
        NodeKind::Input { .. } if pos.is_empty() => return Ok(()),
        NodeKind::Input { .. } => bail!(Value, "graph {}: input %{} has operands", g.name, n.name),
        NodeKind::Op(op) => op,
    };
    let operands = g.operands(v);
    let tys: Vec<&TensorType> = operands.iter().map(|&o| &pg[o].ty).collect();
    let inferred = op.infer(&tys).map_err(|e| {
        crate::Error::Value(format!(
            "graph {}: %{} = {}(...): {e}",
            g.name,
            n.name,
            op.name()
        ))
    })?;
    if inferred != n.ty {
        bail!(
            Value,
            "graph {}: %{} is recorded as {} but {} infers {}",
            g.name,
            n.name,
            fmt_type(&n.ty),
            op.name(),
            fmt_type(&inferred)
        );
    }
    Ok(())
}

fn check_outputs(g: &Graph) -> Result<()> {
    if g.outputs().is_empty() {
        bail!(Value, "graph {}: the graph has no outputs", g.name);
    }
    for (i, &o) in g.outputs().iter().enumerate() {
        match g.try_node(o) {
            None => bail!(
                Value,
                "graph {}: output {i} is not a value of the graph",
                g.name
            ),
            Some(n) if n.is_inline_scalar() => bail!(
                Value,
                "graph {}: output {i} is an anonymous scalar; add it with a name to return it",
                g.name
            ),
            Some(_) => {}
        }
    }
    Ok(())
}
