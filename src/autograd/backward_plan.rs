//! Backward plans and their cache.
//!
//! One reverse sweep walks the recorded nodes below its seeds into a flat list of items (the
//! structure: ops, operand positions, input types) plus the tensors the items stand for. The
//! structure alone decides the differentiated graph, so the plan made from it — the gradient
//! ops to run, in order, reading which known values — is kept in a small per-thread cache:
//! a training loop records the same structure every step and pays for building the graph,
//! the autodiff pass and the pruning once.

use super::engine::{SECOND_BACKWARD, modified_error};
use super::tape::{Edge, GradNode, NodeOp};
use crate::exec::{CompileOptions, CompiledFn};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{Op, TensorType};
use crate::runtime::tensor::{Inner, apply};
use crate::runtime::{MemoryFormat, Tensor};
use crate::{Result, bail};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

/// Plans kept per thread (a loop typically alternates between a few structures).
const CACHE_SIZE: usize = 16;

/// Runs of one plan after which it is compiled into fused kernels (a structure seen this
/// often is a training loop's; compiling costs milliseconds once).
const COMPILE_AFTER: u32 = 10;

/// Compiled versions of one plan for different input layouts (NCHW and channels_last
/// convolutions); a plan run with yet another layout runs op by op.
const LAYOUTS: usize = 4;

/// Whether `t` is in the channels_last memory format, which its compiled plan keeps.
fn is_nhwc(t: &Tensor) -> bool {
    t.suggest_memory_format() == MemoryFormat::ChannelsLast
}

/// Walks longer than this are not cached (comparing them costs about as much as planning).
const MAX_CACHED_ITEMS: usize = 4096;

/// Hashes a pointer key by mixing its address (SipHash costs more than the lookups here).
#[derive(Clone, Copy, Default)]
struct PtrHasher(u64);

