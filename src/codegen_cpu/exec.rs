//! The executor of compiled graphs: graph → fused (or unfused) schedule → compiled kernels
//! → calls.
//!
//! [`CompiledFn::compile`] decomposes and partitions a graph, compiles every kernel once (the
//! Cranelift backend caches kernels process-wide) and plans the temporaries. A call then
//! checks its inputs against the schedule before any generated code runs, copies strided
//! inputs contiguous, runs the steps in order — kernels split into chunks of rows across
//! rayon's threads, small ones on the calling thread; GEMMs and other library ops on the
//! eager kernels through strided views — and returns the outputs as tensors (views of the
//! buffers where the schedule says so).
//!
//! Two kernel backends run through the same executor: machine code from the Cranelift
//! lowering, and the kernel-IR interpreter (one step at a time), which needs no codegen.

mod info;
mod plan;

pub use info::StepInfo;
pub use plan::TempPlan;

use super::lower::{CodegenOptions, CpuKernel, compile_kernel};
use crate::ir::graph::Graph;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::ir::text::fmt_type;
use crate::kernel::{self, BufferId, BufferKind, ExternCall, Schedule, Step, View};
use crate::passes::Pipeline;
use crate::runtime::device::Device;
use crate::runtime::kernels::{self as eager, copy};
use crate::runtime::layout::Layout;
use crate::runtime::{Tensor, access, apply};
use crate::{Result, bail};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kernels whose index space has fewer elements than this run on the calling thread: below
/// it, handing chunks to other threads costs more than it saves. The eager kernels' value
/// (`strided::PAR_THRESHOLD`); the "small kernels" table of `cargo bench --bench compiled`
/// measures it for generated code.
pub const PAR_MIN_ELEMS: usize = 1 << 15;

/// Chunks per thread for a parallel kernel, so uneven rows still balance.
const CHUNKS_PER_THREAD: usize = 4;

/// What runs the fused kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelBackend {
    /// Machine code generated with Cranelift.
    #[default]
    Cranelift,
    /// The kernel-IR reference interpreter (slow; needs no code generation).
    Interp,
}

impl KernelBackend {
    /// Name in reports and errors.
    pub fn name(self) -> &'static str {
        match self {
            KernelBackend::Cranelift => "cranelift",
            KernelBackend::Interp => "kernel-interp",
        }
    }
}

/// How to compile a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Fuse ops into kernels; false gives the unfused baseline (one kernel per op, same
    /// code generation).
    pub fuse: bool,
    /// What runs the kernels.
    pub backend: KernelBackend,
    /// Allow approximate math in generated code.
    pub fast_math: bool,
    /// Threads for one call (`None`: rayon's global pool).
    pub threads: Option<usize>,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            fuse: true,
            backend: KernelBackend::Cranelift,
            fast_math: false,
            threads: None,
        }
    }
}

impl CompileOptions {
    /// Fused kernels on `backend`.
    pub fn with_backend(backend: KernelBackend) -> CompileOptions {
        CompileOptions {
            backend,
            ..CompileOptions::default()
        }
    }
    /// The same options with fusion on or off.
    pub fn fused(mut self, fuse: bool) -> CompileOptions {
        self.fuse = fuse;
        self
    }
    /// The same options with a fixed number of threads.
    pub fn threads(mut self, n: usize) -> CompileOptions {
        self.threads = Some(n);
        self
    }
}

/// How one step runs.
enum Exec {
    /// A compiled kernel and the buffers it reads and writes.
    Native {
        code: Arc<CpuKernel>,
        reads: Vec<BufferId>,
        writes: Vec<BufferId>,
        elems: usize,
    },
    /// The kernel-IR interpreter runs the whole step.
    Interp,
    /// A library call on the eager kernels.
    Extern,
}

/// A graph compiled for the CPU: call it with input tensors in the graph's order.
pub struct CompiledFn {
    schedule: Schedule,
    input_names: Vec<String>,
    constants: Vec<Option<Tensor>>,
    execs: Vec<Exec>,
    plan: TempPlan,
    info: Vec<StepInfo>,
    pool: Option<rayon::ThreadPool>,
    opts: CompileOptions,
    compile_time: Duration,
    /// Tensors bound to the trailing inputs (a traced function's parameters).
    bound: Vec<Tensor>,
}

/// Per-step wall times of one call, in step order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimes(pub Vec<Duration>);

/// Raw buffer pointers handed to the chunks of one kernel call.
struct Ptrs(Vec<*mut u8>);
// SAFETY: the pointers are only dereferenced by generated code while the storages are
// locked by the calling thread, and each chunk writes disjoint rows.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

