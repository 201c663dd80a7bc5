//! Pointwise methods and operators on `Tensor`: unary math, binary math and comparisons with
//! broadcasting and PyTorch's type promotion, `where`, `clamp`, `masked_fill`, `to_dtype`.
//!
//! Scalar arguments (`x.add_scalar(0.5)`, `&x * 0.5`) are Python numbers: they take part in
//! type promotion with the lowest priority, so `f16 * 0.5` stays f16, `i64 * 0.5` is f32 and
//! `i32 + 1` stays i32.

use crate::ir::dtype::Scalar;
use crate::ir::op::{BinaryOp, Op, UnaryOp};
use crate::ir::unary::Real;
use crate::runtime::tensor::{Tensor, apply};
use crate::{DType, Result};

/// A bound of [`Tensor::clamp`]: a Python number (`f64`, `i64`, `Scalar`) or an `Option` of
/// one (`None`: no bound on that side).
pub trait ClampBound {
    /// The bound, `None` for no bound.
    fn bound(self) -> Option<Scalar>;
}

macro_rules! clamp_bound {
    ($($t:ty),*) => {$(
        impl ClampBound for $t {
            fn bound(self) -> Option<Scalar> {
                Some(self.into())
            }
        }
        impl ClampBound for Option<$t> {
            fn bound(self) -> Option<Scalar> {
                self.map(Into::into)
            }
        }
    )*};
}

clamp_bound!(f64, i64, Scalar);

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Result<Tensor> {
            apply(Op::Unary($op), &[self])
        }
    )*};
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
            apply(Op::Binary(BinaryOp::$op), &[self, other])
        }
        /// The same with a Python number as the right operand.
        pub fn $scalar(&self, other: impl Into<Scalar>) -> Result<Tensor> {
            apply(Op::Binary(BinaryOp::$op), &[self, &Tensor::wrapped(other.into())])
        }
    )*};
}

impl Tensor {
    unary_methods! {
        /// `-x`; refused for bool tensors (use `logical_not`).
        neg => UnaryOp::Neg;
        /// `|x|`; integers wrap (`abs(i8::MIN)` is `i8::MIN`).
        abs => UnaryOp::Abs;
        /// `e^x`; integer inputs give f32.
        exp => UnaryOp::Exp;
        /// Natural logarithm; integer inputs give f32.
        log => UnaryOp::Log;
        /// `ln(1 + x)`, accurate near 0.
        log1p => UnaryOp::Log1p;
        /// `e^x - 1`, accurate near 0.
        expm1 => UnaryOp::Expm1;
        /// Square root (NaN below 0).
        sqrt => UnaryOp::Sqrt;
        /// `1 / sqrt(x)`.
        rsqrt => UnaryOp::Rsqrt;
        /// Sine.
        sin => UnaryOp::Sin;
        /// Cosine.
        cos => UnaryOp::Cos;
        /// Inverse sine (NaN outside [-1, 1]); integer inputs give f32.
        asin => UnaryOp::Asin;
        /// Inverse cosine (NaN outside [-1, 1]); integer inputs give f32.
        acos => UnaryOp::Acos;
        /// Inverse tangent; integer inputs give f32.
        atan => UnaryOp::Atan;
        /// Hyperbolic tangent.
        tanh => UnaryOp::Tanh;
        /// `1 / (1 + e^-x)`.
        sigmoid => UnaryOp::Sigmoid;
        /// `max(x, 0)`; NaN stays NaN; integers allowed.
        relu => UnaryOp::Relu;
        /// GELU in its exact form, `x * Φ(x)` (`approximate="none"`); see `gelu_tanh`.
        gelu => UnaryOp::Gelu { tanh: false };
        /// GELU with PyTorch's `approximate="tanh"` formula.
        gelu_tanh => UnaryOp::Gelu { tanh: true };
        /// The derivative of `gelu`, `Φ(x) + x·φ(x)`: what its gradient multiplies by.
        gelu_slope => UnaryOp::GeluSlope { tanh: false };
        /// The derivative of `gelu_tanh`.
        gelu_tanh_slope => UnaryOp::GeluSlope { tanh: true };
        /// `x * sigmoid(x)`.
        silu => UnaryOp::Silu;
        /// The error function.
        erf => UnaryOp::Erf;
        /// Rounds down; integers are returned unchanged.
        floor => UnaryOp::Floor;
        /// Rounds up; integers are returned unchanged.
        ceil => UnaryOp::Ceil;
        /// Rounds half to even (`round(2.5) == 2`).
        round => UnaryOp::Round;
        /// -1, 0 or 1 (0 for NaN).
        sign => UnaryOp::Sign;
        /// `1 / x`; integer inputs give f32.
        reciprocal => UnaryOp::Reciprocal;
        /// `x * x`; bool inputs give i64.
        square => UnaryOp::Square;
        /// Bool tensor: true where `x` is zero.
        logical_not => UnaryOp::LogicalNot;
        /// Bool tensor: true where `x` is NaN (never for integers).
        isnan => UnaryOp::IsNan;
        /// `~x` (`torch.bitwise_not`): every bit flipped; logical not for bool; floats refused.
        bitwise_not => UnaryOp::BitwiseNot;
        /// `x * clamp(x + 3, 0, 6) / 6` (`F.hardswish`); floats only.
        hardswish => UnaryOp::Hardswish;
        /// `x * tanh(softplus(x))` (`F.mish`); floats only.
        mish => UnaryOp::Mish;
        /// `log(sigmoid(x))` as `min(x, 0) - log1p(e^-|x|)` (`F.logsigmoid`); floats only.
        logsigmoid => UnaryOp::LogSigmoid;
    }

