//! The plan of an ahead-of-time compiled model: where every buffer lives (the caller's
//! inputs, the scratch buffer, the constants) and the steps in order, as the words
//! `smelt_rt::model` reads (its module docs give the layout).
//!
//! The scratch holds, in order: one slot table per kernel step, then the temporaries,
//! placed by liveness (two temporaries share bytes only when no step from the first's
//! definition to its last use overlaps the other's), then, per body of a control op, its
//! inputs and the same again (`control`), and last the buffer-pointer table.

mod control;

use super::library;
use crate::exec::cpu::step_buffers;
use crate::ir::dtype::DType;
use crate::ir::op::Op;
use crate::ir::shape::numel;
use crate::kernel::{Buffer, BufferKind, ExternCall, Kernel, Schedule, Step, View};
use crate::{Result, bail};
use smelt_rt::gemm as rt_gemm;
use smelt_rt::model as rt;

/// Alignment of every temporary and constant.
const ALIGN: usize = 64;

/// The plan and what the object needs besides it.
pub(super) struct Built {
    /// The plan's words.
    pub words: Vec<u64>,
    /// Bytes of scratch a call needs.
    pub scratch_bytes: usize,
    /// The constants' bytes.
    pub consts: Vec<u8>,
    /// Per buffer: where it lives, for the manifest.
    pub places: Vec<Place>,
    /// Per step: its kernel index, "gemm", the op of a convolution or the copies of a library
    /// op, for the manifest.
    pub steps: Vec<String>,
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Input `i`.
    Input(usize),
    /// At this byte offset of the scratch.
    Scratch(usize),
    /// At this byte offset of the constants.
    Const(usize),
    /// Nothing reads or writes it.
    Unused,
}

fn align(x: usize, a: usize) -> usize {
    x.next_multiple_of(a)
}

/// A region of scratch alive from step `from` to step `to`, both included.
struct Life {
    from: usize,
    to: usize,
    bytes: usize,
}

/// Places regions with overlapping lives at disjoint offsets (first fit, largest first
/// among those born at the same step), starting at `base`; returns the offsets and the end.
fn place(lives: &[Life], base: usize) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..lives.len()).collect();
    order.sort_by_key(|&i| (lives[i].from, std::cmp::Reverse(lives[i].bytes)));
    let mut at = vec![0; lives.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut end = base;
    for i in order {
        let l = &lives[i];
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| lives[j].from <= l.to && l.from <= lives[j].to)
            .map(|&j| (at[j], at[j] + lives[j].bytes))
            .collect();
        busy.sort_unstable();
        let mut off = base;
        for (lo, hi) in busy {
            if off + l.bytes <= lo {
                break;
            }
            off = off.max(align(hi, ALIGN));
        }
        at[i] = off;
        end = end.max(off + l.bytes);
        placed.push(i);
    }
    (at, align(end, ALIGN))
}

/// A kernel step's code.
#[derive(Clone, Default)]
pub(super) struct KernelCode {
    /// Its index in the kernel table.
    pub index: usize,
    /// Whether it streams its stores.
    pub streams: bool,
    /// The rows it runs side by side as lanes (1 when none): chunks split on its multiples.
    pub block: usize,
    /// The schedule buffer of each slot of its table.
    pub slots: Vec<usize>,
}

/// Defines (or finds) the code of a kernel step, given the buffers of its schedule.
pub(super) type KernelOf<'a> = dyn FnMut(&Kernel, &[Buffer]) -> Result<KernelCode> + 'a;

/// A schedule to compile and the window steps found in it.
pub(super) type Prepared = (Schedule, Vec<Option<super::windows::WindowStep>>);

/// Builds the plan of `s`; `kernel` defines (or finds) the code of a kernel step, `body`
/// prepares the schedule of a control op's body.
pub(super) fn build(
    s: &Schedule,
    windows: &[Option<super::windows::WindowStep>],
    features: u64,
    kernel: &mut KernelOf,
    body: &dyn Fn(&crate::ir::graph::Graph) -> Result<Prepared>,
) -> Result<Built> {
    let mut e = Emitter {
        table: Vec::new(),
        consts: Vec::new(),
        end: 0,
        kernel,
        body,
    };
    let top = e.block(s, windows, None)?;
    // the buffer table after everything else in the scratch
    let table_at = align(e.end, ALIGN);
    let scratch_bytes = align(table_at + e.table.len() * 8, ALIGN);
    let mut w = vec![
        rt::MAGIC,
        rt::FORMAT,
        features,
        scratch_bytes as u64,
        table_at as u64,
        e.table.len() as u64,
        s.inputs.len() as u64,
        s.outputs.len() as u64,
        top.nsteps as u64,
    ];
    w.extend(e.table.iter().flatten());
    for v in &s.outputs {
        w.extend([
            v.buffer as u64,
            s.buffers[v.buffer].dtype.size() as u64,
            v.offset as u64,
            v.shape.len() as u64,
        ]);
        w.extend(v.shape.iter().map(|&d| d as u64));
        w.extend(v.strides.iter().map(|&st| st as u64));
    }
    w.extend(top.words);
    Ok(Built {
        words: w,
        scratch_bytes,
        consts: e.consts,
        places: top.places,
        steps: top.steps,
    })
}

