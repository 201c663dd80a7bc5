//! The helpers generated code calls by symbol (`extern "C"`), and their symbols.

use super::StripOp;
use super::dispatch::{Job, apply, available, extreme, run, softmax, sum};

/// The symbol generated kernels call: `smelt_strip_math(op, src, dst, n)` maps op over `n` f32s
/// from `src` into `dst`.
pub const SYMBOL: &str = "smelt_strip_math";

/// The symbol of the strip sum: `smelt_strip_sum(src, n)` is the f64 sum of `n` f32s.
pub const SUM_SYMBOL: &str = "smelt_strip_sum";

/// The symbols of the strip extremes: `smelt_strip_max(src, n)` (`smelt_strip_min`) is the
/// largest (smallest) of `n` f32s; a quiet NaN when any is NaN, as the generated vector
/// loops give; `-inf` (`inf`) for none.
pub const MAX_SYMBOL: &str = "smelt_strip_max";
/// See [`MAX_SYMBOL`].
pub const MIN_SYMBOL: &str = "smelt_strip_min";

/// The symbol of the column sum: `smelt_col_sum(src, stride, cols, rows, dst)` writes the f64
/// sums of `cols` adjacent columns over `rows` rows `stride` elements apart (`smelt::codegen_cpu::lanes`).
pub const COL_SUM_SYMBOL: &str = "smelt_col_sum";

/// The symbol of the streamed copy: `smelt_stream(src, dst, n)` copies `n` f32s from a stack
/// row to an output with non-temporal stores (`smelt::codegen_cpu::stream`).
pub const STREAM_SYMBOL: &str = "smelt_stream";

/// The symbol of the row softmax: `smelt_softmax_row(src, dst, n, log)` writes the softmax
/// (`log` = 1: log_softmax) of the `n` f32s at `src` to `dst` (`smelt::codegen_cpu::softmax`).
pub const SOFTMAX_SYMBOL: &str = "smelt_softmax_row";

/// The helper generated code calls: `dst[..n] = op(src[..n])`. The two may be the same
/// memory or overlap (a kernel writing into its own input). The loop reads the source where
/// the two are the same memory or disjoint; a source that partly overlaps is first moved
/// into the destination (2 KiB at most) and mapped there. An unknown op code or a negative
/// count does nothing (generated code passes neither).
///
/// # Safety
/// `src` points to `n` initialised f32s, `dst` to `n` writable ones; nothing else touches
/// them during the call.
#[unsafe(export_name = "smelt_strip_math")]
pub unsafe extern "C" fn strip_math(op: i32, src: *const f32, dst: *mut f32, n: i64) {
    let (Some(op), Ok(n)) = (StripOp::from_code(op), usize::try_from(n)) else {
        return;
    };
    if n == 0 {
        return;
    }
    let (s, d, bytes) = (src as usize, dst as usize, n.saturating_mul(4));
    let disjoint = s.saturating_add(bytes) <= d || d.saturating_add(bytes) <= s;
    if disjoint || s == d {
        return run(Job::MapFrom { op, src, dst, n });
    }
    // SAFETY: the caller's contract; `copy` allows overlap.
    let xs = unsafe {
        std::ptr::copy(src, dst, n);
        std::slice::from_raw_parts_mut(dst, n)
    };
    apply(op, xs);
}

/// The strip sum generated code calls; a negative count sums nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s that nothing writes during the call.
#[unsafe(export_name = "smelt_strip_sum")]
pub unsafe extern "C" fn strip_sum(src: *const f32, n: i64) -> f64 {
    match usize::try_from(n) {
        // SAFETY: the caller's contract.
        Ok(n) if n > 0 => sum(unsafe { std::slice::from_raw_parts(src, n) }),
        _ => 0.0,
    }
}

/// The strip maximum generated code calls (see [`MAX_SYMBOL`]); a negative count has none.
///
/// # Safety
/// `src` points to `n` initialised f32s that nothing writes during the call.
#[unsafe(export_name = "smelt_strip_max")]
pub unsafe extern "C" fn strip_max(src: *const f32, n: i64) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { strip_extreme(src, n, true) }
}

