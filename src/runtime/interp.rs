//! The reference interpreter: runs a graph node by node on the eager kernels (`apply`). It is
//! the oracle every compiled backend is tested against, so it stays simple.

use crate::ir::control::Control;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::Op;
use crate::ir::text::fmt_type;
use crate::runtime::control;
use crate::runtime::tensor::{Tensor, apply};
use crate::{Error, Result, bail};
use std::collections::HashMap;

/// Runs `g` on named inputs (names without `%`) and returns its outputs in return order.
pub fn run<S: AsRef<str>>(g: &Graph, inputs: &[(S, Tensor)]) -> Result<Vec<Tensor>> {
    run_with(g, inputs, &mut |_, _, _, _, t| Ok(t))
}

/// What [`run_with`] calls on the result of every op, in control ops' bodies too, before
/// later ops read it: the graph's and the value's names, the op, its operands and its
/// result, which it may replace by a tensor of the same dtype and shape.
pub type OpHook<'a> = dyn FnMut(&str, &str, &Op, &[&Tensor], Tensor) -> Result<Tensor> + 'a;

/// [`run`], passing every op's result through `hook` (the differential fuzzer perturbs
/// each result by its rounding error to learn how far a correct program may stray).
pub fn run_with<S: AsRef<str>>(
    g: &Graph,
    inputs: &[(S, Tensor)],
    hook: &mut OpHook,
) -> Result<Vec<Tensor>> {
    // the reference formulas, not the native f32 paths of eager ops
    let _reference = crate::runtime::native::ReferenceMode::enter();
    let given = bind_inputs(g, inputs)?;
    // Uses left per value, so intermediates are dropped as soon as nothing needs them.
    let mut uses: HashMap<ValueId, usize> = HashMap::new();
    for v in g.topo_order() {
        for o in g.operands(v) {
            *uses.entry(o).or_default() += 1;
        }
    }
    for &o in g.outputs() {
        *uses.entry(o).or_default() += 1;
    }
    let mut values: HashMap<ValueId, Tensor> = HashMap::new();
    // the results of control ops, until their `Result` nodes take them
    let mut tuples: HashMap<ValueId, Vec<Tensor>> = HashMap::new();
    for v in g.topo_order() {
        let node = g.node(v);
        let t = match &node.kind {
            NodeKind::Input { name } => match given.get(name.as_str()) {
                Some(t) => (*t).clone(),
                None => bail!(Value, "graph {}: %{name} is not a declared input", g.name),
            },
            NodeKind::Op(Op::Control(c)) => {
                let operands = g.operands(v);
                let args = operands
                    .iter()
                    .map(|o| value(g, &values, *o).cloned())
                    .collect::<Result<Vec<Tensor>>>()?;
                let bodies = HookedBodies {
                    control: c,
                    hook: std::cell::RefCell::new(&mut *hook),
                };
                tuples.insert(v, control::run(c, &args, &bodies)?);
                for o in operands {
                    release(&mut uses, &mut values, o);
                }
                continue;
            }
            NodeKind::Op(Op::Result { index, .. }) => {
                let Some(t) = g.operands(v).first().and_then(|t| tuples.get(t)) else {
                    bail!(
                        Value,
                        "graph {}: %{} reads a control op that has not run",
                        g.name,
                        node.name
                    );
                };
                match t.get(*index) {
                    Some(t) => t.clone(),
                    None => bail!(
                        Value,
                        "graph {}: %{} reads a missing result",
                        g.name,
                        node.name
                    ),
                }
            }
            NodeKind::Op(op) => {
                let operands = g.operands(v);
                let args = operands
                    .iter()
                    .map(|o| value(g, &values, *o))
                    .collect::<Result<Vec<&Tensor>>>()?;
                let t = hook(&g.name, &node.name, op, &args, apply(op.clone(), &args)?)?;
                for o in operands {
                    release(&mut uses, &mut values, o);
                }
                t
            }
        };
        if t.dtype() != node.ty.dtype || t.shape() != node.ty.shape.as_slice() {
            bail!(
                Value,
                "graph {}: %{} was computed as {}[{}] but the graph says {}",
                g.name,
                node.name,
                t.dtype(),
                dims(t.shape()),
                fmt_type(&node.ty)
            );
        }
        values.insert(v, t);
    }
    g.outputs()
        .iter()
        .map(|&o| value(g, &values, o).cloned())
        .collect()
}

/// Runs the bodies of a control op on the interpreter with [`run_with`]'s hook.
struct HookedBodies<'c, 'h, 'a> {
    control: &'c Control,
    hook: std::cell::RefCell<&'h mut OpHook<'a>>,
}

