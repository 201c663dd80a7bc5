//! Rows as lanes: a row kernel whose rows walk memory with a stride (a sum over dim 0, the
//! bias gradient of a linear layer) runs blocks of adjacent rows side by side, one row per
//! F32X4 lane. The last outer dim is then the contiguous one: every step of the reduced
//! loop loads a whole cache line of adjacent outputs' elements instead of one element per
//! line, and each lane keeps its own accumulator, summed in the same order as a single row
//! (so results are bit-identical to the scalar row code).
//!
//! Taken when the inner space is one dim after coalescing, some load walks it with a stride
//! other than 0 or 1, every access moves by 0 or 1 element along the last outer dim (stores
//! by 1), and every value and reduction has a vector form. Rows that do not fill a block (the
//! end of a chunk or of the last outer dim) run as ordinary rows.

use super::lower::{Body, Gen, RowPlan, flags};
use crate::Result;
use crate::kernel::{Expr, Level, ValId};
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{InstBuilder, Value};

/// Lanes of one vector.
const LANES: i64 = 4;
/// Vectors per block: 16 rows, a 64-byte line of f32 outputs per step of the reduced loop.
const GROUPS: i64 = 4;

impl Gen<'_, '_, '_> {
    /// The block width in rows when this kernel runs rows as lanes, else None.
    pub(super) fn lane_width(&self) -> Option<i64> {
        let k = self.k;
        let ko = k.outer.len();
        if ko == 0 || k.inner.len() != 1 || k.outer[ko - 1] < (LANES * GROUPS) as usize {
            return None;
        }
        let along = |a: usize| self.accesses[a].map.strides[ko - 1];
        let strided = self.accesses.iter().enumerate().any(|(a, acc)| {
            acc.buffer.is_some()
                && self.access_of_val.values().any(|&x| x == a)
                && acc.map.strides[ko] > 1
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

    /// At row `r` (of `[r, end)`): a block of `w` rows as lanes when it fits inside the last
    /// outer dim and the range, else one ordinary row. Returns the rows done.
    pub(super) fn lanes_or_row(
        &mut self,
        r: Value,
        end: Value,
        w: i64,
        plan: &RowPlan,
    ) -> Result<Value> {
        use cranelift_codegen::ir::condcodes::IntCC;
        let last = self.k.outer[self.k.outer.len() - 1] as i64;
        let j = self.fb.b.ins().urem_imm_s(r, last);
        let lastv = self.iconst(I64, last);
        let room = self.fb.b.ins().isub(lastv, j);
        let left = self.fb.b.ins().isub(end, r);
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
        let block = self.fb.b.create_block();
        let single = self.fb.b.create_block();
        let join = self.fb.b.create_block();
        self.fb.b.append_block_param(join, I64);
        self.fb.b.ins().brif(fits, block, &[], single, &[]);
        self.fb.b.switch_to_block(block);
        self.lane_block(r, plan)?;
        let wv = self.iconst(I64, w);
        self.fb.b.ins().jump(join, &[wv.into()]);
        self.fb.b.switch_to_block(single);
        self.one_row(r, plan)?;
        let one = self.iconst(I64, 1);
        self.fb.b.ins().jump(join, &[one.into()]);
        self.fb.b.switch_to_block(join);
        Ok(self.fb.b.block_params(join)[0])
    }

    /// Rows `[r, r + LANES·GROUPS)` as lanes.
    fn lane_block(&mut self, r: Value, plan: &RowPlan) -> Result<()> {
        let k = self.k;
        let ko = k.outer.len();
        let row_offs = self.row_offsets(r);
        let inner: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[ko] as i64)
            .collect();
        let along: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[ko - 1] as i64)
            .collect();
        self.set_position(&row_offs, Some(&inner));
        self.lane_stride = Some(along);
        let result = self.lane_block_body(plan);
        self.lane_stride = None;
        result
    }

    fn lane_block_body(&mut self, plan: &RowPlan) -> Result<()> {
        let k = self.k;
        let zero = self.iconst(I64, 0);
        let mut envs: Vec<Vec<Option<Value>>> = vec![vec![None; k.values.len()]; GROUPS as usize];
        self.lane_outer_values(&mut envs, zero)?;
        for body in &plan.passes {
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
            self.lane_loop(body, &envs, &accs)?;
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

    /// The reduced loop over the inner dim for a block: each group computes `body`'s values
    /// from its environment, folds them into its accumulators and does the body's stores.
    fn lane_loop(
        &mut self,
        body: &Body,
        envs: &[Vec<Option<Value>>],
        accs: &[Vec<super::vector::VAcc>],
    ) -> Result<()> {
        let k = self.k;
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        let n = self.iconst(I64, k.inner[0] as i64);
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
