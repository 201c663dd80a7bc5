//! Rows as lanes: a row kernel whose rows walk memory with a stride (a sum over dim 0, the
//! bias gradient of a linear layer) runs blocks of adjacent rows side by side, one row per
//! F32X4 lane. The last outer dim is then the contiguous one: every step of the reduced
//! loop loads a whole cache line of adjacent outputs' elements instead of one element per
//! line, and each lane keeps its own accumulator, summed in the same order as a single row
//! (so results are bit-identical to the scalar row code).
//!
//! Taken when some load walks the inner space with a stride other than 0 or 1, every access
//! moves by 0 or 1 element along the last outer dim (stores by 1), and every value and
//! reduction has a vector form. An inner space of several dims (a layer norm's weight
//! gradient over [batch, tokens] reading a position embedding that repeats across the batch)
//! runs as nested loops in the scalar rows' order. Rows that do not fill a block (the
//! end of a chunk or of the last outer dim) run as ordinary rows.
//!
//! Column sums: where every reduction of a pass is an f32 sum or mean of a plain load (a sum
//! over dim 0, a bias gradient), a native helper ([`super::vmath`]) sums up to
//! [`SUM_BLOCK`] adjacent rows at once into f64 stack rows, reading each step of the reduced
//! loop as one long contiguous run instead of a 64-byte line per memory page; the blocks of
//! lanes then take their sums from there. The helper adds in the lanes' order, so the results do
//! not change.

use super::generator::{Body, Gen, RowPlan};
use super::lower::flags;
use super::vector::VAcc;
use super::vmath;
use crate::DType;
use crate::Result;
use crate::kernel::{Combiner, Expr, Level, ValId};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F64X2, I64};
use cranelift_codegen::ir::{InstBuilder, Value};

/// Lanes of one vector.
const LANES: i64 = 4;
/// Vectors per block: 16 rows, a 64-byte line of f32 outputs per step of the reduced loop.
const GROUPS: i64 = 4;
/// Most rows one column-sum call covers: 8 KiB read per step of the reduced loop (shorter
/// runs left the helper below copy speed), 16 KiB of f64 sums.
const SUM_BLOCK: i64 = 2048;
/// Stack for the f64 sums of one kernel: with several summed reductions the block narrows.
const SUM_STACK_BYTES: i64 = 32 << 10;

/// The passes whose sums the column-sum helper computes: per pass, for each reduction in
/// order, the access it sums and the stack row of its f64 sums (None: the pass runs in the
/// lanes); and the most rows one call covers.
pub(super) struct ColumnSums {
    passes: Vec<Option<Vec<(usize, Value)>>>,
    block: i64,
}

/// The rows of a block whose sums were computed ahead, as `(sums, first row of the block
/// within them)`.
type Presummed<'a> = Option<(&'a ColumnSums, Value)>;

