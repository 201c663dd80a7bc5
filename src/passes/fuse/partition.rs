//! Fusion planning: which ops share a kernel. Classifies every value, realises what must be in
//! memory, prices recomputation, and groups roots into kernels under the rules of the
//! module docs.

use super::FuseOptions;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType};
use crate::ir::shape::{Shape, reduced_shape, reduction_dims, wrap_dim, wrap_dims};
use crate::ir::unary::Cost;
use crate::runtime::layout::Layout;
use crate::{Error, Result};
use std::collections::{BTreeSet, HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Input,
    Constant,
    /// `full`, `arange`, Python scalars: computed where used.
    Leaf,
    Pointwise,
    View,
    Reduction,
    Extern,
}

pub(super) fn classify(kind: &NodeKind) -> Class {
    let NodeKind::Op(op) = kind else {
        return Class::Input;
    };
    match op {
        Op::Constant(_) => Class::Constant,
        Op::Scalar(_) | Op::Full { .. } | Op::Arange { .. } => Class::Leaf,
        _ if op.is_pointwise() => Class::Pointwise,
        _ if op.keeps_elements() => Class::View,
        Op::Reduce { op, .. } if *op != ReduceOp::LogSumExp => Class::Reduction,
        Op::ArgMax { .. } | Op::ArgMin { .. } => Class::Reduction,
        _ => Class::Extern,
    }
}

/// The values of `g` kept channels_last when the graph inputs named `inputs` arrive so.
pub(crate) fn nhwc_values(g: &Graph, inputs: &[String]) -> HashSet<ValueId> {
    let order = g.topo_order();
    let class = order
        .iter()
        .map(|&v| (v, classify(&g.node(v).kind)))
        .collect();
    channels_last(g, &order, &class, inputs)
}

/// The values kept channels_last, as PyTorch's eager ops propagate the memory format: the
/// inputs named channels_last, then every 4-D result of a convolution, pooling or
/// pointwise op whose input (for pointwise ops: any full-size operand) is channels_last.
/// Views and reductions start no NHWC value (their results are laid out row-major).
fn channels_last(
    g: &Graph,
    order: &[ValueId],
    class: &HashMap<ValueId, Class>,
    inputs: &[String],
) -> HashSet<ValueId> {
    let mut nhwc = HashSet::new();
    if inputs.is_empty() {
        return nhwc;
    }
    let four_d = |v: ValueId| g.node(v).ty.ndim() == 4 && g.node(v).ty.shape[1] > 1;
    // a named input of one channel counts too: the same bytes either way, but the
    // convolution reading it then writes NHWC (PyTorch's `[N, 1, H, W]` channels_last input)
    for &v in g.inputs() {
        if inputs.contains(&g.node(v).name) && g.node(v).ty.ndim() == 4 {
            nhwc.insert(v);
        }
    }
    for &v in order {
        let Some(op) = g.node(v).op() else { continue };
        if !four_d(v) {
            continue;
        }
        let ops = g.operands(v);
        let follows = match op {
            Op::Conv { .. }
            | Op::MaxPool2d { .. }
            | Op::AvgPool2d { .. }
            | Op::AdaptiveAvgPool2d { .. }
            | Op::BatchNorm(_)
            | Op::Dropout { .. } => ops.first().is_some_and(|x| nhwc.contains(x)),
            Op::ConvInputGrad { .. }
            | Op::MaxPool2dGrad { .. }
            | Op::AvgPool2dGrad { .. }
            | Op::AdaptiveAvgPool2dGrad { .. } => ops.iter().any(|x| nhwc.contains(x)),
            _ if class[&v] == Class::Pointwise => ops
                .iter()
                .any(|x| nhwc.contains(x) && g.node(*x).ty.shape == g.node(v).ty.shape),
            _ => false,
        };
        if follows {
            nhwc.insert(v);
        }
    }
    nhwc
}

/// The row space of a reduction: its input shape and the reduced dims (sorted).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct RowKey {
    pub(super) shape: Shape,
    pub(super) dims: Vec<usize>,
}

impl RowKey {
    /// A reduction across rows (the last dim is kept, and is not 1): its row walks memory with
    /// a stride, so full-size values stored from its kernel would be written column by column.
    pub(super) fn is_column(&self) -> bool {
        let nd = self.shape.len();
        nd > 0 && !self.dims.is_empty() && !self.dims.contains(&(nd - 1)) && self.shape[nd - 1] > 1
    }

