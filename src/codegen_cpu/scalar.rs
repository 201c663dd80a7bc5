//! Scalar lowering of kernel values, casts, loads, stores and reduction accumulators.
//!
//! Semantics are the eager kernels' (src/runtime/kernels): floats compute as if in f64 and
//! round once to the result dtype, integers wrap, casts follow C/PyTorch.
//! - f32: add/sub/mul/div/sqrt and the other exactly rounded ops run natively (identical to
//!   f64-then-round); transcendentals use the polynomials of [`super::math`] (≤ 4.5 ulp);
//!   `remainder` runs in f64 (`fmod` helper).
//! - f64: native where exact; exp, log, log1p, expm1, sin, cos, tanh, sigmoid, silu, erf, gelu,
//!   pow and fmod call the host helpers of [`super::helpers`] (Rust std / libm, the very
//!   functions the eager kernels call), so results are bit-identical.
//! - f16/bf16: held exactly in f32; every op computes in f64 as above and rounds once from f64
//!   (helper), which reproduces the eager result bit for bit.

use super::generator::{Acc, Gen};
use super::lower::{ERR_ZERO_DIV, cty, flags};
use super::math;
use crate::Result;
use crate::dispatch;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, UnaryOp};
use crate::kernel::{Combiner, Expr, ValId};
use crate::runtime::element::{Element, round_to_dtype};
use crate::runtime::kernels::creation::scalar_to;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I8, I16, I32, I64};
use cranelift_codegen::ir::{InstBuilder, Value};

/// Signed integer dtypes (u8 and bool compare and extend unsigned).
pub(super) fn signed(d: DType) -> bool {
    !matches!(d, DType::U8 | DType::Bool)
}

