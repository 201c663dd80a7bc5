//! The unary pointwise ops: one table of facts (name, attributes with PyTorch's defaults,
//! dtype class, cost class, differentiability) and one f64 reference formula per op.
//!
//! Everything that lists unary ops derives from `unary_ops!`'s table: the text format's
//! names and attributes, [`UnaryOp::ALL`], the cost models of fusion and rewriting. The
//! per-backend concerns (eager reference, gradient rule, CPU emitter, CUDA emitter) are each
//! one exhaustive `match`, so a new op is a compile error in every place it still needs.
//!
//! Activations that PyTorch computes as a short formula of other functions (leaky_relu, elu,
//! softplus, hardtanh, hardswish, mish, logsigmoid) are written once over [`FloatMath`]: the
//! eager f64 reference, the Cranelift emitters and the CUDA emitter all instantiate that one
//! formula, so no backend can disagree with another about what the op means.

use super::attrs::Attr;
use super::dtype::DType;
use std::fmt;
use std::hash::{Hash, Hasher};

/// An f64 attribute that compares and hashes by its bits, so that ops holding one stay `Eq`.
#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Real(pub f64);

impl Real {
    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Real {
    fn eq(&self, other: &Real) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Real {}
impl Hash for Real {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}
impl fmt::Debug for Real {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// How an op's result dtype follows its operand's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    /// Bool result for any operand (`logical_not`, `isnan`).
    Predicate,
    /// Computes in floating point: integer and bool operands give the default float.
    Float,
    /// Defined for floating-point operands only (PyTorch's "not implemented for 'Long'").
    FloatOnly,
    /// Keeps the operand's dtype; bool refused.
    Numeric,
    /// Keeps the operand's dtype, bool included (`square` of bool gives i64, as in PyTorch).
    Any,
    /// Keeps an integer or bool operand's dtype; floats refused (`bitwise_not`).
    Integral,
}

/// What one element costs, for fusion and rewriting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cost {
    /// One instruction (neg, abs, floor, ...).
    Trivial,
    /// A compare and a select or two (relu, leaky_relu, hardtanh).
    Select,
    /// A division or square root.
    Divide,
    /// A polynomial evaluation or more (exp, tanh, erf, softplus, ...).
    Transcendental,
}

/// A value of a unary op's attribute, as the text format writes it.
pub trait UnaryAttr: Sized {
    /// The value as a `.smelt` attribute.
    fn to_attr(&self) -> Attr;
    /// `Err` says what was expected ("a number").
    fn from_attr(a: &Attr) -> Result<Self, String>;
    /// The value as an f64 argument of compiled code's helper call, and back.
    fn to_code(&self) -> f64;
    /// The value back from [`UnaryAttr::to_code`]'s f64.
    fn from_code(c: f64) -> Self;
}

impl UnaryAttr for Real {
    fn to_attr(&self) -> Attr {
        Attr::Float(self.0)
    }
    fn from_attr(a: &Attr) -> Result<Real, String> {
        match a {
            Attr::Float(x) => Ok(Real(*x)),
            Attr::Int(i) => Ok(Real(*i as f64)),
            _ => Err("a number".into()),
        }
    }
    fn to_code(&self) -> f64 {
        self.0
    }
    fn from_code(c: f64) -> Real {
        Real(c)
    }
}

/// gelu's one attribute: `approximate="none"` (false) or `"tanh"` (true).
impl UnaryAttr for bool {
    fn to_attr(&self) -> Attr {
        Attr::Str(if *self { "tanh" } else { "none" }.into())
    }
    fn from_attr(a: &Attr) -> Result<bool, String> {
        match a {
            Attr::Str(s) if s == "none" => Ok(false),
            Attr::Str(s) if s == "tanh" => Ok(true),
            _ => Err("\"none\" or \"tanh\"".into()),
        }
    }
    fn to_code(&self) -> f64 {
        *self as i64 as f64
    }
    fn from_code(c: f64) -> bool {
        c != 0.0
    }
}

/// The table. Each row: variant (with attribute fields, their defaults and their names in
/// text), the op's name, its dtype class, its cost class, and whether it has a gradient.
macro_rules! unary_ops {
    ($(
        $(#[$doc:meta])*
        $var:ident $({ $($f:ident : $t:ty = $def:expr => $text:literal),+ })?
            = $name:literal, $class:ident, $cost:ident, $grad:literal;
    )*) => {
        /// A unary pointwise op (one row of the table in `ir/unary.rs`); attributes are its fields.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum UnaryOp {
            $($(#[$doc])* $var $({ $(
                #[doc = concat!(
                    "PyTorch's `", $text, "` argument (default `", stringify!($def), "`)."
                )]
                $f: $t
            ),+ })?,)*
        }

        impl UnaryOp {
            /// Every unary op, attributes at PyTorch's defaults.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$var $({ $($f: $def),+ })?,)*];

            /// The op's name in `.smelt` text, in messages and as a `Tensor` method.
            pub fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$var { .. } => $name,)*
                }
            }

            /// How the result dtype follows the operand's (the table's dtype class).
            pub fn dtype_class(self) -> DTypeClass {
                match self {
                    $(UnaryOp::$var { .. } => DTypeClass::$class,)*
                }
            }

            /// What one element costs (the table's cost class).
            pub fn cost(self) -> Cost {
                match self {
                    $(UnaryOp::$var { .. } => Cost::$cost,)*
                }
            }

            /// False for the bool-valued ops, which have no gradient.
            pub fn differentiable(self) -> bool {
                match self {
                    $(UnaryOp::$var { .. } => $grad,)*
                }
            }

            /// The op's attributes as the text format names them.
            pub fn attrs(self) -> Vec<(&'static str, Attr)> {
                match self {
                    $(UnaryOp::$var $({ $($f),+ })? => vec![$($(($text, UnaryAttr::to_attr(&$f)),)+)?],)*
                }
            }

            /// The op called `name`, its attributes read by `get` (None: PyTorch's default).
            /// `Ok(None)` when no unary op has that name; `Err((attribute, "must be .., got .."))`
            /// for an attribute of the wrong kind.
            pub fn from_name(
                name: &str,
                get: &mut dyn FnMut(&'static str) -> Option<Attr>,
            ) -> Result<Option<UnaryOp>, (&'static str, String)> {
                let _ = &get;
                $(
                    if name == $name {
                        return Ok(Some(UnaryOp::$var $({ $($f: match get($text) {
                            None => $def,
                            Some(a) => UnaryAttr::from_attr(&a)
                                .map_err(|e| ($text, format!("must be {e}, got {a}")))?,
                        }),+ })?));
                    }
                )*
                Ok(None)
            }

            /// The op's float attributes in order, as the f64 helper of compiled code takes them.
            pub fn attr_codes(self) -> [f64; 2] {
                #[allow(unused_mut)]
                let mut codes = Vec::<f64>::new();
                match self {
                    $(UnaryOp::$var $({ $($f),+ })? => { $($(codes.push(UnaryAttr::to_code(&$f));)+)? })*
                }
                codes.resize(2, 0.0);
                [codes[0], codes[1]]
            }

            /// The symbol under which compiled code imports [`UnaryOp::f64_helper`].
            pub fn helper_symbol(self) -> &'static str {
                match self {
                    $(UnaryOp::$var { .. } => concat!("smelt_unary_", $name),)*
                }
            }

            /// The reference formula as a C function `(x, attr0, attr1) -> f64` that compiled
            /// f64 code calls (one function per op kind: its match folds to that op's arm).
            pub fn f64_helper(self) -> extern "C" fn(f64, f64, f64) -> f64 {
                match self {
                    $(UnaryOp::$var { .. } => {
                        #[allow(unused_variables, unused_mut, unused_assignments)]
                        extern "C" fn helper(x: f64, a0: f64, a1: f64) -> f64 {
                            let codes = [a0, a1];
                            let mut k = 0;
                            UnaryOp::$var $({ $($f: {
                                let v = UnaryAttr::from_code(codes[k]);
                                k += 1;
                                v
                            }),+ })?.eval_f64(x)
                        }
                        helper
                    })*
                }
            }

            /// The op's f64 reference formula as a closure the caller is generic over: each
            /// arm hands over a closure whose op is fixed, so the per-element match folds away.
            pub fn with_formula<R>(self, w: impl WithFormula<R>) -> R {
                match self {
                    $(UnaryOp::$var $({ $($f),+ })? => w.apply(
                        #[inline(always)]
                        move |x: f64| UnaryOp::$var $({ $($f),+ })?.eval_f64(x)
                    ),)*
                }
            }
        }
    };
}

