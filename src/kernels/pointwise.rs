//! Pointwise kernels: unary math, binary math and comparisons, `where`, `clamp`, `masked_fill`.
//!
//! Every op is written once per dtype class as a scalar function: floats compute in f64 and
//! round once to the output dtype, integers compute in i64 with wrapping. `specialise!` turns
//! the runtime op into a constant before the loop, so each loop sees a known op, the `match`
//! inside the scalar function folds away, and contiguous loops run on the strided engine's
//! slice path where LLVM vectorises them. Operands are converted to the op's computation dtype
//! first (a wrapped Python number is thereby rounded to it, as in PyTorch).

use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{
    BinaryOp, Op, TensorType, UnaryOp, div_floor_float, div_floor_int, div_trunc_int,
};
use crate::ir::unary::{DTypeClass, WithFormula};
use crate::kernels::copy;
use crate::kernels::creation::scalar_to;
use crate::layout::check_no_overlap;
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::tensor::element::{Element, round_to_dtype};
use crate::tensor::strided::{Walk, map1, map2, map3};
use crate::{Error, Result, bail, dispatch, dispatch_float, dispatch_int};
use smelt_rt::scalar::pow_int as pow_i64;
use std::marker::PhantomData;

/// Evaluates `$body` with `$c` a constant equal to `$op`, one arm per listed variant, so the
/// code inside each loop is compiled for one known op. Unlisted variants are an error.
macro_rules! specialise {
    ($op:expr, $E:ident [$($v:ident $({ $f:ident: $val:literal })?),* $(,)?], $c:ident => $body:expr) => {
        match $op {
            $($E::$v $({ $f: $val })? => {
                const $c: $E = $E::$v $({ $f: $val })?;
                $body
            })*
            #[allow(unreachable_patterns)]
            other => Err(misrouted(other.name())),
        }
    };
}

fn misrouted(name: &str) -> Error {
    Error::Unsupported(format!("pointwise kernel: no {name} loop for these dtypes"))
}

/// The result's memory: channels_last when a full-size operand is (PyTorch keeps the
/// memory format through pointwise ops, so a channels_last network stays NHWC), else
/// contiguous.
fn alloc_like(inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let nhwc = out.shape.len() == 4
        && inputs.iter().any(|t| {
            t.shape() == &out.shape[..]
                && !t.is_contiguous()
                && super::conv::is_channels_last(t.shape(), t.strides())
        });
    if !nhwc {
        return Tensor::alloc_for_overwrite(out.dtype, &out.shape);
    }
    let s = &out.shape;
    let t = Tensor::alloc_for_overwrite(out.dtype, &[s[0], s[2], s[3], s[1]])?;
    Ok(t.with_layout(t.layout().permute(&[0, 3, 1, 2])))
}

/// Runs pointwise `op` into a new tensor of type `out` (the op's inferred result type).
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let dst = alloc_like(inputs, out)?;
    write(op, inputs, &dst)?;
    Ok(dst)
}

/// Writes the result of pointwise `op` on `inputs` into the existing tensor `dst`: the kernel
/// behind in-place ops (`x.add_(y)`) and `out=` arguments.
///
/// - `dst` must have the op's broadcast output shape, else PyTorch's "output with shape ...
///   doesn't match the broadcast shape ..." error; it may be any strided view without internal
///   overlap (an expanded `dst` is refused).
/// - The op computes in its own result dtype (`Op::infer`); when `dst` has another dtype the
///   result is converted to it, as PyTorch's in-place ops do. Whether that cast is allowed
///   (PyTorch refuses float results into integer tensors) is for the caller to decide.
/// - `dst` may share storage with inputs. An input with exactly `dst`'s layout is read in place
///   (each element is read before it is written); an input overlapping `dst` in any other way
///   is copied first, so every element reads the old values.
/// - Bumps `dst`'s version counter. On error nothing has been written.
pub fn eval_into(op: &Op, inputs: &[&Tensor], dst: &Tensor) -> Result<()> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ttype()).collect();
    let out = op.infer(&types.iter().collect::<Vec<_>>())?;
    if dst.shape() != out.shape.as_slice() {
        bail!(
            Shape,
            "output with shape {:?} doesn't match the broadcast shape {:?}",
            dst.shape(),
            out.shape
        );
    }
    check_no_overlap(dst.layout())?;
    let safe: Vec<Tensor> = inputs
        .iter()
        .map(|&t| {
            if overlaps_differently(t, dst) {
                copy::cast_new(t, t.dtype())
            } else {
                Ok(t.clone())
            }
        })
        .collect::<Result<_>>()?;
    let safe: Vec<&Tensor> = safe.iter().collect();
    if dst.dtype() == out.dtype {
        write(op, &safe, dst)?;
    } else {
        let tmp = Tensor::alloc(out.dtype, &out.shape)?;
        write(op, &safe, &tmp)?;
        copy::copy_into(dst, &tmp);
    }
    dst.storage().bump_version();
    Ok(())
}