    /// `x > 0 ? x : negative_slope * x` (`F.leaky_relu`; PyTorch's default slope is 0.01).
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        let negative_slope = Real(negative_slope);
        apply(Op::Unary(UnaryOp::LeakyRelu { negative_slope }), &[self])
    }

    /// `x > 0 ? x : alpha * (e^x - 1)` (`F.elu`; PyTorch's default alpha is 1).
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        let alpha = Real(alpha);
        apply(Op::Unary(UnaryOp::Elu { alpha }), &[self])
    }

    /// `log(1 + e^(beta x)) / beta`, and `x` itself where `beta x > threshold` (`F.softplus`;
    /// PyTorch's defaults are beta 1 and threshold 20).
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        let (beta, threshold) = (Real(beta), Real(threshold));
        apply(Op::Unary(UnaryOp::Softplus { beta, threshold }), &[self])
    }

    /// `clamp(x, min_val, max_val)` with NaN kept (`F.hardtanh`; defaults -1 and 1).
    pub fn hardtanh(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        let (min_val, max_val) = (Real(min_val), Real(max_val));
        apply(Op::Unary(UnaryOp::Hardtanh { min_val, max_val }), &[self])
    }

    binary_methods! {
        /// `self + other`, broadcast.
        add, add_scalar => Add;
        /// `self - other`, broadcast; refused for two bool operands.
        sub, sub_scalar => Sub;
        /// `self * other`, broadcast.
        mul, mul_scalar => Mul;
        /// True division: integer operands give f32.
        div, div_scalar => Div;
        /// `self ** other`. An integer tensor to a negative Python-int power is refused.
        pow, pow_scalar => Pow;
        /// Elementwise maximum; NaN wins.
        maximum, maximum_scalar => Maximum;
        /// Elementwise minimum; NaN wins.
        minimum, minimum_scalar => Minimum;
        /// Python's `%`: the result has the divisor's sign; integer division by 0 is refused.
        remainder, remainder_scalar => Remainder;
        /// `torch.floor_divide` (`torch.div(.., rounding_mode="floor")`): the quotient rounded
        /// down, in the common dtype (Python's `//`); integer division by 0 is refused.
        floor_divide, floor_divide_scalar => DivFloor;
        /// `torch.div(.., rounding_mode="trunc")`: the quotient rounded toward zero, in the
        /// common dtype; integer division by 0 is refused.
        div_trunc, div_trunc_scalar => DivTrunc;
        /// Bool tensor of `self == other`, compared in the promoted dtype.
        eq, eq_scalar => Eq;
        /// Bool tensor of `self != other`.
        ne, ne_scalar => Ne;
        /// Bool tensor of `self < other`.
        lt, lt_scalar => Lt;
        /// Bool tensor of `self <= other`.
        le, le_scalar => Le;
        /// Bool tensor of `self > other`.
        gt, gt_scalar => Gt;
        /// Bool tensor of `self >= other`.
        ge, ge_scalar => Ge;
        /// Bool tensor: both nonzero.
        logical_and, logical_and_scalar => LogicalAnd;
        /// Bool tensor: either nonzero.
        logical_or, logical_or_scalar => LogicalOr;
        /// `torch.bitwise_and`: integers and bools, broadcast; floats refused.
        bitwise_and, bitwise_and_scalar => BitwiseAnd;
        /// `torch.bitwise_or`: integers and bools, broadcast; floats refused.
        bitwise_or, bitwise_or_scalar => BitwiseOr;
        /// `torch.bitwise_xor`: integers and bools, broadcast; floats refused.
        bitwise_xor, bitwise_xor_scalar => BitwiseXor;
    }

    /// `torch.add(self, other, alpha=alpha)`: `self + alpha * other`. As PyTorch, a float
    /// `alpha` is refused for integer tensors and a bool one for non-bool tensors.
    pub fn add_alpha(&self, other: &Tensor, alpha: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_alpha(BinaryOp::Add, other, alpha.into())
    }

    /// `torch.sub(self, other, alpha=alpha)`: `self - alpha * other`.
    pub fn sub_alpha(&self, other: &Tensor, alpha: impl Into<Scalar>) -> Result<Tensor> {
        self.binary_alpha(BinaryOp::Sub, other, alpha.into())
    }

    fn binary_alpha(&self, op: BinaryOp, other: &Tensor, alpha: Scalar) -> Result<Tensor> {
        let common = BinaryOp::Add.compute_dtype(&self.ttype(), &other.ttype())?;
        crate::ir::op::check_alpha(alpha, common)?;
        let scaled = if alpha.to_f64() == 1.0 {
            other.clone()
        } else {
            other.mul_scalar(alpha)?
        };
        apply(Op::Binary(op), &[self, &scaled])
    }

    /// `s - self` (PyTorch's `rsub`).
    pub fn rsub_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        apply(
            Op::Binary(BinaryOp::Sub),
            &[&Tensor::wrapped(s.into()), self],
        )
    }

    /// `s / self`.
    pub fn rdiv_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        apply(
            Op::Binary(BinaryOp::Div),
            &[&Tensor::wrapped(s.into()), self],
        )
    }

    /// `s ** self`.
    pub fn rpow_scalar(&self, s: impl Into<Scalar>) -> Result<Tensor> {
        apply(
            Op::Binary(BinaryOp::Pow),
            &[&Tensor::wrapped(s.into()), self],
        )
    }

    /// `torch.where(cond, x, y)`: `x` where `cond` (a bool tensor) is true, else `y`; all three
    /// broadcast, the dtype is `result_type(x, y)`. Pass `&Tensor::wrapped(s)` for a Python
    /// number branch, or use `where_scalar`.
    pub fn where_cond(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        apply(Op::Where, &[cond, x, y])
    }

    /// `torch.where(cond, x, y)` with `y` a Python number.
    pub fn where_scalar(cond: &Tensor, x: &Tensor, y: impl Into<Scalar>) -> Result<Tensor> {
        apply(Op::Where, &[cond, x, &Tensor::wrapped(y.into())])
    }

    /// `torch.clamp(x, min, max)`: `x.clamp(0.0, 6.0)`, or with `Option`s for one-sided
    /// bounds (or `clamp_min`/`clamp_max`); at least one bound; NaN elements stay NaN; a
    /// bound converts to the result dtype, `result_type(x, min, max)`.
    pub fn clamp(&self, min: impl ClampBound, max: impl ClampBound) -> Result<Tensor> {
        let (min, max) = (min.bound(), max.bound());
        apply(Op::Clamp { min, max }, &[self])
    }

    /// `clamp(min=s)`.
    pub fn clamp_min(&self, min: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(Some(min.into()), None::<Scalar>)
    }

    /// `clamp(max=s)`.
    pub fn clamp_max(&self, max: impl Into<Scalar>) -> Result<Tensor> {
        self.clamp(None::<Scalar>, Some(max.into()))
    }

    /// `value` where the bool `mask` is true, else `self`; the shapes broadcast.
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        apply(
            Op::MaskedFill {
                value: value.into(),
            },
            &[self, mask],
        )
    }

    /// `x.to(dtype)` with PyTorch's cast rules; `self` itself when the dtype already matches.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        apply(Op::To { dtype }, &[self])
    }
}

