//! `backward`: turns the recorded nodes a result depends on into an IR graph, appends the
//! reverse sweep with `passes::autodiff`, and evaluates only the gradient nodes, feeding the
//! forward values that were kept when the ops ran. Custom functions cut the graph: their
//! outputs become graph inputs, and their own backward seeds a further sweep below them.

use super::tape::{Edge, GradNode, NodeOp};
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::runtime::Tensor;
use crate::runtime::tensor::{Inner, apply};
use crate::{Error, Result, bail};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

type Key = *const GradNode;

fn key(n: &Arc<GradNode>) -> Key {
    Arc::as_ptr(n)
}

const SECOND_BACKWARD: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";

/// PyTorch's legacy tensor type name (`torch.FloatTensor`).
pub(crate) fn legacy_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "torch.FloatTensor",
        DType::F64 => "torch.DoubleTensor",
        DType::F16 => "torch.HalfTensor",
        DType::BF16 => "torch.BFloat16Tensor",
        DType::I64 => "torch.LongTensor",
        DType::I32 => "torch.IntTensor",
        DType::I16 => "torch.ShortTensor",
        DType::I8 => "torch.CharTensor",
        DType::U8 => "torch.ByteTensor",
        DType::Bool => "torch.BoolTensor",
    }
}

/// The error for a saved value whose storage was written after it was saved.
pub(crate) fn modified_error(t: &Tensor, producer: Option<String>, expected: u64) -> Error {
    let what = match producer {
        Some(p) => format!(", which is output 0 of {p},"),
        None => String::new(),
    };
    Error::Value(format!(
        "one of the variables needed for gradient computation has been modified by an inplace operation: [{} {:?}]{what} is at version {}; expected version {expected} instead. Hint: the backtrace further above shows the operation that failed to compute its gradient. The variable in question was changed in there or anywhere later. Good luck!",
        legacy_type(t.dtype()),
        t.shape(),
        t.version()
    ))
}

/// A value the sweep may read: its data, the versions it must still be at, and its producer.
struct Known {
    t: Tensor,
    versions: Vec<u64>,
    producer: Option<String>,
}

/// One reverse sweep over the IR part of the recorded graph.
struct Sweep {
    g: Graph,
    nodes: HashMap<Key, ValueId>,
    leaves: HashMap<*const Inner, ValueId>,
    known: HashMap<ValueId, Known>,
    leaf_list: Vec<(ValueId, Tensor)>,
    cuts: Vec<(ValueId, Arc<GradNode>)>,
    retained: Vec<(ValueId, Arc<GradNode>)>,
    visited: Vec<Arc<GradNode>>,
}

impl Sweep {
    fn new() -> Sweep {
        Sweep {
            g: Graph::new("backward"),
            nodes: HashMap::new(),
            leaves: HashMap::new(),
            known: HashMap::new(),
            leaf_list: Vec::new(),
            cuts: Vec::new(),
            retained: Vec::new(),
            visited: Vec::new(),
        }
    }

    fn input(&mut self, t: &Tensor) -> Result<ValueId> {
        let name = format!("i{}", self.g.inputs().len());
        self.g.add_input(&name, t.ttype())
    }

    fn edge_value(&mut self, e: &Edge, version: u64) -> Result<ValueId> {
        Ok(match e {
            Edge::Node(n) => self.nodes[&key(n)],
            Edge::Leaf(t) => {
                let k = Arc::as_ptr(&t.0);
                if let Some(&v) = self.leaves.get(&k) {
                    if let Some(kn) = self.known.get_mut(&v) {
                        kn.versions.push(version);
                    }
                    return Ok(v);
                }
                let v = self.input(t)?;
                self.leaves.insert(k, v);
                self.leaf_list.push((v, t.clone()));
                self.known.insert(
                    v,
                    Known {
                        t: t.clone(),
                        versions: vec![version],
                        producer: None,
                    },
                );
                v
            }
            Edge::Const(t) => {
                let v = self.input(t)?;
                self.known.insert(
                    v,
                    Known {
                        t: t.clone(),
                        versions: vec![version],
                        producer: None,
                    },
                );
                v
            }
        })
    }

