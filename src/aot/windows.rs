//! Convolutions and pooling of a compiled model as the plan's conv and pool steps
//! ([`smelt_rt::conv`], [`smelt_rt::pool`]: the kernels the JIT runs, so the results agree
//! bit for bit).
//!
//! The kernels read dense operands in one order each: the input and the output in NCHW, or
//! NHWC where the JIT would choose it (a channels_last input), a convolution's weights in
//! the order [`weight_order_on`] names for the target (the register tiles' order only where
//! its CPU runs them, as `smelt_rt::conv::forward` decides there). [`prepare`] puts every
//! operand there before the plan is
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
use smelt_rt::conv::{Dims, WeightOrder, weight_order_on};
use smelt_rt::model as rt;
use smelt_rt::pool::{Geometry, Plan};
use std::sync::Arc;

/// A convolution or pooling step as [`prepare`] laid it out.
#[derive(Clone, Copy, Debug)]
pub(super) enum WindowStep {
    /// A convolution or one of its gradients.
    Conv {
        /// Which ([`rt::CONV_FORWARD`]..).
        kind: u64,
        /// Its sizes.
        dims: Dims,
        /// Whether it runs in NHWC.
        nhwc: bool,
    },
    /// A pooling or one of its gradients.
    Pool {
        /// Which ([`rt::POOL_MAX`]..).
        kind: u64,
        /// The element type of the input of a max pooling ([`rt::POOL_F32`]..).
        x_dtype: u64,
        /// Its sizes and layout.
        plan: Plan,
        /// Its window.
        geo: Geometry,
        /// Whether padded zeros count in an average's divisor.
        count_include_pad: bool,
    },
}

/// A window op found in a schedule: its step, the order each operand must lie in and the
/// order of its result.
struct Found {
    step: WindowStep,
    orders: Vec<Vec<usize>>,
    out_order: Vec<usize>,
}