    fn outer(&self) -> Vec<usize> {
        (0..self.shape.len())
            .filter(|d| !self.dims.contains(d))
            .collect()
    }
    /// Position in the kernel space of each dim of the reduction input.
    pub(super) fn position(&self) -> Vec<usize> {
        let mut pos = vec![0; self.shape.len()];
        for (p, &d) in self.outer().iter().chain(&self.dims).enumerate() {
            pos[d] = p;
        }
        pos
    }
    pub(super) fn space(&self) -> (Shape, Shape) {
        let o = self.outer().iter().map(|&d| self.shape[d]).collect();
        let i = self.dims.iter().map(|&d| self.shape[d]).collect();
        (o, i)
    }
}

/// A kernel (or an extern call) being planned.
#[derive(Clone, Debug)]
pub(super) struct Unit {
    pub(super) roots: Vec<ValueId>,
    /// The row space of a row kernel.
    pub(super) row: Option<RowKey>,
    /// The index space of a pointwise kernel.
    pub(super) shape: Shape,
    pub(super) first: usize,
    pub(super) is_extern: bool,
}

/// The grouping of roots into kernels.
pub(super) struct Plan {
    pub(super) unit_of: HashMap<ValueId, usize>,
    pub(super) units: Vec<Unit>,
    /// Roots and buffers each root reads directly (through inline producers).
    pub(super) hits: HashMap<ValueId, Hits>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Hits {
    pub(super) roots: BTreeSet<ValueId>,
    pub(super) leaves: BTreeSet<ValueId>,
}

pub(super) struct Fuser<'g> {
    pub(super) g: &'g Graph,
    pub(super) opts: FuseOptions,
    pub(super) order: Vec<ValueId>,
    pub(super) pos: HashMap<ValueId, usize>,
    pub(super) class: HashMap<ValueId, Class>,
    pub(super) realized: HashSet<ValueId>,
    pub(super) isolated: HashSet<ValueId>,
    /// 4-D values stored NHWC (channels_last) when they are buffers.
    pub(super) nhwc: HashSet<ValueId>,
}

fn op_cost(op: &Op) -> u32 {
    match op {
        Op::Unary(u) => match u.cost() {
            Cost::Transcendental => 4,
            Cost::Divide => 2,
            Cost::Trivial | Cost::Select => 1,
        },
        Op::Binary(BinaryOp::Pow) => 4,
        Op::Binary(BinaryOp::Div | BinaryOp::Remainder | BinaryOp::DivTrunc) => 2,
        Op::Binary(BinaryOp::DivFloor) => 4,
        Op::Arange { .. } => 1,
        _ if op.is_pointwise() => 1,
        _ => 0,
    }
}

impl<'g> Fuser<'g> {
    pub(super) fn new(g: &'g Graph, opts: FuseOptions) -> Fuser<'g> {
        let order = g.topo_order();
        let pos = order.iter().enumerate().map(|(i, &v)| (v, i)).collect();
        let class = order
            .iter()
            .map(|&v| (v, classify(&g.node(v).kind)))
            .collect();
        let nhwc = channels_last(g, &order, &class, &opts.channels_last_inputs);
        Fuser {
            g,
            opts,
            order,
            pos,
            class,
            realized: HashSet::new(),
            isolated: HashSet::new(),
            nhwc,
        }
    }

    /// The strides of `v`'s buffer: row-major, or NHWC for a channels_last value.
    pub(super) fn buffer_layout(&self, v: ValueId) -> Layout {
        let shape = &self.ty(v).shape;
        if self.nhwc.contains(&v) {
            Layout::contiguous(&[shape[0], shape[2], shape[3], shape[1]]).permute(&[0, 3, 1, 2])
        } else {
            Layout::contiguous(shape)
        }
    }

    /// Eager `view` fails where its operand's layout (strided after transposes and the like,
    /// dense after any computing op) cannot take the new shape; a compiled graph keeps that
    /// error even though its kernels could read the values through an index map.
    pub(super) fn check_views(&self) -> Result<()> {
        let eager_buffer = |u: ValueId| self.class[&u] != Class::View;
        for &v in &self.order {
            if !matches!(self.op(v), Some(Op::View { .. })) {
                continue;
            }
            let src = self.g.operands(v)[0];
            if let Some((_, l)) = self.layout_of(src, &eager_buffer)
                && l.view(&self.ty(v).shape).is_none()
            {
                return Err(Error::Shape(format!(
                    "%{}: view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.",
                    self.g.node(v).name
                )));
            }
        }
        Ok(())
    }

    pub(super) fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.node(v).ty
    }

