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

use super::helpers::{self, Sig};
use super::jit::{CodeModule, FnBody, Jit};
use crate::ir::dtype::DType;
use crate::ir::shape::numel;
use crate::kernel::{Buffer, BufferId, BufferKind, Combiner, Expr, IndexMap, Kernel, Level, ValId};
use crate::{Error, Result, bail};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F64, I32, I64};
use cranelift_codegen::ir::{FuncRef, Inst, InstBuilder, MemFlagsData, Signature, Type, Value};
use cranelift_frontend::Variable;
use cranelift_module::FuncId;
use cranelift_module::Linkage;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

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

fn cache() -> &'static Mutex<HashMap<String, Arc<Code>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Code>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
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
        let c = cache().lock().unwrap_or_else(|e| e.into_inner());
        c.get(&key).cloned()
    };
    let code = match hit {
        Some(code) => code,
        None => {
            // checked against the schedule's own buffers, so that errors name them
            crate::kernel::check_kernel(k, buffers)?;
            let compiled = Arc::new(compile_code(&local, &local_bufs, opts)?);
            let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
            c.entry(key).or_insert(compiled).clone()
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

/// An accumulator of a reduction: scalar variables, and vector ones inside a vector loop.
#[derive(Clone, Copy)]
pub(super) struct Acc {
    pub val: Variable,
    /// Argmax/argmin: the position of the best element (-1 before the first).
    pub idx: Option<Variable>,
}

/// A distinct access pattern: the buffer (None for `Expr::Index`) and the map.
pub(super) struct Access {
    pub buffer: Option<BufferId>,
    pub map: IndexMap,
}

/// What one innermost loop computes.
/// The values the stores depend on, in order: dead values (unused constants the fuser left
/// behind, often of another dtype) would otherwise keep a loop from being vectorised.
fn live_values(k: &Kernel) -> Vec<ValId> {
    let mut live = vec![false; k.values.len()];
    let mut stack: Vec<ValId> = k.stores.iter().map(|s| s.value).collect();
    while let Some(v) = stack.pop() {
        if !std::mem::replace(&mut live[v], true) {
            stack.extend(k.values[v].expr.operands());
        }
    }
    (0..k.values.len()).filter(|&v| live[v]).collect()
}

pub(super) struct Body {
    /// Inner-level values, in order.
    pub vals: Vec<ValId>,
    /// Reductions updated per element.
    pub reds: Vec<ValId>,
    /// Stores done per element.
    pub stores: Vec<usize>,
    /// Values read from the row cache instead of computed (`super::rowcache`).
    pub cache_in: Vec<ValId>,
    /// Values written to the row cache once computed.
    pub cache_out: Vec<ValId>,
    /// Values read from their strip rows (`super::strip`).
    pub strip_in: Vec<ValId>,
    /// `(operand, value)`: the operand is written to the value's strip row once computed.
    pub strip_out: Vec<(ValId, ValId)>,
}

/// The bodies of a row kernel: one per reduction pass, then the inner stores; and the stores
/// of row-level values.
pub(super) struct RowPlan {
    pub passes: Vec<Body>,
    pub stores: Body,
    pub row_stores: Vec<usize>,
}

impl Body {
    pub(super) fn new(vals: Vec<ValId>, reds: Vec<ValId>, stores: Vec<usize>) -> Self {
        Body {
            vals,
            reds,
            stores,
            cache_in: vec![],
            cache_out: vec![],
            strip_in: vec![],
            strip_out: vec![],
        }
    }
}

/// State of the code generator of one kernel.
pub(super) struct Gen<'g, 'a, 'b> {
    pub fb: &'g mut FnBody<'a, 'b>,
    pub k: &'g Kernel,
    pub bufs: &'g [Buffer],
    imports: &'g HashMap<&'static str, FuncId>,
    frefs: HashMap<&'static str, FuncRef>,
    pub ptr: Type,
    pub opts: CodegenOptions,
    /// Base pointer of every buffer the kernel touches.
    pub base: Vec<Option<Value>>,
    pub err: Variable,
    pub accesses: Vec<Access>,
    /// Access of every load/index value, and of every store.
    pub access_of_val: HashMap<ValId, usize>,
    pub access_of_store: Vec<usize>,
    /// Current element offset of each access at element 0 of the innermost loop.
    pub cur_off: Vec<Value>,
    /// Byte pointer of each access at element 0 of the innermost loop (None for Index).
    pub cur_ptr: Vec<Option<Value>>,
    /// Stride of each access along the innermost loop, in elements.
    pub cur_stride: Vec<i64>,
    /// Inside a vector loop: the pointer of each access it walks at the loop's index value,
    /// advanced by one add per iteration ([`Self::addr`] uses it for that index).
    pub walked: HashMap<usize, (Value, Value)>,
    pub accs: HashMap<ValId, Acc>,
    /// Flat position inside the inner space (argmax/argmin), when needed.
    pub pos: Option<Variable>,
    pub levels: Vec<Level>,
    /// Innermost loops emitted vectorised so far.
    pub vector_loops: usize,
    /// Stack address of the cached row of each value in the row cache.
    pub row_cache: HashMap<ValId, Value>,
    /// Stride of each access along the last outer dim while a block of rows runs as lanes.
    pub lane_stride: Option<Vec<i64>>,
    /// Rows per block when rows run as lanes (0: never).
    pub lane_rows: usize,
    /// Strip row of each value a strip helper computes, addressed by the innermost index.
    pub strip_rows: HashMap<ValId, Value>,
    /// Innermost loops emitted in strips so far, and the stack their rows take.
    pub strip_loops: usize,
    /// Innermost loops whose stores stream (`super::streamed_stores`).
    pub stream_loops: usize,
    pub strip_rows_bytes: usize,
    /// Reductions the column-sum helper computes (see `lanes`).
    pub column_sums: usize,
    /// Row kernels run as one row softmax call per row (see `softmax`).
    pub softmax_rows: usize,
}

impl<'g, 'a, 'b> Gen<'g, 'a, 'b> {
    fn new(
        fb: &'g mut FnBody<'a, 'b>,
        k: &'g Kernel,
        bufs: &'g [Buffer],
        imports: &'g HashMap<&'static str, FuncId>,
        ptr: Type,
        opts: CodegenOptions,
    ) -> Self {
        let err = fb.b.declare_var(I32);
        let mut accesses: Vec<Access> = Vec::new();
        let mut find = |buffer: Option<BufferId>, map: &IndexMap| {
            if let Some(i) = accesses
                .iter()
                .position(|a| a.buffer == buffer && &a.map == map)
            {
                return i;
            }
            accesses.push(Access {
                buffer,
                map: map.clone(),
            });
            accesses.len() - 1
        };
        let mut access_of_val = HashMap::new();
        for (i, v) in k.values.iter().enumerate() {
            match &v.expr {
                Expr::Load { buffer, map } => {
                    access_of_val.insert(i, find(Some(*buffer), map));
                }
                Expr::Index { map } => {
                    access_of_val.insert(i, find(None, map));
                }
                _ => {}
            }
        }
        let access_of_store = k
            .stores
            .iter()
            .map(|s| find(Some(s.buffer), &s.map))
            .collect();
        let levels = k.levels();
        Gen {
            fb,
            k,
            bufs,
            imports,
            frefs: HashMap::new(),
            ptr,
            opts,
            base: vec![None; bufs.len()],
            err,
            accesses,
            access_of_val,
            access_of_store,
            cur_off: vec![],
            cur_ptr: vec![],
            walked: HashMap::new(),
            cur_stride: vec![],
            accs: HashMap::new(),
            pos: None,
            levels,
            vector_loops: 0,
            row_cache: HashMap::new(),
            lane_stride: None,
            lane_rows: 0,
            strip_rows: HashMap::new(),
            strip_loops: 0,
            stream_loops: 0,
            column_sums: 0,
            softmax_rows: 0,
            strip_rows_bytes: 0,
        }
    }

    /// Calls helper `name` with `args`, returning its result.
    pub fn call(&mut self, name: &'static str, args: &[Value]) -> Value {
        let inst = self.call_inst(name, args);
        self.fb.b.inst_results(inst)[0]
    }

    /// Calls helper `name`, which returns nothing, with `args`.
    pub fn call_void(&mut self, name: &'static str, args: &[Value]) {
        self.call_inst(name, args);
    }

    fn call_inst(&mut self, name: &'static str, args: &[Value]) -> Inst {
        let fref = match self.frefs.get(name) {
            Some(&f) => f,
            None => {
                // Every helper the body can call was imported before it was built (the unary
                // ops' f64 helpers: those of the ops the kernel computes).
                let id = self.imports[name];
                let f = self.fb.func_ref(id);
                self.frefs.insert(name, f);
                f
            }
        };
        self.fb.b.ins().call(fref, args)
    }

    pub fn iconst(&mut self, t: Type, v: i64) -> Value {
        let bits = t.bits();
        let v = if bits < 64 {
            v & ((1i64 << bits) - 1)
        } else {
            v
        };
        self.fb.b.ins().iconst(t, v)
    }

    fn emit_function(&mut self) -> Result<()> {
        let params =
            self.fb
                .b
                .block_params(self.fb.b.current_block().unwrap_or_else(|| {
                    unreachable!("the entry block is current while the body is built")
                }));
        let (bufs_ptr, begin, end) = (params[0], params[1], params[2]);
        let zero = self.iconst(I32, 0);
        self.fb.b.def_var(self.err, zero);
        let mut used: Vec<BufferId> = self
            .accesses
            .iter()
            .filter_map(|a| a.buffer)
            .collect::<Vec<_>>();
        used.sort_unstable();
        used.dedup();
        let psize = self.ptr.bytes() as i64;
        for b in used {
            let off = i32::try_from(b as i64 * psize)
                .map_err(|_| Error::Unsupported("cpu codegen: too many buffers".into()))?;
            let p = self.fb.b.ins().load(self.ptr, flags(), bufs_ptr, off);
            self.base[b] = Some(p);
        }
        if self.k.inner.is_empty() {
            self.emit_pointwise(begin, end)?;
        } else if let Some(sm) = self.softmax_rows_plan() {
            self.emit_softmax_rows(&sm, begin, end)?;
        } else {
            self.emit_rows(begin, end)?;
        }
        let e = self.fb.b.use_var(self.err);
        self.fb.b.ins().return_(&[e]);
        Ok(())
    }

    /// `while var < end { body; var += step }` where `body` returns the step to add.
    pub(super) fn while_lt(
        &mut self,
        var: Variable,
        end: Value,
        body: &mut dyn FnMut(&mut Self, Value) -> Result<Value>,
    ) -> Result<()> {
        let header = self.fb.b.create_block();
        let bodyb = self.fb.b.create_block();
        let exit = self.fb.b.create_block();
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(header);
        let cur = self.fb.b.use_var(var);
        let c = self.fb.b.ins().icmp(IntCC::SignedLessThan, cur, end);
        self.fb.b.ins().brif(c, bodyb, &[], exit, &[]);
        self.fb.b.switch_to_block(bodyb);
        let step = body(self, cur)?;
        let cur = self.fb.b.use_var(var);
        let next = self.fb.b.ins().iadd(cur, step);
        self.fb.b.def_var(var, next);
        self.fb.b.ins().jump(header, &[]);
        self.fb.b.switch_to_block(exit);
        Ok(())
    }

    /// Element offset of every access at the point whose outer (or, for pointwise kernels,
    /// leading) multi-index is `idx` over `dims` (dims numbered in the full space).
    pub(super) fn offsets_at(&mut self, idx: &[(usize, Value)]) -> Vec<Value> {
        let mut out = Vec::with_capacity(self.accesses.len());
        for a in 0..self.accesses.len() {
            let m = &self.accesses[a].map;
            let offset = m.offset as i64;
            let terms: Vec<(i64, Value)> = idx
                .iter()
                .map(|&(d, v)| (m.strides[d] as i64, v))
                .filter(|&(s, _)| s != 0)
                .collect();
            let mut o = self.iconst(I64, offset);
            for (s, v) in terms {
                let t = self.fb.b.ins().imul_imm_s(v, s);
                o = self.fb.b.ins().iadd(o, t);
            }
            out.push(o);
        }
        out
    }

    /// The multi-index of flat `r` over `sizes` (row-major), innermost last.
    pub(super) fn unflatten(&mut self, mut r: Value, sizes: &[usize]) -> Vec<Value> {
        let mut idx = vec![r; sizes.len()];
        for d in (0..sizes.len()).rev() {
            if d == 0 {
                idx[d] = r;
                break;
            }
            let n = sizes[d] as i64;
            idx[d] = self.fb.b.ins().urem_imm_s(r, n);
            r = self.fb.b.ins().udiv_imm_s(r, n);
        }
        idx
    }

    fn emit_pointwise(&mut self, begin: Value, end: Value) -> Result<()> {
        let ko = self.k.outer.len();
        let last = if ko == 0 { 1 } else { self.k.outer[ko - 1] } as i64;
        let lead: Vec<usize> = self.k.outer[..ko.saturating_sub(1)].to_vec();
        let body = Body::new(
            live_values(self.k),
            vec![],
            (0..self.k.stores.len()).collect(),
        );
        let cur = self.fb.b.declare_var(I64);
        self.fb.b.def_var(cur, begin);
        self.while_lt(cur, end, &mut |g, c| {
            let (j0, r) = if last == 1 {
                (g.iconst(I64, 0), c)
            } else {
                (
                    g.fb.b.ins().urem_imm_s(c, last),
                    g.fb.b.ins().udiv_imm_s(c, last),
                )
            };
            let mut idx: Vec<(usize, Value)> = if lead.is_empty() {
                vec![]
            } else {
                let li = g.unflatten(r, &lead);
                li.into_iter().enumerate().collect()
            };
            if ko > 0 {
                idx.push((ko - 1, j0));
            }
            let offs = g.offsets_at(&idx);
            let left = g.fb.b.ins().isub(end, c);
            let lastv = g.iconst(I64, last);
            let room = g.fb.b.ins().isub(lastv, j0);
            let len = g.fb.b.ins().smin(left, room);
            let strides: Vec<i64> = g
                .accesses
                .iter()
                .map(|a| {
                    if ko == 0 {
                        0
                    } else {
                        a.map.strides[ko - 1] as i64
                    }
                })
                .collect();
            let mut env = vec![None; g.k.values.len()];
            g.innermost(len, &offs, &strides, &body, &mut env)?;
            Ok(len)
        })
    }

    fn emit_rows(&mut self, begin: Value, end: Value) -> Result<()> {
        let k = self.k;
        let ko = k.outer.len();
        let row = self.fb.b.declare_var(I64);
        self.fb.b.def_var(row, begin);
        let needs_pos = k.values.iter().any(|v| {
            matches!(
                v.expr,
                Expr::Reduce {
                    combiner: Combiner::ArgMax | Combiner::ArgMin,
                    ..
                }
            )
        });
        if needs_pos {
            self.pos = Some(self.fb.b.declare_var(I64));
        }
        // inner-level values each pass and the inner stores need
        let mut parts = Vec::new();
        for p in &k.passes {
            let args: Vec<ValId> = p
                .iter()
                .filter_map(|&r| match k.values[r].expr {
                    Expr::Reduce { arg, .. } => Some(arg),
                    _ => None,
                })
                .collect();
            parts.push((args, Body::new(vec![], p.clone(), vec![])));
        }
        let inner_stores: Vec<usize> = (0..k.stores.len())
            .filter(|&s| !k.stores[s].map.ignores_from(ko))
            .collect();
        let row_stores: Vec<usize> = (0..k.stores.len())
            .filter(|&s| k.stores[s].map.ignores_from(ko))
            .collect();
        let store_vals: Vec<ValId> = inner_stores.iter().map(|&s| k.stores[s].value).collect();
        parts.push((store_vals, Body::new(vec![], vec![], inner_stores)));
        let lanes = self.lane_width();
        self.lane_rows = lanes.unwrap_or(0) as usize;
        let mut passes = self.row_bodies(parts, lanes.is_none());
        let stores = passes.pop().unwrap_or_else(|| unreachable!("pushed above"));
        let plan = RowPlan {
            passes,
            stores,
            row_stores,
        };
        let sums = lanes.and_then(|_| self.column_sums(&plan));
        self.while_lt(row, end, &mut |g, r| match lanes {
            Some(w) => g.lanes_or_row(r, end, w, &plan, sums.as_ref()),
            None => {
                g.one_row(r, &plan)?;
                Ok(g.iconst(I64, 1))
            }
        })
    }

    /// Element offset of every access at the start of row `r` (flat over the outer dims).
    pub(super) fn row_offsets(&mut self, r: Value) -> Vec<Value> {
        let idx: Vec<(usize, Value)> = if self.k.outer.is_empty() {
            vec![]
        } else {
            let outer = self.k.outer.clone();
            self.unflatten(r, &outer).into_iter().enumerate().collect()
        };
        self.offsets_at(&idx)
    }

    /// One row of a row kernel: outer values, each pass, the row stores, the inner stores.
    pub(super) fn one_row(&mut self, r: Value, plan: &RowPlan) -> Result<()> {
        let k = self.k;
        let row_offs = self.row_offsets(r);
        let mut env: Vec<Option<Value>> = vec![None; k.values.len()];
        self.set_position(&row_offs, None);
        self.outer_values(&mut env)?;
        for body in &plan.passes {
            for &r in &body.reds {
                self.init_acc(r);
            }
            if let Some(p) = self.pos {
                let z = self.iconst(I64, 0);
                self.fb.b.def_var(p, z);
            }
            self.nest(0, &row_offs, body, &mut env)?;
            for &r in &body.reds {
                let v = self.finish_acc(r);
                env[r] = Some(v);
            }
            self.set_position(&row_offs, None);
            self.outer_values(&mut env)?;
        }
        self.set_position(&row_offs, None);
        for &s in &plan.row_stores {
            let st = &k.stores[s];
            let v = env[st.value].ok_or_else(|| {
                Error::Unsupported(format!(
                    "cpu codegen: kernel {}: a row store of an inner value",
                    k.name
                ))
            })?;
            let zero = self.iconst(I64, 0);
            self.store_scalar(s, v, zero, 0);
        }
        if !plan.stores.stores.is_empty() {
            self.nest(0, &row_offs, &plan.stores, &mut env)?;
        }
        Ok(())
    }

    /// Computes every outer-level value whose operands are all available.
    fn outer_values(&mut self, env: &mut [Option<Value>]) -> Result<()> {
        let zero = self.iconst(I64, 0);
        for v in 0..self.k.values.len() {
            if env[v].is_some()
                || self.levels[v] != Level::Outer
                || matches!(self.k.values[v].expr, Expr::Reduce { .. })
            {
                continue;
            }
            if self.k.values[v]
                .expr
                .operands()
                .iter()
                .all(|&o| env[o].is_some())
            {
                let x = self.scalar_value(v, env, zero, 0)?;
                env[v] = Some(x);
            }
        }
        Ok(())
    }

    /// Sets the innermost-loop origin of every access to the element offsets `offs`, with
    /// innermost strides `strides` (None: all zero).
    pub(super) fn set_position(&mut self, offs: &[Value], strides: Option<&[i64]>) {
        self.cur_off = offs.to_vec();
        self.cur_stride = match strides {
            Some(s) => s.to_vec(),
            None => vec![0; offs.len()],
        };
        self.cur_ptr = (0..offs.len())
            .map(|a| {
                let buffer = self.accesses[a].buffer?;
                let base = self.base[buffer]?;
                let size = esize(self.bufs[buffer].dtype);
                let bytes = self.fb.b.ins().imul_imm_s(offs[a], size);
                Some(self.fb.b.ins().iadd(base, bytes))
            })
            .collect();
    }

    /// The loop nest over inner dims `d..` starting from element offsets `offs`.
    fn nest(
        &mut self,
        d: usize,
        offs: &[Value],
        body: &Body,
        env: &mut [Option<Value>],
    ) -> Result<()> {
        let ko = self.k.outer.len();
        let ni = self.k.inner.len();
        if ni == 0 {
            let one = self.iconst(I64, 1);
            let z = vec![0; self.accesses.len()];
            return self.innermost(one, offs, &z, body, env);
        }
        let dim = ko + d;
        let strides: Vec<i64> = self
            .accesses
            .iter()
            .map(|a| a.map.strides[dim] as i64)
            .collect();
        let n = self.k.inner[d] as i64;
        if d + 1 == ni {
            let len = self.iconst(I64, n);
            return self.innermost(len, offs, &strides, body, env);
        }
        let offs = offs.to_vec();
        self.count_loop(n, &mut |g, iv| {
            let sub = g.offsets_along(&offs, &strides, iv);
            g.nest(d + 1, &sub, body, env)
        })
    }

    /// A loop of `body(i)` for `i` in `0..n`.
    pub(super) fn count_loop(
        &mut self,
        n: i64,
        body: &mut dyn FnMut(&mut Self, Value) -> Result<()>,
    ) -> Result<()> {
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        let end = self.iconst(I64, n);
        self.while_lt(i, end, &mut |g, iv| {
            body(g, iv)?;
            Ok(g.iconst(I64, 1))
        })
    }

    /// Each access's offset in `offs` moved by `i` steps of its stride in `strides`.
    pub(super) fn offsets_along(
        &mut self,
        offs: &[Value],
        strides: &[i64],
        i: Value,
    ) -> Vec<Value> {
        offs.iter()
            .zip(strides)
            .map(|(&o, &s)| {
                if s == 0 {
                    o
                } else {
                    let t = self.fb.b.ins().imul_imm_s(i, s);
                    self.fb.b.ins().iadd(o, t)
                }
            })
            .collect()
    }

    /// The innermost loop: `len` elements from offsets `offs` with strides `strides`,
    /// vectorised when possible.
    fn innermost(
        &mut self,
        len: Value,
        offs: &[Value],
        strides: &[i64],
        body: &Body,
        env: &mut [Option<Value>],
    ) -> Result<()> {
        self.set_position(offs, Some(strides));
        let i = self.fb.b.declare_var(I64);
        let z = self.iconst(I64, 0);
        self.fb.b.def_var(i, z);
        if self.vectorizable(body) {
            if let Some(work) = self.strip_work(body) {
                self.strip_loops += 1;
                return self.strip_loop(i, len, body, env, &work);
            }
            let streamed = self.stream_stores(body);
            if !streamed.is_empty() {
                self.stream_loops += 1;
                return self.stream_loop(i, len, body, env, &streamed);
            }
            self.vector_loops += 1;
            self.vector_loop(i, len, body, env)?;
        }
        self.scalar_loop(i, len, body, env)
    }

    /// The scalar loop over elements `[i, end)` of the innermost loop.
    pub(super) fn scalar_loop(
        &mut self,
        i: Variable,
        end: Value,
        body: &Body,
        env: &[Option<Value>],
    ) -> Result<()> {
        let saved = env.to_vec();
        self.while_lt(i, end, &mut |g, iv| {
            let mut local = saved.clone();
            for &v in &body.vals {
                let t = cty(g.k.values[v].dtype);
                let x =
                    g.body_value(body, v, t, iv, 0, &mut |g| g.scalar_value(v, &local, iv, 0))?;
                local[v] = Some(x);
            }
            for &r in &body.reds {
                g.update_acc(r, &local);
            }
            if let Some(p) = g.pos {
                let pv = g.fb.b.use_var(p);
                let n = g.fb.b.ins().iadd_imm_s(pv, 1);
                g.fb.b.def_var(p, n);
            }
            for &s in &body.stores {
                let v = local[g.k.stores[s].value].ok_or_else(|| {
                    Error::Unsupported("cpu codegen: a store of an uncomputed value".into())
                })?;
                g.store_scalar(s, v, iv, 0);
            }
            Ok(g.iconst(I64, 1))
        })
    }

    /// Byte address of access `a` at element `i` of the innermost loop and lane `lane`, as
    /// (pointer, constant byte offset). Lanes run along the innermost loop, or along the last
    /// outer dim in a block of rows as lanes (`super::row_lanes`).
    pub fn addr(&mut self, a: usize, i: Value, lane: i64) -> (Value, i32) {
        let size = self.elem_bytes(a);
        let s = self.cur_stride[a];
        let lane_off = (lane * self.lane_step(a) * size) as i32;
        if let Some(&(at, p)) = self.walked.get(&a)
            && at == i
        {
            return (p, lane_off);
        }
        let base =
            self.cur_ptr[a].unwrap_or_else(|| unreachable!("index accesses have no pointer"));
        let p = if s == 0 {
            base
        } else {
            let t = self.fb.b.ins().imul_imm_s(i, s * size);
            self.fb.b.ins().iadd(base, t)
        };
        (p, lane_off)
    }

    /// Bytes per element of the buffer access `a` reads or writes.
    pub fn elem_bytes(&self, a: usize) -> i64 {
        esize(self.bufs[self.accesses[a].buffer.unwrap_or(0)].dtype)
    }

    /// Elements between adjacent lanes of access `a`.
    pub fn lane_step(&self, a: usize) -> i64 {
        match &self.lane_stride {
            Some(l) => l[a],
            None => self.cur_stride[a],
        }
    }

    /// Element offset of access `a` at element `i + lane` (for `Expr::Index`).
    pub fn elem_offset(&mut self, a: usize, i: Value, lane: i64) -> Value {
        let s = self.cur_stride[a];
        let o = self.cur_off[a];
        if s == 0 {
            return o;
        }
        let t = self.fb.b.ins().imul_imm_s(i, s);
        let o = self.fb.b.ins().iadd(o, t);
        self.fb.b.ins().iadd_imm_s(o, lane * s)
    }

    /// Sets the error code to `code` where `cond` (an i8 bool) holds.
    pub fn flag_error(&mut self, cond: Value, code: i64) {
        let e = self.fb.b.use_var(self.err);
        let c = self.iconst(I32, code);
        let n = self.fb.b.ins().select(cond, c, e);
        self.fb.b.def_var(self.err, n);
    }
}