/// The steps of one schedule, as a block of the plan.
struct Block {
    /// The table entry its buffer numbers start at.
    base: usize,
    /// Its records (a library op may take several copies).
    nsteps: usize,
    /// Their words.
    words: Vec<u64>,
    /// Per buffer of its schedule: where it lives.
    places: Vec<Place>,
    /// Per step: what it is, for the manifest.
    steps: Vec<String>,
}

impl Block {
    /// The block's words as a control step holds it: base, records, length, steps.
    fn push(&self, w: &mut Vec<u64>) {
        w.extend([self.base, self.nsteps, self.words.len()].map(|x| x as u64));
        w.extend(&self.words);
    }
}

/// Lays out the buffers of a model and of its bodies, and writes their steps.
struct Emitter<'a, 'k> {
    /// The buffer table: kind, place and bytes of every buffer, the bodies' after the model's.
    table: Vec<[u64; 3]>,
    /// The constants' bytes.
    consts: Vec<u8>,
    /// The end of the scratch laid out so far.
    end: usize,
    kernel: &'a mut KernelOf<'k>,
    body: &'a dyn Fn(&crate::ir::graph::Graph) -> Result<Prepared>,
}

impl Emitter<'_, '_> {
    /// `bytes` of scratch of their own (a body's inputs, a loop's staging).
    fn alloc(&mut self, bytes: usize) -> usize {
        let at = align(self.end, ALIGN);
        self.end = at + bytes;
        at
    }