impl std::hash::Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = ((n as u64) ^ (n as u64 >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type PtrHash = std::hash::BuildHasherDefault<PtrHasher>;

/// One value of the walked graph, as far as the plan depends on it.
#[derive(Clone, Debug, PartialEq)]
enum Item {
    /// A leaf that requires grad (each leaf once, however often it is used).
    Leaf(TensorType),
    /// A tensor without gradient.
    Const(TensorType),
    /// The output of a custom function (a cut): `known` when its value was kept.
    Cut(TensorType, bool),
    /// The incoming gradient of a seed.
    Seed(TensorType),
    /// A recorded op over earlier items.
    Op {
        op: Op,
        args: Vec<usize>,
        known: bool,
        retained: bool,
    },
}

/// What an item's data is at run time, and the versions it must still be at.
struct Known {
    t: Tensor,
    versions: Vec<u64>,
    producer: Option<Arc<GradNode>>,
}

/// The recorded graph below the seeds of one sweep, flattened.
#[derive(Default)]
pub(crate) struct Walk {
    items: Vec<Item>,
    seeds: Vec<(usize, usize)>,
    /// Per item: its data, when known.
    known: Vec<Option<Known>>,
    nodes: HashMap<*const GradNode, usize, PtrHash>,
    leaves: HashMap<*const Inner, usize, PtrHash>,
    /// Leaves, in item order, with their tensors.
    pub leaf_list: Vec<(usize, Tensor)>,
    /// Custom-function outputs below the seeds.
    pub cuts: Vec<(usize, Arc<GradNode>)>,
    /// Nodes whose tensors retain their gradient.
    pub retained: Vec<(usize, Arc<GradNode>)>,
    /// Every node walked (freed after a backward without `retain_graph`).
    pub visited: Vec<Arc<GradNode>>,
}

impl Walk {
    fn push(&mut self, item: Item, known: Option<Known>) -> usize {
        let i = self.items.len();
        self.items.push(item);
        self.known.push(known);
        i
    }

    fn edge(&mut self, e: &Edge, version: u64) -> usize {
        match e {
            Edge::Node(n) => self.nodes[&Arc::as_ptr(n)],
            Edge::Leaf(t) => {
                let k = Arc::as_ptr(&t.0);
                if let Some(&i) = self.leaves.get(&k) {
                    if let Some(Some(kn)) = self.known.get_mut(i) {
                        kn.versions.push(version);
                    }
                    return i;
                }
                let i = self.push(
                    Item::Leaf(t.ttype()),
                    Some(Known {
                        t: t.clone(),
                        versions: vec![version],
                        producer: None,
                    }),
                );
                self.leaves.insert(k, i);
                self.leaf_list.push((i, t.clone()));
                i
            }
            Edge::Const(t) => self.push(
                Item::Const(t.ttype()),
                Some(Known {
                    t: t.clone(),
                    versions: vec![version],
                    producer: None,
                }),
            ),
        }
    }

    /// Adds `root` and the recorded ops below it (stopping at custom functions), then the
    /// seed gradient `g` flowing into it.
    pub fn seed(&mut self, root: &Arc<GradNode>, g: &Tensor) -> Result<()> {
        let r = self.node(root)?;
        let s = self.push(
            Item::Seed(g.ttype()),
            Some(Known {
                t: g.clone(),
                versions: vec![g.version()],
                producer: None,
            }),
        );
        self.seeds.push((r, s));
        Ok(())
    }

    fn node(&mut self, root: &Arc<GradNode>) -> Result<usize> {
        let mut stack = vec![(root.clone(), false)];
        while let Some((n, expanded)) = stack.pop() {
            let k = Arc::as_ptr(&n);
            if self.nodes.contains_key(&k) {
                continue;
            }
            if n.is_freed() {
                bail!(Value, "{SECOND_BACKWARD}");
            }
            let op = match &n.op {
                NodeOp::Custom(_) => {
                    let value = n.value();
                    let known = value.map(|t| Known {
                        t,
                        versions: vec![n.out_version],
                        producer: Some(n.clone()),
                    });
                    let i = self.push(Item::Cut(n.out_type.clone(), known.is_some()), known);
                    self.nodes.insert(k, i);
                    self.cuts.push((i, n.clone()));
                    self.visited.push(n);
                    continue;
                }
                NodeOp::Op(op) => op,
            };
            if !expanded {
                stack.push((n.clone(), true));
                for e in &n.inputs {
                    if let Edge::Node(c) = e
                        && !self.nodes.contains_key(&Arc::as_ptr(c))
                    {
                        stack.push((c.clone(), false));
                    }
                }
                continue;
            }
            let args = n
                .inputs
                .iter()
                .zip(&n.in_versions)
                .map(|(e, &ver)| self.edge(e, ver))
                .collect();
            let value = n.value();
            let retained = n.retained_tensor().is_some();
            let known = value.map(|t| Known {
                t,
                versions: vec![n.out_version],
                producer: Some(n.clone()),
            });
            let item = Item::Op {
                op: op.clone(),
                args,
                known: known.is_some(),
                retained,
            };
            let i = self.push(item, known);
            if retained {
                self.retained.push((i, n.clone()));
            }
            self.nodes.insert(k, i);
            self.visited.push(n);
        }
        Ok(self.nodes[&Arc::as_ptr(root)])
    }

    /// The gradients of the leaves, cuts and retained values (in that order; `None` where
    /// no gradient flows), computed with the cached plan of this structure when there is one.
    pub fn gradients(&self) -> Result<Vec<Option<Tensor>>> {
        self.plan()?.run(self, None)
    }

    /// [`Walk::gradients`], handing each gradient to `ready` (by its index in the result)
    /// as soon as the op that makes it has run, so that what waits for it (a gradient
    /// hook that starts an all-reduce) overlaps the rest of the sweep. The plan then runs
    /// op by op, never as one compiled function.
    pub fn gradients_as_ready(&self, ready: Ready<'_>) -> Result<Vec<Option<Tensor>>> {
        self.plan()?.run(self, Some(ready))
    }

    fn plan(&self) -> Result<Rc<Plan>> {
        Ok(match lookup(&self.items, &self.seeds) {
            Some(p) => p,
            None => {
                let p = Rc::new(Plan::build(&self.items, &self.seeds)?);
                store(&self.items, &self.seeds, p.clone());
                p
            }
        })
    }
}

/// Called with a gradient's index and value as soon as it is computed.
pub(crate) type Ready<'a> = &'a mut dyn FnMut(usize, &Tensor) -> Result<()>;

/// What a sweep runs: the gradient ops over slots, the first of which hold known values.
struct Plan {
    /// `(slot, item)`: slots filled from the walk's known values.
    inputs: Vec<(usize, usize)>,
    /// Steps in order; step `i` writes slot `inputs.len() + i`.
    steps: Vec<Step>,
    /// The slot of each gradient (leaves, cuts, retained values).
    grads: Vec<Option<usize>>,
    /// `(slot, gradient)` for every gradient, by slot: the order they become ready in.
    ready_order: Vec<(usize, usize)>,
    /// Times the plan has run.
    runs: Cell<u32>,
    /// The steps compiled into one function once the plan is hot, one per layout of the
    /// inputs (which are channels_last), at most [`LAYOUTS`] of them (`None`: tried and not
    /// compilable, so the steps keep running op by op).
    compiled: RefCell<Vec<(Vec<bool>, Option<Compiled>)>>,
}

/// A plan compiled with the CPU backend: its inputs are the plan's inputs, its outputs the
/// distinct gradient slots.
struct Compiled {
    f: CompiledFn,
    /// For each gradient, its output index.
    grads: Vec<Option<usize>>,
}

impl Plan {
    fn build(items: &[Item], seeds: &[(usize, usize)]) -> Result<Plan> {
        let mut g = Graph::new("backward");
        let mut ids: Vec<ValueId> = Vec::with_capacity(items.len());
        let mut known: HashMap<ValueId, usize> = HashMap::new();
        let mut wrt = Vec::new();
        let mut cuts = Vec::new();
        let mut retained = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let (v, is_known) = match item {
                Item::Leaf(ty) | Item::Const(ty) | Item::Seed(ty) | Item::Cut(ty, _) => {
                    let v = g.add_input(&format!("i{i}"), ty.clone())?;
                    (v, !matches!(item, Item::Cut(_, false)))
                }
                Item::Op {
                    op, args, known, ..
                } => {
                    let xs: Vec<ValueId> = args.iter().map(|&a| ids[a]).collect();
                    (g.add_op(op.clone(), &xs)?, *known)
                }
            };
            match item {
                Item::Leaf(_) => wrt.push(v),
                Item::Cut(..) => cuts.push(v),
                Item::Op { retained: true, .. } => retained.push(v),
                _ => {}
            }
            if is_known {
                known.insert(v, i);
            }
            ids.push(v);
        }
        wrt.extend(cuts);
        wrt.extend(retained);
        let seed_values: Vec<(ValueId, ValueId)> =
            seeds.iter().map(|&(r, s)| (ids[r], ids[s])).collect();
        let grads = crate::passes::autodiff::backward(&mut g, &seed_values, &wrt)?;
        // Only what the gradients need, stopping at known values.
        let mut needed: HashSet<ValueId> = HashSet::new();
        let mut stack: Vec<ValueId> = grads.iter().flatten().copied().collect();
        while let Some(v) = stack.pop() {
            if !needed.insert(v) || known.contains_key(&v) {
                continue;
            }
            stack.extend(operands_of(&g, v));
        }
        let mut inputs = Vec::new();
        let mut slot: HashMap<ValueId, usize> = HashMap::new();
        let order = g.topo_order();
        for &v in &order {
            if needed.contains(&v)
                && let Some(&i) = known.get(&v)
            {
                slot.insert(v, inputs.len());
                inputs.push((inputs.len(), i));
            }
        }
        let mut steps: Vec<Step> = Vec::new();
        // Identical ops over identical slots are computed once (the rules emit some twice,
        // e.g. both halves of `x * x`).
        let mut seen: HashMap<(&'static str, Vec<usize>), Vec<usize>> = HashMap::new();
        for &v in &order {
            if !needed.contains(&v) || slot.contains_key(&v) {
                continue;
            }
            let op = match &g.node(v).kind {
                NodeKind::Op(op) => op.clone(),
                NodeKind::Input { name } => bail!(Value, "backward: no value for input %{name}"),
            };
            let args: Vec<usize> = operands_of(&g, v).iter().map(|o| slot[o]).collect();
            let same = seen.entry((op.name(), args.clone())).or_default();
            if let Some(&j) = same.iter().find(|&&j| steps[j].op() == &op) {
                slot.insert(v, inputs.len() + j);
                continue;
            }
            same.push(steps.len());
            slot.insert(v, inputs.len() + steps.len());
            // A Python number is made once, not on every run.
            let step = if matches!(op, Op::Scalar(_)) {
                let _off = super::no_grad();
                Step::Fixed(apply(op.clone(), &[])?, op)
            } else {
                Step::Run(op, args)
            };
            steps.push(step);
        }
        let grads: Vec<Option<usize>> = grads.iter().map(|gv| gv.map(|v| slot[&v])).collect();
        let mut ready_order: Vec<(usize, usize)> = grads
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (s, i)))
            .collect();
        ready_order.sort_unstable();
        Ok(Plan {
            inputs,
            steps,
            grads,
            ready_order,
            runs: Cell::new(0),
            compiled: RefCell::new(Vec::new()),
        })
    }

    fn run(&self, w: &Walk, mut ready: Option<Ready<'_>>) -> Result<Vec<Option<Tensor>>> {
        let mut slots: Vec<Option<Tensor>> =
            Vec::with_capacity(self.inputs.len() + self.steps.len());
        for &(_, item) in &self.inputs {
            let Some(Some(k)) = w.known.get(item) else {
                bail!(Value, "backward: no value for input %i{item}");
            };
            if let Some(&bad) = k.versions.iter().find(|&&ver| ver != k.t.version()) {
                return Err(modified_error(
                    &k.t,
                    k.producer.as_ref().map(|n| n.name()),
                    bad,
                ));
            }
            slots.push(Some(k.t.clone()));
        }
        let _off = super::no_grad();
        let runs = self.runs.get().saturating_add(1);
        self.runs.set(runs);
        if runs >= COMPILE_AFTER && ready.is_none() {
            let layout: Vec<bool> = slots
                .iter()
                .map(|t| t.as_ref().is_some_and(is_nhwc))
                .collect();
            let mut compiled = self.compiled.borrow_mut();
            let at = match compiled.iter().position(|(l, _)| *l == layout) {
                Some(i) => Some(i),
                None if compiled.len() < LAYOUTS => {
                    compiled.push((layout, self.compile(&slots).ok()));
                    Some(compiled.len() - 1)
                }
                None => None,
            };
            if let Some((_, Some(c))) = at.map(|i| &compiled[i]) {
                let inputs: Vec<Tensor> = slots.into_iter().flatten().collect();
                let outs = c.f.call(&inputs)?;
                return Ok(c
                    .grads
                    .iter()
                    .map(|o| o.and_then(|o| outs.get(o).cloned()))
                    .collect());
            }
        }
        // the gradients in the order their slots are written (by construction of `ready_order`)
        let mut next_ready = 0;
        let mut hand_out = |slots: &[Option<Tensor>]| -> Result<()> {
            let Some(f) = ready.as_mut() else {
                return Ok(());
            };
            while let Some(&(slot, i)) = self.ready_order.get(next_ready) {
                let Some(Some(t)) = slots.get(slot) else {
                    break;
                };
                f(i, t)?;
                next_ready += 1;
            }
            Ok(())
        };
        hand_out(&slots)?;
        for step in &self.steps {
            let (op, args) = match step {
                Step::Fixed(t, _) => {
                    slots.push(Some(t.clone()));
                    hand_out(&slots)?;
                    continue;
                }
                Step::Run(op, args) => (op, args),
            };
            let mut refs: Vec<&Tensor> = Vec::with_capacity(args.len());
            for &a in args {
                match slots.get(a).and_then(Option::as_ref) {
                    Some(t) => refs.push(t),
                    None => bail!(Value, "backward: slot {a} is read before it is written"),
                }
            }
            let r = apply(op.clone(), &refs)?;
            slots.push(Some(r));
            hand_out(&slots)?;
        }
        Ok(self
            .grads
            .iter()
            .map(|s| s.and_then(|s| slots.get(s).cloned().flatten()))
            .collect())
    }
}

