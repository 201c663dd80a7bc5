//! Convolutions and pooling of a compiled model as the plan's conv and pool steps
//! ([`smelt_rt::conv`], [`smelt_rt::pool`]: the kernels the JIT runs, so the results agree
//! bit for bit).
//!
//! The kernels read dense operands in one order each: the input and the output in NCHW, or
//! NHWC where the JIT would choose it (a channels_last input), a convolution's weights in
//! the order [`weight_order`] names. [`prepare`] puts every operand there before the plan is
//! built: an operand already in that order is read in place; a constant (the weights,
//! mostly) is reordered now, into a new constant; anything else is copied at run time by a
//! `contiguous` step inserted before the op (and a result the schedule wants in the other
//! layout, by one after it).

use crate::ir::dtype::DType;
use crate::ir::op::{Literal, Op};
use crate::ir::shape::numel;
use crate::kernel::{Buffer, BufferKind, ExternCall, Schedule, Step, View};
use crate::kernels::conv::{plan as conv_plan, prefers_nhwc_layout};
use crate::kernels::pool::{geometry, plan as pool_plan};
use crate::layout::Layout;
use crate::{Result, bail};
use smelt_rt::conv::{Dims, WeightOrder, weight_order};
use smelt_rt::model as rt;
use smelt_rt::pool::{Geometry, Plan};
use std::sync::Arc;

/// A convolution or pooling step as [`prepare`] laid it out.
#[derive(Clone, Copy, Debug)]
pub(super) enum WindowStep {
    /// A convolution.
    Conv {
        /// Its sizes.
        dims: Dims,
        /// Whether it runs in NHWC.
        nhwc: bool,
    },
    /// A pooling.
    Pool {
        /// Which ([`rt::POOL_MAX`]..).
        kind: u64,
        /// Its element type ([`rt::POOL_F32`]..).
        dtype: u64,
        /// Its sizes and layout.
        plan: Plan,
        /// Its window.
        geo: Geometry,
        /// Whether padded zeros count in an average's divisor.
        count_include_pad: bool,
    },
}

/// Conforms the operands of every convolution and pooling of `s` to its kernel's orders
/// (inserting copy steps); returns, per step of the new schedule, the window op it runs.
pub(super) fn prepare(s: &mut Schedule) -> Result<Vec<Option<WindowStep>>> {
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut found = Vec::with_capacity(s.steps.len());
    for step in std::mem::take(&mut s.steps) {
        let Step::Extern(mut e) = step else {
            steps.push(step);
            found.push(None);
            continue;
        };
        let Some((window, orders, nhwc)) = problem(s, &e)? else {
            steps.push(Step::Extern(e));
            found.push(None);
            continue;
        };
        let mut before = Vec::new();
        for (a, order) in e.args.iter_mut().zip(&orders) {
            *a = conform(s, a, order, &mut before);
        }
        for c in before {
            steps.push(Step::Extern(c));
            found.push(None);
        }
        // the result: straight into its buffer when that has the kernel's order
        let out = s.buffers[e.out].clone();
        let order = layout_order(out.shape.len(), nhwc);
        let want = strides_for(&out.shape, &order);
        if dense_as(&out.shape, &out.strides(), &want) {
            steps.push(Step::Extern(e));
            found.push(Some(window));
            continue;
        }
        let y = add_buffer(s, &out, permuted(&out.shape, &order), BufferKind::Temp);
        let final_out = std::mem::replace(&mut e.out, y);
        steps.push(Step::Extern(e));
        found.push(Some(window));
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
        found.push(None);
    }
    s.steps = steps;
    s.validate()?;
    Ok(found)
}

/// A window op found in a schedule: its step, the order each operand must lie in, and
/// whether it runs in NHWC.
type Found = (WindowStep, Vec<Vec<usize>>, bool);