/// A caller of [`UnaryOp::with_formula`].
pub trait WithFormula<R> {
    /// Called with the op's reference formula.
    fn apply<F: Fn(f64) -> f64 + Copy + Send + Sync>(self, f: F) -> R;
}

unary_ops! {
    /// `-x`.
    Neg = "neg", Numeric, Trivial, true;
    /// `|x|`.
    Abs = "abs", Numeric, Trivial, true;
    /// `e^x`.
    Exp = "exp", Float, Transcendental, true;
    /// Natural logarithm.
    Log = "log", Float, Transcendental, true;
    /// `ln(1 + x)`, accurate near 0.
    Log1p = "log1p", Float, Transcendental, true;
    /// `e^x - 1`, accurate near 0.
    Expm1 = "expm1", Float, Transcendental, true;
    /// Square root.
    Sqrt = "sqrt", Float, Divide, true;
    /// `1 / sqrt(x)`.
    Rsqrt = "rsqrt", Float, Divide, true;
    /// Sine.
    Sin = "sin", Float, Transcendental, true;
    /// Cosine.
    Cos = "cos", Float, Transcendental, true;
    /// Inverse sine (NaN outside [-1, 1]).
    Asin = "asin", Float, Transcendental, true;
    /// Inverse cosine (NaN outside [-1, 1]).
    Acos = "acos", Float, Transcendental, true;
    /// Inverse tangent.
    Atan = "atan", Float, Transcendental, true;
    /// Hyperbolic tangent.
    Tanh = "tanh", Float, Transcendental, true;
    /// `1 / (1 + e^-x)`.
    Sigmoid = "sigmoid", Float, Transcendental, true;
    /// `max(x, 0)`.
    Relu = "relu", Numeric, Select, true;
    /// `approximate="tanh"` when `tanh` is set, else the exact erf form.
    Gelu { tanh: bool = false => "approximate" } = "gelu", FloatOnly, Transcendental, true;
    /// The derivative of `gelu` with the same `approximate`: what its gradient multiplies by
    /// (PyTorch's `gelu_backward(grad, x)` is `grad * gelu_slope(x)`), one op so that a
    /// backward pass computes the GELU's tail once instead of an erf and an exp.
    GeluSlope { tanh: bool = false => "approximate" }
        = "gelu_slope", FloatOnly, Transcendental, true;
    /// `x * sigmoid(x)`.
    Silu = "silu", FloatOnly, Transcendental, true;
    /// The error function.
    Erf = "erf", Float, Transcendental, true;
    /// Rounds down.
    Floor = "floor", Numeric, Trivial, true;
    /// Rounds up.
    Ceil = "ceil", Numeric, Trivial, true;
    /// Rounds half to even (`torch.round`).
    Round = "round", Numeric, Trivial, true;
    /// -1, 0 or 1 by the sign of `x` (0 for NaN and both zeros).
    Sign = "sign", Any, Trivial, true;
    /// `1 / x`.
    Reciprocal = "reciprocal", Float, Divide, true;
    /// `x * x`.
    Square = "square", Any, Trivial, true;
    /// `x == 0`, as bool.
    LogicalNot = "logical_not", Predicate, Trivial, false;
    /// Whether `x` is NaN.
    IsNan = "isnan", Predicate, Trivial, false;
    /// `~x`: every bit flipped for integers, logical not for bools.
    BitwiseNot = "bitwise_not", Integral, Trivial, false;
    /// `x > 0 ? x : negative_slope * x`.
    LeakyRelu { negative_slope: Real = Real(0.01) => "negative_slope" }
        = "leaky_relu", FloatOnly, Select, true;
    /// `x > 0 ? x : alpha * (e^x - 1)`.
    Elu { alpha: Real = Real(1.0) => "alpha" } = "elu", FloatOnly, Transcendental, true;
    /// `log(1 + e^(beta x)) / beta`, or `x` where `beta x > threshold`.
    Softplus { beta: Real = Real(1.0) => "beta", threshold: Real = Real(20.0) => "threshold" }
        = "softplus", FloatOnly, Transcendental, true;
    /// `clamp(x, min_val, max_val)`.
    Hardtanh { min_val: Real = Real(-1.0) => "min_val", max_val: Real = Real(1.0) => "max_val" }
        = "hardtanh", FloatOnly, Select, true;
    /// `x * clamp(x + 3, 0, 6) / 6`.
    Hardswish = "hardswish", FloatOnly, Divide, true;
    /// `x * tanh(softplus(x))`.
    Mish = "mish", FloatOnly, Transcendental, true;
    /// `log(sigmoid(x))`, as `min(x, 0) - log1p(e^-|x|)`.
    LogSigmoid = "logsigmoid", FloatOnly, Transcendental, true;
}

