//! The one comparison of computed values with expected ones: [`assert_close`] within a
//! [`Tol`], and [`assert_bits`] for results that must be bit for bit the same.

use smelt::{DType, Tensor};
use std::fmt;

/// The relative tolerance of f64 results ([`Tol::for_dtype`]): a few thousand ulps of f64,
/// room for the rounding of reordered sums and transcendental chains, and 1e6 times below
/// what computing in f32 would give.
pub const F64_REL: f64 = 1e-12;

/// How far a computed value may be from the expected one. Whatever the tolerance, a NaN is
/// only close to a NaN (at the same position) and an infinity only to the same infinity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Allowed |got - want| is `abs + rel · max(floor, |want|)`.
    abs: f64,
    rel: f64,
    floor: f64,
    /// f32 values (tensors of dtype f32, or f32 slices) may also differ by this many units in
    /// the last place.
    ulps: u64,
}

impl Tol {
    /// Equal values only.
    pub const EXACT: Tol = Tol {
        abs: 0.0,
        rel: 0.0,
        floor: 0.0,
        ulps: 0,
    };

    /// `|got - want| <= t · max(1, |want|)`: absolute below 1, relative above.
    pub const fn rel(t: f64) -> Tol {
        Tol {
            rel: t,
            floor: 1.0,
            ..Tol::EXACT
        }
    }

    /// `|got - want| <= atol + rtol · |want|`, as `numpy.allclose`.
    pub const fn allclose(rtol: f64, atol: f64) -> Tol {
        Tol {
            abs: atol,
            rel: rtol,
            ..Tol::EXACT
        }
    }

    /// f32 values within `n` units in the last place, nothing else beyond equality.
    pub const fn ulps(n: u64) -> Tol {
        Tol::EXACT.or_ulps(n)
    }

    /// This tolerance for results of `dtype`, tightened to f64's precision for f64 results
    /// (`F64_REL`): a path that computed an f64 graph in f32 fails it.
    pub fn for_dtype(self, dtype: DType) -> Tol {
        match dtype {
            DType::F64 => Tol::rel(F64_REL),
            _ => self,
        }
    }

    /// This tolerance, or f32 values within `n` units in the last place.
    pub const fn or_ulps(self, n: u64) -> Tol {
        Tol { ulps: n, ..self }
    }

    /// The largest |got - want| allowed next to `want` (ulps aside).
    pub fn allowed(&self, want: f64) -> f64 {
        self.abs + self.rel * want.abs().max(self.floor)
    }

    /// Whether `got` is close enough to `want`; `f32s` says that both are f32 values, which
    /// may then also be within [`Tol::ulps`].
    pub fn accepts(&self, got: f64, want: f64, f32s: bool) -> bool {
        if got.is_nan() || want.is_nan() {
            return got.is_nan() && want.is_nan();
        }
        if got == want {
            return true;
        }
        if got.is_infinite() || want.is_infinite() {
            return false;
        }
        (f32s && ulps(got as f32, want as f32) <= self.ulps)
            || (got - want).abs() <= self.allowed(want)
    }
}

/// A bare number is a [`Tol::rel`] tolerance.
impl From<f64> for Tol {
    fn from(t: f64) -> Tol {
        Tol::rel(t)
    }
}

impl fmt::Display for Tol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Tol::EXACT {
            return write!(f, "exact");
        }
        let mut parts = Vec::new();
        if self.abs != 0.0 || self.rel != 0.0 {
            let rel = match self.floor {
                0.0 => format!("{:e}·|expected|", self.rel),
                fl => format!("{:e}·max({fl}, |expected|)", self.rel),
            };
            parts.push(match self.abs {
                0.0 => rel,
                a => format!("{a:e} + {rel}"),
            });
        }
        if self.ulps != 0 {
            parts.push(format!("{} f32 ulps", self.ulps));
        }
        write!(f, "{}", parts.join(" or "))
    }
}

