//! Where temporaries live: a slot per group of buffers whose lifetimes do not overlap.
//!
//! The rule is the simple liveness one: a temporary written by a kernel is allocated before
//! the step that first writes it and released after the last step that reads it (graph
//! outputs are never released); a released slot is taken by the next temporary of the same
//! dtype and element count. Extern results are the tensors the library call returns, so
//! they get no slot. A memory planner can replace [`TempPlan::build`] with its own
//! assignment: the executor reads only `alloc_before`, `free_after` and `slot_of`.
//!
//! One exception to disjoint lifetimes: a pointwise kernel that reads a temporary only at
//! the element it writes, at the step where that temporary dies, writes its result into the
//! temporary's slot ([`in_place`]): a gradient flowing through an activation's derivative,
//! say, needs no second buffer of its size.

use crate::ir::dtype::DType;
use crate::kernel::{BufferId, BufferKind, Expr, IndexMap, Kernel, Schedule, Step};
use crate::runtime::storage::pool::MIN_BYTES as POOLED;

/// The temporaries' slots and when each is taken and given back.
#[derive(Clone, Debug, Default)]
pub struct TempPlan {
    /// The slot of each buffer written by a kernel (`None` for inputs, constants and extern
    /// results).
    pub slot_of: Vec<Option<usize>>,
    /// Dtype and element count of every slot (at least those of each buffer it holds).
    pub slots: Vec<(DType, usize)>,
    /// Buffers to allocate (from their slot) before each step.
    pub alloc_before: Vec<Vec<BufferId>>,
    /// Buffers that no later step reads, released after each step.
    pub free_after: Vec<Vec<BufferId>>,
    /// For a kernel's result written over an operand that dies at that step, in the same
    /// slot (`in_place`): the operand.
    pub written_over: Vec<Option<BufferId>>,
    /// The bytes a call allocates at most, by this plan: the slots it holds and the extern
    /// results alive, at the step where they are most.
    pub peak_estimate: usize,
    /// Slots whose storage the call gives back after each step, their last holder done: only
    /// where that lowers the peak (a later call then takes a block from the pool of freed
    /// ones instead of keeping it).
    pub release_after: Vec<Vec<usize>>,
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

/// The (operand, result) pairs of a pointwise kernel whose result may be written over the
/// operand: the kernel reads the operand only at the element it writes (the same map, which
/// reaches a different element at every point of the space), so each element is read
/// before it is overwritten, and by its own iteration only. Kernels with aliased operands
/// already run this way (a parameter's update written into the parameter).
pub fn in_place(k: &Kernel) -> Vec<(BufferId, BufferId)> {
    if !k.inner.is_empty() || !k.passes.is_empty() {
        return Vec::new();
    }
    let loads: Vec<(BufferId, &IndexMap)> = k
        .values
        .iter()
        .filter_map(|v| match &v.expr {
            Expr::Load { buffer, map } => Some((*buffer, map)),
            _ => None,
        })
        .collect();
    let mut out: Vec<(BufferId, BufferId)> = Vec::new();
    for st in &k.stores {
        // every point of the space writes its own element, once
        let distinct = k
            .outer
            .iter()
            .zip(&st.map.strides)
            .all(|(&size, &stride)| size <= 1 || stride != 0);
        let single = k.stores.iter().filter(|o| o.buffer == st.buffer).count() == 1;
        if !distinct || !single || loads.iter().any(|&(b, _)| b == st.buffer) {
            continue;
        }
        for &(a, _) in &loads {
            let aligned = loads.iter().all(|&(b, m)| b != a || m == &st.map);
            if aligned && !out.iter().any(|&(x, y)| x == a || y == st.buffer) {
                out.push((a, st.buffer));
            }
        }
    }
    out
}

impl TempPlan {
    /// Assigns slots to the temporaries of `s` by liveness.
    pub fn build(s: &Schedule) -> TempPlan {
        TempPlan::build_nested(s, &[], &[])
    }

    /// [`TempPlan::build`] where each step `i` with `inside_previous[i]` runs inside step
    /// `i - 1` (a convolution's epilogue, run tile by tile): its temporaries are taken
    /// before step `i - 1`, and what step `i - 1` reads stays until step `i` is done, so
    /// that no slot is shared between the two. The result of each extern step `i` with
    /// `slotted[i]` (a GEMM called directly, which writes its own result) gets a slot too,
    /// though it is not in `alloc_before`: its step takes the slot's storage itself.
    ///
    /// Two plans are made and the one with the lowest estimated peak kept (the first on a
    /// tie): buffers placed largest first (each in the first free slot) or in the order
    /// they are first written (each in the smallest free slot that fits). A call takes a
    /// slot's storage at the slot's first step and keeps it to the end, so that a steady
    /// stream of calls allocates nothing, except slots of 64 KiB or more whose holders are
    /// all done before the peak: those are given back after their last holder, to the pool
    /// of freed blocks, which hands them to the next call. The estimate is what the
    /// call allocates (for the compiled models' steps it is the measured peak, byte for
    /// byte).
    pub fn build_nested(s: &Schedule, inside_previous: &[bool], slotted: &[bool]) -> TempPlan {
        let largest_first = Self::build_with(s, inside_previous, slotted, false);
        let by_time = Self::build_with(s, inside_previous, slotted, true);
        if by_time.peak_estimate < largest_first.peak_estimate {
            by_time
        } else {
            largest_first
        }
    }

