//! Building kernel IR from a plan: buffers, kernels (values, reduction passes, stores),
//! extern calls and the order of the steps.

use super::affine::{AMap, broadcast_map, view_map};
use super::partition::{Class, Fuser, Plan, RowKey};
use super::{Fail, R};
use crate::Error;
use crate::ir::dtype::DType;
use crate::ir::graph::ValueId;
use crate::ir::op::{BinaryOp, Op, ReduceOp};
use crate::ir::shape::{Shape, reduced_shape};
use crate::kernel::{
    Buffer, BufferId, BufferKind, Combiner, ControlCall, Expr, ExternCall, Kernel, Schedule, Step,
    ValId, Value, View, accumulator,
};
use std::collections::{HashMap, HashSet};

impl<'g> Fuser<'g> {
    /// Builds the schedule of `plan`, or says which decision to change.
    pub(super) fn build(&self, p: &Plan) -> R<Schedule> {
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
                // a control op's results are buffers its step writes: no step of their own
                if !matches!(self.op(v), Some(Op::Result { .. })) {
                    steps_by_unit.push(self.extern_step(v, &buf_of)?);
                }
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
        let mut steps: Vec<Option<Step>> = Vec::with_capacity(p.units.len());
        let mut made = steps_by_unit.into_iter();
        for unit in &p.units {
            let none = unit.is_extern && matches!(self.op(unit.roots[0]), Some(Op::Result { .. }));
            steps.push(if none { None } else { made.next() });
        }
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
            channels_last: self.nhwc.contains(&v),
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

    /// The step of extern node `v`: a library call, or a control op with its result buffers.
    fn extern_step(&self, v: ValueId, buf_of: &HashMap<ValueId, BufferId>) -> R<Step> {
        let e = self.extern_call(v, buf_of)?;
        let Some(Op::Control(c)) = self.op(v) else {
            return Ok(Step::Extern(e));
        };
        let outs = self
            .g
            .results_of(v)
            .into_iter()
            .map(|r| r.map(|r| buf_of[&r]))
            .collect();
        Ok(Step::Control(ControlCall {
            control: (**c).clone(),
            args: e.args,
            outs,
        }))
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

    /// Realises an expensive producer that several kernels recompute, and one whose
    /// recomputations read more than storing it once and reading it back would (as much,
    /// where storing it frees two temporaries or more): `c` kernels each reading its `l`
    /// same-sized buffers move `c·l` elements, storing it moves `l + 1 + c`, and its buffers
    /// may be freed as soon as it is stored (a ResNet block's output gradient,
    /// `where(y > 0, g1 + g2, 0)` recomputed by five kernels of its backward, kept two 1 MB
    /// gradients alive to the end of the stem's backward). The latter is stored by a kernel
    /// of its own: in a kernel that also writes other results, its buffers and theirs would
    /// all be alive at once (the same gradient recomputed by two kernels: stored in the
    /// first, the NCHW ResNet step peaked at 10.62 MB; alone, at 10.02, against 10.64
    /// recomputed).
    fn check_duplication(&self, emitted: &[HashSet<ValueId>]) -> R<()> {
        let mut count: HashMap<ValueId, usize> = HashMap::new();
        for set in emitted {
            for &v in set {
                *count.entry(v).or_default() += 1;
            }
        }
        let mut memo = HashMap::new();
        let mut dup: Vec<(ValueId, bool)> = count
            .into_iter()
            .filter(|&(_, c)| c > 1)
            .filter_map(|(v, c)| {
                if self.cone_cost(v, &mut memo) >= self.opts.expensive {
                    return Some((v, false));
                }
                let reads = self.cone_reads(v);
                // a value of one buffer or none is never worth storing
                if reads.len() < 2 {
                    return None;
                }
                // a tie in traffic goes to storing when that frees two temporaries or more
                // for the one stored (graph inputs stay alive whatever is stored)
                let temps = reads
                    .iter()
                    .filter(|&&r| !self.is_input_or_constant(r))
                    .count();
                let saved = (c - 1) * (reads.len() - 1);
                (saved > 2 || (saved == 2 && temps >= 2)).then_some((v, true))
            })
            .collect();
        dup.sort_by_key(|(v, _)| self.pos[v]);
        match dup.last() {
            Some(&(v, false)) => Err(Fail::Realize { node: v, root: v }),
            Some(&(v, true)) => Err(Fail::RealizeAlone(v)),
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
                let strides = self.f.buffer_layout(t).strides;
                let map = m.through(&strides, 0, self.ndims())?;
                stores.push(crate::kernel::Store {
                    buffer: b,
                    map,
                    value: v,
                });
            }
        }
        let passes = self.passes();
        let mut k = Kernel {
            name: self.f.g.node(roots[roots.len() - 1]).name.clone(),
            outer: self.outer.clone(),
            inner: self.inner.clone(),
            values: std::mem::take(&mut self.values),
            passes,
            stores,
        };
        k.prune();
        Ok(k)
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
        let strides = self.f.buffer_layout(v).strides;
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
        let ms = self
            .f
            .op(v)
            .and_then(|op| view_map(op, &self.f.ty(src).shape, &self.f.ty(v).shape, m));
        match ms {
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
