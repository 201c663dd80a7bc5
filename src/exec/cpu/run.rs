//! A call of a compiled function: its frame chosen, its inputs checked and bound, the steps
//! run in order (kernels in chunks of rows across the pool, direct GEMMs, library calls on
//! the eager kernels, control steps on their compiled bodies), its outputs taken out.

use super::*;

impl CompiledFn {
    pub(super) fn run(
        &self,
        inputs: &[Tensor],
        times: Option<&mut StepTimes>,
        into: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        self.check_inputs(inputs)?;
        let run = || {
            let _call = crate::profiler::span(crate::profiler::EventKind::Call, || {
                self.schedule.name.clone()
            });
            self.run_steps(inputs, times, into)
        };
        match &self.pool {
            None if self.opts.cpu.threads == Some(1) => crate::runtime::threads::serial(run),
            None if !self.threaded => run(),
            pool => crate::runtime::threads::hot(pool.as_ref(), run),
        }
    }

    /// The profiler's event for step `i` (when a session records).
    fn step_span(&self, i: usize) -> Option<crate::profiler::Span> {
        let info = &self.info[i];
        let kind = if info.is_extern {
            crate::profiler::EventKind::Extern
        } else {
            crate::profiler::EventKind::Kernel
        };
        let mut span = crate::profiler::span(kind, || info.name.clone())?;
        let (_, writes) = plan::step_buffers(&self.schedule.steps[i]);
        span.values(
            writes
                .iter()
                .map(|&b| format!("%{}", self.schedule.buffers[b].name))
                .collect(),
        );
        span.work(info.bytes as u64, info.flops);
        Some(span)
    }

    fn run_steps(
        &self,
        inputs: &[Tensor],
        times: Option<&mut StepTimes>,
        into: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        let mut frame = self.frames.take();
        let out = self.run_frame(&mut frame, inputs, times, into);
        self.frames.give(frame);
        out
    }

    /// Chooses which outputs go into the caller's tensors `into` (the inputs are already
    /// in `f.bufs`).
    fn choose_into(&self, f: &mut Frame, into: &[Option<&Tensor>]) {
        let s = &self.schedule;
        for (i, dest) in into.iter().enumerate() {
            let (Some(dest), Some(Some(ip))) = (dest, self.in_place.get(i)) else {
                continue;
            };
            let buf = &s.buffers[ip.buffer];
            if !matches!(self.execs[ip.step], Exec::Native { .. })
                || dest.device() != Device::Cpu
                || dest.dtype() != buf.dtype
                || dest.shape() != buf.shape.as_slice()
                || dest.strides() != buf.strides().as_slice()
                || f.into[ip.buffer].is_some()
            {
                continue;
            }
            let other_dest = into
                .iter()
                .enumerate()
                .any(|(j, d)| j != i && d.is_some_and(|d| d.shares_storage(dest)));
            let input_ok = s
                .inputs
                .iter()
                .enumerate()
                .all(|(j, &ib)| match f.bufs[ib].as_ref() {
                    Some(t) if t.shares_storage(dest) => {
                        ip.inputs.contains(&j) && t.storage_offset() == dest.storage_offset()
                    }
                    _ => true,
                });
            let constant = self
                .constants
                .iter()
                .flatten()
                .any(|c| c.shares_storage(dest));
            if !other_dest && input_ok && !constant {
                f.into[ip.buffer] = Some((*dest).clone());
                f.any_into = true;
            }
        }
    }

