//! Convolutions of a compiled model as the plan's conv steps ([`smelt_rt::conv`], the kernels
//! the JIT runs, so the results agree bit for bit).
//!
//! The kernels read dense operands in one order each: the input and the output in NCHW, or
//! NHWC where the JIT would choose it (a channels_last input), the weights in the order
//! [`weight_order`] names. [`prepare`] puts every operand there before the plan is built: an
//! operand already in that order is read in place; a constant (the weights, mostly) is
//! reordered now, into a new constant; anything else is copied at run time by a
//! `contiguous` step inserted before the convolution (and a result the schedule wants in
//! the other layout, by one after it).

use crate::ir::dtype::DType;
use crate::ir::op::{Literal, Op};
use crate::ir::shape::numel;
use crate::kernel::{Buffer, BufferKind, ExternCall, Schedule, Step, View};
use crate::kernels::conv::{plan as conv_plan, prefers_nhwc_layout};
use crate::layout::Layout;
use crate::{Result, bail};
use smelt_rt::conv::{Dims, WeightOrder, weight_order};
use smelt_rt::model as rt;
use std::sync::Arc;

/// A convolution step as [`prepare`] laid it out.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConvStep {
    dims: Dims,
    nhwc: bool,
}

/// Conforms the operands of every convolution of `s` to its kernel's orders (inserting
/// copy steps); returns, per step of the new schedule, the convolution it runs, if any.
pub(super) fn prepare(s: &mut Schedule) -> Result<Vec<Option<ConvStep>>> {
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut convs = Vec::with_capacity(s.steps.len());
    for step in std::mem::take(&mut s.steps) {
        let Step::Extern(mut e) = step else {
            steps.push(step);
            convs.push(None);
            continue;
        };
        if !matches!(e.op, Op::Conv { .. }) {
            steps.push(Step::Extern(e));
            convs.push(None);
            continue;
        }
        let (dims, nhwc, order) = problem(s, &e)?;
        let rank = e.args[0].shape.len();
        let x_order = layout_order(rank, nhwc);
        let w_order = match order {
            WeightOrder::Nchw => layout_order(rank, false),
            WeightOrder::Nhwc => layout_order(rank, true),
            // [kH, kW, Cin, Cout], or [kW, Cin, Cout] for a 1-d convolution
            WeightOrder::Taps if rank == 4 => vec![2, 3, 1, 0],
            WeightOrder::Taps => vec![2, 1, 0],
        };
        let mut before = Vec::new();
        e.args[0] = conform(s, &e.args[0], &x_order, &mut before);
        e.args[1] = conform(s, &e.args[1], &w_order, &mut before);
        if let Some(b) = e.args.get(2).cloned() {
            e.args[2] = conform(s, &b, &[0], &mut before);
        }
        for c in before {
            steps.push(Step::Extern(c));
            convs.push(None);
        }
        // the result: straight into its buffer when that has the kernel's order
        let out = s.buffers[e.out].clone();
        let want = strides_for(&out.shape, &layout_order(out.shape.len(), nhwc));
        if dense_as(&out.shape, &out.strides(), &want) {
            steps.push(Step::Extern(e));
            convs.push(Some(ConvStep { dims, nhwc }));
            continue;
        }
        let order = layout_order(out.shape.len(), nhwc);
        let y = add_buffer(s, &out, permuted(&out.shape, &order), BufferKind::Temp);
        let final_out = std::mem::replace(&mut e.out, y);
        steps.push(Step::Extern(e));
        convs.push(Some(ConvStep { dims, nhwc }));
        steps.push(Step::Extern(ExternCall {
            op: Op::Contiguous,
            args: vec![View {
                buffer: y,
                shape: out.shape.clone(),
                strides: want,
                offset: 0,
            }],
            out: final_out,
        }));
        convs.push(None);
    }
    s.steps = steps;
    s.validate()?;
    Ok(convs)
}

/// The sizes of `e`'s convolution, whether it runs in NHWC, and its weights' order.
fn problem(s: &Schedule, e: &ExternCall) -> Result<(Dims, bool, WeightOrder)> {
    let Op::Conv { conv, .. } = &e.op else {
        bail!(Value, "aot: {} is not a convolution", e.op.name());
    };
    let out = &s.buffers[e.out];
    let dtype = out.dtype;
    if !matches!(dtype, DType::F32 | DType::F64) {
        bail!(
            Unsupported,
            "aot: the library op {} is not compiled for {dtype} yet (f32 and f64 are)",
            e.op.name()
        );
    }
    if e.args.len() < 2 || e.args.iter().any(|a| s.buffers[a.buffer].dtype != dtype) {
        bail!(DType, "aot: {} operands of different dtypes", e.op.name());
    }
    let (x, w) = (&e.args[0], &e.args[1]);
    let geo = conv.geometry(w.shape.get(2..).unwrap_or(&[]))?;
    if x.shape.len() != conv.spatial() + 2 || out.shape.len() != x.shape.len() {
        bail!(
            Unsupported,
            "aot: an unbatched {} is not compiled ahead of time yet",
            e.op.name()
        );
    }
    let d = conv_plan(e.op.name(), &x.shape, &w.shape, &out.shape, &geo)?;
    let nhwc = prefers_nhwc_layout(&Layout {
        shape: x.shape.clone(),
        strides: x.strides.clone(),
        offset: x.offset,
    });
    Ok((d, nhwc, weight_order(&d, nhwc, dtype == DType::F32)))
}