    /// [`TempPlan::build_nested`] in one order, with the call's estimated peak: the most
    /// bytes at one step of the slots held and the extern results alive.
    fn build_with(
        s: &Schedule,
        inside_previous: &[bool],
        slotted: &[bool],
        by_time: bool,
    ) -> TempPlan {
        let n = s.buffers.len();
        let steps = s.steps.len();
        let nested = |i: usize| inside_previous.get(i).copied().unwrap_or(false);
        let mut def: Vec<Option<usize>> = vec![None; n];
        let mut last: Vec<Option<usize>> = vec![None; n];
        let mut by_kernel = vec![false; n];
        let mut by_extern = vec![false; n];
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
                    by_extern[b] = slotted.get(i).copied().unwrap_or(false);
                }
                last[b] = Some(last[b].map_or(i, |l| l.max(i)));
            }
        }
        let mut kept = vec![false; n];
        for v in &s.outputs {
            kept[v.buffer] = true;
        }
        // (dying operand, result) pairs that may share a slot at the step between them
        let mut pairs: Vec<(BufferId, BufferId)> = Vec::new();
        for (i, step) in s.steps.iter().enumerate() {
            let Step::Kernel(k) = step else { continue };
            if nested(i) || nested(i + 1) {
                continue;
            }
            for (a, b) in in_place(k) {
                let temp = |x: BufferId| s.buffers[x].kind == BufferKind::Temp && !kept[x];
                let same = s.buffers[a].dtype == s.buffers[b].dtype
                    && s.buffers[a].len() == s.buffers[b].len();
                let fresh = def[b] == Some(i) && by_kernel[b];
                let taken = pairs.iter().any(|&(x, y)| x == a || y == b);
                if temp(a) && temp(b) && same && fresh && last[a] == Some(i) && !taken {
                    pairs.push((a, b));
                }
            }
        }
        let mut plan = TempPlan {
            slot_of: vec![None; n],
            slots: Vec::new(),
            alloc_before: vec![Vec::new(); steps],
            free_after: vec![Vec::new(); steps],
            written_over: vec![None; n],
            peak_estimate: 0,
            release_after: vec![Vec::new(); steps],
        };
        // what takes a slot at each step: what the plan allocates, and slotted extern results
        let mut take: Vec<Vec<BufferId>> = vec![Vec::new(); steps];
        for b in 0..n {
            if s.buffers[b].kind != BufferKind::Temp {
                continue;
            }
            if let Some(d) = def[b] {
                if by_kernel[b] {
                    plan.alloc_before[d].push(b);
                }
                if by_kernel[b] || by_extern[b] {
                    take[d].push(b);
                }
                if !kept[b] {
                    plan.free_after[last[b].unwrap_or(d)].push(b);
                }
            }
        }
        // Largest first, each buffer takes the first slot of its dtype that is free for its
        // whole life (taken at its step, given back after its last reader), so a slot is
        // as big as its first buffer; in time order, the smallest such slot as big as the
        // buffer. A returned temporary only shares with returned ones of its exact size
        // (the caller gets its storage).
        let mut life: Vec<Option<(usize, usize)>> = vec![None; n];
        for (i, take) in take.iter().enumerate() {
            for &b in take {
                life[b] = Some((i, steps));
            }
        }
        for (i, freed) in plan.free_after.iter().enumerate() {
            for &b in freed {
                if let Some((first, _)) = life[b] {
                    life[b] = Some((first, i));
                }
            }
        }
        let mut order: Vec<BufferId> = (0..n).filter(|&b| life[b].is_some()).collect();
        let bytes = |b: BufferId| s.buffers[b].len() * s.buffers[b].dtype.size();
        if by_time {
            order.sort_by_key(|&b| (life[b].map(|l| l.0), std::cmp::Reverse(bytes(b)), b));
        } else {
            order.sort_by_key(|&b| (std::cmp::Reverse(bytes(b)), b));
        }
        let mut holders: Vec<Vec<(BufferId, usize, usize)>> = Vec::new();
        let mut exact: Vec<bool> = Vec::new();
        for b in order {
            let Some((first, last)) = life[b] else {
                continue;
            };
            let (dtype, len) = (s.buffers[b].dtype, s.buffers[b].len());
            // a holder whose life meets b's at the one step where one is written over the other
            let handover = |h: BufferId, f: usize, l: usize| {
                (l == first && pairs.contains(&(h, b))) || (last == f && pairs.contains(&(b, h)))
            };
            let free = |k: usize| {
                plan.slots[k].0 == dtype
                    && exact[k] == kept[b]
                    && (!kept[b] || plan.slots[k].1 == len)
                    && holders[k]
                        .iter()
                        .all(|&(h, f, l)| l < first || last < f || handover(h, f, l))
            };
            // the slot of the buffer it is written over (or into), when that one has one
            let partner = pairs
                .iter()
                .find_map(|&(x, y)| match (x == b, y == b) {
                    (true, _) => plan.slot_of[y],
                    (_, true) => plan.slot_of[x],
                    _ => None,
                })
                .filter(|&k| free(k));
            // the first free slot, or in time order the smallest (slots are not made
            // largest first then)
            let fits = |k: &usize| free(*k) && plan.slots[*k].1 >= len;
            let any = if by_time {
                (0..plan.slots.len())
                    .filter(fits)
                    .min_by_key(|&k| (plan.slots[k].1, k))
            } else {
                (0..plan.slots.len()).find(fits)
            };
            let slot = match partner.filter(|k| plan.slots[*k].1 >= len).or(any) {
                Some(k) => k,
                None => {
                    plan.slots.push((dtype, len));
                    holders.push(Vec::new());
                    exact.push(kept[b]);
                    plan.slots.len() - 1
                }
            };
            holders[slot].push((b, first, last));
            plan.slot_of[b] = Some(slot);
        }
        for (a, b) in pairs {
            if plan.slot_of[a].is_some() && plan.slot_of[a] == plan.slot_of[b] {
                plan.written_over[b] = Some(a);
            }
        }
        // the bytes no slot holds, step by step: an extern result from its step to its
        // last reader (or the end, when returned)
        let mut unslotted = vec![0usize; steps + 1];
        for b in 0..n {
            let (Some(d), None) = (def[b], plan.slot_of[b]) else {
                continue;
            };
            if s.buffers[b].kind != BufferKind::Temp || by_kernel[b] {
                continue;
            }
            let to = if kept[b] { steps } else { last[b].unwrap_or(d) };
            for u in unslotted.iter_mut().take(to + 1).skip(d) {
                *u += bytes(b);
            }
        }
        // plus each slot from the first step that takes it to the end (a call keeps a slot's
        // storage), or to its last holder's last step where giving it back then lowers the
        // peak: slots whose holders are all done before the peak's step, until none is left,
        // and only slots the pool of freed blocks keeps (the next call takes the block back
        // from it, without a fresh allocation's page faults). `spans`: each slot's first step
        // and its last holder's last one.
        let spans: Vec<(usize, usize)> = holders
            .iter()
            .map(|held| {
                let first = held.iter().map(|&(_, f, _)| f).min().unwrap_or(steps);
                let last = held.iter().map(|&(_, _, l)| l).max().unwrap_or(steps);
                (first, last)
            })
            .collect();
        let mut released = vec![false; plan.slots.len()];
        let slot_bytes = |k: usize| plan.slots[k].0.size() * plan.slots[k].1;
        let with_slots = |released: &[bool]| {
            let mut at = unslotted.clone();
            for (k, &(first, last)) in spans.iter().enumerate() {
                let end = if released[k] { last + 1 } else { steps + 1 };
                for u in at.iter_mut().take(end).skip(first) {
                    *u += slot_bytes(k);
                }
            }
            at
        };
        let mut at = with_slots(&released);
        loop {
            let peak_step = (0..at.len()).max_by_key(|&i| (at[i], std::cmp::Reverse(i)));
            let Some(p) = peak_step else { break };
            let more: Vec<usize> = (0..plan.slots.len())
                .filter(|&k| !released[k] && !exact[k] && slot_bytes(k) >= POOLED && spans[k].1 < p)
                .collect();
            if more.is_empty() {
                break;
            }
            let mut trial = released.clone();
            more.iter().for_each(|&k| trial[k] = true);
            let next = with_slots(&trial);
            if next.iter().max() >= at.iter().max() {
                break;
            }
            (released, at) = (trial, next);
        }
        // (a released slot's last holder is done before the peak's step)
        for (k, &r) in released.iter().enumerate() {
            if r {
                plan.release_after[spans[k].1].push(k);
            }
        }
        plan.peak_estimate = at.into_iter().max().unwrap_or(0);
        plan
    }

    /// Bytes of all slots together: the temporaries' footprint of one call.
    pub fn slot_bytes(&self) -> usize {
        self.slots.iter().map(|(d, n)| d.size() * n).sum()
    }
}
