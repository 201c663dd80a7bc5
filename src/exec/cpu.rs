//! The executor of compiled graphs: graph → fused (or unfused) schedule → compiled kernels
//! → calls.
//!
//! [`CompiledFn::compile`] decomposes and partitions a graph, compiles every kernel once (the
//! Cranelift backend caches kernels process-wide) and plans the temporaries. A call then
//! checks its inputs against the schedule before any generated code runs, copies strided
//! inputs contiguous, runs the steps in order — kernels split into chunks of rows across
//! rayon's threads, small ones on the calling thread; GEMMs and other library ops on the
//! eager kernels through strided views — and returns the outputs as tensors (views of the
//! buffers where the schedule says so). The steps run on one worker of the pool while the
//! others poll for their chunks (`runtime::threads::hot`), so that a parallel kernel starts
//! without waking anyone.
//!
//! What a call needs besides its data is kept between calls (`frame`): the buffer and
//! pointer tables and the temporaries' storages, taken again once nothing else holds them,
//! so a small call allocates little; 2-D float GEMMs are called directly (`gemm`), and
//! [`CompiledFn::call_into`] can write an update into the tensor it reads (`inplace`).
//!
//! Two kernel backends run through the same executor: machine code from the Cranelift
//! lowering, and the kernel-IR interpreter (one step at a time), which needs no codegen.

pub(crate) mod cache;
mod epilogue;
mod frame;
mod gemm;
mod info;
mod inplace;
mod plan;
mod run;
mod tight;

pub use cache::CodeOrigin;
pub(crate) use cache::{cached_plan, fuzz_entry as fuzz_cache_entry};
pub use info::StepInfo;
pub use plan::{TempPlan, step_buffers};

use crate::codegen_cpu::lower::{CpuKernel, compile_kernel};
use crate::ir::graph::Graph;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::ir::text::fmt_type;
use crate::kernel::{self, BufferId, BufferKind, ExternCall, Schedule, Step, View};
use crate::runtime::device::Device;
use crate::runtime::kernels::copy;
use crate::runtime::layout::Layout;
use crate::runtime::{Tensor, access, apply, control};
use crate::{Result, bail};
use frame::{Frame, FramePool, Locks};
use gemm::DirectGemm;
use rayon::prelude::*;
use run::{Ptrs, buffer, elem0, run_extern, view_of};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kernels whose index space has fewer elements than this run on the calling thread: below
/// it, waking sleeping threads to hand them chunks costs more than it saves. (Inside a call
/// whose other threads poll for work, the bar is lower: `smelt_rt::hot::par_min_elems`.)
/// Chosen as the smallest size at which both threads beat one in the "small kernels" table
/// of `cargo bench --bench compiled` (BENCHMARKS.md has the figures). Ahead-of-time
/// compiled models follow the same rule.
pub use smelt_rt::model::PAR_MIN_ELEMS;

pub use super::options::{CompileOptions, DiskCache, KernelBackend};

/// How one step runs.
enum Exec {
    /// A compiled kernel and the buffers it reads and writes.
    Native {
        code: Arc<CpuKernel>,
        reads: Vec<BufferId>,
        writes: Vec<BufferId>,
        elems: usize,
        /// Every buffer it writes is a temporary only this call uses, so only the others
        /// (inputs, constants, extern results) need locks.
        owns_writes: bool,
    },
    /// The kernel-IR interpreter runs the whole step.
    Interp,
    /// A control op: its bodies compiled, in the op's body order, and those that run on
    /// raw buffers.
    Control {
        bodies: Vec<CompiledFn>,
        tight: Vec<Option<tight::TightBody>>,
    },
    /// A library call on the eager kernels; `ty` is its result type when the shape rule
    /// accepted the argument types at compile time.
    Extern { ty: Option<TensorType> },
    /// A 2-D float GEMM called directly, into the storage of its slot `place`; `update`:
    /// the next step's `w + beta·result`, done by the GEMM itself when written in place.
    Gemm {
        gemm: DirectGemm,
        place: usize,
        update: Option<gemm::Update>,
    },
}

/// The kernel steps of `s` that run inside the convolution before them, tile by tile, when
/// compiled with [`CompileOptions::conv_epilogues`] on the Cranelift backend.
pub fn nested_epilogues(s: &Schedule) -> Vec<usize> {
    (0..s.steps.len())
        .filter(|&i| epilogue::nests(s, i))
        .collect()
}

