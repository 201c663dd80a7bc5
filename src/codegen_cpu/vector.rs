//! The vectorised innermost loop: F32X4 lanes (masks as I32X4), two groups per iteration.
//!
//! Taken when every access of the loop has stride 0 (splat) or 1 along it, every value is
//! f32 or bool, and every reduction is a sum, mean, max or min of f32. Max/min use
//! compare + bitselect and keep PyTorch's NaN propagation; sums accumulate in f64 lanes
//! (`f32_lane_sums`: f32 lanes), merged lane by lane into the scalar accumulator before the tail.

use super::generator::{Body, Gen};
use super::lower::flags;
use super::math;
use crate::Result;
use crate::ir::dtype::DType;
use crate::ir::op::{BinaryOp, UnaryOp};
use crate::kernel::{Combiner, Expr, ValId};
use crate::runtime::element::round_to_dtype;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, F64, F64X2, I8, I8X16, I32, I32X4};
use cranelift_codegen::ir::{
    ConstantData, Endianness, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind,
    Type, Value,
};
use cranelift_frontend::Variable;
use std::collections::HashSet;

const LANES: i64 = 4;
const GROUPS: i64 = 2;

/// Vector accumulators of one reduction.
pub(super) enum VAcc {
    /// f64 lanes for elements 0,1 and 2,3 of each group.
    SumF64(Variable, Variable),
    SumF32(Variable),
    /// Max/min lanes, and the lanes that have seen a NaN (kept apart so that the max/min
    /// itself is one `maxps`/`minps` on the loop-carried chain).
    Extreme(Variable, Variable),
}

fn vbitcast(g: &mut Gen, t: Type, v: Value) -> Value {
    if g.fb.b.func.dfg.value_type(v) == t {
        return v;
    }
    let fl = MemFlagsData::new().with_endianness(Endianness::Little);
    g.fb.b.ins().bitcast(t, fl, v)
}

/// `m ? a : b` lane-wise for an I32X4 mask.
fn vsel(g: &mut Gen, m: Value, a: Value, b: Value) -> Value {
    let t = g.fb.b.func.dfg.value_type(a);
    let m = vbitcast(g, t, m);
    g.fb.b.ins().bitselect(m, a, b)
}

fn vf(g: &mut Gen, v: f64) -> Value {
    let s = g.fb.b.ins().f32const(v as f32);
    g.fb.b.ins().splat(F32X4, s)
}

fn vmask_const(g: &mut Gen, on: bool) -> Value {
    let s = g.iconst(I32, if on { -1 } else { 0 });
    g.fb.b.ins().splat(I32X4, s)
}