/// Distance in units in the last place between two f32 values.
pub fn ulps(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i64::from(i32::MIN) - i64::from(i)
        } else {
            i64::from(i)
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// What [`assert_close`] and [`assert_bits`] compare: tensors (whose dtypes and shapes must
/// match too) or plain slices of values.
pub trait Values {
    /// Every value, widened to f64.
    fn values(&self) -> Vec<f64>;
    /// A tensor's dtype and shape.
    fn layout(&self) -> Option<(DType, Vec<usize>)> {
        None
    }
    /// Whether the values are f32 (the ones [`Tol::ulps`] applies to).
    fn f32s(&self) -> bool {
        false
    }
}

impl Values for Tensor {
    fn values(&self) -> Vec<f64> {
        // a tensor that cannot be read fails the comparison, never passes as empty
        self.try_to_f64_vec()
            .unwrap_or_else(|e| panic!("cannot read the tensor's elements: {e}"))
    }
    fn layout(&self) -> Option<(DType, Vec<usize>)> {
        Some((self.dtype(), self.shape().to_vec()))
    }
    fn f32s(&self) -> bool {
        self.dtype() == DType::F32
    }
}

impl Values for [f64] {
    fn values(&self) -> Vec<f64> {
        self.to_vec()
    }
}

impl Values for Vec<f64> {
    fn values(&self) -> Vec<f64> {
        self.clone()
    }
}

impl<const N: usize> Values for [f64; N] {
    fn values(&self) -> Vec<f64> {
        self.to_vec()
    }
}

impl Values for [f32] {
    fn values(&self) -> Vec<f64> {
        self.iter().map(|&v| f64::from(v)).collect()
    }
    fn f32s(&self) -> bool {
        true
    }
}

impl Values for Vec<f32> {
    fn values(&self) -> Vec<f64> {
        self.as_slice().values()
    }
    fn f32s(&self) -> bool {
        true
    }
}

/// `i` as a multi-index of `shape` (row-major), for messages.
fn position(i: usize, shape: Option<&[usize]>) -> String {
    match shape {
        Some(s) if s.len() > 1 && s.iter().all(|&d| d > 0) => {
            let mut rest = i;
            let mut idx = vec![0; s.len()];
            for (k, &d) in s.iter().enumerate().rev() {
                idx[k] = rest % d;
                rest /= d;
            }
            format!("{i} {idx:?}")
        }
        _ => i.to_string(),
    }
}

/// Checks the layouts (tensors: dtype and shape) and lengths of `got` and `want`; returns
/// their values and the shape, if any.
fn matched<G, W>(got: &G, want: &W, what: &str) -> (Vec<f64>, Vec<f64>, Option<Vec<usize>>)
where
    G: Values + ?Sized,
    W: Values + ?Sized,
{
    let shape = match (got.layout(), want.layout()) {
        (Some((gd, gs)), Some((wd, ws))) => {
            assert_eq!(gd, wd, "{what}: dtype");
            assert_eq!(gs, ws, "{what}: shape");
            Some(ws)
        }
        (_, w) => w.map(|(_, s)| s),
    };
    let (g, w) = (got.values(), want.values());
    assert_eq!(g.len(), w.len(), "{what}: number of values");
    (g, w, shape)
}

/// Asserts that `got` matches `want` within `tol` (a bare `f64` is [`Tol::rel`]): equal dtypes
/// and shapes when both are tensors, equal lengths, NaNs at the same positions, the same
/// infinities, every other value within the tolerance. A failure names the element, both
/// values and the tolerance.
#[track_caller]
pub fn assert_close<G, W>(got: &G, want: &W, tol: impl Into<Tol>, what: &str)
where
    G: Values + ?Sized,
    W: Values + ?Sized,
{
    let tol = tol.into();
    let f32s = got.f32s() && want.f32s();
    let (g, w, shape) = matched(got, want, what);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        assert!(
            tol.accepts(a, b, f32s),
            "{what}: element {}: got {a:e}, expected {b:e} (|difference| {:e}, allowed {:e}: {tol})",
            position(i, shape.as_deref()),
            (a - b).abs(),
            tol.allowed(b),
        );
    }
}

/// Whether two values have the same bits, any NaN matching any NaN (so `-0.0` differs from
/// `0.0`).
pub fn same_bits(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Asserts that `got` and `want` are the same bit for bit: equal dtypes and shapes when both
/// are tensors, NaNs of any payload at the same positions, and zeros of the same sign.
#[track_caller]
pub fn assert_bits<G, W>(got: &G, want: &W, what: &str)
where
    G: Values + ?Sized,
    W: Values + ?Sized,
{
    let (g, w, shape) = matched(got, want, what);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        assert!(
            same_bits(a, b),
            "{what}: element {}: got {a:e}, expected {b:e} (bit for bit)",
            position(i, shape.as_deref()),
        );
    }
}

/// How many times the reference's spread ([`crate::common::inputs::spread`]) an element may
/// differ beyond `tol`: more than one rounding step can add up.
pub const SPREAD_FACTOR: f64 = 8.0;

/// [`assert_close`], each element also allowed [`SPREAD_FACTOR`] times its `spread`.
#[track_caller]
pub fn assert_close_within<G, W>(got: &G, want: &W, tol: impl Into<Tol>, spread: &[f64], what: &str)
where
    G: Values + ?Sized,
    W: Values + ?Sized,
{
    let tol = tol.into();
    let (g, w, shape) = matched(got, want, what);
    assert_eq!(spread.len(), w.len(), "{what}: spread per element");
    for (i, ((&a, &b), &s)) in g.iter().zip(&w).zip(spread).enumerate() {
        let allowed = tol.allowed(b) + SPREAD_FACTOR * s;
        let same = same_bits(a, b) || (a.is_nan() && b.is_nan()) || (a - b).abs() <= allowed;
        assert!(
            same,
            "{what}: element {}: got {a:e}, expected {b:e} (allowed {allowed:e}: {tol} and {SPREAD_FACTOR} x the reference's spread {s:e})",
            position(i, shape.as_deref()),
        );
    }
}