/// A graph compiled for the CPU: call it with input tensors in the graph's order.
pub struct CompiledFn {
    schedule: Schedule,
    input_names: Vec<String>,
    constants: Vec<Option<Tensor>>,
    execs: Vec<Exec>,
    /// Kernel steps that run inside the convolution before them, tile by tile
    /// ([`epilogue`]).
    in_conv: Vec<bool>,
    plan: TempPlan,
    info: Vec<StepInfo>,
    /// Whether a call moves to a pool worker with the others polling (`wants_threads`).
    threaded: bool,
    pool: Option<rayon::ThreadPool>,
    opts: CompileOptions,
    compile_time: Duration,
    /// Tensors bound to the trailing inputs (a traced function's parameters).
    bound: Vec<Tensor>,
    /// The contiguous layout of every buffer.
    layouts: Vec<Layout>,
    /// The buffers a call uses alone (temporaries in its own storages): no locks needed.
    owned: Vec<bool>,
    /// The buffers an output shows.
    returned: Vec<bool>,
    /// Scratch of the calls, kept between them.
    frames: FramePool,
    /// Calls made so far: a `dropout` draws a fresh mask on every call after the first, as
    /// an eager step draws one from the advancing generator.
    calls: std::sync::atomic::AtomicU64,
    /// Which outputs `call_into` may write into a caller's tensor.
    in_place: Vec<Option<inplace::InPlace>>,
    /// Which outputs each call copies ([`Schedule::fresh_outputs`]).
    fresh: Vec<bool>,
    /// Where the kernels' code came from.
    origin: CodeOrigin,
}

/// Per-step wall times of one call, in step order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimes(pub Vec<Duration>);

impl CompiledFn {
    /// Runs the pass pipeline (partitioning fused or not) and compiles every kernel of `g`.
    ///
    /// With the disk cache on (`SMELT_CACHE_DIR`, see [`CodeOrigin`]), a graph compiled by
    /// an earlier process loads from it: neither the passes nor Cranelift run.
    pub fn compile(g: &Graph, opts: &CompileOptions) -> Result<CompiledFn> {
        let t0 = Instant::now();
        let (p, kernels, origin) = match cache::compile(g, opts)? {
            Some(c) => (c.planned, Some(c.kernels), c.origin),
            None => (super::plan(g, &opts.passes)?, None, CodeOrigin::Jit),
        };
        let mut f = CompiledFn::build(p.schedule, p.input_names, opts, kernels)?;
        f.fresh = f.schedule.fresh_outputs(&p.may_alias);
        f.origin = origin;
        f.compile_time = t0.elapsed();
        Ok(f)
    }

    /// Where the code came from: the JIT, or the disk cache (compiled and stored now, or
    /// loaded).
    pub fn code_origin(&self) -> CodeOrigin {
        self.origin
    }

    /// Compiles an already partitioned schedule; `input_names` name its inputs in errors.
    pub fn from_schedule(
        s: Schedule,
        input_names: Vec<String>,
        opts: &CompileOptions,
    ) -> Result<CompiledFn> {
        CompiledFn::build(s, input_names, opts, None)
    }

