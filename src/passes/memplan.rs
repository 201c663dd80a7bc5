//! Memory planning: which temporary buffers of a [`Schedule`] can share memory.
//!
//! A `Temp` buffer is live from the step that first writes it to the last step that reads it
//! (both included: a step may read its operands while it writes its result, so a buffer freed
//! by step `s` is reused only by buffers written after `s`). Graph outputs stay live to the
//! end. Inputs and constants are not planned.
//!
//! Buffers are assigned to *slots* in step order, best fit: the smallest free slot that is big
//! enough; if none is, the largest free slot grows (it costs less than a new one); a new slot
//! only when no slot is free. Any dtype may take any slot: the executor allocates every slot
//! aligned to [`SLOT_ALIGN`] bytes, more than any element needs.

use crate::ir::op::Op;
use crate::kernel::{BufferId, BufferKind, Expr, Schedule, Step};
use crate::{Result, bail};

/// Alignment, in bytes, of every slot's allocation.
pub const SLOT_ALIGN: usize = 64;

/// Where each temporary buffer lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The slot of each buffer of the schedule; `None` for inputs and constants.
    pub slot_of: Vec<Option<usize>>,
    /// Size of each slot in bytes (the largest buffer it holds).
    pub slot_bytes: Vec<usize>,
    /// Bytes of all slots together: the temporary memory the schedule needs with this plan.
    pub peak_planned: usize,
    /// Bytes of all temporary buffers together, as if none were ever freed.
    pub peak_unplanned: usize,
}

/// The live range of a temporary buffer, in steps (both ends included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The first step that uses it.
    pub first: usize,
    /// The last step that uses it.
    pub last: usize,
}

