//! A reference interpreter of the kernel IR, so fusion is testable before any machine code
//! exists.
//!
//! It evaluates each kernel value over the whole index space at once, as a tensor, by calling
//! the eager op of that value (`runtime::apply`): the scalar semantics are the eager kernels'
//! own, never redefined here. Loads and stores are strided views of the buffers, built from
//! the index maps; a value of outer level is a tensor of shape `outer ++ [1; inner]` that
//! broadcasts over the row. Reductions run the eager reduction over the flattened inner
//! space. Extern calls run the eager op (`matmul` for GEMMs) on views of their operands.
//!
//! `crate::runtime::interp::run` is the oracle the interpreter is compared against: every node of a graph
//! evaluated eagerly in topological order.

use super::{
    Buffer, BufferKind, Combiner, Expr, ExternCall, IndexMap, Kernel, Level, Schedule, Step, View,
};
use crate::ir::op::{Op, ReduceOp, TensorType};
use crate::ir::shape::numel;
use crate::ir::text::fmt_type;
use crate::runtime::kernels::copy;
use crate::runtime::layout::{Layout, check_no_overlap};
use crate::runtime::{Tensor, apply};
use crate::{Result, bail};

/// Runs `s` on `inputs` (one tensor per graph input) and returns the graph outputs.
pub fn run(s: &Schedule, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    // a reference backend: the eager kernels' float64 formulas, not their native f32 paths
    let _reference = crate::runtime::native::ReferenceMode::enter();
    s.validate()?;
    if inputs.len() != s.inputs.len() {
        bail!(
            Value,
            "schedule {} takes {} inputs, but {} were given",
            s.name,
            s.inputs.len(),
            inputs.len()
        );
    }
    let mut bufs: Vec<Option<Tensor>> = vec![None; s.buffers.len()];
    for (i, b) in s.buffers.iter().enumerate() {
        bufs[i] = match &b.kind {
            BufferKind::Input(k) => Some(bind_input(b, inputs.get(*k))?),
            BufferKind::Constant(lit) => Some(apply(Op::Constant(lit.clone()), &[])?),
            BufferKind::Temp => None,
        };
    }
    for step in &s.steps {
        run_step(s, step, &mut bufs)?;
    }
    s.outputs.iter().map(|v| view_of(&bufs, v)).collect()
}

/// Runs one step of `s` on its buffers (`bufs[i]` holds buffer `i`, contiguous, or `None`
/// while unwritten). A kernel writes into the tensors already there (allocating missing
/// ones); an extern call replaces its output buffer with the eager result.
pub fn run_step(s: &Schedule, step: &Step, bufs: &mut [Option<Tensor>]) -> Result<()> {
    let _reference = crate::runtime::native::ReferenceMode::enter();
    if bufs.len() != s.buffers.len() {
        bail!(
            Value,
            "schedule {}: {} buffers given for {}",
            s.name,
            bufs.len(),
            s.buffers.len()
        );
    }
    match step {
        Step::Kernel(k) => run_kernel(s, k, bufs),
        Step::Extern(e) => {
            let args: Vec<Tensor> = e
                .args
                .iter()
                .map(|v| view_of(bufs, v))
                .collect::<Result<_>>()?;
            bufs[e.out] = Some(run_extern(s, e, &args, None)?);
            Ok(())
        }
        Step::Control(c) => {
            let args: Vec<Tensor> = c
                .args
                .iter()
                .map(|v| view_of(bufs, v))
                .collect::<Result<_>>()?;
            let bodies = crate::runtime::interp::ReferenceBodies(&c.control);
            let results = crate::runtime::control::run(&c.control, &args, &bodies)?;
            for (r, out) in results.into_iter().zip(&c.outs) {
                if let Some(b) = out {
                    bufs[*b] = Some(s.buffers[*b].conform(&r)?);
                }
            }
            Ok(())
        }
    }
}

/// Runs extern call `e` of `s` on the eager reference kernels: `args` are host tensors of its
/// operand views, `ty` its result type when the caller knows it already. The result must fit
/// the call's output buffer; it comes back contiguous. The one extern-call runner of the
/// interpreter and of both executors (the CUDA one runs it on host copies where cuBLAS
/// does not apply).
pub fn run_extern(
    s: &Schedule,
    e: &ExternCall,
    args: &[Tensor],
    ty: Option<&TensorType>,
) -> Result<Tensor> {
    let refs: Vec<&Tensor> = args.iter().collect();
    let ty = match ty {
        Some(t) => t.clone(),
        None => {
            let types: Vec<TensorType> = args.iter().map(Tensor::ttype).collect();
            e.op.infer(&types.iter().collect::<Vec<_>>())?
        }
    };
    let b = &s.buffers[e.out];
    if ty.dtype != b.dtype || ty.shape != b.shape {
        bail!(
            Value,
            "extern {}: result {} does not fit b{}",
            e.op.name(),
            fmt_type(&ty),
            e.out
        );
    }
    let r = crate::runtime::kernels::eval(&e.op, &refs, &ty)?;
    b.conform(&r)
}

fn bind_input(b: &Buffer, t: Option<&Tensor>) -> Result<Tensor> {
    let Some(t) = t else {
        bail!(Value, "missing input %{}", b.name)
    };
    if t.dtype() != b.dtype || t.shape() != b.shape.as_slice() {
        bail!(
            Value,
            "input %{}: expected {}{:?}, got {}{:?}",
            b.name,
            b.dtype,
            b.shape,
            t.dtype(),
            t.shape()
        );
    }
    b.conform(t)
}

/// The buffer's tensor and the storage offset of its element 0.
fn base(bufs: &[Option<Tensor>], b: usize) -> Result<(&Tensor, usize)> {
    match bufs.get(b).and_then(Option::as_ref) {
        Some(t) => Ok((t, t.storage_offset())),
        None => bail!(Value, "schedule: b{b} is read before it is written"),
    }
}

