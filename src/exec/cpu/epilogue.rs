//! A convolution's pointwise epilogue (bias, batch-norm scaling, relu, a residual add: the
//! kernel fusion leaves after a `conv2d`) run inside the convolution, on each tile of its
//! output as soon as the tile is written and while it is still in cache, so the epilogue
//! costs no pass of its own over memory.
//!
//! The schedule is unchanged: a convolution step, then its kernel. The executor decides
//! when compiling which kernels nest in the convolution before them ([`nests`]) and plans
//! their temporaries as living through both steps; at run time a call whose operands do
//! not allow it (a result the convolution rounds to another dtype, a depthwise
//! convolution, an unbatched input, a layout that is not the buffer's) runs the two steps
//! one after the other instead.

use crate::Result;
use crate::codegen_cpu::lower::CpuKernel;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::kernel::{self, BufferId, Expr, ExternCall, IndexMap, Schedule, Step};
use crate::runtime::kernels::conv;
use crate::runtime::{Tensor, access};
use std::sync::OnceLock;

/// Whether kernel step `i` may run inside the convolution of step `i - 1`: a pointwise
/// kernel over as many elements as the convolution's result that reads it, whose row `j`
/// (in the order its compiled code walks them) is element `j` in memory of that result and
/// of every buffer it stores (so any range of rows can run on its own, in any order), and
/// that writes none of the convolution's operands.
pub(super) fn nests(s: &Schedule, i: usize) -> bool {
    let (Some(Step::Extern(e)), Some(Step::Kernel(k))) =
        (s.steps.get(i.wrapping_sub(1)), s.steps.get(i))
    else {
        return false;
    };
    if !matches!(e.op, Op::Conv { .. }) || !k.inner.is_empty() {
        return false;
    }
    // the order the compiled code walks its rows in: a channels_last store reorders them
    // to memory order (`kernel::store_order`)
    let ordered = kernel::store_order(k);
    let k = ordered.as_ref().unwrap_or(k);
    let n = numel(&k.outer);
    if n == 0 || n != s.buffers[e.out].len() {
        return false;
    }
    let flat = |m: &IndexMap| {
        let mut stride = 1;
        m.offset == 0
            && k.outer.iter().zip(&m.strides).rev().all(|(&d, &st)| {
                let ok = d <= 1 || st == stride;
                stride *= d;
                ok
            })
    };
    let stores_ok = k.stores.iter().all(|st| {
        flat(&st.map)
            && s.buffers[st.buffer].len() == n
            && e.args.iter().all(|a| a.buffer != st.buffer)
    });
    let mut reads_result = false;
    let loads_ok = k.values.iter().all(|v| match &v.expr {
        Expr::Load { buffer, map } if *buffer == e.out => {
            reads_result = true;
            flat(map)
        }
        _ => true,
    });
    stores_ok && loads_ok && reads_result
}

/// The code's table of buffer pointers, shared by the tile tasks.
struct Table(Vec<*mut u8>);
// SAFETY: the pointers address buffers locked by the calling thread for the whole
// convolution; the tasks write disjoint ranges of them.
unsafe impl Send for Table {}
// SAFETY: shared by the tile tasks, the table itself is only read (`with` copies it); the
// memory its pointers address is written in disjoint ranges, as for `Send`.
unsafe impl Sync for Table {}

impl Table {
    /// This table with buffer `b` at `p`.
    fn with(&self, b: BufferId, p: *mut u8) -> Table {
        let mut t = self.0.clone();
        t[b] = p;
        Table(t)
    }
}

/// Runs convolution `e` with `code` (the kernel of the next step, reading `reads` and
/// writing `writes`) as its epilogue, and stores the result in `bufs`. True when the
/// epilogue ran; false when this call ran the convolution alone (the caller then runs the
/// kernel as usual).
pub(super) fn run(
    s: &Schedule,
    e: &ExternCall,
    ty: Option<&TensorType>,
    code: &CpuKernel,
    (reads, writes): (&[BufferId], &[BufferId]),
    bufs: &mut [Option<Tensor>],
) -> Result<bool> {
    let Op::Conv {
        conv: attrs,
        has_bias,
    } = &e.op
    else {
        return super::run_extern(s, e, ty, bufs).map(|()| false);
    };
    let args: Vec<Tensor> = e
        .args
        .iter()
        .map(|v| super::view_of(bufs, v))
        .collect::<Result<_>>()?;
    let out = &s.buffers[e.out];
    // the result comes back in the buffer's own layout, with a batch dim
    let nhwc = out.channels_last && out.shape.len() == 4;
    let fits = args.len() >= 2
        && args[0].dim() == attrs.spatial() + 2
        && conv::prefers_nhwc(&args[0]) == nhwc
        && ty.is_none_or(|t| t.dtype == out.dtype && t.shape == out.shape);
    if !fits {
        return super::run_extern(s, e, ty, bufs).map(|()| false);
    }
    let others = |list: &[BufferId]| -> Result<Vec<(BufferId, &Tensor)>> {
        list.iter()
            .filter(|&&b| b != e.out)
            .map(|&b| super::buffer(bufs, b).map(|t| (b, t)))
            .collect()
    };
    let (rs, ws) = (others(reads)?, others(writes)?);
    // the convolution locks and reads its operands while the epilogue runs: the epilogue
    // may neither write them (a caller's tensor given to `call_into`) nor lock them again
    let shares = rs
        .iter()
        .chain(&ws)
        .any(|(_, t)| args.iter().any(|a| a.storage().id() == t.storage().id()));
    if shares {
        return super::run_extern(s, e, ty, bufs).map(|()| false);
    }
    let Some(kernel) = args[1].shape().get(2..) else {
        return super::run_extern(s, e, ty, bufs).map(|()| false);
    };
    let geo = attrs.geometry(kernel)?;
    let bias = if *has_bias { args.get(2) } else { None };
    let out_ty = TensorType::new(out.dtype, out.shape.clone());
    let rt: Vec<&Tensor> = rs.iter().map(|p| p.1).collect();
    let wt: Vec<&Tensor> = ws.iter().map(|p| p.1).collect();
    let acc = access::lock(&rt, &wt);
    let mut base = Table(vec![std::ptr::null_mut::<u8>(); s.buffers.len()]);
    for (j, (b, _)) in rs.iter().enumerate() {
        base.0[*b] = acc.read::<u8>(j) as *mut u8;
    }
    for (j, (b, t)) in ws.iter().enumerate() {
        base.0[*b] = acc.write::<u8>(j);
        t.storage().bump_version();
    }
    let table: OnceLock<Table> = OnceLock::new();
    let epi = |y: *mut u8, start: usize, len: usize| -> Result<()> {
        // the result's address is the same for every tile
        let t = table.get_or_init(|| base.with(e.out, y));
        // SAFETY: every buffer of the kernel is locked above (the result is written by
        // the convolution, which hands over finished elements only); tiles are disjoint.
        unsafe { code.run_rows(&t.0, start, start + len) }
    };
    let (r, ran) = conv::forward_then(&args[0], &args[1], bias, &geo, &out_ty, Some(&epi))?;
    drop(acc);
    bufs[e.out] = Some(kernel::Buffer::conform(out, &r)?);
    Ok(ran)
}