/// True when `t` shares memory with `dst` other than element for element.
fn overlaps_differently(t: &Tensor, dst: &Tensor) -> bool {
    let (a, b) = (t.layout(), dst.layout());
    t.shares_storage(dst)
        && a != b
        && a.numel() > 0
        && b.numel() > 0
        && a.offset < b.extent()
        && b.offset < a.extent()
}

/// Runs the kernel of `op` into `dst`, whose dtype is the op's result dtype.
fn write(op: &Op, inputs: &[&Tensor], dst: &Tensor) -> Result<()> {
    match (op, inputs) {
        (Op::Unary(u), [x]) => unary(*u, x, dst),
        (Op::Binary(b), [x, y]) => binary(*b, x, y, dst),
        (Op::Where, [c, x, y]) => where_(c, x, y, dst),
        (Op::Clamp { min, max }, [x]) => clamp(x, *min, *max, dst),
        (Op::MaskedFill { value }, [x, m]) => masked_fill(x, m, *value, dst),
        (Op::To { .. }, [x]) => {
            copy::copy_into(dst, x);
            Ok(())
        }
        _ => bail!(
            Value,
            "{}: not a pointwise op with {} operands",
            op.name(),
            inputs.len()
        ),
    }
}

// ---- loops ----------------------------------------------------------------------------------

/// Refuses a typed view of a tensor that does not match its dtype or the output shape: the
/// guard in front of every raw access below.
fn check_operand<T: Element>(t: &Tensor, out: &[usize]) -> Result<()> {
    if t.dtype() != T::DTYPE {
        bail!(
            Unsupported,
            "pointwise kernel: a {} operand read as {}",
            t.dtype(),
            T::DTYPE
        );
    }
    let lead = out.len().checked_sub(t.dim());
    let fits = lead.is_some_and(|lead| {
        t.shape()
            .iter()
            .enumerate()
            .all(|(i, &s)| s == 1 || s == out[lead + i])
    });
    if !fits {
        bail!(
            Shape,
            "pointwise kernel: shape {:?} does not broadcast to {out:?}",
            t.shape()
        );
    }
    Ok(())
}

/// `dst = f(a)` with `a` broadcast to `dst`.
fn run1<A: Element, O: Element>(dst: &Tensor, a: &Tensor, f: impl Fn(A) -> O + Sync) -> Result<()> {
    check_operand::<O>(dst, dst.shape())?;
    check_operand::<A>(a, dst.shape())?;
    let sa = a.layout().broadcast_strides(dst.shape());
    let acc = access::lock(&[a], &[dst]);
    // SAFETY: dtypes and shapes were checked, so every index lies inside its operand's
    // layout, which lies inside its storage; `dst` has no internal overlap; an input
    // sharing `dst`'s storage has exactly its layout, so each element is read before it is
    // written. (run2 and run3 refer to this comment.)
    unsafe {
        map1(
            dst.shape(),
            (acc.write::<O>(0), dst.strides()),
            (acc.read::<A>(0), &sa),
            f,
        )
    };
    Ok(())
}

