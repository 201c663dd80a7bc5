//! Lowering of one [`Kernel`] to a Cranelift function, and the process-wide kernel cache.
//!
//! Each kernel becomes `fn(bufs: *const *mut u8, begin: i64, end: i64) -> i32` that runs the
//! rows `[begin, end)` of the kernel's outer space and returns an error code (0 = success).
//!
//! - Adjacent dims that every index map walks contiguously are merged first
//!   ([`coalesce`](crate::kernel::coalesce)), so a dense pointwise kernel is one flat loop
//!   and a row kernel has one or two loops.
//! - Pointwise kernels walk the flat row range in segments along the last outer dim; row
//!   kernels compute outer-level values once per row, run each reduction pass over the inner
//!   space (a loop nest), then the row stores and the inner stores.
//! - Addresses: each map's element offset is computed once per segment or loop level
//!   (`offset + Σ i_d·s_d`); inside the innermost loop an access is `base + i·stride`, and a
//!   vector loop walks each strided access with a pointer advanced once per iteration.
//! - The innermost loop is vectorised (`super::vector`) with two F32X4 groups per iteration
//!   and a scalar tail when every access there has stride 0 or 1 and every value is f32 or a
//!   mask; otherwise it is the scalar loop (`super::scalar`).
//! - Row kernels whose rows walk memory with a stride (reductions across rows) run 16
//!   adjacent rows at once as vector lanes (`super::row_lanes`); row kernels whose passes and
//!   stores share a costly value keep it in a stack row (`super::rowcache`).
//! - Vector loops with exp, tanh, sigmoid, silu, erf, either GELU or its slope run in strips whose
//!   transcendentals native AVX-512/AVX2 helpers evaluate (`super::strip`); other vector
//!   loops storing into a large f32 output stream it with non-temporal stores
//!   (`super::streamed_stores`).
//! - Integer remainder by zero sets error code 1 (PyTorch's ZeroDivisionError); the division
//!   itself then runs on a safe divisor, so no instruction traps.

use super::generator::Gen;
use super::helpers::{self, Sig};
use super::jit::{CodeModule, Jit};
use crate::ir::dtype::DType;
use crate::ir::shape::numel;
use crate::kernel::{Buffer, BufferId, BufferKind, Expr, Kernel};
use crate::{Result, bail};
use cranelift_codegen::ir::types::{F32, F64, I32, I64};
use cranelift_codegen::ir::{MemFlagsData, Signature, Type};
use cranelift_module::FuncId;
use cranelift_module::Linkage;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Options of code generation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    /// Vectorised f32 sums accumulate in f32 lanes instead of f64 lanes (fewer conversions,
    /// less exact).
    pub f32_lane_sums: bool,
    /// Transcendentals and sums stay in the inline Cranelift code, never in strips
    /// (`super::strip`): the same bits (sums may round differently), slower where strips
    /// apply.
    pub inline_math: bool,
    /// Outputs of at least this many bytes are written by streamed (non-temporal) stores
    /// (`super::streamed_stores`); None: [`super::STREAM_MIN_BYTES`].
    pub stream_min_bytes: Option<usize>,
}

use smelt_rt::model::KernelFn;

/// Error code of an integer division or remainder by zero.
pub(super) const ERR_ZERO_DIV: i64 = 1;

/// Machine code of a kernel, shared by every kernel of the same structure: it reads its
/// buffers from a table of the kernel's own slots ([`localize`]), not of the schedule's
/// buffers, so a kernel compiles once whichever buffers it touches.
struct Code {
    func: KernelFn,
    /// Entries of the table `func` reads.
    slots: usize,
    stats: CodeStats,
    /// Owns the machine code `func` points into; never used after construction.
    _owner: Owner,
}

