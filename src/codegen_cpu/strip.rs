//! Strips: an innermost vector loop whose body applies a transcendental that a native helper
//! evaluates ([`super::vmath`]: exp, tanh, sigmoid, silu, both GELUs and their slopes, erf),
//! or sums f32 values, runs in strips of [`STRIP`] elements. Per strip:
//! - for each such value in order, a loop computes its operand into the value's strip row and
//!   the helper maps the row in place; an operand that is a contiguous load is read from its
//!   buffer instead, and a value the body only stores has its strip row in its output;
//! - sums, maxima and minima of a strip value or of a contiguous load are taken by the
//!   sum and extreme helpers;
//! - the body proper runs with the strip values read back from their rows, still in L1 (not
//!   at all when nothing is left for it).
//!
//! Strip rows are stack rows, or the value's row in the row cache ([`super::rowcache`]) where
//! that keeps it. Cranelift's 128-bit code keeps the cheap work (loads, arithmetic, other
//! reductions, stores); the helpers' 256- or 512-bit loops take the costly one. The helpers
//! are exact ports of the inline math, so strips change speed, not results, except that
//! sums add in another order (in f64, far below f32 precision) and a maximum of `-0` and
//! `+0` may come out as either.

use super::generator::{Body, Gen};
use super::vmath::{self, StripOp};
use crate::Result;
use crate::ir::dtype::DType;
use crate::kernel::{Combiner, Expr, ValId};
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_codegen::ir::{InstBuilder, Value};
use cranelift_frontend::Variable;
use std::collections::HashSet;

/// Elements per strip: a multiple of the vector loop's step; 2 KiB of stack per value. Also
/// where a helper reads its operand from memory: shorter strips there once kept the hardware
/// prefetcher streaming while a helper that copied its operand first computed; the helpers
/// now read the operand in their loop and ask for its lines ahead themselves, and 512
/// measured faster than 128 for tanh-GELU and sigmoid on AVX2 and AVX-512 (BENCHMARKS.md).
pub const STRIP: i64 = 512;

/// Elements per call when the helper only sums memory: nothing computes between the calls,
/// so longer calls only save the per-call work (the helper's partial sums are folded at
/// the end of each call).
pub const SUM_STRIP: i64 = 8192;

/// Stack bytes the strip rows of one kernel may take; values past it stay inline (a long
/// chain of transcendentals must not overflow a worker thread's stack).
pub const STRIP_STACK_BYTES: usize = 32 << 10;

const ROW_BYTES: usize = STRIP as usize * 4;

/// The shortest innermost loop that runs in strips.
pub(super) const MIN_STRIP_ROW: usize = 64;

pub use crate::runtime::native::strip_of;

fn within(vals: &[ValId], set: &[ValId]) -> Vec<ValId> {
    vals.iter().copied().filter(|v| set.contains(v)).collect()
}