impl Gen<'_, '_, '_> {
    pub fn fconst(&mut self, t: cranelift_codegen::ir::Type, v: f64) -> Value {
        if t == F64 {
            self.fb.b.ins().f64const(v)
        } else {
            self.fb.b.ins().f32const(v as f32)
        }
    }

    /// A constant of dtype `d` converted from `s` with cast semantics.
    pub fn const_of(&mut self, s: Scalar, d: DType) -> Value {
        if d.is_float() {
            let v = dispatch!(d, T => scalar_to::<T>(s).to_f64());
            self.fconst(cty(d), v)
        } else {
            let v = dispatch!(d, T => scalar_to::<T>(s).to_i64());
            self.iconst(cty(d), v)
        }
    }

    /// `v` (dtype `d`, integer or bool) as an i64, sign- or zero-extended.
    pub fn widen_int(&mut self, v: Value, d: DType) -> Value {
        if cty(d) == I64 {
            v
        } else if signed(d) {
            self.fb.b.ins().sextend(I64, v)
        } else {
            self.fb.b.ins().uextend(I64, v)
        }
    }

    /// A float value of dtype `d` as f64 (exact).
    pub fn widen_float(&mut self, v: Value, d: DType) -> Value {
        if d == DType::F64 {
            v
        } else {
            self.fb.b.ins().fpromote(F64, v)
        }
    }

    /// An f64 rounded once to float dtype `d` (held in its Cranelift type).
    pub fn narrow_f64(&mut self, v: Value, d: DType) -> Value {
        match d {
            DType::F64 => v,
            DType::F16 => self.call("smelt_f64_to_f16", &[v]),
            DType::BF16 => self.call("smelt_f64_to_bf16", &[v]),
            _ => self.fb.b.ins().fdemote(F32, v),
        }
    }

    /// `v != 0` as an i8 bool (NaN is nonzero).
    pub fn nonzero(&mut self, v: Value, d: DType) -> Value {
        if d.is_float() {
            let z = self.fconst(cty(d), 0.0);
            self.fb.b.ins().fcmp(FloatCC::NotEqual, v, z)
        } else {
            self.fb.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0)
        }
    }

    /// Conversion with PyTorch's cast semantics (the eager `convert`).
    pub fn cast(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        if to == DType::Bool {
            return self.nonzero(v, from);
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                let w = self.widen_float(v, from);
                self.narrow_f64(w, to)
            }
            (false, true) => {
                let w = self.widen_int(v, from);
                let f = self.fb.b.ins().fcvt_from_sint(F64, w);
                self.narrow_f64(f, to)
            }
            (true, false) => {
                let w = self.widen_float(v, from);
                let i = self.fb.b.ins().fcvt_to_sint_sat(I64, w);
                self.reduce_int(i, to)
            }
            (false, false) => {
                let w = self.widen_int(v, from);
                self.reduce_int(w, to)
            }
        }
    }

    /// An i64 truncated (wrapping) to integer dtype `d`.
    fn reduce_int(&mut self, v: Value, d: DType) -> Value {
        let t = cty(d);
        if t == I64 {
            v
        } else {
            self.fb.b.ins().ireduce(t, v)
        }
    }

    /// Loads access `a` (a buffer of dtype `d`) at element `i + lane`.
    pub fn load_scalar(&mut self, a: usize, d: DType, i: Value, lane: i64) -> Value {
        let (p, off) = self.addr(a, i, lane);
        match d {
            DType::F16 => {
                let h = self.fb.b.ins().load(I16, flags(), p, off);
                let w = self.fb.b.ins().uextend(I32, h);
                self.call("smelt_f16_bits_to_f32", &[w])
            }
            DType::BF16 => {
                let h = self.fb.b.ins().load(I16, flags(), p, off);
                let w = self.fb.b.ins().uextend(I32, h);
                let w = self.fb.b.ins().ishl_imm_u(w, 16);
                self.fb
                    .b
                    .ins()
                    .bitcast(F32, cranelift_codegen::ir::MemFlagsData::new(), w)
            }
            _ => self.fb.b.ins().load(cty(d), flags(), p, off),
        }
    }

    /// Stores `v` through store `s` at element `i + lane`.
    pub fn store_scalar(&mut self, s: usize, v: Value, i: Value, lane: i64) {
        let a = self.access_of_store[s];
        let d = self.bufs[self.k.stores[s].buffer].dtype;
        let (p, off) = self.addr(a, i, lane);
        let x = match d {
            DType::F16 => {
                let bits = self.call("smelt_f32_to_f16_bits", &[v]);
                self.fb.b.ins().ireduce(I16, bits)
            }
            DType::BF16 => {
                let bits =
                    self.fb
                        .b
                        .ins()
                        .bitcast(I32, cranelift_codegen::ir::MemFlagsData::new(), v);
                let bits = self.fb.b.ins().ushr_imm_u(bits, 16);
                self.fb.b.ins().ireduce(I16, bits)
            }
            _ => v,
        };
        self.fb.b.ins().store(flags(), x, p, off);
    }

    /// Value `v` at element `i + lane` of the innermost loop; operands come from `env`.
    pub fn scalar_value(
        &mut self,
        v: ValId,
        env: &[Option<Value>],
        i: Value,
        lane: i64,
    ) -> Result<Value> {
        let k = self.k;
        let val = &k.values[v];
        let d = val.dtype;
        let op = |o: ValId| -> Result<Value> {
            env[o].ok_or_else(|| {
                crate::Error::Unsupported(format!(
                    "cpu codegen: kernel {}: v{v} reads v{o} before it is computed",
                    k.name
                ))
            })
        };
        Ok(match &val.expr {
            Expr::Load { .. } => {
                let a = self.access_of_val[&v];
                self.load_scalar(a, d, i, lane)
            }
            Expr::Index { .. } => {
                let a = self.access_of_val[&v];
                self.elem_offset(a, i, lane)
            }
            Expr::Const(s) => self.const_of(*s, d),
            Expr::Cast(a) => {
                let x = op(*a)?;
                self.cast(x, k.values[*a].dtype, d)
            }
            Expr::Unary(u, a) => {
                let x = op(*a)?;
                self.unary(*u, x, k.values[*a].dtype, d)
            }
            Expr::Binary(b, x, y) => {
                let (xv, yv) = (op(*x)?, op(*y)?);
                self.binary(*b, xv, yv, k.values[*x].dtype)
            }
            Expr::Where(c, a, b) => {
                let (c, a, b) = (op(*c)?, op(*a)?, op(*b)?);
                self.fb.b.ins().select(c, a, b)
            }
            Expr::MaskedFill { x, mask, value } => {
                let (xv, m) = (op(*x)?, op(*mask)?);
                let c = self.const_of(*value, d);
                self.fb.b.ins().select(m, c, xv)
            }
            Expr::Clamp { x, min, max } => {
                let xv = op(*x)?;
                self.clamp(xv, *min, *max, d)
            }
            Expr::Reduce { .. } => op(v)?,
        })
    }

    fn clamp(&mut self, x: Value, min: Option<Scalar>, max: Option<Scalar>, d: DType) -> Value {
        let t = cty(d);
        if d.is_float() {
            let lo = min.map(|s| round_to_dtype(s.to_f64(), d));
            let hi = max.map(|s| round_to_dtype(s.to_f64(), d));
            if let (Some(l), Some(h)) = (lo, hi)
                && (l.is_nan() || h.is_nan())
            {
                return self.fconst(t, f64::NAN);
            }
            let mut v = x;
            if let Some(l) = lo {
                let c = self.fconst(t, l);
                let m = self.fb.b.ins().fcmp(FloatCC::LessThan, v, c);
                v = self.fb.b.ins().select(m, c, v);
            }
            if let Some(h) = hi {
                let c = self.fconst(t, h);
                let m = self.fb.b.ins().fcmp(FloatCC::LessThan, c, v);
                v = self.fb.b.ins().select(m, c, v);
            }
            v
        } else {
            let mut v = x;
            if let Some(l) = min {
                let c = self.const_of(l, d);
                v = if signed(d) {
                    self.fb.b.ins().smax(v, c)
                } else {
                    self.fb.b.ins().umax(v, c)
                };
            }
            if let Some(h) = max {
                let c = self.const_of(h, d);
                v = if signed(d) {
                    self.fb.b.ins().smin(v, c)
                } else {
                    self.fb.b.ins().umin(v, c)
                };
            }
            v
        }
    }

    fn unary(&mut self, u: UnaryOp, x: Value, da: DType, d: DType) -> Value {
        use UnaryOp::*;
        match u {
            LogicalNot => {
                let nz = self.nonzero(x, da);
                return self.fb.b.ins().bxor_imm_s(nz, 1);
            }
            // `~` of a bool is its logical not (the bits of `true` are 1)
            BitwiseNot if da == DType::Bool => return self.fb.b.ins().bxor_imm_s(x, 1),
            IsNan => {
                return if da.is_float() {
                    self.fb.b.ins().fcmp(FloatCC::Unordered, x, x)
                } else {
                    self.iconst(I8, 0)
                };
            }
            _ => {}
        }
        let x = self.cast(x, da, d);
        if d.is_float() {
            if d == DType::F32 {
                self.unary_f32(u, x)
            } else {
                let w = self.widen_float(x, d);
                let r = self.unary_f64(u, w);
                self.narrow_f64(r, d)
            }
        } else {
            self.unary_int(u, x, d)
        }
    }

    /// A float unary op shared by f32 and f64 when exactly rounded; None otherwise.
    fn unary_exact(&mut self, u: UnaryOp, x: Value) -> Option<Value> {
        use UnaryOp::*;
        let t = self.fb.b.func.dfg.value_type(x);
        Some(match u {
            Neg => self.fb.b.ins().fneg(x),
            Abs => self.fb.b.ins().fabs(x),
            Sqrt => self.fb.b.ins().sqrt(x),
            Rsqrt => {
                let s = self.fb.b.ins().sqrt(x);
                let one = self.fconst(t, 1.0);
                self.fb.b.ins().fdiv(one, s)
            }
            Relu => {
                let z = self.fconst(t, 0.0);
                let m = self.fb.b.ins().fcmp(FloatCC::LessThan, x, z);
                self.fb.b.ins().select(m, z, x)
            }
            Floor => self.fb.b.ins().floor(x),
            Ceil => self.fb.b.ins().ceil(x),
            Round => self.fb.b.ins().nearest(x),
            Sign => {
                let z = self.fconst(t, 0.0);
                let one = self.fconst(t, 1.0);
                let mone = self.fconst(t, -1.0);
                let gt = self.fb.b.ins().fcmp(FloatCC::GreaterThan, x, z);
                let lt = self.fb.b.ins().fcmp(FloatCC::LessThan, x, z);
                let r = self.fb.b.ins().select(lt, mone, z);
                self.fb.b.ins().select(gt, one, r)
            }
            Reciprocal => {
                let one = self.fconst(t, 1.0);
                self.fb.b.ins().fdiv(one, x)
            }
            Square => self.fb.b.ins().fmul(x, x),
            Exp
            | Log
            | Log1p
            | Expm1
            | Sin
            | Cos
            | Asin
            | Acos
            | Atan
            | Tanh
            | Sigmoid
            | Gelu { .. }
            | GeluSlope { .. }
            | Silu
            | Erf
            | LogicalNot
            | IsNan
            | BitwiseNot
            | LeakyRelu { .. }
            | Elu { .. }
            | Softplus { .. }
            | Hardtanh { .. }
            | Hardswish
            | Mish
            | LogSigmoid => return None,
        })
    }

    fn unary_f32(&mut self, u: UnaryOp, x: Value) -> Value {
        use UnaryOp::*;
        if let Some(r) = self.unary_exact(u, x) {
            return r;
        }
        let b = &mut *self.fb.b;
        match u {
            Exp => math::exp(b, x),
            Log => math::log(b, x),
            Log1p => math::log1p(b, x),
            Expm1 => math::expm1(b, x),
            Sin => math::sin(b, x),
            Cos => math::cos(b, x),
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
            | LogSigmoid => u.composite(&mut math::ClifMath { b, ty: F32 }, x),
            // rare enough to take the f64 reference formula, rounded once
            Asin | Acos | Atan => {
                let w = self.widen_float(x, DType::F32);
                let r = self.unary_f64(u, w);
                self.narrow_f64(r, DType::F32)
            }
            // handled by `unary_exact`, or bool-valued (handled by `unary`)
            Neg | Abs | Sqrt | Rsqrt | Relu | Floor | Ceil | Round | Sign | Reciprocal | Square
            | LogicalNot | IsNan | BitwiseNot => {
                unreachable!("{} is not an f32 formula", u.name())
            }
        }
    }

    /// f64 ops that are not exactly rounded call the op's reference formula
    /// ([`UnaryOp::f64_helper`]), so results are the eager kernels' bit for bit.
    fn unary_f64(&mut self, u: UnaryOp, x: Value) -> Value {
        if let Some(r) = self.unary_exact(u, x) {
            return r;
        }
        let [a0, a1] = u.attr_codes();
        let a0 = self.fconst(F64, a0);
        let a1 = self.fconst(F64, a1);
        self.call(u.helper_symbol(), &[x, a0, a1])
    }

    fn unary_int(&mut self, u: UnaryOp, x: Value, d: DType) -> Value {
        use UnaryOp::*;
        let t = cty(d);
        let s = signed(d);
        match u {
            Neg => self.fb.b.ins().ineg(x),
            Abs if s => self.fb.b.ins().iabs(x),
            Relu if s => {
                let z = self.iconst(t, 0);
                self.fb.b.ins().smax(x, z)
            }
            Sign if s => {
                let gt = self.fb.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                let lt = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                let diff = self.fb.b.ins().isub(gt, lt);
                if t == I8 {
                    diff
                } else {
                    self.fb.b.ins().sextend(t, diff)
                }
            }
            Sign => {
                let nz = self.nonzero(x, d);
                if t == I8 {
                    nz
                } else {
                    self.fb.b.ins().uextend(t, nz)
                }
            }
            Square => self.fb.b.ins().imul(x, x),
            BitwiseNot => self.fb.b.ins().bnot(x),
            // floor/ceil/round of integers, abs/relu of unsigned values: unchanged
            Floor | Ceil | Round | Abs | Relu => x,
            // integer operands are converted (or refused) by the op's dtype class
            Exp
            | Log
            | Log1p
            | Expm1
            | Sqrt
            | Rsqrt
            | Sin
            | Cos
            | Asin
            | Acos
            | Atan
            | Tanh
            | Sigmoid
            | Gelu { .. }
            | GeluSlope { .. }
            | Silu
            | Erf
            | Reciprocal
            | LogicalNot
            | IsNan
            | LeakyRelu { .. }
            | Elu { .. }
            | Softplus { .. }
            | Hardtanh { .. }
            | Hardswish
            | Mish
            | LogSigmoid => {
                unreachable!("{} has no integer form", u.name())
            }
        }
    }

    /// Binary op `b` on operands of compute dtype `c`.
    fn binary(&mut self, b: BinaryOp, x: Value, y: Value, c: DType) -> Value {
        use BinaryOp::*;
        if b.is_comparison() {
            return if c.is_float() {
                let cc = match b {
                    Eq => FloatCC::Equal,
                    Ne => FloatCC::NotEqual,
                    Lt => FloatCC::LessThan,
                    Le => FloatCC::LessThanOrEqual,
                    Gt => FloatCC::GreaterThan,
                    _ => FloatCC::GreaterThanOrEqual,
                };
                self.fb.b.ins().fcmp(cc, x, y)
            } else {
                let s = signed(c);
                let cc = match (b, s) {
                    (Eq, _) => IntCC::Equal,
                    (Ne, _) => IntCC::NotEqual,
                    (Lt, true) => IntCC::SignedLessThan,
                    (Lt, false) => IntCC::UnsignedLessThan,
                    (Le, true) => IntCC::SignedLessThanOrEqual,
                    (Le, false) => IntCC::UnsignedLessThanOrEqual,
                    (Gt, true) => IntCC::SignedGreaterThan,
                    (Gt, false) => IntCC::UnsignedGreaterThan,
                    (_, true) => IntCC::SignedGreaterThanOrEqual,
                    (_, false) => IntCC::UnsignedGreaterThanOrEqual,
                };
                self.fb.b.ins().icmp(cc, x, y)
            };
        }
        if b.is_logical() {
            let (a, bb) = (self.nonzero(x, c), self.nonzero(y, c));
            return if b == LogicalAnd {
                self.fb.b.ins().band(a, bb)
            } else {
                self.fb.b.ins().bor(a, bb)
            };
        }
        if c.is_float() {
            if c == DType::F32 && b != Remainder {
                return self.binary_float(b, x, y);
            }
            // halves compute in f64: their quotients round to the same integers as in f32
            let (xw, yw) = (self.widen_float(x, c), self.widen_float(y, c));
            let r = self.binary_float(b, xw, yw);
            return self.narrow_f64(r, c);
        }
        let r = self.binary_int(b, x, y, c);
        if c == DType::Bool {
            self.nonzero(r, DType::U8)
        } else {
            r
        }
    }

    /// Float binary arithmetic in the operands' type (f32 only for exactly rounded ops and
    /// `pow`, whose f32 emitter rounds once from an f64 computation).
    fn binary_float(&mut self, b: BinaryOp, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        let t = self.fb.b.func.dfg.value_type(x);
        match b {
            Add => self.fb.b.ins().fadd(x, y),
            Sub => self.fb.b.ins().fsub(x, y),
            Mul => self.fb.b.ins().fmul(x, y),
            Div => self.fb.b.ins().fdiv(x, y),
            Pow if t == F32 => math::pow(self.fb.b, x, y),
            Pow => self.call("smelt_pow", &[x, y]),
            DivTrunc => {
                let q = self.fb.b.ins().fdiv(x, y);
                self.fb.b.ins().trunc(q)
            }
            // the reference formula, in the operands' precision
            DivFloor if t == F32 => self.call("smelt_div_floor_f32", &[x, y]),
            DivFloor => self.call("smelt_div_floor", &[x, y]),
            Maximum | Minimum => {
                // NaN if either is NaN, else C++ std::max/min
                let pick_y = if b == Maximum {
                    self.fb.b.ins().fcmp(FloatCC::LessThan, x, y)
                } else {
                    self.fb.b.ins().fcmp(FloatCC::LessThan, y, x)
                };
                let r = self.fb.b.ins().select(pick_y, y, x);
                let nan = self.fb.b.ins().fcmp(FloatCC::Unordered, x, y);
                let sum = self.fb.b.ins().fadd(x, y);
                self.fb.b.ins().select(nan, sum, r)
            }
            Remainder => {
                // Python's `%` in f64: the result takes the divisor's sign
                let r = self.call("smelt_fmod", &[x, y]);
                let z = self.fconst(t, 0.0);
                let nz_ord = self.fb.b.ins().fcmp(FloatCC::OrderedNotEqual, r, z);
                let rn = self.fb.b.ins().fcmp(FloatCC::LessThan, r, z);
                let yn = self.fb.b.ins().fcmp(FloatCC::LessThan, y, z);
                let diff = self.fb.b.ins().bxor(rn, yn);
                let fix = self.fb.b.ins().band(nz_ord, diff);
                let ry = self.fb.b.ins().fadd(r, y);
                self.fb.b.ins().select(fix, ry, r)
            }
            // compared by the caller before it gets here; bitwise ops refuse floats
            Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr
            | BitwiseXor => x,
        }
    }

    /// The operands of an integer division or remainder widened to i64, and the divisor
    /// made safe: a zero divisor raises the error flag, and 1 stands in for 0 and -1 (the
    /// traps of x / 0 and MIN / -1). Also returns whether the divisor is -1.
    fn safe_divisor(&mut self, x: Value, y: Value, c: DType) -> (Value, Value, Value, Value) {
        let (xw, yw) = (self.widen_int(x, c), self.widen_int(y, c));
        let zero = self.fb.b.ins().icmp_imm_s(IntCC::Equal, yw, 0);
        self.flag_error(zero, ERR_ZERO_DIV);
        let m1 = self.fb.b.ins().icmp_imm_s(IntCC::Equal, yw, -1);
        let bad = self.fb.b.ins().bor(zero, m1);
        let one = self.iconst(I64, 1);
        let safe = self.fb.b.ins().select(bad, one, yw);
        (xw, yw, safe, m1)
    }

    /// Integer binary arithmetic of dtype `c`, wrapping; bool results are normalised by the
    /// caller.
    fn binary_int(&mut self, b: BinaryOp, x: Value, y: Value, c: DType) -> Value {
        use BinaryOp::*;
        let s = signed(c);
        match b {
            Add => self.fb.b.ins().iadd(x, y),
            Sub => self.fb.b.ins().isub(x, y),
            Mul => self.fb.b.ins().imul(x, y),
            Maximum if s => self.fb.b.ins().smax(x, y),
            Maximum => self.fb.b.ins().umax(x, y),
            Minimum if s => self.fb.b.ins().smin(x, y),
            Minimum => self.fb.b.ins().umin(x, y),
            Pow => {
                let (xw, yw) = (self.widen_int(x, c), self.widen_int(y, c));
                let r = self.call("smelt_pow_i64", &[xw, yw]);
                self.reduce_int(r, c)
            }
            DivTrunc | DivFloor => {
                // x / -1 is -x (wrapping, as the reference)
                let (xw, yw, safe, m1) = self.safe_divisor(x, y, c);
                let mut q = self.fb.b.ins().sdiv(xw, safe);
                if b == DivFloor {
                    // one less when the remainder is nonzero and the signs differ
                    let r = self.fb.b.ins().srem(xw, safe);
                    let rnz = self.fb.b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                    let xn = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, xw, 0);
                    let yn = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, yw, 0);
                    let diff = self.fb.b.ins().bxor(xn, yn);
                    let fix = self.fb.b.ins().band(rnz, diff);
                    let q1 = self.fb.b.ins().iadd_imm_s(q, -1);
                    q = self.fb.b.ins().select(fix, q1, q);
                }
                let neg = self.fb.b.ins().ineg(xw);
                let q = self.fb.b.ins().select(m1, neg, q);
                self.reduce_int(q, c)
            }
            Remainder => {
                // x % -1 == x % 1 == 0
                let (xw, yw, safe, _) = self.safe_divisor(x, y, c);
                let r = self.fb.b.ins().srem(xw, safe);
                let rnz = self.fb.b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
                let rn = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
                let yn = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, yw, 0);
                let diff = self.fb.b.ins().bxor(rn, yn);
                let fix = self.fb.b.ins().band(rnz, diff);
                let ry = self.fb.b.ins().iadd(r, yw);
                let r = self.fb.b.ins().select(fix, ry, r);
                self.reduce_int(r, c)
            }
            BitwiseAnd => self.fb.b.ins().band(x, y),
            BitwiseOr => self.fb.b.ins().bor(x, y),
            BitwiseXor => self.fb.b.ins().bxor(x, y),
            // `div` computes integers in floats, and the caller compares
            Div | Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr => x,
        }
    }

    // ---- reductions -------------------------------------------------------------------------

    fn reduce_parts(&self, r: ValId) -> (Combiner, ValId) {
        match self.k.values[r].expr {
            Expr::Reduce { combiner, arg, .. } => (combiner, arg),
            _ => unreachable!("passes list only reductions (validated)"),
        }
    }

    /// The accumulator type of reduction `r` (float sums and products accumulate in f64).
    fn acc_type(&self, r: ValId) -> cranelift_codegen::ir::Type {
        let (c, arg) = self.reduce_parts(r);
        let da = self.k.values[arg].dtype;
        match c {
            Combiner::Sum | Combiner::Mean | Combiner::Prod if da.is_float() => F64,
            Combiner::Sum | Combiner::Mean | Combiner::Prod => I64,
            Combiner::All | Combiner::Any => I8,
            _ => cty(da),
        }
    }

    pub fn init_acc(&mut self, r: ValId) {
        let (c, arg) = self.reduce_parts(r);
        let da = self.k.values[arg].dtype;
        let t = self.acc_type(r);
        let init = match c {
            Combiner::Sum | Combiner::Mean if t == F64 => self.fconst(F64, 0.0),
            Combiner::Prod if t == F64 => self.fconst(F64, 1.0),
            Combiner::Sum | Combiner::Mean | Combiner::Any => self.iconst(t, 0),
            Combiner::Prod | Combiner::All => self.iconst(t, 1),
            Combiner::Max | Combiner::Min | Combiner::ArgMax | Combiner::ArgMin => {
                let max = matches!(c, Combiner::Max | Combiner::ArgMax);
                if da.is_float() {
                    self.fconst(
                        t,
                        if max {
                            f64::NEG_INFINITY
                        } else {
                            f64::INFINITY
                        },
                    )
                } else {
                    let (lo, hi) = int_range(da);
                    self.iconst(t, if max { lo } else { hi })
                }
            }
        };
        let val = self.fb.b.declare_var(t);
        self.fb.b.def_var(val, init);
        let idx = if matches!(c, Combiner::ArgMax | Combiner::ArgMin) {
            let v = self.fb.b.declare_var(I64);
            let m1 = self.iconst(I64, -1);
            self.fb.b.def_var(v, m1);
            Some(v)
        } else {
            None
        };
        self.accs.insert(r, Acc { val, idx });
    }

    /// Folds one element `x` (of the argument's dtype) into the scalar accumulator of `r`.
    pub fn fold(&mut self, r: ValId, x: Value) {
        let (c, arg) = self.reduce_parts(r);
        let da = self.k.values[arg].dtype;
        let acc = self.accs[&r];
        let a = self.fb.b.use_var(acc.val);
        let n = match c {
            Combiner::Sum | Combiner::Mean | Combiner::Prod => {
                let prod = c == Combiner::Prod;
                if da.is_float() {
                    let w = self.widen_float(x, da);
                    if prod {
                        self.fb.b.ins().fmul(a, w)
                    } else {
                        self.fb.b.ins().fadd(a, w)
                    }
                } else {
                    let w = self.widen_int(x, da);
                    if prod {
                        self.fb.b.ins().imul(a, w)
                    } else {
                        self.fb.b.ins().iadd(a, w)
                    }
                }
            }
            Combiner::All | Combiner::Any => {
                let nz = self.nonzero(x, da);
                if c == Combiner::All {
                    self.fb.b.ins().band(a, nz)
                } else {
                    self.fb.b.ins().bor(a, nz)
                }
            }
            Combiner::Max | Combiner::Min => {
                let max = c == Combiner::Max;
                if da.is_float() {
                    // NaN wins and stays
                    let better = if max {
                        self.fb.b.ins().fcmp(FloatCC::GreaterThan, x, a)
                    } else {
                        self.fb.b.ins().fcmp(FloatCC::LessThan, x, a)
                    };
                    let nan = self.fb.b.ins().fcmp(FloatCC::Unordered, x, x);
                    let take = self.fb.b.ins().bor(better, nan);
                    self.fb.b.ins().select(take, x, a)
                } else {
                    match (max, signed(da)) {
                        (true, true) => self.fb.b.ins().smax(a, x),
                        (true, false) => self.fb.b.ins().umax(a, x),
                        (false, true) => self.fb.b.ins().smin(a, x),
                        (false, false) => self.fb.b.ins().umin(a, x),
                    }
                }
            }
            Combiner::ArgMax | Combiner::ArgMin => {
                let max = c == Combiner::ArgMax;
                let better = if da.is_float() {
                    let cc = if max {
                        FloatCC::GreaterThan
                    } else {
                        FloatCC::LessThan
                    };
                    let cmp = self.fb.b.ins().fcmp(cc, x, a);
                    let xnan = self.fb.b.ins().fcmp(FloatCC::Unordered, x, x);
                    let anan = self.fb.b.ins().fcmp(FloatCC::Unordered, a, a);
                    let t = self.fb.b.ins().bor(cmp, xnan);
                    self.fb.b.ins().band_not(t, anan)
                } else {
                    let cc = match (max, signed(da)) {
                        (true, true) => IntCC::SignedGreaterThan,
                        (true, false) => IntCC::UnsignedGreaterThan,
                        (false, true) => IntCC::SignedLessThan,
                        (false, false) => IntCC::UnsignedLessThan,
                    };
                    self.fb.b.ins().icmp(cc, x, a)
                };
                let idx_var = acc
                    .idx
                    .unwrap_or_else(|| unreachable!("argmax has an index"));
                let idx = self.fb.b.use_var(idx_var);
                let first = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, idx, 0);
                let take = self.fb.b.ins().bor(first, better);
                let pos_var = self
                    .pos
                    .unwrap_or_else(|| unreachable!("argmax tracks positions"));
                let pos = self.fb.b.use_var(pos_var);
                let ni = self.fb.b.ins().select(take, pos, idx);
                self.fb.b.def_var(idx_var, ni);
                self.fb.b.ins().select(take, x, a)
            }
        };
        self.fb.b.def_var(acc.val, n);
    }

    /// Folds the current element's argument of `r`, read from `env`.
    pub fn update_acc(&mut self, r: ValId, env: &[Option<Value>]) {
        let (_, arg) = self.reduce_parts(r);
        if let Some(x) = env[arg] {
            self.fold(r, x);
        }
    }

    /// The final value of reduction `r`, in its result dtype.
    pub fn finish_acc(&mut self, r: ValId) -> Value {
        let (c, arg) = self.reduce_parts(r);
        let da = self.k.values[arg].dtype;
        let d = self.k.values[r].dtype;
        let acc = self.accs[&r];
        let a = self.fb.b.use_var(acc.val);
        match c {
            Combiner::Sum | Combiner::Mean | Combiner::Prod if da.is_float() => {
                let a = if c == Combiner::Mean {
                    let n = crate::ir::shape::numel(&self.k.inner) as f64;
                    let nv = self.fconst(F64, n);
                    self.fb.b.ins().fdiv(a, nv)
                } else {
                    a
                };
                if d.is_float() {
                    self.narrow_f64(a, d)
                } else {
                    self.cast(a, DType::F64, d)
                }
            }
            Combiner::Sum | Combiner::Mean | Combiner::Prod => self.cast(a, DType::I64, d),
            Combiner::All | Combiner::Any => a,
            Combiner::Max | Combiner::Min => self.cast(a, da, d),
            Combiner::ArgMax | Combiner::ArgMin => {
                let idx_var = acc
                    .idx
                    .unwrap_or_else(|| unreachable!("argmax has an index"));
                let idx = self.fb.b.use_var(idx_var);
                let z = self.iconst(I64, 0);
                let neg = self.fb.b.ins().icmp_imm_s(IntCC::SignedLessThan, idx, 0);
                let idx = self.fb.b.ins().select(neg, z, idx);
                self.cast(idx, DType::I64, d)
            }
        }
    }
}

/// The smallest and largest value of an integer or bool dtype.
fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::Bool => (0, 1),
        DType::U8 => (0, 255),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    }
}