/// `dst = f(a, b)` with both broadcast to `dst`.
fn run2<A: Element, B: Element, O: Element>(
    dst: &Tensor,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, B) -> O + Sync,
) -> Result<()> {
    check_operand::<O>(dst, dst.shape())?;
    check_operand::<A>(a, dst.shape())?;
    check_operand::<B>(b, dst.shape())?;
    let (sa, sb) = (
        a.layout().broadcast_strides(dst.shape()),
        b.layout().broadcast_strides(dst.shape()),
    );
    let acc = access::lock(&[a, b], &[dst]);
    // SAFETY: as in `run1`.
    unsafe {
        map2(
            dst.shape(),
            (acc.write::<O>(0), dst.strides()),
            (acc.read::<A>(0), &sa),
            (acc.read::<B>(1), &sb),
            f,
        )
    };
    Ok(())
}

/// `dst = f(a, b, c)` with all three broadcast to `dst`.
fn run3<A: Element, B: Element, C: Element, O: Element>(
    dst: &Tensor,
    [a, b, c]: [&Tensor; 3],
    f: impl Fn(A, B, C) -> O + Sync,
) -> Result<()> {
    check_operand::<O>(dst, dst.shape())?;
    check_operand::<A>(a, dst.shape())?;
    check_operand::<B>(b, dst.shape())?;
    check_operand::<C>(c, dst.shape())?;
    let s: [Vec<usize>; 3] = [a, b, c].map(|t| t.layout().broadcast_strides(dst.shape()));
    let acc = access::lock(&[a, b, c], &[dst]);
    // SAFETY: as in `run1`.
    unsafe {
        map3(
            dst.shape(),
            (acc.write::<O>(0), dst.strides()),
            (acc.read::<A>(0), &s[0]),
            (acc.read::<B>(1), &s[1]),
            (acc.read::<C>(2), &s[2]),
            f,
        )
    };
    Ok(())
}

/// True if some element of `t` satisfies `pred`.
fn any_elem<T: Element>(t: &Tensor, pred: impl Fn(T) -> bool) -> Result<bool> {
    check_operand::<T>(t, t.shape())?;
    let acc = access::lock(&[t], &[]);
    let p = acc.read::<T>(0);
    let mut found = false;
    Walk::new(t.shape(), [t.strides()]).run_range(0, t.numel(), &mut |[base], len, [s]| {
        for i in 0..len {
            // SAFETY: the walk stays inside `t`'s layout, which lies inside its storage.
            found |= pred(unsafe { *p.add(base + i * s) });
        }
    });
    Ok(found)
}

// ---- unary ----------------------------------------------------------------------------------

fn unary(op: UnaryOp, x: &Tensor, dst: &Tensor) -> Result<()> {
    if op.dtype_class() == DTypeClass::Predicate {
        return dispatch!(x.dtype(), T => unary_pred::<T>(op, x, dst));
    }
    // `~` of a bool is its logical not
    if op == UnaryOp::BitwiseNot && x.dtype() == DType::Bool {
        return unary_pred::<bool>(UnaryOp::LogicalNot, x, dst);
    }
    // The result dtype is the computation dtype (`exp(int)` computes in f32).
    let d = dst.dtype();
    let x = copy::cast(x, d)?;
    if crate::kernels::native::unary_f32(op, &x, dst).is_some() {
        return Ok(());
    }
    dispatch_float!(d, T => op.with_formula(FloatLoop::<T> { x: &x, dst, t: PhantomData }),
    else if op.eval_i64(0).is_some() {
        dispatch_int!(d, T => unary_int::<T>(op, &x, dst), else Err(misrouted(op.name())))
    } else {
        Err(misrouted(op.name()))
    })
}

/// The eager loop of a float unary op: `dst = f(x)` with `f` the op's reference formula.
struct FloatLoop<'a, T> {
    x: &'a Tensor,
    dst: &'a Tensor,
    t: PhantomData<T>,
}

