//! Loops whose bodies are compiled kernels only, run over raw buffers: the memory of every
//! buffer of the body is allocated once per loop, a carry's new value is written into a
//! buffer of its own and the two are swapped (pointers, not data) for the next iteration,
//! and a scan's slices are read in place. An iteration costs its kernel calls and nothing
//! else: no tensor is made, checked or allocated.
//!
//! The semantics are `runtime::control::run`'s (which the executor uses for every other
//! loop); the control-flow tests compare both with the interpreter.

use super::gemm::DirectGemm;
use super::{CompiledFn, Exec, run_rows};
use crate::codegen_cpu::lower::CpuKernel;
use crate::ir::control::{Control, ControlKind};
use crate::ir::dtype::DType;
use crate::ir::op::TensorType;
use crate::kernel::{BufferId, BufferKind, ExternCall};
use crate::runtime::Tensor;
use crate::runtime::access;
use crate::runtime::kernels::copy;
use crate::runtime::layout::Layout;
use crate::runtime::storage::Storage;
use crate::{Result, bail};
use std::sync::Arc;

/// A body that runs on raw buffers: its kernels in order, and where its inputs and outputs
/// live.
pub(super) struct TightBody {
    steps: Vec<Step>,
    /// Some step is a library call, which reads its operands as tensors.
    views: bool,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
}

