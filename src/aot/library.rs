//! The data-movement library ops of a compiled model as the plan's copy steps
//! ([`smelt_rt::copy`]): `cat` and `stack` copy each operand into its slice of the result,
//! `repeat` copies from a view whose repeated dims have stride 0, `flip` from a view with
//! negative strides, `embedding`, `index_select` and `gather` copy through their index,
//! `contiguous` (which `super::windows` adds to put operands in a kernel's order) copies a
//! view, and `scatter`, `scatter_add` and `index_add` copy the operand, then write or add
//! the source through their index ([`smelt_rt::copy::scatter`]).

use crate::ir::dtype::DType;
use crate::ir::op::Op;
use crate::ir::shape::wrap_dim;
use crate::kernel::{ExternCall, Schedule, View};
use crate::{Result, bail};
use smelt_rt::copy::MAX_RANK;
use smelt_rt::model as rt;

/// One side of a copy: a buffer, an element offset and strides over the walk.
#[derive(Clone)]
struct Side {
    buffer: usize,
    offset: isize,
    strides: Vec<isize>,
}

impl Side {
    fn of(v: &View) -> Side {
        Side {
            buffer: v.buffer,
            offset: v.offset as isize,
            strides: v.strides.iter().map(|&s| s as isize).collect(),
        }
    }
}

/// The index of an indexed copy.
struct Indexed {
    side: Side,
    wide: bool,
    size: usize,
    step: isize,
}

/// One copy step.
struct CopyStep {
    shape: Vec<usize>,
    dst: Side,
    src: Side,
    index: Option<Indexed>,
    /// A scatter (the index picks destination elements) and its accumulation word
    /// ([`rt::SCATTER_ADD_F16`].., 0 to write); `None` for a copy.
    into: Option<u64>,
}

/// Whether the copy steps express `op`.
pub(super) fn lowers(op: &Op) -> bool {
    matches!(
        op,
        Op::Cat { .. }
            | Op::Stack { .. }
            | Op::Repeat { .. }
            | Op::Flip { .. }
            | Op::IndexSelect { .. }
            | Op::Gather { .. }
            | Op::Embedding
            | Op::Contiguous
            | Op::Scatter { .. }
            | Op::ScatterAdd { .. }
            | Op::ScatterReduce { .. }
            | Op::IndexAdd { .. }
    )
}

/// Appends the words of `e`'s copy steps to `w`; returns how many steps they are.
pub(super) fn copy_words(s: &Schedule, e: &ExternCall, w: &mut Vec<u64>) -> Result<usize> {
    let out = &s.buffers[e.out];
    let dst = Side {
        buffer: e.out,
        offset: 0,
        strides: out.strides().iter().map(|&x| x as isize).collect(),
    };
    let steps = copies(s, e, &out.shape, dst)?;
    let size = out.dtype.size() as u64;
    for c in &steps {
        // a copy step moves elements, it does not convert them
        let from = s.buffers[c.src.buffer].dtype;
        if from != out.dtype {
            bail!(
                Unsupported,
                "aot: {} of a {from} operand into a {} result",
                e.op.name(),
                out.dtype
            );
        }
        if c.shape.len() > MAX_RANK {
            bail!(
                Unsupported,
                "aot: {} walks {} dims, more than the {MAX_RANK} a copy step takes",
                e.op.name(),
                c.shape.len()
            );
        }
        let kind = match &c.index {
            None => rt::INDEX_NONE,
            Some(i) if i.wide => rt::INDEX_I64,
            Some(_) => rt::INDEX_I32,
        };
        let tag = match c.into {
            Some(_) => rt::STEP_SCATTER,
            None => rt::STEP_COPY,
        };
        w.extend([tag, size, c.shape.len() as u64]);
        w.extend([c.dst.buffer as u64, c.dst.offset as u64]);
        w.extend([c.src.buffer as u64, c.src.offset as u64, kind]);
        w.extend(c.into);
        w.extend(c.shape.iter().map(|&d| d as u64));
        w.extend(c.dst.strides.iter().map(|&x| x as u64));
        w.extend(c.src.strides.iter().map(|&x| x as u64));
        if let Some(i) = &c.index {
            w.extend([i.side.buffer as u64, i.side.offset as u64]);
            w.extend([i.size as u64, i.step as u64]);
            w.extend(i.side.strides.iter().map(|&x| x as u64));
        }
    }
    Ok(steps.len())
}