/// What holds a kernel's machine code.
enum Owner {
    /// The JIT module it was compiled into.
    Jit(#[allow(dead_code)] Box<Jit>),
    /// An object loaded from the disk cache (shared by the kernels of one schedule).
    Loaded(#[allow(dead_code)] Arc<super::linker::Loaded>),
}

// SAFETY: after `compile_code` returns, the owner is never touched again except by `Drop`
// (which frees the code once no `Code` reference exists, so no call can be running). The
// generated function reads only its arguments and its own stack (no globals, no mutable
// state shared between calls), and the helpers it calls are pure `extern "C"` functions, so
// any number of threads may call it at once.
unsafe impl Send for Code {}
// SAFETY: as for `Send`: `&Code` only gives access to immutable data and re-entrant code.
unsafe impl Sync for Code {}

/// One kernel of a schedule as machine code.
pub struct CpuKernel {
    name: String,
    rows: usize,
    /// The schedule buffer behind each slot of the code's table.
    slots: Vec<BufferId>,
    /// Buffers of the schedule, the length of the table [`CpuKernel::run_rows`] takes.
    nbufs: usize,
    code: Arc<Code>,
}

impl std::fmt::Debug for CpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuKernel({}, {} rows)", self.name, self.rows)
    }
}

impl CpuKernel {
    /// Number of rows: numel(k.outer) (1 for a 0-d outer space; 0 if empty).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether both run the same machine code (kernels equal up to their name and the
    /// buffers they touch).
    pub fn shares_code(&self, other: &CpuKernel) -> bool {
        Arc::ptr_eq(&self.code, &other.code)
    }

    /// Number of innermost loops emitted as F32X4 vector loops (0: all scalar).
    pub fn vector_loops(&self) -> usize {
        self.code.stats.vector_loops
    }

    /// Number of values kept in the row cache (computed once per row, read back after).
    pub fn cached_rows(&self) -> usize {
        self.code.stats.cached_rows
    }

    /// Number of innermost loops run in strips whose transcendentals native helpers evaluate
    /// (see `strip`).
    pub fn strip_loops(&self) -> usize {
        self.code.stats.strip_loops
    }

    /// Innermost loops whose stores stream to their outputs (`super::streamed_stores`).
    pub fn stream_loops(&self) -> usize {
        self.code.stats.stream_loops
    }

    /// Rows run side by side as vector lanes (0: one row at a time; see `lanes`).
    pub fn lane_rows(&self) -> usize {
        self.code.stats.lane_rows
    }

    /// Reductions whose sums the column-sum helper computes for rows as lanes (see `lanes`).
    pub fn column_sums(&self) -> usize {
        self.code.stats.column_sums
    }

    /// Whether each row is one call of the row softmax helper (see `softmax`).
    pub fn softmax_rows(&self) -> bool {
        self.code.stats.softmax_rows > 0
    }

    /// Runs rows `[begin, end)`. `bufs[i]` points to element 0 of buffer `i` of the schedule
    /// (dense, row-major, of the schedule's dtype and length). Errors raised by the kernel
    /// come back as `Error`.
    ///
    /// # Safety
    /// Every pointer is valid for its buffer's length; buffers written by this kernel are not
    /// accessed by anyone else meanwhile.
    pub unsafe fn run_rows(&self, bufs: &[*mut u8], begin: usize, end: usize) -> Result<()> {
        if bufs.len() != self.nbufs {
            bail!(
                Value,
                "kernel {}: {} buffer pointers given for a schedule of {} buffers",
                self.name,
                bufs.len(),
                self.nbufs
            );
        }
        if begin > end || end > self.rows {
            bail!(
                Value,
                "kernel {}: rows {begin}..{end} out of 0..{}",
                self.name,
                self.rows
            );
        }
        if begin == end {
            return Ok(());
        }
        // the code's table: on the stack for the usual handful of buffers
        const ON_STACK: usize = 16;
        let mut stack = [std::ptr::null_mut::<u8>(); ON_STACK];
        let mut heap = Vec::new();
        let table: &mut [*mut u8] = match self.slots.len() {
            n if n <= ON_STACK => &mut stack[..n],
            n => {
                heap.resize(n, std::ptr::null_mut());
                &mut heap
            }
        };
        for (t, &b) in table.iter_mut().zip(&self.slots) {
            // every slot is a buffer of the schedule (`localize`), and `bufs` holds them all
            *t = bufs[b];
        }
        debug_assert_eq!(table.len(), self.code.slots);
        // SAFETY: the signature matches the one the function was defined with; the caller
        // guarantees the buffer pointers, the table puts each where the code reads it, and
        // every index map was validated to stay inside its buffer for rows below `self.rows`.
        let rc = unsafe { (self.code.func)(table.as_ptr(), begin as i64, end as i64) };
        if self.code.stats.stream_loops > 0 {
            // streamed stores are weakly ordered: complete them before anyone reads the output
            super::vmath::fence();
        }
        match i64::from(rc) {
            0 => Ok(()),
            ERR_ZERO_DIV => bail!(Value, "ZeroDivisionError"),
            c => bail!(Value, "kernel {}: error code {c}", self.name),
        }
    }
}

