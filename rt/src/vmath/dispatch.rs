//! Dispatch: the strip ops' maps, the ISA chosen once at run time ([`level`]), and the
//! safe entry points, which run each job with the widest vectors the CPU has.

use super::StripOp;
use super::erf_gelu::{erf, gelu_family, gelu_in_place, gelu_map};
use super::exp::{exp, sigmoid, silu, tanh};
use super::rows::{
    PREFETCH_AHEAD, extreme_with, layer_norm_with, prefetch, softmax_with, sum_with,
};
use crate::lanes;
use std::sync::OnceLock;

/// `$each!(f)` with the scalar function of strip op `$op`, or `$gelu` for the GELUs.
macro_rules! by_op {
    ($op:expr, $each:ident, $gelu:expr) => {
        match $op {
            StripOp::Exp => $each!(exp),
            StripOp::Tanh => $each!(tanh),
            StripOp::Sigmoid => $each!(sigmoid),
            StripOp::Silu => $each!(silu),
            StripOp::Erf => $each!(erf),
            StripOp::GeluTanh
            | StripOp::GeluErf
            | StripOp::GeluErfSlope
            | StripOp::GeluTanhSlope => $gelu,
        }
    };
}

/// Plain `for` loops, not `for_each` with a closure: rustc may outline a generic
/// `for_each` out of the `#[target_feature]` caller, and the copy outside it computes every
/// `mul_add` with a software fma call (the exact GELU ran far slower that way).
#[inline(always)]
pub(super) fn map_with(op: StripOp, xs: &mut [f32]) {
    macro_rules! each {
        ($f:ident) => {
            for x in xs {
                *x = $f(*x);
            }
        };
    }
    // SAFETY: one lane needs no features
    by_op!(op, each, unsafe { gelu_in_place::<f32>(xs, op) })
}

/// `dst = op(src)`, with the source's lines asked for ahead of the loop.
#[inline(always)]
fn map_from_with(op: StripOp, src: &[f32], dst: &mut [f32]) {
    const STEP: usize = 16;
    macro_rules! each {
        ($f:ident) => {{
            let (mut s, mut d) = (src.chunks_exact(STEP), dst.chunks_exact_mut(STEP));
            for (k, (o, x)) in (&mut d).zip(&mut s).enumerate() {
                prefetch(src.as_ptr().wrapping_add(k * STEP + PREFETCH_AHEAD) as *const u8);
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = $f(x);
                }
            }
            for (o, &x) in d.into_remainder().iter_mut().zip(s.remainder()) {
                *o = $f(x);
            }
        }};
    }
    let n = src.len().min(dst.len());
    // SAFETY: one lane needs no features; `n` f32s in each, disjoint (two borrows)
    by_op!(op, each, unsafe {
        gelu_map::<f32>(src.as_ptr(), dst.as_mut_ptr(), n, op)
    })
}

// ---------------------------------------------------------------------------------------------
// Dispatch

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Avx512,
    Avx2,
    Unavailable,
}

pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        // `SMELT_CPU=avx2` (or `baseline`) caps the helpers below what the CPU has, to
        // measure the paths of smaller CPUs on a larger one
        let cap = std::env::var("SMELT_CPU").unwrap_or_default();
        if cap == "baseline" {
            return Level::Unavailable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2
                && cap != "avx2"
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
            {
                return Level::Avx512;
            }
            if avx2 {
                return Level::Avx2;
            }
        }
        Level::Unavailable
    })
}

/// Whether this CPU runs the strip helpers natively (AVX2 + FMA at least).
pub fn available() -> bool {
    level() != Level::Unavailable
}

/// The widest vector instructions the strip helpers use here, for reports.
pub fn isa() -> &'static str {
    match level() {
        Level::Avx512 => "avx512",
        Level::Avx2 => "avx2+fma",
        Level::Unavailable => "none",
    }
}

