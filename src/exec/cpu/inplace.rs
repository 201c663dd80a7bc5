//! Outputs written straight into a caller's tensor ([`super::CompiledFn::call_into`]): a
//! training step writes the updated parameters into the parameter tensors themselves
//! instead of new buffers that are then copied back.
//!
//! The destination may be the storage of an input (the parameter the update reads) only
//! where that cannot change what any step reads: the output is a whole buffer written by
//! one pointwise kernel, every read of the input happens in that kernel or before it, and
//! that kernel loads the input only at the element it stores (the same index map), so each
//! element is read before it is overwritten, by the same iteration.

use crate::ir::op::Op;
use crate::ir::shape::contiguous_strides;
use crate::kernel::{BufferId, BufferKind, Expr, Schedule, Step};

use super::plan::step_buffers;

/// How output `i` may be written into a caller's tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InPlace {
    /// The buffer behind the output.
    pub buffer: BufferId,
    /// The step (a pointwise kernel) that writes it.
    pub step: usize,
    /// Inputs (by position) whose storage the destination may share, at the same layout.
    pub inputs: Vec<usize>,
}

/// For every output of `s`, whether it can be written into a caller's tensor.
pub(super) fn analyse(s: &Schedule) -> Vec<Option<InPlace>> {
    let bufs: Vec<(Vec<BufferId>, Vec<BufferId>)> = s.steps.iter().map(step_buffers).collect();
    s.outputs
        .iter()
        .map(|v| {
            let b = v.buffer;
            let buf = s.buffers.get(b)?;
            let whole = v.offset == 0
                && v.shape == buf.shape
                && v.strides == contiguous_strides(&buf.shape);
            if buf.kind != BufferKind::Temp || !whole {
                return None;
            }
            let mut writers = bufs.iter().enumerate().filter(|(_, (_, w))| w.contains(&b));
            let (step, _) = writers.next()?;
            if writers.next().is_some() {
                return None;
            }
            let Step::Kernel(k) = &s.steps[step] else {
                return None;
            };
            if !k.inner.is_empty() || !k.passes.is_empty() {
                return None;
            }
            let mut stores = k.stores.iter().filter(|st| st.buffer == b);
            let store = stores.next()?;
            if stores.next().is_some() {
                return None;
            }
            let inputs = s
                .inputs
                .iter()
                .enumerate()
                .filter(|&(_, &ib)| {
                    let ibuf = &s.buffers[ib];
                    let same_type = ibuf.dtype == buf.dtype && ibuf.shape == buf.shape;
                    let returned = s.outputs.iter().any(|o| o.buffer == ib);
                    let read_later = bufs[step + 1..].iter().any(|(r, _)| r.contains(&ib));
                    let written = bufs.iter().any(|(_, w)| w.contains(&ib));
                    // an extern's result could be a view of its argument, read after the
                    // update: only products, whose results are new tensors, may read it
                    let extern_view = s.steps[..step].iter().any(|st| match st {
                        Step::Extern(e) => {
                            e.args.iter().any(|a| a.buffer == ib)
                                && !matches!(e.op, Op::Matmul | Op::Linear { .. })
                        }
                        // a result may be an operand passed through
                        Step::Control(c) => c.args.iter().any(|a| a.buffer == ib),
                        Step::Kernel(_) => false,
                    });
                    let same_element = k.values.iter().all(|val| match &val.expr {
                        Expr::Load { buffer, map } if *buffer == ib => *map == store.map,
                        _ => true,
                    });
                    same_type
                        && !returned
                        && !read_later
                        && !written
                        && !extern_view
                        && same_element
                })
                .map(|(j, _)| j)
                .collect();
            Some(InPlace {
                buffer: b,
                step,
                inputs,
            })
        })
        .collect()
}
