//! C expressions of the scalar ops, casts and constants, one dtype at a time.
//!
//! A value of dtype f16 or bf16 is held in a `float` holding an exactly representable value;
//! integers in their own C type with wrapping helpers; bool in `bool`.

use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, UnaryOp};
use crate::ir::unary::FloatMath;
use crate::runtime::element::Element;
use crate::{Result, bail, dispatch};

/// The C type a value of `d` is computed in.
pub fn var_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 => "unsigned char",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// The C type an element of a buffer of `d` is stored as.
pub fn mem_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        _ => var_type(d),
    }
}

/// Reads a stored element `e` into its computation type.
pub fn load(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("__half2float({e})"),
        DType::BF16 => format!("__bfloat162float({e})"),
        _ => e.to_string(),
    }
}

/// Converts a computed value `e` to its storage type.
pub fn store(d: DType, e: &str) -> String {
    match d {
        DType::F16 => format!("__float2half_rn({e})"),
        DType::BF16 => format!("__float2bfloat16_rn({e})"),
        _ => e.to_string(),
    }
}

/// Rounds a float result to `d` (f16/bf16 results are computed in f32).
fn round(d: DType, e: String) -> String {
    match d {
        DType::F16 => format!("sm_rh({e})"),
        DType::BF16 => format!("sm_rb({e})"),
        _ => e,
    }
}

/// True when values of `d` compute in double.
fn is_double(d: DType) -> bool {
    d == DType::F64
}

/// The name of a math function for `d`: `expf` for single, `exp` for double.
fn math(name: &str, d: DType) -> String {
    if is_double(d) {
        name.to_string()
    } else {
        format!("{name}f")
    }
}

/// A float literal of the computation type of `d` (exact for values representable in it).
pub fn float_lit(x: f64, d: DType) -> String {
    let dbl = is_double(d);
    if x.is_nan() {
        return if dbl { "SM_NAN_D" } else { "SM_NAN_F" }.to_string();
    }
    if x.is_infinite() {
        let inf = if dbl { "SM_INF_D" } else { "SM_INF_F" };
        return if x > 0.0 {
            inf.to_string()
        } else {
            format!("(-{inf})")
        };
    }
    if dbl {
        let s = format!("{x:?}");
        format!("({s})")
    } else {
        let s = format!("{:?}", x as f32);
        format!("({s}f)")
    }
}

/// An integer literal of C type `var_type(d)`.
pub fn int_lit(i: i64, d: DType) -> String {
    let body = if i == i64::MIN {
        "(-9223372036854775807LL - 1)".to_string()
    } else {
        format!("{i}LL")
    };
    if d == DType::I64 {
        format!("({body})")
    } else {
        format!("(({})({body}))", var_type(d))
    }
}

/// A Python scalar converted to `d` with cast semantics, as a C literal.
pub fn const_lit(s: Scalar, d: DType) -> String {
    fn conv<T: Element>(s: Scalar) -> (f64, i64) {
        let v: T = crate::runtime::kernels::creation::scalar_to(s);
        (v.to_f64(), v.to_i64())
    }
    let (f, i) = dispatch!(d, T => conv::<T>(s));
    match d {
        DType::Bool => if i != 0 { "true" } else { "false" }.to_string(),
        _ if d.is_float() => float_lit(f, d),
        _ => int_lit(i, d),
    }
}

/// `e` of dtype `from` converted to `to` with PyTorch's cast semantics.
pub fn cast(from: DType, to: DType, e: &str) -> String {
    use DType::*;
    if from == to {
        return e.to_string();
    }
    match (from, to) {
        (_, Bool) => format!("(({e}) != 0)"),
        (Bool, _) if to.is_float() => {
            format!("(({e}) ? {} : {})", float_lit(1.0, to), float_lit(0.0, to))
        }
        (Bool, _) => format!("(({})({e}))", var_type(to)),
        (_, _) if from.is_float() && to.is_int() => {
            // saturating to i64 then wrapping, NaN to 0: `(v as i64) as T` of the eager kernels
            format!("(({})(long long)({e}))", var_type(to))
        }
        (_, _) if from.is_int() && to.is_int() => format!("(({})({e}))", var_type(to)),
        (_, F32) if from == F64 || from.is_int() => format!("((float)({e}))"),
        (_, F32) => e.to_string(),
        (_, F64) => format!("((double)({e}))"),
        // through f32 from f64 and the integers, as PyTorch converts
        (_, F16) if from == F64 || from.is_int() => format!("sm_rh((float)({e}))"),
        (_, F16) => format!("sm_rh({e})"),
        (_, BF16) if from == F64 || from.is_int() => format!("sm_rb((float)({e}))"),
        (_, BF16) => format!("sm_rb({e})"),
        _ => format!("(({})({e}))", var_type(to)),
    }
}

