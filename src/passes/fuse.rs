//! The fusion partitioner: graph → [`Schedule`] of fused kernels and extern calls.
//!
//! Run [`super::decompose::decompose`] first (or call [`compile`]) so composites are visible.
//!
//! ## Model
//! Every graph value is one of: a buffer (input, captured constant, extern result), a view
//! (folded into the index maps of its readers), an inline leaf (`full`, `arange`, Python
//! scalars: constants and positions), a pointwise op, or a reduction. Pointwise ops are
//! recomputed inside every kernel that reads them unless they are *realised* (stored to a
//! buffer). Realised values and reductions are the *roots*; roots are grouped into kernels:
//! - a **pointwise kernel** stores roots of one shape (its index space);
//! - a **row kernel** holds reductions of one row space (input shape `S`, reduced dims `R`;
//!   space = kept dims ++ reduced dims) in dependency-ordered passes, its pointwise prologue
//!   (inlined into the reductions), and its epilogue: roots of shape `S` (which may read the
//!   reductions broadcast back along the row: softmax, layer_norm) and roots of the reduced
//!   shape (row stores);
//! - `matmul` and ops without a kernel lowering are **extern calls** on strided views of
//!   their operands (a transposed weight is a view, not a copy). Their epilogue (bias,
//!   activation, scale, residual) is an ordinary pointwise kernel that follows them.
//!
//! ## Rules (and whose they are)
//! - Graph outputs and extern operands are materialised (tinygrad, Inductor); an output that
//!   is a view of a buffer is returned as that view, without a copy.
//! - At most one reduction row space per kernel (tinygrad). A consumer of a reduction joins its
//!   kernel only when it reads the reduced value at the row it is computing, i.e. through the
//!   keepdim broadcast along the row (tinygrad's "same size" rule, widened to the broadcast
//!   that softmax needs); a read at another row stores the reduction and reloads it.
//! - A producer that costs [`FuseOptions::expensive`] or more is not recomputed for every
//!   element of a broadcast (XLA: no expensive producer into a consumer that reuses its
//!   elements), nor in several kernels (XLA's duplication limit): it is realised instead.
//!   Values that depend only on the row are computed once per row, so they do not count as
//!   duplicated inside a row kernel.
//! - A root does not join a kernel whose first root is more than
//!   [`FuseOptions::max_distance`] nodes earlier in topological order (Inductor's proximity
//!   rule, which protects peak memory), and a recomputed expression cone is cut at
//!   [`FuseOptions::max_cone`] (XLA's code-size limit).
//! - Extern kernels never fuse inward (Inductor); grouping never creates a cycle between
//!   steps.
//! - Horizontal fusion: roots of the same index space that share an input share a kernel.
//!
//! Decisions that turn out impossible while building a kernel (a reshape that no affine map
//! can express, a reduction read at another row) are resolved by realising the value or
//! isolating the root, and planning again; every round adds one such decision, so planning
//! ends.

use super::decompose::decompose;
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType, reduction_dims};
use crate::ir::shape::{Shape, contiguous_strides, reduced_shape, wrap_dim, wrap_dims};
use crate::ir::unary::Cost;
use crate::kernel::{
    Buffer, BufferId, BufferKind, Combiner, Expr, ExternCall, IndexMap, Kernel, Schedule, Step,
    ValId, Value, View, accumulator,
};
use crate::runtime::layout::Layout;
use crate::{Error, Result};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Limits of the partitioner.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Cost from which a producer is realised rather than recomputed per broadcast element
    /// or in several kernels (an `exp` costs 4, an `add` 1).
    pub expensive: u32,
    /// Largest cost of an expression recomputed inside one kernel.
    pub max_cone: u32,
    /// Largest distance in topological order between the first and the last root of a kernel.
    pub max_distance: usize,
    /// False for the unfused baseline: every pointwise op and reduction is its own kernel
    /// (views are still folded into index maps, matmul is still an extern call).
    pub fuse: bool,
}

impl Default for FuseOptions {
    fn default() -> FuseOptions {
        FuseOptions {
            expensive: 8,
            max_cone: 256,
            max_distance: 64,
            fuse: true,
        }
    }
}

/// Decomposes composites, then fuses: the usual way from a graph to a schedule.
pub fn compile(g: &Graph) -> Result<Schedule> {
    fuse(&decompose(g)?)
}

/// Partitions `g` into a schedule with the default limits.
pub fn fuse(g: &Graph) -> Result<Schedule> {
    fuse_with(g, &FuseOptions::default())
}

/// Fails where eager execution of `g` would fail a `view` for its operand's layout.
pub fn check_views(g: &Graph) -> Result<()> {
    Fuser::new(g, FuseOptions::default()).check_views()
}