/// The copies that compute `e` into `dst` (the result buffer, of shape `shape`).
fn copies(s: &Schedule, e: &ExternCall, shape: &[usize], dst: Side) -> Result<Vec<CopyStep>> {
    let a = &e.args;
    Ok(match &e.op {
        Op::Cat { dim } => {
            let d = wrap_dim(*dim, shape.len())?;
            let mut at = 0;
            let mut steps = Vec::new();
            // a 1-D empty operand joins any cat (PyTorch's legacy rule): it adds nothing
            for v in a.iter().filter(|v| v.shape.iter().product::<usize>() > 0) {
                steps.push(CopyStep {
                    shape: v.shape.clone(),
                    dst: Side {
                        offset: at * dst.strides[d],
                        ..dst.clone()
                    },
                    src: Side::of(v),
                    index: None,
                    into: None,
                });
                at += v.shape[d] as isize;
            }
            steps
        }
        Op::Stack { dim } => {
            let d = wrap_dim(*dim, shape.len())?;
            let mut strides = dst.strides.clone();
            let step = strides.remove(d);
            a.iter()
                .enumerate()
                .map(|(i, v)| CopyStep {
                    shape: v.shape.clone(),
                    dst: Side {
                        buffer: dst.buffer,
                        offset: i as isize * step,
                        strides: strides.clone(),
                    },
                    src: Side::of(v),
                    index: None,
                    into: None,
                })
                .collect()
        }
        Op::Repeat { repeats } => vec![repeat(&a[0], repeats, shape, dst)?],
        Op::Contiguous => vec![CopyStep {
            shape: a[0].shape.clone(),
            dst,
            src: Side::of(&a[0]),
            index: None,
            into: None,
        }],
        Op::Flip { dims } => {
            let mut src = Side::of(&a[0]);
            for &d in dims {
                let d = wrap_dim(d, shape.len())?;
                if shape[d] > 0 {
                    src.offset += (shape[d] as isize - 1) * src.strides[d];
                    src.strides[d] = -src.strides[d];
                }
            }
            vec![CopyStep {
                shape: shape.to_vec(),
                dst,
                src,
                index: None,
                into: None,
            }]
        }
        Op::IndexSelect { dim } => {
            let (x, idx) = (&a[0], &a[1]);
            let d = wrap_dim(*dim, x.shape.len().max(1))?;
            let mut src = Side::of(x);
            let (size, step) = indexed_dim(&mut src, &x.shape, d);
            let mut istr = vec![0; shape.len()];
            if let (Some(s), Some(i)) = (istr.get_mut(d), idx.strides.first()) {
                *s = *i as isize;
            }
            vec![CopyStep {
                shape: shape.to_vec(),
                dst,
                src,
                index: Some(index_of(s, idx, istr, size, step)?),
                into: None,
            }]
        }
        Op::Gather { dim } => {
            let (x, idx) = (&a[0], &a[1]);
            let d = wrap_dim(*dim, x.shape.len().max(1))?;
            let mut src = Side::of(x);
            let (size, step) = indexed_dim(&mut src, &x.shape, d);
            let istr = Side::of(idx).strides;
            vec![CopyStep {
                shape: idx.shape.clone(),
                dst,
                src,
                index: Some(index_of(s, idx, istr, size, step)?),
                into: None,
            }]
        }
        Op::Embedding => {
            let (idx, wt) = (&a[0], &a[1]);
            let mut src = Side::of(wt);
            let (size, step) = indexed_dim(&mut src, &wt.shape, 0);
            src.strides = vec![0; idx.shape.len()];
            src.strides.push(wt.strides[1] as isize);
            let mut istr = Side::of(idx).strides;
            istr.push(0);
            vec![CopyStep {
                shape: shape.to_vec(),
                dst,
                src,
                index: Some(index_of(s, idx, istr, size, step)?),
                into: None,
            }]
        }
        Op::Scatter { dim }
        | Op::ScatterAdd { dim }
        | Op::ScatterReduce { dim, .. }
        | Op::IndexAdd { dim } => {
            let (x, idx, src) = (&a[0], &a[1], &a[2]);
            if x.shape.is_empty() {
                bail!(
                    Unsupported,
                    "aot: {} into a 0-d tensor is not compiled ahead of time yet",
                    e.op.name()
                );
            }
            let d = wrap_dim(*dim, x.shape.len())?;
            // the result starts as a copy of x
            let mut steps = vec![CopyStep {
                shape: x.shape.clone(),
                dst: dst.clone(),
                src: Side::of(x),
                index: None,
                into: None,
            }];
            let mut into = dst.clone();
            let (size, step) = indexed_dim(&mut into, &x.shape, d);
            let dtype = s.buffers[e.out].dtype;
            let add = match &e.op {
                Op::Scatter { .. } => 0,
                Op::ScatterReduce { reduce, .. } => {
                    use crate::ir::op::ScatterReduction as R;
                    use smelt_rt::copy::Combine;
                    let how = match reduce {
                        R::Sum => Combine::Sum,
                        R::Prod => Combine::Prod,
                        R::Amax => Combine::Amax,
                        R::Amin => Combine::Amin,
                        // `aot::compile` writes a mean as a sum and a count
                        R::Mean => bail!(
                            Unsupported,
                            "aot: a scatter_reduce mean is compiled as a sum and a count"
                        ),
                    };
                    add_word(dtype) + 16 * how.code()
                }
                _ => add_word(dtype),
            };
            // scatter walks the index (reading src at the same points), index_add walks
            // src (its index runs along `dim` only)
            let (walk, istr) = match e.op {
                Op::IndexAdd { .. } => {
                    let mut istr = vec![0; src.shape.len()];
                    if let (Some(s), Some(i)) = (istr.get_mut(d), idx.strides.first()) {
                        *s = *i as isize;
                    }
                    (src.shape.clone(), istr)
                }
                _ => (idx.shape.clone(), Side::of(idx).strides),
            };
            let mut from = Side::of(src);
            from.strides.truncate(walk.len());
            into.strides.truncate(walk.len());
            steps.push(CopyStep {
                shape: walk,
                dst: into,
                src: from,
                index: Some(index_of(s, idx, istr, size, step)?),
                into: Some(add),
            });
            steps
        }
        op => bail!(
            Unsupported,
            "aot: the library op {} is not a copy step",
            op.name()
        ),
    })
}

