//! The entry point of ahead-of-time compiled models.
//!
//! `smelt compile --target cpu` writes an object file whose `NAME_run` hands three tables
//! to [`smelt_rt_run`]: the model's *plan* (a list of `u64` words, below), its kernels'
//! addresses and its constant data. This module reads the plan and runs it: it checks the
//! arguments and the CPU, points every buffer into the caller's inputs, the scratch buffer
//! or the constants, runs the kernels (rows split over threads when large) and the GEMMs in
//! order, and copies the outputs (strided views of buffers) into the caller's contiguous
//! output arrays.
//!
//! The plan itself allocates nothing when the caller passes a scratch buffer: the
//! buffer-pointer table and every kernel's slot table have places in the scratch. (The thread
//! pool and the GEMM library set up per-thread state the first time a thread uses them, and
//! a convolution takes its column buffers from the heap, as the JIT's does.)
//!
//! # The plan
//! Words, in order:
//! - header: [`MAGIC`], [`FORMAT`], CPU features ([`FEATURES`] bits), scratch bytes, the
//!   byte offset of the buffer-pointer table in the scratch, the number of buffers, inputs,
//!   outputs and steps;
//! - per buffer: kind ([`BUF_INPUT`], [`BUF_SCRATCH`], [`BUF_CONST`]), the input index or
//!   byte offset, its size in bytes;
//! - per output: buffer, element size, element offset, rank, then the shape and the strides
//!   (in elements);
//! - per step, a tag then its fields:
//!   - [`STEP_KERNEL`]: kernel index, rows, elements, streams (0/1), row block (chunks of
//!     rows split on its multiples), slot-table byte offset in the scratch, slot count, then
//!     the buffer of each slot;
//!   - [`STEP_GEMM`]: dtype ([`GEMM_F16`]..), m, n, k, a's row and column strides, b's
//!     (as two's complement), buffers a, b and out, the number of batches, then the
//!     `[out, a, b]` element offsets of each batch; an f16 or bf16 product carries six more
//!     words, the scratch byte offsets of the f32 copies of a, b and out, then their
//!     lengths in elements;
//!   - [`STEP_COPY`]: element bytes, rank, the destination's buffer and element offset, the
//!     source's, the index kind ([`INDEX_NONE`], [`INDEX_I32`], [`INDEX_I64`]), then the
//!     shape and the destination's and the source's strides (two's complement); an
//!     indexed copy then gives the index's buffer and element offset, the number of
//!     valid index values, the source stride of one index unit and the index's strides
//!     ([`crate::copy`]);
//!   - [`STEP_SCATTER`]: as [`STEP_COPY`] with an index (which then picks destination
//!     elements), plus, after the index kind, the accumulation ([`SCATTER_ADD_F16`] plus
//!     the element type's code plus 16 times the combination's, or 0 to write)
//!     ([`crate::copy::scatter`]);
//!   - [`STEP_SCAN`]: the element type ([`crate::ElemType`]'s code), rank,
//!     the summed dim, the destination's buffer and element offset, the source's, then the
//!     shape and the destination's and the source's strides ([`crate::scan::cumsum`]);
//!   - [`STEP_CONV`]: kind ([`CONV_FORWARD`], [`CONV_INPUT_GRAD`], [`CONV_WEIGHT_GRAD`]),
//!     dtype ([`FLOAT_F32`], [`FLOAT_F64`], [`FLOAT_F16`], [`FLOAT_BF16`]), layout (0: NCHW, 1: NHWC), the 16 sizes of
//!     [`crate::conv::Dims`] (n, c, h, w, co, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, g), the
//!     buffer and element offset of three operands ([`NO_BUFFER`] for none: the input, the
//!     weights in the order [`crate::conv::weight_order`] names and the bias; the output's
//!     gradient and the weights; the output's gradient and the input), then the result's
//!     buffer ([`crate::conv`]);
//!   - [`STEP_POOL`]: kind ([`POOL_MAX`]..), dtype of the result ([`FLOAT_F32`]..; unused
//!     by max pooling), the element type of a max pooling's input
//!     ([`POOL_F32`]..), layout (0: NCHW, 1: NHWC), the sizes n, c, h, w, oh, ow, the window
//!     (kernel, stride, padding and dilation, each along height then width), whether an
//!     average counts padding, the buffer and element offset of two operands (the input, or
//!     the output's gradient and, for max pooling, the input), then the result's buffer
//!     ([`crate::pool`]);
//!   - [`STEP_DROPOUT`]: the element type ([`crate::ElemType`]'s code), the probability
//!     (an f64's bits), the seed, the rank, the destination's buffer and element offset, the
//!     source's, then the shape and the destination's and the source's strides; call `c` of
//!     the model (counted in the tables' call counter) draws with
//!     [`crate::dropout::seed_of_call`]`(seed, c)`;
//!   - [`STEP_COND`] and [`STEP_LOOP`]: a branch or a loop over *blocks*, the steps of a
//!     body, whose buffers follow the model's in the table (as this module's `control`
//!     part reads them).

mod control;

use crate::copy;
use crate::gemm::{self, Product};
use crate::ranges::Ranges;
use half::{bf16, f16};

/// First word of every plan.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SMELTAOT");
/// The plan format this library reads (5: branches and loops, the buffer table's place in
/// the header, and scatters that combine by products, maxima and minima).
pub const FORMAT: u64 = 5;

/// A buffer that is an input (the word after the kind: its index).
pub const BUF_INPUT: u64 = 0;
/// A buffer in the scratch (its byte offset).
pub const BUF_SCRATCH: u64 = 1;
/// A constant of the model (its byte offset in the constant data).
pub const BUF_CONST: u64 = 2;

/// A fused kernel step.
pub const STEP_KERNEL: u64 = 0;
/// A GEMM step.
pub const STEP_GEMM: u64 = 1;
/// A strided (or indexed) copy step.
pub const STEP_COPY: u64 = 2;
/// Step tag: a copy whose index picks destination elements, written or added into.
pub const STEP_SCATTER: u64 = 5;
/// The first accumulation word of a scatter step (f16); then bf16, f32, f64, u8, i8, i16,
/// i32, i64 and bool follow in order (one more than the [`crate::ElemType`] code); 0 writes
/// instead.
pub const SCATTER_ADD_F16: u64 = 1;
/// Step tag: a running sum along one dim.
pub const STEP_SCAN: u64 = 6;
/// Step tag: a convolution or one of its gradients.
pub const STEP_CONV: u64 = 3;
/// Step tag: a pooling or one of its gradients.
pub const STEP_POOL: u64 = 4;
/// A branch: `cond`.
pub const STEP_COND: u64 = 7;
/// A training dropout, its mask drawn anew each call ([`crate::dropout`]).
pub const STEP_DROPOUT: u64 = 9;
/// A loop: `while_loop`, `fori_loop` or `scan`.
pub const STEP_LOOP: u64 = 8;
/// A loop that runs while its condition block gives true.
pub const LOOP_WHILE: u64 = 0;
/// A loop over the counter values `[lower, upper)`, read from two i64 buffers.
pub const LOOP_RANGE: u64 = 1;
/// A loop of a fixed number of iterations, forwards or backwards.
pub const LOOP_COUNT: u64 = 2;
/// A convolution.
pub const CONV_FORWARD: u64 = 0;
/// The gradient of a convolution for its input.
pub const CONV_INPUT_GRAD: u64 = 1;
/// The gradient of a convolution for its weights.
pub const CONV_WEIGHT_GRAD: u64 = 2;
/// Max pooling.
pub const POOL_MAX: u64 = 0;
/// Average pooling.
pub const POOL_AVG: u64 = 1;
/// Adaptive average pooling.
pub const POOL_ADAPTIVE_AVG: u64 = 2;
/// The gradient of max pooling.
pub const POOL_MAX_GRAD: u64 = 3;
/// The gradient of average pooling.
pub const POOL_AVG_GRAD: u64 = 4;
/// The gradient of adaptive average pooling.
pub const POOL_ADAPTIVE_AVG_GRAD: u64 = 5;
/// A convolution or pooling computing in f32.
pub const FLOAT_F32: u64 = 0;
/// A convolution or pooling computing in f64.
pub const FLOAT_F64: u64 = 1;
/// A convolution or pooling of f16, computing in f32 (rounded once, as eager).
pub const FLOAT_F16: u64 = 2;
/// A convolution or pooling of bf16, computing in f32 (rounded once, as eager).
pub const FLOAT_BF16: u64 = 3;
/// A max pooling's input of f32.
pub const POOL_F32: u64 = 0;
/// A max pooling's input of f64.
pub const POOL_F64: u64 = 1;
/// A max pooling's input of f16.
pub const POOL_F16: u64 = 2;
/// A max pooling's input of bf16.
pub const POOL_BF16: u64 = 3;
/// A max pooling's input of u8.
pub const POOL_U8: u64 = 4;
/// A max pooling's input of i8.
pub const POOL_I8: u64 = 5;
/// A max pooling's input of i16.
pub const POOL_I16: u64 = 6;
/// A max pooling's input of i32.
pub const POOL_I32: u64 = 7;
/// A max pooling's input of i64.
pub const POOL_I64: u64 = 8;
/// No buffer (a convolution without bias).
pub const NO_BUFFER: u64 = u64::MAX;

