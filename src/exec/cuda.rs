//! Compiled graphs on a GPU: the same pass pipeline and schedule as the CPU backend, its
//! kernels as CUDA C (one module per schedule, through the program caches), GEMMs through
//! cuBLAS, and the remaining library ops on the CPU's eager kernels (their operands are
//! copied over and back: correct, not fast).
//!
//! Buffers are device storages from the caching allocator, taken per call (after the first
//! call they come from the cache without driver calls). Inputs must be on the function's
//! device; a non-contiguous one is copied dense first. Outputs are device tensors, views of
//! their buffers where the schedule says so.

use super::CompileOptions;
use super::cpu::{StepInfo, check_input};
use crate::codegen_cuda::{self, CudaProgram, CudaStep, ParamAccess};
use crate::ir::graph::Graph;
use crate::ir::op::Op;
use crate::kernel::{BufferKind, ExternCall, Schedule, View};
use crate::runtime::cuda::blas;
use crate::runtime::cuda::driver::{Function, Gpu, Module, Timer};
use crate::runtime::cuda::memory::DeviceBuffer;
use crate::runtime::cuda::program::{self, Origin};
use crate::runtime::device::Device;
use crate::runtime::layout::Layout;
use crate::runtime::storage::Storage;
use crate::runtime::{Tensor, apply};
use crate::{Error, Result, bail};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A buffer during a call: a device storage and the element where the buffer starts.
#[derive(Clone)]
struct Buf {
    storage: Arc<Storage>,
    offset: usize,
}

impl Buf {
    fn ptr(&self) -> u64 {
        let base = self.storage.device_ptr().unwrap_or(0);
        base + (self.offset * self.storage.dtype().size()) as u64
    }

    fn view(&self, v: &View) -> Tensor {
        Tensor::from_parts(
            self.storage.clone(),
            Layout {
                shape: v.shape.clone(),
                strides: v.strides.clone(),
                offset: self.offset + v.offset,
            },
        )
    }
}

/// A graph compiled for one GPU.
pub struct CudaFn {
    gpu: Arc<Gpu>,
    schedule: Schedule,
    program: CudaProgram,
    _module: Option<Arc<Module>>,
    /// The function of every program kernel.
    functions: Vec<Function>,
    input_names: Vec<String>,
    constants: Vec<Option<Buf>>,
    error_flag: DeviceBuffer,
    /// Some kernel has an integer remainder (and so may set the flag).
    checks_errors: bool,
    info: Vec<StepInfo>,
    compile_time: Duration,
    origin: Origin,
    /// Which outputs each call copies ([`Schedule::fresh_outputs`]).
    fresh: Vec<bool>,
    /// The compiled bodies of each control step (empty for other steps).
    bodies: Vec<Vec<CudaFn>>,
}

impl CudaFn {
    /// Runs the pass pipeline and compiles every kernel of `g` for GPU `opts.gpu.device`.
    pub fn compile(g: &Graph, opts: &CompileOptions) -> Result<CudaFn> {
        let t0 = Instant::now();
        if !opts.channels_last_inputs().is_empty() {
            bail!(
                Unsupported,
                "channels_last inputs are compiled for the CPU only; give the GPU NCHW tensors"
            );
        }
        let gpu = Gpu::get(opts.gpu.device)?;
        // no fused attention backward on the GPU: its matmul-and-softmax form instead
        let expanded = crate::passes::decompose::expand_attention_grads(g)?;
        let g = &*expanded;
        let p = super::plan(g, &opts.passes)?;
        let mut f = CudaFn::from_schedule(&gpu, p.schedule, p.input_names, &opts.gpu.codegen)?;
        f.fresh = f.schedule.fresh_outputs(&p.may_alias);
        f.compile_time = t0.elapsed();
        Ok(f)
    }