impl Gen<'_, '_, '_> {
    /// The strip op of value `v`, if it is an f32 op a helper evaluates.
    fn strip_op(&self, v: ValId) -> Option<StripOp> {
        let val = &self.k.values[v];
        match val.expr {
            Expr::Unary(u, a)
                if val.dtype == DType::F32 && self.k.values[a].dtype == DType::F32 =>
            {
                strip_of(u)
            }
            _ => None,
        }
    }

    /// What of a vectorisable `body` strips hand to helpers; None when the body runs as one
    /// plain vector loop.
    pub(super) fn strip_work(&self, body: &Body) -> Option<Strips> {
        // rows shorter than a few vectors spend more on the helpers' calls than they save
        // (measured on log_softmax over rows of 13)
        let short = self.k.inner.last().is_some_and(|&n| n < MIN_STRIP_ROW);
        if self.opts.inline_math
            || !vmath::available()
            || self.pos.is_some()
            || self.lane_stride.is_some()
            || short
        {
            return None;
        }
        let room = STRIP_STACK_BYTES.saturating_sub(self.strip_rows_bytes) / ROW_BYTES;
        let vals: Vec<ValId> = body
            .vals
            .iter()
            .copied()
            .filter(|&v| !body.cache_in.contains(&v) && self.strip_op(v).is_some())
            .take(room)
            .collect();
        // f32 sums of a strip value or of a contiguous load: the helper reads the row or the
        // memory with 8 f64 lanes per instruction instead of 2; maxima and minima with 16 or 8
        // lanes instead of 4 (softmax's row maximum)
        let sums: Vec<ValId> = body
            .reds
            .iter()
            .copied()
            .filter(|&r| match self.k.values[r].expr {
                Expr::Reduce {
                    combiner: Combiner::Sum | Combiner::Mean | Combiner::Max | Combiner::Min,
                    arg,
                    ..
                } => {
                    self.k.values[arg].dtype == DType::F32
                        && (vals.contains(&arg) || self.contiguous_load(body, arg).is_some())
                }
                _ => false,
            })
            .collect();
        (!vals.is_empty() || !sums.is_empty()).then_some(Strips { vals, sums })
    }

    /// The values of `body` that `roots` need, following operands up to `leaves`, in order.
    fn closure_in(&self, body: &Body, roots: &[ValId], leaves: &[ValId]) -> Vec<ValId> {
        let inside: HashSet<ValId> = body.vals.iter().copied().collect();
        self.closure_within(roots, leaves, &|v| inside.contains(&v))
    }

    /// The access of `v` if it is a load the innermost loop walks contiguously.
    fn contiguous_load(&self, body: &Body, v: ValId) -> Option<usize> {
        let a = *self.access_of_val.get(&v)?;
        let plain = matches!(self.k.values[v].expr, Expr::Load { .. })
            && !body.cache_in.contains(&v)
            && self.cur_stride[a] == 1;
        plain.then_some(a)
    }

    /// The store the helper may write itself: when `body` has one strip value and does
    /// nothing but store it, once and contiguously, into a buffer the kernel does not read
    /// (`body` itself then need not run). Not with several strip values: an output may share
    /// memory with an input (`CompiledFn::call_into`), and a later helper of the strip would
    /// read what an earlier one wrote.
    fn direct_store(&self, body: &Body, strip: &[ValId]) -> Option<usize> {
        let k = self.k;
        let ([c], [s]) = (strip, &body.stores[..]) else {
            return None;
        };
        let st = &k.stores[*s];
        let used = body
            .vals
            .iter()
            .any(|&v| k.values[v].expr.operands().contains(c));
        let read = k
            .values
            .iter()
            .any(|v| matches!(v.expr, Expr::Load { buffer, .. } if buffer == st.buffer));
        let plain = st.value == *c
            && body.reds.is_empty()
            && body.cache_out.is_empty()
            && self.cur_stride[self.access_of_store[*s]] == 1;
        (plain && !used && !read).then_some(*s)
    }

    /// How `body` runs in strips: for each value of `strip`, where its helper reads (a loop
    /// that fills a row with the operand, or the operand's own memory) and writes (its row, or
    /// straight into its output); then `body` itself reading the rows, unless nothing is left
    /// for it to do.
    fn strip_plan(&self, body: &Body, work: &Strips) -> StripPlan {
        let k = self.k;
        let strip = &work.vals[..];
        let direct = self.direct_store(body, strip);
        let mut srcs = Vec::new();
        for (n, &c) in strip.iter().enumerate() {
            let Expr::Unary(_, a) = k.values[c].expr else {
                unreachable!("strip values are unary ops")
            };
            if let Some(acc) = self.contiguous_load(body, a) {
                srcs.push(Src::Load(acc));
                continue;
            }
            let done = &strip[..n];
            let vals = self.closure_in(body, &[a], &[done, &body.cache_in].concat());
            let mut ph = Body::new(vals, vec![], vec![]);
            ph.cache_in = within(&ph.vals, &body.cache_in);
            ph.strip_in = within(&ph.vals, done);
            ph.strip_out = vec![(a, c)];
            srcs.push(Src::Row(ph));
        }
        let sums = work
            .sums
            .iter()
            .map(|&r| {
                let Expr::Reduce { arg, combiner, .. } = k.values[r].expr else {
                    unreachable!("strip sums are reductions")
                };
                match strip.iter().position(|&c| c == arg) {
                    Some(j) => (r, combiner, SumSrc::Row(j)),
                    None => {
                        let a = self.contiguous_load(body, arg);
                        (
                            r,
                            combiner,
                            SumSrc::Load(a.unwrap_or_else(|| unreachable!("chosen so"))),
                        )
                    }
                }
            })
            .collect();
        if direct.is_some() {
            return StripPlan {
                srcs,
                outs: vec![direct],
                sums,
                last: None,
            };
        }
        let reds: Vec<ValId> = body
            .reds
            .iter()
            .copied()
            .filter(|r| !work.sums.contains(r))
            .collect();
        let mut roots: Vec<ValId> = reds
            .iter()
            .filter_map(|&r| match k.values[r].expr {
                Expr::Reduce { arg, .. } => Some(arg),
                _ => None,
            })
            .collect();
        roots.extend(body.stores.iter().map(|&s| k.stores[s].value));
        // a strip value the row cache keeps has its strip row there: nothing to copy
        let cache_out: Vec<ValId> = body
            .cache_out
            .iter()
            .copied()
            .filter(|v| !strip.contains(v))
            .collect();
        roots.extend(&cache_out);
        let vals = self.closure_in(body, &roots, &[strip, &body.cache_in].concat());
        let idle = reds.is_empty() && body.stores.is_empty() && cache_out.is_empty();
        let mut last = Body::new(vals, reds, body.stores.clone());
        last.cache_in = within(&last.vals, &body.cache_in);
        last.cache_out = within(&last.vals, &cache_out);
        last.strip_in = within(&last.vals, strip);
        StripPlan {
            outs: vec![None; strip.len()],
            srcs,
            sums,
            last: (!idle).then_some(last),
        }
    }

    /// Byte pointer of access `a` at element `i` of the innermost loop.
    pub(super) fn pointer_at(&mut self, a: usize, i: Value) -> Value {
        let (p, off) = self.addr(a, i, 0);
        self.fb.b.ins().iadd_imm_s(p, i64::from(off))
    }

    /// The innermost loop over `[0, len)` in strips (`i` is the loop's index variable).
    pub(super) fn strip_loop(
        &mut self,
        i: Variable,
        len: Value,
        body: &Body,
        env: &mut [Option<Value>],
        work: &Strips,
    ) -> Result<()> {
        let plan = self.strip_plan(body, work);
        let strip = &work.vals[..];
        // A stack row for each value whose result `body` reads back, unless the row cache
        // keeps the value (its strip row is then the cached row). A value the helper stores
        // itself has its strip row in its output: a loop computing its operand writes there,
        // and the helper maps it in place. Rows are addressed by the innermost index: a
        // stack row holds one strip, so its base moves with the strip; the others are whole.
        let mut rows = Vec::new();
        for (out, &c) in plan.outs.iter().zip(strip) {
            rows.push(match out {
                Some(st) => {
                    let a = self.access_of_store[*st];
                    let zero = self.iconst(I64, 0);
                    Row::Whole(self.pointer_at(a, zero))
                }
                None => match self.row_cache.get(&c) {
                    Some(&base) => Row::Whole(base),
                    None => {
                        self.strip_rows_bytes += ROW_BYTES;
                        Row::Strip(self.stack_row(ROW_BYTES))
                    }
                },
            });
        }
        let ops: Vec<i64> = strip
            .iter()
            .map(|&c| self.strip_op(c).map_or(-1, |op| op as i64))
            .collect();
        let only_sums = strip.is_empty()
            && plan.last.is_none()
            && plan
                .sums
                .iter()
                .all(|(_, _, s)| matches!(s, SumSrc::Load(_)));
        let step = if only_sums { SUM_STRIP } else { STRIP };
        self.in_strips(len, step, &mut |g, sv, n, end| {
            // element `sv` is a stack row's first: its base sits `sv` elements before it
            let back = g.fb.b.ins().imul_imm_s(sv, 4);
            let mut starts = Vec::new();
            for (&c, row) in strip.iter().zip(&rows) {
                let (base, start) = match *row {
                    Row::Strip(p) => (g.fb.b.ins().isub(p, back), p),
                    Row::Whole(base) => (base, g.fb.b.ins().iadd(base, back)),
                };
                g.strip_rows.insert(c, base);
                starts.push(start);
            }
            for j in 0..strip.len() {
                let src = match &plan.srcs[j] {
                    Src::Load(a) => g.pointer_at(*a, sv),
                    Src::Row(ph) => {
                        g.fb.b.def_var(i, sv);
                        g.vector_loop(i, end, ph, env)?;
                        g.scalar_loop(i, end, ph, env)?;
                        starts[j]
                    }
                };
                let op = g.iconst(I32, ops[j]);
                g.call_void(vmath::SYMBOL, &[op, src, starts[j], n]);
            }
            for &(r, combiner, ref from) in &plan.sums {
                let src = match *from {
                    SumSrc::Load(a) => g.pointer_at(a, sv),
                    SumSrc::Row(j) => starts[j],
                };
                match combiner {
                    Combiner::Max | Combiner::Min => {
                        let max = combiner == Combiner::Max;
                        let sym = if max {
                            vmath::MAX_SYMBOL
                        } else {
                            vmath::MIN_SYMBOL
                        };
                        let part = g.call(sym, &[src, n]);
                        g.fold(r, part);
                    }
                    _ => {
                        let part = g.call(vmath::SUM_SYMBOL, &[src, n]);
                        let acc = g.accs[&r].val;
                        let a = g.fb.b.use_var(acc);
                        let a = g.fb.b.ins().fadd(a, part);
                        g.fb.b.def_var(acc, a);
                    }
                }
            }
            if let Some(last) = &plan.last {
                g.fb.b.def_var(i, sv);
                g.vector_loop(i, end, last, env)?;
                g.scalar_loop(i, end, last, env)?;
            }
            Ok(())
        })
    }

    /// Runs `each(g, start, n, end)` over `[0, len)` in strips of `n = min(step, len - start)`
    /// elements ending at `end`.
    pub(super) fn in_strips(
        &mut self,
        len: Value,
        step: i64,
        each: &mut dyn FnMut(&mut Self, Value, Value, Value) -> Result<()>,
    ) -> Result<()> {
        let s = self.fb.b.declare_var(I64);
        let zero = self.iconst(I64, 0);
        self.fb.b.def_var(s, zero);
        self.while_lt(s, len, &mut |g, sv| {
            let left = g.fb.b.ins().isub(len, sv);
            let cap = g.iconst(I64, step);
            let n = g.fb.b.ins().smin(left, cap);
            let end = g.fb.b.ins().iadd(sv, n);
            each(g, sv, n, end)?;
            Ok(n)
        })
    }
}