/// A copy without an index.
pub const INDEX_NONE: u64 = 0;
/// A copy through an `i32` index.
pub const INDEX_I32: u64 = 1;
/// A copy through an `i64` index.
pub const INDEX_I64: u64 = 2;

/// GEMM element types: f16 products, computed in f32 as the eager kernel does.
pub const GEMM_F16: u64 = 0;
/// f32 products.
pub const GEMM_F32: u64 = 1;
/// f64 products.
pub const GEMM_F64: u64 = 2;
/// bf16 products, computed in f32 as the eager kernel does.
pub const GEMM_BF16: u64 = 3;
/// u8 products ([`gemm::int_batches`]: wrapping i64 sums).
pub const GEMM_U8: u64 = 4;
/// i8 products.
pub const GEMM_I8: u64 = 5;
/// i16 products.
pub const GEMM_I16: u64 = 6;
/// i32 products.
pub const GEMM_I32: u64 = 7;
/// i64 products.
pub const GEMM_I64: u64 = 8;

/// Success.
pub const OK: i32 = 0;
/// `inputs` or `outputs` is NULL, or one of their entries is.
pub const ERR_NULL_POINTER: i32 = 1;
/// The scratch buffer is smaller than the model's scratch size.
pub const ERR_SCRATCH_TOO_SMALL: i32 = 2;
/// The CPU lacks an instruction set extension the code was compiled for.
pub const ERR_CPU_UNSUPPORTED: i32 = 3;
/// The model's tables are not a plan this library reads (a different smelt version).
pub const ERR_BAD_MODEL: i32 = 4;
/// An integer division or remainder by zero.
pub const ERR_ZERO_DIVISION: i32 = 5;
/// A kernel reported an error other than a division by zero.
pub const ERR_KERNEL: i32 = 6;
/// The scratch buffer was NULL and allocating one failed.
pub const ERR_OUT_OF_MEMORY: i32 = 7;

/// The scratch buffer is not aligned to [`SCRATCH_ALIGN`] bytes.
pub const ERR_SCRATCH_MISALIGNED: i32 = 8;
/// An index input (of `embedding`, `index_select`, `gather`) holds a value outside the
/// indexed dim.
pub const ERR_INDEX_OUT_OF_RANGE: i32 = 9;

/// The alignment a caller's scratch buffer needs (what `malloc` gives).
pub const SCRATCH_ALIGN: usize = 16;

/// Every error code with its name and message, for headers ([`error_message`] gives the
/// same messages NUL-terminated).
pub const ERRORS: &[(i32, &str, &str)] = &[
    (OK, "OK", "success"),
    (
        ERR_NULL_POINTER,
        "ERR_NULL_POINTER",
        "a NULL inputs or outputs array, or a NULL entry in one",
    ),
    (
        ERR_SCRATCH_TOO_SMALL,
        "ERR_SCRATCH_TOO_SMALL",
        "the scratch buffer is smaller than the model's scratch size",
    ),
    (
        ERR_CPU_UNSUPPORTED,
        "ERR_CPU_UNSUPPORTED",
        "this CPU lacks instructions the model was compiled for",
    ),
    (
        ERR_BAD_MODEL,
        "ERR_BAD_MODEL",
        "the model's tables do not match this run-time library",
    ),
    (
        ERR_ZERO_DIVISION,
        "ERR_ZERO_DIVISION",
        "integer division or remainder by zero",
    ),
    (ERR_KERNEL, "ERR_KERNEL", "a kernel reported an error"),
    (
        ERR_OUT_OF_MEMORY,
        "ERR_OUT_OF_MEMORY",
        "allocating the scratch buffer failed",
    ),
    (
        ERR_SCRATCH_MISALIGNED,
        "ERR_SCRATCH_MISALIGNED",
        "the scratch buffer is not 16-byte aligned",
    ),
    (
        ERR_INDEX_OUT_OF_RANGE,
        "ERR_INDEX_OUT_OF_RANGE",
        "an index input holds a value outside the dim it indexes",
    ),
];

/// The message of an error code, NUL-terminated for C.
pub fn error_message(code: i32) -> &'static str {
    match code {
        OK => "success\0",
        ERR_NULL_POINTER => "a NULL inputs or outputs array, or a NULL entry in one\0",
        ERR_SCRATCH_TOO_SMALL => "the scratch buffer is smaller than the model's scratch size\0",
        ERR_CPU_UNSUPPORTED => "this CPU lacks instructions the model was compiled for\0",
        ERR_BAD_MODEL => "the model's tables do not match this run-time library\0",
        ERR_ZERO_DIVISION => "integer division or remainder by zero\0",
        ERR_KERNEL => "a kernel reported an error\0",
        ERR_OUT_OF_MEMORY => "allocating the scratch buffer failed\0",
        ERR_SCRATCH_MISALIGNED => "the scratch buffer is not 16-byte aligned\0",
        ERR_INDEX_OUT_OF_RANGE => "an index input holds a value outside the dim it indexes\0",
        _ => "unknown error code\0",
    }
}

/// The CPU features a plan may require: bit `i` of its feature word is `FEATURES[i]`, named
/// as Cranelift's x86-64 setting and as `is_x86_feature_detected!`.
pub const FEATURES: [(&str, &str); 16] = [
    ("has_sse3", "sse3"),
    ("has_ssse3", "ssse3"),
    ("has_sse41", "sse4.1"),
    ("has_sse42", "sse4.2"),
    ("has_popcnt", "popcnt"),
    ("has_avx", "avx"),
    ("has_avx2", "avx2"),
    ("has_fma", "fma"),
    ("has_bmi1", "bmi1"),
    ("has_bmi2", "bmi2"),
    ("has_lzcnt", "lzcnt"),
    ("has_avx512f", "avx512f"),
    ("has_avx512vl", "avx512vl"),
    ("has_avx512dq", "avx512dq"),
    ("has_avx512vbmi", "avx512vbmi"),
    ("has_avx512bitalg", "avx512bitalg"),
];

/// Whether this CPU has feature `i` of [`FEATURES`].
#[cfg(target_arch = "x86_64")]
fn has_feature(i: usize) -> bool {
    match i {
        0 => is_x86_feature_detected!("sse3"),
        1 => is_x86_feature_detected!("ssse3"),
        2 => is_x86_feature_detected!("sse4.1"),
        3 => is_x86_feature_detected!("sse4.2"),
        4 => is_x86_feature_detected!("popcnt"),
        5 => is_x86_feature_detected!("avx"),
        6 => is_x86_feature_detected!("avx2"),
        7 => is_x86_feature_detected!("fma"),
        8 => is_x86_feature_detected!("bmi1"),
        9 => is_x86_feature_detected!("bmi2"),
        10 => is_x86_feature_detected!("lzcnt"),
        11 => is_x86_feature_detected!("avx512f"),
        12 => is_x86_feature_detected!("avx512vl"),
        13 => is_x86_feature_detected!("avx512dq"),
        14 => is_x86_feature_detected!("avx512vbmi"),
        15 => is_x86_feature_detected!("avx512bitalg"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn has_feature(_: usize) -> bool {
    false
}

/// The features of `mask` this CPU lacks, by name; a bit this library does not know is
/// reported as `"unknown"` (code for a newer library's CPU).
pub fn missing_features(mask: u64) -> Vec<&'static str> {
    let known = (1u64 << FEATURES.len()) - 1;
    let mut missing: Vec<&str> = (0..FEATURES.len())
        .filter(|&i| mask & (1 << i) != 0 && !has_feature(i))
        .map(|i| FEATURES[i].1)
        .collect();
    if mask & !known != 0 {
        missing.push("unknown");
    }
    missing
}

pub use crate::hot::PAR_MIN_ELEMS;

/// Chunks per thread for a parallel kernel, so uneven rows still balance.
pub const CHUNKS_PER_THREAD: usize = 4;

/// A generated kernel: `(slot table, first row, end row) -> error code`.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, i64, i64) -> i32;

/// The chunks a compiled kernel's `rows` split into over `threads`: edges on multiples of
/// `block`, the rows its code runs side by side as vector lanes (a chunk of 12 such rows
/// would run them one at a time).
pub fn row_chunks(rows: usize, threads: usize, block: usize) -> Ranges {
    Ranges::new(rows, threads * CHUNKS_PER_THREAD, block)
}

/// Runs rows `[0, rows)` of `f` over `table`, split into chunks over the threads (edges on
/// multiples of `block`, see [`row_chunks`]) when the kernel has `elems ≥
/// hot::par_min_elems()` elements; each chunk fences its streamed stores.
/// Returns the kernel's first nonzero code.
///
/// # Safety
/// `table` holds, for every slot of the kernel, a pointer to memory of that buffer's dtype
/// and size, readable (and writable where the kernel writes) and unused by others meanwhile.
pub unsafe fn run_rows(
    f: KernelFn,
    table: *const *mut u8,
    rows: usize,
    elems: usize,
    streams: bool,
    block: usize,
) -> i32 {
    let call = |table: SendTable, begin: usize, end: usize| {
        // SAFETY: the caller's contract; chunks cover disjoint rows.
        let rc = unsafe { f(table.0, begin as i64, end as i64) };
        if streams {
            // streamed stores are weakly ordered: complete them before anyone reads them
            crate::vmath::fence();
        }
        rc
    };
    let table = SendTable(table);
    // a small kernel never starts the thread pool
    if elems < crate::hot::par_min_elems() || rows < 2 || rayon::current_num_threads() < 2 {
        return call(table, 0, rows);
    }
    let threads = rayon::current_num_threads();
    use rayon::prelude::*;
    let chunks = row_chunks(rows, threads, block);
    (0..chunks.count())
        .into_par_iter()
        .map(|c| {
            let (begin, end) = chunks.get(c);
            call(table, begin, end)
        })
        .find_first(|&rc| rc != 0)
        .unwrap_or(0)
}

/// The pointers of one call, lent to the pool worker that runs it.
#[derive(Clone, Copy)]
struct CallPtrs(*const *const u8, *const *mut u8, *mut u8);
// SAFETY: the caller of `smelt_rt_run` lends this memory for the call, which waits for the
// worker that uses it.
unsafe impl Send for CallPtrs {}

impl CallPtrs {
    /// The pointers; a method, so that a closure captures the whole `CallPtrs`.
    fn get(self) -> (*const *const u8, *const *mut u8, *mut u8) {
        (self.0, self.1, self.2)
    }
}

#[derive(Clone, Copy)]
struct SendTable(*const *mut u8);
// SAFETY: the table and the buffers behind it are lent to the kernel for the call; chunks
// write disjoint rows.
unsafe impl Send for SendTable {}
// SAFETY: as for `Send`.
unsafe impl Sync for SendTable {}

/// A cursor over the plan's words; running off the end is [`ERR_BAD_MODEL`].
struct Words<'a> {
    w: &'a [u64],
    at: usize,
}

impl Words<'_> {
    fn next(&mut self) -> Result<u64, i32> {
        let v = *self.w.get(self.at).ok_or(ERR_BAD_MODEL)?;
        self.at += 1;
        Ok(v)
    }
    fn usize(&mut self) -> Result<usize, i32> {
        usize::try_from(self.next()?).map_err(|_| ERR_BAD_MODEL)
    }
    fn isize(&mut self) -> Result<isize, i32> {
        Ok(self.next()? as i64 as isize)
    }
    fn skip(&mut self, n: usize) -> Result<(), i32> {
        self.at = self.at.checked_add(n).ok_or(ERR_BAD_MODEL)?;
        Ok(())
    }
}