    /// The block of schedule `s`: its temporaries in scratch after what is laid out so far,
    /// its inputs the caller's (`inputs` None) or at the given scratch offsets (a body's).
    fn block(
        &mut self,
        s: &Schedule,
        windows: &[Option<super::windows::WindowStep>],
        inputs: Option<&[usize]>,
    ) -> Result<Block> {
        let nbuf = s.buffers.len();
        let nsteps = s.steps.len();
        // lives of the temporaries, and of each bf16 GEMM's f32 copies
        let mut first: Vec<Option<usize>> = vec![None; nbuf];
        let mut last: Vec<usize> = vec![0; nbuf];
        for (i, step) in s.steps.iter().enumerate() {
            let (reads, writes) = step_buffers(step);
            for &b in &writes {
                if matches!(
                    s.buffers[b].kind,
                    BufferKind::Input(_) | BufferKind::Constant(_)
                ) {
                    bail!(
                        Unsupported,
                        "aot: step {i} writes into {} ({}), which a compiled model only reads",
                        s.buffers[b].name,
                        if matches!(s.buffers[b].kind, BufferKind::Input(_)) {
                            "an input"
                        } else {
                            "a constant"
                        }
                    );
                }
                first[b].get_or_insert(i);
            }
            for b in reads.into_iter().chain(writes) {
                last[b] = last[b].max(i);
            }
        }
        for v in &s.outputs {
            last[v.buffer] = nsteps;
        }
        let mut lives = Vec::new();
        let mut life_of: Vec<Option<usize>> = vec![None; nbuf];
        for b in 0..nbuf {
            if let (BufferKind::Temp, Some(from)) = (&s.buffers[b].kind, first[b]) {
                life_of[b] = Some(lives.len());
                lives.push(Life {
                    from,
                    to: last[b],
                    bytes: s.buffers[b].len() * s.buffers[b].dtype.size(),
                });
            }
        }
        // per f16 or bf16 GEMM step: the lives of its f32 copies of a, b and out
        let mut copies: Vec<Option<[usize; 3]>> = vec![None; nsteps];
        for (i, step) in s.steps.iter().enumerate() {
            if let Step::Extern(e) = step
                && e.op == Op::Matmul
                && matches!(s.buffers[e.out].dtype, DType::F16 | DType::BF16)
            {
                let lens = [
                    s.buffers[e.args[0].buffer].len(),
                    s.buffers[e.args[1].buffer].len(),
                    s.buffers[e.out].len(),
                ];
                copies[i] = Some(lens.map(|n| {
                    lives.push(Life {
                        from: i,
                        to: i,
                        bytes: n * 4,
                    });
                    lives.len() - 1
                }));
            }
        }
        // the fixed part: one slot table per kernel step
        let mut fixed = align(self.end, 8);
        let mut tables = vec![0; nsteps];
        let mut kernels = vec![KernelCode::default(); nsteps];
        for (i, step) in s.steps.iter().enumerate() {
            if let Step::Kernel(k) = step {
                kernels[i] = (self.kernel)(k, &s.buffers)?;
                tables[i] = fixed;
                fixed += kernels[i].slots.len() * 8;
            }
        }
        let (offsets, end) = place(&lives, align(fixed, ALIGN));
        self.end = end;

        // buffers
        let base = self.table.len();
        let mut places = vec![Place::Unused; nbuf];
        for (b, buf) in s.buffers.iter().enumerate() {
            let bytes = buf.len() * buf.dtype.size();
            places[b] = match &buf.kind {
                BufferKind::Input(_) => match s.inputs.iter().position(|&x| x == b) {
                    Some(i) => match inputs {
                        None => Place::Input(i),
                        Some(at) => Place::Scratch(at[i]),
                    },
                    None => bail!(
                        Value,
                        "aot: buffer b{b} is an input the schedule does not list"
                    ),
                },
                BufferKind::Constant(lit) => {
                    // a literal holds its elements as the buffer does: row-major, little-endian
                    let data = lit.bytes.as_slice();
                    if data.len() != bytes {
                        bail!(
                            Value,
                            "aot: constant b{b} has {} bytes, its buffer {bytes}",
                            data.len()
                        );
                    }
                    self.consts.resize(align(self.consts.len(), ALIGN), 0);
                    let at = self.consts.len();
                    self.consts.extend_from_slice(data);
                    Place::Const(at)
                }
                BufferKind::Temp => match life_of[b] {
                    Some(l) => Place::Scratch(offsets[l]),
                    None => Place::Unused,
                },
            };
            let (kind, at) = match places[b] {
                Place::Input(i) => (rt::BUF_INPUT, i),
                Place::Scratch(o) => (rt::BUF_SCRATCH, o),
                Place::Const(o) => (rt::BUF_CONST, o),
                Place::Unused => (rt::BUF_SCRATCH, 0),
            };
            let bytes = if places[b] == Place::Unused { 0 } else { bytes };
            self.table.push([kind, at as u64, bytes as u64]);
        }

        // steps (a library op takes a copy step per operand, or none)
        let mut records = 0;
        let mut w = Vec::new();
        let mut steps = Vec::with_capacity(nsteps);
        for (i, step) in s.steps.iter().enumerate() {
            records += 1;
            match step {
                Step::Kernel(k) => {
                    let KernelCode {
                        index,
                        streams,
                        block,
                        slots,
                    } = &kernels[i];
                    w.extend([
                        rt::STEP_KERNEL,
                        *index as u64,
                        numel(&k.outer) as u64,
                        numel(&k.space()) as u64,
                        u64::from(*streams),
                        *block as u64,
                        tables[i] as u64,
                        slots.len() as u64,
                    ]);
                    w.extend(slots.iter().map(|&b| b as u64));
                    steps.push(format!("kernel {index}"));
                }
                Step::Extern(e) if windows.get(i).is_some_and(Option::is_some) => {
                    if let Some(Some(c)) = windows.get(i) {
                        super::windows::window_words(s, e, c, &mut w);
                    }
                    steps.push(e.op.name().to_string());
                }
                Step::Extern(e) if matches!(e.op, Op::Cumsum { .. }) => {
                    library::scan_words(s, e, &mut w)?;
                    steps.push("cumsum".into());
                }
                Step::Extern(e) if matches!(e.op, Op::Dropout { .. }) => {
                    library::dropout_words(s, e, &mut w)?;
                    steps.push("dropout".into());
                }
                Step::Extern(e) if library::lowers(&e.op) => {
                    let n = library::copy_words(s, e, &mut w)?;
                    records = records - 1 + n;
                    steps.push(format!("{} ({n} copies)", e.op.name()));
                }
                Step::Extern(e) => {
                    let c = copies[i].map(|c| c.map(|l| offsets[l]));
                    gemm_words(s, e, c, &mut w)?;
                    steps.push("gemm".into());
                }
                Step::Control(c) => {
                    self.control(s, base, c, &mut w)?;
                    steps.push(format!(
                        "{} ({} bodies)",
                        c.control.name(),
                        c.control.bodies.len()
                    ));
                }
            }
        }
        Ok(Block {
            base,
            nsteps: records,
            words: w,
            places,
            steps,
        })
    }
}