/// A unary op on `x` (already of the op's computation dtype `d`, the result dtype).
/// `LogicalNot` and `IsNan` read `x` in its own dtype `d` and give bool.
pub fn unary(op: UnaryOp, d: DType, x: &str) -> Result<String> {
    use UnaryOp::*;
    if op == LogicalNot {
        return Ok(format!("(({x}) == 0)"));
    }
    if op == IsNan {
        return Ok(if d.is_float() {
            format!("(({x}) != ({x}))")
        } else {
            "false".to_string()
        });
    }
    if d.is_float() {
        let f = |n: &str| math(n, d);
        let one = float_lit(1.0, d);
        let zero = float_lit(0.0, d);
        let half = float_lit(0.5, d);
        let e = match op {
            Neg => format!("(-({x}))"),
            Abs => format!("{}({x})", f("fabs")),
            Exp => format!("{}({x})", f("exp")),
            Log => format!("{}({x})", f("log")),
            Log1p => format!("{}({x})", f("log1p")),
            Expm1 => format!("{}({x})", f("expm1")),
            Sqrt => format!("{}({x})", f("sqrt")),
            Rsqrt => format!("({one} / {}({x}))", f("sqrt")),
            Sin => format!("{}({x})", f("sin")),
            Cos => format!("{}({x})", f("cos")),
            Asin => format!("{}({x})", f("asin")),
            Acos => format!("{}({x})", f("acos")),
            Atan => format!("{}({x})", f("atan")),
            Tanh => format!("{}({x})", f("tanh")),
            Sigmoid => format!("({one} / ({one} + {}(-({x}))))", f("exp")),
            Relu => format!("(({x}) < {zero} ? {zero} : ({x}))"),
            Gelu { tanh: false } => format!(
                "({half} * ({x}) * ({one} + {}(({x}) * {})))",
                f("erf"),
                float_lit(std::f64::consts::FRAC_1_SQRT_2, d)
            ),
            Gelu { tanh: true } => format!(
                "({half} * ({x}) * ({one} + {}({} * (({x}) + {} * ({x}) * ({x}) * ({x})))))",
                f("tanh"),
                float_lit(0.797_884_560_802_865_4, d),
                float_lit(0.044715, d)
            ),
            GeluSlope { tanh: false } => format!(
                "({half} * {}(-({x}) * {}) + ({x}) * {}({} * ({x}) * ({x})) * {})",
                f("erfc"),
                float_lit(std::f64::consts::FRAC_1_SQRT_2, d),
                f("exp"),
                float_lit(-0.5, d),
                float_lit(crate::ir::unary::FRAC_1_SQRT_2PI, d)
            ),
            GeluSlope { tanh: true } => {
                let k = 2.0 * crate::ir::unary::SQRT_2_OVER_PI;
                let v = format!(
                    "({} * (({x}) + {} * ({x}) * ({x}) * ({x})))",
                    float_lit(k, d),
                    float_lit(0.044715, d)
                );
                let dv = format!(
                    "({} * ({one} + {} * ({x}) * ({x})))",
                    float_lit(k, d),
                    float_lit(3.0 * 0.044715, d)
                );
                let e = f("exp");
                format!(
                    "({one} / ({one} + {e}(-{v})) + ({x}) * ({one} / ({one} + {e}(-{v}))) * ({one} / ({one} + {e}({v}))) * {dv})"
                )
            }
            Silu => format!("(({x}) * ({one} / ({one} + {}(-({x})))))", f("exp")),
            Erf => format!("{}({x})", f("erf")),
            Floor => format!("{}({x})", f("floor")),
            Ceil => format!("{}({x})", f("ceil")),
            Round => format!("{}({x})", f("rint")),
            Sign => format!("(({zero} < ({x})) ? {one} : ((({x}) < {zero}) ? -{one} : {zero}))"),
            Reciprocal => format!("({one} / ({x}))"),
            Square => format!("(({x}) * ({x}))"),
            LeakyRelu { .. }
            | Elu { .. }
            | Softplus { .. }
            | Hardtanh { .. }
            | Hardswish
            | Mish
            | LogSigmoid => op.composite(&mut CudaMath { d }, format!("({x})")),
            LogicalNot | IsNan | BitwiseNot => unreachable_op(op)?,
        };
        return Ok(round(d, e));
    }
    let t = var_type(d);
    Ok(match op {
        Neg => format!("sm_wneg<{t}>({x})"),
        Abs => format!("sm_iabs<{t}>({x})"),
        Relu => format!("(({x}) < ({t})0 ? ({t})0 : ({x}))"),
        Sign => format!("sm_isign<{t}>({x})"),
        Square => format!("sm_wmul<{t}>({x}, {x})"),
        Floor | Ceil | Round => x.to_string(),
        BitwiseNot if d == DType::Bool => format!("(!({x}))"),
        BitwiseNot => format!("(({t})(~({x})))"),
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
        | LogSigmoid => bail!(
            Unsupported,
            "cuda codegen: {} of {} is not a valid kernel op",
            op.name(),
            d
        ),
    })
}

