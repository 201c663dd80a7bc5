//! The generator of one kernel's function ([`Gen`]): its loop nest over the outer and
//! inner spaces, the addresses of every access, reductions' accumulators, and the stores;
//! the scalar and vector loops (`super::scalar`, `super::vector`) and the helpers that
//! replace loops (strips, row lanes, the row cache, softmax rows) emit through it.

use super::jit::FnBody;
use super::lower::{CodegenOptions, cty, esize, flags};
use crate::kernel::{Buffer, BufferId, Combiner, Expr, IndexMap, Kernel, Level, ValId};
use crate::{Error, Result};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_codegen::ir::{FuncRef, Inst, InstBuilder, Type, Value};
use cranelift_frontend::Variable;
use cranelift_module::FuncId;
use std::collections::HashMap;

/// An accumulator of a reduction: scalar variables, and vector ones inside a vector loop.
#[derive(Clone, Copy)]
pub(super) struct Acc {
    pub val: Variable,
    /// Argmax/argmin: the position of the best element (-1 before the first).
    pub idx: Option<Variable>,
}

/// A distinct access pattern: the buffer (None for `Expr::Index`) and the map.
pub(super) struct Access {
    pub buffer: Option<BufferId>,
    pub map: IndexMap,
}

/// What one innermost loop computes.
/// The values the stores depend on, in order: dead values (unused constants the fuser left
/// behind, often of another dtype) would otherwise keep a loop from being vectorised.
fn live_values(k: &Kernel) -> Vec<ValId> {
    let mut live = vec![false; k.values.len()];
    let mut stack: Vec<ValId> = k.stores.iter().map(|s| s.value).collect();
    while let Some(v) = stack.pop() {
        if !std::mem::replace(&mut live[v], true) {
            stack.extend(k.values[v].expr.operands());
        }
    }
    (0..k.values.len()).filter(|&v| live[v]).collect()
}

pub(super) struct Body {
    /// Inner-level values, in order.
    pub vals: Vec<ValId>,
    /// Reductions updated per element.
    pub reds: Vec<ValId>,
    /// Stores done per element.
    pub stores: Vec<usize>,
    /// Values read from the row cache instead of computed (`super::rowcache`).
    pub cache_in: Vec<ValId>,
    /// Values written to the row cache once computed.
    pub cache_out: Vec<ValId>,
    /// Values read from their strip rows (`super::strip`).
    pub strip_in: Vec<ValId>,
    /// `(operand, value)`: the operand is written to the value's strip row once computed.
    pub strip_out: Vec<(ValId, ValId)>,
}

/// The bodies of a row kernel: one per reduction pass, then the inner stores; and the stores
/// of row-level values.
pub(super) struct RowPlan {
    pub passes: Vec<Body>,
    pub stores: Body,
    pub row_stores: Vec<usize>,
}

impl Body {
    pub(super) fn new(vals: Vec<ValId>, reds: Vec<ValId>, stores: Vec<usize>) -> Self {
        Body {
            vals,
            reds,
            stores,
            cache_in: vec![],
            cache_out: vec![],
            strip_in: vec![],
            strip_out: vec![],
        }
    }
}