impl Gen<'_, '_, '_> {
    fn stride_ok(&self, a: usize, allow_zero: bool) -> bool {
        let s = self.cur_stride[a];
        s == 1 || (allow_zero && s == 0)
    }

    /// The I32X4 mask of four bools at `p + off` (one bool splat when `splat`): a bool
    /// operand (a causal mask, a comparison's stored result) keeps its loop vectorised.
    fn vmask_load(&mut self, p: Value, off: i32, splat: bool) -> Value {
        let b = &mut self.fb.b;
        if splat {
            let x = b.ins().load(I8, flags(), p, off);
            let m = b.ins().bmask(I32, x);
            return b.ins().splat(I32X4, m);
        }
        // four bytes into the low lane, widened byte by byte to four i32 lanes
        let x = b.ins().load(I32, flags(), p, off);
        let v = b.ins().scalar_to_vector(I32X4, x);
        let fl = MemFlagsData::new().with_endianness(Endianness::Little);
        let v = b.ins().bitcast(I8X16, fl, v);
        let v = b.ins().uwiden_low(v);
        let v = b.ins().uwiden_low(v);
        let zero = b.ins().iconst(I32, 0);
        let zero = b.ins().splat(I32X4, zero);
        b.ins().icmp(IntCC::NotEqual, v, zero)
    }

    /// Whether `body` can run in the vector loop at the current position.
    pub fn vectorizable(&self, body: &Body) -> bool {
        let k = self.k;
        for &v in &body.vals {
            if body.cache_in.contains(&v) {
                if k.values[v].dtype != DType::F32 {
                    return false;
                }
                continue;
            }
            if !self.vector_value_ok(v) {
                return false;
            }
            if matches!(k.values[v].expr, Expr::Load { .. })
                && !self.stride_ok(self.access_of_val[&v], true)
            {
                return false;
            }
        }
        let inside: HashSet<ValId> = body.vals.iter().copied().collect();
        for &r in &body.reds {
            let Expr::Reduce { arg, .. } = k.values[r].expr else {
                return false;
            };
            if !self.vector_reduce_ok(r)
                || !inside.contains(&arg) && self.levels[arg] != crate::kernel::Level::Outer
            {
                return false;
            }
        }
        for &s in &body.stores {
            let st = &k.stores[s];
            if k.values[st.value].dtype != DType::F32
                || !self.stride_ok(self.access_of_store[s], false)
            {
                return false;
            }
        }
        true
    }

    /// Whether value `v` (not a reduction) has a lane-wise F32X4/mask form; loads are checked
    /// for dtype only (their stride is the caller's business).
    pub fn vector_value_ok(&self, v: ValId) -> bool {
        let k = self.k;
        let vtype = |v: ValId| matches!(k.values[v].dtype, DType::F32 | DType::Bool);
        let val = &k.values[v];
        if !vtype(v) || !val.expr.operands().iter().all(|&o| vtype(o)) {
            return false;
        }
        let f32_ops = val
            .expr
            .operands()
            .first()
            .is_none_or(|&o| k.values[o].dtype == DType::F32);
        match &val.expr {
            Expr::Load { .. } => matches!(val.dtype, DType::F32 | DType::Bool),
            Expr::Const(_) => true,
            Expr::Index { .. } | Expr::Cast(_) | Expr::Reduce { .. } => false,
            Expr::Unary(u, _) => match u {
                UnaryOp::LogicalNot | UnaryOp::BitwiseNot => true,
                // the f64 reference formula, one lane at a time
                UnaryOp::Asin | UnaryOp::Acos | UnaryOp::Atan => false,
                _ => f32_ops,
            },
            Expr::Binary(b, x, _) => {
                // fmod and rounded quotients run in the scalar code
                let scalar_only = matches!(
                    b,
                    BinaryOp::Remainder | BinaryOp::DivFloor | BinaryOp::DivTrunc
                );
                if k.values[*x].dtype == DType::F32 {
                    !scalar_only
                } else {
                    !matches!(b, BinaryOp::Pow | BinaryOp::Sub | BinaryOp::Div) && !scalar_only
                }
            }
            Expr::Clamp { .. } => val.dtype == DType::F32,
            Expr::Where(..) | Expr::MaskedFill { .. } => true,
        }
    }

    /// Whether reduction `r` has vector accumulators: a sum, mean, max or min of f32.
    pub fn vector_reduce_ok(&self, r: ValId) -> bool {
        let Expr::Reduce { combiner, arg, .. } = self.k.values[r].expr else {
            return false;
        };
        matches!(
            combiner,
            Combiner::Sum | Combiner::Mean | Combiner::Max | Combiner::Min
        ) && self.k.values[arg].dtype == DType::F32
    }

    /// Runs the vector part of an innermost loop: elements `[i, len & !7)`; leaves `i` at
    /// the first element of the scalar tail and merges vector accumulators.
    pub fn vector_loop(
        &mut self,
        i: Variable,
        len: Value,
        body: &Body,
        env: &mut [Option<Value>],
    ) -> Result<()> {
        let step = LANES * GROUPS;
        let nv = self.fb.b.ins().band_imm_s(len, -step);
        // loop-invariant operands from outside the body, splatted once
        let mut pinned = Vec::new();
        for o in self.outside_operands(body) {
            let x = env[o].ok_or_else(|| {
                crate::Error::Unsupported("cpu codegen: an operand is not computed".into())
            })?;
            let v = self.splat_value(x, self.k.values[o].dtype);
            pinned.push((o, self.pin(v)));
        }
        // one accumulator per group, so that the groups' dependency chains run side by side
        let mut vaccs = Vec::new();
        for &r in &body.reds {
            let Expr::Reduce { combiner, .. } = self.k.values[r].expr else {
                continue;
            };
            let accs: Vec<VAcc> = (0..GROUPS).map(|_| self.vacc(combiner)).collect();
            vaccs.push((r, combiner, accs));
        }
        let walks = self.walk_pointers(i, body, step);
        self.while_lt_vec(i, nv, step, &mut |g, iv| {
            for &(a, var, _) in &walks {
                let p = g.fb.b.use_var(var);
                g.walked.insert(a, (iv, p));
            }
            let invariant = g.unpin_all(&pinned, g.k.values.len());
            for grp in 0..GROUPS {
                let lane = grp * LANES;
                let mut venv = invariant.clone();
                for &v in &body.vals {
                    let x = g.body_value(body, v, F32X4, iv, lane, &mut |g| {
                        g.vector_value(v, &venv, iv, lane)
                    })?;
                    venv[v] = Some(x);
                }
                for (r, comb, accs) in &vaccs {
                    let Expr::Reduce { arg, .. } = g.k.values[*r].expr else {
                        continue;
                    };
                    let x = venv[arg].unwrap_or_else(|| unreachable!("argument computed"));
                    g.vfold(*comb, &accs[grp as usize], x);
                }
                for &s in &body.stores {
                    let x = venv[g.k.stores[s].value].unwrap_or_else(|| unreachable!());
                    let a = g.access_of_store[s];
                    let (p, off) = g.addr(a, iv, lane);
                    g.fb.b.ins().store(flags(), x, p, off);
                }
            }
            for &(_, var, bytes) in &walks {
                let p = g.fb.b.use_var(var);
                let p = g.fb.b.ins().iadd_imm_s(p, bytes);
                g.fb.b.def_var(var, p);
            }
            Ok(())
        })?;
        self.walked.clear();
        for (r, comb, accs) in &vaccs {
            for acc in accs {
                self.vmerge(*r, *comb, acc);
            }
        }
        Ok(())
    }

    /// Strength reduction: a pointer variable for each access the vector loop over `body`
    /// loads or stores with a stride, set at the loop's first element, with the bytes it
    /// advances per iteration of `step` elements. Cranelift recomputes a row's base (a
    /// shift and two adds) at every use inside the loop; the variable costs one add.
    fn walk_pointers(
        &mut self,
        i: Variable,
        body: &Body,
        step: i64,
    ) -> Vec<(usize, Variable, i64)> {
        let mut accs: Vec<usize> = body
            .vals
            .iter()
            .filter(|&&v| {
                matches!(self.k.values[v].expr, Expr::Load { .. })
                    && !body.cache_in.contains(&v)
                    && !body.strip_in.contains(&v)
            })
            .filter_map(|v| self.access_of_val.get(v).copied())
            .chain(body.stores.iter().map(|&s| self.access_of_store[s]))
            .filter(|&a| self.cur_stride[a] != 0 && self.cur_ptr[a].is_some())
            .collect();
        accs.sort_unstable();
        accs.dedup();
        let start = self.fb.b.use_var(i);
        accs.into_iter()
            .map(|a| {
                let (p, _) = self.addr(a, start, 0);
                let t = self.fb.b.func.dfg.value_type(p);
                let var = self.fb.b.declare_var(t);
                self.fb.b.def_var(var, p);
                (a, var, step * self.cur_stride[a] * self.elem_bytes(a))
            })
            .collect()
    }

    /// A fresh vector accumulator for `combiner` (sum, mean, max or min of f32).
    pub(super) fn vacc(&mut self, combiner: Combiner) -> VAcc {
        match combiner {
            Combiner::Sum | Combiner::Mean if self.opts.f32_lane_sums => {
                let v = self.fb.b.declare_var(F32X4);
                let z = vf(self, 0.0);
                self.fb.b.def_var(v, z);
                VAcc::SumF32(v)
            }
            Combiner::Sum | Combiner::Mean => {
                let z = self.fb.b.ins().f64const(0.0);
                let z = self.fb.b.ins().splat(F64X2, z);
                let lo = self.fb.b.declare_var(F64X2);
                let hi = self.fb.b.declare_var(F64X2);
                self.fb.b.def_var(lo, z);
                self.fb.b.def_var(hi, z);
                VAcc::SumF64(lo, hi)
            }
            _ => {
                let init = if combiner == Combiner::Max {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
                let v = self.fb.b.declare_var(F32X4);
                let c = vf(self, init);
                self.fb.b.def_var(v, c);
                let nan = self.fb.b.declare_var(I32X4);
                let none = vmask_const(self, false);
                self.fb.b.def_var(nan, none);
                VAcc::Extreme(v, nan)
            }
        }
    }

    /// `while var < end { body; var += step }` for the vector loop.
    fn while_lt_vec(
        &mut self,
        var: Variable,
        end: Value,
        step: i64,
        body: &mut dyn FnMut(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        use cranelift_codegen::ir::condcodes::IntCC;
        let header = self.fb.b.create_block();
        let bodyb = self.fb.b.create_block();
        let exit = self.fb.b.create_block();
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(header);
        let cur = self.fb.b.use_var(var);
        let c = self.fb.b.ins().icmp(IntCC::SignedLessThan, cur, end);
        self.fb.b.ins().brif(c, bodyb, &[], exit, &[]);
        self.fb.b.switch_to_block(bodyb);
        body(self, cur)?;
        let next = self.fb.b.ins().iadd_imm_s(cur, step);
        self.fb.b.def_var(var, next);
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(exit);
        Ok(())
    }

    /// The values `body` reads that it does not compute itself, sorted.
    pub(super) fn outside_operands(&self, body: &Body) -> Vec<ValId> {
        let inside: HashSet<ValId> = body.vals.iter().copied().collect();
        let mut outside: Vec<ValId> = body
            .vals
            .iter()
            .filter(|v| !body.cache_in.contains(v) && !body.strip_in.contains(v))
            .flat_map(|&v| self.k.values[v].expr.operands())
            .chain(
                body.reds
                    .iter()
                    .filter_map(|&r| match self.k.values[r].expr {
                        Expr::Reduce { arg, .. } => Some(arg),
                        _ => None,
                    }),
            )
            .chain(body.stores.iter().map(|&s| self.k.stores[s].value))
            .filter(|o| !inside.contains(o))
            .collect();
        outside.sort_unstable();
        outside.dedup();
        outside
    }

    /// Keeps a loop-invariant vector in a stack slot, to be read inside the loop with
    /// [`Self::unpin_all`]. Cranelift places pure values at their uses and, for values
    /// computed after a reduction loop, does not hoist them out of the next loop: a mean or an
    /// rsqrt would be recomputed (divisions, a square root) on every iteration. The store
    /// pins the computation before the loop; the loop pays one L1 load instead.
    pub(super) fn pin(&mut self, v: Value) -> (StackSlot, Type) {
        let t = self.fb.b.func.dfg.value_type(v);
        let slot = self.fb.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            t.bytes(),
            4,
        ));
        self.fb.b.ins().stack_store(self.ptr, v, slot, 0);
        (slot, t)
    }

    /// An environment holding the pinned values, loaded from their slots.
    pub(super) fn unpin_all(
        &mut self,
        pinned: &[(ValId, (StackSlot, Type))],
        n: usize,
    ) -> Vec<Option<Value>> {
        let mut env = vec![None; n];
        for &(o, (slot, t)) in pinned {
            env[o] = Some(self.fb.b.ins().stack_load(self.ptr, t, slot, 0));
        }
        env
    }

    /// A scalar (f32 or i8 bool) broadcast to all lanes.
    fn splat_value(&mut self, x: Value, d: DType) -> Value {
        if d == DType::F32 {
            self.fb.b.ins().splat(F32X4, x)
        } else {
            let on = self.iconst(I32, -1);
            let off = self.iconst(I32, 0);
            let m = self.fb.b.ins().select(x, on, off);
            self.fb.b.ins().splat(I32X4, m)
        }
    }

    pub(super) fn vector_value(
        &mut self,
        v: ValId,
        env: &[Option<Value>],
        i: Value,
        lane: i64,
    ) -> Result<Value> {
        let k = self.k;
        let val = &k.values[v];
        let op = |o: ValId| -> Result<Value> {
            env[o].ok_or_else(|| {
                crate::Error::Unsupported(format!("cpu codegen: v{v} reads v{o} too early"))
            })
        };
        Ok(match &val.expr {
            Expr::Load { .. } if val.dtype == DType::Bool => {
                let a = self.access_of_val[&v];
                let (p, off) = self.addr(a, i, lane);
                self.vmask_load(p, off, self.lane_step(a) == 0)
            }
            Expr::Load { .. } => {
                let a = self.access_of_val[&v];
                let (p, off) = self.addr(a, i, lane);
                if self.lane_step(a) == 0 {
                    let s = self.fb.b.ins().load(F32, flags(), p, off);
                    self.fb.b.ins().splat(F32X4, s)
                } else {
                    self.fb.b.ins().load(F32X4, flags(), p, off)
                }
            }
            Expr::Const(s) => {
                if val.dtype == DType::F32 {
                    let c = round_to_dtype(s.to_f64(), DType::F32);
                    vf(self, c)
                } else {
                    vmask_const(self, s.to_f64() != 0.0)
                }
            }
            Expr::Unary(u, a) => {
                let x = op(*a)?;
                self.vunary(*u, x, k.values[*a].dtype)
            }
            Expr::Binary(b, x, y) => {
                let (xv, yv) = (op(*x)?, op(*y)?);
                self.vbinary(*b, xv, yv, k.values[*x].dtype)
            }
            Expr::Where(c, a, b) => {
                let (c, a, b) = (op(*c)?, op(*a)?, op(*b)?);
                vsel(self, c, a, b)
            }
            Expr::MaskedFill { x, mask, value } => {
                let (xv, m) = (op(*x)?, op(*mask)?);
                let c = if val.dtype == DType::F32 {
                    let c = round_to_dtype(value.to_f64(), DType::F32);
                    vf(self, c)
                } else {
                    vmask_const(self, value.to_f64() != 0.0)
                };
                vsel(self, m, c, xv)
            }
            Expr::Clamp { x, min, max } => {
                let mut xv = op(*x)?;
                let lo = min.map(|s| round_to_dtype(s.to_f64(), DType::F32));
                let hi = max.map(|s| round_to_dtype(s.to_f64(), DType::F32));
                if let (Some(l), Some(h)) = (lo, hi)
                    && (l.is_nan() || h.is_nan())
                {
                    return Ok(vf(self, f64::NAN));
                }
                if let Some(l) = lo {
                    let c = vf(self, l);
                    let m = self.fb.b.ins().fcmp(FloatCC::LessThan, xv, c);
                    xv = vsel(self, m, c, xv);
                }
                if let Some(h) = hi {
                    let c = vf(self, h);
                    let m = self.fb.b.ins().fcmp(FloatCC::LessThan, c, xv);
                    xv = vsel(self, m, c, xv);
                }
                xv
            }
            Expr::Index { .. } | Expr::Cast(_) | Expr::Reduce { .. } => {
                return Err(crate::Error::Unsupported(
                    "cpu codegen: not vectorisable".into(),
                ));
            }
        })
    }

    fn vunary(&mut self, u: UnaryOp, x: Value, da: DType) -> Value {
        use UnaryOp::*;
        if da == DType::Bool {
            // only logical_not and bitwise_not reach here with a mask
            return self.fb.b.ins().bnot(x);
        }
        let b = &mut *self.fb.b;
        match u {
            LogicalNot => {
                let z = vf(self, 0.0);
                self.fb.b.ins().fcmp(FloatCC::Equal, x, z)
            }
            IsNan => b.ins().fcmp(FloatCC::Unordered, x, x),
            Neg => b.ins().fneg(x),
            Abs => b.ins().fabs(x),
            Sqrt => math::sqrt(b, x),
            Rsqrt => math::rsqrt(b, x),
            Floor => b.ins().floor(x),
            Ceil => b.ins().ceil(x),
            Round => b.ins().nearest(x),
            Square => b.ins().fmul(x, x),
            Reciprocal => {
                let one = vf(self, 1.0);
                self.fb.b.ins().fdiv(one, x)
            }
            Relu => {
                let z = vf(self, 0.0);
                let m = self.fb.b.ins().fcmp(FloatCC::LessThan, x, z);
                vsel(self, m, z, x)
            }
            Sign => {
                let z = vf(self, 0.0);
                let one = vf(self, 1.0);
                let mone = vf(self, -1.0);
                let gt = self.fb.b.ins().fcmp(FloatCC::GreaterThan, x, z);
                let lt = self.fb.b.ins().fcmp(FloatCC::LessThan, x, z);
                let r = vsel(self, lt, mone, z);
                vsel(self, gt, one, r)
            }
            Exp => math::exp(b, x),
            Log => math::log(b, x),
            Log1p => math::log1p(b, x),
            Expm1 => math::expm1(b, x),
            Sin => math::sin(b, x),
            Cos => math::cos(b, x),
            // refused by `vectorizable`; `bitwise_not` only sees masks, above
            Asin | Acos | Atan | BitwiseNot => x,
            Tanh => math::tanh(b, x),
            Sigmoid => math::sigmoid(b, x),
            Erf => math::erf(b, x),
            Gelu { tanh: false } => math::gelu(b, x),
            Gelu { tanh: true } => math::gelu_tanh(b, x),
            GeluSlope { tanh: false } => math::gelu_slope(b, x),
            GeluSlope { tanh: true } => math::gelu_tanh_slope(b, x),
            Silu => {
                let s = math::sigmoid(b, x);
                b.ins().fmul(x, s)
            }
            LeakyRelu { .. }
            | Elu { .. }
            | Softplus { .. }
            | Hardtanh { .. }
            | Hardswish
            | Mish
            | LogSigmoid => u.composite(&mut math::ClifMath { b, ty: F32X4 }, x),
        }
    }

    fn vbinary(&mut self, op: BinaryOp, x: Value, y: Value, c: DType) -> Value {
        use BinaryOp::*;
        if c == DType::Bool {
            return match op {
                Add | Maximum | LogicalOr | BitwiseOr => self.fb.b.ins().bor(x, y),
                Mul | Minimum | LogicalAnd | BitwiseAnd => self.fb.b.ins().band(x, y),
                BitwiseXor => self.fb.b.ins().bxor(x, y),
                Eq => {
                    let d = self.fb.b.ins().bxor(x, y);
                    self.fb.b.ins().bnot(d)
                }
                Ne => self.fb.b.ins().bxor(x, y),
                Lt => self.fb.b.ins().band_not(y, x),
                Gt => self.fb.b.ins().band_not(x, y),
                Le => {
                    let nx = self.fb.b.ins().bnot(x);
                    self.fb.b.ins().bor(nx, y)
                }
                _ => {
                    let ny = self.fb.b.ins().bnot(y);
                    self.fb.b.ins().bor(x, ny)
                }
            };
        }
        let b = &mut *self.fb.b;
        match op {
            Add => b.ins().fadd(x, y),
            Sub => b.ins().fsub(x, y),
            Mul => b.ins().fmul(x, y),
            Div => b.ins().fdiv(x, y),
            Pow => math::pow(b, x, y),
            Maximum | Minimum => {
                let pick_y = if op == Maximum {
                    b.ins().fcmp(FloatCC::LessThan, x, y)
                } else {
                    b.ins().fcmp(FloatCC::LessThan, y, x)
                };
                let nan = b.ins().fcmp(FloatCC::Unordered, x, y);
                let sum = b.ins().fadd(x, y);
                let r = vsel(self, pick_y, y, x);
                vsel(self, nan, sum, r)
            }
            Eq => b.ins().fcmp(FloatCC::Equal, x, y),
            Ne => b.ins().fcmp(FloatCC::NotEqual, x, y),
            Lt => b.ins().fcmp(FloatCC::LessThan, x, y),
            Le => b.ins().fcmp(FloatCC::LessThanOrEqual, x, y),
            Gt => b.ins().fcmp(FloatCC::GreaterThan, x, y),
            Ge => b.ins().fcmp(FloatCC::GreaterThanOrEqual, x, y),
            LogicalAnd | LogicalOr => {
                let z = vf(self, 0.0);
                let a = self.fb.b.ins().fcmp(FloatCC::NotEqual, x, z);
                let bb = self.fb.b.ins().fcmp(FloatCC::NotEqual, y, z);
                if op == LogicalAnd {
                    self.fb.b.ins().band(a, bb)
                } else {
                    self.fb.b.ins().bor(a, bb)
                }
            }
            // refused by `vectorizable`, or by the op for floats
            Remainder | DivFloor | DivTrunc | BitwiseAnd | BitwiseOr | BitwiseXor => x,
        }
    }

    pub(super) fn vfold(&mut self, comb: Combiner, acc: &VAcc, x: Value) {
        match *acc {
            VAcc::SumF32(v) => {
                let a = self.fb.b.use_var(v);
                let n = self.fb.b.ins().fadd(a, x);
                self.fb.b.def_var(v, n);
            }
            VAcc::SumF64(lo, hi) => {
                let xl = self.fb.b.ins().fvpromote_low(x);
                let h = high_half(self, x);
                let xh = self.fb.b.ins().fvpromote_low(h);
                let a = self.fb.b.use_var(lo);
                let n = self.fb.b.ins().fadd(a, xl);
                self.fb.b.def_var(lo, n);
                let a = self.fb.b.use_var(hi);
                let n = self.fb.b.ins().fadd(a, xh);
                self.fb.b.def_var(hi, n);
            }
            VAcc::Extreme(v, nan) => {
                let a = self.fb.b.use_var(v);
                // `a < x ? x : a` (max) is one maxps; `x < a ? x : a` (min) one minps
                let better = if comb == Combiner::Max {
                    self.fb.b.ins().fcmp(FloatCC::LessThan, a, x)
                } else {
                    self.fb.b.ins().fcmp(FloatCC::LessThan, x, a)
                };
                let n = vsel(self, better, x, a);
                self.fb.b.def_var(v, n);
                let seen = self.fb.b.use_var(nan);
                let is_nan = self.fb.b.ins().fcmp(FloatCC::Unordered, x, x);
                let seen = self.fb.b.ins().bor(seen, is_nan);
                self.fb.b.def_var(nan, seen);
            }
        }
    }

    /// The result of a vector accumulator lane by lane (rows as lanes: lane `l` is one output),
    /// rounded as the scalar accumulator's result is.
    pub(super) fn vfinish(&mut self, comb: Combiner, acc: &VAcc) -> Value {
        let n = crate::ir::shape::numel(&self.k.inner) as f64;
        match *acc {
            VAcc::SumF64(lo, hi) => {
                let halves = [lo, hi].map(|h| {
                    let mut x = self.fb.b.use_var(h);
                    if comb == Combiner::Mean {
                        let c = self.fb.b.ins().f64const(n);
                        let c = self.fb.b.ins().splat(F64X2, c);
                        x = self.fb.b.ins().fdiv(x, c);
                    }
                    let x = self.fb.b.ins().fvdemote(x);
                    vbitcast(self, I8X16, x)
                });
                // lanes 0, 1 of the low half, then lanes 0, 1 of the high half
                let mask: Vec<u8> = (0..8).chain(16..24).collect();
                let imm = self.fb.b.func.dfg.immediates.push(ConstantData::from(mask));
                let r = self.fb.b.ins().shuffle(halves[0], halves[1], imm);
                vbitcast(self, F32X4, r)
            }
            VAcc::SumF32(v) => {
                let x = self.fb.b.use_var(v);
                if comb == Combiner::Mean {
                    let c = vf(self, n);
                    self.fb.b.ins().fdiv(x, c)
                } else {
                    x
                }
            }
            VAcc::Extreme(v, nan) => {
                let x = self.fb.b.use_var(v);
                let seen = self.fb.b.use_var(nan);
                let qnan = vf(self, f64::NAN);
                vsel(self, seen, qnan, x)
            }
        }
    }

    /// Folds the lanes of a vector accumulator into the scalar one, lane by lane in order.
    fn vmerge(&mut self, r: ValId, comb: Combiner, acc: &VAcc) {
        let scalar = self.accs[&r].val;
        match *acc {
            VAcc::SumF64(lo, hi) => {
                let mut s = self.fb.b.use_var(scalar);
                for v in [lo, hi] {
                    let x = self.fb.b.use_var(v);
                    for l in 0..2u8 {
                        let e = self.fb.b.ins().extractlane(x, l);
                        s = self.fb.b.ins().fadd(s, e);
                    }
                }
                self.fb.b.def_var(scalar, s);
            }
            VAcc::SumF32(v) => {
                let mut s = self.fb.b.use_var(scalar);
                let x = self.fb.b.use_var(v);
                for l in 0..4u8 {
                    let e = self.fb.b.ins().extractlane(x, l);
                    let e = self.fb.b.ins().fpromote(F64, e);
                    s = self.fb.b.ins().fadd(s, e);
                }
                self.fb.b.def_var(scalar, s);
            }
            VAcc::Extreme(v, nan) => {
                let _ = comb;
                let x = self.fb.b.use_var(v);
                let seen = self.fb.b.use_var(nan);
                let qnan = vf(self, f64::NAN);
                let x = vsel(self, seen, qnan, x);
                for l in 0..4u8 {
                    let e = self.fb.b.ins().extractlane(x, l);
                    self.fold(r, e);
                }
            }
        }
    }
}

/// Lanes 2 and 3 of an F32X4 moved to lanes 0 and 1.
fn high_half(g: &mut Gen, x: Value) -> Value {
    let bytes = vbitcast(g, I8X16, x);
    let mask: Vec<u8> = (8..16).chain(8..16).collect();
    let imm = g.fb.b.func.dfg.immediates.push(ConstantData::from(mask));
    let r = g.fb.b.ins().shuffle(bytes, bytes, imm);
    vbitcast(g, F32X4, r)
}