    pub(super) fn op(&self, v: ValueId) -> Option<&Op> {
        self.g.node(v).op()
    }

    pub(super) fn is_root(&self, v: ValueId) -> bool {
        let c = self.class[&v];
        c == Class::Reduction
            || (self.realized.contains(&v)
                && matches!(c, Class::Pointwise | Class::View | Class::Leaf))
    }

    /// Whether `v` is a graph input or a captured constant: alive for the whole call.
    pub(super) fn is_input_or_constant(&self, v: ValueId) -> bool {
        matches!(self.class[&v], Class::Input | Class::Constant)
    }

    /// Values that live in a buffer for every reader outside their own kernel.
    fn is_buffer(&self, v: ValueId) -> bool {
        matches!(
            self.class[&v],
            Class::Input | Class::Constant | Class::Extern
        ) || self.realized.contains(&v)
    }

    /// The layout of `v` over the buffer of its base, when `v` is a buffer or a chain of views
    /// over one (`is_buf` says which values count as buffers).
    pub(super) fn layout_of(
        &self,
        v: ValueId,
        is_buf: &dyn Fn(ValueId) -> bool,
    ) -> Option<(ValueId, Layout)> {
        if is_buf(v) {
            return Some((v, self.buffer_layout(v)));
        }
        if self.class[&v] != Class::View {
            return None;
        }
        let src = self.g.operands(v)[0];
        let (base, l) = self.layout_of(src, is_buf)?;
        let out = &self.ty(v).shape;
        let op = self.op(v)?;
        let nd = l.ndim();
        let l = match op {
            Op::Reshape { .. } | Op::View { .. } | Op::Flatten { .. } => l.view(out)?,
            Op::Contiguous => l,
            Op::Permute { dims } => l.permute(&wrap_dims(dims, nd).ok()?),
            Op::Transpose { dim0, dim1 } => {
                l.transpose(wrap_dim(*dim0, nd).ok()?, wrap_dim(*dim1, nd).ok()?)
            }
            Op::T => {
                if nd < 2 {
                    l
                } else {
                    l.transpose(0, 1)
                }
            }
            Op::Expand { .. } => l.expand(out),
            Op::Squeeze { dim } => {
                let dims = match dim {
                    None => (0..nd).collect(),
                    Some(d) => wrap_dims(d, nd).ok()?,
                };
                l.squeeze(&dims)
            }
            Op::Unsqueeze { dim } => l.unsqueeze(wrap_dim(*dim, nd + 1).ok()?),
            Op::Narrow { dim, start, length } => l.narrow(*dim, *start, *length).ok()?,
            Op::Select { dim, index } => l.select(*dim, *index).ok()?,
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => l.slice(*dim, *start, *end, *step).ok()?,
            Op::Diagonal { offset, dim1, dim2 } => l.diagonal(*offset, *dim1, *dim2).ok()?,
            _ => return None,
        };
        (l.shape == *out).then_some((base, l))
    }

    /// The first value under a chain of views.
    fn view_base(&self, mut v: ValueId) -> ValueId {
        while self.class[&v] == Class::View {
            v = self.g.operands(v)[0];
        }
        v
    }

    /// Realises what must be in memory: graph outputs and extern operands.
    pub(super) fn realize_boundaries(&mut self) -> Result<()> {
        let mut needs: Vec<ValueId> = self.g.outputs().to_vec();
        for &v in &self.order {
            if self.class[&v] == Class::Extern {
                needs.extend(self.g.operands(v));
            }
        }
        for v in needs {
            let base = self.view_base(v);
            if !self.is_buffer(base) {
                self.realized.insert(base);
            }
            if self.layout_of(v, &|x| self.is_buffer(x)).is_none() {
                self.realized.insert(v);
            }
        }
        Ok(())
    }

    /// Stores every pointwise op and reduction in a kernel of its own (the unfused mode).
    pub(super) fn separate_all(&mut self) {
        for &v in &self.order {
            if matches!(self.class[&v], Class::Pointwise | Class::Reduction) {
                self.realized.insert(v);
                self.isolated.insert(v);
            }
        }
    }