/// The tables of a compiled model, as its object file holds them.
#[repr(C)]
pub struct ModelTables {
    /// The plan's words.
    pub plan: *const u64,
    /// Number of plan words.
    pub plan_words: u64,
    /// The kernels' entry points, by index.
    pub kernels: *const KernelFn,
    /// Number of kernels.
    pub kernel_count: u64,
    /// The constants' bytes.
    pub consts: *const u8,
    /// Number of constant bytes.
    pub const_bytes: u64,
    /// The model's call counter (a `u64` in writable memory, used atomically, 0 before the
    /// first call), or NULL: call `c` of a model draws its dropout masks with
    /// [`crate::dropout::seed_of_call`]`(seed, c)`.
    pub calls: *mut u64,
}

/// The scratch size a plan needs, or None when it is not a plan of this format.
pub fn scratch_bytes(plan: &[u64]) -> Option<usize> {
    (plan.len() >= 9 && plan[0] == MAGIC && plan[1] == FORMAT)
        .then(|| usize::try_from(plan[3]).ok())
        .flatten()
}

/// Runs a compiled model (the function `NAME_run` calls): the contract is the one the
/// model's C header states.
///
/// # Safety
/// `tables` points to the model's own tables; `inputs` (`outputs`) to as many pointers as
/// the model has inputs (outputs), each to memory of that input's (output's) size; `scratch`
/// is NULL or points to `scratch_bytes` writable bytes. Nothing else writes the inputs or
/// touches the outputs and the scratch during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn smelt_rt_run(
    tables: *const ModelTables,
    inputs: *const *const u8,
    outputs: *const *mut u8,
    scratch: *mut u8,
    scratch_len: usize,
) -> i32 {
    if tables.is_null() {
        return ERR_BAD_MODEL;
    }
    // SAFETY: the caller's contract: the model's own tables.
    let t = unsafe { &*tables };
    let (Ok(words), Ok(kernels), Ok(consts)) = (
        usize::try_from(t.plan_words),
        usize::try_from(t.kernel_count),
        usize::try_from(t.const_bytes),
    ) else {
        return ERR_BAD_MODEL;
    };
    // SAFETY: the tables describe their own arrays.
    let (Some(plan), Some(kernels), Some(consts)) = (unsafe {
        (
            table(t.plan, words),
            table(t.kernels, kernels),
            table(t.consts, consts),
        )
    }) else {
        return ERR_BAD_MODEL;
    };
    let Some(need) = scratch_bytes(plan) else {
        return ERR_BAD_MODEL;
    };
    if !missing_features(plan[2]).is_empty() {
        return ERR_CPU_UNSUPPORTED;
    }
    if inputs.is_null() || outputs.is_null() {
        return ERR_NULL_POINTER;
    }
    let mut owned = None;
    let scratch = if scratch.is_null() {
        match Scratch::new(need) {
            Some(s) => owned.insert(s).ptr,
            None => return ERR_OUT_OF_MEMORY,
        }
    } else if scratch_len < need {
        return ERR_SCRATCH_TOO_SMALL;
    } else if scratch.align_offset(SCRATCH_ALIGN) != 0 {
        return ERR_SCRATCH_MISALIGNED;
    } else {
        scratch
    };
    let threaded = match wants_threads(plan) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let call = if t.calls.is_null() || !t.calls.is_aligned() {
        0
    } else {
        // SAFETY: the tables' counter is a u64 of the model's writable memory, which every
        // call uses atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(t.calls) }
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
    let ptrs = CallPtrs(inputs, outputs, scratch);
    let run = move || {
        let (inputs, outputs, scratch) = ptrs.get();
        let memory = (inputs, outputs, scratch, need);
        // SAFETY: the caller's contract, and a scratch of at least `need` bytes.
        unsafe { run_plan(plan, kernels, consts, memory, call) }
    };
    // on a pool worker, with the others polling for the kernels' chunks, when there are any
    let rc = if threaded {
        crate::hot::hot(None, run)
    } else {
        run()
    };
    drop(owned);
    match rc {
        Ok(()) => OK,
        Err(code) => code,
    }
}

/// The `len` elements at `p`: empty when `len` is 0, None when `p` is NULL or misaligned
/// otherwise.
///
/// # Safety
/// A non-NULL `p` points to `len` initialised elements that outlive the result.
unsafe fn table<'a, T>(p: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() || !p.is_aligned() {
        return None;
    }
    // SAFETY: the caller's contract; non-NULL and aligned, checked above.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The message of a code, as a NUL-terminated C string (`NAME_error_string` calls it).
#[unsafe(no_mangle)]
pub extern "C" fn smelt_rt_error_string(code: i32) -> *const std::ffi::c_char {
    error_message(code).as_ptr().cast()
}

/// A scratch buffer allocated for one call (the caller passed none), 64-byte aligned.
struct Scratch {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Scratch {
    fn new(bytes: usize) -> Option<Scratch> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(64), 64).ok()?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        (!ptr.is_null()).then_some(Scratch { ptr, layout })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// The memory a call's buffers live in.
struct Memory<'a> {
    inputs: *const *const u8,
    ninputs: usize,
    consts: &'a [u8],
    scratch: *mut u8,
    scratch_len: usize,
}

impl Memory<'_> {
    /// Where a buffer lives, checked against the memory it is in.
    fn buffer(&self, kind: u64, at: usize, bytes: usize) -> Result<*mut u8, i32> {
        let inside = |len: usize| at.checked_add(bytes).is_some_and(|e| e <= len);
        match kind {
            BUF_INPUT if at < self.ninputs => {
                // SAFETY: the caller passes one pointer per input.
                let p = unsafe { *self.inputs.add(at) };
                if p.is_null() && bytes > 0 {
                    return Err(ERR_NULL_POINTER);
                }
                Ok(p as *mut u8)
            }
            BUF_SCRATCH if inside(self.scratch_len) => Ok(self.scratch.wrapping_add(at)),
            // constants are only read: the plan never names them as a step's output
            BUF_CONST if inside(self.consts.len()) => {
                Ok(self.consts.as_ptr().wrapping_add(at) as *mut u8)
            }
            _ => Err(ERR_BAD_MODEL),
        }
    }
}