/// State of the code generator of one kernel.
pub(super) struct Gen<'g, 'a, 'b> {
    pub fb: &'g mut FnBody<'a, 'b>,
    pub k: &'g Kernel,
    pub bufs: &'g [Buffer],
    imports: &'g HashMap<&'static str, FuncId>,
    frefs: HashMap<&'static str, FuncRef>,
    pub ptr: Type,
    pub opts: CodegenOptions,
    /// Base pointer of every buffer the kernel touches.
    pub base: Vec<Option<Value>>,
    pub err: Variable,
    pub accesses: Vec<Access>,
    /// Access of every load/index value, and of every store.
    pub access_of_val: HashMap<ValId, usize>,
    pub access_of_store: Vec<usize>,
    /// Current element offset of each access at element 0 of the innermost loop.
    pub cur_off: Vec<Value>,
    /// Byte pointer of each access at element 0 of the innermost loop (None for Index).
    pub cur_ptr: Vec<Option<Value>>,
    /// Stride of each access along the innermost loop, in elements.
    pub cur_stride: Vec<i64>,
    /// Inside a vector loop: the pointer of each access it walks at the loop's index value,
    /// advanced by one add per iteration ([`Self::addr`] uses it for that index).
    pub walked: HashMap<usize, (Value, Value)>,
    pub accs: HashMap<ValId, Acc>,
    /// Flat position inside the inner space (argmax/argmin), when needed.
    pub pos: Option<Variable>,
    pub levels: Vec<Level>,
    /// Innermost loops emitted vectorised so far.
    pub vector_loops: usize,
    /// Stack address of the cached row of each value in the row cache.
    pub row_cache: HashMap<ValId, Value>,
    /// Stride of each access along the last outer dim while a block of rows runs as lanes.
    pub lane_stride: Option<Vec<i64>>,
    /// Rows per block when rows run as lanes (0: never).
    pub lane_rows: usize,
    /// Strip row of each value a strip helper computes, addressed by the innermost index.
    pub strip_rows: HashMap<ValId, Value>,
    /// Innermost loops emitted in strips so far, and the stack their rows take.
    pub strip_loops: usize,
    /// Innermost loops whose stores stream (`super::streamed_stores`).
    pub stream_loops: usize,
    pub strip_rows_bytes: usize,
    /// Reductions the column-sum helper computes (see `lanes`).
    pub column_sums: usize,
    /// Row kernels run as one row softmax call per row (see `softmax`).
    pub softmax_rows: usize,
}

impl<'g, 'a, 'b> Gen<'g, 'a, 'b> {
    pub(super) fn new(
        fb: &'g mut FnBody<'a, 'b>,
        k: &'g Kernel,
        bufs: &'g [Buffer],
        imports: &'g HashMap<&'static str, FuncId>,
        ptr: Type,
        opts: CodegenOptions,
    ) -> Self {
        let err = fb.b.declare_var(I32);
        let mut accesses: Vec<Access> = Vec::new();
        let mut find = |buffer: Option<BufferId>, map: &IndexMap| {
            if let Some(i) = accesses
                .iter()
                .position(|a| a.buffer == buffer && &a.map == map)
            {
                return i;
            }
            accesses.push(Access {
                buffer,
                map: map.clone(),
            });
            accesses.len() - 1
        };
        let mut access_of_val = HashMap::new();
        for (i, v) in k.values.iter().enumerate() {
            match &v.expr {
                Expr::Load { buffer, map } => {
                    access_of_val.insert(i, find(Some(*buffer), map));
                }
                Expr::Index { map } => {
                    access_of_val.insert(i, find(None, map));
                }
                _ => {}
            }
        }
        let access_of_store = k
            .stores
            .iter()
            .map(|s| find(Some(s.buffer), &s.map))
            .collect();
        let levels = k.levels();
        Gen {
            fb,
            k,
            bufs,
            imports,
            frefs: HashMap::new(),
            ptr,
            opts,
            base: vec![None; bufs.len()],
            err,
            accesses,
            access_of_val,
            access_of_store,
            cur_off: vec![],
            cur_ptr: vec![],
            walked: HashMap::new(),
            cur_stride: vec![],
            accs: HashMap::new(),
            pos: None,
            levels,
            vector_loops: 0,
            row_cache: HashMap::new(),
            lane_stride: None,
            lane_rows: 0,
            strip_rows: HashMap::new(),
            strip_loops: 0,
            stream_loops: 0,
            column_sums: 0,
            softmax_rows: 0,
            strip_rows_bytes: 0,
        }
    }

    /// Calls helper `name` with `args`, returning its result.
    pub fn call(&mut self, name: &'static str, args: &[Value]) -> Value {
        let inst = self.call_inst(name, args);
        self.fb.b.inst_results(inst)[0]
    }

    /// Calls helper `name`, which returns nothing, with `args`.
    pub fn call_void(&mut self, name: &'static str, args: &[Value]) {
        self.call_inst(name, args);
    }

    fn call_inst(&mut self, name: &'static str, args: &[Value]) -> Inst {
        let fref = match self.frefs.get(name) {
            Some(&f) => f,
            None => {
                // Every helper the body can call was imported before it was built (the unary
                // ops' f64 helpers: those of the ops the kernel computes).
                let id = self.imports[name];
                let f = self.fb.func_ref(id);
                self.frefs.insert(name, f);
                f
            }
        };
        self.fb.b.ins().call(fref, args)
    }