/// `e`'s window op; `None` for any other op.
fn problem(s: &Schedule, e: &ExternCall) -> Result<Option<Found>> {
    let out = &s.buffers[e.out];
    let dtype = out.dtype;
    let floats = |op: &str| -> Result<()> {
        if !matches!(dtype, DType::F32 | DType::F64) {
            bail!(
                Unsupported,
                "aot: the library op {op} is not compiled for {dtype} yet (f32 and f64 are)"
            );
        }
        Ok(())
    };
    let name = e.op.name();
    let same_dtypes = || {
        if e.args.is_empty() || e.args.iter().any(|a| s.buffers[a.buffer].dtype != dtype) {
            bail!(DType, "aot: {name} operands of different dtypes");
        }
        Ok(())
    };
    let batched = |spatial: usize| {
        if e.args[0].shape.len() != spatial + 2 || out.shape.len() != spatial + 2 {
            bail!(
                Unsupported,
                "aot: an unbatched {name} is not compiled ahead of time yet"
            );
        }
        Ok(())
    };
    let x = e.args.first();
    let nhwc = x.is_some_and(|x| {
        prefers_nhwc_layout(&Layout {
            shape: x.shape.clone(),
            strides: x.strides.clone(),
            offset: x.offset,
        })
    });
    let pool = |kind: u64, geo: Geometry, count_include_pad: bool, code: u64| {
        let x = &e.args[0];
        let plan = pool_plan(name, &x.shape, &out.shape, nhwc)?;
        let step = WindowStep::Pool {
            kind,
            dtype: code,
            plan,
            geo,
            count_include_pad,
        };
        Ok::<_, crate::Error>(Some((step, vec![layout_order(4, nhwc)], nhwc)))
    };
    let float_code = || match dtype {
        DType::F64 => rt::POOL_F64,
        _ => rt::POOL_F32,
    };
    match &e.op {
        Op::Conv { conv, .. } => {
            floats(name)?;
            same_dtypes()?;
            batched(conv.spatial())?;
            let (x, w) = (&e.args[0], &e.args[1]);
            let geo = conv.geometry(w.shape.get(2..).unwrap_or(&[]))?;
            let dims = conv_plan(name, &x.shape, &w.shape, &out.shape, &geo)?;
            let rank = x.shape.len();
            let w_order = match weight_order(&dims, nhwc, dtype == DType::F32) {
                WeightOrder::Nchw => layout_order(rank, false),
                WeightOrder::Nhwc => layout_order(rank, true),
                // [kH, kW, Cin, Cout], or [kW, Cin, Cout] for a 1-d convolution
                WeightOrder::Taps if rank == 4 => vec![2, 3, 1, 0],
                WeightOrder::Taps => vec![2, 1, 0],
            };
            let orders = vec![layout_order(rank, nhwc), w_order, vec![0]];
            Ok(Some((WindowStep::Conv { dims, nhwc }, orders, nhwc)))
        }
        Op::MaxPool2d { pool: attrs } => {
            same_dtypes()?;
            batched(2)?;
            let Some(code) = element_code(dtype) else {
                bail!(
                    Unsupported,
                    "aot: the library op {name} is not compiled for {dtype}"
                );
            };
            pool(
                rt::POOL_MAX,
                geometry(name, &attrs.geometry()?)?,
                false,
                code,
            )
        }
        Op::AvgPool2d {
            pool: attrs,
            count_include_pad,
        } => {
            floats(name)?;
            same_dtypes()?;
            batched(2)?;
            let geo = geometry(name, &attrs.geometry()?)?;
            pool(rt::POOL_AVG, geo, *count_include_pad, float_code())
        }
        Op::AdaptiveAvgPool2d { .. } => {
            floats(name)?;
            same_dtypes()?;
            batched(2)?;
            let geo = Geometry {
                kernel: [1, 1],
                stride: [1, 1],
                padding: [0, 0],
                dilation: [1, 1],
            };
            pool(rt::POOL_ADAPTIVE_AVG, geo, false, float_code())
        }
        _ => Ok(None),
    }
}

/// The code of the element type max pooling reads in a plan.
fn element_code(d: DType) -> Option<u64> {
    Some(match d {
        DType::F32 => rt::POOL_F32,
        DType::F64 => rt::POOL_F64,
        DType::F16 => rt::POOL_F16,
        DType::BF16 => rt::POOL_BF16,
        DType::U8 => rt::POOL_U8,
        DType::I8 => rt::POOL_I8,
        DType::I16 => rt::POOL_I16,
        DType::I32 => rt::POOL_I32,
        DType::I64 => rt::POOL_I64,
        DType::Bool => return None,
    })
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

/// Appends the words of the window step `c` of `e`, whose operands [`prepare`] conformed.
pub(super) fn window_words(s: &Schedule, e: &ExternCall, c: &WindowStep, w: &mut Vec<u64>) {
    match c {
        WindowStep::Conv { dims: d, nhwc } => {
            let dtype = match s.buffers[e.out].dtype {
                DType::F64 => rt::CONV_F64,
                _ => rt::CONV_F32,
            };
            w.extend([rt::STEP_CONV, dtype, u64::from(*nhwc)]);
            w.extend(
                [
                    d.n, d.c, d.h, d.w, d.co, d.oh, d.ow, d.kh, d.kw, d.sh, d.sw, d.ph, d.pw, d.dh,
                    d.dw, d.g,
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
        }
        WindowStep::Pool {
            kind,
            dtype,
            plan: p,
            geo: g,
            count_include_pad,
        } => {
            w.extend([rt::STEP_POOL, *kind, *dtype, u64::from(p.nhwc)]);
            w.extend([p.n, p.c, p.h, p.w, p.oh, p.ow].map(|x| x as u64));
            w.extend(
                [g.kernel, g.stride, g.padding, g.dilation]
                    .iter()
                    .flatten()
                    .map(|&x| x as u64),
            );
            w.push(u64::from(*count_include_pad));
            w.extend([e.args[0].buffer as u64, e.args[0].offset as u64]);
        }
    }
    w.push(e.out as u64);
}