impl Plan {
    /// The steps as one graph over the plan's inputs (typed as `inputs`), compiled with
    /// fusion. Refused when a gradient is an input itself or an input is a Python number.
    fn compile(&self, inputs: &[Option<Tensor>]) -> Result<Compiled> {
        let mut g = Graph::new("backward");
        let mut ids: Vec<ValueId> = Vec::with_capacity(inputs.len() + self.steps.len());
        // inputs in channels_last keep their kernels in NHWC (later calls with other
        // layouts are converted on entry)
        let mut channels_last = Vec::new();
        for (i, t) in inputs.iter().enumerate() {
            let Some(t) = t else {
                bail!(Value, "backward: input {i} has no value");
            };
            if t.is_wrapped_number() {
                bail!(Unsupported, "backward: a Python number as input");
            }
            let name = format!("i{i}");
            ids.push(g.add_input(&name, t.ttype())?);
            if is_nhwc(t) {
                channels_last.push(name);
            }
        }
        for step in &self.steps {
            let v = match step {
                Step::Fixed(_, op) => g.add_op(op.clone(), &[])?,
                Step::Run(op, args) => {
                    let xs: Vec<ValueId> = args.iter().map(|&a| ids[a]).collect();
                    g.add_op(op.clone(), &xs)?
                }
            };
            ids.push(v);
        }
        let mut outputs: Vec<usize> = Vec::new();
        let mut grads = Vec::with_capacity(self.grads.len());
        for s in &self.grads {
            grads.push(match *s {
                None => None,
                Some(s) if s < inputs.len() => {
                    bail!(Unsupported, "backward: a gradient that is an input")
                }
                Some(s) => Some(match outputs.iter().position(|&o| o == s) {
                    Some(j) => j,
                    None => {
                        outputs.push(s);
                        outputs.len() - 1
                    }
                }),
            });
        }
        g.set_outputs(outputs.iter().map(|&s| ids[s]).collect());
        g.verify()?;
        let f = CompiledFn::compile(&g, &CompileOptions::default().channels_last(&channels_last))?;
        Ok(Compiled { f, grads })
    }
}