/// The strip minimum generated code calls (see [`MAX_SYMBOL`]).
///
/// # Safety
/// As [`strip_max`].
#[unsafe(export_name = "smelt_strip_min")]
pub unsafe extern "C" fn strip_min(src: *const f32, n: i64) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { strip_extreme(src, n, false) }
}

/// # Safety
/// As [`strip_max`].
unsafe fn strip_extreme(src: *const f32, n: i64, max: bool) -> f32 {
    match usize::try_from(n) {
        // SAFETY: the caller's contract.
        Ok(n) if n > 0 => extreme(unsafe { std::slice::from_raw_parts(src, n) }, max),
        _ if max => f32::NEG_INFINITY,
        _ => f32::INFINITY,
    }
}

/// The row softmax generated code calls (see [`SOFTMAX_SYMBOL`]); a negative count does
/// nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s and `dst` to `n` writable ones that do not overlap
/// them; nothing else touches either during the call.
#[unsafe(export_name = "smelt_softmax_row")]
pub unsafe extern "C" fn softmax_row(src: *const f32, dst: *mut f32, n: i64, log: i32) {
    let Ok(n) = usize::try_from(n) else {
        return;
    };
    if n == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    let (xs, out) = unsafe {
        (
            std::slice::from_raw_parts(src, n),
            std::slice::from_raw_parts_mut(dst, n),
        )
    };
    softmax(xs, out, log != 0);
}

/// Completes this thread's streamed stores before its later stores (`sfence`): a kernel
/// that streamed calls it before returning its results.
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// The streamed copy generated code calls: `dst[..n] = src[..n]`, with non-temporal stores
/// from the first 32-byte boundary of `dst` on (plain stores before it and for the last
/// partial vector). A negative count copies nothing.
///
/// # Safety
/// `src` points to `n` initialised f32s and `dst` to `n` writable ones that do not overlap
/// them; nothing else touches either during the call.
#[unsafe(export_name = "smelt_stream")]
pub unsafe extern "C" fn stream(src: *const f32, dst: *mut f32, n: i64) {
    let Ok(n) = usize::try_from(n) else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX is present (AVX2 implies it); the caller's contract.
        unsafe { stream_avx(src, dst, n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// [`stream`] with 32-byte streaming stores.
///
/// # Safety
/// The CPU has AVX; `src` points to `n` initialised f32s and `dst` to `n` writable ones that
/// do not overlap them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(src: *const f32, dst: *mut f32, n: usize) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    let head = dst.align_offset(32).min(n);
    // SAFETY: `head <= n`, and the caller's contract gives `n` readable f32s at `src` and `n`
    // writable ones at `dst`, disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 8 <= n {
        // SAFETY: AVX by this fn's contract; lanes `i..i + 8 <= n` of both ranges; `dst + i`
        // is 32-byte aligned, as the streaming store needs (`head` reached the boundary, or
        // `head == n` and the loop does not run).
        unsafe { _mm256_stream_ps(dst.add(i), _mm256_loadu_ps(src.add(i))) };
        i += 8;
    }
    // SAFETY: the last `n - i` elements of both ranges, `i <= n`.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i) };
}

/// The column sum generated code calls: `dst[c] = Σ_{r<rows} src[r·stride + c]` for
/// `c < cols`, in f64, rows in order. A negative count or a stride that does not fit a
/// pointer offset does nothing.
///
/// # Safety
/// For every `r < rows`, the `cols` f32s at `src + r·stride` are initialised and nothing
/// writes them during the call; `dst` points to `cols` writable f64s that nothing else uses.
#[unsafe(export_name = "smelt_col_sum")]
pub unsafe extern "C" fn col_sum(
    src: *const f32,
    stride: i64,
    cols: i64,
    rows: i64,
    dst: *mut f64,
) {
    let (Ok(cols), Ok(rows), Ok(stride)) = (
        usize::try_from(cols),
        usize::try_from(rows),
        isize::try_from(stride),
    ) else {
        return;
    };
    if cols == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, cols) };
    run(Job::Cols {
        src,
        stride,
        rows,
        dst,
    });
}