impl Interval {
    /// True when the two ranges share a step.
    pub fn overlaps(&self, o: &Interval) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// The buffers a step reads and the buffers it writes.
pub fn step_io(step: &Step) -> (Vec<BufferId>, Vec<BufferId>) {
    match step {
        Step::Kernel(k) => {
            let reads = k
                .values
                .iter()
                .filter_map(|v| match &v.expr {
                    Expr::Load { buffer, .. } => Some(*buffer),
                    _ => None,
                })
                .collect();
            (reads, k.stores.iter().map(|s| s.buffer).collect())
        }
        Step::Extern(e) => (e.args.iter().map(|a| a.buffer).collect(), vec![e.out]),
        Step::Control(c) => (
            c.args.iter().map(|a| a.buffer).collect(),
            c.outs.iter().flatten().copied().collect(),
        ),
    }
}

/// The live range of every buffer: `Some` for `Temp` buffers. A temporary nobody writes is
/// live from the start; one nobody reads dies at its writing step.
pub fn liveness(s: &Schedule) -> Vec<Option<Interval>> {
    let n = s.steps.len();
    let mut live: Vec<Option<Interval>> = vec![None; s.buffers.len()];
    let temp = |b: BufferId| matches!(s.buffers.get(b).map(|b| &b.kind), Some(BufferKind::Temp));
    for (i, step) in s.steps.iter().enumerate() {
        let (reads, writes) = step_io(step);
        for b in writes.into_iter().filter(|&b| temp(b)) {
            let iv = live[b].get_or_insert(Interval { first: i, last: i });
            iv.last = iv.last.max(i);
        }
        for b in reads.into_iter().filter(|&b| temp(b)) {
            let iv = live[b].get_or_insert(Interval { first: 0, last: i });
            iv.last = iv.last.max(i);
        }
    }
    for o in &s.outputs {
        if temp(o.buffer) {
            let iv = live[o.buffer].get_or_insert(Interval { first: 0, last: 0 });
            iv.last = n.saturating_sub(1).max(iv.last);
        }
    }
    for (b, buf) in s.buffers.iter().enumerate() {
        if buf.kind == BufferKind::Temp && live[b].is_none() {
            live[b] = Some(Interval { first: 0, last: 0 });
        }
    }
    live
}

/// Reorders the steps of `s` so that temporaries die sooner: a step that is the last
/// reader of more temporary bytes than it writes (a weight gradient's GEMM reading an
/// activation and the gradient flowing through it, a bias gradient's reduction) moves up to
/// just after the last step it depends on (one that writes what it reads, or reads or
/// writes what it writes). The order of every other pair of steps that share a buffer is
/// kept, so the results are the same. The backward of a model otherwise computes its weight
/// gradients late, at the end of the sweep, keeping every layer's activations and output
/// gradients alive until then.
///
/// A GEMM or convolution and the next step, when the next is where its result dies and is a
/// parameter's update (for a GEMM) or any epilogue (for a convolution), move together, so
/// the executor can still run them as one. A step that writes a graph output counts as writing
/// the inputs it reads too: the executor may write the output into an input's memory (a
/// parameter's update), so no reader of that input moves after it.
pub fn hoist_last_readers(s: &mut Schedule) {
    let n = s.steps.len();
    let live = liveness(s);
    let outputs: Vec<BufferId> = s.outputs.iter().map(|v| v.buffer).collect();
    let io: Vec<(Vec<BufferId>, Vec<BufferId>)> = s
        .steps
        .iter()
        .map(|step| {
            let (mut reads, mut writes) = step_io(step);
            if writes.iter().any(|b| outputs.contains(b)) {
                let inputs = reads.iter().filter(|&&b| s.inputs.contains(&b));
                writes.extend(inputs.copied().collect::<Vec<_>>());
            }
            reads.sort_unstable();
            reads.dedup();
            writes.sort_unstable();
            writes.dedup();
            (reads, writes)
        })
        .collect();
    let temp_bytes = |b: BufferId| live[b].map_or(0, |_| s.buffers[b].bytes());
    // temporaries read for the last time by step j (not written by it)
    let dying = |j: usize| -> Vec<BufferId> {
        let (reads, writes) = &io[j];
        reads
            .iter()
            .copied()
            .filter(|&b| live[b].is_some_and(|iv| iv.last == j) && !writes.contains(&b))
            .collect()
    };
    let conflicts = |a: usize, b: usize| {
        let (ra, wa) = &io[a];
        let (rb, wb) = &io[b];
        wa.iter().any(|x| rb.contains(x) || wb.contains(x)) || ra.iter().any(|x| wb.contains(x))
    };
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut j = 0;
    while j < n {
        // what the executor runs as one: a GEMM and the parameter update reading its result,
        // a convolution and the epilogue reading its result
        let pair = j + 1 < n
            && dying(j + 1).iter().any(|b| io[j].1.contains(b))
            && match &s.steps[j] {
                Step::Extern(e) => {
                    matches!(e.op, Op::Conv { .. })
                        || io[j + 1].1.iter().any(|b| outputs.contains(b))
                }
                _ => false,
            };
        let group: Vec<usize> = if pair { vec![j, j + 1] } else { vec![j] };
        let mut freed: Vec<BufferId> = group.iter().flat_map(|&k| dying(k)).collect();
        let mut made: Vec<BufferId> = group.iter().flat_map(|&k| io[k].1.clone()).collect();
        // what the first hands to the second is both made and freed
        let handed: Vec<BufferId> = made.iter().copied().filter(|b| freed.contains(b)).collect();
        freed.retain(|b| !handed.contains(b));
        made.retain(|b| !handed.contains(b));
        for v in [&mut freed, &mut made] {
            v.sort_unstable();
            v.dedup();
        }
        let bytes = |v: &[BufferId]| v.iter().map(|&b| temp_bytes(b)).sum::<usize>();
        let at = if bytes(&freed) > bytes(&made) {
            order
                .iter()
                .rposition(|&i| group.iter().any(|&k| conflicts(i, k)))
                .map_or(0, |p| p + 1)
        } else {
            order.len()
        };
        for (d, &k) in group.iter().enumerate() {
            order.insert(at + d, k);
        }
        j += group.len();
    }
    let mut steps: Vec<Option<Step>> = std::mem::take(&mut s.steps).into_iter().map(Some).collect();
    s.steps = order.iter().filter_map(|&i| steps[i].take()).collect();
}

/// Plans the temporary buffers of `s` into shared slots.
pub fn plan(s: &Schedule) -> MemoryPlan {
    let live = liveness(s);
    let mut order: Vec<BufferId> = (0..s.buffers.len())
        .filter(|&b| live[b].is_some())
        .collect();
    // by first step, then largest first so big buffers pick slots before small ones
    order.sort_by_key(|&b| {
        let iv = live[b].unwrap_or(Interval { first: 0, last: 0 });
        (iv.first, std::cmp::Reverse(s.buffers[b].bytes()), b)
    });
    let mut slot_of = vec![None; s.buffers.len()];
    let mut slot_bytes: Vec<usize> = Vec::new();
    // step after which each slot is free again
    let mut busy_until: Vec<usize> = Vec::new();
    for b in order {
        let Some(iv) = live[b] else { continue };
        let need = s.buffers[b].bytes();
        let free: Vec<usize> = (0..slot_bytes.len())
            .filter(|&k| busy_until[k] < iv.first)
            .collect();
        let fit = free
            .iter()
            .copied()
            .filter(|&k| slot_bytes[k] >= need)
            .min_by_key(|&k| (slot_bytes[k], k));
        let k = match fit {
            Some(k) => k,
            None => match free.iter().copied().max_by_key(|&k| (slot_bytes[k], k)) {
                Some(k) => {
                    slot_bytes[k] = need;
                    k
                }
                None => {
                    slot_bytes.push(need);
                    busy_until.push(0);
                    slot_bytes.len() - 1
                }
            },
        };
        busy_until[k] = iv.last;
        slot_of[b] = Some(k);
    }
    let peak_unplanned = (0..s.buffers.len())
        .filter(|&b| live[b].is_some())
        .map(|b| s.buffers[b].bytes())
        .sum();
    MemoryPlan {
        peak_planned: slot_bytes.iter().sum(),
        slot_of,
        slot_bytes,
        peak_unplanned,
    }
}

impl MemoryPlan {
    /// Checks the plan against `s`: every temporary has a slot big enough, nothing else has
    /// one, no two buffers live at the same step share a slot, and the totals add up.
    pub fn validate(&self, s: &Schedule) -> Result<()> {
        let live = liveness(s);
        if self.slot_of.len() != s.buffers.len() {
            bail!(
                Value,
                "memory plan: {} slot entries for {} buffers",
                self.slot_of.len(),
                s.buffers.len()
            );
        }
        let mut by_slot: Vec<Vec<BufferId>> = vec![Vec::new(); self.slot_bytes.len()];
        for (b, slot) in self.slot_of.iter().enumerate() {
            match (slot, live[b]) {
                (None, None) => {}
                (Some(_), None) => bail!(Value, "memory plan: b{b} is not a temporary"),
                (None, Some(_)) => bail!(Value, "memory plan: temporary b{b} has no slot"),
                (Some(k), Some(_)) => {
                    let Some(list) = by_slot.get_mut(*k) else {
                        bail!(Value, "memory plan: b{b} is in missing slot {k}");
                    };
                    if self.slot_bytes[*k] < s.buffers[b].bytes() {
                        bail!(Value, "memory plan: b{b} does not fit slot {k}");
                    }
                    list.push(b);
                }
            }
        }
        for (k, list) in by_slot.iter().enumerate() {
            for (i, &a) in list.iter().enumerate() {
                for &b in &list[i + 1..] {
                    if let (Some(x), Some(y)) = (live[a], live[b])
                        && x.overlaps(&y)
                    {
                        bail!(
                            Value,
                            "memory plan: b{a} and b{b} are live together in slot {k}"
                        );
                    }
                }
            }
        }
        let unplanned: usize = (0..s.buffers.len())
            .filter(|&b| live[b].is_some())
            .map(|b| s.buffers[b].bytes())
            .sum();
        if self.peak_planned != self.slot_bytes.iter().sum::<usize>()
            || self.peak_unplanned != unplanned
        {
            bail!(Value, "memory plan: totals do not add up");
        }
        Ok(())
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slot_bytes.len()
    }
}