/// Whether some step of the plan splits across threads inside a polling call
/// ([`crate::hot`]). Only then does a call move to a pool worker: the hand-off costs more
/// than a whole call of a model of small steps on the caller's thread (`cargo bench --bench
/// aot`; BENCHMARKS.md).
fn wants_threads(plan: &[u64]) -> Result<bool, i32> {
    let mut w = Words { w: plan, at: 5 };
    let (nbuf, _, noutputs, nsteps) = (w.usize()?, w.usize()?, w.usize()?, w.usize()?);
    w.skip(nbuf.checked_mul(3).ok_or(ERR_BAD_MODEL)?)?;
    for _ in 0..noutputs {
        w.skip(3)?;
        let rank = w.usize()?;
        w.skip(rank.checked_mul(2).ok_or(ERR_BAD_MODEL)?)?;
    }
    splits(&mut w, nsteps)
}

/// Whether one of the next `nsteps` steps (those of a branch or loop's blocks included)
/// splits across threads; reads past them.
fn splits(w: &mut Words, nsteps: usize) -> Result<bool, i32> {
    let skip = |w: &mut Words, n: usize| w.skip(n);
    for _ in 0..nsteps {
        match w.next()? {
            STEP_KERNEL => {
                let (_, rows, elems) = (w.next()?, w.usize()?, w.usize()?);
                if crate::hot::kernel_splits(rows, elems) {
                    return Ok(true);
                }
                skip(w, 3)?;
                let slots = w.usize()?;
                skip(w, slots)?;
            }
            STEP_GEMM => {
                let dtype = w.next()?;
                let (m, n, k) = (w.usize()?, w.usize()?, w.usize()?);
                skip(w, 7)?;
                let batches = w.usize()?;
                if gemm::splits(m.saturating_mul(n).saturating_mul(k), batches) {
                    return Ok(true);
                }
                let copies = if gemm_in_f32(dtype) { 6 } else { 0 };
                skip(w, batches.saturating_mul(3).saturating_add(copies))?;
            }
            tag @ (STEP_COPY | STEP_SCATTER) => {
                let (_, rank) = (w.next()?, w.usize()?);
                skip(w, 4)?;
                let indexed = w.next()? != INDEX_NONE;
                if tag == STEP_SCATTER {
                    skip(w, 1)?;
                }
                let per_dim = if indexed { 4 } else { 3 };
                let fixed = if indexed { 4 } else { 0 };
                skip(w, rank.saturating_mul(per_dim).saturating_add(fixed))?;
            }
            STEP_SCAN => {
                let (_, rank) = (w.next()?, w.usize()?);
                skip(w, rank.saturating_mul(3).saturating_add(5))?;
            }
            STEP_CONV => {
                skip(w, 3)?;
                let d = conv_dims(w)?;
                let [_, _, out] = d.lens();
                if out.saturating_mul(d.kk()) >= crate::hot::par_min_elems() {
                    return Ok(true);
                }
                skip(w, 7)?;
            }
            STEP_POOL => {
                skip(w, 4)?;
                let (p, g) = pool_sizes(w)?;
                let [x, y] = p.lens();
                let visits = y.saturating_mul(g.kernel[0] * g.kernel[1]);
                if x.max(visits) >= crate::hot::par_min_elems() {
                    return Ok(true);
                }
                skip(w, 6)?;
            }
            STEP_DROPOUT => {
                skip(w, 3)?;
                let rank = w.usize()?;
                skip(w, rank.saturating_mul(3).saturating_add(4))?;
            }
            tag @ (STEP_COND | STEP_LOOP) => {
                if control::splits(w, tag)? {
                    return Ok(true);
                }
            }
            _ => return Err(ERR_BAD_MODEL),
        }
    }
    Ok(false)
}

/// The plan's body; see the module docs for the layout.
///
/// # Safety
/// As [`smelt_rt_run`], with a scratch of `scratch_len` writable bytes aligned to
/// [`SCRATCH_ALIGN`] (at least 8, a pointer's alignment).
unsafe fn run_plan(
    plan: &[u64],
    kernels: &[KernelFn],
    consts: &[u8],
    (inputs, outputs, scratch, scratch_len): (*const *const u8, *const *mut u8, *mut u8, usize),
    call: u64,
) -> Result<(), i32> {
    let mut w = Words { w: plan, at: 4 };
    let table_at = w.usize()?;
    let (nbuf, ninputs, noutputs, nsteps) = (w.usize()?, w.usize()?, w.usize()?, w.usize()?);
    // the buffer table lives in the scratch, at `table_at`
    let table_end = nbuf
        .checked_mul(8)
        .and_then(|b| b.checked_add(table_at))
        .ok_or(ERR_BAD_MODEL)?;
    if table_end > scratch_len || table_at % 8 != 0 {
        return Err(ERR_BAD_MODEL);
    }
    let bufs = scratch.wrapping_add(table_at) as *mut *mut u8;
    let mem = Memory {
        inputs,
        ninputs,
        consts,
        scratch,
        scratch_len,
    };
    for b in 0..nbuf {
        let (kind, at, bytes) = (w.next()?, w.usize()?, w.usize()?);
        let p = mem.buffer(kind, at, bytes)?;
        // SAFETY: the table's `nbuf` entries are inside the scratch and aligned (checked
        // above).
        unsafe { bufs.add(b).write(p) };
    }
    let outputs_at = w.at;
    // skip the outputs to reach the steps
    for _ in 0..noutputs {
        let (_buf, _size, _off, rank) = (w.next()?, w.next()?, w.next()?, w.usize()?);
        w.skip(rank.checked_mul(2).ok_or(ERR_BAD_MODEL)?)?;
    }
    let cx = Context {
        kernels,
        bufs,
        nbuf,
        scratch,
        scratch_len,
        call,
    };
    // SAFETY: this fn's contract, and a buffer table just filled.
    unsafe { run_steps(&cx, &mut w, 0, nsteps)? };
    let buf = |b: usize| cx.buf(b);
    let mut w = Words {
        w: plan,
        at: outputs_at,
    };
    for i in 0..noutputs {
        let (b, size, off, rank) = (w.usize()?, w.usize()?, w.usize()?, w.usize()?);
        let mut shape = [0usize; 16];
        let mut strides = [0isize; 16];
        if rank > 16 {
            return Err(ERR_BAD_MODEL);
        }
        for d in shape.iter_mut().take(rank) {
            *d = w.usize()?;
        }
        for s in strides.iter_mut().take(rank) {
            *s = w.isize()?;
        }
        // SAFETY: `i < noutputs`, and `outputs` points to one pointer per output of the model
        // (this fn's contract).
        let dst = unsafe { *outputs.add(i) };
        let n: usize = shape[..rank].iter().product();
        if n == 0 {
            continue;
        }
        if dst.is_null() {
            return Err(ERR_NULL_POINTER);
        }
        let src = buf(b)?.wrapping_add(off * size);
        // SAFETY: the view (offset, shape, strides) lies in buffer `b`, as the compiler laid
        // it out; `dst` is non-NULL and holds the output's `n` elements of `size` bytes (this
        // fn's contract).
        unsafe { copy_strided(src, dst, size, &shape[..rank], &strides[..rank]) };
    }
    Ok(())
}

/// What the steps of a call share: the kernels, the buffer table and the scratch.
struct Context<'a> {
    kernels: &'a [KernelFn],
    bufs: *mut *mut u8,
    nbuf: usize,
    scratch: *mut u8,
    scratch_len: usize,
    /// The call's number among the model's calls.
    call: u64,
}

impl Context<'_> {
    /// Buffer `b` of the table.
    fn buf(&self, b: usize) -> Result<*mut u8, i32> {
        if b < self.nbuf {
            // SAFETY: entry `b < nbuf` of the buffer table, inside the scratch and aligned
            // (checked by `run_plan`, which filled it).
            Ok(unsafe { *self.bufs.add(b) })
        } else {
            Err(ERR_BAD_MODEL)
        }
    }
}