fn not_implemented(name: &str, d: DType) -> crate::Error {
    crate::Error::DType(format!(
        "\"{name}\" not implemented for '{}'",
        d.scalar_name()
    ))
}

use smelt_rt::unary_f64 as f64m;
/// `sqrt(2 / pi)`, the constant of the tanh form of GELU (the run-time library's).
pub const SQRT_2_OVER_PI: f64 = smelt_rt::unary_f64::SQRT_2_OVER_PI;

/// `1 / sqrt(2 pi)`, the standard normal density at 0.
pub use smelt_rt::consts::FRAC_1_SQRT_2PI;

impl UnaryOp {
    /// True for ops that compute in floating point and so turn integer inputs into floats.
    pub fn promotes_int_to_float(self) -> bool {
        self.dtype_class() == DTypeClass::Float
    }

    /// The result dtype for an operand of dtype `d`, or PyTorch's error for a dtype the op refuses.
    pub fn out_dtype(self, d: DType) -> crate::Result<DType> {
        use DTypeClass::*;
        Ok(match self.dtype_class() {
            Predicate => DType::Bool,
            Float if d.is_float() => d,
            Float => super::dtype::DEFAULT_FLOAT,
            FloatOnly if d.is_float() => d,
            FloatOnly => return Err(not_implemented(self.name(), d)),
            Numeric if d.is_bool() && self == UnaryOp::Neg => crate::bail!(
                DType,
                "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
            ),
            Numeric if d.is_bool() => return Err(not_implemented(self.name(), d)),
            Any if d.is_bool() && self == UnaryOp::Square => DType::I64,
            Integral if d.is_float() => {
                return Err(not_implemented(&format!("{}_cpu", self.name()), d));
            }
            Integral => d,
            Numeric | Any => d,
        })
    }