    /// Adds `root` and the IR nodes below it (stopping at custom functions) to the graph.
    fn build(&mut self, root: &Arc<GradNode>) -> Result<ValueId> {
        let mut stack = vec![(root.clone(), false)];
        while let Some((n, expanded)) = stack.pop() {
            if self.nodes.contains_key(&key(&n)) {
                continue;
            }
            if n.is_freed() {
                bail!(Value, "{SECOND_BACKWARD}");
            }
            let op = match &n.op {
                NodeOp::Custom(_) => {
                    let v = self
                        .g
                        .add_input(&format!("i{}", self.g.inputs().len()), n.out_type.clone())?;
                    if let Some(t) = n.value() {
                        self.known.insert(
                            v,
                            Known {
                                t,
                                versions: vec![n.out_version],
                                producer: Some(n.name()),
                            },
                        );
                    }
                    self.nodes.insert(key(&n), v);
                    self.cuts.push((v, n.clone()));
                    self.visited.push(n.clone());
                    continue;
                }
                NodeOp::Op(op) => op,
            };
            if !expanded {
                stack.push((n.clone(), true));
                for e in &n.inputs {
                    if let Edge::Node(c) = e
                        && !self.nodes.contains_key(&key(c))
                    {
                        stack.push((c.clone(), false));
                    }
                }
                continue;
            }
            let operands = n
                .inputs
                .iter()
                .zip(&n.in_versions)
                .map(|(e, &ver)| self.edge_value(e, ver))
                .collect::<Result<Vec<_>>>()?;
            let v = self.g.add_op(op.clone(), &operands)?;
            if let Some(t) = n.value() {
                self.known.insert(
                    v,
                    Known {
                        t,
                        versions: vec![n.out_version],
                        producer: Some(n.name()),
                    },
                );
            }
            if n.retained_tensor().is_some() {
                self.retained.push((v, n.clone()));
            }
            self.nodes.insert(key(&n), v);
            self.visited.push(n);
        }
        Ok(self.nodes[&key(root)])
    }
}

/// Evaluates the values `want` of `g`, given the `known` ones: only what they need is
/// computed, and every known value they read is checked against its saved version.
fn evaluate(
    g: &Graph,
    known: &HashMap<ValueId, Known>,
    want: &[ValueId],
) -> Result<HashMap<ValueId, Tensor>> {
    let mut needed: HashSet<ValueId> = HashSet::new();
    let mut stack: Vec<ValueId> = want.to_vec();
    while let Some(v) = stack.pop() {
        if !needed.insert(v) {
            continue;
        }
        if let Some(k) = known.get(&v) {
            if let Some(&bad) = k.versions.iter().find(|&&ver| ver != k.t.version()) {
                return Err(modified_error(&k.t, k.producer.clone(), bad));
            }
            continue;
        }
        stack.extend(g.operands(v));
    }
    let _off = super::no_grad();
    let mut vals: HashMap<ValueId, Tensor> = HashMap::new();
    for v in g.topo_order() {
        if !needed.contains(&v) {
            continue;
        }
        if let Some(k) = known.get(&v) {
            vals.insert(v, k.t.clone());
            continue;
        }
        let node = g.node(v);
        let op = match &node.kind {
            NodeKind::Op(op) => op,
            NodeKind::Input { name } => bail!(Value, "backward: no value for input %{name}"),
        };
        let args: Vec<Tensor> = g.operands(v).iter().map(|o| vals[o].clone()).collect();
        let refs: Vec<&Tensor> = args.iter().collect();
        vals.insert(v, apply(op.clone(), &refs)?);
    }
    Ok(vals)
}

/// Adds `g` to the `.grad` of `t`.
pub(crate) fn accumulate_grad(t: &Tensor, g: Tensor) -> Result<()> {
    let _off = super::no_grad();
    let new = match t.grad() {
        Some(old) => old.add(&g)?,
        None => {
            // A gradient that is a view of some other tensor gets its own storage.
            if g.is_contiguous() && g.storage_offset() == 0 && g.numel() == g.storage().len() {
                g
            } else {
                g.contiguous()
            }
        }
    };
    t.set_grad(Some(new));
    Ok(())
}

