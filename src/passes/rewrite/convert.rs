//! Graph → e-graph, and the extracted e-graph → graph.

use super::cost::Cheapest;
use super::lang::{EG, ENode, Head, Types};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::Op;
use crate::{Result, bail};
use egg::Id;
use std::collections::{HashMap, HashSet};

/// An e-graph holding `g`, and the e-class of each output. Equal subexpressions share one
/// e-class from the start (the IR has no ops with side effects or randomness).
pub fn to_egraph(g: &Graph) -> Result<(EG, Vec<Id>, HashMap<ValueId, Id>)> {
    let inputs = g.inputs().iter().map(|&v| g.node(v).ty.clone()).collect();
    let mut eg = EG::new(Types { inputs });
    let mut ids: HashMap<ValueId, Id> = HashMap::new();
    let position: HashMap<ValueId, usize> = g
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &v)| (v, i))
        .collect();
    for v in g.topo_order() {
        let node = match &g.node(v).kind {
            NodeKind::Input { .. } => match position.get(&v) {
                Some(&i) => ENode {
                    head: Head::Input(i),
                    children: vec![],
                },
                None => bail!(Value, "rewrite: %{} is not a graph input", g.node(v).name),
            },
            NodeKind::Op(op) => {
                let mut children = Vec::new();
                for o in g.operands(v) {
                    match ids.get(&o) {
                        Some(&c) => children.push(c),
                        None => bail!(Value, "rewrite: graph {} has a cycle", g.name),
                    }
                }
                ENode::op(op.clone(), children)
            }
        };
        ids.insert(v, eg.add(node));
    }
    let mut roots = Vec::new();
    for o in g.outputs() {
        match ids.get(o) {
            Some(&id) => roots.push(id),
            None => bail!(
                Value,
                "rewrite: an output of graph {} is not a value",
                g.name
            ),
        }
    }
    eg.rebuild();
    Ok((eg, roots, ids))
}

/// Builds the cheapest graph for `roots`: same name, same inputs in the same order, one
/// output per root. Values whose e-class held a value of `g` keep that value's name.
pub fn extract(g: &Graph, eg: &EG, roots: &[Id], ids: &HashMap<ValueId, Id>) -> Result<Graph> {
    let cheapest = Cheapest::new(eg);
    let mut out = Graph::new(&g.name);
    let mut made: HashMap<Id, ValueId> = HashMap::new();
    for &v in g.inputs() {
        let n = g.node(v);
        let NodeKind::Input { name } = &n.kind else {
            bail!(Value, "rewrite: input %{} is not an input node", n.name);
        };
        out.add_input(name, n.ty.clone())?;
    }
    // Names: outputs' names first, then every other value in graph order.
    let mut names: HashMap<Id, String> = HashMap::new();
    let mut used: HashSet<String> = HashSet::new();
    for (id, name) in class_names(g, eg, ids) {
        if !names.contains_key(&id) && used.insert(name.clone()) {
            names.insert(id, name);
        }
    }
    let mut next = 0usize;
    // Iterative post-order over chosen nodes: (class, children pushed yet).
    let mut on_path: HashSet<Id> = HashSet::new();
    for &root in roots {
        let mut stack = vec![(eg.find(root), false)];
        while let Some((c, expanded)) = stack.pop() {
            if made.contains_key(&c) {
                continue;
            }
            let Some(node) = cheapest.node(eg, c) else {
                bail!(Value, "rewrite: no term of e-class {c} has a cost");
            };
            if !expanded {
                if !on_path.insert(c) {
                    bail!(Value, "rewrite: extraction chose a cycle");
                }
                stack.push((c, true));
                for &ch in node.children.iter().rev() {
                    let ch = eg.find(ch);
                    if !made.contains_key(&ch) {
                        stack.push((ch, false));
                    }
                }
                continue;
            }
            on_path.remove(&c);
            let v = match &node.head {
                Head::Input(i) => match out.inputs().get(*i) {
                    Some(&v) => v,
                    None => bail!(Value, "rewrite: input {i} out of range"),
                },
                Head::Op(k) => {
                    let mut operands = Vec::with_capacity(node.children.len());
                    for &ch in &node.children {
                        match made.get(&eg.find(ch)) {
                            Some(&o) => operands.push(o),
                            None => bail!(Value, "rewrite: extraction chose a cycle"),
                        }
                    }
                    let op = k.op().clone();
                    if matches!(op, Op::Scalar(_)) {
                        out.add_op(op, &operands)?
                    } else {
                        // New values take numbers no value of `g` uses, so that values kept
                        // from `g` can keep their names.
                        let name = match names.get(&c) {
                            Some(n) if out.value(n).is_none() => n.clone(),
                            _ => loop {
                                let n = next.to_string();
                                next += 1;
                                if !used.contains(&n) && out.value(&n).is_none() {
                                    break n;
                                }
                            },
                        };
                        out.add_op_named(op, &operands, &name)?
                    }
                }
            };
            made.insert(c, v);
        }
    }
    let mut outputs = Vec::with_capacity(roots.len());
    for &r in roots {
        match made.get(&eg.find(r)) {
            Some(&v) => outputs.push(v),
            None => bail!(Value, "rewrite: output class was not built"),
        }
    }
    out.set_outputs(outputs);
    out.verify()?;
    Ok(out)
}

/// (e-class, name) for the op values of `g`, outputs first, then in graph order.
fn class_names(g: &Graph, eg: &EG, ids: &HashMap<ValueId, Id>) -> Vec<(Id, String)> {
    let named = |v: ValueId| {
        let n = g.node(v);
        matches!(n.kind, NodeKind::Op(_)) && !n.is_inline_scalar()
    };
    let order = g.outputs().iter().copied().chain(g.topo_order());
    order
        .filter(|&v| named(v))
        .filter_map(|v| ids.get(&v).map(|&id| (eg.find(id), g.node(v).name.clone())))
        .collect()
}
