//! What the profiler reports about a step: its name, the ops it runs, the bytes it moves and
//! the arithmetic it does.

use super::plan::step_buffers;
use crate::ir::shape::numel;
use crate::kernel::{Expr, Level, Schedule, Step};

/// Static facts about one step of a schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct StepInfo {
    /// The kernel's name, or `extern_<op>` for a library call.
    pub name: String,
    /// The ops the step runs, in order (one per computed value of a kernel).
    pub ops: Vec<String>,
    /// Bytes read plus bytes written, each buffer counted once.
    pub bytes: usize,
    /// Arithmetic operations (a multiply-add counts two).
    pub flops: u64,
    /// True for a library call (GEMM or eager kernel) rather than a generated kernel.
    pub is_extern: bool,
}

impl StepInfo {
    /// The facts of every step of `s`, in order.
    pub fn of_schedule(s: &Schedule) -> Vec<StepInfo> {
        s.steps.iter().map(|st| StepInfo::of_step(s, st)).collect()
    }

    fn of_step(s: &Schedule, step: &Step) -> StepInfo {
        let (reads, writes) = step_buffers(step);
        let bytes = reads
            .iter()
            .chain(&writes)
            .map(|&b| s.buffers.get(b).map_or(0, |x| x.bytes()))
            .sum();
        match step {
            Step::Kernel(k) => {
                let levels = k.levels();
                let per_row = numel(&k.outer) as u64;
                let all = numel(&k.space()) as u64;
                let mut ops = Vec::new();
                let mut flops = 0u64;
                for (v, l) in k.values.iter().zip(&levels) {
                    let name = match &v.expr {
                        Expr::Load { .. } | Expr::Index { .. } | Expr::Const(_) => continue,
                        Expr::Unary(u, _) => u.name().to_string(),
                        Expr::Binary(b, _, _) => b.name().to_string(),
                        Expr::Where(..) => "where".into(),
                        Expr::Clamp { .. } => "clamp".into(),
                        Expr::Cast(_) => format!("to_{}", v.dtype.name()),
                        Expr::MaskedFill { .. } => "masked_fill".into(),
                        Expr::Reduce { combiner, .. } => combiner.name().to_string(),
                    };
                    let n = match (&v.expr, l) {
                        (Expr::Reduce { .. }, _) => all,
                        (_, Level::Outer) => per_row,
                        (_, Level::Inner) => all,
                    };
                    if !matches!(v.expr, Expr::Cast(_)) {
                        flops += n;
                    }
                    ops.push(name);
                }
                StepInfo {
                    name: k.name.clone(),
                    ops,
                    bytes,
                    flops,
                    is_extern: false,
                }
            }
            Step::Extern(e) => {
                let shapes: Vec<&[usize]> = e.args.iter().map(|a| a.shape.as_slice()).collect();
                let out_shape = s.buffers.get(e.out).map_or(&[][..], |b| b.shape.as_slice());
                let flops = e.op.flops(&shapes, out_shape);
                StepInfo {
                    name: format!("extern_{}", e.op.name()),
                    ops: vec![e.op.name().to_string()],
                    bytes,
                    flops,
                    is_extern: true,
                }
            }
            // the bodies' kernels report themselves (their own calls) while they run
            Step::Control(c) => StepInfo {
                name: format!("control_{}", c.control.name()),
                ops: vec![c.control.name().to_string()],
                bytes,
                flops: 0,
                is_extern: true,
            },
        }
    }
}