/// The process-wide kernel cache: every kernel some compiled function still holds, and the
/// [`RECENT_KERNELS`] last compiled or reused, so that a graph compiled again soon after
/// its function was dropped does not recompile. Code nothing holds any more is freed: a
/// process that compiles ever new graphs (a server tracing new shapes, a fuzzer) keeps its
/// memory bounded.
#[derive(Default)]
struct KernelCache {
    live: HashMap<String, Weak<Code>>,
    recent: VecDeque<Arc<Code>>,
}

/// How many recently used kernels the cache keeps alive by itself.
const RECENT_KERNELS: usize = 1024;

impl KernelCache {
    fn get(&mut self, key: &str) -> Option<Arc<Code>> {
        let code = self.live.get(key)?.upgrade()?;
        self.keep(code.clone());
        Some(code)
    }

    /// The code cached under `key` if another thread compiled it meanwhile, else `code`.
    fn insert(&mut self, key: String, code: Arc<Code>) -> Arc<Code> {
        if let Some(found) = self.get(&key) {
            return found;
        }
        self.live.insert(key, Arc::downgrade(&code));
        self.keep(code.clone());
        if self.live.len() > 4 * RECENT_KERNELS {
            self.live.retain(|_, w| w.strong_count() > 0);
        }
        code
    }

    fn keep(&mut self, code: Arc<Code>) {
        self.recent.push_back(code);
        if self.recent.len() > RECENT_KERNELS {
            self.recent.pop_front();
        }
    }
}

fn cache() -> &'static Mutex<KernelCache> {
    static CACHE: OnceLock<Mutex<KernelCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(KernelCache::default()))
}

/// `k` with its buffers renumbered from 0 in the order the kernel first names them, the
/// buffers behind those numbers (dtype and shape, all that code generation reads), and the
/// schedule buffer of each number. Kernels that differ only in the buffers they touch, such
/// as the one-op kernels of an unfused chain, become equal; a buffer read and written keeps
/// one number, so aliasing is part of the structure.
pub(crate) fn localize(
    k: &Kernel,
    buffers: &[Buffer],
) -> Result<(Kernel, Vec<Buffer>, Vec<BufferId>)> {
    let mut slots: Vec<BufferId> = Vec::new();
    let mut number: HashMap<BufferId, BufferId> = HashMap::new();
    let mut renumber = |b: &mut BufferId| {
        *b = *number.entry(*b).or_insert_with(|| {
            slots.push(*b);
            slots.len() - 1
        });
    };
    let mut local = k.clone();
    for v in &mut local.values {
        if let Expr::Load { buffer, .. } = &mut v.expr {
            renumber(buffer);
        }
    }
    for st in &mut local.stores {
        renumber(&mut st.buffer);
    }
    let bufs = slots
        .iter()
        .map(|&b| match buffers.get(b) {
            Some(x) => Ok(Buffer {
                name: String::new(),
                dtype: x.dtype,
                shape: x.shape.clone(),
                kind: BufferKind::Temp,
                channels_last: x.channels_last,
            }),
            None => bail!(Value, "kernel {}: buffer b{b} does not exist", k.name),
        })
        .collect::<Result<_>>()?;
    Ok((local, bufs, slots))
}

/// The structural cache key of a localized kernel: the kernel without its name, the dtypes
/// and lengths of its buffers, and the options. `Debug` prints floats exactly.
pub(crate) fn cache_key(k: &Kernel, buffers: &[Buffer], opts: &CodegenOptions) -> String {
    let bufs: Vec<(DType, usize)> = buffers.iter().map(|x| (x.dtype, x.len())).collect();
    format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        k.outer, k.inner, k.values, k.passes, k.stores, bufs, opts
    )
}

