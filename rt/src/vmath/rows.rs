//! Reductions and rows in f32 slices: the f64 sum, the extremes, softmax and layer_norm,
//! with the prefetches that keep a streaming read ahead of the loop.

use super::exp::exp;

/// How far ahead of a streaming read `prefetch_ahead` asks for lines, in f32s (8 KiB).
pub const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache line at `p` (a hint: any address, it reads nothing and never faults).
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch cannot fault or change memory; SSE is baseline x86-64.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the two cache lines [`PREFETCH_AHEAD`] elements past `xs[i]`: the hardware's
/// prefetchers stop at each 4 KiB boundary and restart behind it, so long row sums measured
/// faster with it, on one thread and on two (BENCHMARKS.md). The address may lie past the
/// slice.
#[inline(always)]
fn prefetch_ahead(xs: &[f32], i: usize) {
    let p = xs.as_ptr().wrapping_add(i + PREFETCH_AHEAD) as *const u8;
    prefetch(p);
    prefetch(p.wrapping_add(64));
}

/// Thirty-two f64 partial sums (four AVX-512 vectors, eight AVX2 ones), added up at the end:
/// with two vectors, each add waited for the one before it and a thread read memory at
/// 16 bytes a cycle at most, below what one core draws from DRAM with loads in flight.
#[inline(always)]
pub(super) fn sum_with(xs: &[f32]) -> f64 {
    let mut acc = [0.0f64; 32];
    let chunks = xs.chunks_exact(32);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 32);
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f64::from(x);
        }
    }
    let mut s = 0.0;
    for a in acc {
        s += a;
    }
    for &x in tail {
        s += f64::from(x);
    }
    s
}

/// The largest (`MAX`) or smallest element of `xs` in 32 lanes, NaN when any is; ties of
/// `-0` and `+0` give either.
#[inline(always)]
pub(super) fn extreme_with<const MAX: bool>(xs: &[f32]) -> f32 {
    let init = if MAX {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    };
    let better = |x: f32, a: f32| if MAX { x > a } else { x < a };
    let mut acc = [init; 32];
    let mut nan = [0u32; 32];
    let chunks = xs.chunks_exact(32);
    let tail = chunks.remainder();
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 32);
        for ((a, m), &x) in acc.iter_mut().zip(nan.iter_mut()).zip(c) {
            *m |= u32::from(x.is_nan());
            *a = if better(x, *a) { x } else { *a };
        }
    }
    let mut any = nan.iter().any(|&m| m != 0);
    let mut r = init;
    for x in acc.into_iter().chain(tail.iter().copied()) {
        any |= x.is_nan();
        r = if better(x, r) { x } else { r };
    }
    if any { f32::NAN } else { r }
}

/// softmax of `xs` into `out` (same length): `e = exp(x - max)`, then `e / Σe` in f64 rounded
/// once; log_softmax: `x - max - ln(Σe)` in f64. The max skips NaN, but a NaN's exponential
/// makes the sum and so the whole row NaN, as in the reference; a row of `-inf` is NaN too.
/// (So the max needs none of [`extreme_with`]'s NaN tracking, which measured slower on
/// large rows.)
#[inline(always)]
pub(super) fn softmax_with(xs: &[f32], out: &mut [f32], log: bool) {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let mut m = f32::NEG_INFINITY;
    for &x in chunks.remainder() {
        m = if x > m { x } else { m };
    }
    for (k, c) in chunks.enumerate() {
        prefetch_ahead(xs, k * 16);
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    for a in acc {
        m = if a > m { a } else { m };
    }
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = exp(x - m);
    }
    let s = sum_with(out);
    if log {
        let (m, lse) = (f64::from(m), s.ln());
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = (f64::from(x) - m - lse) as f32;
        }
    } else {
        let r = 1.0 / s;
        for o in out.iter_mut() {
            *o = (f64::from(*o) * r) as f32;
        }
    }
}

/// layer_norm of `xs` into `out` (same length): mean and biased variance in f64 (32 and 16
/// partial sums each), `(x - mean)·rstd·w + b` in f64, rounded once to f32.
#[inline(always)]
pub(super) fn layer_norm_with(
    xs: &[f32],
    out: &mut [f32],
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
) {
    let n = xs.len() as f64;
    let m = sum_with(xs) / n;
    let mut acc = [0.0f64; 16];
    let chunks = xs.chunks_exact(16);
    let mut var = 0.0;
    for &x in chunks.remainder() {
        let d = f64::from(x) - m;
        var += d * d;
    }
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            let d = f64::from(x) - m;
            *a += d * d;
        }
    }
    for a in acc {
        var += a;
    }
    let rstd = 1.0 / (var / n + eps).sqrt();
    // one loop per case, so that each vectorises without per-element tests
    match (w, b) {
        (Some(w), Some(b)) => {
            for (((o, &x), &w), &b) in out.iter_mut().zip(xs).zip(w).zip(b) {
                *o = ((f64::from(x) - m) * rstd * f64::from(w) + f64::from(b)) as f32;
            }
        }
        (Some(w), None) => {
            for ((o, &x), &w) in out.iter_mut().zip(xs).zip(w) {
                *o = ((f64::from(x) - m) * rstd * f64::from(w)) as f32;
            }
        }
        (None, Some(b)) => {
            for ((o, &x), &b) in out.iter_mut().zip(xs).zip(b) {
                *o = ((f64::from(x) - m) * rstd + f64::from(b)) as f32;
            }
        }
        (None, None) => {
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = ((f64::from(x) - m) * rstd) as f32;
            }
        }
    }
}