/// Conforms the operands of every convolution and pooling of `s` to its kernel's orders
/// (inserting copy steps); returns, per step of the new schedule, the window op it runs.
pub(super) fn prepare(s: &mut Schedule, tiles: bool) -> Result<Vec<Option<WindowStep>>> {
    let mut steps = Vec::with_capacity(s.steps.len());
    let mut found = Vec::with_capacity(s.steps.len());
    for step in std::mem::take(&mut s.steps) {
        let Step::Extern(mut e) = step else {
            steps.push(step);
            found.push(None);
            continue;
        };
        let Some(f) = problem(s, &e, tiles)? else {
            steps.push(Step::Extern(e));
            found.push(None);
            continue;
        };
        let mut before = Vec::new();
        for (a, order) in e.args.iter_mut().zip(&f.orders) {
            *a = conform(s, a, order, &mut before);
        }
        for c in before {
            steps.push(Step::Extern(c));
            found.push(None);
        }
        // the result: straight into its buffer when that has the kernel's order
        let out = s.buffers[e.out].clone();
        let want = strides_for(&out.shape, &f.out_order);
        if dense_as(&out.shape, &out.strides(), &want) {
            steps.push(Step::Extern(e));
            found.push(Some(f.step));
            continue;
        }
        let y = add_buffer(
            s,
            &out,
            permuted(&out.shape, &f.out_order),
            BufferKind::Temp,
        );
        let final_out = std::mem::replace(&mut e.out, y);
        steps.push(Step::Extern(e));
        found.push(Some(f.step));
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

/// Whether the tensor `v` views would take the NHWC kernels, as the JIT decides.
fn prefers_nhwc_view(v: &View) -> bool {
    prefers_nhwc_layout(&Layout {
        shape: v.shape.clone(),
        strides: v.strides.clone(),
        offset: v.offset,
    })
}

/// `e`'s window op; `None` for any other op.
fn problem(s: &Schedule, e: &ExternCall, tiles: bool) -> Result<Option<Found>> {
    let out = &s.buffers[e.out];
    let dtype = out.dtype;
    let name = e.op.name();
    let refuse = |d: DType| -> crate::Error {
        crate::Error::Unsupported(format!(
            "aot: the library op {name} takes floating-point operands, not {d}"
        ))
    };
    let floats = |d: DType| d.is_float();
    // every operand in the result's dtype (a max pooling's input aside), a float one
    // unless `any`
    let dtypes = |skip: Option<usize>, any: bool| -> Result<()> {
        if !any && !floats(dtype) {
            return Err(refuse(dtype));
        }
        if e.args.is_empty() {
            bail!(Value, "aot: {name} without operands");
        }
        for (i, a) in e.args.iter().enumerate() {
            let d = s.buffers[a.buffer].dtype;
            if Some(i) != skip && d != dtype {
                if floats(dtype) && !floats(d) {
                    return Err(refuse(d));
                }
                bail!(DType, "aot: {name} operands of different dtypes");
            }
        }
        Ok(())
    };
    let rank_of = |v: &View, spatial: usize| {
        if v.shape.len() != spatial + 2 || out.shape.len() != spatial + 2 {
            bail!(
                Unsupported,
                "aot: an unbatched {name} is not compiled ahead of time yet"
            );
        }
        Ok(spatial + 2)
    };
    let conv = |kind: u64, dims: Dims, nhwc: bool, orders, out_order| {
        Ok(Some(Found {
            step: WindowStep::Conv { kind, dims, nhwc },
            orders,
            out_order,
        }))
    };
    // a pooling whose operands and result all lie in the order `nhwc` names
    let pool = |kind: u64, x_dtype: u64, plan: Plan, geo: Geometry, cip: bool| {
        let order = layout_order(4, plan.nhwc);
        Ok(Some(Found {
            step: WindowStep::Pool {
                kind,
                x_dtype,
                plan,
                geo,
                count_include_pad: cip,
            },
            orders: vec![order.clone(); e.args.len()],
            out_order: order,
        }))
    };
    let no_window = Geometry {
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
    };
    // (the averages ignore it: their input has the result's dtype)
    let own_code = |d: DType| element_code(d).unwrap_or(rt::POOL_F32);
    match &e.op {
        Op::Conv { conv: attrs, .. } => {
            dtypes(None, false)?;
            let (x, w) = (&e.args[0], &e.args[1]);
            let rank = rank_of(x, attrs.spatial())?;
            let geo = attrs.geometry(w.shape.get(2..).unwrap_or(&[]))?;
            let dims = conv_plan(name, &x.shape, &w.shape, &out.shape, &geo)?;
            let nhwc = prefers_nhwc_view(x);
            // the halves compute in f32, and take the f32 kernels' orders
            let w_order = match weight_order_on(&dims, nhwc, dtype != DType::F64, tiles) {
                WeightOrder::Nchw => layout_order(rank, false),
                WeightOrder::Nhwc => layout_order(rank, true),
                // [kH, kW, Cin, Cout], or [kW, Cin, Cout] for a 1-d convolution
                WeightOrder::Taps if rank == 4 => vec![2, 3, 1, 0],
                WeightOrder::Taps => vec![2, 1, 0],
            };
            let x_order = layout_order(rank, nhwc);
            let orders = vec![x_order.clone(), w_order, vec![0]];
            conv(rt::CONV_FORWARD, dims, nhwc, orders, x_order)
        }
        Op::ConvInputGrad { conv: attrs, .. } => {
            dtypes(None, false)?;
            let (gy, w) = (&e.args[0], &e.args[1]);
            let rank = rank_of(gy, attrs.spatial())?;
            let geo = attrs.geometry(w.shape.get(2..).unwrap_or(&[]))?;
            let dims = conv_plan(name, &out.shape, &w.shape, &gy.shape, &geo)?;
            let nhwc = prefers_nhwc_view(gy);
            let order = layout_order(rank, nhwc);
            let w_order = layout_order(rank, nhwc && !dims.depthwise());
            conv(
                rt::CONV_INPUT_GRAD,
                dims,
                nhwc,
                vec![order.clone(), w_order],
                order,
            )
        }
        Op::ConvWeightGrad {
            conv: attrs,
            weight_size,
        } => {
            dtypes(None, false)?;
            let (gy, x) = (&e.args[0], &e.args[1]);
            let rank = rank_of(x, attrs.spatial())?;
            let geo = attrs.geometry(weight_size.get(2..).unwrap_or(&[]))?;
            let dims = conv_plan(name, &x.shape, &out.shape, &gy.shape, &geo)?;
            let nhwc = prefers_nhwc_view(x);
            let order = layout_order(rank, nhwc);
            let orders = vec![order.clone(), order];
            conv(
                rt::CONV_WEIGHT_GRAD,
                dims,
                nhwc,
                orders,
                layout_order(rank, false),
            )
        }
        Op::MaxPool2d { pool: attrs } => {
            dtypes(None, true)?;
            rank_of(&e.args[0], 2)?;
            let Some(code) = element_code(dtype) else {
                bail!(
                    Unsupported,
                    "aot: the library op {name} is not compiled for {dtype}"
                );
            };
            let x = &e.args[0];
            let plan = pool_plan(name, &x.shape, &out.shape, prefers_nhwc_view(x))?;
            pool(
                rt::POOL_MAX,
                code,
                plan,
                geometry(name, &attrs.geometry()?)?,
                false,
            )
        }
        Op::MaxPool2dGrad { pool: attrs } => {
            // the gradient in the result's (float) dtype; the input in any
            dtypes(Some(1), false)?;
            let (gy, x) = (&e.args[0], &e.args[1]);
            rank_of(x, 2)?;
            let xd = s.buffers[x.buffer].dtype;
            let Some(code) = element_code(xd) else {
                bail!(
                    Unsupported,
                    "aot: the library op {name} is not compiled for {xd}"
                );
            };
            let plan = pool_plan(name, &x.shape, &gy.shape, prefers_nhwc_view(x))?;
            let geo = geometry(name, &attrs.geometry()?)?;
            pool(rt::POOL_MAX_GRAD, code, plan, geo, false)
        }
        Op::AvgPool2d {
            pool: attrs,
            count_include_pad,
        } => {
            dtypes(None, false)?;
            let x = &e.args[0];
            rank_of(x, 2)?;
            let plan = pool_plan(name, &x.shape, &out.shape, prefers_nhwc_view(x))?;
            let geo = geometry(name, &attrs.geometry()?)?;
            pool(rt::POOL_AVG, own_code(dtype), plan, geo, *count_include_pad)
        }
        Op::AvgPool2dGrad {
            pool: attrs,
            count_include_pad,
            ..
        } => {
            dtypes(None, false)?;
            let gy = &e.args[0];
            rank_of(gy, 2)?;
            let plan = pool_plan(name, &out.shape, &gy.shape, prefers_nhwc_view(gy))?;
            let geo = geometry(name, &attrs.geometry()?)?;
            pool(
                rt::POOL_AVG_GRAD,
                own_code(dtype),
                plan,
                geo,
                *count_include_pad,
            )
        }
        Op::AdaptiveAvgPool2d { .. } => {
            dtypes(None, false)?;
            let x = &e.args[0];
            rank_of(x, 2)?;
            let plan = pool_plan(name, &x.shape, &out.shape, prefers_nhwc_view(x))?;
            pool(
                rt::POOL_ADAPTIVE_AVG,
                own_code(dtype),
                plan,
                no_window,
                false,
            )
        }
        Op::AdaptiveAvgPool2dGrad { .. } => {
            dtypes(None, false)?;
            let gy = &e.args[0];
            rank_of(gy, 2)?;
            let plan = pool_plan(name, &out.shape, &gy.shape, prefers_nhwc_view(gy))?;
            pool(
                rt::POOL_ADAPTIVE_AVG_GRAD,
                own_code(dtype),
                plan,
                no_window,
                false,
            )
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
    let dtype = match s.buffers[e.out].dtype {
        DType::F64 => rt::FLOAT_F64,
        DType::F16 => rt::FLOAT_F16,
        DType::BF16 => rt::FLOAT_BF16,
        _ => rt::FLOAT_F32,
    };
    let operand = |i: usize| match e.args.get(i) {
        Some(v) => [v.buffer as u64, v.offset as u64],
        None => [rt::NO_BUFFER, 0],
    };
    match c {
        WindowStep::Conv {
            kind,
            dims: d,
            nhwc,
        } => {
            w.extend([rt::STEP_CONV, *kind, dtype, u64::from(*nhwc)]);
            w.extend(d.to_array().map(|x| x as u64));
            (0..3).for_each(|i| w.extend(operand(i)));
        }
        WindowStep::Pool {
            kind,
            x_dtype,
            plan: p,
            geo: g,
            count_include_pad,
        } => {
            w.extend([rt::STEP_POOL, *kind, dtype, *x_dtype, u64::from(p.nhwc)]);
            w.extend([p.n, p.c, p.h, p.w, p.oh, p.ow].map(|x| x as u64));
            w.extend(
                [g.kernel, g.stride, g.padding, g.dilation]
                    .iter()
                    .flatten()
                    .map(|&x| x as u64),
            );
            w.push(u64::from(*count_include_pad));
            (0..2).for_each(|i| w.extend(operand(i)));
        }
    }
    w.push(e.out as u64);
}