/// Compiles `k` (a kernel of a schedule whose buffers are `buffers`). The machine code is
/// cached process-wide by a structural key of (the kernel up to its name and the buffers it
/// touches, their dtypes and lengths, the options), so equal kernels at different places of
/// a schedule, or of different schedules, compile once.
pub fn compile_kernel(
    k: &Kernel,
    buffers: &[Buffer],
    opts: &CodegenOptions,
) -> Result<Arc<CpuKernel>> {
    let (local, local_bufs, slots) = localize(k, buffers)?;
    let key = cache_key(&local, &local_bufs, opts);
    let hit = {
        let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.get(&key)
    };
    let code = match hit {
        Some(code) => code,
        None => {
            // checked against the schedule's own buffers, so that errors name them
            crate::kernel::check_kernel(k, buffers)?;
            let compiled = Arc::new(compile_code(&local, &local_bufs, opts)?);
            let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
            c.insert(key, compiled)
        }
    };
    Ok(Arc::new(CpuKernel {
        name: k.name.clone(),
        rows: numel(&k.outer),
        slots,
        nbufs: buffers.len(),
        code,
    }))
}

/// What code generation chose for a kernel, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct CodeStats {
    vector_loops: usize,
    cached_rows: usize,
    /// Rows run side by side as lanes (0: none): a thread's chunk of rows should hold whole
    /// blocks of them.
    pub lane_rows: usize,
    strip_loops: usize,
    column_sums: usize,
    /// Innermost loops whose stores stream: the caller fences after running the kernel.
    pub stream_loops: usize,
    softmax_rows: usize,
}

/// Defines the localized kernel `k` (whose buffers are `buffers`) in `m` as function `name`
/// with the signature of [`KernelFn`], importing the helpers it may call.
pub(crate) fn define_kernel(
    m: &mut dyn CodeModule,
    (name, linkage): (&str, Linkage),
    k: &Kernel,
    buffers: &[Buffer],
    opts: &CodegenOptions,
) -> Result<(FuncId, CodeStats)> {
    crate::kernel::check_ops(k, "cpu codegen")?;
    let ordered = crate::kernel::store_order(k);
    let ck = crate::kernel::coalesce(ordered.as_ref().unwrap_or(k));
    let ptr = m.pointer_type();
    let mut imports = HashMap::new();
    for (sym, sig) in kernel_helpers(k) {
        let s = helper_signature(m, sig);
        imports.insert(sym, m.import(sym, &s)?);
    }
    let sig = m.signature(&[ptr, I64, I64], &[I32]);
    let mut stats = CodeStats::default();
    let id = m.define(name, linkage, &sig, &mut |fb| {
        let mut g = Gen::new(fb, &ck, buffers, &imports, ptr, opts.clone());
        g.emit_function()?;
        stats = CodeStats {
            vector_loops: g.vector_loops,
            cached_rows: g.row_cache.len(),
            lane_rows: g.lane_rows,
            strip_loops: g.strip_loops,
            column_sums: g.column_sums,
            stream_loops: g.stream_loops,
            softmax_rows: g.softmax_rows,
        };
        Ok(())
    })?;
    Ok((id, stats))
}

/// The helpers kernel `k` may call, with their signatures: the per-op f64 helpers only of the
/// unary ops it computes (a kernel declares the handful it can call, not one per op of the
/// table), and every helper of the run-time library.
fn kernel_helpers(k: &Kernel) -> Vec<(&'static str, Sig)> {
    let unary: Vec<&str> = k
        .values
        .iter()
        .filter_map(|v| match v.expr {
            Expr::Unary(u, _) => Some(u.helper_symbol()),
            _ => None,
        })
        .collect();
    helpers::symbols()
        .into_iter()
        .filter(|&(n, _, sig)| sig != Sig::Unary || unary.contains(&n))
        .map(|(n, _, sig)| (n, sig))
        .collect()
}