/// Appends the words of `e`, a `cumsum`, as a scan step.
pub(super) fn scan_words(s: &Schedule, e: &ExternCall, w: &mut Vec<u64>) -> Result<()> {
    let Op::Cumsum { dim } = &e.op else {
        bail!(Value, "aot: {} is not a running sum", e.op.name());
    };
    let x = &e.args[0];
    let out = &s.buffers[e.out];
    if x.shape.len() > MAX_RANK {
        bail!(Unsupported, "aot: cumsum over more than {MAX_RANK} dims");
    }
    let dim = match x.shape.len() {
        0 => 0,
        n => wrap_dim(*dim, n)?,
    };
    let code = crate::kernels::reduce::elem_type(s.buffers[x.buffer].dtype).code();
    w.extend([rt::STEP_SCAN, code, x.shape.len() as u64, dim as u64]);
    w.extend([e.out as u64, 0, x.buffer as u64, x.offset as u64]);
    w.extend(x.shape.iter().map(|&d| d as u64));
    w.extend(out.strides().iter().map(|&st| st as u64));
    w.extend(x.strides.iter().map(|&st| st as u64));
    Ok(())
}

/// Appends the words of `e`, a `dropout`, as a dropout step: in training its mask is drawn
/// anew each call of the model (the object counts its calls); otherwise every element is
/// kept, unscaled.
pub(super) fn dropout_words(s: &Schedule, e: &ExternCall, w: &mut Vec<u64>) -> Result<()> {
    let Op::Dropout { p, training, seed } = &e.op else {
        bail!(Value, "aot: {} is not a dropout", e.op.name());
    };
    let x = &e.args[0];
    let out = &s.buffers[e.out];
    if x.shape.len() > MAX_RANK {
        bail!(Unsupported, "aot: dropout over more than {MAX_RANK} dims");
    }
    if !out.dtype.is_float() || out.dtype != s.buffers[x.buffer].dtype {
        bail!(
            DType,
            "aot: dropout of {} into {}",
            s.buffers[x.buffer].dtype,
            out.dtype
        );
    }
    let p = if *training { p.get() } else { 0.0 };
    let code = crate::kernels::reduce::elem_type(out.dtype).code();
    w.extend([
        rt::STEP_DROPOUT,
        code,
        p.to_bits(),
        *seed,
        x.shape.len() as u64,
    ]);
    w.extend([e.out as u64, 0, x.buffer as u64, x.offset as u64]);
    w.extend(x.shape.iter().map(|&d| d as u64));
    w.extend(out.strides().iter().map(|&st| st as u64));
    w.extend(x.strides.iter().map(|&st| st as u64));
    Ok(())
}