/// Runs the next `nsteps` steps, whose buffer numbers start at entry `base` of the table.
///
/// # Safety
/// As [`run_plan`]: the buffers are laid out as the plan says; the steps trust that the
/// buffers hold the plan's sizes, as the compiler laid them out.
unsafe fn run_steps(cx: &Context, w: &mut Words, base: usize, nsteps: usize) -> Result<(), i32> {
    let buf = |b: usize| cx.buf(base.checked_add(b).ok_or(ERR_BAD_MODEL)?);
    let (kernels, scratch, scratch_len) = (cx.kernels, cx.scratch, cx.scratch_len);
    for _ in 0..nsteps {
        match w.next()? {
            STEP_KERNEL => {
                let (k, rows, elems) = (w.usize()?, w.usize()?, w.usize()?);
                let (streams, block) = (w.next()?, w.usize()?);
                let (table_at, slots) = (w.usize()?, w.usize()?);
                let f = *kernels.get(k).ok_or(ERR_BAD_MODEL)?;
                let end = slots
                    .checked_mul(8)
                    .and_then(|s| s.checked_add(table_at))
                    .ok_or(ERR_BAD_MODEL)?;
                if end > scratch_len || table_at % 8 != 0 {
                    return Err(ERR_BAD_MODEL);
                }
                let table = scratch.wrapping_add(table_at) as *mut *mut u8;
                for s in 0..slots {
                    let p = buf(w.usize()?)?;
                    // SAFETY: slot `s < slots` of the table: below `end <= scratch_len`,
                    // checked above, and aligned (`table_at` a multiple of 8 in an aligned
                    // scratch).
                    unsafe { table.add(s).write(p) };
                }
                // SAFETY: every slot was just filled with a buffer of the plan, which holds
                // the kernel's sizes (this fn's contract: the model's own tables); no other
                // code uses the buffers during the call.
                let rc = unsafe { run_rows(f, table, rows, elems, streams != 0, block) };
                match rc {
                    0 => {}
                    1 => return Err(ERR_ZERO_DIVISION),
                    _ => return Err(ERR_KERNEL),
                }
            }
            // SAFETY: the buffers are laid out as the plan says (this fn's contract), which is
            // `gemm_step`'s contract; `scratch_len` is the scratch's true size.
            STEP_GEMM => unsafe { gemm_step(w, &buf, scratch, scratch_len)? },
            // SAFETY: as for the GEMM: the copy's views lie in its buffers as laid out.
            STEP_COPY => unsafe { copy_step(w, &buf, false, [0, 0])? },
            // SAFETY: as for a copy.
            STEP_SCATTER => unsafe { copy_step(w, &buf, true, [0, 0])? },
            // SAFETY: as for a copy: the walks lie in their buffers as laid out.
            STEP_SCAN => unsafe { scan_step(w, &buf)? },
            // SAFETY: as for the GEMM: the operands lie in their buffers as laid out.
            STEP_CONV => unsafe { conv_step(w, &buf)? },
            // SAFETY: as for the GEMM: the operands lie in their buffers as laid out.
            STEP_POOL => unsafe { pool_step(w, &buf)? },
            // SAFETY: as for a copy.
            STEP_DROPOUT => unsafe { dropout_step(w, &buf, cx.call)? },
            // SAFETY: as for a copy: the blocks' steps lie in their buffers as laid out.
            STEP_COND => unsafe { control::cond(cx, w)? },
            // SAFETY: as for a branch.
            STEP_LOOP => unsafe { control::run_loop(cx, w)? },
            _ => return Err(ERR_BAD_MODEL),
        }
    }
    Ok(())
}

/// Copies the strided view at `src` into contiguous `dst`, `size` bytes an element.
///
/// # Safety
/// The view's elements are readable; `dst` holds the view's element count.
unsafe fn copy_strided(src: *const u8, dst: *mut u8, size: usize, shape: &[usize], st: &[isize]) {
    let n: usize = shape.iter().product();
    let contiguous = {
        let mut expect = 1isize;
        shape.iter().zip(st).rev().all(|(&d, &s)| {
            let ok = d == 1 || s == expect;
            expect *= d as isize;
            ok
        })
    };
    if contiguous {
        // SAFETY: the caller's contract; a contiguous view is `n` adjacent elements.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n * size) };
        return;
    }
    let mut idx = [0usize; 16];
    let rank = shape.len();
    for i in 0..n {
        let off: isize = (0..rank).map(|d| idx[d] as isize * st[d]).sum();
        // SAFETY: the element at the multi-index is inside the view; `i < n`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.wrapping_offset(off * size as isize),
                dst.add(i * size),
                size,
            )
        };
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Reads and runs one copy step, its destination and source `shift` elements further on.
///
/// # Safety
/// The buffers are laid out as the plan says: every view of the step lies in its buffer
/// for every index value in range.
unsafe fn copy_step(
    w: &mut Words,
    buf: &dyn Fn(usize) -> Result<*mut u8, i32>,
    scatter: bool,
    shift: [isize; 2],
) -> Result<(), i32> {
    let (size, rank) = (w.usize()?, w.usize()?);
    let (dst, dst_off) = (buf(w.usize()?)?, w.isize()? + shift[0]);
    let (src, src_off) = (buf(w.usize()?)?, w.isize()? + shift[1]);
    let kind = w.next()?;
    let add = match scatter {
        true => add_of(w.next()?)?,
        false => None,
    };
    if rank > copy::MAX_RANK
        || !matches!(kind, INDEX_NONE | INDEX_I32 | INDEX_I64)
        || (scatter && kind == INDEX_NONE)
    {
        return Err(ERR_BAD_MODEL);
    }
    let mut dims = [[0isize; copy::MAX_RANK]; 4];
    let mut shape = [0usize; copy::MAX_RANK];
    for d in shape.iter_mut().take(rank) {
        *d = w.usize()?;
    }
    for part in dims.iter_mut().take(2) {
        for s in part.iter_mut().take(rank) {
            *s = w.isize()?;
        }
    }
    let mut index = None;
    if kind != INDEX_NONE {
        let (ib, ioff) = (buf(w.usize()?)?, w.isize()?);
        let (count, step) = (w.usize()?, w.isize()?);
        for s in dims[2].iter_mut().take(rank) {
            *s = w.isize()?;
        }
        let wide = kind == INDEX_I64;
        let bytes = if wide { 8 } else { 4 };
        index = Some((ib.wrapping_offset(ioff * bytes), wide, count, step));
    }
    let [d, s, i, _] = &dims;
    let c = copy::Copy {
        size,
        shape: &shape[..rank],
        dst: &d[..rank],
        src: &s[..rank],
        index: index.map(|(ptr, wide, size, step)| copy::Index {
            ptr,
            wide,
            strides: &i[..rank],
            size,
            step,
        }),
    };
    let at = |p: *mut u8, off: isize| p.wrapping_offset(off * size as isize);
    let (d, s) = (at(dst, dst_off), at(src, src_off));
    // SAFETY: the views lie in their buffers (this fn's contract); a step never copies
    // a buffer into itself.
    let r = unsafe {
        match scatter {
            true => copy::scatter(&c, add, d, s),
            false => copy::run(&c, d, s),
        }
    };
    r.map_err(|_| ERR_INDEX_OUT_OF_RANGE)
}

/// Runs a scan step.
///
/// # Safety
/// The walks lie in their buffers as the plan says, and do not overlap.
unsafe fn scan_step(w: &mut Words, buf: &dyn Fn(usize) -> Result<*mut u8, i32>) -> Result<(), i32> {
    let kind = w.next()?;
    let (rank, dim) = (w.usize()?, w.usize()?);
    let (dst, dst_off) = (buf(w.usize()?)?, w.isize()?);
    let (src, src_off) = (buf(w.usize()?)?, w.isize()?);
    let kind = crate::ElemType::of_code(kind).ok_or(ERR_BAD_MODEL)?;
    if rank > 0 && dim >= rank {
        return Err(ERR_BAD_MODEL);
    }
    let (shape, strides) = walk_words(w, rank)?;
    use crate::ElemType as E;
    let (in_size, out_size) = match kind {
        E::F16 | E::BF16 => (2, 2),
        E::F32 => (4, 4),
        E::F64 => (8, 8),
        E::U8 | E::I8 | E::Bool => (1, 8),
        E::I16 => (2, 8),
        E::I32 => (4, 8),
        E::I64 => (8, 8),
    };
    let (y, x) = (
        dst.wrapping_offset(dst_off * out_size),
        src.wrapping_offset(src_off * in_size),
    );
    // SAFETY: this fn's contract.
    unsafe {
        crate::scan::cumsum(
            kind,
            (&shape[..rank], dim),
            (y, &strides[0][..rank]),
            (x, &strides[1][..rank]),
        )
    };
    Ok(())
}

/// The shape and the destination's and the source's strides of a walk of `rank` dims.
type WalkWords = ([usize; copy::MAX_RANK], [[isize; copy::MAX_RANK]; 2]);

/// Reads the shape and the two stride lists of a walk of `rank` dims.
fn walk_words(w: &mut Words, rank: usize) -> Result<WalkWords, i32> {
    if rank > copy::MAX_RANK {
        return Err(ERR_BAD_MODEL);
    }
    let mut shape = [0usize; copy::MAX_RANK];
    let mut strides = [[0isize; copy::MAX_RANK]; 2];
    for d in shape.iter_mut().take(rank) {
        *d = w.usize()?;
    }
    for part in &mut strides {
        for s in part.iter_mut().take(rank) {
            *s = w.isize()?;
        }
    }
    Ok((shape, strides))
}

/// Reads and runs one dropout step of call `call`.
///
/// # Safety
/// As [`copy_step`]: the walks lie in their buffers as laid out.
unsafe fn dropout_step(
    w: &mut Words,
    buf: &dyn Fn(usize) -> Result<*mut u8, i32>,
    call: u64,
) -> Result<(), i32> {
    let elem = crate::ElemType::of_code(w.next()?).ok_or(ERR_BAD_MODEL)?;
    let (p, seed, rank) = (f64::from_bits(w.next()?), w.next()?, w.usize()?);
    let (dst, dst_off) = (buf(w.usize()?)?, w.isize()?);
    let (src, src_off) = (buf(w.usize()?)?, w.isize()?);
    let (shape, strides) = walk_words(w, rank)?;
    let walk = crate::dropout::Walk {
        elem,
        shape: &shape[..rank],
        dst: &strides[0][..rank],
        src: &strides[1][..rank],
    };
    let size = elem.size() as isize;
    let (y, x) = (
        dst.wrapping_offset(dst_off * size),
        src.wrapping_offset(src_off * size),
    );
    let seed = crate::dropout::seed_of_call(seed, call);
    // SAFETY: this fn's contract.
    match unsafe { crate::dropout::step(&walk, p, seed, y, x) } {
        true => Ok(()),
        false => Err(ERR_BAD_MODEL),
    }
}