/// Kernel `k` of a schedule whose buffers are `buffers`, running the loaded function `func`
/// (a [`define_kernel`] of `k` localized, with the same options) that `image` holds.
///
/// # Safety
/// `func` must be that function's entry in `image`.
pub(crate) unsafe fn loaded_kernel(
    k: &Kernel,
    buffers: &[Buffer],
    func: *const u8,
    stats: CodeStats,
    image: Arc<super::linker::Loaded>,
) -> Result<Arc<CpuKernel>> {
    let (_, local_bufs, slots) = localize(k, buffers)?;
    // SAFETY: the caller's contract: an entry with `KernelFn`'s signature.
    let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(func) };
    let code = Code {
        func,
        slots: local_bufs.len(),
        stats,
        _owner: Owner::Loaded(image),
    };
    Ok(Arc::new(CpuKernel {
        name: k.name.clone(),
        rows: numel(&k.outer),
        slots,
        nbufs: buffers.len(),
        code: Arc::new(code),
    }))
}

/// Compiles a localized kernel; `buffers` are its own.
fn compile_code(k: &Kernel, buffers: &[Buffer], opts: &CodegenOptions) -> Result<Code> {
    let wanted: Vec<&str> = kernel_helpers(k).into_iter().map(|(n, _)| n).collect();
    let pairs: Vec<(&str, *const u8)> = helpers::symbols()
        .into_iter()
        .filter(|(n, _, _)| wanted.contains(n))
        .map(|(n, p, _)| (n, p))
        .collect();
    let mut jit = Jit::with_symbols(&pairs)?;
    let (id, st) = define_kernel(
        &mut jit,
        (&k.name_for_symbol(), Linkage::Export),
        k,
        buffers,
        opts,
    )?;
    jit.finalize()?;
    let code = jit.code_ptr(id)?;
    // SAFETY: `code` is the entry of the function just defined with signature
    // (pointer, i64, i64) -> i32 in the host's C calling convention, which is `KernelFn`.
    let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
    Ok(Code {
        func,
        slots: buffers.len(),
        stats: st,
        _owner: Owner::Jit(Box::new(jit)),
    })
}

trait SymbolName {
    fn name_for_symbol(&self) -> String;
}
impl SymbolName for Kernel {
    /// A symbol name made of the kernel's name (any characters) kept to `[A-Za-z0-9_]`.
    fn name_for_symbol(&self) -> String {
        let clean: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("kernel_{clean}")
    }
}

fn helper_signature(jit: &dyn CodeModule, s: Sig) -> Signature {
    match s {
        Sig::Unary => jit.signature(&[F64, F64, F64], &[F64]),
        Sig::F64F64F64 => jit.signature(&[F64, F64], &[F64]),
        Sig::F32F32F32 => jit.signature(&[F32, F32], &[F32]),
        Sig::F64F32 => jit.signature(&[F64], &[F32]),
        Sig::F32U32 => jit.signature(&[F32], &[I32]),
        Sig::U32F32 => jit.signature(&[I32], &[F32]),
        Sig::I64I64I64 => jit.signature(&[I64, I64], &[I64]),
        Sig::Strip => {
            let p = jit.pointer_type();
            jit.signature(&[I32, p, p, I64], &[])
        }
        Sig::StripSum => jit.signature(&[jit.pointer_type(), I64], &[F64]),
        Sig::StripExtreme => jit.signature(&[jit.pointer_type(), I64], &[F32]),
        Sig::ColSum => {
            let p = jit.pointer_type();
            jit.signature(&[p, I64, I64, I64, p], &[])
        }
        Sig::Stream => {
            let p = jit.pointer_type();
            jit.signature(&[p, p, I64], &[])
        }
        Sig::SoftmaxRow => {
            let p = jit.pointer_type();
            jit.signature(&[p, p, I64, I32], &[])
        }
    }
}

/// The Cranelift type holding a value of dtype `d`: f16/bf16 values are held exactly in f32,
/// bool as an i8 of 0 or 1, u8 as i8.
pub(super) fn cty(d: DType) -> Type {
    use cranelift_codegen::ir::types::{I8, I16};
    match d {
        DType::F32 | DType::F16 | DType::BF16 => F32,
        DType::F64 => F64,
        DType::I64 => I64,
        DType::I32 => I32,
        DType::I16 => I16,
        DType::I8 | DType::U8 | DType::Bool => I8,
    }
}

/// Element size in bytes as an i64.
pub(super) fn esize(d: DType) -> i64 {
    d.size() as i64
}

pub(super) fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}