    pub fn iconst(&mut self, t: Type, v: i64) -> Value {
        let bits = t.bits();
        let v = if bits < 64 {
            v & ((1i64 << bits) - 1)
        } else {
            v
        };
        self.fb.b.ins().iconst(t, v)
    }

    pub(super) fn emit_function(&mut self) -> Result<()> {
        let params =
            self.fb
                .b
                .block_params(self.fb.b.current_block().unwrap_or_else(|| {
                    unreachable!("the entry block is current while the body is built")
                }));
        let (bufs_ptr, begin, end) = (params[0], params[1], params[2]);
        let zero = self.iconst(I32, 0);
        self.fb.b.def_var(self.err, zero);
        let mut used: Vec<BufferId> = self
            .accesses
            .iter()
            .filter_map(|a| a.buffer)
            .collect::<Vec<_>>();
        used.sort_unstable();
        used.dedup();
        let psize = self.ptr.bytes() as i64;
        for b in used {
            let off = i32::try_from(b as i64 * psize)
                .map_err(|_| Error::Unsupported("cpu codegen: too many buffers".into()))?;
            let p = self.fb.b.ins().load(self.ptr, flags(), bufs_ptr, off);
            self.base[b] = Some(p);
        }
        if self.k.inner.is_empty() {
            self.emit_pointwise(begin, end)?;
        } else if let Some(sm) = self.softmax_rows_plan() {
            self.emit_softmax_rows(&sm, begin, end)?;
        } else {
            self.emit_rows(begin, end)?;
        }
        let e = self.fb.b.use_var(self.err);
        self.fb.b.ins().return_(&[e]);
        Ok(())
    }

    /// `while var < end { body; var += step }` where `body` returns the step to add.
    pub(super) fn while_lt(
        &mut self,
        var: Variable,
        end: Value,
        body: &mut dyn FnMut(&mut Self, Value) -> Result<Value>,
    ) -> Result<()> {
        let header = self.fb.b.create_block();
        let bodyb = self.fb.b.create_block();
        let exit = self.fb.b.create_block();
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(header);
        let cur = self.fb.b.use_var(var);
        let c = self.fb.b.ins().icmp(IntCC::SignedLessThan, cur, end);
        self.fb.b.ins().brif(c, bodyb, &[], exit, &[]);
        self.fb.b.switch_to_block(bodyb);
        let step = body(self, cur)?;
        let cur = self.fb.b.use_var(var);
        let next = self.fb.b.ins().iadd(cur, step);
        self.fb.b.def_var(var, next);
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(exit);
        Ok(())
    }

    /// Element offset of every access at the point whose outer (or, for pointwise kernels,
    /// leading) multi-index is `idx` over `dims` (dims numbered in the full space).
    pub(super) fn offsets_at(&mut self, idx: &[(usize, Value)]) -> Vec<Value> {
        let mut out = Vec::with_capacity(self.accesses.len());
        for a in 0..self.accesses.len() {
            let m = &self.accesses[a].map;
            let offset = m.offset as i64;
            let terms: Vec<(i64, Value)> = idx
                .iter()
                .map(|&(d, v)| (m.strides[d] as i64, v))
                .filter(|&(s, _)| s != 0)
                .collect();
            let mut o = self.iconst(I64, offset);
            for (s, v) in terms {
                let t = self.fb.b.ins().imul_imm_s(v, s);
                o = self.fb.b.ins().iadd(o, t);
            }
            out.push(o);
        }
        out
    }

    /// The multi-index of flat `r` over `sizes` (row-major), innermost last.
    pub(super) fn unflatten(&mut self, mut r: Value, sizes: &[usize]) -> Vec<Value> {
        let mut idx = vec![r; sizes.len()];
        for d in (0..sizes.len()).rev() {
            if d == 0 {
                idx[d] = r;
                break;
            }
            let n = sizes[d] as i64;
            idx[d] = self.fb.b.ins().urem_imm_s(r, n);
            r = self.fb.b.ins().udiv_imm_s(r, n);
        }
        idx
    }

