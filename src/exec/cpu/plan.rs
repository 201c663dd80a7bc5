//! Where temporaries live: a slot per group of buffers whose lifetimes do not overlap.
//!
//! The rule is the simple liveness one: a temporary written by a kernel is allocated before
//! the step that first writes it and released after the last step that reads it (graph
//! outputs are never released); a released slot is taken by the next temporary of the same
//! dtype and element count. Extern results are the tensors the library call returns, so
//! they get no slot. A memory planner can replace [`TempPlan::build`] with its own
//! assignment: the executor reads only `alloc_before`, `free_after` and `slot_of`.

use crate::ir::dtype::DType;
use crate::kernel::{BufferId, BufferKind, Expr, Schedule, Step};

/// The temporaries' slots and when each is taken and given back.
#[derive(Clone, Debug, Default)]
pub struct TempPlan {
    /// The slot of each buffer written by a kernel (`None` for inputs, constants and extern
    /// results).
    pub slot_of: Vec<Option<usize>>,
    /// Dtype and element count of every slot.
    pub slots: Vec<(DType, usize)>,
    /// Buffers to allocate (from their slot) before each step.
    pub alloc_before: Vec<Vec<BufferId>>,
    /// Buffers that no later step reads, released after each step.
    pub free_after: Vec<Vec<BufferId>>,
}

/// The buffers a step reads and the ones it writes.
pub fn step_buffers(step: &Step) -> (Vec<BufferId>, Vec<BufferId>) {
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    match step {
        Step::Kernel(k) => {
            for v in &k.values {
                if let Expr::Load { buffer, .. } = v.expr {
                    reads.push(buffer);
                }
            }
            writes.extend(k.stores.iter().map(|s| s.buffer));
        }
        Step::Extern(e) => {
            reads.extend(e.args.iter().map(|a| a.buffer));
            writes.push(e.out);
        }
        Step::Control(c) => {
            reads.extend(c.args.iter().map(|a| a.buffer));
            writes.extend(c.outs.iter().flatten());
        }
    }
    reads.sort_unstable();
    reads.dedup();
    writes.sort_unstable();
    writes.dedup();
    (reads, writes)
}

impl TempPlan {
    /// Assigns slots to the temporaries of `s` by liveness.
    pub fn build(s: &Schedule) -> TempPlan {
        TempPlan::build_nested(s, &[])
    }

    /// [`TempPlan::build`] where each step `i` with `inside_previous[i]` runs inside step
    /// `i - 1` (a convolution's epilogue, run tile by tile): its temporaries are taken
    /// before step `i - 1`, and what step `i - 1` reads stays until step `i` is done, so
    /// that no slot is shared between the two.
    pub fn build_nested(s: &Schedule, inside_previous: &[bool]) -> TempPlan {
        let n = s.buffers.len();
        let steps = s.steps.len();
        let nested = |i: usize| inside_previous.get(i).copied().unwrap_or(false);
        let mut def: Vec<Option<usize>> = vec![None; n];
        let mut last: Vec<Option<usize>> = vec![None; n];
        let mut by_kernel = vec![false; n];
        for (i, step) in s.steps.iter().enumerate() {
            let (reads, writes) = step_buffers(step);
            let until = if nested(i + 1) { i + 1 } else { i };
            let at = if i > 0 && nested(i) { i - 1 } else { i };
            for b in reads {
                last[b] = Some(last[b].map_or(until, |l| l.max(until)));
            }
            for b in writes {
                if def[b].is_none() {
                    def[b] = Some(at);
                    by_kernel[b] = matches!(step, Step::Kernel(_));
                }
                last[b] = Some(last[b].map_or(i, |l| l.max(i)));
            }
        }
        let mut kept = vec![false; n];
        for v in &s.outputs {
            kept[v.buffer] = true;
        }
        let mut plan = TempPlan {
            slot_of: vec![None; n],
            slots: Vec::new(),
            alloc_before: vec![Vec::new(); steps],
            free_after: vec![Vec::new(); steps],
        };
        for b in 0..n {
            if s.buffers[b].kind != BufferKind::Temp {
                continue;
            }
            if let Some(d) = def[b] {
                if by_kernel[b] {
                    plan.alloc_before[d].push(b);
                }
                if !kept[b] {
                    plan.free_after[last[b].unwrap_or(d)].push(b);
                }
            }
        }
        let mut free: Vec<usize> = Vec::new();
        for i in 0..steps {
            for &b in &plan.alloc_before[i] {
                let want = (s.buffers[b].dtype, s.buffers[b].len());
                let slot = match free.iter().position(|&f| plan.slots[f] == want) {
                    Some(p) => free.swap_remove(p),
                    None => {
                        plan.slots.push(want);
                        plan.slots.len() - 1
                    }
                };
                plan.slot_of[b] = Some(slot);
            }
            for &b in &plan.free_after[i] {
                if let Some(slot) = plan.slot_of[b] {
                    free.push(slot);
                }
            }
        }
        plan
    }

    /// Bytes of all slots together: the temporaries' footprint of one call.
    pub fn slot_bytes(&self) -> usize {
        self.slots.iter().map(|(d, n)| d.size() * n).sum()
    }
}