    fn run_frame(
        &self,
        f: &mut Frame,
        inputs: &[Tensor],
        mut times: Option<&mut StepTimes>,
        into: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        let s = &self.schedule;
        let call = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (b, c) in f.bufs.iter_mut().zip(&self.constants) {
            b.clone_from(c);
        }
        for (&b, t) in s.inputs.iter().zip(inputs.iter().chain(&self.bound)) {
            f.bufs[b] = Some(s.buffers[b].conform(t)?);
        }
        if into.iter().any(Option::is_some) {
            self.choose_into(f, into);
        }
        // a kernel step an earlier step has already done: a GEMM's in-place update
        // (`gemm::Update`), a convolution's epilogue run on its tiles (`epilogue`)
        let mut done_early = None;
        for (i, (step, exec)) in s.steps.iter().zip(&self.execs).enumerate() {
            for &b in &self.plan.alloc_before[i] {
                let buf = &s.buffers[b];
                if let Some(dest) = f.into[b].clone() {
                    f.bufs[b] = Some(dest);
                    continue;
                }
                // a result written over its dying operand takes the operand's storage
                let over = self.plan.written_over[b]
                    .zip(self.plan.slot_of[b])
                    .and_then(|(a, slot)| f.handover(slot, f.bufs[a].as_ref()?, &self.layouts[b]));
                let t = match (over, self.plan.slot_of[b]) {
                    (Some(t), _) => t,
                    (None, Some(slot)) => f.storage_tensor(
                        slot,
                        buf.dtype,
                        buf.len(),
                        self.plan.slots[slot].1,
                        &self.layouts[b],
                        self.returned[b],
                    )?,
                    (None, None) => Tensor::alloc_for_overwrite(buf.dtype, &buf.shape)?,
                };
                f.bufs[b] = Some(t);
            }
            // the clock is read only when timing: an untimed small call is a few µs
            let t0 = times.is_some().then(Instant::now);
            let _span = self.step_span(i);
            match (exec, step) {
                _ if done_early == Some(i) => {}
                (Exec::Extern { ty }, Step::Extern(e))
                    if self.in_conv.get(i + 1).copied().unwrap_or(false) =>
                {
                    match &self.execs[i + 1] {
                        Exec::Native {
                            code,
                            reads,
                            writes,
                            ..
                        } => {
                            let rw = (reads.as_slice(), writes.as_slice());
                            if epilogue::run(s, e, ty.as_ref(), code, rw, &mut f.bufs)? {
                                done_early = Some(i + 1);
                            }
                        }
                        _ => run_extern(s, e, ty.as_ref(), &mut f.bufs)?,
                    }
                }
                (
                    Exec::Native {
                        code,
                        reads,
                        writes,
                        elems,
                        owns_writes,
                    },
                    _,
                ) => {
                    if *owns_writes {
                        self.run_native_owned(code, reads, writes, *elems, f)?
                    } else {
                        self.run_native(code, reads, writes, *elems, &f.bufs)?
                    }
                }
                (Exec::Interp, _) => kernel::interp::run_step(s, step, &mut f.bufs)?,
                (Exec::Extern { ty }, Step::Extern(e)) => match &e.op {
                    Op::Dropout { p, training, seed } if call > 0 => {
                        let op = Op::Dropout {
                            p: *p,
                            training: *training,
                            seed: crate::ir::conv::dropout_seed(*seed, call),
                        };
                        let e = ExternCall { op, ..e.clone() };
                        run_extern(s, &e, ty.as_ref(), &mut f.bufs)?
                    }
                    _ => run_extern(s, e, ty.as_ref(), &mut f.bufs)?,
                },
                (
                    Exec::Gemm {
                        gemm,
                        place,
                        update,
                    },
                    _,
                ) => {
                    if let Some(u) = update.as_ref().filter(|u| self.updates_in_place(u, f)) {
                        self.run_gemm_update(gemm, u, f)?;
                        done_early = Some(u.step);
                    } else {
                        self.run_gemm(gemm, *place, f)?
                    }
                }
                (Exec::Control { bodies, tight }, Step::Control(c)) => {
                    let args: Vec<Tensor> = c
                        .args
                        .iter()
                        .map(|v| view_of(&f.bufs, v))
                        .collect::<Result<_>>()?;
                    let results = match tight::run(&c.control, &args, bodies, tight)? {
                        Some(r) => r,
                        None => control::run(&c.control, &args, &Compiled(bodies))?,
                    };
                    for (r, out) in results.into_iter().zip(&c.outs) {
                        if let Some(b) = out {
                            // a body may return a view: buffers hold their own layout
                            f.bufs[*b] = Some(s.buffers[*b].conform(&r)?);
                        }
                    }
                }
                (Exec::Extern { .. } | Exec::Control { .. }, _) => {
                    bail!(Value, "step {i} of {} has no code of its kind", s.name)
                }
            }
            if let (Some(t), Some(t0)) = (times.as_deref_mut(), t0) {
                t.0.push(t0.elapsed());
            }
            for &b in &self.plan.free_after[i] {
                f.bufs[b] = None;
            }
            for &slot in &self.plan.release_after[i] {
                f.cache[slot] = None;
            }
        }
        s.outputs
            .iter()
            .zip(&self.fresh)
            .map(|(v, &fresh)| {
                let t = output_of(&f.bufs, v)?;
                if fresh {
                    copy::cast_new(&t, t.dtype())
                } else {
                    Ok(t)
                }
            })
            .collect()
    }