    /// The reference formula on one float value: the eager kernels and the compiled f64
    /// helpers both call it, so their results are bit-identical. Bool-valued ops give NaN
    /// here (see [`UnaryOp::eval_pred`]).
    #[inline(always)]
    pub fn eval_f64(self, x: f64) -> f64 {
        use UnaryOp::*;
        match self {
            Neg => -x,
            Abs => x.abs(),
            Exp => f64m::smelt_unary_exp(x, 0.0, 0.0),
            Log => f64m::smelt_unary_log(x, 0.0, 0.0),
            Log1p => f64m::smelt_unary_log1p(x, 0.0, 0.0),
            Expm1 => f64m::smelt_unary_expm1(x, 0.0, 0.0),
            Sqrt => x.sqrt(),
            Rsqrt => 1.0 / x.sqrt(),
            Sin => f64m::smelt_unary_sin(x, 0.0, 0.0),
            Cos => f64m::smelt_unary_cos(x, 0.0, 0.0),
            Asin => f64m::smelt_unary_asin(x, 0.0, 0.0),
            Acos => f64m::smelt_unary_acos(x, 0.0, 0.0),
            Atan => f64m::smelt_unary_atan(x, 0.0, 0.0),
            Tanh => f64m::smelt_unary_tanh(x, 0.0, 0.0),
            Sigmoid => f64m::sigmoid(x),
            // `max(x, 0)` in C++'s form: NaN stays NaN
            Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            Gelu { tanh } => f64m::gelu(x, tanh),
            GeluSlope { tanh } => f64m::gelu_slope(x, tanh),
            Silu => f64m::silu(x),
            Erf => f64m::erf(x),
            Floor => x.floor(),
            Ceil => x.ceil(),
            Round => x.round_ties_even(),
            // `(0 < x) - (x < 0)`: 0 for NaN and for both zeros
            Sign => ((0.0 < x) as i64 - (x < 0.0) as i64) as f64,
            Reciprocal => 1.0 / x,
            Square => x * x,
            LogicalNot | IsNan | BitwiseNot => f64::NAN,
            LeakyRelu { negative_slope } => f64m::leaky_relu(x, negative_slope.get()),
            Elu { alpha } => f64m::elu(x, alpha.get()),
            Softplus { beta, threshold } => f64m::softplus(x, beta.get(), threshold.get()),
            Hardtanh { min_val, max_val } => f64m::hardtanh(x, min_val.get(), max_val.get()),
            Hardswish => f64m::hardswish(x),
            Mish => f64m::mish(x),
            LogSigmoid => f64m::logsigmoid(x),
        }
    }