/// One call's work: a map in place, a sum into the f64, or column sums.
pub(super) enum Job<'a> {
    Map(StripOp, &'a mut [f32]),
    /// A map of `n` f32s into `dst`, the same memory as `src` or disjoint.
    MapFrom {
        op: StripOp,
        src: *const f32,
        dst: *mut f32,
        n: usize,
    },
    Sum(&'a [f32], &'a mut f64),
    /// The largest (`true`) or smallest element.
    Extreme(&'a [f32], &'a mut f32, bool),
    /// softmax (or log_softmax) of one row into the second slice.
    Softmax(&'a [f32], &'a mut [f32], bool),
    /// layer_norm of one row into `out`, with an optional weight and bias of its length.
    LayerNorm {
        xs: &'a [f32],
        out: &'a mut [f32],
        w: Option<&'a [f32]>,
        b: Option<&'a [f32]>,
        eps: f64,
    },
    /// `dst[c] = Σ_r src[r·stride + c]` over `rows` rows of `dst.len()` f32s.
    Cols {
        src: *const f32,
        stride: isize,
        rows: usize,
        dst: &'a mut [f64],
    },
}

#[inline(always)]
pub(super) fn run_with(job: Job) {
    match job {
        Job::Map(op, xs) => map_with(op, xs),
        Job::MapFrom { op, src, dst, n } if std::ptr::eq(src, dst) => {
            // SAFETY: whoever made the job (`strip_math`, `apply_from`) promises `n` f32s at
            // `dst`, initialised and used by nothing else meanwhile; `src` is the same memory.
            map_with(op, unsafe { std::slice::from_raw_parts_mut(dst, n) })
        }
        // SAFETY: as above, and the two ranges of `n` f32s are disjoint (the same memory took
        // the arm above), so the shared and the mutable slice do not alias.
        Job::MapFrom { op, src, dst, n } => unsafe {
            map_from_with(
                op,
                std::slice::from_raw_parts(src, n),
                std::slice::from_raw_parts_mut(dst, n),
            )
        },
        Job::Sum(xs, out) => *out = sum_with(xs),
        Job::Extreme(xs, out, true) => *out = extreme_with::<true>(xs),
        Job::Extreme(xs, out, false) => *out = extreme_with::<false>(xs),
        Job::Softmax(xs, out, log) => softmax_with(xs, out, log),
        Job::LayerNorm { xs, out, w, b, eps } => layer_norm_with(xs, out, w, b, eps),
        Job::Cols {
            src,
            stride,
            rows,
            dst,
        } => {
            let n = dst.len();
            // SAFETY: whoever made the job (`col_sum`) promises that every row is readable.
            let row = |r: usize| unsafe {
                std::slice::from_raw_parts(src.wrapping_offset(r as isize * stride), n)
            };
            cols_with(dst, rows, row)
        }
    }
}