    /// Whether this call writes update `u`'s result into the storage of its `w` (at the same
    /// offset and layout), so that the GEMM can accumulate into it.
    fn updates_in_place(&self, u: &gemm::Update, f: &Frame) -> bool {
        match (&f.into[u.out], &f.bufs[u.w]) {
            (Some(dest), Some(w)) => {
                dest.shares_storage(w)
                    && dest.storage_offset() == w.storage_offset()
                    && dest.is_contiguous()
                    && w.is_contiguous()
            }
            _ => false,
        }
    }

    /// Runs a direct GEMM that accumulates into the caller's tensor of `u.out`, which holds
    /// `u.w`: `w += beta·(a·b)`.
    fn run_gemm_update(&self, g: &DirectGemm, u: &gemm::Update, f: &mut Frame) -> Result<()> {
        let dest = f.into[u.out]
            .clone()
            .ok_or_else(|| crate::Error::Value("an in-place update without its tensor".into()))?;
        let a = buffer(&f.bufs, g.a.buffer)?;
        let b = buffer(&f.bufs, g.b.buffer)?;
        let locks = Locks::lock([(a, false), (b, false), (&dest, true)]);
        // SAFETY: the operands are locked for reading and the destination for writing (three
        // storages never exceed the lock capacity); the destination holds `w`'s values in
        // the result's dtype, shape and contiguous layout, and is not an operand (`Update::of`
        // refuses w as an operand; `choose_into` refuses a destination sharing an operand's
        // storage).
        unsafe { g.run(elem0(a), elem0(b), elem0(&dest), Some(u.beta)) };
        drop(locks);
        Ok(())
    }

    /// Runs a direct GEMM into its cached result buffer.
    fn run_gemm(&self, g: &DirectGemm, place: usize, f: &mut Frame) -> Result<()> {
        let out = f.storage_tensor(
            place,
            g.dtype,
            g.m * g.n,
            self.plan.slots[place].1,
            &self.layouts[g.out],
            self.returned[g.out],
        )?;
        let a = buffer(&f.bufs, g.a.buffer)?;
        let b = buffer(&f.bufs, g.b.buffer)?;
        let locks = Locks::lock([(a, false), (b, false)]);
        // SAFETY: the operands are locked for reading (two storages never exceed the lock
        // capacity) and hold their buffers' dtype and size; `out` is a storage of this call
        // alone, of the result's dtype and size.
        unsafe { g.run(elem0(a), elem0(b), elem0(&out), None) };
        drop(locks);
        f.bufs[g.out] = Some(out);
        Ok(())
    }