/// The words of a GEMM step (`copies`: the scratch offsets of a half product's f32 copies).
fn gemm_words(
    s: &Schedule,
    e: &ExternCall,
    copies: Option<[usize; 3]>,
    w: &mut Vec<u64>,
) -> Result<()> {
    if e.op.communicates() {
        bail!(
            Unsupported,
            "aot: {} talks to the other processes of a distributed run, and an ahead-of-time model has no process group",
            e.op.name()
        );
    }
    if e.op != Op::Matmul || e.args.len() != 2 {
        bail!(
            Unsupported,
            "aot: the library op {} is not supported in compiled models yet (matmul, conv1d, conv2d, the poolings, cumsum, the scatters and the copies cat, stack, repeat, flip, embedding, index_select and gather are)",
            e.op.name()
        );
    }
    let out = &s.buffers[e.out];
    let dtype = out.dtype;
    let code = match dtype {
        DType::F16 => rt::GEMM_F16,
        DType::F32 => rt::GEMM_F32,
        DType::F64 => rt::GEMM_F64,
        DType::BF16 => rt::GEMM_BF16,
        DType::U8 => rt::GEMM_U8,
        DType::I8 => rt::GEMM_I8,
        DType::I16 => rt::GEMM_I16,
        DType::I32 => rt::GEMM_I32,
        DType::I64 => rt::GEMM_I64,
        d => bail!(Unsupported, "aot: matmul of {d} is not supported"),
    };
    for a in &e.args {
        if s.buffers[a.buffer].dtype != dtype {
            bail!(DType, "aot: matmul operands of different dtypes");
        }
    }
    let strides = |v: &View| -> Vec<isize> { v.strides.iter().map(|&x| x as isize).collect() };
    let (sa, sb) = (strides(&e.args[0]), strides(&e.args[1]));
    let planned = rt_gemm::plan(
        rt_gemm::Operand {
            shape: &e.args[0].shape,
            strides: &sa,
            offset: e.args[0].offset,
        },
        rt_gemm::Operand {
            shape: &e.args[1].shape,
            strides: &sb,
            offset: e.args[1].offset,
        },
    );
    let Ok(rt_gemm::Batched { product: p, offs }) = planned else {
        bail!(
            Shape,
            "aot: matmul of {:?} and {:?}",
            e.args[0].shape,
            e.args[1].shape
        );
    };
    if offs.len() * p.m * p.n != out.len() {
        bail!(Shape, "aot: matmul result does not fill its buffer");
    }
    w.extend([rt::STEP_GEMM, code, p.m as u64, p.n as u64, p.k as u64]);
    w.extend([p.a.0, p.a.1, p.b.0, p.b.1].map(|x| x as u64));
    w.extend([e.args[0].buffer, e.args[1].buffer, e.out].map(|x| x as u64));
    w.push(offs.len() as u64);
    w.extend(offs.iter().flatten().map(|&x| x as u64));
    if let Some([a32, b32, o32]) = copies {
        w.extend([a32, b32, o32].map(|x| x as u64));
        w.extend(
            [
                s.buffers[e.args[0].buffer].len(),
                s.buffers[e.args[1].buffer].len(),
                out.len(),
            ]
            .map(|x| x as u64),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_alive_together_never_overlap() {
        let lives = [
            Life {
                from: 0,
                to: 2,
                bytes: 100,
            },
            Life {
                from: 1,
                to: 1,
                bytes: 64,
            },
            Life {
                from: 3,
                to: 4,
                bytes: 200,
            },
            Life {
                from: 2,
                to: 3,
                bytes: 8,
            },
        ];
        let (at, end) = place(&lives, 128);
        for i in 0..lives.len() {
            assert!(at[i] >= 128 && at[i] % ALIGN == 0 && at[i] + lives[i].bytes <= end);
            for j in 0..i {
                let together = lives[i].from <= lives[j].to && lives[j].from <= lives[i].to;
                let apart = at[i] + lives[i].bytes <= at[j] || at[j] + lives[j].bytes <= at[i];
                assert!(!together || apart, "{i} and {j} overlap");
            }
        }
        // the fourth region takes the second's bytes, free again by its first step
        assert_eq!((at[0], at[1], at[3]), (128, 256, 256));
    }
}