impl<T: Element> WithFormula<Result<()>> for FloatLoop<'_, T> {
    fn apply<F: Fn(f64) -> f64 + Copy + Send + Sync>(self, f: F) -> Result<()> {
        run1(self.dst, self.x, move |v: T| T::from_f64(f(v.to_f64())))
    }
}

fn unary_int<T: Element>(op: UnaryOp, x: &Tensor, dst: &Tensor) -> Result<()> {
    // integers are already whole
    if matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round) {
        copy::copy_into(dst, x);
        return Ok(());
    }
    specialise!(op, UnaryOp[Neg, Abs, Relu, Sign, Square, BitwiseNot], OP =>
        run1(dst, x, |v: T| T::from_i64(OP.eval_i64(v.to_i64()).unwrap_or(0))))
}

fn unary_pred<T: Element>(op: UnaryOp, x: &Tensor, dst: &Tensor) -> Result<()> {
    specialise!(op, UnaryOp[LogicalNot, IsNan], OP => run1(dst, x, |v: T| {
        let float = T::DTYPE.is_float();
        let x = if float { v.to_f64() } else { v.to_i64() as f64 };
        OP.eval_pred(x, float).unwrap_or(false)
    }))
}

// ---- binary ---------------------------------------------------------------------------------

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, dst: &Tensor) -> Result<()> {
    use BinaryOp::*;
    let c = op.compute_dtype(&a.ttype(), &b.ttype())?;
    // PyTorch refuses `int_tensor ** -2` (a Python int exponent), not a tensor exponent.
    if op == Pow && !c.is_float() && b.is_wrapped_number() && copy::to_i64_vec(b).first() < Some(&0)
    {
        bail!(
            Value,
            "Integers to negative integer powers are not allowed."
        );
    }
    let (a, b) = (copy::cast(a, c)?, copy::cast(b, c)?);
    if matches!(op, Remainder | DivFloor | DivTrunc)
        && !c.is_float()
        && dst.numel() > 0
        && dispatch!(c, T => any_elem::<T>(&b, |v| v.to_i64() == 0))?
    {
        bail!(Value, "ZeroDivisionError");
    }
    if op.is_comparison() || op.is_logical() {
        return dispatch!(c, T => binary_pred::<T>(op, &a, &b, dst));
    }
    dispatch_float!(c, T => binary_float::<T>(op, &a, &b, dst),
        else dispatch_int!(c, T => binary_int::<T>(op, &a, &b, dst), else Err(misrouted(op.name()))))
}

fn binary_float<T: Element>(op: BinaryOp, a: &Tensor, b: &Tensor, dst: &Tensor) -> Result<()> {
    use BinaryOp::*;
    // rounding divisions round their quotient in the dtype (f32 for halves, as PyTorch's
    // CPU kernels compute them), not in f64: trunc(1 / 0.1) is 10 in f32, 9 in f64
    let wide = T::DTYPE == DType::F64;
    match op {
        DivTrunc if wide => {
            return run2(dst, a, b, |x: T, y: T| {
                T::from_f64((x.to_f64() / y.to_f64()).trunc())
            });
        }
        DivTrunc => {
            return run2(dst, a, b, |x: T, y: T| {
                T::from_f64(f64::from((x.to_f64() as f32 / y.to_f64() as f32).trunc()))
            });
        }
        DivFloor if wide => {
            return run2(dst, a, b, |x: T, y: T| {
                T::from_f64(div_floor_float(x.to_f64(), y.to_f64()))
            });
        }
        DivFloor => {
            return run2(dst, a, b, |x: T, y: T| {
                T::from_f64(f64::from(div_floor_float(
                    x.to_f64() as f32,
                    y.to_f64() as f32,
                )))
            });
        }
        _ => {}
    }
    specialise!(op, BinaryOp[Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder], OP =>
        run2(dst, a, b, |x: T, y: T| T::from_f64(binary_f64(OP, x.to_f64(), y.to_f64()))))
}