    fn emit_pointwise(&mut self, begin: Value, end: Value) -> Result<()> {
        let ko = self.k.outer.len();
        let last = if ko == 0 { 1 } else { self.k.outer[ko - 1] } as i64;
        let lead: Vec<usize> = self.k.outer[..ko.saturating_sub(1)].to_vec();
        let body = Body::new(
            live_values(self.k),
            vec![],
            (0..self.k.stores.len()).collect(),
        );
        let cur = self.fb.b.declare_var(I64);
        self.fb.b.def_var(cur, begin);
        self.while_lt(cur, end, &mut |g, c| {
            let (j0, r) = if last == 1 {
                (g.iconst(I64, 0), c)
            } else {
                (
                    g.fb.b.ins().urem_imm_s(c, last),
                    g.fb.b.ins().udiv_imm_s(c, last),
                )
            };
            let mut idx: Vec<(usize, Value)> = if lead.is_empty() {
                vec![]
            } else {
                let li = g.unflatten(r, &lead);
                li.into_iter().enumerate().collect()
            };
            if ko > 0 {
                idx.push((ko - 1, j0));
            }
            let offs = g.offsets_at(&idx);
            let left = g.fb.b.ins().isub(end, c);
            let lastv = g.iconst(I64, last);
            let room = g.fb.b.ins().isub(lastv, j0);
            let len = g.fb.b.ins().smin(left, room);
            let strides: Vec<i64> = g
                .accesses
                .iter()
                .map(|a| {
                    if ko == 0 {
                        0
                    } else {
                        a.map.strides[ko - 1] as i64
                    }
                })
                .collect();
            let mut env = vec![None; g.k.values.len()];
            g.innermost(len, &offs, &strides, &body, &mut env)?;
            Ok(len)
        })
    }

    fn emit_rows(&mut self, begin: Value, end: Value) -> Result<()> {
        let k = self.k;
        let ko = k.outer.len();
        let row = self.fb.b.declare_var(I64);
        self.fb.b.def_var(row, begin);
        let needs_pos = k.values.iter().any(|v| {
            matches!(
                v.expr,
                Expr::Reduce {
                    combiner: Combiner::ArgMax | Combiner::ArgMin,
                    ..
                }
            )
        });
        if needs_pos {
            self.pos = Some(self.fb.b.declare_var(I64));
        }
        // inner-level values each pass and the inner stores need
        let mut parts = Vec::new();
        for p in &k.passes {
            let args: Vec<ValId> = p
                .iter()
                .filter_map(|&r| match k.values[r].expr {
                    Expr::Reduce { arg, .. } => Some(arg),
                    _ => None,
                })
                .collect();
            parts.push((args, Body::new(vec![], p.clone(), vec![])));
        }
        let inner_stores: Vec<usize> = (0..k.stores.len())
            .filter(|&s| !k.stores[s].map.ignores_from(ko))
            .collect();
        let row_stores: Vec<usize> = (0..k.stores.len())
            .filter(|&s| k.stores[s].map.ignores_from(ko))
            .collect();
        let store_vals: Vec<ValId> = inner_stores.iter().map(|&s| k.stores[s].value).collect();
        parts.push((store_vals, Body::new(vec![], vec![], inner_stores)));
        let lanes = self.lane_width();
        self.lane_rows = lanes.unwrap_or(0) as usize;
        let mut passes = self.row_bodies(parts, lanes.is_none());
        let stores = passes.pop().unwrap_or_else(|| unreachable!("pushed above"));
        let plan = RowPlan {
            passes,
            stores,
            row_stores,
        };
        let sums = lanes.and_then(|_| self.column_sums(&plan));
        self.while_lt(row, end, &mut |g, r| match lanes {
            Some(w) => g.lanes_or_row(r, end, w, &plan, sums.as_ref()),
            None => {
                g.one_row(r, &plan)?;
                Ok(g.iconst(I64, 1))
            }
        })
    }

    /// Element offset of every access at the start of row `r` (flat over the outer dims).
    pub(super) fn row_offsets(&mut self, r: Value) -> Vec<Value> {
        let idx: Vec<(usize, Value)> = if self.k.outer.is_empty() {
            vec![]
        } else {
            let outer = self.k.outer.clone();
            self.unflatten(r, &outer).into_iter().enumerate().collect()
        };
        self.offsets_at(&idx)
    }

