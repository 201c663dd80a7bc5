//! Scalar definitions of exp, expm1, tanh, sigmoid and silu, written branch-free (selects,
//! not jumps) so that the loops vectorise; each is a port of its emitter in
//! `smelt::codegen_cpu::math`.

use crate::consts::{EXP_G, LN2_HI, LN2_LO, LOG2E, SHIFT32, SIGMOID_GONE};

/// Clamp by compare + select; NaN passes through (as `math::clamp`).
#[inline(always)]
pub(super) fn clamp<T: PartialOrd + Copy>(x: T, lo: T, hi: T) -> T {
    let x = if x > hi { hi } else { x };
    if x < lo { lo } else { x }
}

#[inline(always)]
pub(super) fn poly32(x: f32, c: &[f64]) -> f32 {
    let (last, rest) = c.split_last().unwrap_or((&0.0, &[]));
    let mut acc = *last as f32;
    for &ci in rest.iter().rev() {
        acc = acc.mul_add(x, ci as f32);
    }
    acc
}

#[inline(always)]
fn pow2i32(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

#[inline(always)]
fn scale2n(y: f32, n: i32) -> f32 {
    scale2n_unless(y, n, false)
}

/// `math::scale2n_factors`: [`scale2n`] with the first factor 0 where `gone`.
#[inline(always)]
fn scale2n_unless(y: f32, n: i32, gone: bool) -> f32 {
    let n1 = n >> 1;
    let s1 = if gone { 0.0 } else { pow2i32(n1) };
    y * s1 * pow2i32(n.wrapping_sub(n1))
}

/// `math::scale2n_from_one`: `y·2^n` as added to or taken from 1, in one multiply.
#[inline(always)]
pub(super) fn scale2n_from_one(y: f32, n: i32) -> f32 {
    y * pow2i32(n.max(-64))
}

/// `x = k·ln2 + r` (`math::reduce_ln2`).
#[inline(always)]
fn reduce_ln2(x: f32) -> (f32, i32) {
    let shift = SHIFT32 as f32;
    let s = x.mul_add(LOG2E as f32, shift);
    let kf = s + (-shift);
    let k = (s.to_bits() as i32).wrapping_sub(shift.to_bits() as i32);
    let r = kf.mul_add(-LN2_HI as f32, x);
    (kf.mul_add(-LN2_LO as f32, r), k)
}

#[inline(always)]
fn expm1_small(r: f32) -> f32 {
    let g = poly32(r, &EXP_G);
    (r * r).mul_add(g, r)
}

#[inline(always)]
pub(super) fn exp_parts(x: f32) -> (f32, i32) {
    let (r, k) = reduce_ln2(clamp(x, -110.0, 89.0));
    (expm1_small(r) + 1.0, k)
}

#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    let (p, k) = exp_parts(x);
    // `math::exp`: 0 below -105 without an underflowing product
    let p = if x < -105.0 { 0.0 } else { p };
    scale2n(p, k)
}

#[inline(always)]
fn expm1(x: f32) -> f32 {
    let (r, k) = reduce_ln2(clamp(x, -30.0, 89.0));
    let p = expm1_small(r);
    let s = pow2i32(k.wrapping_sub(1));
    let y = s.mul_add(p, s + (-0.5));
    let y = if k == 0 { p } else { y + y };
    if x == 0.0 { x } else { y }
}

#[inline(always)]
pub(super) fn tanh(x: f32) -> f32 {
    let a = clamp(x.abs(), 0.0, 10.0);
    let t = expm1(a + a);
    (t / (t + 2.0)).copysign(x)
}

/// `math::sigmoid`: `1/(1+e)` for `x ≥ 0`, `p/(1+e)·2^k` below (`e = p·2^k = e^{-|x|}`).
#[inline(always)]
pub(super) fn sigmoid(x: f32) -> f32 {
    let (p, k) = exp_parts(-x.abs());
    // `math::sigmoid`: no subnormal product where the result does not need one
    let den = 1.0 + scale2n_from_one(p, k);
    let y_neg = scale2n_unless(p / den, k, k < SIGMOID_GONE);
    if x >= 0.0 { 1.0 / den } else { y_neg }
}

#[inline(always)]
pub(super) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}
