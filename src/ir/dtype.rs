//! Element types and PyTorch's type-promotion rules.

use std::fmt;

/// The element type of a tensor. `I16` exists because PyTorch promotes `u8` with `i8` to it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum DType {
    /// `torch.bool`.
    Bool,
    /// `torch.uint8`.
    U8,
    /// `torch.int8`.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.int32`.
    I32,
    /// `torch.int64` (`long`), the default integer dtype.
    I64,
    /// `torch.float16` (IEEE half precision).
    F16,
    /// `torch.bfloat16` (brain float: f32's exponent, 8-bit mantissa).
    BF16,
    /// `torch.float32`, the default floating dtype.
    F32,
    /// `torch.float64`.
    F64,
}

/// The default floating dtype (`torch.get_default_dtype()`).
pub const DEFAULT_FLOAT: DType = DType::F32;

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether this is a floating-point dtype (`f16`, `bf16`, `f32`, `f64`).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Integral in PyTorch's sense, bool excluded.
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64
        )
    }

    /// Whether this is `bool`.
    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// The name used in `.smelt` text and error messages (`f32`, `i64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// The name PyTorch prints (`torch.float16`), used in reprs and messages.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Bool => "torch.bool",
            DType::U8 => "torch.uint8",
            DType::I8 => "torch.int8",
            DType::I16 => "torch.int16",
            DType::I32 => "torch.int32",
            DType::I64 => "torch.int64",
            DType::F16 => "torch.float16",
            DType::BF16 => "torch.bfloat16",
            DType::F32 => "torch.float32",
            DType::F64 => "torch.float64",
        }
    }

    /// PyTorch's kernel-dispatch name (`Float`, `Long`), as in "not implemented for 'Long'".
    pub fn scalar_name(self) -> &'static str {
        match self {
            DType::Bool => "Bool",
            DType::U8 => "Byte",
            DType::I8 => "Char",
            DType::I16 => "Short",
            DType::I32 => "Int",
            DType::I64 => "Long",
            DType::F16 => "Half",
            DType::BF16 => "BFloat16",
            DType::F32 => "Float",
            DType::F64 => "Double",
        }
    }

    /// The dtype whose `.smelt` name ([`DType::name`]) is `s`.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// `torch.promote_types`.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (Bool, x) | (x, Bool) => x,
            (F16, BF16) | (BF16, F16) => F32,
            (x, y) if x.is_float() && y.is_float() => x.max(y),
            (x, _) if x.is_float() => x,
            (_, y) if y.is_float() => y,
            // both integral: u8 is the only unsigned type
            (U8, I8) | (I8, U8) => I16,
            (x, y) => x.max(y),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Python-style scalar: the "wrapped number" of PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Scalar {
    /// A Python `bool`.
    Bool(bool),
    /// A Python `int`.
    Int(i64),
    /// A Python `float`.
    Float(f64),
}

impl Scalar {
    /// The dtype a wrapped number takes part in promotion with.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DEFAULT_FLOAT,
        }
    }

    /// The value as `f64` (`true` is 1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// Integer value; floats truncate toward zero as a C cast does.
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        }
    }

    /// Whether this is a `Float`.
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => fmt_float(*x, f),
        }
    }
}

/// Prints a float so that it reads back as the same float and as a float (`1.0`, not `1`).
pub fn fmt_float(x: f64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if x.is_nan() {
        f.write_str("nan")
    } else if x.is_infinite() {
        f.write_str(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        let s = format!("{x:?}");
        f.write_str(&s)
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar { fn from(x: $t) -> Scalar { Scalar::$v(x as $c) } }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64,
    u8 => Int as i64, i8 => Int as i64, i16 => Int as i64, usize => Int as i64);

impl From<bool> for Scalar {
    fn from(b: bool) -> Scalar {
        Scalar::Bool(b)
    }
}

/// One operand's part in `torch.result_type`: its dtype, whether it is 0-d, and whether it
/// is a wrapped Python number.
#[derive(Clone, Copy, Debug)]
pub struct PromoteArg {
    /// The operand's dtype.
    pub dtype: DType,
    /// Whether it is 0-d.
    pub zero_dim: bool,
    /// Whether it is a wrapped Python number.
    pub wrapped: bool,
}

/// `torch.result_type` over several operands: dimensioned tensors outrank 0-d tensors, which
/// outrank wrapped numbers, unless a lower tier has a higher category (bool < int < float).
pub fn result_type(args: &[PromoteArg]) -> DType {
    let mut tiers: [Option<DType>; 3] = [None, None, None];
    for a in args {
        let (tier, d) = if a.wrapped {
            let d = if a.dtype.is_float() {
                DEFAULT_FLOAT
            } else if a.dtype.is_int() {
                DType::I64
            } else {
                DType::Bool
            };
            (2, d)
        } else if a.zero_dim {
            (1, a.dtype)
        } else {
            (0, a.dtype)
        };
        tiers[tier] = Some(match tiers[tier] {
            None => d,
            Some(p) => DType::promote(p, d),
        });
    }
    let low = combine_categories(tiers[1], tiers[2]);
    combine_categories(tiers[0], low).unwrap_or(DEFAULT_FLOAT)
}

fn combine_categories(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let (h, l) = match (higher, lower) {
        (None, l) => return l,
        (h, None) => return h,
        (Some(h), Some(l)) => (h, l),
    };
    if h.is_float() {
        return Some(h);
    }
    if h == DType::Bool || l.is_float() {
        return Some(DType::promote(h, l));
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: DType) -> PromoteArg {
        PromoteArg {
            dtype: d,
            zero_dim: false,
            wrapped: false,
        }
    }
    fn w(s: Scalar) -> PromoteArg {
        PromoteArg {
            dtype: s.dtype(),
            zero_dim: true,
            wrapped: true,
        }
    }

    #[test]
    fn promotion_matches_pytorch() {
        use DType::*;
        assert_eq!(DType::promote(U8, I8), I16);
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(I64, F16), F16);
        assert_eq!(DType::promote(Bool, U8), U8);
        assert_eq!(result_type(&[t(F16), w(Scalar::Float(0.5))]), F16);
        assert_eq!(result_type(&[t(I64), w(Scalar::Float(0.5))]), F32);
        assert_eq!(result_type(&[t(I32), w(Scalar::Int(1))]), I32);
        assert_eq!(result_type(&[t(Bool), w(Scalar::Int(1))]), I64);
        assert_eq!(result_type(&[t(U8), w(Scalar::Int(1000))]), U8);
        let zero_f64 = PromoteArg {
            dtype: F64,
            zero_dim: true,
            wrapped: false,
        };
        assert_eq!(result_type(&[t(F32), zero_f64]), F32);
        assert_eq!(result_type(&[t(I32), zero_f64]), F64);
    }
}