    /// Runs a compiled kernel whose written buffers belong to this call alone (or are
    /// caller tensors given to `call_into`): only the buffers others may share are locked,
    /// with no allocation.
    fn run_native_owned(
        &self,
        code: &CpuKernel,
        reads: &[BufferId],
        writes: &[BufferId],
        elems: usize,
        f: &mut Frame,
    ) -> Result<()> {
        let mut shared: [Option<(&Tensor, bool)>; frame::MAX_LOCKS] = [None; frame::MAX_LOCKS];
        let mut n = 0;
        for (j, &b) in reads.iter().chain(writes).enumerate() {
            let t = buffer(&f.bufs, b)?;
            f.ptrs[b] = elem0(t);
            let into = f.any_into && f.into[b].is_some();
            if !self.owned[b] || into {
                if n == shared.len() {
                    return self.run_native(code, reads, writes, elems, &f.bufs);
                }
                let write = j >= reads.len();
                if write {
                    t.storage().bump_version();
                }
                shared[n] = Some((t, write));
                n += 1;
            }
        }
        let Some(locks) = Locks::lock(shared[..n].iter().flatten().copied()) else {
            return self.run_native(code, reads, writes, elems, &f.bufs);
        };
        // SAFETY: the pointers address the buffers of this call: the shared ones locked above
        // (for writing where written), the others used by nobody else.
        let out = unsafe { run_rows(code, elems, &f.ptrs) };
        drop(locks);
        out
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
        let rt: Vec<&Tensor> = reads
            .iter()
            .map(|&b| buffer(bufs, b))
            .collect::<Result<_>>()?;
        let wt: Vec<&Tensor> = writes
            .iter()
            .map(|&b| buffer(bufs, b))
            .collect::<Result<_>>()?;
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
        // SAFETY: every buffer the kernel touches is allocated with its schedule dtype and
        // size and locked above (reads shared, writes exclusive).
        unsafe { run_rows(code, elems, &ptrs) }
    }
}

/// Raw buffer pointers handed to the chunks of one kernel call.
pub(super) struct Ptrs<'a>(pub(super) &'a [*mut u8]);
// SAFETY: the pointers are only dereferenced by generated code while the storages are
// locked by the calling thread, and each chunk writes disjoint rows.
unsafe impl Send for Ptrs<'_> {}
// SAFETY: as for `Send`: a shared `Ptrs` only hands out the pointer slice (`all`), which is
// never written; the chunks write disjoint rows of the memory behind it.
unsafe impl Sync for Ptrs<'_> {}

impl Ptrs<'_> {
    pub(super) fn all(&self) -> &[*mut u8] {
        self.0
    }
}

/// The compiled bodies of a control step; a loop's spare carries are written in place
/// where `call_into` finds it safe.
struct Compiled<'a>(&'a [CompiledFn]);

impl control::Bodies for Compiled<'_> {
    fn call(&self, i: usize, inputs: &[Tensor], into: &[Option<&Tensor>]) -> Result<Vec<Tensor>> {
        let Some(body) = self.0.get(i) else {
            bail!(Value, "a control step has no body {i}");
        };
        body.call_into(inputs, into)
    }
}

/// The tensor of buffer `b`, or an error when the schedule reads it before writing it.
pub(super) fn buffer(bufs: &[Option<Tensor>], b: BufferId) -> Result<&Tensor> {
    match bufs.get(b).and_then(Option::as_ref) {
        Some(t) => Ok(t),
        None => bail!(Value, "schedule: b{b} is used before it is written"),
    }
}

/// Pointer to element 0 of `t` (its offset applied). The address is only formed here;
/// whoever dereferences it holds the storage's lock or owns the storage.
pub(super) fn elem0(t: &Tensor) -> *mut u8 {
    // wrapping_add: an empty tensor's offset may point one past its (empty) buffer
    (t.storage().data_addr() as *mut u8).wrapping_add(t.storage_offset() * t.dtype().size())
}

/// Runs a library call on the eager kernels ([`kernel::interp::run_extern`]).
pub(super) fn run_extern(
    s: &Schedule,
    e: &ExternCall,
    ty: Option<&TensorType>,
    bufs: &mut [Option<Tensor>],
) -> Result<()> {
    let args: Vec<Tensor> = e
        .args
        .iter()
        .map(|v| view_of(bufs, v))
        .collect::<Result<_>>()?;
    bufs[e.out] = Some(kernel::interp::run_extern(s, e, &args, ty)?);
    Ok(())
}

/// Output view `v`: the buffer's tensor itself when the view is the whole buffer as it is
/// laid out.
pub(super) fn output_of(bufs: &[Option<Tensor>], v: &View) -> Result<Tensor> {
    let t = buffer(bufs, v.buffer)?;
    if v.offset == 0 && t.shape() == v.shape.as_slice() && t.strides() == v.strides.as_slice() {
        return Ok(t.clone());
    }
    view_of(bufs, v)
}

/// The strided view `v` of its buffer.
pub(super) fn view_of(bufs: &[Option<Tensor>], v: &View) -> Result<Tensor> {
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