/// The composite activations' formulas ([`FloatMath`]) as C expressions of the computation
/// type of `d` (float for f16/bf16/f32, double for f64).
struct CudaMath {
    d: DType,
}

impl FloatMath for CudaMath {
    type V = String;
    type M = String;
    fn lit(&mut self, c: f64) -> String {
        float_lit(c, self.d)
    }
    fn add(&mut self, a: String, b: String) -> String {
        format!("({a} + {b})")
    }
    fn sub(&mut self, a: String, b: String) -> String {
        format!("({a} - {b})")
    }
    fn mul(&mut self, a: String, b: String) -> String {
        format!("({a} * {b})")
    }
    fn div(&mut self, a: String, b: String) -> String {
        format!("({a} / {b})")
    }
    fn neg(&mut self, a: String) -> String {
        format!("(-{a})")
    }
    fn abs(&mut self, a: String) -> String {
        format!("{}({a})", math("fabs", self.d))
    }
    fn gt(&mut self, a: String, b: String) -> String {
        format!("({a} > {b})")
    }
    fn is_nan(&mut self, a: String) -> String {
        format!("({a} != {a})")
    }
    fn select(&mut self, m: String, a: String, b: String) -> String {
        format!("({m} ? {a} : {b})")
    }
    fn exp(&mut self, a: String) -> String {
        format!("{}({a})", math("exp", self.d))
    }
    fn expm1(&mut self, a: String) -> String {
        format!("{}({a})", math("expm1", self.d))
    }
    fn log1p(&mut self, a: String) -> String {
        format!("{}({a})", math("log1p", self.d))
    }
    fn tanh(&mut self, a: String) -> String {
        format!("{}({a})", math("tanh", self.d))
    }
}

fn unreachable_op(op: UnaryOp) -> Result<String> {
    bail!(Unsupported, "cuda codegen: {} routed wrongly", op.name())
}