/// The result of an operator: operators cannot return errors, so they panic with the message
/// the corresponding method returns as `Err`.
fn or_panic(r: Result<Tensor>) -> Tensor {
    match r {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn binary_op(op: BinaryOp, a: &Tensor, b: &Tensor) -> Tensor {
    or_panic(apply(Op::Binary(op), &[a, b]))
}

// Arithmetic operators on tensors and Python numbers (f64 and i64, on either side: Python's
// float and int, one impl each, so that a literal infers: `&w * 3.0`, `&w + 1`). They panic
// where the corresponding method (`add`, `sub`, ...) returns Err.
macro_rules! binary_operator {
    ($Trait:ident, $method:ident, $op:ident) => {
        binary_operator!(@tensors $Trait, $method, $op, [Tensor, &Tensor], [Tensor, &Tensor]);
        binary_operator!(@scalars $Trait, $method, $op, [f64, i64]);
    };
    (@tensors $Trait:ident, $method:ident, $op:ident, [$($L:ty),*], $R:tt) => {$(
        binary_operator!(@pair $Trait, $method, $op, $L, $R);
    )*};
    (@pair $Trait:ident, $method:ident, $op:ident, $L:ty, [$($R:ty),*]) => {$(
        /// Panics where the method of the same name returns Err.
        impl std::ops::$Trait<$R> for $L {
            type Output = Tensor;
            fn $method(self, rhs: $R) -> Tensor {
                binary_op(BinaryOp::$op, &self, &rhs)
            }
        }
    )*};
    (@scalars $Trait:ident, $method:ident, $op:ident, [$($S:ty),*]) => {$(
        /// Panics where the method of the same name returns Err.
        impl std::ops::$Trait<$S> for &Tensor {
            type Output = Tensor;
            fn $method(self, rhs: $S) -> Tensor {
                binary_op(BinaryOp::$op, self, &Tensor::wrapped(rhs.into()))
            }
        }
        /// Panics where the method of the same name returns Err.
        impl std::ops::$Trait<$S> for Tensor {
            type Output = Tensor;
            fn $method(self, rhs: $S) -> Tensor {
                binary_op(BinaryOp::$op, &self, &Tensor::wrapped(rhs.into()))
            }
        }
        /// Panics where the method of the same name returns Err.
        impl std::ops::$Trait<&Tensor> for $S {
            type Output = Tensor;
            fn $method(self, rhs: &Tensor) -> Tensor {
                binary_op(BinaryOp::$op, &Tensor::wrapped(self.into()), rhs)
            }
        }
        /// Panics where the method of the same name returns Err.
        impl std::ops::$Trait<Tensor> for $S {
            type Output = Tensor;
            fn $method(self, rhs: Tensor) -> Tensor {
                binary_op(BinaryOp::$op, &Tensor::wrapped(self.into()), &rhs)
            }
        }
    )*};
}

binary_operator!(Add, add, Add);
binary_operator!(Sub, sub, Sub);
binary_operator!(Mul, mul, Mul);
binary_operator!(Div, div, Div);
binary_operator!(Rem, rem, Remainder);

// `-x`; panics where `Tensor::neg` returns Err (bool tensors).
impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        or_panic(apply(Op::Unary(UnaryOp::Neg), &[self]))
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        -&self
    }
}