/// The order of a `[N, C, *spatial]` operand's dims in memory, outermost first: NCHW, or
/// NHWC when `nhwc` (4-d only).
fn layout_order(rank: usize, nhwc: bool) -> Vec<usize> {
    if nhwc && rank == 4 {
        vec![0, 2, 3, 1]
    } else {
        (0..rank).collect()
    }
}

/// `shape`'s dims in `order`.
fn permuted(shape: &[usize], order: &[usize]) -> Vec<usize> {
    order.iter().map(|&d| shape[d]).collect()
}

/// The strides of a dense array of `shape` whose dims lie in memory in `order`.
fn strides_for(shape: &[usize], order: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for &d in order.iter().rev() {
        strides[d] = step;
        step *= shape[d];
    }
    strides
}

/// Whether `strides` address the same elements as `want` (dims of size 1 may differ; an
/// empty array is anything).
fn dense_as(shape: &[usize], strides: &[usize], want: &[usize]) -> bool {
    numel(shape) == 0
        || shape
            .iter()
            .zip(strides.iter().zip(want))
            .all(|(&n, (s, w))| n == 1 || s == w)
}

/// A new buffer like `like` of (dense) `shape`.
fn add_buffer(s: &mut Schedule, like: &Buffer, shape: Vec<usize>, kind: BufferKind) -> usize {
    s.buffers.push(Buffer {
        name: format!("{}.ordered", like.name),
        dtype: like.dtype,
        shape,
        kind,
        channels_last: false,
    });
    s.buffers.len() - 1
}

/// `v` as a view whose elements lie densely in `order`: `v` itself when they already do,
/// else a view of a new buffer holding them so, a constant reordered now or a temporary
/// filled by a copy step appended to `before`.
fn conform(s: &mut Schedule, v: &View, order: &[usize], before: &mut Vec<ExternCall>) -> View {
    let want = strides_for(&v.shape, order);
    if dense_as(&v.shape, &v.strides, &want) {
        return v.clone();
    }
    let dense = permuted(&v.shape, order);
    let src = View {
        buffer: v.buffer,
        shape: dense.clone(),
        strides: permuted(&v.strides, order),
        offset: v.offset,
    };
    let from = s.buffers[v.buffer].clone();
    let b = match &from.kind {
        BufferKind::Constant(lit) => {
            let bytes = reordered(lit, &src);
            let kind = BufferKind::Constant(Literal {
                dtype: from.dtype,
                shape: dense.clone(),
                bytes: Arc::new(bytes),
            });
            add_buffer(s, &from, dense, kind)
        }
        _ => {
            let b = add_buffer(s, &from, dense, BufferKind::Temp);
            before.push(ExternCall {
                op: Op::Contiguous,
                args: vec![src],
                out: b,
            });
            b
        }
    };
    View {
        buffer: b,
        shape: v.shape.clone(),
        strides: want,
        offset: 0,
    }
}

/// The elements of the view `src` of the constant `lit`, densely in its order.
fn reordered(lit: &Literal, src: &View) -> Vec<u8> {
    let size = lit.dtype.size();
    let mut out = vec![0u8; numel(&src.shape) * size];
    let dst_strides: Vec<isize> =
        strides_for(&src.shape, &(0..src.shape.len()).collect::<Vec<_>>())
            .iter()
            .map(|&x| x as isize)
            .collect();
    let src_strides: Vec<isize> = src.strides.iter().map(|&x| x as isize).collect();
    let c = smelt_rt::copy::Copy {
        size,
        shape: &src.shape,
        dst: &dst_strides,
        src: &src_strides,
        index: None,
    };
    // SAFETY: the schedule's views lie in their buffers (validated before the plan is
    // built), and `out` holds the view's elements densely.
    let r = unsafe {
        smelt_rt::copy::run(
            &c,
            out.as_mut_ptr(),
            lit.bytes.as_ptr().add(src.offset * size),
        )
    };
    debug_assert!(r.is_ok(), "a copy without an index cannot fail");
    out
}

/// Appends the words of the conv step `c`, whose operands [`prepare`] conformed.
pub(super) fn conv_words(s: &Schedule, e: &ExternCall, c: &ConvStep, w: &mut Vec<u64>) {
    let d = &c.dims;
    let dtype = match s.buffers[e.out].dtype {
        DType::F64 => rt::CONV_F64,
        _ => rt::CONV_F32,
    };
    w.extend([rt::STEP_CONV, dtype, u64::from(c.nhwc)]);
    w.extend(
        [
            d.n, d.c, d.h, d.w, d.co, d.oh, d.ow, d.kh, d.kw, d.sh, d.sw, d.ph, d.pw, d.dh, d.dw,
            d.g,
        ]
        .map(|x| x as u64),
    );
    for a in &e.args[..2] {
        w.extend([a.buffer as u64, a.offset as u64]);
    }
    match e.args.get(2) {
        Some(b) => w.extend([b.buffer as u64, b.offset as u64]),
        None => w.extend([rt::NO_BUFFER, 0]),
    }
    w.push(e.out as u64);
}