/// Where a strip helper reads its operand.
enum Src {
    /// A row this body fills.
    Row(Body),
    /// The operand's own memory (a contiguous f32 load; this access).
    Load(usize),
}

/// What an innermost loop hands to strip helpers.
pub(super) struct Strips {
    /// Values a helper maps (exp, tanh, ...), in order.
    vals: Vec<ValId>,
    /// f32 sums, maxima and minima a helper computes, of one of `vals` or of a contiguous
    /// load.
    sums: Vec<ValId>,
}

/// Where a strip value's row lies (its address; see [`Gen::strip_loop`]).
#[derive(Clone, Copy)]
enum Row {
    /// A stack row of one strip.
    Strip(Value),
    /// The base of a whole row: the output, or the row cache.
    Whole(Value),
}

/// Where a strip sum reads.
enum SumSrc {
    /// The row of strip value `j`.
    Row(usize),
    /// Memory (a contiguous f32 load; this access).
    Load(usize),
}

/// How one innermost loop runs in strips ([`Gen::strip_plan`]).
struct StripPlan {
    srcs: Vec<Src>,
    /// The store each value's helper writes straight into, if any.
    outs: Vec<Option<usize>>,
    /// Each strip reduction, its combiner and where it reads.
    sums: Vec<(ValId, Combiner, SumSrc)>,
    /// The body reading the rows back; None when the helpers wrote every store.
    last: Option<Body>,
}