    /// Generates, compiles and loads the kernels of an already partitioned schedule.
    pub fn from_schedule(
        gpu: &Arc<Gpu>,
        s: Schedule,
        input_names: Vec<String>,
        codegen: &codegen_cuda::CudaOptions,
    ) -> Result<CudaFn> {
        let t0 = Instant::now();
        let program = codegen_cuda::generate(&s, codegen)?;
        let (module, origin, functions) = if program.kernels.is_empty() {
            (None, Origin::Memory, Vec::new())
        } else {
            let name = format!("{}.cu", program.name);
            let (m, origin) = program::load(gpu, &program.whole(), &name, codegen.use_fast_math)?;
            let fs = program
                .kernels
                .iter()
                .map(|k| m.function(&k.name))
                .collect::<Result<Vec<_>>>()?;
            (Some(m), origin, fs)
        };
        let constants = s
            .buffers
            .iter()
            .map(|b| match &b.kind {
                BufferKind::Constant(lit) => {
                    let host = apply(Op::Constant(lit.clone()), &[])?;
                    let dev = crate::runtime::cuda::tensor::upload(&host, gpu.ordinal())?;
                    Ok(Some(Buf {
                        offset: dev.storage_offset(),
                        storage: dev.storage_arc().clone(),
                    }))
                }
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        let checks_errors = program.kernels.iter().any(|k| k.may_raise());
        let mut body_opts = CompileOptions::default().on_gpu(gpu.ordinal());
        body_opts.gpu.codegen = codegen.clone();
        let bodies = s
            .steps
            .iter()
            .map(|st| match st {
                crate::kernel::Step::Control(c) => c
                    .control
                    .bodies
                    .iter()
                    .map(|b| CudaFn::compile(b.graph(), &body_opts))
                    .collect::<Result<Vec<_>>>(),
                _ => Ok(Vec::new()),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut names = input_names;
        names.resize_with(s.inputs.len(), String::new);
        Ok(CudaFn {
            gpu: gpu.clone(),
            info: StepInfo::of_schedule(&s),
            error_flag: DeviceBuffer::alloc(gpu.ordinal(), 4)?,
            checks_errors,
            program,
            _module: module,
            functions,
            input_names: names,
            constants,
            compile_time: t0.elapsed(),
            origin,
            fresh: s.fresh_outputs(&[]),
            bodies,
            schedule: s,
        })
    }

    /// The schedule this function runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }
    /// The generated CUDA program.
    pub fn program(&self) -> &CudaProgram {
        &self.program
    }
    /// Static facts of every step, in step order.
    pub fn steps(&self) -> &[StepInfo] {
        &self.info
    }
    /// Wall time of the compilation (passes, code generation, NVRTC or cache, loading).
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }
    /// Where the kernels' module came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// The device it runs on.
    pub fn device(&self) -> Device {
        Device::Cuda(self.gpu.ordinal())
    }

    /// Runs the function on device tensors, in the graph's input order.
    pub fn call(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run(inputs, None)
    }

    /// Runs the function and also returns the GPU time of every step (CUDA events), in ms.
    pub fn call_timed(&self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<f32>)> {
        let mut t = Vec::with_capacity(self.schedule.steps.len());
        let out = self.run(inputs, Some(&mut t))?;
        Ok((out, t))
    }

    /// The GPU time of one whole call between two CUDA events, in ms, without per-step
    /// synchronisation.
    pub fn time_whole(&self, inputs: &[Tensor]) -> Result<f32> {
        let t = Timer::new(&self.gpu)?;
        t.start()?;
        drop(self.call(inputs)?);
        t.stop()?;
        t.elapsed_ms()
    }

    fn check_inputs(&self, inputs: &[Tensor]) -> Result<()> {
        let want = self.schedule.inputs.len();
        if inputs.len() != want {
            bail!(
                Value,
                "graph {} takes {want} input{} but {} {} given",
                self.schedule.name,
                if want == 1 { "" } else { "s" },
                inputs.len(),
                if inputs.len() == 1 { "was" } else { "were" }
            );
        }
        for (i, t) in inputs.iter().enumerate() {
            check_input(&self.schedule, i, &self.input_names[i], t, self.device())?;
        }
        Ok(())
    }

    fn run(&self, inputs: &[Tensor], mut times: Option<&mut Vec<f32>>) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        self.gpu.bind()?;
        let _call = crate::profiler::span(crate::profiler::EventKind::Call, || {
            self.schedule.name.clone()
        });
        let profiling = crate::profiler::enabled();
        let s = &self.schedule;
        let mut bufs: Vec<Option<Buf>> = self.constants.clone();
        for (&b, t) in s.inputs.iter().zip(inputs) {
            let dense = crate::runtime::cuda::tensor::contiguous(t)?;
            bufs[b] = Some(Buf {
                offset: dense.storage_offset(),
                storage: dense.storage_arc().clone(),
            });
        }
        // every kernel-written buffer, from the caching allocator
        for (b, buf) in s.buffers.iter().enumerate() {
            if bufs[b].is_none() && matches!(buf.kind, BufferKind::Temp) {
                let st = Storage::cuda_for_overwrite(self.gpu.ordinal(), buf.dtype, buf.len())?;
                bufs[b] = Some(Buf {
                    storage: Arc::new(st),
                    offset: 0,
                });
            }
        }
        if self.checks_errors {
            self.gpu.zero(self.error_flag.ptr(), 4)?;
        }
        for (i, step) in s.steps.iter().enumerate() {
            let host_start = Instant::now();
            let timer = if profiling || times.is_some() {
                let t = Timer::new(&self.gpu)?;
                t.start()?;
                Some(t)
            } else {
                None
            };
            // a convolution cuDNN takes skips its generated kernel
            let by_dnn = match step {
                crate::kernel::Step::Extern(e) => self.run_dnn(e, &bufs)?,
                _ => false,
            };
            let span = match by_dnn {
                true => 0..0,
                false => self.program.spans.get(i).cloned().unwrap_or_default(),
            };
            for cstep in self.program.steps.get(span).unwrap_or(&[]) {
                match cstep {
                    CudaStep::Kernel(k) => self.launch(*k, &bufs)?,
                    CudaStep::Extern(_) => {
                        let crate::kernel::Step::Extern(e) = step else {
                            bail!(Value, "schedule and CUDA program disagree");
                        };
                        self.run_extern(e, &mut bufs)?;
                    }
                    CudaStep::Control { .. } => {
                        let crate::kernel::Step::Control(c) = step else {
                            bail!(Value, "schedule and CUDA program disagree");
                        };
                        self.run_control(c, &self.bodies[i], &mut bufs)?;
                    }
                }
            }
            if let Some(t) = timer {
                t.stop()?;
                let ms = t.elapsed_ms()?;
                if let Some(times) = times.as_deref_mut() {
                    times.push(ms);
                }
                if profiling {
                    self.record_step(i, host_start, ms);
                }
            }
        }
        if self.checks_errors {
            let mut flag = [0u8; 4];
            self.gpu.dtoh(&mut flag, self.error_flag.ptr())?;
            match u32::from_ne_bytes(flag) {
                0 => {}
                codegen_cuda::indexing::INDEX_ERROR => return Err(self.index_error(inputs)),
                _ => bail!(Value, "ZeroDivisionError"),
            }
        }
        s.outputs
            .iter()
            .zip(&self.fresh)
            .map(
                |(v, &fresh)| match bufs.get(v.buffer).and_then(Option::as_ref) {
                    Some(b) if fresh => crate::runtime::cuda::tensor::contiguous_copy(&b.view(v)),
                    Some(b) => Ok(b.view(v)),
                    None => bail!(Value, "schedule: output b{} is never written", v.buffer),
                },
            )
            .collect()
    }

    /// Tells the profiler that step `i`, launched at `start`, took `ms` on the GPU (its
    /// stream's track; the timer's synchronisation makes the host wait for it).
    fn record_step(&self, i: usize, start: Instant, ms: f32) {
        use crate::profiler::{EventKind, Measured, Track, record_measured};
        let Some(info) = self.info.get(i) else { return };
        let kind = if info.is_extern {
            EventKind::Extern
        } else {
            EventKind::Kernel
        };
        let (_, writes) = super::cpu::step_buffers(&self.schedule.steps[i]);
        let m = Measured {
            values: writes
                .iter()
                .map(|&b| format!("%{}", self.schedule.buffers[b].name))
                .collect(),
            bytes: info.bytes as u64,
            flops: info.flops,
        };
        let track = Track::Stream {
            device: self.gpu.ordinal() as u32,
            stream: 0,
        };
        let dur = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
        record_measured(kind, &info.name, track, start, dur, m);
    }

    /// The error of an index out of range, with PyTorch's message: the schedule's reference
    /// interpreter finds it on host copies of the inputs (a rare path, not a fast one).
    fn index_error(&self, inputs: &[Tensor]) -> Error {
        let host: Result<Vec<Tensor>> = inputs.iter().map(|t| t.cpu()).collect();
        match host.and_then(|h| crate::kernel::interp::run(&self.schedule, &h)) {
            Err(e) => e,
            Ok(_) => Error::Index(format!(
                "graph {}: a GPU kernel saw an index out of range",
                self.schedule.name
            )),
        }
    }

    fn launch(&self, i: usize, bufs: &[Option<Buf>]) -> Result<()> {
        let k = &self.program.kernels[i];
        let grid = k.launch.grid();
        if grid == 0 {
            return Ok(());
        }
        let mut args = Vec::with_capacity(k.params.len());
        for p in &k.params {
            args.push(match (p.access, p.buffer) {
                (ParamAccess::ErrorFlag, _) => self.error_flag.ptr(),
                (_, Some(b)) => match bufs.get(b).and_then(Option::as_ref) {
                    Some(buf) => buf.ptr(),
                    None => bail!(
                        Value,
                        "kernel {}: b{b} is used before it is written",
                        k.name
                    ),
                },
                (_, None) => bail!(Value, "kernel {}: parameter without a buffer", k.name),
            });
        }
        let grid = u32::try_from(grid)
            .map_err(|_| Error::Value(format!("kernel {}: grid {grid} too large", k.name)))?;
        // SAFETY: the parameters are the kernel's buffers in its parameter order, each a
        // live device allocation of its schedule size (validated when generated).
        unsafe { self.functions[i].launch(grid, k.launch.block(), 0, &args) }
    }

    /// Runs a control step from the host: the loop's bookkeeping on the CPU, every body a
    /// call of its compiled program on the GPU.
    fn run_control(
        &self,
        c: &crate::kernel::ControlCall,
        bodies: &[CudaFn],
        bufs: &mut [Option<Buf>],
    ) -> Result<()> {
        let args = views(bufs, &c.args)?;
        let results = crate::runtime::control::run(&c.control, &args, &OnGpu(bodies))?;
        for (r, out) in results.into_iter().zip(&c.outs) {
            if let Some(b) = out {
                let dense = crate::runtime::cuda::tensor::contiguous(&r)?;
                bufs[*b] = Some(Buf {
                    offset: dense.storage_offset(),
                    storage: dense.storage_arc().clone(),
                });
            }
        }
        Ok(())
    }

    /// Runs a convolution through cuDNN into its output buffer; false when cuDNN does not
    /// take it (no library, or a call it cannot express) and nothing was written.
    fn run_dnn(&self, e: &ExternCall, bufs: &[Option<Buf>]) -> Result<bool> {
        if !matches!(
            e.op,
            Op::Conv { .. } | Op::ConvInputGrad { .. } | Op::ConvWeightGrad { .. }
        ) {
            return Ok(false);
        }
        let Some(dst) = bufs.get(e.out).and_then(Option::as_ref) else {
            return Ok(false);
        };
        let args = views(bufs, &e.args)?;
        let out = &self.schedule.buffers[e.out];
        let strides = out.strides();
        let target = crate::runtime::cuda::dnn::Out {
            ptr: dst.ptr(),
            shape: &out.shape,
            strides: &strides,
        };
        crate::runtime::cuda::dnn::run(&self.gpu, &e.op, &args, &target)
    }

    fn run_extern(&self, e: &ExternCall, bufs: &mut [Option<Buf>]) -> Result<()> {
        let args = views(bufs, &e.args)?;
        let out = &self.schedule.buffers[e.out];
        if matches!(e.op, Op::Matmul) && args.len() == 2 && blas::supports(out.dtype) {
            let dst = Storage::cuda_for_overwrite(self.gpu.ordinal(), out.dtype, out.len())?;
            let dst = Arc::new(dst);
            matmul_into(&self.gpu, &args[0], &args[1], dst.device_ptr().unwrap_or(0))?;
            bufs[e.out] = Some(Buf {
                storage: dst,
                offset: 0,
            });
            return Ok(());
        }
        // a collective of a GPU group reduces the device buffer itself (NCCL)
        if let (Op::AllReduce { .. }, [x]) = (&e.op, &args[..]) {
            let r = crate::runtime::kernels::eval(&e.op, &[x], &x.ttype())?;
            bufs[e.out] = Some(Buf {
                offset: r.storage_offset(),
                storage: r.storage_arc().clone(),
            });
            return Ok(());
        }
        // the CPU's kernel on copies of the operands
        let host: Vec<Tensor> = args
            .iter()
            .map(crate::runtime::cuda::tensor::download)
            .collect::<Result<_>>()?;
        let r = crate::kernel::interp::run_extern(&self.schedule, e, &host, None)?;
        let dev = crate::runtime::cuda::tensor::upload(&r, self.gpu.ordinal())?;
        bufs[e.out] = Some(Buf {
            offset: dev.storage_offset(),
            storage: dev.storage_arc().clone(),
        });
        Ok(())
    }
}

/// The tensors of strided views of a call's buffers.
fn views(bufs: &[Option<Buf>], vs: &[View]) -> Result<Vec<Tensor>> {
    vs.iter()
        .map(|v| match bufs.get(v.buffer).and_then(Option::as_ref) {
            Some(b) => Ok(b.view(v)),
            None => bail!(
                Value,
                "schedule: b{} is read before it is written",
                v.buffer
            ),
        })
        .collect()
}

/// The compiled bodies of a control step on a GPU; host values (a loop's counter) are
/// uploaded first.
struct OnGpu<'a>(&'a [CudaFn]);

impl crate::runtime::control::Bodies for OnGpu<'_> {
    fn call(&self, i: usize, inputs: &[Tensor], _into: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let Some(body) = self.0.get(i) else {
            bail!(Value, "a control step has no body {i}");
        };
        let ordinal = body.gpu.ordinal();
        let on_gpu = inputs
            .iter()
            .map(|t| match t.device() {
                Device::Cpu => crate::runtime::cuda::tensor::upload(t, ordinal),
                _ => Ok(t.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        body.call(&on_gpu)
    }
}

fn geom(t: &Tensor) -> blas::Geom {
    blas::Geom {
        shape: t.shape().to_vec(),
        strides: t.strides().to_vec(),
        offset: t.storage_offset(),
    }
}

/// `torch.matmul(a, b)` of device views into the dense buffer at `c_ptr` (of the result's
/// shape), through cuBLAS. Operands cuBLAS cannot read are copied dense first.
pub fn matmul_into(gpu: &Arc<Gpu>, a: &Tensor, b: &Tensor, c_ptr: u64) -> Result<()> {
    let dtype = a.dtype();
    if b.dtype() != dtype || !blas::supports(dtype) {
        bail!(
            DType,
            "matmul on the GPU: expected two float tensors of one dtype, got {} and {}",
            a.dtype(),
            b.dtype()
        );
    }
    let (ra, rb) = blas::readable(&geom(a), &geom(b));
    let a = if ra {
        a.clone()
    } else {
        crate::runtime::cuda::tensor::contiguous_copy(a)?
    };
    let b = if rb {
        b.clone()
    } else {
        crate::runtime::cuda::tensor::contiguous_copy(b)?
    };
    let base = |t: &Tensor| t.storage().device_ptr().unwrap_or(0);
    for call in blas::plan(&geom(&a), &geom(&b))? {
        blas::gemm(gpu, dtype, &call, base(&b), base(&a), c_ptr)?;
    }
    Ok(())
}