/// A binary op on `a` and `b`, both of the computation dtype `c`.
pub fn binary(op: BinaryOp, c: DType, a: &str, b: &str) -> Result<String> {
    use BinaryOp::*;
    let cmp = |sym: &str| format!("(({a}) {sym} ({b}))");
    match op {
        Eq => return Ok(cmp("==")),
        Ne => return Ok(cmp("!=")),
        Lt => return Ok(cmp("<")),
        Le => return Ok(cmp("<=")),
        Gt => return Ok(cmp(">")),
        Ge => return Ok(cmp(">=")),
        LogicalAnd => return Ok(format!("((({a}) != 0) && (({b}) != 0))")),
        LogicalOr => return Ok(format!("((({a}) != 0) || (({b}) != 0))")),
        _ => {}
    }
    if c.is_float() {
        let e = match op {
            Add => cmp("+"),
            Sub => cmp("-"),
            Mul => cmp("*"),
            Div => cmp("/"),
            Pow => format!("{}({a}, {b})", math("pow", c)),
            Maximum => format!("sm_fmax({a}, {b})"),
            Minimum => format!("sm_fmin({a}, {b})"),
            Remainder => format!("sm_frem({a}, {b})"),
            DivTrunc => format!("sm_fdiv_trunc({a}, {b})"),
            DivFloor => format!("sm_fdiv_floor({a}, {b})"),
            _ => bail!(Unsupported, "cuda codegen: {} routed wrongly", op.name()),
        };
        return Ok(round(c, e));
    }
    let t = var_type(c);
    Ok(match op {
        Add if c == DType::Bool => format!("(({a}) || ({b}))"),
        Mul if c == DType::Bool => format!("(({a}) && ({b}))"),
        Maximum if c == DType::Bool => format!("(({a}) || ({b}))"),
        Minimum if c == DType::Bool => format!("(({a}) && ({b}))"),
        Add => format!("sm_wadd<{t}>({a}, {b})"),
        Sub => format!("sm_wsub<{t}>({a}, {b})"),
        Mul => format!("sm_wmul<{t}>({a}, {b})"),
        Pow => format!("sm_ipow<{t}>({a}, {b})"),
        Maximum => format!("(({a}) < ({b}) ? ({b}) : ({a}))"),
        Minimum => format!("(({b}) < ({a}) ? ({b}) : ({a}))"),
        Remainder => format!("sm_irem<{t}>({a}, {b}, sm_err)"),
        DivTrunc => format!("sm_idiv_trunc<{t}>({a}, {b}, sm_err)"),
        DivFloor => format!("sm_idiv_floor<{t}>({a}, {b}, sm_err)"),
        BitwiseAnd => format!("(({t})(({a}) & ({b})))"),
        BitwiseOr => format!("(({t})(({a}) | ({b})))"),
        BitwiseXor => format!("(({t})(({a}) ^ ({b})))"),
        _ => bail!(
            Unsupported,
            "cuda codegen: {} of {} is not a valid kernel op",
            op.name(),
            c
        ),
    })
}

/// `clamp(x, min, max)` in dtype `d`, as the eager kernel: bounds converted to `d`; a NaN
/// element stays NaN; both bounds given and one NaN makes the result NaN.
pub fn clamp(d: DType, x: &str, min: Option<Scalar>, max: Option<Scalar>) -> String {
    if d.is_float() {
        let bound =
            |s: Option<Scalar>| s.map(|s| crate::runtime::element::round_to_dtype(s.to_f64(), d));
        let (lo, hi) = (bound(min), bound(max));
        if let (Some(l), Some(h)) = (lo, hi)
            && (l.is_nan() || h.is_nan())
        {
            return float_lit(f64::NAN, d);
        }
        let mut e = format!("({x})");
        if let Some(l) = lo {
            let l = float_lit(l, d);
            e = format!("({e} < {l} ? {l} : {e})");
        }
        if let Some(h) = hi {
            let h = float_lit(h, d);
            e = format!("({h} < {e} ? {h} : {e})");
        }
        return e;
    }
    // integers and bool: max(lo) then min(hi) in i64
    let mut e = format!("((long long)({x}))");
    if let Some(l) = min {
        let l = lit_i64_of(l, d);
        e = format!("({e} < {l} ? {l} : {e})");
    }
    if let Some(h) = max {
        let h = lit_i64_of(h, d);
        e = format!("({h} < {e} ? {h} : {e})");
    }
    format!("(({})({e}))", var_type(d))
}

/// The scalar converted to `d`, then widened to an i64 literal.
fn lit_i64_of(s: Scalar, d: DType) -> String {
    fn conv<T: Element>(s: Scalar) -> i64 {
        let v: T = crate::runtime::kernels::creation::scalar_to(s);
        v.to_i64()
    }
    int_lit(dispatch!(d, T => conv::<T>(s)), DType::I64)
}