    /// [`CompiledFn::from_schedule`], with the code of each kernel step when it is already
    /// compiled (loaded from the disk cache).
    fn build(
        s: Schedule,
        input_names: Vec<String>,
        opts: &CompileOptions,
        mut compiled: Option<Vec<Option<Arc<CpuKernel>>>>,
    ) -> Result<CompiledFn> {
        let t0 = Instant::now();
        s.validate()?;
        let cg = &opts.cpu.codegen;
        let in_conv: Vec<bool> = (0..s.steps.len())
            .map(|i| {
                opts.cpu.conv_epilogues
                    && opts.cpu.kernels == KernelBackend::Cranelift
                    && epilogue::nests(&s, i)
            })
            .collect();
        // a GEMM called directly writes its result into a slot of the plan, shared with
        // the temporaries of other steps
        let direct: Vec<bool> = s
            .steps
            .iter()
            .map(|step| match step {
                Step::Extern(e) => DirectGemm::of(&s, e).is_some() && owned_by_gemm(&s, e.out),
                _ => false,
            })
            .collect();
        let plan = TempPlan::build_nested(&s, &in_conv, &direct);
        let owned = owned_buffers(&s, &plan);
        let mut execs = Vec::with_capacity(s.steps.len());
        for (i, step) in s.steps.iter().enumerate() {
            execs.push(match (step, opts.cpu.kernels) {
                (Step::Extern(e), _) => match (DirectGemm::of(&s, e), plan.slot_of[e.out]) {
                    (Some(gemm), Some(place)) if direct[i] => {
                        let update = match opts.cpu.kernels {
                            KernelBackend::Cranelift => gemm::Update::of(&s, i, &gemm),
                            KernelBackend::Interp => None,
                        };
                        Exec::Gemm {
                            gemm,
                            place,
                            update,
                        }
                    }
                    _ => Exec::Extern {
                        ty: extern_type(&s, e),
                    },
                },
                (Step::Control(c), _) => {
                    // bodies run on the caller's pool (or serially, as the caller does)
                    let mut body_opts = opts.clone();
                    body_opts.cpu.threads = opts.cpu.threads.filter(|&n| n == 1);
                    let bodies: Vec<CompiledFn> = c
                        .control
                        .bodies
                        .iter()
                        .map(|b| CompiledFn::compile(b.graph(), &body_opts))
                        .collect::<Result<_>>()?;
                    let tight = bodies.iter().map(tight::TightBody::of).collect();
                    Exec::Control { bodies, tight }
                }
                (Step::Kernel(_), KernelBackend::Interp) => Exec::Interp,
                (Step::Kernel(k), KernelBackend::Cranelift) => {
                    let loaded = compiled.as_mut().and_then(|c| c.get_mut(i)?.take());
                    let code = match loaded {
                        Some(code) => code,
                        None => compile_kernel(k, &s.buffers, cg)?,
                    };
                    let (reads, writes) = plan::step_buffers(step);
                    Exec::Native {
                        code,
                        owns_writes: writes.iter().all(|&b| owned[b]),
                        reads,
                        writes,
                        elems: numel(&k.space()),
                    }
                }
            });
        }
        let constants = s
            .buffers
            .iter()
            .map(|b| match &b.kind {
                BufferKind::Constant(lit) => Ok(Some(copy::contiguous(&apply(
                    Op::Constant(lit.clone()),
                    &[],
                )?)?)),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        // One thread runs on the caller's thread: a one-thread pool would cost a hand-off.
        let pool = match opts.cpu.threads {
            Some(n) if n > 1 => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build()
                    .map_err(|e| crate::Error::Unsupported(format!("thread pool: {e}")))?,
            ),
            _ => None,
        };
        let info = StepInfo::of_schedule(&s);
        let mut names: Vec<String> = input_names;
        names.resize_with(s.inputs.len(), String::new);
        Ok(CompiledFn {
            layouts: s.buffers.iter().map(kernel::Buffer::layout).collect(),
            frames: FramePool::new(s.buffers.len(), plan.slots.len()),
            calls: std::sync::atomic::AtomicU64::new(0),
            in_place: inplace::analyse(&s),
            fresh: s.fresh_outputs(&[]),
            returned: (0..s.buffers.len())
                .map(|b| s.outputs.iter().any(|v| v.buffer == b))
                .collect(),
            owned,
            in_conv,
            plan,
            threaded: wants_threads(&s, &info),
            info,
            input_names: names,
            constants,
            execs,
            pool,
            opts: opts.clone(),
            compile_time: t0.elapsed(),
            origin: CodeOrigin::Jit,
            bound: Vec::new(),
            schedule: s,
        })
    }

    /// Number of GEMMs whose result only feeds `w ± c·result` for an input `w`: written in
    /// place (`call_into` with `w`'s tensor), the GEMM accumulates into `w` itself and the
    /// update kernel does not run (SGD's weight updates).
    pub fn gemm_updates(&self) -> usize {
        self.execs
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Exec::Gemm {
                        update: Some(_),
                        ..
                    }
                )
            })
            .count()
    }

    /// Number of kernels that run inside the convolution before them, on each tile of its
    /// output while the tile is in cache (bias, batch norm, relu, residual adds), instead
    /// of in a pass of their own.
    pub fn epilogues_in_convolutions(&self) -> usize {
        self.in_conv.iter().filter(|&&n| n).count()
    }

    /// The schedule this function runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
    /// The options it was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }
    /// Static facts of every step (names, ops, bytes, flops), in step order.
    pub fn steps(&self) -> &[StepInfo] {
        &self.info
    }
    /// The temporaries' plan.
    pub fn temp_plan(&self) -> &TempPlan {
        &self.plan
    }
    /// Wall time of the compilation (passes and code generation).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }
    /// Names of the inputs a call passes, in order (bound ones excluded).
    pub fn free_inputs(&self) -> &[String] {
        &self.input_names[..self.input_names.len() - self.bound.len()]
    }

    /// Binds the last `params.len()` inputs to `params` for every call; the caller then
    /// passes only the leading inputs.
    pub fn bind_trailing(mut self, params: Vec<Tensor>) -> Result<CompiledFn> {
        let n = self.schedule.inputs.len();
        if params.len() + self.bound.len() > n {
            bail!(Value, "cannot bind {} of {n} inputs", params.len());
        }
        let mut all = params;
        all.append(&mut self.bound);
        let first = n - all.len();
        for (j, t) in all.iter().enumerate() {
            self.check_input(first + j, t)?;
        }
        self.bound = all;
        Ok(self)
    }

    /// Runs the function on `inputs`, in the graph's input order.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run(inputs, None, &[])
    }

    /// Runs the function, writing output `i` straight into `into[i]` (when given) where
    /// that is safe: `into[i]` contiguous, of the output's dtype and shape, sharing no
    /// storage with another destination nor with any input except one the output's kernel
    /// only reads element by element before overwriting it (an SGD update of the
    /// parameter it reads). The returned output `i` is then a tensor over `into[i]`'s
    /// storage, whose version is bumped as by an in-place op; otherwise it is a new tensor
    /// and `into[i]` is left alone.
    pub fn call_into(&self, inputs: &[Tensor], into: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        self.run(inputs, None, into)
    }

    /// Runs the function and also returns the wall time of every step.
    pub fn call_timed(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, StepTimes)> {
        let mut t = StepTimes(Vec::with_capacity(self.execs.len()));
        let out = self.run(inputs, Some(&mut t), &[])?;
        Ok((out, t))
    }

    /// Runs the function on inputs given by name (without `%`), each exactly once.
    pub fn call_named<S: AsRef<str>>(&self, inputs: &[(S, Tensor)]) -> Result<Vec<Tensor>> {
        for (i, (name, _)) in inputs.iter().enumerate() {
            let name = name.as_ref();
            if inputs[..i].iter().any(|(n, _)| n.as_ref() == name) {
                bail!(Value, "input {name} is given more than once");
            }
            if !self.free_inputs().iter().any(|n| n == name) {
                bail!(
                    Value,
                    "graph {} has no input named '{name}' (its inputs: {})",
                    self.schedule.name,
                    self.signature()
                );
            }
        }
        let mut ordered = Vec::with_capacity(self.input_names.len());
        for (i, n) in self.free_inputs().iter().enumerate() {
            match inputs.iter().find(|(m, _)| m.as_ref() == n) {
                Some((_, t)) => ordered.push(t.clone()),
                None => bail!(Value, "missing input {n}: {}", self.input_type(i)),
            }
        }
        self.call(&ordered)
    }

    fn input_type(&self, i: usize) -> String {
        input_type(&self.schedule, i)
    }

    fn signature(&self) -> String {
        let n = self.input_names.len() - self.bound.len();
        if n == 0 {
            return "none".into();
        }
        (0..n)
            .map(|i| format!("{}: {}", self.input_names[i], self.input_type(i)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks the count of the inputs and the device, dtype and shape of each against the
    /// schedule.
    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        let want = self.schedule.inputs.len() - self.bound.len();
        if inputs.len() != want {
            bail!(
                Value,
                "graph {} takes {want} input{} ({}) but {} {} given",
                self.schedule.name,
                if want == 1 { "" } else { "s" },
                self.signature(),
                inputs.len(),
                if inputs.len() == 1 { "was" } else { "were" }
            );
        }
        for (i, t) in inputs.iter().enumerate() {
            self.check_input(i, t)?;
        }
        Ok(())
    }

    fn check_input(&self, i: usize, t: &Tensor) -> Result<()> {
        check_input(&self.schedule, i, &self.input_names[i], t, Device::Cpu)
    }
}

/// Whether some step of `s` splits across threads inside a polling call
/// (`runtime::threads::hot`). Only then does a call move to a pool worker: the hand-off
/// costs more than a whole call of a model of small steps on the caller's thread
/// (`cargo bench --bench aot`; BENCHMARKS.md). Control steps count, since their bodies may run many times.
/// A library call counts when its multiply-adds would split a GEMM (`info.flops` counts
/// two per multiply-add), or when it moves as many bytes as a kernel that splits.
fn wants_threads(s: &Schedule, info: &[StepInfo]) -> bool {
    use smelt_rt::hot::{PAR_MIN_ELEMS_HOT, kernel_splits};
    s.steps.iter().zip(info).any(|(st, info)| match st {
        Step::Kernel(k) => kernel_splits(numel(&k.outer), numel(&k.space())),
        Step::Extern(_) => {
            let macs = usize::try_from(info.flops / 2).unwrap_or(usize::MAX);
            smelt_rt::gemm::splits(macs, 1) || info.bytes >= 4 * PAR_MIN_ELEMS_HOT
        }
        Step::Control(_) => true,
    })
}

/// Runs a compiled kernel over its rows, in parallel chunks when it is large.
///
/// # Safety
/// `ptrs` must hold, for every buffer the kernel touches, a pointer to element 0 of memory
/// of the buffer's dtype and size that stays readable (and writable where the kernel
/// writes) and unused by others for the call.
unsafe fn run_rows(code: &CpuKernel, elems: usize, ptrs: &[*mut u8]) -> Result<()> {
    let rows = code.rows();
    let threads = crate::runtime::threads::available();
    if elems < smelt_rt::hot::par_min_elems() || threads < 2 || rows < 2 {
        // SAFETY: the caller's pointers, valid and unused by others for the call (this fn's
        // contract), for all the rows on this thread.
        return unsafe { code.run_rows(ptrs, 0, rows) };
    }
    let ptrs = Ptrs(ptrs);
    let chunks = smelt_rt::model::row_chunks(rows, threads, code.lane_rows().max(1));
    (0..chunks.count()).into_par_iter().try_for_each(|c| {
        let (begin, end) = chunks.get(c);
        // SAFETY: the caller's pointers stay valid and unused by others for the whole call
        // (this fn's contract); `chunks` splits `0..rows` into disjoint ranges, so the chunks
        // running at once write disjoint rows.
        unsafe { code.run_rows(ptrs.all(), begin, end) }
    })
}

/// Which buffers a call uses alone: temporaries that a kernel writes first into a slot of
/// the call's frame and that no extern call replaces, and direct GEMM results.
fn owned_buffers(s: &Schedule, plan: &TempPlan) -> Vec<bool> {
    let mut owned: Vec<bool> = plan.slot_of.iter().map(Option::is_some).collect();
    for step in &s.steps {
        if let Step::Extern(e) = step {
            owned[e.out] = DirectGemm::of(s, e).is_some() && owned_by_gemm(s, e.out);
        }
    }
    owned
}

/// Whether the temporary `b` is written by one extern call and by nothing else (so a direct
/// GEMM can own its storage).
fn owned_by_gemm(s: &Schedule, b: BufferId) -> bool {
    let writers = s
        .steps
        .iter()
        .filter(|step| plan::step_buffers(step).1.contains(&b))
        .count();
    writers == 1 && s.buffers[b].kind == BufferKind::Temp && !s.inputs.contains(&b)
}

/// The result type of extern call `e` as the shape rule gives it for its argument views.
fn extern_type(s: &Schedule, e: &ExternCall) -> Option<TensorType> {
    let types: Vec<TensorType> = e
        .args
        .iter()
        .map(|v| {
            Some(TensorType::new(
                s.buffers.get(v.buffer)?.dtype,
                v.shape.clone(),
            ))
        })
        .collect::<Option<_>>()?;
    let refs: Vec<&TensorType> = types.iter().collect();
    e.op.infer(&refs).ok()
}

/// The type of input `i` of `s`, as the text format writes it.
pub(crate) fn input_type(s: &Schedule, i: usize) -> String {
    let b = &s.buffers[s.inputs[i]];
    fmt_type(&TensorType::new(b.dtype, b.shape.clone()))
}

/// Checks input `i` (named `name`) of `s`: on `device`, with the schedule's dtype and shape.
pub(crate) fn check_input(
    s: &Schedule,
    i: usize,
    name: &str,
    t: &Tensor,
    device: Device,
) -> Result<()> {
    let b = &s.buffers[s.inputs[i]];
    if t.device() != device {
        bail!(
            Device,
            "input {i} ({name}) is on {}, but the function is compiled for {device}",
            t.device()
        );
    }
    if t.dtype() != b.dtype || t.shape() != b.shape.as_slice() {
        bail!(
            Value,
            "input {i} ({name}): expected {} but got {}",
            input_type(s, i),
            fmt_type(&TensorType::new(t.dtype(), t.shape().to_vec()))
        );
    }
    Ok(())
}