/// The accumulation word of a scatter step: 0 to write, else [`SCATTER_ADD_F16`] plus the
/// element type's code plus 16 times the combination's ([`copy::Combine::code`]).
fn add_of(word: u64) -> Result<Option<(copy::Combine, crate::ElemType)>, i32> {
    match word {
        0 => Ok(None),
        w => {
            let w = w - SCATTER_ADD_F16;
            let how = usize::try_from(w / 16).map_err(|_| ERR_BAD_MODEL)?;
            let how = *copy::Combine::ALL.get(how).ok_or(ERR_BAD_MODEL)?;
            let elem = crate::ElemType::of_code(w % 16).ok_or(ERR_BAD_MODEL)?;
            Ok(Some((how, elem)))
        }
    }
}

/// The sizes of a convolution step.
fn conv_dims(w: &mut Words) -> Result<crate::conv::Dims, i32> {
    let mut v = [0usize; 16];
    for x in &mut v {
        *x = w.usize()?;
    }
    let d = crate::conv::Dims::from_array(v);
    if d.consistent() {
        Ok(d)
    } else {
        Err(ERR_BAD_MODEL)
    }
}

/// A step's operand: its buffer and element offset, or none.
fn operand(w: &mut Words, buf: &dyn Fn(usize) -> Result<*mut u8, i32>) -> Result<Operand, i32> {
    let (b, off) = (w.next()?, w.usize()?);
    if b == NO_BUFFER {
        return Ok(None);
    }
    Ok(Some((
        buf(usize::try_from(b).map_err(|_| ERR_BAD_MODEL)?)?,
        off,
    )))
}

/// The layout word of a step: whether its buffers are NHWC.
fn nhwc_of(layout: u64) -> Result<bool, i32> {
    match layout {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ERR_BAD_MODEL),
    }
}

/// `n` elements of `T` from element `off` of `p`, or an empty slice for none.
///
/// # Safety
/// `p + off` holds `n` elements of `T`, aligned, that nothing writes meanwhile.
unsafe fn elems<'a, T>(p: Operand, n: usize) -> &'a [T] {
    match p {
        // SAFETY: as the caller promises.
        Some((p, off)) => unsafe {
            std::slice::from_raw_parts((p as *const T).wrapping_add(off), n)
        },
        None => &[],
    }
}

/// Runs a convolution step.
///
/// # Safety
/// The operands lie in their buffers as the sizes say, and the result overlaps none.
unsafe fn conv_step(w: &mut Words, buf: &dyn Fn(usize) -> Result<*mut u8, i32>) -> Result<(), i32> {
    let (kind, dtype, nhwc) = (w.next()?, w.next()?, nhwc_of(w.next()?)?);
    let d = conv_dims(w)?;
    let (a, b, c) = (operand(w, buf)?, operand(w, buf)?, operand(w, buf)?);
    let out = buf(w.usize()?)?;
    /// The step on `A`.
    ///
    /// # Safety
    /// As `conv_step`'s, for element type `A`.
    unsafe fn run<A: crate::conv::Real>(
        kind: u64,
        d: &crate::conv::Dims,
        nhwc: bool,
        (a, b, c): OperandsOf,
        out: *mut u8,
    ) -> Result<(), i32> {
        use crate::conv;
        let [xn, wn, yn] = d.lens();
        if a.is_none() || b.is_none() {
            return Err(ERR_BAD_MODEL);
        }
        // SAFETY: the caller's contract: each operand holds its elements, the result no
        // operand's.
        unsafe {
            let at = |n| std::slice::from_raw_parts_mut(out as *mut A, n);
            match kind {
                CONV_FORWARD => {
                    let bias = c.map(|_| elems::<A>(c, d.co));
                    conv::forward((elems(a, xn), elems(b, wn), bias), d, nhwc, at(yn), None);
                }
                CONV_INPUT_GRAD => {
                    conv::backward_input(elems(a, yn), elems(b, wn), d, nhwc, at(xn))
                }
                CONV_WEIGHT_GRAD => {
                    let dw = conv::backward_weight(elems::<A>(a, yn), elems(b, xn), d, nhwc);
                    at(wn).copy_from_slice(&dw);
                }
                _ => return Err(ERR_BAD_MODEL),
            }
        }
        Ok(())
    }
    // element counts of the operands and of the result
    let [xn, wn, yn] = d.lens();
    let (ins, out_n) = match kind {
        CONV_FORWARD => ([xn, wn, d.co], yn),
        CONV_INPUT_GRAD => ([yn, wn, 0], xn),
        _ => ([yn, xn, 0], wn),
    };
    let ins = [(a, ins[0]), (b, ins[1]), (c, ins[2])];
    let f32_run = |[a, b, c]: [Operand; 3], out: *mut u8| {
        // SAFETY: this fn's contract, on the f32 copies `in_f32` made.
        unsafe { run::<f32>(kind, &d, nhwc, (a, b, c), out) }
    };
    // SAFETY: this fn's contract.
    unsafe {
        match dtype {
            FLOAT_F32 => run::<f32>(kind, &d, nhwc, (a, b, c), out),
            FLOAT_F64 => run::<f64>(kind, &d, nhwc, (a, b, c), out),
            FLOAT_F16 => in_f32::<f16>(ins, (out, out_n), f32_run),
            FLOAT_BF16 => in_f32::<bf16>(ins, (out, out_n), f32_run),
            _ => Err(ERR_BAD_MODEL),
        }
    }
}

/// An operand of a step: a buffer and an element offset, or none.
type Operand = Option<(*mut u8, usize)>;

/// Up to three operands of a step.
type OperandsOf = (Operand, Operand, Operand);

/// A half-precision element: convolutions and averages compute it in f32, rounded once.
trait Half: Copy + 'static {
    fn widen(self) -> f32;
    fn narrow(v: f32) -> Self;
}
impl Half for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> f16 {
        f16::from_f32(v)
    }
}
impl Half for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}

/// Runs `f` on f32 copies of the half-precision operands `ins` (each with its element
/// count), then rounds its f32 result of `n` elements into `out`, as the eager kernels do.
///
/// # Safety
/// Each operand holds its count of `H` elements, and `out` holds `n`.
unsafe fn in_f32<H: Half>(
    ins: [(Operand, usize); 3],
    (out, n): (*mut u8, usize),
    f: impl FnOnce([Operand; 3], *mut u8) -> Result<(), i32>,
) -> Result<(), i32> {
    let wide = ins.map(|(p, len)| {
        // SAFETY: as the caller promises.
        let src = unsafe { elems::<H>(p, len) };
        p.map(|_| src.iter().map(|h| h.widen()).collect::<Vec<f32>>())
    });
    let ops = wide
        .each_ref()
        .map(|w| w.as_ref().map(|v| (v.as_ptr() as *mut u8, 0)));
    let mut y = vec![0.0f32; n];
    f(ops, y.as_mut_ptr() as *mut u8)?;
    // SAFETY: as the caller promises.
    let dst = unsafe { std::slice::from_raw_parts_mut(out as *mut H, n) };
    for (d, &v) in dst.iter_mut().zip(&y) {
        *d = H::narrow(v);
    }
    Ok(())
}

/// The sizes and window of a pooling step (the layout word already read).
fn pool_sizes(w: &mut Words) -> Result<(crate::pool::Plan, crate::pool::Geometry), i32> {
    let mut v = [0usize; 14];
    for x in &mut v {
        *x = w.usize()?;
    }
    let [n, c, h, wd, oh, ow, k0, k1, s0, s1, p0, p1, d0, d1] = v;
    let p = crate::pool::Plan {
        n,
        c,
        h,
        w: wd,
        oh,
        ow,
        nhwc: false,
    };
    let g = crate::pool::Geometry {
        kernel: [k0, k1],
        stride: [s0, s1],
        padding: [p0, p1],
        dilation: [d0, d1],
    };
    match p.consistent() && g.consistent() {
        true => Ok((p, g)),
        false => Err(ERR_BAD_MODEL),
    }
}