impl TightBody {
    /// The body's plan, or `None` when a step is not a compiled kernel or an output is not a
    /// whole contiguous buffer written by the body (or an input returned as it is).
    pub(super) fn of(f: &CompiledFn) -> Option<TightBody> {
        let s = &f.schedule;
        let mut steps = Vec::new();
        for e in &f.execs {
            match e {
                Exec::Native { code, elems, .. } => steps.push(Step::Kernel(code.clone(), *elems)),
                Exec::Gemm { gemm, .. } => steps.push(Step::Gemm(gemm.clone())),
                // a dropout draws a new mask per call: the general loop keeps count
                Exec::Extern { ty } => match &s.steps[steps.len()] {
                    crate::kernel::Step::Extern(e)
                        if !matches!(e.op, crate::ir::op::Op::Dropout { .. }) =>
                    {
                        steps.push(Step::Extern(e.clone(), ty.clone()))
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
        if !f.bound.is_empty() {
            return None;
        }
        let mut outputs = Vec::new();
        for v in &s.outputs {
            let b = s.buffers.get(v.buffer)?;
            let whole = v.offset == 0
                && v.shape == b.shape
                && v.strides == crate::ir::shape::contiguous_strides(&b.shape)
                && !b.channels_last;
            // an input returned as it is: `Loop::new` checks that it is its own carry
            let ok = matches!(b.kind, BufferKind::Temp | BufferKind::Input(_));
            if !whole || !ok || outputs.contains(&v.buffer) {
                return None;
            }
            outputs.push(v.buffer);
        }
        Some(TightBody {
            views: steps.iter().any(|s| matches!(s, Step::Extern(..))),
            steps,
            inputs: s.inputs.clone(),
            outputs,
        })
    }

    /// Runs the kernels on `ptrs` (one per buffer of the body's schedule).
    ///
    /// # Safety
    /// Every pointer addresses memory of its buffer's dtype and size that nobody else
    /// uses meanwhile (read-only where the body only reads it).
    unsafe fn run(&self, fr: &Frame) -> Result<()> {
        let ptrs = &fr.ptrs;
        for step in &self.steps {
            // SAFETY: as the caller promises (a GEMM's operands and result are buffers of
            // the schedule it was planned for).
            unsafe {
                match step {
                    Step::Kernel(code, elems) => run_rows(code, *elems, ptrs)?,
                    Step::Gemm(g) => g.run(ptrs[g.a.buffer], ptrs[g.b.buffer], ptrs[g.out], None),
                    Step::Extern(e, ty) => fr.run_extern(e, ty.as_ref())?,
                }
            }
        }
        Ok(())
    }
}

/// One step of a tight body.
enum Step {
    /// A compiled kernel over its elements.
    Kernel(Arc<CpuKernel>, usize),
    /// A direct GEMM into its result buffer.
    Gemm(DirectGemm),
    /// An eager library call on views of the buffers, its result copied into its buffer.
    Extern(ExternCall, Option<TensorType>),
}

/// The memory of one buffer of a body, owned by the loop.
struct Owned {
    storage: Arc<Storage>,
}

impl Owned {
    fn new(dtype: DType, len: usize) -> Result<Owned> {
        Ok(Owned {
            storage: Arc::new(Storage::for_overwrite(dtype, len)?),
        })
    }
    fn ptr(&self) -> *mut u8 {
        self.storage.data_addr() as *mut u8
    }
}

/// The buffers of one body during a loop.
struct Frame<'a> {
    body: &'a TightBody,
    f: &'a CompiledFn,
    ptrs: Vec<*mut u8>,
    /// The storage behind each pointer and the element it points at (kept alive; a
    /// library call views the buffers through them).
    owners: Vec<Option<(Arc<Storage>, usize)>>,
}

impl<'a> Frame<'a> {
    fn new(body: &'a TightBody, f: &'a CompiledFn) -> Result<Frame<'a>> {
        let s = &f.schedule;
        // temporaries live in `owners` even when no library call views them
        let keep = |st: Arc<Storage>| Some((st, 0));
        let mut fr = Frame {
            body,
            f,
            ptrs: vec![std::ptr::null_mut(); s.buffers.len()],
            owners: (0..s.buffers.len()).map(|_| None).collect(),
        };
        for (b, buf) in s.buffers.iter().enumerate() {
            match &buf.kind {
                BufferKind::Temp => {
                    let st = Owned::new(buf.dtype, buf.len())?.storage;
                    fr.set(b, &st, 0);
                    fr.owners[b] = keep(st);
                }
                BufferKind::Constant(_) => {
                    if let Some(c) = &f.constants[b] {
                        fr.set(b, c.storage_arc(), c.storage_offset());
                    }
                }
                BufferKind::Input(_) => {}
            }
        }
        Ok(fr)
    }

    /// Points buffer `b` at element `offset` of `st` (which the caller keeps alive).
    fn set(&mut self, b: BufferId, st: &Arc<Storage>, offset: usize) {
        self.ptrs[b] = (st.data_addr() as *mut u8).wrapping_add(offset * st.dtype().size());
        // only library calls read buffers as tensors: other bodies skip the count
        if self.body.views {
            self.owners[b] = Some((st.clone(), offset));
        }
    }

    /// Buffer `b` of `other` (the same memory) as buffer `into` of this frame.
    fn share(&mut self, into: BufferId, other: &Frame, b: BufferId) {
        self.ptrs[into] = other.ptrs[b];
        self.owners[into] = other.owners[b].clone();
    }

    /// The view `v` of its buffer, as a tensor.
    fn view(&self, v: &crate::kernel::View) -> Result<Tensor> {
        let Some((st, off)) = &self.owners[v.buffer] else {
            bail!(Value, "a loop body reads b{} before it is set", v.buffer);
        };
        Ok(Tensor::from_parts(
            st.clone(),
            Layout {
                shape: v.shape.clone(),
                strides: v.strides.clone(),
                offset: off + v.offset,
            },
        ))
    }

    /// Runs library call `e` on the eager kernels and copies its result into its buffer.
    fn run_extern(&self, e: &ExternCall, ty: Option<&TensorType>) -> Result<()> {
        let s = &self.f.schedule;
        let args = e
            .args
            .iter()
            .map(|v| self.view(v))
            .collect::<Result<Vec<_>>>()?;
        let r = crate::kernel::interp::run_extern(s, e, &args, ty)?;
        let whole = crate::kernel::View {
            buffer: e.out,
            shape: s.buffers[e.out].shape.clone(),
            strides: crate::ir::shape::contiguous_strides(&s.buffers[e.out].shape),
            offset: 0,
        };
        copy::copy_into(&self.view(&whole)?, &r);
        Ok(())
    }
}

/// Runs loop `c` on `args` with compiled `bodies` over raw buffers; `None` when a body does
/// not qualify (the caller then runs the general loop).
pub(super) fn run(
    c: &Control,
    args: &[Tensor],
    bodies: &[CompiledFn],
    plans: &[Option<TightBody>],
) -> Result<Option<Vec<Tensor>>> {
    let plan = |i: usize| plans.get(i).and_then(Option::as_ref);
    match c.kind {
        ControlKind::ForiLoop => {
            let Some(b) = plan(0) else { return Ok(None) };
            let (lo, hi) = (int(&args[0])?, int(&args[1])?);
            let counter = Owned::new(DType::I64, 1)?;
            let given = dense(&args[2..])?;
            let _read = access::lock(&given.iter().collect::<Vec<_>>(), &[]);
            let Some(mut lp) = Loop::new(b, &bodies[0], &given, 1, 0)? else {
                return Ok(None);
            };
            lp.body.set(b.inputs[0], &counter.storage, 0);
            for i in lo..hi {
                // SAFETY: the counter is the loop's own one-element i64 buffer.
                unsafe { (counter.ptr() as *mut i64).write(i) };
                lp.step()?;
            }
            Ok(Some(lp.finish()))
        }
        ControlKind::WhileLoop => {
            let (Some(cb), Some(b)) = (plan(0), plan(1)) else {
                return Ok(None);
            };
            let given = dense(args)?;
            let _read = access::lock(&given.iter().collect::<Vec<_>>(), &[]);
            let Some(mut lp) = Loop::new(b, &bodies[1], &given, 0, 0)? else {
                return Ok(None);
            };
            let mut cond = Frame::new(cb, &bodies[0])?;
            loop {
                for (k, &ib) in cb.inputs.iter().enumerate() {
                    cond.share(ib, &lp.body, lp.carries[k].0);
                }
                // SAFETY: the condition only reads the carries (the loop's own memory, or
                // the caller's, read-locked by the loop) and writes its own temporaries.
                unsafe { cond.body.run(&cond)? };
                // SAFETY: the condition's output is a one-element bool buffer it wrote.
                let go = unsafe { *cond.ptrs[cb.outputs[0]] } != 0;
                if !go {
                    break;
                }
                lp.step()?;
            }
            Ok(Some(lp.finish()))
        }
        ControlKind::Scan { carries, reverse } => {
            let Some(b) = plan(0) else { return Ok(None) };
            let xs = dense(&args[carries..])?;
            let len = xs[0].shape()[0];
            let given = dense(&args[..carries])?;
            let mut reads: Vec<&Tensor> = xs.iter().collect();
            reads.extend(&given);
            let _read = access::lock(&reads, &[]);
            let Some(mut lp) = Loop::new(b, &bodies[0], &given, 0, xs.len())? else {
                return Ok(None);
            };
            let s = &bodies[0].schedule;
            let ys_bufs: Vec<BufferId> = b.outputs[carries..].to_vec();
            let ys: Vec<Tensor> = ys_bufs
                .iter()
                .map(|&yb| {
                    let buf = &s.buffers[yb];
                    let mut shape = vec![len];
                    shape.extend(&buf.shape);
                    Tensor::alloc_for_overwrite(buf.dtype, &shape)
                })
                .collect::<Result<_>>()?;
            for step in 0..len {
                let t = if reverse { len - 1 - step } else { step };
                for (j, x) in xs.iter().enumerate() {
                    let slice = x.numel() / len.max(1);
                    let ib = b.inputs[carries + j];
                    // the slice in place: the body only reads it
                    lp.body
                        .set(ib, x.storage_arc(), x.storage_offset() + t * slice);
                }
                lp.step_with(|ptrs| {
                    for (y, &yb) in ys.iter().zip(&ys_bufs) {
                        let bytes = s.buffers[yb].bytes();
                        // SAFETY: `y` is this loop's new tensor (no one else holds it yet);
                        // slice t of it and the body's output buffer hold `bytes` bytes each.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                ptrs[yb],
                                (super::elem0(y)).add(t * bytes),
                                bytes,
                            )
                        };
                    }
                })?;
            }
            let mut res = lp.finish();
            res.extend(ys);
            Ok(Some(res))
        }
        ControlKind::Cond => Ok(None),
    }
}