fn view_of(bufs: &[Option<Tensor>], v: &View) -> Result<Tensor> {
    let (t, off) = base(bufs, v.buffer)?;
    Ok(t.with_layout(Layout {
        shape: v.shape.clone(),
        strides: v.strides.clone(),
        offset: off + v.offset,
    }))
}

/// The buffer seen through `map` over `shape` (validated to stay inside it).
fn mapped(bufs: &[Option<Tensor>], b: usize, map: &IndexMap, shape: &[usize]) -> Result<Tensor> {
    let (t, off) = base(bufs, b)?;
    Ok(t.with_layout(Layout {
        shape: shape.to_vec(),
        strides: map.strides.clone(),
        offset: off + map.offset,
    }))
}

fn run_kernel(s: &Schedule, k: &Kernel, bufs: &mut [Option<Tensor>]) -> Result<()> {
    let space = k.space();
    let mut row_shape = k.outer.clone();
    row_shape.resize(space.len(), 1);
    let levels = k.levels();
    let shape_of = |l: Level| {
        if l == Level::Outer {
            &row_shape
        } else {
            &space
        }
    };
    let mut vals: Vec<Tensor> = Vec::with_capacity(k.values.len());
    for (i, v) in k.values.iter().enumerate() {
        let shape = shape_of(levels[i]);
        let t = match &v.expr {
            Expr::Load { buffer, map } => mapped(bufs, *buffer, map, shape)?,
            Expr::Index { map } => positions(map, shape)?,
            Expr::Const(c) => apply(
                Op::Full {
                    size: vec![],
                    fill_value: *c,
                    dtype: Some(v.dtype),
                },
                &[],
            )?,
            Expr::Unary(u, a) => apply(Op::Unary(*u), &[&vals[*a]])?,
            Expr::Binary(b, x, y) => apply(Op::Binary(*b), &[&vals[*x], &vals[*y]])?,
            Expr::Where(c, a, b) => apply(Op::Where, &[&vals[*c], &vals[*a], &vals[*b]])?,
            Expr::Clamp { x, min, max } => apply(
                Op::Clamp {
                    min: *min,
                    max: *max,
                },
                &[&vals[*x]],
            )?,
            Expr::Cast(a) => apply(Op::To { dtype: v.dtype }, &[&vals[*a]])?,
            Expr::MaskedFill { x, mask, value } => {
                apply(Op::MaskedFill { value: *value }, &[&vals[*x], &vals[*mask]])?
            }
            Expr::Reduce { combiner, arg, .. } => reduce(k, *combiner, &vals[*arg], &row_shape)?,
        };
        if t.dtype() != v.dtype {
            bail!(
                Value,
                "kernel {}: v{i} computes {} but is declared {}",
                k.name,
                t.dtype(),
                v.dtype
            );
        }
        vals.push(t);
    }
    for st in &k.stores {
        let shape = if st.map.ignores_from(k.outer.len()) {
            &row_shape
        } else {
            &space
        };
        let b = &s.buffers[st.buffer];
        if bufs[st.buffer].is_none() {
            let t = Tensor::alloc(b.dtype, &b.shape)?;
            bufs[st.buffer] = Some(t.with_layout(b.layout()));
        }
        let dst = mapped(bufs, st.buffer, &st.map, shape)?;
        check_no_overlap(dst.layout())?;
        let src = vals[st.value].clone();
        if src.shape() != dst.shape() {
            let size: Vec<i64> = dst.shape().iter().map(|&n| n as i64).collect();
            copy::copy_into(&dst, &apply(Op::Expand { size }, &[&src])?);
        } else {
            copy::copy_into(&dst, &src);
        }
    }
    Ok(())
}

/// An i64 tensor of `map(i)` over `shape`.
fn positions(map: &IndexMap, shape: &[usize]) -> Result<Tensor> {
    let n = numel(shape);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        let p: usize = map.offset
            + idx
                .iter()
                .zip(&map.strides)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        out.push(p as i64);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Tensor::from_vec(out, shape)
}

/// `combiner` over the inner space of `arg`, as a tensor of shape `row_shape`.
fn reduce(k: &Kernel, combiner: Combiner, arg: &Tensor, row_shape: &[usize]) -> Result<Tensor> {
    let space = k.space();
    let size: Vec<i64> = space.iter().map(|&n| n as i64).collect();
    let full = apply(Op::Expand { size }, &[arg])?;
    let mut flat: Vec<i64> = k.outer.iter().map(|&n| n as i64).collect();
    flat.push(numel(&k.inner) as i64);
    let rows = apply(Op::Reshape { shape: flat }, &[&full])?;
    let op = |op| Op::Reduce {
        op,
        dim: Some(vec![-1]),
        keepdim: true,
    };
    let r = match combiner {
        Combiner::Sum => op(ReduceOp::Sum),
        Combiner::Mean => op(ReduceOp::Mean),
        Combiner::Prod => op(ReduceOp::Prod),
        Combiner::Max => op(ReduceOp::Amax),
        Combiner::Min => op(ReduceOp::Amin),
        Combiner::All => op(ReduceOp::All),
        Combiner::Any => op(ReduceOp::Any),
        Combiner::ArgMax => Op::ArgMax {
            dim: Some(-1),
            keepdim: true,
        },
        Combiner::ArgMin => Op::ArgMin {
            dim: Some(-1),
            keepdim: true,
        },
    };
    let r = apply(r, &[&rows])?;
    let shape: Vec<i64> = row_shape.iter().map(|&n| n as i64).collect();
    apply(Op::Reshape { shape }, &[&r])
}