    /// One row of a row kernel: outer values, each pass, the row stores, the inner stores.
    pub(super) fn one_row(&mut self, r: Value, plan: &RowPlan) -> Result<()> {
        let k = self.k;
        let row_offs = self.row_offsets(r);
        let mut env: Vec<Option<Value>> = vec![None; k.values.len()];
        self.set_position(&row_offs, None);
        self.outer_values(&mut env)?;
        for body in &plan.passes {
            for &r in &body.reds {
                self.init_acc(r);
            }
            if let Some(p) = self.pos {
                let z = self.iconst(I64, 0);
                self.fb.b.def_var(p, z);
            }
            self.nest(0, &row_offs, body, &mut env)?;
            for &r in &body.reds {
                let v = self.finish_acc(r);
                env[r] = Some(v);
            }
            self.set_position(&row_offs, None);
            self.outer_values(&mut env)?;
        }
        self.set_position(&row_offs, None);
        for &s in &plan.row_stores {
            let st = &k.stores[s];
            let v = env[st.value].ok_or_else(|| {
                Error::Unsupported(format!(
                    "cpu codegen: kernel {}: a row store of an inner value",
                    k.name
                ))
            })?;
            let zero = self.iconst(I64, 0);
            self.store_scalar(s, v, zero, 0);
        }
        if !plan.stores.stores.is_empty() {
            self.nest(0, &row_offs, &plan.stores, &mut env)?;
        }
        Ok(())
    }

    /// Computes every outer-level value whose operands are all available.
    fn outer_values(&mut self, env: &mut [Option<Value>]) -> Result<()> {
        let zero = self.iconst(I64, 0);
        for v in 0..self.k.values.len() {
            if env[v].is_some()
                || self.levels[v] != Level::Outer
                || matches!(self.k.values[v].expr, Expr::Reduce { .. })
            {
                continue;
            }
            if self.k.values[v]
                .expr
                .operands()
                .iter()
                .all(|&o| env[o].is_some())
            {
                let x = self.scalar_value(v, env, zero, 0)?;
                env[v] = Some(x);
            }
        }
        Ok(())
    }

    /// Sets the innermost-loop origin of every access to the element offsets `offs`, with
    /// innermost strides `strides` (None: all zero).
    pub(super) fn set_position(&mut self, offs: &[Value], strides: Option<&[i64]>) {
        self.cur_off = offs.to_vec();
        self.cur_stride = match strides {
            Some(s) => s.to_vec(),
            None => vec![0; offs.len()],
        };
        self.cur_ptr = (0..offs.len())
            .map(|a| {
                let buffer = self.accesses[a].buffer?;
                let base = self.base[buffer]?;
                let size = esize(self.bufs[buffer].dtype);
                let bytes = self.fb.b.ins().imul_imm_s(offs[a], size);
                Some(self.fb.b.ins().iadd(base, bytes))
            })
            .collect();
    }