impl Ptrs {
    fn all(&self) -> &[*mut u8] {
        &self.0
    }
}

impl CompiledFn {
    /// Runs the pass pipeline (partitioning fused or not) and compiles every kernel of `g`.
    pub fn compile(g: &Graph, opts: &CompileOptions) -> Result<CompiledFn> {
        let t0 = Instant::now();
        let mut pipeline = Pipeline::default();
        pipeline.options.fuse.fuse = opts.fuse;
        if !opts.fuse {
            // The unfused baseline runs the ops as written, one kernel each.
            pipeline.graph_passes.retain(|p| p.name() != "rewrite");
        }
        pipeline.options.rewrite.fast_math = opts.fast_math;
        let s = pipeline
            .run_until(g, "fuse")?
            .schedule
            .ok_or_else(|| crate::Error::Value("the pass pipeline produced no schedule".into()))?;
        let names = g.inputs().iter().map(|&v| g.node(v).name.clone()).collect();
        let mut f = CompiledFn::from_schedule(s, names, opts)?;
        f.compile_time = t0.elapsed();
        Ok(f)
    }

    /// Compiles an already partitioned schedule; `input_names` name its inputs in errors.
    pub fn from_schedule(
        s: Schedule,
        input_names: Vec<String>,
        opts: &CompileOptions,
    ) -> Result<CompiledFn> {
        let t0 = Instant::now();
        s.validate()?;
        let cg = CodegenOptions {
            fast_math: opts.fast_math,
        };
        let mut execs = Vec::with_capacity(s.steps.len());
        for step in &s.steps {
            execs.push(match (step, opts.backend) {
                (Step::Extern(_), _) => Exec::Extern,
                (Step::Kernel(_), KernelBackend::Interp) => Exec::Interp,
                (Step::Kernel(k), KernelBackend::Cranelift) => {
                    let code = compile_kernel(k, &s.buffers, &cg)?;
                    let (reads, writes) = plan::step_buffers(step);
                    Exec::Native {
                        code,
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
                BufferKind::Constant(lit) => {
                    apply(Op::Constant(lit.clone()), &[]).map(|t| Some(copy::contiguous(&t)))
                }
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let pool = match opts.threads {
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build()
                    .map_err(|e| crate::Error::Unsupported(format!("thread pool: {e}")))?,
            ),
            None => None,
        };
        let mut names: Vec<String> = input_names;
        names.resize_with(s.inputs.len(), String::new);
        Ok(CompiledFn {
            plan: TempPlan::build(&s),
            info: StepInfo::of_schedule(&s),
            input_names: names,
            constants,
            execs,
            pool,
            opts: opts.clone(),
            compile_time: t0.elapsed(),
            bound: Vec::new(),
            schedule: s,
        })
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
        self.run(inputs, None)
    }

    /// Runs the function and also returns the wall time of every step.
    pub fn call_timed(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, StepTimes)> {
        let mut t = StepTimes(Vec::with_capacity(self.execs.len()));
        let out = self.run(inputs, Some(&mut t))?;
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

    fn run(&self, inputs: &[Tensor], times: Option<&mut StepTimes>) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        match &self.pool {
            Some(p) => p.install(|| self.run_steps(inputs, times)),
            None => self.run_steps(inputs, times),
        }
    }

    fn run_steps(
        &self,
        inputs: &[Tensor],
        mut times: Option<&mut StepTimes>,
    ) -> Result<Vec<Tensor>> {
        let s = &self.schedule;
        let mut bufs: Vec<Option<Tensor>> = self.constants.clone();
        for (&b, t) in s.inputs.iter().zip(inputs.iter().chain(&self.bound)) {
            bufs[b] = Some(copy::contiguous(t));
        }
        let mut slots: Vec<Option<Tensor>> = vec![None; self.plan.slots.len()];
        for (i, (step, exec)) in s.steps.iter().zip(&self.execs).enumerate() {
            for &b in &self.plan.alloc_before[i] {
                bufs[b] = Some(self.take_slot(&mut slots, b));
            }
            // the clock is read only when timing: an untimed small call is a few µs
            let t0 = times.is_some().then(Instant::now);
            match (exec, step) {
                (
                    Exec::Native {
                        code,
                        reads,
                        writes,
                        elems,
                    },
                    _,
                ) => self.run_native(code, reads, writes, *elems, &bufs)?,
                (Exec::Interp, _) => kernel::interp::run_step(s, step, &mut bufs)?,
                (Exec::Extern, Step::Extern(e)) => run_extern(s, e, &mut bufs)?,
                (Exec::Extern, Step::Kernel(k)) => {
                    bail!(Value, "kernel {} has no compiled code", k.name)
                }
            }
            if let (Some(t), Some(t0)) = (times.as_deref_mut(), t0) {
                t.0.push(t0.elapsed());
            }
            for &b in &self.plan.free_after[i] {
                if let (Some(slot), Some(t)) = (self.plan.slot_of[b], bufs[b].take()) {
                    slots[slot] = Some(t);
                }
            }
        }
        s.outputs.iter().map(|v| view_of(&bufs, v)).collect()
    }

    /// The tensor of temporary `b`: its slot's memory when a released one is there.
    fn take_slot(&self, slots: &mut [Option<Tensor>], b: BufferId) -> Tensor {
        let buf = &self.schedule.buffers[b];
        let held = self.plan.slot_of[b].and_then(|s| slots[s].take());
        match held {
            Some(t) => t.with_layout(Layout::contiguous(&buf.shape)),
            None => Tensor::alloc_for_overwrite(buf.dtype, &buf.shape),
        }
    }

    /// Runs a compiled kernel over its rows, in parallel chunks when it is large.
    fn run_native(
        &self,
        code: &CpuKernel,
        reads: &[BufferId],
        writes: &[BufferId],
        elems: usize,
        bufs: &[Option<Tensor>],
    ) -> Result<()> {
        let get = |b: BufferId| -> Result<&Tensor> {
            match bufs.get(b).and_then(Option::as_ref) {
                Some(t) => Ok(t),
                None => bail!(Value, "schedule: b{b} is used before it is written"),
            }
        };
        let rt: Vec<&Tensor> = reads.iter().map(|&b| get(b)).collect::<Result<_>>()?;
        let wt: Vec<&Tensor> = writes.iter().map(|&b| get(b)).collect::<Result<_>>()?;
        let acc = access::lock(&rt, &wt);
        let mut ptrs = vec![std::ptr::null_mut::<u8>(); bufs.len()];
        for (j, &b) in reads.iter().enumerate() {
            ptrs[b] = acc.read::<u8>(j) as *mut u8;
        }
        for (j, &b) in writes.iter().enumerate() {
            ptrs[b] = acc.write::<u8>(j);
        }
        for t in &wt {
            t.storage().bump_version();
        }
        let ptrs = Ptrs(ptrs);
        let rows = code.rows();
        let threads = rayon::current_num_threads();
        // SAFETY: every buffer the kernel touches is allocated with its schedule dtype and
        // size and locked above (reads shared, writes exclusive); chunks cover disjoint rows.
        if elems < PAR_MIN_ELEMS || threads < 2 || rows < 2 {
            return unsafe { code.run_rows(ptrs.all(), 0, rows) };
        }
        let chunks = rows.min(threads * CHUNKS_PER_THREAD);
        (0..chunks).into_par_iter().try_for_each(|c| {
            let (begin, end) = (c * rows / chunks, (c + 1) * rows / chunks);
            unsafe { code.run_rows(ptrs.all(), begin, end) }
        })
    }
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

/// Runs a library call on the eager kernels: GEMMs through the strided gemm path, anything
/// else through the op's reference kernel.
fn run_extern(s: &Schedule, e: &ExternCall, bufs: &mut [Option<Tensor>]) -> Result<()> {
    let args: Vec<Tensor> = e
        .args
        .iter()
        .map(|v| view_of(bufs, v))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = args.iter().collect();
    let types: Vec<TensorType> = args.iter().map(Tensor::ttype).collect();
    let trefs: Vec<&TensorType> = types.iter().collect();
    let ty = e.op.infer(&trefs)?;
    let b = &s.buffers[e.out];
    if ty.dtype != b.dtype || ty.shape != b.shape {
        bail!(
            Value,
            "extern {}: result {} does not fit b{}",
            e.op.name(),
            fmt_type(&ty),
            e.out
        );
    }
    let r = eager::eval(&e.op, &refs, &ty)?;
    bufs[e.out] = Some(copy::contiguous(&r));
    Ok(())
}

/// The strided view `v` of its buffer.
fn view_of(bufs: &[Option<Tensor>], v: &View) -> Result<Tensor> {
    let Some(t) = bufs.get(v.buffer).and_then(Option::as_ref) else {
        bail!(
            Value,
            "schedule: b{} is read before it is written",
            v.buffer
        )
    };
    Ok(t.with_layout(Layout {
        shape: v.shape.clone(),
        strides: v.strides.clone(),
        offset: t.storage_offset() + v.offset,
    }))
}
