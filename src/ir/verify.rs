//! The graph verifier: every graph the parser, the builder and the tracer hand out passes it.

use super::graph::{Graph, NodeKind, ValueId, is_anonymous, is_valid_name};
use super::op::{Op, TensorType};
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
        let anon_scalar = is_anonymous(&n.name)
            && (n.is_inline_scalar() || matches!(n.op(), Some(super::op::Op::Control(_))));
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
    check_control(g, v, op)?;
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

/// A control op's node is used only by its `Result` values; each of those has the type the
/// op's rule gives its index.
fn check_control(g: &Graph, v: ValueId, op: &Op) -> Result<()> {
    let name = &g.node(v).name;
    match op {
        Op::Control(c) => {
            for u in g.users(v) {
                if !matches!(g.node(u).op(), Some(Op::Result { .. })) {
                    bail!(
                        Value,
                        "graph {}: %{} uses the results of {} as one value",
                        g.name,
                        g.node(u).name,
                        c.name()
                    );
                }
            }
            if g.outputs().contains(&v) {
                bail!(
                    Value,
                    "graph {}: a {} call is returned as one value",
                    g.name,
                    c.name()
                );
            }
        }
        Op::Result { index, ty } => {
            let Some(&t) = g.operands(v).first() else {
                return Ok(());
            };
            let Some(Op::Control(c)) = g.node(t).op() else {
                bail!(
                    Value,
                    "graph {}: %{name} is a result of a value that is not a control op",
                    g.name
                );
            };
            let args: Vec<&TensorType> = g.operands(t).iter().map(|&o| &g.node(o).ty).collect();
            let want = c.result_types(&args)?;
            match want.get(*index) {
                Some(w) if w == ty => {}
                Some(w) => bail!(
                    Value,
                    "graph {}: %{name} is result {index} of {} of type {} but is recorded as {}",
                    g.name,
                    c.name(),
                    fmt_type(w),
                    fmt_type(ty)
                ),
                None => bail!(
                    Value,
                    "graph {}: %{name} is result {index} of {}, which has {} results",
                    g.name,
                    c.name(),
                    want.len()
                ),
            }
            let twins = g
                .users(t)
                .into_iter()
                .filter(|&u| g.result_of(u).map(|(_, i)| i) == Some(*index))
                .count();
            if twins > 1 {
                bail!(
                    Value,
                    "graph {}: result {index} of a {} call has {twins} values",
                    g.name,
                    c.name()
                );
            }
        }
        _ => {}
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
