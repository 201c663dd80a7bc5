//! The row cache: in a row kernel whose reduction passes and stores need the same costly
//! inner value (softmax's `exp(x - max)`, needed by the sum and by the scaling), the first
//! body that needs it computes it and keeps the row in a stack buffer; later bodies read it
//! back from there (the row stays in L1) instead of evaluating the transcendental again.
//!
//! Only for a one-dimensional inner space after coalescing (the flat position is the loop
//! index) and rows of at most [`ROW_CACHE_BYTES`] in all.

use super::generator::{Body, Gen};
use super::lower::{cty, flags};
use crate::Result;
use crate::ir::op::BinaryOp;
use crate::ir::unary::Cost;
use crate::kernel::{Expr, Level, ValId};
use cranelift_codegen::ir::{InstBuilder, StackSlotData, StackSlotKind, Type, Value};

/// Stack bytes the cached rows of one kernel may take.
pub const ROW_CACHE_BYTES: usize = 32 << 10;

/// Whether an expression costs a polynomial evaluation or more per element.
fn costly(e: &Expr) -> bool {
    match e {
        Expr::Unary(u, _) => u.cost() == Cost::Transcendental,
        Expr::Binary(b, ..) => *b == BinaryOp::Pow,
        _ => false,
    }
}

impl Gen<'_, '_, '_> {
    /// The inner-level values `roots` need, in order; values in `leaves` are included but
    /// their operands are not followed (they come from the row cache).
    pub(super) fn closure_upto(&self, roots: &[ValId], leaves: &[ValId]) -> Vec<ValId> {
        self.closure_within(roots, leaves, &|v| self.levels[v] != Level::Outer)
    }

    /// The values `roots` need among those `inside` accepts, in order, following operands
    /// except those of `leaves`.
    pub(super) fn closure_within(
        &self,
        roots: &[ValId],
        leaves: &[ValId],
        inside: &dyn Fn(ValId) -> bool,
    ) -> Vec<ValId> {
        let mut need = vec![false; self.k.values.len()];
        let mut stack: Vec<ValId> = roots.to_vec();
        while let Some(v) = stack.pop() {
            if need[v] || !inside(v) {
                continue;
            }
            need[v] = true;
            if !leaves.contains(&v) {
                stack.extend(self.k.values[v].expr.operands());
            }
        }
        (0..need.len()).filter(|&v| need[v]).collect()
    }

    /// A stack row of `bytes` (16-byte aligned); its address.
    pub(super) fn stack_row(&mut self, bytes: usize) -> Value {
        let slot = self.fb.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes as u32,
            4,
        ));
        self.fb.b.ins().stack_addr(self.ptr, slot, 0)
    }

    /// The bodies of a row kernel (the passes in order, then the stores), given the values
    /// each must produce; with `cache`, costly values shared by two or more bodies are cached.
    pub(super) fn row_bodies(&mut self, parts: Vec<(Vec<ValId>, Body)>, cache: bool) -> Vec<Body> {
        let closures: Vec<Vec<ValId>> = parts
            .iter()
            .map(|(roots, _)| self.closure_upto(roots, &[]))
            .collect();
        let cached = if cache {
            self.choose_cached(&closures)
        } else {
            vec![]
        };
        let mut done: Vec<ValId> = Vec::new();
        let mut bodies = Vec::new();
        for (roots, mut body) in parts {
            body.vals = self.closure_upto(&roots, &done);
            body.cache_in = body
                .vals
                .iter()
                .copied()
                .filter(|v| done.contains(v))
                .collect();
            body.cache_out = body
                .vals
                .iter()
                .copied()
                .filter(|v| cached.contains(v) && !done.contains(v))
                .collect();
            done.extend(&body.cache_out);
            bodies.push(body);
        }
        bodies
    }

    /// Costly float values needed by two or more bodies, skipping those whose every user
    /// is itself cached; each gets a stack row.
    fn choose_cached(&mut self, closures: &[Vec<ValId>]) -> Vec<ValId> {
        let k = self.k;
        if k.inner.len() != 1 || closures.len() < 2 {
            return vec![];
        }
        let n = k.inner[0];
        let mut shared: Vec<ValId> = (0..k.values.len())
            .filter(|&v| {
                k.values[v].dtype.is_float()
                    && costly(&k.values[v].expr)
                    && closures.iter().filter(|c| c.contains(&v)).count() >= 2
            })
            .collect();
        // A value whose every user is cached too is not needed again (a store is a use).
        let snapshot = shared.clone();
        shared.retain(|&v| {
            let stored = k.stores.iter().any(|s| s.value == v);
            let mut users = (0..k.values.len())
                .filter(|&u| k.values[u].expr.operands().contains(&v))
                .peekable();
            stored || users.peek().is_none() || !users.all(|u| snapshot.contains(&u))
        });
        let mut budget = ROW_CACHE_BYTES;
        let mut chosen = Vec::new();
        for v in shared {
            let bytes = n * cty(k.values[v].dtype).bytes() as usize;
            if bytes == 0 || bytes > budget {
                continue;
            }
            budget -= bytes;
            let p = self.stack_row(bytes);
            self.row_cache.insert(v, p);
            chosen.push(v);
        }
        chosen
    }

    /// Address of element `i + lane` of a row of `v`'s that starts at `base`.
    fn row_addr(&mut self, base: Value, v: ValId, i: Value, lane: i64) -> (Value, i32) {
        let size = cty(self.k.values[v].dtype).bytes() as i64;
        let t = self.fb.b.ins().imul_imm_s(i, size);
        let p = self.fb.b.ins().iadd(base, t);
        (p, (lane * size) as i32)
    }

    /// Value `v` of `body` at element `i + lane`, of type `t` (its scalar type, or F32X4 in a
    /// vector loop): read from its cached or strip row, or computed by `compute`; then kept in
    /// the rows `body` writes it to.
    pub(super) fn body_value(
        &mut self,
        body: &Body,
        v: ValId,
        t: Type,
        i: Value,
        lane: i64,
        compute: &mut dyn FnMut(&mut Self) -> Result<Value>,
    ) -> Result<Value> {
        let from = if body.cache_in.contains(&v) {
            Some(self.row_cache[&v])
        } else if body.strip_in.contains(&v) {
            Some(self.strip_rows[&v])
        } else {
            None
        };
        let x = match from {
            Some(base) => {
                let (p, off) = self.row_addr(base, v, i, lane);
                self.fb.b.ins().load(t, flags(), p, off)
            }
            None => compute(self)?,
        };
        let mut to: Vec<(ValId, Value)> = body
            .strip_out
            .iter()
            .filter(|&&(o, _)| o == v)
            .map(|&(_, c)| (c, self.strip_rows[&c]))
            .collect();
        if body.cache_out.contains(&v) {
            to.push((v, self.row_cache[&v]));
        }
        for (w, base) in to {
            let (p, off) = self.row_addr(base, w, i, lane);
            self.fb.b.ins().store(flags(), x, p, off);
        }
        Ok(x)
    }
}