    /// The op on one integer value, for the ops that keep integer dtypes (`None` for the
    /// others, which never see integers: their dtype class converts or refuses them).
    #[inline(always)]
    pub fn eval_i64(self, x: i64) -> Option<i64> {
        use UnaryOp::*;
        Some(match self {
            Neg => x.wrapping_neg(),
            Abs => x.wrapping_abs(),
            Relu => x.max(0),
            Sign => x.signum(),
            Square => x.wrapping_mul(x),
            // bools are handled by the callers (`!1` is not `false` once narrowed)
            BitwiseNot => !x,
            // integers are already whole
            Floor | Ceil | Round => x,
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
            | LogSigmoid => return None,
        })
    }

    /// The bool-valued ops on one value (`is_float`: whether it came from a float dtype).
    #[inline(always)]
    pub fn eval_pred(self, x: f64, is_float: bool) -> Option<bool> {
        match self {
            UnaryOp::LogicalNot => Some(x == 0.0),
            UnaryOp::IsNan => Some(is_float && x.is_nan()),
            _ => None,
        }
    }

    /// The activations written as a formula of other functions, over any [`FloatMath`];
    /// `x` itself for every other op (those have their own lowering in each backend).
    pub fn composite<M: FloatMath>(self, m: &mut M, x: M::V) -> M::V {
        use UnaryOp::*;
        match self {
            LeakyRelu { negative_slope } => {
                let z = m.lit(0.0);
                let pos = m.gt(x.clone(), z);
                let s = m.lit(negative_slope.get());
                let neg = m.mul(x.clone(), s);
                m.select(pos, x, neg)
            }
            Elu { alpha } => {
                // PyTorch's `x <= 0 ? alpha * expm1(x) : x`: NaN takes the second branch
                let z = m.lit(0.0);
                let pos = m.gt(x.clone(), z);
                let e = m.expm1(x.clone());
                let a = m.lit(alpha.get());
                let neg = m.mul(e, a);
                let pos_or_nan = m.select(pos, x.clone(), neg.clone());
                let nan = m.is_nan(x.clone());
                m.select(nan, x, pos_or_nan)
            }
            Softplus { beta, threshold } => {
                let b = m.lit(beta.get());
                let bx = m.mul(x.clone(), b.clone());
                let t = m.lit(threshold.get());
                let linear = m.gt(bx.clone(), t);
                let e = m.exp(bx);
                let l = m.log1p(e);
                let soft = m.div(l, b);
                m.select(linear, x, soft)
            }
            Hardtanh { min_val, max_val } => {
                // min(max(x, min_val), max_val), NaN passing through
                let lo = m.lit(min_val.get());
                let below = m.gt(lo.clone(), x.clone());
                let y = m.select(below, lo, x);
                let hi = m.lit(max_val.get());
                let above = m.gt(y.clone(), hi.clone());
                m.select(above, hi, y)
            }
            Hardswish => {
                let three = m.lit(3.0);
                let y = m.add(x.clone(), three);
                let z = m.lit(0.0);
                let below = m.gt(z.clone(), y.clone());
                let y = m.select(below, z, y);
                let six = m.lit(6.0);
                let above = m.gt(y.clone(), six.clone());
                let y = m.select(above, six.clone(), y);
                let p = m.mul(x, y);
                m.div(p, six)
            }
            Mish => {
                let e = m.exp(x.clone());
                let sp = m.log1p(e);
                let t = m.tanh(sp);
                m.mul(x, t)
            }
            LogSigmoid => {
                // min(x, 0) - log1p(e^-|x|)
                let z = m.lit(0.0);
                let pos = m.gt(x.clone(), z.clone());
                let low = m.select(pos, z, x.clone());
                let a = m.abs(x);
                let na = m.neg(a);
                let e = m.exp(na);
                let l = m.log1p(e);
                m.sub(low, l)
            }
            Neg
            | Abs
            | Exp
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
            | Relu
            | Gelu { .. }
            | GeluSlope { .. }
            | Silu
            | Erf
            | Floor
            | Ceil
            | Round
            | Sign
            | Reciprocal
            | Square
            | LogicalNot
            | IsNan
            | BitwiseNot => x,
        }
    }
}