    /// Cost of recomputing `v` where it is read (0 for buffers and roots, which are loaded).
    pub(super) fn cone_cost(&self, v: ValueId, memo: &mut HashMap<ValueId, u32>) -> u32 {
        if let Some(&c) = memo.get(&v) {
            return c;
        }
        let c = match self.class[&v] {
            Class::Pointwise | Class::View | Class::Leaf => {
                let own = self.op(v).map_or(0, op_cost);
                let ops: u32 = self
                    .g
                    .operands(v)
                    .iter()
                    .map(|&o| {
                        if self.is_root(o) || self.is_buffer(o) {
                            0
                        } else {
                            self.cone_cost(o, memo)
                        }
                    })
                    .sum();
                own.saturating_add(ops)
            }
            _ => 0,
        };
        memo.insert(v, c);
        c
    }

    /// The buffers (realised values included) of `v`'s size that computing `v` reads, through
    /// its recomputed pointwise ops and views.
    pub(super) fn cone_reads(&self, v: ValueId) -> HashSet<ValueId> {
        let n = self.ty(v).numel();
        let mut seen = HashSet::new();
        let mut reads = HashSet::new();
        let mut stack = vec![v];
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            for o in self.g.operands(x) {
                if self.is_root(o) || self.is_buffer(o) {
                    if self.ty(o).numel() == n {
                        reads.insert(o);
                    }
                } else if matches!(self.class[&o], Class::Pointwise | Class::View) {
                    stack.push(o);
                }
            }
        }
        reads
    }

    /// Realises the costliest operand of any expression whose cone exceeds `max_cone`.
    pub(super) fn cut_large_cones(&mut self) {
        loop {
            let mut memo = HashMap::new();
            let mut cut = None;
            for &v in &self.order {
                if self.cone_cost(v, &mut memo) > self.opts.max_cone {
                    cut = self
                        .g
                        .operands(v)
                        .into_iter()
                        .filter(|&o| !self.is_root(o) && !self.is_buffer(o))
                        .max_by_key(|&o| self.cone_cost(o, &mut memo));
                    break;
                }
            }
            match cut {
                Some(o) => {
                    self.realized.insert(o);
                }
                None => return,
            }
        }
    }

    /// Roots and buffers that root `t` reads through inline producers.
    fn hits(&self, t: ValueId) -> Hits {
        let mut h = Hits::default();
        let mut seen = HashSet::new();
        let mut stack = self.g.operands(t);
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            if self.is_root(v) {
                h.roots.insert(v);
            } else if self.is_buffer(v) {
                h.leaves.insert(v);
            } else {
                stack.extend(self.g.operands(v));
            }
        }
        h
    }

    pub(super) fn row_key(&self, r: ValueId) -> RowKey {
        let x = self.g.operands(r)[0];
        let shape = self.ty(x).shape.clone();
        let nd = shape.len();
        let dims = match self.op(r) {
            Some(Op::Reduce { dim, .. }) => reduction_dims(dim, nd).unwrap_or_default(),
            Some(Op::ArgMax { dim, .. } | Op::ArgMin { dim, .. }) => match dim {
                Some(d) if nd > 0 => wrap_dim(*d, nd).map(|d| vec![d]).unwrap_or_default(),
                _ => (0..nd).collect(),
            },
            _ => vec![],
        };
        let mut dims = dims;
        dims.sort_unstable();
        dims.dedup();
        RowKey { shape, dims }
    }

    /// Whether a root of shape `shape` can be stored by a row kernel over `key`.
    fn fits_row(&self, key: &RowKey, shape: &[usize]) -> bool {
        shape == key.shape.as_slice()
            || shape == reduced_shape(&key.shape, &key.dims, true).as_slice()
            || shape == reduced_shape(&key.shape, &key.dims, false).as_slice()
    }

    pub(super) fn plan(&self) -> Plan {
        let mut p = Plan {
            unit_of: HashMap::new(),
            units: Vec::new(),
            hits: HashMap::new(),
        };
        for &v in &self.order {
            if self.class[&v] == Class::Extern {
                let u = p.units.len();
                p.units.push(Unit {
                    roots: vec![v],
                    row: None,
                    shape: vec![],
                    first: self.pos[&v],
                    is_extern: true,
                });
                p.unit_of.insert(v, u);
                p.hits.insert(v, self.extern_hits(v));
                continue;
            }
            if !self.is_root(v) {
                continue;
            }
            let h = self.hits(v);
            let chosen = if self.isolated.contains(&v) {
                None
            } else {
                self.choose_unit(&p, v, &h)
            };
            let u = match chosen {
                Some(u) => {
                    if self.class[&v] == Class::Reduction {
                        p.units[u].row = Some(self.row_key(v));
                    }
                    p.units[u].roots.push(v);
                    u
                }
                None => {
                    let row = (self.class[&v] == Class::Reduction).then(|| self.row_key(v));
                    p.units.push(Unit {
                        roots: vec![v],
                        row,
                        shape: self.ty(v).shape.clone(),
                        first: self.pos[&v],
                        is_extern: false,
                    });
                    p.units.len() - 1
                }
            };
            p.unit_of.insert(v, u);
            p.hits.insert(v, h);
        }
        p
    }

    /// An extern call reads the roots and buffers under its operands' views: the first
    /// realised value down each chain (a view realised because no layout expresses it is
    /// read from its own buffer, not from the base under it).
    fn extern_hits(&self, v: ValueId) -> Hits {
        let mut h = Hits::default();
        for mut b in self.g.operands(v) {
            while self.class[&b] == Class::View && !self.realized.contains(&b) {
                b = self.g.operands(b)[0];
            }
            if self.is_root(b) {
                h.roots.insert(b);
            } else {
                h.leaves.insert(b);
            }
        }
        h
    }

    /// The kernel root `t` joins, if any: first a kernel it reads from, then one it shares an
    /// input with; never a cycle, never too far back.
    fn choose_unit(&self, p: &Plan, t: ValueId, h: &Hits) -> Option<usize> {
        let pos = self.pos[&t];
        let shape = &self.ty(t).shape;
        let is_red = self.class[&t] == Class::Reduction;
        let key = is_red.then(|| self.row_key(t));
        let t_nhwc = self.nhwc.contains(&t);
        let fits = |u: &Unit| -> bool {
            if u.is_extern || pos - u.first > self.opts.max_distance {
                return false;
            }
            if u.roots.iter().any(|r| self.isolated.contains(r)) {
                return false;
            }
            // Full-size values stay out of column reductions: a pointwise kernel stores them
            // contiguously, and the reduction reads them back (strided stores cost several times more).
            match (&key, &u.row) {
                (Some(k), Some(r)) => k == r,
                (Some(k), None) => u.shape == k.shape && !k.is_column(),
                (None, Some(r)) => self.fits_row(r, shape) && !(r.is_column() && *shape == r.shape),
                // one store order per pointwise kernel: an NHWC value and a row-major one
                // of equal sizes ([N, C, H, W] with H = W = C) would leave one of them
                // written and read across its rows
                (None, None) => u.shape == *shape && self.nhwc.contains(&u.roots[0]) == t_nhwc,
            }
        };
        let mut cands: Vec<usize> = h
            .roots
            .iter()
            .filter_map(|r| p.unit_of.get(r).copied())
            .collect();
        cands.sort_by_key(|&u| std::cmp::Reverse(p.units[u].first));
        let shared: Vec<usize> = (0..p.units.len())
            .filter(|&u| {
                p.units[u].roots.iter().any(|r| {
                    p.hits.get(r).is_some_and(|rh| {
                        !rh.leaves.is_disjoint(&h.leaves) || !rh.roots.is_disjoint(&h.roots)
                    })
                })
            })
            .collect();
        cands.extend(shared);
        let mut tried = HashSet::new();
        cands
            .into_iter()
            .find(|&u| tried.insert(u) && fits(&p.units[u]) && !self.makes_cycle(p, u, h))
    }

    /// True when adding a root with hits `h` to unit `u` would make `u` depend on itself.
    fn makes_cycle(&self, p: &Plan, u: usize, h: &Hits) -> bool {
        let deps_of = |x: usize| -> Vec<usize> {
            let mut d = Vec::new();
            for r in &p.units[x].roots {
                if let Some(rh) = p.hits.get(r) {
                    for t in rh.roots.iter().chain(&rh.leaves) {
                        if let Some(&y) = p.unit_of.get(t)
                            && y != x
                        {
                            d.push(y);
                        }
                    }
                }
            }
            d
        };
        let mut stack: Vec<usize> = h
            .roots
            .iter()
            .chain(&h.leaves)
            .filter_map(|t| p.unit_of.get(t).copied())
            .filter(|&y| y != u)
            .collect();
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            if x == u {
                return true;
            }
            if seen.insert(x) {
                stack.extend(deps_of(x));
            }
        }
        false
    }
}