/// Runs the reverse sweep from `root` seeded with `seed`.
pub(crate) fn backward(root: &Tensor, seed: Tensor, retain_graph: bool) -> Result<()> {
    let node = {
        let m = root.meta();
        if !m.requires_grad {
            bail!(
                Value,
                "element 0 of tensors does not require grad and does not have a grad_fn"
            );
        }
        m.node.clone()
    };
    let Some(node) = node else {
        return accumulate_grad(root, seed);
    };
    if node.is_freed() {
        bail!(Value, "{SECOND_BACKWARD}");
    }
    // Post-order positions of the custom functions: they run from the highest down.
    let order = custom_order(&node);
    let mut pending: HashMap<Key, (Arc<GradNode>, Tensor)> = HashMap::new();
    let mut seeds: Vec<(Arc<GradNode>, Tensor)> = vec![(node, seed)];
    let mut visited: Vec<Arc<GradNode>> = Vec::new();
    loop {
        let (custom, ir): (Vec<_>, Vec<_>) = seeds
            .drain(..)
            .partition(|(n, _)| matches!(n.op, NodeOp::Custom(_)));
        for (n, g) in custom {
            add_pending(&mut pending, n, g)?;
        }
        if !ir.is_empty() {
            sweep(&ir, &mut pending, &mut visited)?;
        }
        let Some(next) = pending
            .keys()
            .copied()
            .max_by_key(|k| order.get(k).copied().unwrap_or(0))
        else {
            break;
        };
        let Some((n, g)) = pending.remove(&next) else {
            break;
        };
        if let Some(t) = n.retained_tensor() {
            accumulate_grad(&t, g.clone())?;
        }
        let NodeOp::Custom(f) = &n.op else { continue };
        if n.is_freed() {
            bail!(Value, "{SECOND_BACKWARD}");
        }
        let grads = {
            let _off = super::no_grad();
            f.backward(&g)?
        };
        if grads.len() != n.inputs.len() {
            bail!(
                Value,
                "function {} returned an incorrect number of gradients (expected {}, got {})",
                n.name(),
                n.inputs.len(),
                grads.len()
            );
        }
        for (i, (e, gi)) in n.inputs.iter().zip(grads).enumerate() {
            let Some(gi) = gi else { continue };
            let expect = match e {
                Edge::Node(c) => c.out_type.clone(),
                Edge::Leaf(t) | Edge::Const(t) => t.ttype(),
            };
            if gi.shape() != expect.shape.as_slice() {
                bail!(
                    Value,
                    "Function {} returned an invalid gradient at index {i} - got {:?} but expected shape compatible with {:?}",
                    n.name(),
                    gi.shape(),
                    expect.shape
                );
            }
            let gi = if gi.dtype() != expect.dtype && expect.dtype.is_float() {
                let _off = super::no_grad();
                gi.to_dtype(expect.dtype)?
            } else {
                gi
            };
            match e {
                Edge::Node(c) => seeds.push((c.clone(), gi)),
                Edge::Leaf(t) => accumulate_grad(t, gi)?,
                Edge::Const(_) => {}
            }
        }
        visited.push(n);
    }
    if !retain_graph {
        for n in visited {
            n.free();
        }
    }
    Ok(())
}

fn add_pending(
    pending: &mut HashMap<Key, (Arc<GradNode>, Tensor)>,
    n: Arc<GradNode>,
    g: Tensor,
) -> Result<()> {
    match pending.remove(&key(&n)) {
        Some((n, old)) => {
            let _off = super::no_grad();
            let sum = old.add(&g)?;
            pending.insert(key(&n), (n, sum));
        }
        None => {
            pending.insert(key(&n), (n, g));
        }
    }
    Ok(())
}

/// One IR sweep from the seeded nodes down to leaves and custom-function outputs.
fn sweep(
    seeds: &[(Arc<GradNode>, Tensor)],
    pending: &mut HashMap<Key, (Arc<GradNode>, Tensor)>,
    visited: &mut Vec<Arc<GradNode>>,
) -> Result<()> {
    let mut s = Sweep::new();
    let mut seed_values = Vec::with_capacity(seeds.len());
    for (n, g) in seeds {
        let v = s.build(n)?;
        let sv = s.input(g)?;
        s.known.insert(
            sv,
            Known {
                t: g.clone(),
                versions: vec![g.version()],
                producer: None,
            },
        );
        seed_values.push((v, sv));
    }
    let mut wrt: Vec<ValueId> = s.leaf_list.iter().map(|(v, _)| *v).collect();
    wrt.extend(s.cuts.iter().map(|(v, _)| *v));
    wrt.extend(s.retained.iter().map(|(v, _)| *v));
    let grads = crate::passes::autodiff::backward(&mut s.g, &seed_values, &wrt)?;
    let want: Vec<ValueId> = grads.iter().flatten().copied().collect();
    let vals = evaluate(&s.g, &s.known, &want)?;
    let mut it = grads.into_iter();
    for (_, t) in &s.leaf_list {
        if let Some(Some(gv)) = it.next() {
            accumulate_grad(t, vals[&gv].clone())?;
        }
    }
    for (_, n) in &s.cuts {
        if let Some(Some(gv)) = it.next() {
            add_pending(pending, n.clone(), vals[&gv].clone())?;
        }
    }
    for (_, n) in &s.retained {
        if let Some(Some(gv)) = it.next()
            && let Some(t) = n.retained_tensor()
        {
            accumulate_grad(&t, vals[&gv].clone())?;
        }
    }
    visited.append(&mut s.visited);
    Ok(())
}

/// Post-order positions of the custom-function nodes reachable from `root`.
fn custom_order(root: &Arc<GradNode>) -> HashMap<Key, usize> {
    let mut pos: HashMap<Key, usize> = HashMap::new();
    let mut seen: HashSet<Key> = HashSet::new();
    let mut any_custom = false;
    let mut stack = vec![(root.clone(), false)];
    let mut next = 0usize;
    while let Some((n, expanded)) = stack.pop() {
        if expanded {
            if matches!(n.op, NodeOp::Custom(_)) {
                any_custom = true;
                pos.insert(key(&n), next);
            }
            next += 1;
            continue;
        }
        if !seen.insert(key(&n)) {
            continue;
        }
        stack.push((n.clone(), true));
        for e in &n.inputs {
            if let Edge::Node(c) = e
                && !seen.contains(&key(c))
            {
                stack.push((c.clone(), false));
            }
        }
    }
    if !any_custom {
        pos.clear();
    }
    pos
}