// `!x`: PyTorch's `~x`, bitwise not (logical not for bool); panics for float tensors.
impl std::ops::Not for &Tensor {
    type Output = Tensor;
    fn not(self) -> Tensor {
        or_panic(apply(Op::Unary(UnaryOp::BitwiseNot), &[self]))
    }
}

impl std::ops::Not for Tensor {
    type Output = Tensor;
    fn not(self) -> Tensor {
        !&self
    }
}

// `a & b`, `a | b`, `a ^ b`: PyTorch's bitwise ops (the logical ones for two bool tensors,
// which give the same values); panic for floats and where the methods return Err.
macro_rules! bitwise_operator {
    ($Trait:ident, $method:ident, $logical:ident, $bitwise:ident) => {
        bitwise_operator!(@pair $Trait, $method, $logical, $bitwise, Tensor, [Tensor, &Tensor]);
        bitwise_operator!(@pair $Trait, $method, $logical, $bitwise, &Tensor, [Tensor, &Tensor]);
    };
    (@pair $Trait:ident, $method:ident, $logical:ident, $bitwise:ident, $L:ty, [$($R:ty),*]) => {$(
        impl std::ops::$Trait<$R> for $L {
            type Output = Tensor;
            fn $method(self, rhs: $R) -> Tensor {
                let (a, b): (&Tensor, &Tensor) = (&self, &rhs);
                let both_bool = a.dtype() == DType::Bool && b.dtype() == DType::Bool;
                let op = if both_bool { BinaryOp::$logical } else { BinaryOp::$bitwise };
                binary_op(op, a, b)
            }
        }
    )*};
}

bitwise_operator!(BitAnd, bitand, LogicalAnd, BitwiseAnd);
bitwise_operator!(BitOr, bitor, LogicalOr, BitwiseOr);
bitwise_operator!(BitXor, bitxor, Ne, BitwiseXor);