/// The arithmetic the composite formulas are written in. Implemented by f64 itself (the
/// reference), by the Cranelift emitters (f32 scalars and vectors) and by the CUDA emitter
/// (C expressions). Comparisons are false on NaN, as in C.
pub trait FloatMath {
    /// A float value (or vector of them).
    type V: Clone;
    /// A comparison result (a mask).
    type M: Clone;
    /// The constant `c`.
    fn lit(&mut self, c: f64) -> Self::V;
    /// `a + b`.
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b`.
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `-a`.
    fn neg(&mut self, a: Self::V) -> Self::V;
    /// `|a|`.
    fn abs(&mut self, a: Self::V) -> Self::V;
    /// `a > b`.
    fn gt(&mut self, a: Self::V, b: Self::V) -> Self::M;
    /// Whether `a` is NaN.
    fn is_nan(&mut self, a: Self::V) -> Self::M;
    /// `m ? a : b`.
    fn select(&mut self, m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// `e^a`.
    fn exp(&mut self, a: Self::V) -> Self::V;
    /// `e^a - 1`, accurate near 0.
    fn expm1(&mut self, a: Self::V) -> Self::V;
    /// `ln(1 + a)`, accurate near 0.
    fn log1p(&mut self, a: Self::V) -> Self::V;
    /// `tanh(a)`.
    fn tanh(&mut self, a: Self::V) -> Self::V;
}

/// f64 arithmetic with Rust's std functions: the reference.
pub struct Exact;

impl FloatMath for Exact {
    type V = f64;
    type M = bool;
    fn lit(&mut self, c: f64) -> f64 {
        c
    }
    fn add(&mut self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn sub(&mut self, a: f64, b: f64) -> f64 {
        a - b
    }
    fn mul(&mut self, a: f64, b: f64) -> f64 {
        a * b
    }
    fn div(&mut self, a: f64, b: f64) -> f64 {
        a / b
    }
    fn neg(&mut self, a: f64) -> f64 {
        -a
    }
    fn abs(&mut self, a: f64) -> f64 {
        a.abs()
    }
    fn gt(&mut self, a: f64, b: f64) -> bool {
        a > b
    }
    fn is_nan(&mut self, a: f64) -> bool {
        a.is_nan()
    }
    fn select(&mut self, m: bool, a: f64, b: f64) -> f64 {
        if m { a } else { b }
    }
    fn exp(&mut self, a: f64) -> f64 {
        a.exp()
    }
    fn expm1(&mut self, a: f64) -> f64 {
        a.exp_m1()
    }
    fn log1p(&mut self, a: f64) -> f64 {
        a.ln_1p()
    }
    fn tanh(&mut self, a: f64) -> f64 {
        a.tanh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 formulas of the composite activations live in `smelt_rt::unary_f64` (eager
    /// kernels, the JIT's helpers and ahead-of-time models call them); the generic formula
    /// the code generators expand must give the same bits in exact f64 math.
    #[test]
    fn composites_in_exact_math_are_the_run_time_formulas() {
        use UnaryOp::*;
        let ops = [
            LeakyRelu {
                negative_slope: Real(0.2),
            },
            Elu { alpha: Real(1.5) },
            Softplus {
                beta: Real(2.0),
                threshold: Real(5.0),
            },
            Hardtanh {
                min_val: Real(-0.5),
                max_val: Real(2.0),
            },
            Hardswish,
            Mish,
            LogSigmoid,
        ];
        let mut xs: Vec<f64> = (-400..=400).map(|i| i as f64 * 0.0173).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-300,
            -1e-300,
            700.0,
            -745.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ]);
        for op in ops {
            for &x in &xs {
                let a = op.eval_f64(x);
                let b = op.composite(&mut Exact, x);
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{} at {x}: {a} from smelt-rt, {b} from the generic formula",
                    op.name()
                );
            }
        }
    }
}