/// The accumulation word of a scatter that adds elements of `d`.
fn add_word(d: DType) -> u64 {
    rt::SCATTER_ADD_F16 + crate::kernels::reduce::elem_type(d).code()
}

/// `repeat`: the result viewed as `[r0, x0, r1, x1, ...]` (pairs with a 1 dropped) read from
/// the operand with stride 0 along each `r`.
fn repeat(x: &View, repeats: &[usize], shape: &[usize], dst: Side) -> Result<CopyStep> {
    let Some(lead) = repeats.len().checked_sub(x.shape.len()) else {
        bail!(
            Shape,
            "aot: repeat of a {}-d operand with {} repeats",
            x.shape.len(),
            repeats.len()
        );
    };
    let (mut walk, mut ds, mut ss) = (Vec::new(), Vec::new(), Vec::new());
    for (j, &r) in repeats.iter().enumerate() {
        let (n, xs) = match j.checked_sub(lead) {
            Some(k) => (x.shape[k], x.strides[k] as isize),
            None => (1, 0),
        };
        let os = dst.strides[j];
        debug_assert_eq!(shape[j], r * n);
        if r != 1 {
            walk.push(r);
            ds.push(os * n as isize);
            ss.push(0);
        }
        if n != 1 || r == 1 {
            walk.push(n);
            ds.push(os);
            ss.push(xs);
        }
    }
    Ok(CopyStep {
        shape: walk,
        dst: Side { strides: ds, ..dst },
        src: Side {
            buffer: x.buffer,
            offset: x.offset as isize,
            strides: ss,
        },
        index: None,
        into: None,
    })
}

/// Takes dim `d` out of `src`'s walk (stride 0); returns its size and stride (1 and 0 for
/// a 0-d operand, as the eager kernel reads one).
fn indexed_dim(src: &mut Side, shape: &[usize], d: usize) -> (usize, isize) {
    let size = shape.get(d).copied().unwrap_or(1);
    let step = src.strides.get(d).copied().unwrap_or(0);
    if let Some(s) = src.strides.get_mut(d) {
        *s = 0;
    }
    (size, step)
}

fn index_of(
    s: &Schedule,
    idx: &View,
    strides: Vec<isize>,
    size: usize,
    step: isize,
) -> Result<Indexed> {
    let wide = match s.buffers[idx.buffer].dtype {
        DType::I64 => true,
        DType::I32 => false,
        d => bail!(DType, "aot: an index of {d} (int32 and int64 are)"),
    };
    Ok(Indexed {
        side: Side {
            buffer: idx.buffer,
            offset: idx.offset as isize,
            strides,
        },
        wide,
        size,
        step,
    })
}