/// Runs a pooling step.
///
/// # Safety
/// The operands lie in their buffers as the sizes say, and the result overlaps none.
unsafe fn pool_step(w: &mut Words, buf: &dyn Fn(usize) -> Result<*mut u8, i32>) -> Result<(), i32> {
    use crate::pool;
    let (kind, dtype, x_dtype) = (w.next()?, w.next()?, w.next()?);
    let nhwc = nhwc_of(w.next()?)?;
    let (mut p, g) = pool_sizes(w)?;
    p.nhwc = nhwc;
    let include_pad = w.next()? != 0;
    let (a, b) = (operand(w, buf)?, operand(w, buf)?);
    let out = buf(w.usize()?)?;
    if a.is_none() || (kind == POOL_MAX_GRAD && b.is_none()) {
        return Err(ERR_BAD_MODEL);
    }
    /// The kinds that read and write `A` only.
    ///
    /// # Safety
    /// As `pool_step`'s, for element type `A`.
    unsafe fn floats<A: pool::Real>(
        kind: u64,
        a: Operand,
        out: *mut u8,
        (p, g, include_pad): (&pool::Plan, &pool::Geometry, bool),
    ) -> Result<(), i32> {
        let [xn, yn] = p.lens();
        // SAFETY: the caller's contract.
        unsafe {
            let at = |n| std::slice::from_raw_parts_mut(out as *mut A, n);
            match kind {
                POOL_AVG => pool::avg_forward(elems(a, xn), p, g, include_pad, at(yn)),
                POOL_ADAPTIVE_AVG => pool::adaptive_avg_forward(elems(a, xn), p, at(yn)),
                POOL_AVG_GRAD => pool::avg_backward(elems(a, yn), p, g, include_pad, at(xn)),
                POOL_ADAPTIVE_AVG_GRAD => pool::adaptive_avg_backward(elems(a, yn), p, at(xn)),
                _ => return Err(ERR_BAD_MODEL),
            }
        }
        Ok(())
    }
    /// Max pooling of an input of `T`, its gradient in `A`.
    ///
    /// # Safety
    /// As `pool_step`'s, for element types `T` and `A`.
    unsafe fn max<T: pool::Elem, A: pool::Real>(
        kind: u64,
        (a, b): (Operand, Operand),
        out: *mut u8,
        (p, g): (&pool::Plan, &pool::Geometry),
    ) -> Result<(), i32> {
        let [xn, yn] = p.lens();
        // SAFETY: the caller's contract.
        unsafe {
            match kind {
                POOL_MAX => {
                    let y = std::slice::from_raw_parts_mut(out as *mut T, yn);
                    pool::max_forward(elems::<T>(a, xn), p, g, y);
                }
                POOL_MAX_GRAD => {
                    let dx = std::slice::from_raw_parts_mut(out as *mut A, xn);
                    pool::max_backward(elems::<A>(a, yn), elems::<T>(b, xn), p, g, dx);
                }
                _ => return Err(ERR_BAD_MODEL),
            }
        }
        Ok(())
    }
    macro_rules! max_of {
        ($a:ty) => {
            // SAFETY: this fn's contract.
            unsafe {
                let (ops, pg) = ((a, b), (&p, &g));
                match x_dtype {
                    POOL_F32 => max::<f32, $a>(kind, ops, out, pg),
                    POOL_F64 => max::<f64, $a>(kind, ops, out, pg),
                    POOL_F16 => max::<f16, $a>(kind, ops, out, pg),
                    POOL_BF16 => max::<bf16, $a>(kind, ops, out, pg),
                    POOL_U8 => max::<u8, $a>(kind, ops, out, pg),
                    POOL_I8 => max::<i8, $a>(kind, ops, out, pg),
                    POOL_I16 => max::<i16, $a>(kind, ops, out, pg),
                    POOL_I32 => max::<i32, $a>(kind, ops, out, pg),
                    POOL_I64 => max::<i64, $a>(kind, ops, out, pg),
                    _ => Err(ERR_BAD_MODEL),
                }
            }
        };
    }
    let [xn, yn] = p.lens();
    // the gradient of max pooling in f16 or bf16: computed in f32 and rounded once, as the
    // averages and their gradients (`floats`), whose operand and result counts these are
    let (a_n, out_n) = match kind {
        POOL_MAX_GRAD | POOL_AVG_GRAD | POOL_ADAPTIVE_AVG_GRAD => (yn, xn),
        _ => (xn, yn),
    };
    let halves = kind != POOL_MAX && matches!(dtype, FLOAT_F16 | FLOAT_BF16);
    if halves {
        let run = |[a, _, _]: [Operand; 3], out: *mut u8| match kind {
            POOL_MAX_GRAD => {
                let (ops, pg) = ((a, b), (&p, &g));
                // SAFETY: this fn's contract, on the f32 copies `in_f32` made.
                unsafe {
                    match x_dtype {
                        POOL_F16 => max::<f16, f32>(kind, ops, out, pg),
                        POOL_BF16 => max::<bf16, f32>(kind, ops, out, pg),
                        // the input has the gradient's half dtype
                        _ => Err(ERR_BAD_MODEL),
                    }
                }
            }
            // SAFETY: as above.
            _ => unsafe { floats::<f32>(kind, a, out, (&p, &g, include_pad)) },
        };
        let ins = [(a, a_n), (None, 0), (None, 0)];
        // SAFETY: this fn's contract.
        return unsafe {
            match dtype {
                FLOAT_F16 => in_f32::<f16>(ins, (out, out_n), run),
                _ => in_f32::<bf16>(ins, (out, out_n), run),
            }
        };
    }
    match (kind, dtype) {
        (POOL_MAX | POOL_MAX_GRAD, FLOAT_F64) => max_of!(f64),
        (POOL_MAX | POOL_MAX_GRAD, _) => max_of!(f32),
        // SAFETY: this fn's contract.
        (_, FLOAT_F32) => unsafe { floats::<f32>(kind, a, out, (&p, &g, include_pad)) },
        // SAFETY: this fn's contract.
        (_, FLOAT_F64) => unsafe { floats::<f64>(kind, a, out, (&p, &g, include_pad)) },
        _ => Err(ERR_BAD_MODEL),
    }
}

/// An integer product of a GEMM step, written (not accumulated).
///
/// # Safety
/// As [`gemm::int_batches`].
unsafe fn int<T: gemm::IntElem>(
    p: &Product,
    (a, b, out): (*mut u8, *mut u8, *mut u8),
    offs: &[[usize; 3]],
    threads: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { gemm::int_batches::<T>(p, (a as _, b as _, out as _), offs, false, threads) }
}

/// Reads and runs one GEMM step.
///
/// # Safety
/// The buffers are laid out as the plan says.
unsafe fn gemm_step(
    w: &mut Words,
    buf: &dyn Fn(usize) -> Result<*mut u8, i32>,
    scratch: *mut u8,
    scratch_len: usize,
) -> Result<(), i32> {
    let dtype = w.next()?;
    let (m, n, k) = (w.usize()?, w.usize()?, w.usize()?);
    let a = (w.isize()?, w.isize()?);
    let b = (w.isize()?, w.isize()?);
    let (pa, pb, po) = (buf(w.usize()?)?, buf(w.usize()?)?, buf(w.usize()?)?);
    let batches = w.usize()?;
    let mut offs = [[0usize; 3]; 64];
    let start = w.at;
    let p = Product { m, n, k, a, b };
    // a small product never starts the thread pool
    let threads = if m * n * k >= gemm::PAR_FLOPS || batches > 1 {
        rayon::current_num_threads()
    } else {
        1
    };
    // a bf16 product runs in f32 on copies in the scratch, as the eager kernel does; the
    // copies' offsets and lengths follow the batch offsets
    let mut copies = None;
    if gemm_in_f32(dtype) {
        w.at = start + batches.checked_mul(3).ok_or(ERR_BAD_MODEL)?;
        let (a32, b32, o32) = (w.usize()?, w.usize()?, w.usize()?);
        let (alen, blen, olen) = (w.usize()?, w.usize()?, w.usize()?);
        let mut f32s = [std::ptr::null_mut::<f32>(); 3];
        for (j, (at, len)) in [(a32, alen), (b32, blen), (o32, olen)]
            .into_iter()
            .enumerate()
        {
            if at % 4 != 0 || at.checked_add(len * 4).is_none_or(|e| e > scratch_len) {
                return Err(ERR_BAD_MODEL);
            }
            f32s[j] = scratch.wrapping_add(at) as *mut f32;
        }
        // SAFETY: the operands hold `alen` and `blen` bf16s; the copies are in the scratch.
        unsafe {
            for (src, dst, len) in [(pa, f32s[0], alen), (pb, f32s[1], blen)] {
                for i in 0..len {
                    let x = match dtype {
                        GEMM_F16 => (src as *const f16).add(i).read_unaligned().to_f32(),
                        _ => (src as *const bf16).add(i).read_unaligned().to_f32(),
                    };
                    dst.add(i).write(x);
                }
            }
        }
        copies = Some((f32s, olen, w.at));
        w.at = start;
    }
    let (kind, (xa, xb, xo)) = match copies {
        Some((f, _, _)) => (
            GEMM_F32,
            (f[0] as *mut u8, f[1] as *mut u8, f[2] as *mut u8),
        ),
        None => (dtype, (pa, pb, po)),
    };
    // batches come in groups of 64 so that no call allocates
    let mut done = 0;
    while done < batches {
        let c = (batches - done).min(offs.len());
        for o in offs.iter_mut().take(c) {
            *o = [w.usize()?, w.usize()?, w.usize()?];
        }
        let offs = &offs[..c];
        // SAFETY: the plan's sizes and offsets, as the compiler laid them out.
        unsafe {
            match kind {
                GEMM_F32 => {
                    gemm::batches::<f32>(&p, (xa as _, xb as _, xo as _), offs, None, threads)
                }
                GEMM_F64 => {
                    gemm::batches::<f64>(&p, (xa as _, xb as _, xo as _), offs, None, threads)
                }
                GEMM_U8 => int::<u8>(&p, (xa, xb, xo), offs, threads),
                GEMM_I8 => int::<i8>(&p, (xa, xb, xo), offs, threads),
                GEMM_I16 => int::<i16>(&p, (xa, xb, xo), offs, threads),
                GEMM_I32 => int::<i32>(&p, (xa, xb, xo), offs, threads),
                GEMM_I64 => int::<i64>(&p, (xa, xb, xo), offs, threads),
                _ => return Err(ERR_BAD_MODEL),
            }
        }
        done += c;
    }
    if let Some((f, olen, end)) = copies {
        // SAFETY: the result's copy holds `olen` f32s; the output holds `olen` halves.
        unsafe {
            for i in 0..olen {
                let x = f[2].add(i).read();
                match dtype {
                    GEMM_F16 => (po as *mut f16).add(i).write(f16::from_f32(x)),
                    _ => (po as *mut bf16).add(i).write(bf16::from_f32(x)),
                }
            }
        }
        w.at = end;
    }
    Ok(())
}