/// Adds `rows` rows into `dst`, zeroed first, in row order: the order of one f64 accumulator
/// per column, so the sums are bit-identical to a sequential loop. Four rows per pass over
/// `dst` keep its loads and stores off the critical path.
#[inline(always)]
fn cols_with<'a>(dst: &mut [f64], rows: usize, row: impl Fn(usize) -> &'a [f32]) {
    dst.fill(0.0);
    let mut r = 0;
    while r + 4 <= rows {
        let (a, b, c, d) = (row(r), row(r + 1), row(r + 2), row(r + 3));
        for ((((o, &a), &b), &c), &d) in dst.iter_mut().zip(a).zip(b).zip(c).zip(d) {
            *o = (((*o + f64::from(a)) + f64::from(b)) + f64::from(c)) + f64::from(d);
        }
        r += 4;
    }
    for r in r..rows {
        for (o, &x) in dst.iter_mut().zip(row(r)) {
            *o += f64::from(x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
pub(super) fn run_avx512(job: Job) {
    match job {
        // SAFETY: compiled for AVX-512, which `level` saw
        Job::Map(op, xs) if gelu_family(op) => unsafe { gelu_in_place::<lanes::X16>(xs, op) },
        // SAFETY: as above; the job's maker promises the two ranges
        Job::MapFrom { op, src, dst, n } if gelu_family(op) => unsafe {
            gelu_map::<lanes::X16>(src, dst, n, op)
        },
        job => run_with(job),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn run_avx2(job: Job) {
    match job {
        // SAFETY: compiled for AVX2 + FMA, which `level` saw
        Job::Map(op, xs) if gelu_family(op) => unsafe { gelu_in_place::<lanes::X8>(xs, op) },
        // SAFETY: as above; the job's maker promises the two ranges
        Job::MapFrom { op, src, dst, n } if gelu_family(op) => unsafe {
            gelu_map::<lanes::X8>(src, dst, n, op)
        },
        job => run_with(job),
    }
}

/// Runs `job` with the widest vectors this CPU has (the portable loop where [`available`] is
/// false: correct, but slow without a hardware fma).
pub(super) fn run(job: Job) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw AVX-512 F/VL/DQ, AVX2 and FMA on this CPU.
        Level::Avx512 => unsafe { run_avx512(job) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` saw AVX2 and FMA on this CPU.
        Level::Avx2 => unsafe { run_avx2(job) },
        _ => run_with(job),
    }
}

/// The sum of `xs` in f64 (thirty-two partial sums; the order differs from a sequential sum
/// only far below f32 precision).
pub fn sum(xs: &[f32]) -> f64 {
    let mut s = 0.0;
    run(Job::Sum(xs, &mut s));
    s
}

/// The largest (`max`) or smallest element of `xs`: NaN when any is, `∓inf` for none.
pub fn extreme(xs: &[f32], max: bool) -> f32 {
    let mut r = 0.0;
    run(Job::Extreme(xs, &mut r, max));
    r
}

/// softmax (or, with `log`, log_softmax) of the row `xs` into `out`, of the same length.
pub fn softmax(xs: &[f32], out: &mut [f32], log: bool) {
    let n = xs.len().min(out.len());
    run(Job::Softmax(&xs[..n], &mut out[..n], log))
}

/// layer_norm of the row `xs` into `out` with an optional weight and bias (each as long as
/// the row; shorter slices shorten the row).
pub fn layer_norm(xs: &[f32], out: &mut [f32], w: Option<&[f32]>, b: Option<&[f32]>, eps: f64) {
    let n = [
        Some(xs.len()),
        Some(out.len()),
        w.map(<[f32]>::len),
        b.map(<[f32]>::len),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(0);
    run(Job::LayerNorm {
        xs: &xs[..n],
        out: &mut out[..n],
        w: w.map(|w| &w[..n]),
        b: b.map(|b| &b[..n]),
        eps,
    })
}

/// Column sums of a row-major matrix: `dst[j] = Σ_r xs[r·stride + c0 + j]` over the
/// `xs.len() / stride` rows, in f64, rows in order. Does nothing unless `stride` divides
/// `xs.len()` and the columns `c0..c0 + dst.len()` lie within a row.
pub fn col_sums(xs: &[f32], stride: usize, c0: usize, dst: &mut [f64]) {
    let fits = stride > 0
        && xs.len().is_multiple_of(stride)
        && c0.checked_add(dst.len()).is_some_and(|e| e <= stride)
        && isize::try_from(stride).is_ok();
    if !fits || dst.is_empty() {
        return;
    }
    run(Job::Cols {
        src: xs[c0..].as_ptr(),
        stride: stride as isize,
        rows: xs.len() / stride,
        dst,
    });
}

/// Maps `op` over `xs` in place.
pub fn apply(op: StripOp, xs: &mut [f32]) {
    run(Job::Map(op, xs))
}

/// `dst = op(src)` over the shorter of the two: the same values as [`apply`] on a copy,
/// with the source read in the loop instead of copied first, which measured faster on
/// large inputs (BENCHMARKS.md).
pub fn apply_from(op: StripOp, src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    run(Job::MapFrom {
        op,
        src: src.as_ptr(),
        dst: dst.as_mut_ptr(),
        n,
    })
}