/// Partitions `g` into a schedule.
pub fn fuse_with(g: &Graph, opts: &FuseOptions) -> Result<Schedule> {
    g.verify()?;
    let mut f = Fuser::new(g, opts.clone());
    f.check_views()?;
    f.realize_boundaries()?;
    if !opts.fuse {
        f.separate_all();
    }
    for _ in 0..4 * g.len() + 16 {
        f.cut_large_cones();
        let plan = f.plan();
        match f.build(&plan) {
            Ok(s) => return Ok(s),
            Err(Fail::Error(e)) => return Err(e),
            Err(Fail::Realize { node, root }) => {
                if !f.realized.insert(node) && !f.isolated.insert(root) {
                    return Err(stuck(g, root));
                }
            }
            Err(Fail::Isolate(root)) => {
                if !f.isolated.insert(root) {
                    return Err(stuck(g, root));
                }
            }
        }
    }
    Err(Error::Unsupported(format!(
        "fusion of graph {} did not settle",
        g.name
    )))
}

fn stuck(g: &Graph, v: ValueId) -> Error {
    Error::Unsupported(format!("fusion: no kernel can compute %{}", g.node(v).name))
}

/// Why a kernel could not be built as planned.
enum Fail {
    /// Store `node` to a buffer (it is read where recomputing or mapping it is not possible).
    Realize {
        node: ValueId,
        root: ValueId,
    },
    /// `root` must get a kernel of its own.
    Isolate(ValueId),
    Error(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Error(e)
    }
}

type R<T> = std::result::Result<T, Fail>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Input,
    Constant,
    /// `full`, `arange`, Python scalars: computed where used.
    Leaf,
    Pointwise,
    View,
    Reduction,
    Extern,
}

fn classify(kind: &NodeKind) -> Class {
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

/// The row space of a reduction: its input shape and the reduced dims (sorted).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RowKey {
    shape: Shape,
    dims: Vec<usize>,
}

impl RowKey {
    /// A reduction across rows (the last dim is kept, and is not 1): its row walks memory with
    /// a stride, so full-size values stored from its kernel would be written column by column.
    fn is_column(&self) -> bool {
        let nd = self.shape.len();
        nd > 0 && !self.dims.is_empty() && !self.dims.contains(&(nd - 1)) && self.shape[nd - 1] > 1
    }

    fn outer(&self) -> Vec<usize> {
        (0..self.shape.len())
            .filter(|d| !self.dims.contains(d))
            .collect()
    }
    /// Position in the kernel space of each dim of the reduction input.
    fn position(&self) -> Vec<usize> {
        let mut pos = vec![0; self.shape.len()];
        for (p, &d) in self.outer().iter().chain(&self.dims).enumerate() {
            pos[d] = p;
        }
        pos
    }
    fn space(&self) -> (Shape, Shape) {
        let o = self.outer().iter().map(|&d| self.shape[d]).collect();
        let i = self.dims.iter().map(|&d| self.shape[d]).collect();
        (o, i)
    }
}

/// An affine map from a kernel space to a value's multi-index:
/// `index[k] = off[k] + Σ_d coef[k][d] * i[d]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AMap {
    coef: Vec<Vec<i64>>,
    off: Vec<i64>,
}

impl AMap {
    fn identity(n: usize) -> AMap {
        let coef = (0..n)
            .map(|k| (0..n).map(|d| (k == d) as i64).collect())
            .collect();
        AMap {
            coef,
            off: vec![0; n],
        }
    }
    fn zero_row(&self) -> Vec<i64> {
        vec![0; self.cols()]
    }
    fn cols(&self) -> usize {
        self.coef.first().map_or(0, Vec::len)
    }
    /// Through a row-major layout with `strides` and `offset`: an index map into storage.
    fn through(&self, strides: &[usize], offset: usize, cols: usize) -> R<IndexMap> {
        let mut st = vec![0i64; cols];
        let mut off = offset as i64;
        for (k, &s) in strides.iter().enumerate() {
            off += s as i64 * self.off[k];
            // a row derived from a 0-d map (which has no rows to count columns by) is empty:
            // it moves along nothing
            for (c, &a) in st.iter_mut().zip(&self.coef[k]) {
                *c += s as i64 * a;
            }
        }
        if off < 0 || st.iter().any(|&s| s < 0) {
            return Err(Fail::Error(Error::Unsupported(
                "fusion: a negative stride in an index map".into(),
            )));
        }
        Ok(IndexMap {
            strides: st.into_iter().map(|s| s as usize).collect(),
            offset: off as usize,
        })
    }
}

/// A kernel (or an extern call) being planned.
#[derive(Clone, Debug)]
struct Unit {
    roots: Vec<ValueId>,
    /// The row space of a row kernel.
    row: Option<RowKey>,
    /// The index space of a pointwise kernel.
    shape: Shape,
    first: usize,
    is_extern: bool,
}

/// The grouping of roots into kernels.
struct Plan {
    unit_of: HashMap<ValueId, usize>,
    units: Vec<Unit>,
    /// Roots and buffers each root reads directly (through inline producers).
    hits: HashMap<ValueId, Hits>,
}

#[derive(Clone, Debug, Default)]
struct Hits {
    roots: BTreeSet<ValueId>,
    leaves: BTreeSet<ValueId>,
}

struct Fuser<'g> {
    g: &'g Graph,
    opts: FuseOptions,
    order: Vec<ValueId>,
    pos: HashMap<ValueId, usize>,
    class: HashMap<ValueId, Class>,
    realized: HashSet<ValueId>,
    isolated: HashSet<ValueId>,
}