impl control::Bodies for HookedBodies<'_, '_, '_> {
    fn call(&self, i: usize, inputs: &[Tensor], _into: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let g = self.control.bodies[i].graph();
        let named = by_name(g, inputs)?;
        let mut hook = self.hook.borrow_mut();
        run_with(g, &named, &mut **hook)
    }
}

/// Runs the bodies of a control op on the interpreter.
pub struct ReferenceBodies<'a>(pub &'a Control);

impl control::Bodies for ReferenceBodies<'_> {
    fn call(&self, i: usize, inputs: &[Tensor], _into: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        run_positional(self.0.bodies[i].graph(), inputs)
    }
}

/// Runs `g` on inputs given in the graph's input order.
pub fn run_positional(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    run(g, &by_name(g, inputs)?)
}

/// Inputs given in `g`'s input order, paired with their names.
fn by_name<'g>(g: &'g Graph, inputs: &[Tensor]) -> Result<Vec<(&'g str, Tensor)>> {
    if inputs.len() != g.inputs().len() {
        bail!(
            Value,
            "graph {} takes {} inputs but got {}",
            g.name,
            g.inputs().len(),
            inputs.len()
        );
    }
    Ok(g.inputs()
        .iter()
        .zip(inputs)
        .map(|(&v, t)| (g.node(v).name.as_str(), t.clone()))
        .collect())
}

/// The given named inputs in the graph's parameter order, checked as [`run`] checks them.
pub fn ordered_inputs<S: AsRef<str>>(g: &Graph, inputs: &[(S, Tensor)]) -> Result<Vec<Tensor>> {
    let given = bind_inputs(g, inputs)?;
    g.inputs()
        .iter()
        .map(|&v| {
            let name = g.node(v).name.as_str();
            given
                .get(name)
                .map(|t| (*t).clone())
                .ok_or_else(|| Error::Value(format!("missing input {name}")))
        })
        .collect()
}

/// Checks the given inputs against the graph's parameters: each exactly once, none missing,
/// none unknown, each of the declared dtype and shape.
fn bind_inputs<'a, S: AsRef<str>>(
    g: &Graph,
    inputs: &'a [(S, Tensor)],
) -> Result<HashMap<&'a str, &'a Tensor>> {
    let mut given: HashMap<&str, &Tensor> = HashMap::new();
    for (name, t) in inputs {
        let name = name.as_ref();
        if given.insert(name, t).is_some() {
            bail!(Value, "input {name} is given more than once");
        }
    }
    let params: Vec<(&str, String)> = g
        .inputs()
        .iter()
        .map(|&v| (g.node(v).name.as_str(), fmt_type(&g.node(v).ty)))
        .collect();
    for name in given.keys() {
        if !params.iter().any(|(p, _)| p == name) {
            let list: Vec<String> = params.iter().map(|(p, ty)| format!("{p}: {ty}")).collect();
            bail!(
                Value,
                "graph {} has no input named '{name}' (its inputs: {})",
                g.name,
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            );
        }
    }
    let missing: Vec<String> = params
        .iter()
        .filter(|(p, _)| !given.contains_key(p))
        .map(|(p, ty)| format!("{p}: {ty}"))
        .collect();
    if !missing.is_empty() {
        bail!(Value, "missing input {}", missing.join(", missing input "));
    }
    for &v in g.inputs() {
        let n = g.node(v);
        let Some(t) = given.get(n.name.as_str()) else {
            continue;
        };
        if t.dtype() != n.ty.dtype || t.shape() != n.ty.shape.as_slice() {
            bail!(
                Value,
                "input {}: expected {} but got {}[{}]",
                n.name,
                fmt_type(&n.ty),
                t.dtype(),
                dims(t.shape())
            );
        }
    }
    Ok(given)
}

fn value<'a>(g: &Graph, values: &'a HashMap<ValueId, Tensor>, v: ValueId) -> Result<&'a Tensor> {
    values.get(&v).ok_or_else(|| {
        let name = g.try_node(v).map_or("?", |n| n.name.as_str());
        Error::Value(format!(
            "graph {}: %{name} is used before it is computed",
            g.name
        ))
    })
}

fn release(uses: &mut HashMap<ValueId, usize>, values: &mut HashMap<ValueId, Tensor>, v: ValueId) {
    if let Some(n) = uses.get_mut(&v) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            values.remove(&v);
        }
    }
}

fn dims(shape: &[usize]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