impl Gen<'_, '_, '_> {
    /// The block width in rows when this kernel runs rows as lanes, else None.
    pub(super) fn lane_width(&self) -> Option<i64> {
        let k = self.k;
        let ko = k.outer.len();
        if ko == 0 || k.inner.is_empty() || k.outer[ko - 1] < (LANES * GROUPS) as usize {
            return None;
        }
        let along = |a: usize| self.accesses[a].map.strides[ko - 1];
        let strided = self.accesses.iter().enumerate().any(|(a, acc)| {
            acc.buffer.is_some()
                && self.access_of_val.values().any(|&x| x == a)
                && acc.map.strides[ko..].iter().any(|&s| s > 1)
        });
        if !strided {
            return None;
        }
        if self.accesses.iter().any(|a| a.buffer.is_none())
            || (0..self.accesses.len()).any(|a| along(a) > 1)
            || self.access_of_store.iter().any(|&a| along(a) != 1)
        {
            return None;
        }
        let live: Vec<ValId> = self.closure_all();
        let ok = live.iter().all(|&v| match k.values[v].expr {
            Expr::Reduce { .. } => self.vector_reduce_ok(v),
            _ => self.vector_value_ok(v),
        }) && k
            .stores
            .iter()
            .all(|s| k.values[s.value].dtype == crate::DType::F32);
        ok.then_some(LANES * GROUPS)
    }

    /// Every value the stores need, reductions included, through reduction arguments.
    fn closure_all(&self) -> Vec<ValId> {
        let k = self.k;
        let mut need = vec![false; k.values.len()];
        let mut stack: Vec<ValId> = k.stores.iter().map(|s| s.value).collect();
        while let Some(v) = stack.pop() {
            if !std::mem::replace(&mut need[v], true) {
                stack.extend(k.values[v].expr.operands());
                if let Expr::Reduce { arg, .. } = k.values[v].expr {
                    stack.push(arg);
                }
            }
        }
        (0..need.len()).filter(|&v| need[v]).collect()
    }

    /// The passes of `plan` the column-sum helper can sum (see the module doc), with their
    /// stack rows; None when there is none.
    pub(super) fn column_sums(&mut self, plan: &RowPlan) -> Option<ColumnSums> {
        let k = self.k;
        let ko = k.outer.len();
        // the helper walks one inner dim
        if self.opts.f32_lane_sums || k.inner.len() != 1 {
            return None;
        }
        let summable = |g: &Self, r: ValId| {
            let Expr::Reduce {
                combiner: Combiner::Sum | Combiner::Mean,
                arg,
                ..
            } = k.values[r].expr
            else {
                return None;
            };
            let a = *g.access_of_val.get(&arg)?;
            let acc = &g.accesses[a];
            let ok = matches!(k.values[arg].expr, Expr::Load { .. })
                && k.values[r].dtype == DType::F32
                && k.values[arg].dtype == DType::F32
                && acc.buffer.is_some_and(|b| g.bufs[b].dtype == DType::F32)
                && acc.map.strides[ko - 1] == 1;
            ok.then_some(a)
        };
        let passes: Vec<Option<Vec<usize>>> = plan
            .passes
            .iter()
            .map(|body| {
                if !body.stores.is_empty() || body.reds.is_empty() {
                    return None;
                }
                body.reds.iter().map(|&r| summable(self, r)).collect()
            })
            .collect();
        if passes.iter().all(Option::is_none) {
            return None;
        }
        let count: usize = passes.iter().flatten().map(Vec::len).sum();
        let block = SUM_BLOCK.min(SUM_STACK_BYTES / 8 / count as i64) & -(LANES * GROUPS);
        if block == 0 {
            return None;
        }
        self.column_sums = count;
        let passes = passes
            .into_iter()
            .map(|p| {
                p.map(|loads| {
                    loads
                        .into_iter()
                        .map(|a| (a, self.stack_row(block as usize * 8)))
                        .collect()
                })
            })
            .collect();
        Some(ColumnSums { passes, block })
    }

    /// At row `r` (of `[r, end)`): with column sums, as many rows as one helper call covers
    /// in whole blocks; else a block of `w` rows as lanes when it fits inside the last outer
    /// dim and the range, else one ordinary row. Returns the rows done.
    pub(super) fn lanes_or_row(
        &mut self,
        r: Value,
        end: Value,
        w: i64,
        plan: &RowPlan,
        sums: Option<&ColumnSums>,
    ) -> Result<Value> {
        let last = self.k.outer[self.k.outer.len() - 1] as i64;
        let j = self.fb.b.ins().urem_imm_s(r, last);
        let lastv = self.iconst(I64, last);
        let room = self.fb.b.ins().isub(lastv, j);
        let left = self.fb.b.ins().isub(end, r);
        if let Some(sums) = sums {
            // blocks of w rows (a power of two) inside the dim, the range and one call
            let most = self.fb.b.ins().smin(room, left);
            let cap = self.iconst(I64, sums.block);
            let most = self.fb.b.ins().smin(most, cap);
            let width = self.fb.b.ins().band_imm_s(most, -w);
            let wide = self
                .fb
                .b
                .ins()
                .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, width, w);
            return self.either(
                wide,
                &mut |g| {
                    g.summed_blocks(r, width, w, plan, sums)?;
                    Ok(width)
                },
                &mut |g| g.block_or_row(r, room, left, w, plan),
            );
        }
        self.block_or_row(r, room, left, w, plan)
    }

    /// `cond ? yes() : no()`, each branch emitting its code and returning the rows it did.
    fn either(
        &mut self,
        cond: Value,
        yes: &mut dyn FnMut(&mut Self) -> Result<Value>,
        no: &mut dyn FnMut(&mut Self) -> Result<Value>,
    ) -> Result<Value> {
        let (then, other, join) = (
            self.fb.b.create_block(),
            self.fb.b.create_block(),
            self.fb.b.create_block(),
        );
        self.fb.b.append_block_param(join, I64);
        self.fb.b.ins().brif(cond, then, &[], other, &[]);
        self.fb.b.switch_to_block(then);
        let done = yes(self)?;
        self.fb.b.ins().jump(join, &[done.into()]);
        self.fb.b.switch_to_block(other);
        let done = no(self)?;
        self.fb.b.ins().jump(join, &[done.into()]);
        self.fb.b.switch_to_block(join);
        Ok(self.fb.b.block_params(join)[0])
    }

    /// Each access's stride along the inner dim.
    fn inner_strides(&self) -> Vec<i64> {
        let ko = self.k.outer.len();
        self.accesses
            .iter()
            .map(|a| a.map.strides[ko] as i64)
            .collect()
    }

    /// Rows `[r, r + width)`, `width` a multiple of `w`: one helper call per summed
    /// reduction, then the blocks of `w` rows as lanes, their sums read from the stack rows.
    fn summed_blocks(
        &mut self,
        r: Value,
        width: Value,
        w: i64,
        plan: &RowPlan,
        sums: &ColumnSums,
    ) -> Result<()> {
        let k = self.k;
        let row_offs = self.row_offsets(r);
        let inner = self.inner_strides();
        self.set_position(&row_offs, Some(&inner));
        let zero = self.iconst(I64, 0);
        let rows = self.iconst(I64, k.inner[0] as i64);
        for &(a, slot) in sums.passes.iter().flatten().flatten() {
            let src = self.pointer_at(a, zero);
            let stride = self.iconst(I64, inner[a]);
            self.call_void(vmath::COL_SUM_SYMBOL, &[src, stride, width, rows, slot]);
        }
        let s = self.fb.b.declare_var(I64);
        self.fb.b.def_var(s, zero);
        self.while_lt(s, width, &mut |g, sv| {
            let rs = g.fb.b.ins().iadd(r, sv);
            g.lane_block(rs, plan, Some((sums, sv)))?;
            Ok(g.iconst(I64, w))
        })
    }

    /// A block of `w` rows as lanes when `room` (rows left in the last outer dim) and `left`
    /// (rows left in the range) allow, else one ordinary row. Returns the rows done.
    fn block_or_row(
        &mut self,
        r: Value,
        room: Value,
        left: Value,
        w: i64,
        plan: &RowPlan,
    ) -> Result<Value> {
        let fits_dim = self
            .fb
            .b
            .ins()
            .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, room, w);
        let fits_range = self
            .fb
            .b
            .ins()
            .icmp_imm_s(IntCC::SignedGreaterThanOrEqual, left, w);
        let fits = self.fb.b.ins().band(fits_dim, fits_range);
        self.either(
            fits,
            &mut |g| {
                g.lane_block(r, plan, None)?;
                Ok(g.iconst(I64, w))
            },
            &mut |g| {
                g.one_row(r, plan)?;
                Ok(g.iconst(I64, 1))
            },
        )
    }

    /// Rows `[r, r + LANES·GROUPS)` as lanes.
    fn lane_block(&mut self, r: Value, plan: &RowPlan, pre: Presummed) -> Result<()> {
        let k = self.k;
        let ko = k.outer.len();
        let row_offs = self.row_offsets(r);
        let inner = self.inner_strides();
        let along: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[ko - 1] as i64)
            .collect();
        self.set_position(&row_offs, Some(&inner));
        self.lane_stride = Some(along);
        let result = self.lane_block_body(plan, pre);
        self.lane_stride = None;
        result
    }

    fn lane_block_body(&mut self, plan: &RowPlan, pre: Presummed) -> Result<()> {
        let k = self.k;
        let zero = self.iconst(I64, 0);
        let mut envs: Vec<Vec<Option<Value>>> = vec![vec![None; k.values.len()]; GROUPS as usize];
        self.lane_outer_values(&mut envs, zero)?;
        for (p, body) in plan.passes.iter().enumerate() {
            let accs: Vec<Vec<_>> = body
                .reds
                .iter()
                .map(|&r| {
                    let Expr::Reduce { combiner, .. } = k.values[r].expr else {
                        unreachable!("a pass lists reductions")
                    };
                    (0..GROUPS).map(|_| self.vacc(combiner)).collect()
                })
                .collect();
            match pre.and_then(|(sums, at)| Some((sums.passes[p].as_ref()?, at))) {
                Some((sums, at)) => self.load_sums(sums, &accs, at),
                None => self.lane_loop(body, &envs, &accs)?,
            }
            for (&r, accs) in body.reds.iter().zip(&accs) {
                let Expr::Reduce { combiner, .. } = k.values[r].expr else {
                    unreachable!("a pass lists reductions")
                };
                for (env, acc) in envs.iter_mut().zip(accs) {
                    env[r] = Some(self.vfinish(combiner, acc));
                }
            }
            self.lane_outer_values(&mut envs, zero)?;
        }
        for &s in &plan.row_stores {
            for (grp, env) in envs.iter().enumerate() {
                let x = env[k.stores[s].value].ok_or_else(|| {
                    crate::Error::Unsupported("cpu codegen: a row store of an inner value".into())
                })?;
                let a = self.access_of_store[s];
                let (p, off) = self.addr(a, zero, grp as i64 * LANES);
                self.fb.b.ins().store(flags(), x, p, off);
            }
        }
        if !plan.stores.stores.is_empty() {
            self.lane_loop(&plan.stores, &envs, &[])?;
        }
        Ok(())
    }

    /// Sets each group's f64 accumulators to the helper's sums for rows `at + grp·LANES ..`
    /// of the block (`sums` in the pass's order of reductions, as `accs`).
    fn load_sums(&mut self, sums: &[(usize, Value)], accs: &[Vec<VAcc>], at: Value) {
        let byte = self.fb.b.ins().imul_imm_s(at, 8);
        for (&(_, slot), accs) in sums.iter().zip(accs) {
            let base = self.fb.b.ins().iadd(slot, byte);
            for (grp, acc) in accs.iter().enumerate() {
                let VAcc::SumF64(lo, hi) = *acc else {
                    unreachable!("summed reductions are f32 sums with f64 lanes")
                };
                let off = (grp as i64 * LANES * 8) as i32;
                let l = self.fb.b.ins().load(F64X2, flags(), base, off);
                let h = self.fb.b.ins().load(F64X2, flags(), base, off + 16);
                self.fb.b.def_var(lo, l);
                self.fb.b.def_var(hi, h);
            }
        }
    }

    /// Computes, per group of lanes, every outer-level value whose operands are available.
    fn lane_outer_values(&mut self, envs: &mut [Vec<Option<Value>>], zero: Value) -> Result<()> {
        let k = self.k;
        for v in 0..k.values.len() {
            if self.levels[v] != Level::Outer || matches!(k.values[v].expr, Expr::Reduce { .. }) {
                continue;
            }
            for (grp, env) in envs.iter_mut().enumerate() {
                if env[v].is_none()
                    && k.values[v]
                        .expr
                        .operands()
                        .iter()
                        .all(|&o| env[o].is_some())
                {
                    env[v] = Some(self.vector_value(v, env, zero, grp as i64 * LANES)?);
                }
            }
        }
        Ok(())
    }

    /// The reduced loop over the inner dims for a block: each group computes `body`'s values
    /// from its environment, folds them into its accumulators and does the body's stores.
    /// Leading inner dims run as outer loops that move the position; the block's row
    /// position is restored afterwards.
    fn lane_loop(
        &mut self,
        body: &Body,
        envs: &[Vec<Option<Value>>],
        accs: &[Vec<super::vector::VAcc>],
    ) -> Result<()> {
        let row = (
            self.cur_off.clone(),
            self.cur_stride.clone(),
            self.cur_ptr.clone(),
        );
        let result = self.lane_nest(0, &row.0, body, envs, accs);
        (self.cur_off, self.cur_stride, self.cur_ptr) = row;
        result
    }

    /// The loops over inner dims `d..` from element offsets `offs`.
    fn lane_nest(
        &mut self,
        d: usize,
        offs: &[Value],
        body: &Body,
        envs: &[Vec<Option<Value>>],
        accs: &[Vec<super::vector::VAcc>],
    ) -> Result<()> {
        let ko = self.k.outer.len();
        let strides: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[ko + d] as i64)
            .collect();
        if d + 1 == self.k.inner.len() {
            self.set_position(offs, Some(&strides));
            return self.lane_inner(body, envs, accs);
        }
        self.count_loop(self.k.inner[d] as i64, &mut |g, jv| {
            let at = g.offsets_along(offs, &strides, jv);
            g.lane_nest(d + 1, &at, body, envs, accs)
        })
    }

    /// The innermost loop of [`Self::lane_loop`], over the last inner dim.
    fn lane_inner(
        &mut self,
        body: &Body,
        envs: &[Vec<Option<Value>>],
        accs: &[Vec<super::vector::VAcc>],
    ) -> Result<()> {
        let k = self.k;
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        let n = self.iconst(I64, k.inner[k.inner.len() - 1] as i64);
        // loop-invariant operands pinned before the loop (see `pin`)
        let outside = self.outside_operands(body);
        let mut pinned = Vec::new();
        for env in envs.iter() {
            let mut p = Vec::new();
            for &o in &outside {
                let x = env[o].ok_or_else(|| {
                    crate::Error::Unsupported("cpu codegen: an operand is not computed".into())
                })?;
                p.push((o, self.pin(x)));
            }
            pinned.push(p);
        }
        self.while_lt(i, n, &mut |g, iv| {
            for (grp, p) in pinned.iter().enumerate() {
                let lane = grp as i64 * LANES;
                let mut env = g.unpin_all(p, k.values.len());
                for &v in &body.vals {
                    env[v] = Some(g.vector_value(v, &env, iv, lane)?);
                }
                for (&r, accs) in body.reds.iter().zip(accs) {
                    let Expr::Reduce { combiner, arg, .. } = k.values[r].expr else {
                        unreachable!("a pass lists reductions")
                    };
                    let x = env[arg].ok_or_else(|| {
                        crate::Error::Unsupported("cpu codegen: an uncomputed argument".into())
                    })?;
                    g.vfold(combiner, &accs[grp], x);
                }
                for &s in &body.stores {
                    let x = env[k.stores[s].value].ok_or_else(|| {
                        crate::Error::Unsupported(
                            "cpu codegen: a store of an uncomputed value".into(),
                        )
                    })?;
                    let (p, off) = g.addr(g.access_of_store[s], iv, lane);
                    g.fb.b.ins().store(flags(), x, p, off);
                }
            }
            Ok(g.iconst(I64, 1))
        })
    }
}