fn binary_int<T: Element>(op: BinaryOp, a: &Tensor, b: &Tensor, dst: &Tensor) -> Result<()> {
    specialise!(op, BinaryOp[Add, Sub, Mul, Pow, Maximum, Minimum, Remainder, DivFloor, DivTrunc,
            BitwiseAnd, BitwiseOr, BitwiseXor], OP =>
        run2(dst, a, b, |x: T, y: T| T::from_i64(binary_i64(OP, x.to_i64(), y.to_i64()))))
}

fn binary_pred<T: Element>(op: BinaryOp, a: &Tensor, b: &Tensor, dst: &Tensor) -> Result<()> {
    specialise!(op, BinaryOp[Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr], OP =>
    run2(dst, a, b, |x: T, y: T| if T::DTYPE.is_float() {
        compare(OP, x.to_f64(), y.to_f64())
    } else {
        compare(OP, x.to_i64(), y.to_i64())
    }))
}

/// C++'s `std::max` with NaN propagated, as `torch.maximum`.
#[inline(always)]
pub(crate) fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b {
        b
    } else {
        a
    }
}

/// C++'s `std::min` with NaN propagated, as `torch.minimum`.
#[inline(always)]
fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if b < a {
        b
    } else {
        a
    }
}

/// A float binary op on one pair of values.
#[inline(always)]
fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    use BinaryOp::*;
    match op {
        Add => a + b,
        Sub => a - b,
        Mul => a * b,
        Div => a / b,
        Pow => a.powf(b),
        Maximum => max_nan(a, b),
        Minimum => min_nan(a, b),
        // Python's `%`: the result takes the divisor's sign
        Remainder => {
            let r = a % b;
            if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                r + b
            } else {
                r
            }
        }
        // in the operands' precision: see `binary_float`
        DivFloor => div_floor_float(a, b),
        DivTrunc => (a / b).trunc(),
        // bool-valued: see `compare`; bitwise ops refuse floats
        Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr
        | BitwiseXor => f64::NAN,
    }
}

/// An integer binary op on one pair of values, wrapping on overflow. Division is never
/// integral (`div` computes in floats); a zero divisor was refused before the loop.
#[inline(always)]
fn binary_i64(op: BinaryOp, a: i64, b: i64) -> i64 {
    use BinaryOp::*;
    match op {
        Add => a.wrapping_add(b),
        Sub => a.wrapping_sub(b),
        Mul => a.wrapping_mul(b),
        Pow => pow_i64(a, b),
        Maximum => a.max(b),
        Minimum => a.min(b),
        DivFloor => div_floor_int(a, b),
        DivTrunc => div_trunc_int(a, b),
        Remainder => {
            if b == 0 {
                return 0;
            }
            let r = a.wrapping_rem(b);
            if r != 0 && ((r < 0) != (b < 0)) {
                r.wrapping_add(b)
            } else {
                r
            }
        }
        BitwiseAnd => a & b,
        BitwiseOr => a | b,
        BitwiseXor => a ^ b,
        _ => 0,
    }
}

/// Comparisons and logical ops on one pair of values (nonzero is true, NaN included).
#[inline(always)]
fn compare<V: PartialOrd + Default>(op: BinaryOp, a: V, b: V) -> bool {
    use BinaryOp::*;
    match op {
        Eq => a == b,
        Ne => a != b,
        Lt => a < b,
        Le => a <= b,
        Gt => a > b,
        Ge => a >= b,
        LogicalAnd => a != V::default() && b != V::default(),
        LogicalOr => a != V::default() || b != V::default(),
        _ => false,
    }
}

// ---- where, clamp, masked_fill ------------------------------------------------------------

fn where_(cond: &Tensor, x: &Tensor, y: &Tensor, dst: &Tensor) -> Result<()> {
    let d = dst.dtype();
    let (x, y) = (copy::cast(x, d)?, copy::cast(y, d)?);
    dispatch!(d, T => run3(dst, [cond, &x, &y], |c: bool, a: T, b: T| if c { a } else { b }))
}