/// One step of a plan.
enum Step {
    /// An op over earlier slots.
    Run(Op, Vec<usize>),
    /// A value computed when the plan was made (a Python number), and its op.
    Fixed(Tensor, Op),
}

impl Step {
    fn op(&self) -> &Op {
        match self {
            Step::Run(op, _) | Step::Fixed(_, op) => op,
        }
    }
}

/// The operands `v` is computed from, skipping a reshape that only adds leading size-1
/// dims in front of an expand (the expand adds them itself): the gradient of a mean or sum
/// is such a pair.
fn operands_of(g: &Graph, v: ValueId) -> Vec<ValueId> {
    let xs = g.operands(v);
    if let (Some(Op::Expand { .. }), [r]) = (g.node(v).op(), xs.as_slice())
        && let Some(Op::Reshape { .. }) = g.node(*r).op()
        && let [x] = g.operands(*r).as_slice()
    {
        let (from, to) = (&g.node(*x).ty.shape, &g.node(*r).ty.shape);
        let lead = to.len().saturating_sub(from.len());
        if to.len() >= from.len() && to[lead..] == from[..] && to[..lead].iter().all(|&d| d == 1) {
            return vec![*x];
        }
    }
    xs
}

type Entry = (Vec<Item>, Vec<(usize, usize)>, Rc<Plan>);