fn op_cost(op: &Op) -> u32 {
    match op {
        Op::Unary(u) => match u.cost() {
            Cost::Transcendental => 4,
            Cost::Divide => 2,
            Cost::Trivial | Cost::Select => 1,
        },
        Op::Binary(BinaryOp::Pow) => 4,
        Op::Binary(BinaryOp::Div | BinaryOp::Remainder) => 2,
        Op::Arange { .. } => 1,
        _ if op.is_pointwise() => 1,
        _ => 0,
    }
}

impl<'g> Fuser<'g> {
    fn new(g: &'g Graph, opts: FuseOptions) -> Fuser<'g> {
        let order = g.topo_order();
        let pos = order.iter().enumerate().map(|(i, &v)| (v, i)).collect();
        let class = order
            .iter()
            .map(|&v| (v, classify(&g.node(v).kind)))
            .collect();
        Fuser {
            g,
            opts,
            order,
            pos,
            class,
            realized: HashSet::new(),
            isolated: HashSet::new(),
        }
    }

    /// Eager `view` fails where its operand's layout (strided after transposes and the like,
    /// dense after any computing op) cannot take the new shape; a compiled graph keeps that
    /// error even though its kernels could read the values through an index map.
    fn check_views(&self) -> Result<()> {
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

    fn ty(&self, v: ValueId) -> &TensorType {
        &self.g.node(v).ty
    }

    fn op(&self, v: ValueId) -> Option<&Op> {
        self.g.node(v).op()
    }

    fn is_root(&self, v: ValueId) -> bool {
        let c = self.class[&v];
        c == Class::Reduction
            || (self.realized.contains(&v)
                && matches!(c, Class::Pointwise | Class::View | Class::Leaf))
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
    fn layout_of(&self, v: ValueId, is_buf: &dyn Fn(ValueId) -> bool) -> Option<(ValueId, Layout)> {
        if is_buf(v) {
            return Some((v, Layout::contiguous(&self.ty(v).shape)));
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
    fn realize_boundaries(&mut self) -> Result<()> {
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
    fn separate_all(&mut self) {
        for &v in &self.order {
            if matches!(self.class[&v], Class::Pointwise | Class::Reduction) {
                self.realized.insert(v);
                self.isolated.insert(v);
            }
        }
    }

    /// Cost of recomputing `v` where it is read (0 for buffers and roots, which are loaded).
    fn cone_cost(&self, v: ValueId, memo: &mut HashMap<ValueId, u32>) -> u32 {
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

    /// Realises the costliest operand of any expression whose cone exceeds `max_cone`.
    fn cut_large_cones(&mut self) {
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

    fn row_key(&self, r: ValueId) -> RowKey {
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

    fn plan(&self) -> Plan {
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

    /// An extern call reads the roots and buffers under its operands' views.
    fn extern_hits(&self, v: ValueId) -> Hits {
        let mut h = Hits::default();
        for o in self.g.operands(v) {
            let b = self.view_base(o);
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
        let fits = |u: &Unit| -> bool {
            if u.is_extern || pos - u.first > self.opts.max_distance {
                return false;
            }
            if u.roots.iter().any(|r| self.isolated.contains(r)) {
                return false;
            }
            // Full-size values stay out of column reductions: a pointwise kernel stores them
            // contiguously, and the reduction reads them back (strided stores cost ~4×).
            match (&key, &u.row) {
                (Some(k), Some(r)) => k == r,
                (Some(k), None) => u.shape == k.shape && !k.is_column(),
                (None, Some(r)) => self.fits_row(r, shape) && !(r.is_column() && *shape == r.shape),
                (None, None) => u.shape == *shape,
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

    /// Builds the schedule of `plan`, or says which decision to change.
    fn build(&self, p: &Plan) -> R<Schedule> {
        let stored = self.stored(p);
        let mut bufs: Vec<Buffer> = Vec::new();
        let mut buf_of: HashMap<ValueId, BufferId> = HashMap::new();
        let mut inputs = Vec::new();
        for (i, &v) in self.g.inputs().iter().enumerate() {
            buf_of.insert(v, bufs.len());
            inputs.push(bufs.len());
            bufs.push(self.buffer(v, BufferKind::Input(i)));
        }
        for &v in &self.order {
            let kind = match (self.class[&v], self.op(v)) {
                (Class::Constant, Some(Op::Constant(lit))) => BufferKind::Constant(lit.clone()),
                (Class::Extern, _) => BufferKind::Temp,
                _ if stored.contains(&v) => BufferKind::Temp,
                _ => continue,
            };
            buf_of.insert(v, bufs.len());
            bufs.push(self.buffer(v, kind));
        }
        let mut steps_by_unit: Vec<Step> = Vec::with_capacity(p.units.len());
        let mut emitted: Vec<HashSet<ValueId>> = Vec::new();
        for (u, unit) in p.units.iter().enumerate() {
            if unit.is_extern {
                let v = unit.roots[0];
                steps_by_unit.push(Step::Extern(self.extern_call(v, &buf_of)?));
                emitted.push(HashSet::new());
                continue;
            }
            let mut kb = KernelBuilder::new(self, p, u, &buf_of, &stored);
            let k = kb.build()?;
            emitted.push(kb.inlined);
            steps_by_unit.push(Step::Kernel(k));
        }
        self.check_duplication(&emitted)?;
        let order = self.unit_order(p);
        let mut steps: Vec<Option<Step>> = steps_by_unit.into_iter().map(Some).collect();
        let mut out_steps = Vec::new();
        for (i, u) in order.into_iter().enumerate() {
            if let Some(mut s) = steps[u].take() {
                if let Step::Kernel(k) = &mut s {
                    k.name = format!("k{i}_{}", k.name);
                }
                out_steps.push(s);
            }
        }
        let mut outputs = Vec::new();
        for &o in self.g.outputs() {
            let Some((base, l)) = self.layout_of(o, &|x| buf_of.contains_key(&x)) else {
                return Err(Fail::Realize { node: o, root: o });
            };
            outputs.push(View {
                buffer: buf_of[&base],
                shape: l.shape,
                strides: l.strides,
                offset: l.offset,
            });
        }
        let s = Schedule {
            name: self.g.name.clone(),
            buffers: bufs,
            inputs,
            outputs,
            steps: out_steps,
        };
        s.validate()?;
        Ok(s)
    }

    fn buffer(&self, v: ValueId, kind: BufferKind) -> Buffer {
        let n = self.g.node(v);
        Buffer {
            name: n.name.clone(),
            dtype: n.ty.dtype,
            shape: n.ty.shape.clone(),
            kind,
        }
    }

    /// Roots that are written to memory: realised values, and reductions read elsewhere.
    fn stored(&self, p: &Plan) -> HashSet<ValueId> {
        let mut s: HashSet<ValueId> = self
            .realized
            .iter()
            .copied()
            .filter(|v| self.is_root(*v))
            .collect();
        for (t, h) in &p.hits {
            for r in &h.roots {
                if p.unit_of.get(r) != p.unit_of.get(t) {
                    s.insert(*r);
                }
            }
        }
        s
    }

    fn extern_call(&self, v: ValueId, buf_of: &HashMap<ValueId, BufferId>) -> R<ExternCall> {
        let mut args = Vec::new();
        for o in self.g.operands(v) {
            let Some((base, l)) = self.layout_of(o, &|x| buf_of.contains_key(&x)) else {
                return Err(Fail::Realize { node: o, root: v });
            };
            args.push(View {
                buffer: buf_of[&base],
                shape: l.shape,
                strides: l.strides,
                offset: l.offset,
            });
        }
        Ok(ExternCall {
            op: self.op(v).cloned().unwrap_or(Op::Contiguous),
            args,
            out: buf_of[&v],
        })
    }

    /// Realises an expensive producer that several kernels recompute.
    fn check_duplication(&self, emitted: &[HashSet<ValueId>]) -> R<()> {
        let mut count: HashMap<ValueId, usize> = HashMap::new();
        for set in emitted {
            for &v in set {
                *count.entry(v).or_default() += 1;
            }
        }
        let mut memo = HashMap::new();
        let mut dup: Vec<ValueId> = count
            .into_iter()
            .filter(|&(_, c)| c > 1)
            .map(|(v, _)| v)
            .filter(|&v| self.cone_cost(v, &mut memo) >= self.opts.expensive)
            .collect();
        dup.sort_by_key(|v| self.pos[v]);
        match dup.last() {
            Some(&v) => Err(Fail::Realize { node: v, root: v }),
            None => Ok(()),
        }
    }

    /// Steps in dependency order, earliest first among the ready ones.
    fn unit_order(&self, p: &Plan) -> Vec<usize> {
        let n = p.units.len();
        let mut deps: Vec<HashSet<usize>> = vec![HashSet::new(); n];
        for (u, unit) in p.units.iter().enumerate() {
            for r in &unit.roots {
                if let Some(h) = p.hits.get(r) {
                    for t in h.roots.iter().chain(&h.leaves) {
                        if let Some(&y) = p.unit_of.get(t)
                            && y != u
                        {
                            deps[u].insert(y);
                        }
                    }
                }
            }
        }
        let mut done = vec![false; n];
        let mut order = Vec::with_capacity(n);
        while order.len() < n {
            let next = (0..n)
                .filter(|&u| !done[u] && deps[u].iter().all(|&d| done[d]))
                .min_by_key(|&u| p.units[u].first);
            let Some(u) = next else { break };
            done[u] = true;
            order.push(u);
        }
        order
    }
}

/// Builds one kernel of a plan.
struct KernelBuilder<'a, 'g> {
    f: &'a Fuser<'g>,
    p: &'a Plan,
    unit: usize,
    buf_of: &'a HashMap<ValueId, BufferId>,
    stored: &'a HashSet<ValueId>,
    outer: Shape,
    inner: Shape,
    row: Option<RowKey>,
    values: Vec<Value>,
    memo: HashMap<(ValueId, AMap), ValId>,
    cse: HashMap<String, ValId>,
    reduced: HashMap<ValueId, ValId>,
    /// Pointwise values recomputed here (for the duplication rule).
    inlined: HashSet<ValueId>,
    root: ValueId,
}

impl<'a, 'g> KernelBuilder<'a, 'g> {
    fn new(
        f: &'a Fuser<'g>,
        p: &'a Plan,
        unit: usize,
        buf_of: &'a HashMap<ValueId, BufferId>,
        stored: &'a HashSet<ValueId>,
    ) -> Self {
        let u = &p.units[unit];
        let (outer, inner) = match &u.row {
            Some(k) => k.space(),
            None => (u.shape.clone(), vec![]),
        };
        KernelBuilder {
            f,
            p,
            unit,
            buf_of,
            stored,
            outer,
            inner,
            row: u.row.clone(),
            values: Vec::new(),
            memo: HashMap::new(),
            cse: HashMap::new(),
            reduced: HashMap::new(),
            inlined: HashSet::new(),
            root: u.roots[0],
        }
    }

    fn ndims(&self) -> usize {
        self.outer.len() + self.inner.len()
    }

    fn push(&mut self, expr: Expr, dtype: DType) -> ValId {
        let key = format!("{expr:?}:{dtype:?}");
        if let Some(&v) = self.cse.get(&key) {
            return v;
        }
        self.values.push(Value { expr, dtype });
        let id = self.values.len() - 1;
        self.cse.insert(key, id);
        id
    }

    fn build(&mut self) -> R<Kernel> {
        let roots = self.p.units[self.unit].roots.clone();
        let mut stores = Vec::new();
        for &t in &roots {
            self.root = t;
            let m = self.root_map(t)?;
            let v = self.emit(t, &m)?;
            if self.stored.contains(&t) {
                let b = self.buf_of[&t];
                let strides = contiguous_strides(&self.f.ty(t).shape);
                let map = m.through(&strides, 0, self.ndims())?;
                stores.push(crate::kernel::Store {
                    buffer: b,
                    map,
                    value: v,
                });
            }
        }
        let passes = self.passes();
        Ok(Kernel {
            name: self.f.g.node(roots[roots.len() - 1]).name.clone(),
            outer: self.outer.clone(),
            inner: self.inner.clone(),
            values: std::mem::take(&mut self.values),
            passes,
            stores,
        })
    }

    /// Reductions grouped by pass: one more than the latest pass they read.
    fn passes(&self) -> Vec<Vec<ValId>> {
        let mut pass: Vec<Option<usize>> = vec![None; self.values.len()];
        let mut after: Vec<usize> = vec![0; self.values.len()];
        for (i, v) in self.values.iter().enumerate() {
            let need = v
                .expr
                .operands()
                .iter()
                .map(|&o| after[o])
                .max()
                .unwrap_or(0);
            if matches!(v.expr, Expr::Reduce { .. }) {
                pass[i] = Some(need);
                after[i] = need + 1;
            } else {
                after[i] = need;
            }
        }
        let n = pass.iter().flatten().map(|&p| p + 1).max().unwrap_or(0);
        let mut out = vec![Vec::new(); n];
        for (i, p) in pass.iter().enumerate() {
            if let Some(p) = p {
                out[*p].push(i);
            }
        }
        out
    }

    /// The map from the kernel space to a root's index.
    fn root_map(&self, t: ValueId) -> R<AMap> {
        let shape = &self.f.ty(t).shape;
        let Some(key) = &self.row else {
            return Ok(AMap::identity(shape.len()));
        };
        if self.f.class[&t] == Class::Reduction {
            return Ok(self.reduction_out_map(t, key));
        }
        if *shape == key.shape {
            return Ok(self.input_map(key));
        }
        for keep in [true, false] {
            if *shape == reduced_shape(&key.shape, &key.dims, keep) {
                return Ok(self.out_map(key, keep));
            }
        }
        Err(Fail::Isolate(t))
    }

    /// Kernel space → the reduction input's index.
    fn input_map(&self, key: &RowKey) -> AMap {
        let pos = key.position();
        let n = self.ndims();
        AMap {
            coef: pos
                .iter()
                .map(|&p| (0..n).map(|d| (d == p) as i64).collect())
                .collect(),
            off: vec![0; pos.len()],
        }
    }

    /// Kernel space → the reduced value's index (keepdim or not).
    fn out_map(&self, key: &RowKey, keepdim: bool) -> AMap {
        let pos = key.position();
        let n = self.ndims();
        let mut coef = Vec::new();
        for (k, &p) in pos.iter().enumerate() {
            if key.dims.contains(&k) {
                if keepdim {
                    coef.push(vec![0; n]);
                }
            } else {
                coef.push((0..n).map(|d| (d == p) as i64).collect());
            }
        }
        let off = vec![0; coef.len()];
        AMap { coef, off }
    }

    fn reduction_out_map(&self, r: ValueId, key: &RowKey) -> AMap {
        let keepdim = match self.f.op(r) {
            Some(
                Op::Reduce { keepdim, .. }
                | Op::ArgMax { keepdim, .. }
                | Op::ArgMin { keepdim, .. },
            ) => *keepdim,
            _ => false,
        };
        let mut m = self.out_map(key, keepdim);
        // argmax/argmin over every dim without keepdim is 0-d; with keepdim all ones.
        if m.coef.len() != self.f.ty(r).shape.len() {
            m = AMap {
                coef: vec![vec![0; self.ndims()]; self.f.ty(r).shape.len()],
                off: vec![0; self.f.ty(r).shape.len()],
            };
        }
        m
    }

    /// Read by this kernel from memory rather than recomputed.
    fn loaded_here(&self, v: ValueId) -> bool {
        match self.f.class[&v] {
            Class::Input | Class::Constant | Class::Extern => true,
            Class::Reduction => self.p.unit_of.get(&v) != Some(&self.unit),
            _ => self.f.is_root(v) && self.p.unit_of.get(&v) != Some(&self.unit),
        }
    }

    /// `m` with the terms that are always zero removed: dims of size 1 of the value (their
    /// index is 0) and of the kernel space (their index is 0), so equal maps compare equal.
    fn canon(&self, v: ValueId, m: &AMap) -> AMap {
        let shape = &self.f.ty(v).shape;
        let space: Vec<usize> = self.outer.iter().chain(&self.inner).copied().collect();
        let mut m = m.clone();
        for (k, row) in m.coef.iter_mut().enumerate() {
            for (d, c) in row.iter_mut().enumerate() {
                if shape[k] == 1 || space[d] == 1 {
                    *c = 0;
                }
            }
            if shape[k] == 1 {
                m.off[k] = 0;
            }
        }
        m
    }

    fn emit(&mut self, v: ValueId, m: &AMap) -> R<ValId> {
        let m = &self.canon(v, m);
        if let Some(&id) = self.memo.get(&(v, m.clone())) {
            return Ok(id);
        }
        let id = if self.loaded_here(v) {
            self.load(v, m)?
        } else {
            match self.f.class[&v] {
                Class::Reduction => self.row_value(v, m)?,
                Class::View => self.emit_view(v, m)?,
                Class::Pointwise => self.emit_pointwise(v, m)?,
                Class::Leaf => self.emit_leaf(v, m)?,
                _ => {
                    return Err(Fail::Error(Error::Unsupported(
                        "fusion: unexpected node".into(),
                    )));
                }
            }
        };
        self.memo.insert((v, m.clone()), id);
        Ok(id)
    }

    fn load(&mut self, v: ValueId, m: &AMap) -> R<ValId> {
        let Some(&b) = self.buf_of.get(&v) else {
            return Err(Fail::Realize {
                node: v,
                root: self.root,
            });
        };
        let strides = contiguous_strides(&self.f.ty(v).shape);
        let map = m.through(&strides, 0, self.ndims())?;
        Ok(self.push(Expr::Load { buffer: b, map }, self.f.ty(v).dtype))
    }

    /// A reduction of this kernel, read at its own row.
    fn row_value(&mut self, r: ValueId, m: &AMap) -> R<ValId> {
        let Some(key) = self.row.clone() else {
            return Err(Fail::Isolate(self.root));
        };
        let want = self.canon(r, &self.reduction_out_map(r, &key));
        if *m != want || self.f.row_key(r) != key {
            return Err(Fail::Isolate(self.root));
        }
        if let Some(&id) = self.reduced.get(&r) {
            return Ok(id);
        }
        let x = self.f.g.operands(r)[0];
        let arg = self.emit(x, &self.input_map(&key))?;
        let combiner = match self.f.op(r) {
            Some(Op::Reduce { op, .. }) => match op {
                ReduceOp::Sum => Combiner::Sum,
                ReduceOp::Mean => Combiner::Mean,
                ReduceOp::Prod => Combiner::Prod,
                ReduceOp::Amax => Combiner::Max,
                ReduceOp::Amin => Combiner::Min,
                ReduceOp::All => Combiner::All,
                ReduceOp::Any => Combiner::Any,
                ReduceOp::LogSumExp => return Err(Fail::Isolate(self.root)),
            },
            Some(Op::ArgMax { .. }) => Combiner::ArgMax,
            _ => Combiner::ArgMin,
        };
        let acc = accumulator(self.f.ty(x).dtype);
        let id = self.push(Expr::Reduce { combiner, arg, acc }, self.f.ty(r).dtype);
        self.reduced.insert(r, id);
        Ok(id)
    }

    fn emit_view(&mut self, v: ValueId, m: &AMap) -> R<ValId> {
        let here = |x: ValueId| self.loaded_here(x);
        if let Some((base, l)) = self.f.layout_of(v, &here) {
            let map = m.through(&l.strides, l.offset, self.ndims())?;
            return Ok(self.push(
                Expr::Load {
                    buffer: self.buffer_of(base)?,
                    map,
                },
                self.f.ty(v).dtype,
            ));
        }
        let src = self.f.g.operands(v)[0];
        match self.view_map(v, src, m) {
            Some(ms) => self.emit(src, &ms),
            None => Err(Fail::Realize {
                node: src,
                root: self.root,
            }),
        }
    }

    fn buffer_of(&self, v: ValueId) -> R<BufferId> {
        self.buf_of.get(&v).copied().ok_or(Fail::Realize {
            node: v,
            root: self.root,
        })
    }

    /// The map to `src`'s index given the map `m` to the index of the view `v` of it.
    fn view_map(&self, v: ValueId, src: ValueId, m: &AMap) -> Option<AMap> {
        let sshape = &self.f.ty(src).shape;
        let vshape = &self.f.ty(v).shape;
        let nd = sshape.len();
        let z = m.zero_row();
        let mut coef: Vec<Vec<i64>>;
        let mut off: Vec<i64>;
        match self.f.op(v)? {
            Op::Contiguous => return Some(m.clone()),
            Op::Permute { dims } => {
                let dims = wrap_dims(dims, nd).ok()?;
                coef = vec![z.clone(); nd];
                off = vec![0; nd];
                for (k, &d) in dims.iter().enumerate() {
                    coef[d] = m.coef[k].clone();
                    off[d] = m.off[k];
                }
            }
            Op::Transpose { dim0, dim1 } => {
                let (a, b) = (wrap_dim(*dim0, nd).ok()?, wrap_dim(*dim1, nd).ok()?);
                (coef, off) = (m.coef.clone(), m.off.clone());
                if nd > 0 {
                    coef.swap(a, b);
                    off.swap(a, b);
                }
            }
            Op::T => {
                (coef, off) = (m.coef.clone(), m.off.clone());
                coef.reverse();
                off.reverse();
            }
            Op::Expand { .. } => {
                let lead = vshape.len() - nd;
                coef = Vec::new();
                off = Vec::new();
                for j in 0..nd {
                    if sshape[j] == vshape[lead + j] {
                        coef.push(m.coef[lead + j].clone());
                        off.push(m.off[lead + j]);
                    } else {
                        coef.push(z.clone());
                        off.push(0);
                    }
                }
            }
            Op::Unsqueeze { dim } => {
                let d = wrap_dim(*dim, nd + 1).ok()?;
                (coef, off) = (m.coef.clone(), m.off.clone());
                coef.remove(d);
                off.remove(d);
            }
            Op::Narrow { dim, start, .. } => {
                let d = wrap_dim(*dim, nd).ok()?;
                let s = if *start < 0 {
                    start + sshape[d] as i64
                } else {
                    *start
                };
                (coef, off) = (m.coef.clone(), m.off.clone());
                off[d] += s;
            }
            Op::Select { dim, index } => {
                let d = wrap_dim(*dim, nd).ok()?;
                let i = if *index < 0 {
                    index + sshape[d] as i64
                } else {
                    *index
                };
                (coef, off) = (m.coef.clone(), m.off.clone());
                coef.insert(d, z.clone());
                off.insert(d, i);
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => {
                let (d, s, _) =
                    crate::ir::op::slice_range(sshape, *dim, *start, *end, *step).ok()?;
                (coef, off) = (m.coef.clone(), m.off.clone());
                coef[d] = coef[d].iter().map(|c| c * step).collect();
                off[d] = off[d] * step + s as i64;
            }
            Op::Diagonal { offset, dim1, dim2 } => {
                let (a, b) = (wrap_dim(*dim1, nd).ok()?, wrap_dim(*dim2, nd).ok()?);
                let last = vshape.len() - 1;
                coef = vec![z.clone(); nd];
                off = vec![0; nd];
                let mut k = 0;
                for d in 0..nd {
                    if d != a && d != b {
                        coef[d] = m.coef[k].clone();
                        off[d] = m.off[k];
                        k += 1;
                    }
                }
                coef[a] = m.coef[last].clone();
                coef[b] = m.coef[last].clone();
                off[a] = m.off[last] + if *offset < 0 { -offset } else { 0 };
                off[b] = m.off[last] + if *offset > 0 { *offset } else { 0 };
            }
            Op::Squeeze { .. } | Op::Reshape { .. } | Op::View { .. } | Op::Flatten { .. } => {
                return reshape_map(sshape, vshape, m);
            }
            _ => return None,
        }
        Some(AMap { coef, off })
    }

    fn emit_pointwise(&mut self, v: ValueId, m: &AMap) -> R<ValId> {
        self.check_broadcast(v, m)?;
        self.inlined.insert(v);
        let ty = self.f.ty(v).clone();
        let ops = self.f.g.operands(v);
        let mut args = Vec::with_capacity(ops.len());
        for &o in &ops {
            let om = broadcast_map(&self.f.ty(o).shape, &ty.shape, m);
            args.push(self.emit(o, &om)?);
        }
        let op = self.f.op(v).cloned().unwrap_or(Op::Contiguous);
        let d = ty.dtype;
        let expr = match op {
            Op::Unary(u) => Expr::Unary(u, args[0]),
            Op::Binary(b) => {
                let c = b.compute_dtype(self.f.ty(ops[0]), self.f.ty(ops[1]))?;
                let (x, y) = (self.cast(args[0], c), self.cast(args[1], c));
                Expr::Binary(b, x, y)
            }
            Op::Where => {
                let (x, y) = (self.cast(args[1], d), self.cast(args[2], d));
                Expr::Where(args[0], x, y)
            }
            Op::Clamp { min, max } => Expr::Clamp {
                x: self.cast(args[0], d),
                min,
                max,
            },
            Op::To { .. } => return Ok(self.cast(args[0], d)),
            Op::MaskedFill { value } => Expr::MaskedFill {
                x: args[0],
                mask: args[1],
                value,
            },
            _ => {
                return Err(Fail::Error(Error::Unsupported(
                    "fusion: not pointwise".into(),
                )));
            }
        };
        Ok(self.push(expr, d))
    }

    /// Refuses recomputing an expensive value for each element of a broadcast.
    fn check_broadcast(&self, v: ValueId, m: &AMap) -> R<()> {
        let space: Vec<usize> = self.outer.iter().chain(&self.inner).copied().collect();
        let ko = self.outer.len();
        let moves = |d: usize| m.coef.iter().any(|row| row.get(d).is_some_and(|&c| c != 0));
        let inner_level = (ko..space.len()).any(moves);
        let factor: usize = (0..space.len())
            .filter(|&d| !moves(d) && (d < ko || inner_level))
            .map(|d| space[d])
            .product();
        if factor > 1 && !self.f.is_root(v) {
            let cost = self.f.cone_cost(v, &mut HashMap::new());
            if cost >= self.f.opts.expensive {
                return Err(Fail::Realize {
                    node: v,
                    root: self.root,
                });
            }
        }
        if factor > 1
            && self.f.is_root(v)
            && self.f.cone_cost(v, &mut HashMap::new()) >= self.f.opts.expensive
        {
            return Err(Fail::Isolate(self.root));
        }
        Ok(())
    }

    fn cast(&mut self, v: ValId, d: DType) -> ValId {
        if self.values[v].dtype == d {
            return v;
        }
        if let Expr::Const(s) = self.values[v].expr {
            return self.push(Expr::Const(s), d);
        }
        self.push(Expr::Cast(v), d)
    }

    fn emit_leaf(&mut self, v: ValueId, m: &AMap) -> R<ValId> {
        let d = self.f.ty(v).dtype;
        Ok(match self.f.op(v) {
            Some(Op::Scalar(s)) => self.push(Expr::Const(*s), d),
            Some(Op::Full { fill_value, .. }) => self.push(Expr::Const(*fill_value), d),
            Some(Op::Arange { start, step, .. }) => {
                let map = m.through(&[1], 0, self.ndims())?;
                let idx = self.push(Expr::Index { map }, DType::I64);
                let float = d.is_float() || start.is_float() || step.is_float();
                let c = if float { DType::F64 } else { DType::I64 };
                let i = self.cast(idx, c);
                let st = self.push(Expr::Const(*step), c);
                let s0 = self.push(Expr::Const(*start), c);
                let p = self.push(Expr::Binary(BinaryOp::Mul, i, st), c);
                let r = self.push(Expr::Binary(BinaryOp::Add, s0, p), c);
                self.cast(r, d)
            }
            _ => return Err(Fail::Error(Error::Unsupported("fusion: not a leaf".into()))),
        })
    }
}

/// The map to an operand of shape `from` broadcast to `to`, given the map `m` to `to`.
fn broadcast_map(from: &[usize], to: &[usize], m: &AMap) -> AMap {
    let lead = to.len() - from.len();
    let mut coef = Vec::with_capacity(from.len());
    let mut off = Vec::with_capacity(from.len());
    for (j, &n) in from.iter().enumerate() {
        if n == to[lead + j] {
            coef.push(m.coef[lead + j].clone());
            off.push(m.off[lead + j]);
        } else {
            coef.push(m.zero_row());
            off.push(0);
        }
    }
    AMap { coef, off }
}

/// Through a reshape from `src` to `view`: possible when every dim of `src` larger than one
/// is split into (not merged from) dims of the view; size-1 dims come and go freely.
fn reshape_map(src: &[usize], view: &[usize], m: &AMap) -> Option<AMap> {
    let cols = m.cols();
    let mut coef = Vec::with_capacity(src.len());
    let mut off = Vec::with_capacity(src.len());
    let mut j = 0;
    for &n in src {
        if n == 1 {
            coef.push(vec![0; cols]);
            off.push(0);
            continue;
        }
        // gather view dims until their product is n
        let mut prod = 1usize;
        let mut group = Vec::new();
        while prod < n {
            let &s = view.get(j)?;
            group.push(j);
            prod = prod.checked_mul(s)?;
            j += 1;
        }
        if prod != n {
            return None;
        }
        let mut row = vec![0i64; cols];
        let mut o = 0i64;
        let mut scale = 1i64;
        for &g in group.iter().rev() {
            for (c, r) in row.iter_mut().enumerate() {
                *r += scale * m.coef[g][c];
            }
            o += scale * m.off[g];
            scale *= view[g] as i64;
        }
        coef.push(row);
        off.push(o);
    }
    while j < view.len() {
        if view[j] != 1 {
            return None;
        }
        j += 1;
    }
    Some(AMap { coef, off })
}