/// A loop over one body: carries in double buffers (the current value in one, the next
/// written into the other), the other inputs read where they are.
struct Loop<'a> {
    body: Frame<'a>,
    /// Per carry: its input buffer, its output buffer, and the two memories it alternates
    /// between (`None` for a carry passed through: it stays where it is).
    carries: Vec<(BufferId, BufferId, Option<[Owned; 2]>)>,
    /// The caller's carries (read-locked by the caller while the loop runs), contiguous.
    given: &'a [Tensor],
    /// Which of the two memories holds the current value.
    flip: usize,
}

impl<'a> Loop<'a> {
    /// `lead` body inputs come before the carries (fori_loop's counter); `extra` after them
    /// (scan's slices).
    fn new(
        body: &'a TightBody,
        f: &'a CompiledFn,
        given: &'a [Tensor],
        lead: usize,
        extra: usize,
    ) -> Result<Option<Loop<'a>>> {
        let s = &f.schedule;
        if body.inputs.len() != lead + given.len() + extra || body.outputs.len() < given.len() {
            bail!(Value, "a loop body's signature does not match its carries");
        }
        let mut frame = Frame::new(body, f)?;
        let mut carries = Vec::with_capacity(given.len());
        for (k, t) in given.iter().enumerate() {
            let (ib, ob) = (body.inputs[lead + k], body.outputs[k]);
            if ib != ob && body.inputs.contains(&ob) {
                // another input returned as this carry (carries that swap): the general loop
                return Ok(None);
            }
            if ib == ob {
                // passed through: read in place
                frame.set(ib, t.storage_arc(), t.storage_offset());
                carries.push((ib, ob, None));
                continue;
            }
            let buf = &s.buffers[ib];
            let mem = [
                Owned::new(buf.dtype, buf.len())?,
                Owned::new(buf.dtype, buf.len())?,
            ];
            copy::copy_into(
                &Tensor::from_parts(mem[0].storage.clone(), Layout::contiguous(&buf.shape)),
                t,
            );
            frame.set(ib, &mem[0].storage, 0);
            frame.set(ob, &mem[1].storage, 0);
            carries.push((ib, ob, Some(mem)));
        }
        Ok(Some(Loop {
            body: frame,
            carries,
            given,
            flip: 0,
        }))
    }

    fn step(&mut self) -> Result<()> {
        self.step_with(|_| {})
    }

    /// One iteration; `after` sees the buffers before the carries swap (a scan's ys).
    fn step_with(&mut self, after: impl FnOnce(&[*mut u8])) -> Result<()> {
        // SAFETY: every carry buffer is the loop's own memory (or, passed through, the
        // caller's, read-locked by the caller and only read); temporaries are the loop's own; the
        // next values go into the other half of each double buffer, so no kernel reads
        // memory it writes.
        unsafe { self.body.body.run(&self.body)? };
        after(&self.body.ptrs);
        self.flip ^= 1;
        for (ib, ob, mem) in &self.carries {
            if let Some(mem) = mem {
                self.body.set(*ib, &mem[self.flip].storage, 0);
                self.body.set(*ob, &mem[self.flip ^ 1].storage, 0);
            }
        }
        Ok(())
    }

    /// The final carries as tensors (the loop's memory handed over, no copy).
    fn finish(self) -> Vec<Tensor> {
        let s = &self.body.f.schedule;
        self.carries
            .into_iter()
            .zip(self.given)
            .map(|((ib, _, mem), given)| match mem {
                Some(mem) => {
                    let [a, b] = mem;
                    let cur = if self.flip == 0 { a } else { b };
                    Tensor::from_parts(cur.storage, Layout::contiguous(&s.buffers[ib].shape))
                }
                None => given.clone(),
            })
            .collect()
    }
}

fn dense(ts: &[Tensor]) -> Result<Vec<Tensor>> {
    ts.iter().map(copy::contiguous).collect()
}

fn int(t: &Tensor) -> Result<i64> {
    match t.to_i64_vec().as_slice() {
        [i] => Ok(*i),
        _ => bail!(Value, "fori_loop: a bound has {} elements", t.numel()),
    }
}