/// Whether products of this GEMM dtype run in f32 on copies in the scratch (the halves,
/// which PyTorch too sums in f32 and rounds once).
fn gemm_in_f32(dtype: u64) -> bool {
    dtype == GEMM_F16 || dtype == GEMM_BF16
}

/// A nonzero result of a compiled model's entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AotError {
    /// The code (`ERR_*`).
    pub code: i32,
}

impl std::fmt::Display for AotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let msg = error_message(self.code);
        write!(f, "{} (code {})", &msg[..msg.len() - 1], self.code)
    }
}

impl std::error::Error for AotError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model with no steps whose output is its input (4 f32s), under `features`.
    fn identity(features: u64) -> Vec<u64> {
        let mut w = vec![MAGIC, FORMAT, features, 64, 0, 1, 1, 1, 0];
        w.extend([BUF_INPUT, 0, 16]);
        w.extend([0, 4, 0, 1, 4, 1]);
        w
    }

    #[test]
    fn only_plans_with_a_large_step_move_to_the_pool() {
        let big = crate::hot::PAR_MIN_ELEMS_HOT as u64;
        // the identity's header, buffer and output, then `steps`
        let with = |steps: &[&[u64]]| {
            let mut w = identity(0);
            w[8] = steps.len() as u64;
            for s in steps {
                w.extend_from_slice(s);
            }
            w
        };
        let kernel = |rows: u64, elems: u64| vec![STEP_KERNEL, 0, rows, elems, 0, 1, 64, 2, 0, 0];
        // a bf16 GEMM of one small batch: its offsets and the six words of its f32 copies
        let bf16: Vec<u64> = vec![
            STEP_GEMM, GEMM_BF16, 2, 2, 2, 2, 1, 2, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 4, 4,
        ];
        assert_eq!(wants_threads(&identity(0)), Ok(false));
        assert_eq!(wants_threads(&with(&[&kernel(4, 64)])), Ok(false));
        assert_eq!(wants_threads(&with(&[&kernel(1, big)])), Ok(false));
        assert_eq!(wants_threads(&with(&[&kernel(4, big)])), Ok(true));
        // the walk reads past the small steps to the large one
        assert_eq!(
            wants_threads(&with(&[&kernel(4, 64), &bf16, &kernel(8, big)])),
            Ok(true)
        );
        assert_eq!(wants_threads(&with(&[&bf16, &kernel(8, 64)])), Ok(false));
        // a batch of small products splits across the batch once it is large enough
        let batched = |count: u64| {
            let mut g = vec![STEP_GEMM, GEMM_F32, 2, 2, 2, 2, 1, 2, 1, 0, 0, 0, count];
            g.extend((0..count).flat_map(|_| [0, 0, 0]));
            g
        };
        assert_eq!(wants_threads(&with(&[&batched(2)])), Ok(false));
        let many = (gemm::PAR_FLOPS / 8) as u64;
        assert_eq!(wants_threads(&with(&[&batched(many)])), Ok(true));
        // the walk looks into the blocks of branches and loops
        let block = |steps: &[Vec<u64>]| {
            let words: Vec<u64> = steps.concat();
            let mut b = vec![0, steps.len() as u64, words.len() as u64];
            b.extend(words);
            b
        };
        let none = [0u64, 0];
        let looped = |body: Vec<u64>| {
            let mut l = vec![STEP_LOOP, LOOP_COUNT, 3, 0, 0, 0, NO_BUFFER, 0];
            l.extend(none.repeat(2));
            l.extend(block(&[]));
            l.extend([NO_BUFFER, 0]);
            l.extend(body);
            l.extend(none.repeat(3));
            l
        };
        let branch = |then: Vec<u64>, other: Vec<u64>| {
            let mut c = vec![STEP_COND, 0, 0];
            for arm in [then, other] {
                c.push((arm.len() + 4) as u64);
                c.extend(none);
                c.extend(arm);
                c.extend(none);
            }
            c
        };
        let small = block(&[kernel(4, 64)]);
        let large = block(&[kernel(4, 64), kernel(4, big)]);
        assert_eq!(wants_threads(&with(&[&looped(small.clone())])), Ok(false));
        assert_eq!(wants_threads(&with(&[&looped(large.clone())])), Ok(true));
        let both = branch(small.clone(), small.clone());
        assert_eq!(wants_threads(&with(&[&both, &kernel(4, 64)])), Ok(false));
        let one = branch(small, block(&[looped(large)]));
        assert_eq!(wants_threads(&with(&[&one])), Ok(true));
        // a truncated plan is an error, not a guess
        let mut cut = with(&[&kernel(4, 64)]);
        cut.truncate(cut.len() - 3);
        assert_eq!(wants_threads(&cut), Err(ERR_BAD_MODEL));
    }

    /// Runs `plan` with no kernels and no constants.
    fn run(
        plan: &[u64],
        inputs: *const *const u8,
        outputs: *const *mut u8,
        scratch: *mut u8,
        len: usize,
    ) -> i32 {
        let consts = [0u8; 8];
        let tables = ModelTables {
            plan: plan.as_ptr(),
            plan_words: plan.len() as u64,
            kernels: std::ptr::null(),
            kernel_count: 0,
            consts: consts.as_ptr(),
            const_bytes: 0,
            calls: std::ptr::null_mut(),
        };
        // SAFETY: the tables describe `plan`; the pointers are the test's own buffers.
        unsafe { smelt_rt_run(&tables, inputs, outputs, scratch, len) }
    }

    #[test]
    fn the_entry_point_runs_a_plan_and_reports_bad_arguments() {
        let x = [1.0f32, -2.0, 3.5, 0.25];
        let mut y = [0.0f32; 4];
        let ins = [x.as_ptr() as *const u8];
        let outs = [y.as_mut_ptr() as *mut u8];
        let mut scratch = vec![0u128; 8];
        let sp = scratch.as_mut_ptr() as *mut u8;
        let plan = identity(0);
        assert_eq!(run(&plan, ins.as_ptr(), outs.as_ptr(), sp, 128), OK);
        assert_eq!(y, x);
        // NULL scratch: the call allocates
        assert_eq!(
            run(&plan, ins.as_ptr(), outs.as_ptr(), std::ptr::null_mut(), 0),
            OK
        );
        assert_eq!(
            run(&plan, std::ptr::null(), outs.as_ptr(), sp, 128),
            ERR_NULL_POINTER
        );
        assert_eq!(
            run(&plan, ins.as_ptr(), std::ptr::null(), sp, 128),
            ERR_NULL_POINTER
        );
        let null_in = [std::ptr::null::<u8>()];
        assert_eq!(
            run(&plan, null_in.as_ptr(), outs.as_ptr(), sp, 128),
            ERR_NULL_POINTER
        );
        assert_eq!(
            run(&plan, ins.as_ptr(), outs.as_ptr(), sp, 63),
            ERR_SCRATCH_TOO_SMALL
        );
        assert_eq!(
            run(&plan, ins.as_ptr(), outs.as_ptr(), sp.wrapping_add(1), 127),
            ERR_SCRATCH_MISALIGNED
        );
        // code that needs a CPU feature this library does not know
        let newer = identity(1 << 40);
        assert_eq!(
            run(&newer, ins.as_ptr(), outs.as_ptr(), sp, 128),
            ERR_CPU_UNSUPPORTED
        );
        // a plan of another format, or cut short
        let mut other = plan.clone();
        other[1] = FORMAT + 1;
        assert_eq!(
            run(&other, ins.as_ptr(), outs.as_ptr(), sp, 128),
            ERR_BAD_MODEL
        );
        assert_eq!(
            run(&plan[..11], ins.as_ptr(), outs.as_ptr(), sp, 128),
            ERR_BAD_MODEL
        );
        // a buffer outside the scratch
        let mut outside = plan.clone();
        outside[9] = BUF_SCRATCH;
        outside[10] = 60;
        assert_eq!(
            run(&outside, ins.as_ptr(), outs.as_ptr(), sp, 128),
            ERR_BAD_MODEL
        );
        for &(code, _, msg) in ERRORS {
            assert_eq!(error_message(code).trim_end_matches('\0'), msg);
        }
        assert_eq!(error_message(99), "unknown error code\0");
    }
}
