//! Softmax rows as one helper call. A row kernel that is exactly the decomposition of
//! `softmax` (`max`, `sub`, `exp`, `sum`, `reciprocal`, `mul`) or `log_softmax` (`log` and
//! `sub` at the end) of a contiguous f32 row, stored to a contiguous row and nothing else,
//! calls the run-time library's row softmax once per row ([`vmath::SOFTMAX_SYMBOL`], the
//! same code as eager `softmax`). The generic lowering runs its cheap passes (the
//! subtraction, the scaling) as Cranelift's 128-bit loops between the helpers' 256- or
//! 512-bit ones, and measured well behind the eager op on large rows (BENCHMARKS.md has
//! the figures).
//!
//! A softmax fused with what computes its input, or with what reads its output, keeps the
//! generic lowering.

use super::generator::Gen;
use super::strip::MIN_STRIP_ROW;
use super::vmath;
use crate::Result;
use crate::ir::dtype::DType;
use crate::ir::op::{BinaryOp, UnaryOp};
use crate::kernel::{Combiner, Expr, Kernel, ValId};
use cranelift_codegen::ir::Value;
use cranelift_codegen::ir::types::{I32, I64};

/// A kernel recognised as row softmax: the value loaded, and whether it is log_softmax.
pub(super) struct SoftmaxRows {
    load: ValId,
    log: bool,
}

/// `v`'s expression, when `v` is an f32 value.
fn f32_expr(k: &Kernel, v: ValId) -> Option<&Expr> {
    let val = k.values.get(v)?;
    (val.dtype == DType::F32).then_some(&val.expr)
}

/// Whether `v` reduces `arg` with `combiner`.
fn reduces(k: &Kernel, v: ValId, combiner: Combiner) -> Option<ValId> {
    match *f32_expr(k, v)? {
        Expr::Reduce {
            combiner: c, arg, ..
        } if c == combiner => Some(arg),
        _ => None,
    }
}

/// Whether `v` is `op(a)`, and `a`.
fn unary(k: &Kernel, v: ValId, op: UnaryOp) -> Option<ValId> {
    match *f32_expr(k, v)? {
        Expr::Unary(u, a) if u == op => Some(a),
        _ => None,
    }
}

/// The operands of `v = op(a, b)`.
fn binary(k: &Kernel, v: ValId, op: BinaryOp) -> Option<(ValId, ValId)> {
    match *f32_expr(k, v)? {
        Expr::Binary(b, x, y) if b == op => Some((x, y)),
        _ => None,
    }
}

/// Recognises `k` (coalesced) as row softmax or log_softmax; see the module's text.
fn recognise(k: &Kernel) -> Option<SoftmaxRows> {
    let inner = k.outer.len();
    if k.inner.len() != 1 || k.inner[0] < MIN_STRIP_ROW || k.stores.len() != 1 {
        return None;
    }
    let [p0, p1] = k.passes.as_slice() else {
        return None;
    };
    let ([m], [s]) = (p0.as_slice(), p1.as_slice()) else {
        return None;
    };
    let x = reduces(k, *m, Combiner::Max)?;
    let e = reduces(k, *s, Combiner::Sum)?;
    let d = unary(k, e, UnaryOp::Exp)?;
    if binary(k, d, BinaryOp::Sub)? != (x, *m) {
        return None;
    }
    let y = k.stores[0].value;
    let log = if let Some((a, b)) = binary(k, y, BinaryOp::Mul) {
        let r = if a == e {
            b
        } else if b == e {
            a
        } else {
            return None;
        };
        if unary(k, r, UnaryOp::Reciprocal)? != *s {
            return None;
        }
        false
    } else {
        let (a, l) = binary(k, y, BinaryOp::Sub)?;
        if a != d || unary(k, l, UnaryOp::Log)? != *s {
            return None;
        }
        true
    };
    // contiguous rows in and out, and no value but the decomposition's
    let Expr::Load { buffer, map } = f32_expr(k, x)? else {
        return None;
    };
    let out = &k.stores[0];
    let unit = |strides: &[usize]| strides.get(inner) == Some(&1);
    (unit(&map.strides) && unit(&out.map.strides) && *buffer != out.buffer && k.values.len() == 7)
        .then_some(SoftmaxRows { load: x, log })
}

impl Gen<'_, '_, '_> {
    /// This kernel as softmax rows, where the native helpers run and it is recognised.
    pub(super) fn softmax_rows_plan(&self) -> Option<SoftmaxRows> {
        (vmath::available() && !self.opts.inline_math)
            .then(|| recognise(self.k))
            .flatten()
    }

    /// Rows `[begin, end)` of a kernel [`recognise`] accepted: one helper call per row.
    pub(super) fn emit_softmax_rows(
        &mut self,
        sm: &SoftmaxRows,
        begin: Value,
        end: Value,
    ) -> Result<()> {
        let src = self.access_of_val[&sm.load];
        let dst = self.access_of_store[0];
        let n = self.k.inner[0] as i64;
        let log = i32::from(sm.log);
        let row = self.fb.b.declare_var(I64);
        self.fb.b.def_var(row, begin);
        self.while_lt(row, end, &mut |g, r| {
            let offs = g.row_offsets(r);
            g.set_position(&offs, None);
            let ptr = |a: usize| g.cur_ptr[a].unwrap_or_else(|| unreachable!("a load or store"));
            let (s, d) = (ptr(src), ptr(dst));
            let (n, log) = (g.iconst(I64, n), g.iconst(I32, log as i64));
            g.call_void(vmath::SOFTMAX_SYMBOL, &[s, d, n, log]);
            Ok(g.iconst(I64, 1))
        })?;
        self.softmax_rows += 1;
        Ok(())
    }
}