fn clamp(x: &Tensor, min: Option<Scalar>, max: Option<Scalar>, dst: &Tensor) -> Result<()> {
    let d = dst.dtype();
    for s in [min, max].into_iter().flatten() {
        check_fits(s, d)?;
    }
    let x = copy::cast(x, d)?;
    if d.is_float() {
        let bound =
            |s: Option<Scalar>, none: f64| s.map_or(none, |s| round_to_dtype(s.to_f64(), d));
        let (lo, hi) = (bound(min, f64::NEG_INFINITY), bound(max, f64::INFINITY));
        if min.is_some() && max.is_some() && (lo.is_nan() || hi.is_nan()) {
            // PyTorch: a NaN bound, when both are given, makes every element NaN
            return dispatch_float!(d, T => run1(dst, &x, |_: T| T::from_f64(f64::NAN)),
                else Err(misrouted("clamp")));
        }
        // `min(max(x, lo), hi)` with C++'s std::max/min: a NaN `x` stays NaN, and a lone
        // NaN bound leaves `x` as it is, as in PyTorch
        dispatch_float!(d, T => run1(dst, &x, move |v: T| {
            let v = v.to_f64();
            let v = if v < lo { lo } else { v };
            T::from_f64(if hi < v { hi } else { v })
        }), else Err(misrouted("clamp")))
    } else {
        dispatch_int!(d, T => {
            let lo = min.map_or(i64::MIN, |s| scalar_to::<T>(s).to_i64());
            let hi = max.map_or(i64::MAX, |s| scalar_to::<T>(s).to_i64());
            run1(dst, &x, move |v: T| T::from_i64(v.to_i64().max(lo).min(hi)))
        }, else Err(misrouted("clamp")))
    }
}

fn masked_fill(x: &Tensor, mask: &Tensor, value: Scalar, dst: &Tensor) -> Result<()> {
    let d = dst.dtype();
    check_fits(value, d)?;
    let x = copy::cast(x, d)?;
    dispatch!(d, T => {
        let v = scalar_to::<T>(value);
        run2(dst, &x, mask, move |a: T, m: bool| if m { v } else { a })
    })
}

/// PyTorch's check when a scalar argument is converted to a tensor's dtype (`clamp` bounds,
/// `masked_fill` values): out-of-range values are refused; u8 accepts -255..=255 (wrapping).
fn check_fits(s: Scalar, d: DType) -> Result<()> {
    let max_float = |d: DType| match d {
        DType::F16 => 65504.0,
        DType::BF16 => 3.389_531_389_251_535_5e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    };
    let int_range = |d: DType| -> (i64, i64) {
        match d {
            DType::U8 => (0, 255),
            DType::I8 => (-128, 127),
            DType::I16 => (-32768, 32767),
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            _ => (i64::MIN, i64::MAX),
        }
    };
    let fits = match s {
        _ if d == DType::Bool => true,
        Scalar::Bool(_) => true,
        Scalar::Float(f) if d.is_float() => !f.is_finite() || f.abs() <= max_float(d),
        Scalar::Float(f) => {
            let (lo, hi) = int_range(d);
            f >= lo as f64 && f <= hi as f64
        }
        Scalar::Int(i) if d.is_float() => (i as f64).abs() <= max_float(d),
        Scalar::Int(i) if d == DType::U8 => (-255..=255).contains(&i),
        Scalar::Int(i) => {
            let (lo, hi) = int_range(d);
            (lo..=hi).contains(&i)
        }
    };
    if !fits {
        let name = match d {
            DType::U8 => "uint8_t",
            DType::I8 => "int8_t",
            DType::I16 => "int16_t",
            DType::I32 => "int",
            DType::I64 => "int64_t",
            DType::F16 => "at::Half",
            DType::BF16 => "at::BFloat16",
            DType::F32 => "float",
            DType::F64 => "double",
            DType::Bool => "bool",
        };
        bail!(
            Value,
            "value cannot be converted to type {name} without overflow"
        );
    }
    Ok(())
}