    /// The loop nest over inner dims `d..` starting from element offsets `offs`.
    fn nest(
        &mut self,
        d: usize,
        offs: &[Value],
        body: &Body,
        env: &mut [Option<Value>],
    ) -> Result<()> {
        let ko = self.k.outer.len();
        let ni = self.k.inner.len();
        if ni == 0 {
            let one = self.iconst(I64, 1);
            let z = vec![0; self.accesses.len()];
            return self.innermost(one, offs, &z, body, env);
        }
        let dim = ko + d;
        let strides: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[dim] as i64)
            .collect();
        let n = self.k.inner[d] as i64;
        if d + 1 == ni {
            let len = self.iconst(I64, n);
            return self.innermost(len, offs, &strides, body, env);
        }
        let offs = offs.to_vec();
        self.count_loop(n, &mut |g, iv| {
            let sub = g.offsets_along(&offs, &strides, iv);
            g.nest(d + 1, &sub, body, env)
        })
    }

    /// A loop of `body(i)` for `i` in `0..n`.
    pub(super) fn count_loop(
        &mut self,
        n: i64,
        body: &mut dyn FnMut(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        let end = self.iconst(I64, n);
        self.while_lt(i, end, &mut |g, iv| {
            body(g, iv)?;
            Ok(g.iconst(I64, 1))
        })
    }

    /// Each access's offset in `offs` moved by `i` steps of its stride in `strides`.
    pub(super) fn offsets_along(
        &mut self,
        offs: &[Value],
        strides: &[i64],
        i: Value,
    ) -> Vec<Value> {
        offs.iter()
            .zip(strides)
            .map(|(&o, &s)| {
                if s == 0 {
                    o
                } else {
                    let t = self.fb.b.ins().imul_imm_s(i, s);
                    self.fb.b.ins().iadd(o, t)
                }
            })
            .collect()
    }

    /// The innermost loop: `len` elements from offsets `offs` with strides `strides`,
    /// vectorised when possible.
    fn innermost(
        &mut self,
        len: Value,
        offs: &[Value],
        strides: &[i64],
        body: &Body,
        env: &mut [Option<Value>],
    ) -> Result<()> {
        self.set_position(offs, Some(strides));
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        if self.vectorizable(body) {
            if let Some(work) = self.strip_work(body) {
                self.strip_loops += 1;
                return self.strip_loop(i, len, body, env, &work);
            }
            let streamed = self.stream_stores(body);
            if !streamed.is_empty() {
                self.stream_loops += 1;
                return self.stream_loop(i, len, body, env, &streamed);
            }
            self.vector_loops += 1;
            self.vector_loop(i, len, body, env)?;
        }
        self.scalar_loop(i, len, body, env)
    }

    /// The scalar loop over elements `[i, end)` of the innermost loop.
    pub(super) fn scalar_loop(
        &mut self,
        i: Variable,
        end: Value,
        body: &Body,
        env: &[Option<Value>],
    ) -> Result<()> {
        let saved = env.to_vec();
        self.while_lt(i, end, &mut |g, iv| {
            let mut local = saved.clone();
            for &v in &body.vals {
                let t = cty(g.k.values[v].dtype);
                let x =
                    g.body_value(body, v, t, iv, 0, &mut |g| g.scalar_value(v, &local, iv, 0))?;
                local[v] = Some(x);
            }
            for &r in &body.reds {
                g.update_acc(r, &local);
            }
            if let Some(p) = g.pos {
                let pv = g.fb.b.use_var(p);
                let n = g.fb.b.ins().iadd_imm_s(pv, 1);
                g.fb.b.def_var(p, n);
            }
            for &s in &body.stores {
                let v = local[g.k.stores[s].value].ok_or_else(|| {
                    Error::Unsupported("cpu codegen: a store of an uncomputed value".into())
                })?;
                g.store_scalar(s, v, iv, 0);
            }
            Ok(g.iconst(I64, 1))
        })
    }

    /// Byte address of access `a` at element `i` of the innermost loop and lane `lane`, as
    /// (pointer, constant byte offset). Lanes run along the innermost loop, or along the last
    /// outer dim in a block of rows as lanes (`super::row_lanes`).
    pub fn addr(&mut self, a: usize, i: Value, lane: i64) -> (Value, i32) {
        let size = self.elem_bytes(a);
        let s = self.cur_stride[a];
        let lane_off = (lane * self.lane_step(a) * size) as i32;
        if let Some(&(at, p)) = self.walked.get(&a)
            && at == i
        {
            return (p, lane_off);
        }
        let base =
            self.cur_ptr[a].unwrap_or_else(|| unreachable!("index accesses have no pointer"));
        let p = if s == 0 {
            base
        } else {
            let t = self.fb.b.ins().imul_imm_s(i, s * size);
            self.fb.b.ins().iadd(base, t)
        };
        (p, lane_off)
    }

    /// Bytes per element of the buffer access `a` reads or writes.
    pub fn elem_bytes(&self, a: usize) -> i64 {
        esize(self.bufs[self.accesses[a].buffer.unwrap_or(0)].dtype)
    }

    /// Elements between adjacent lanes of access `a`.
    pub fn lane_step(&self, a: usize) -> i64 {
        match &self.lane_stride {
            Some(l) => l[a],
            None => self.cur_stride[a],
        }
    }

    /// Element offset of access `a` at element `i + lane` (for `Expr::Index`).
    pub fn elem_offset(&mut self, a: usize, i: Value, lane: i64) -> Value {
        let s = self.cur_stride[a];
        let o = self.cur_off[a];
        if s == 0 {
            return o;
        }
        let t = self.fb.b.ins().imul_imm_s(i, s);
        let o = self.fb.b.ins().iadd(o, t);
        self.fb.b.ins().iadd_imm_s(o, lane * s)
    }

    /// Sets the error code to `code` where `cond` (an i8 bool) holds.
    pub fn flag_error(&mut self, cond: Value, code: i64) {
        let e = self.fb.b.use_var(self.err);
        let c = self.iconst(I32, code);
        let n = self.fb.b.ins().select(cond, c, e);
        self.fb.b.def_var(self.err, n);
    }
}