thread_local! {
    static CACHE: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

fn lookup(items: &[Item], seeds: &[(usize, usize)]) -> Option<Rc<Plan>> {
    if items.len() > MAX_CACHED_ITEMS {
        return None;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let i = c
            .iter()
            .position(|(it, s, _)| it.as_slice() == items && s.as_slice() == seeds)?;
        // Most recently used last.
        let e = c.remove(i);
        let p = e.2.clone();
        c.push(e);
        Some(p)
    })
}

fn store(items: &[Item], seeds: &[(usize, usize)], plan: Rc<Plan>) {
    if items.len() > MAX_CACHED_ITEMS {
        return;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHE_SIZE {
            c.remove(0);
        }
        c.push((items.to_vec(), seeds.to_vec(), plan));
    });
}

/// Number of plans cached on this thread.
#[cfg(test)]
fn cached() -> usize {
    CACHE.with(|c| c.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_structure_reuses_its_plan_and_gives_the_same_gradients() {
        let before = cached();
        let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]).unwrap();
        w.requires_grad_(true).unwrap();
        let mut grads = Vec::new();
        for x in [[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]] {
            let x = Tensor::from_slice(&x, &[3]).unwrap();
            let y = w.mul(&x).unwrap().mul(&w).unwrap().sum().unwrap();
            y.backward().unwrap();
            grads.push(w.grad().unwrap().to_f64_vec());
            w.set_grad(None);
        }
        assert_eq!(cached(), (before + 1).min(CACHE_SIZE));
        // d/dw sum(w·x·w) = 2·w·x.
        assert_eq!(grads[0], vec![1.0, -4.0, 12.0]);
        assert_eq!(grads[1], vec![4.0, -10.0, 24.0]);
    }

    #[test]
    fn a_cached_plan_reads_this_call_s_numbers_and_saved_values() {
        let w = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
        w.requires_grad_(true).unwrap();
        for c in [2.0, -0.5, 3.0] {
            // Same structure every time; the Python number and exp(w·c) change.
            let y = w.mul_scalar(c).unwrap().exp().unwrap().sum().unwrap();
            y.backward().unwrap();
            let want: Vec<f64> = [1.0f64, -2.0].iter().map(|x| c * (x * c).exp()).collect();
            let got = w.grad().unwrap().to_f64_vec();
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                    "c = {c}: {got:?} vs {want:?}"
                );
            }
            w.set_grad(None);
        }
    }

    #[test]
    fn a_hot_plan_is_compiled_and_gives_the_same_gradients() {
        // A linear layer, a bias and a mean squared error: the training loop's structure.
        let x =
            Tensor::from_vec((0..21).map(|i| i as f32 * 0.25 - 2.0).collect(), &[7, 3]).unwrap();
        let w = Tensor::from_vec(vec![0.5f32, -1.0, 0.25, 2.0, 0.0, -0.5], &[2, 3]).unwrap();
        let b = Tensor::from_vec(vec![0.1f32, -0.2], &[2]).unwrap();
        w.requires_grad_(true).unwrap();
        b.requires_grad_(true).unwrap();
        let (xs, ws, bs) = (x.to_f64_vec(), w.to_f64_vec(), b.to_f64_vec());
        // f64 reference: loss = mean((x·wᵀ + b)²) over 7×2 values.
        let mut gw = [0.0f64; 6];
        let mut gb = [0.0f64; 2];
        for r in 0..7 {
            for o in 0..2 {
                let y: f64 = (0..3).map(|k| xs[r * 3 + k] * ws[o * 3 + k]).sum::<f64>() + bs[o];
                let d = 2.0 * y / 14.0;
                gb[o] += d;
                for k in 0..3 {
                    gw[o * 3 + k] += d * xs[r * 3 + k];
                }
            }
        }
        let mut plan = None;
        for _ in 0..COMPILE_AFTER + 2 {
            let y = x.linear(&w, Some(&b)).unwrap();
            let loss = y.square().unwrap().mean().unwrap();
            let node = loss.meta().node().unwrap();
            let mut walk = Walk::default();
            walk.seed(&node, &Tensor::ones(&[], crate::DType::F32))
                .unwrap();
            let g = walk.gradients().unwrap();
            for (got, want) in [(&g[0], &gw[..]), (&g[1], &gb[..])] {
                let got = got.as_ref().unwrap().to_f64_vec();
                for (a, e) in got.iter().zip(want) {
                    assert!((a - e).abs() < 1e-5, "{got:?} vs {want:?}");
                }
            }
            plan = lookup(&walk.items, &walk.seeds);
        }
        let plan = plan.unwrap();
        assert!(plan.runs.get() >= COMPILE_AFTER);
        assert!(matches!(plan.compiled.borrow().as_slice(), [(_, Some(_))]));
    }

    #[test]
    fn a_hot_plan_is_compiled_once_per_input_layout() {
        use crate::runtime::ConvOptions;
        let r = |shape: &[usize]| Tensor::randn(shape, Some(crate::DType::F32)).unwrap();
        let (x, w, gy) = (r(&[2, 3, 5, 6]), r(&[4, 3, 3, 3]), r(&[2, 4, 5, 6]));
        w.requires_grad_(true).unwrap();
        let cl = |t: &Tensor| t.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
        let (xl, gyl) = (cl(&x), cl(&gy));
        x.requires_grad_(true).unwrap();
        xl.requires_grad_(true).unwrap();
        let mut plan = None;
        for (x, gy) in [(&x, &gy), (&xl, &gyl)] {
            for _ in 0..COMPILE_AFTER + 2 {
                let y = x
                    .conv2d(&w, None, &ConvOptions::default().padding(1))
                    .unwrap();
                let mut walk = Walk::default();
                walk.seed(&y.meta().node().unwrap(), gy).unwrap();
                walk.gradients().unwrap();
                plan = lookup(&walk.items, &walk.seeds);
            }
        }
        let plan = plan.unwrap();
        let compiled = plan.compiled.borrow();
        // the inputs are gy, w and x in some order
        assert_eq!(compiled.len(), 2);
        for (layout, c) in compiled.iter() {
            let s = c.as_ref().unwrap().f.schedule();
            let nhwc = layout.iter().any(|&l| l);
            assert_eq!(
                layout.iter().filter(|&&l| l).count(),
                if nhwc { 2 } else { 0 }
            );
            let convs: Vec<bool> = s
                .externs()
                .map(|e| s.buffers[e.out].channels_last)
                .collect();
            // the input gradient follows gy; the weight gradient is plain [Cout, Cin, kH, kW]
            assert_eq!(convs, [nhwc, false], "{s}");
        }
    }

    #[test]
    fn the_same_leaf_used_twice_is_one_item() {
        let w = Tensor::from_vec(vec![3.0f64], &[1]).unwrap();
        w.requires_grad_(true).unwrap();
        let y = w.mul(&w).unwrap();
        let node = y.meta().node().unwrap();
        let mut walk = Walk::default();
        walk.seed(&node, &Tensor::ones(&[1], crate::DType::F64))
            .unwrap();
        assert_eq!(walk.leaf_list.len(), 1);
        let g = walk.gradients().unwrap();
        assert_eq!(g[0].as_ref().unwrap().to_f64_vec(), vec![6.0]);
    }
}
