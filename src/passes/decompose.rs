//! Decomposition of composite ops into the primitives the fuser understands (pointwise ops,
//! views, simple reductions and `matmul`), so that e.g. softmax becomes one kernel with two
//! reduction passes instead of an opaque call.
//!
//! - `softmax(x, d)`      → `e = exp(x - amax(x, d)); e * reciprocal(sum(e, d))`: one division
//!   per row, not per element, as PyTorch's CPU kernel computes it (`x * (1 / sum)`)
//! - `log_softmax(x, d)`  → `s = x - amax(x, d); s - log(sum(exp(s), d))`
//! - `layer_norm`         → `c = x - mean(x); c * rsqrt(mean(c*c) + eps) * w + b`
//! - `var/std`            → `sum((x - mean(x))^2) / max(0, N - correction)` (then `sqrt`)
//! - `logsumexp`          → `log(sum(exp(x - m))) + m`, `m = amax(x)` with ±inf maxima set to 0
//! - `linear(x, w, b)`    → `matmul(x, t(w)) + b` (the transpose is a view, never a copy)
//! - `batch_norm`         → `(x - mean) * (rsqrt(var + eps) * w) + b`, per channel: the
//!   batch's statistics (row reductions over every dim but the channels) when training, the
//!   running ones otherwise (then a pointwise op, which constant folding turns into one
//!   scale and shift per channel when the statistics are constants)
//! - `einsum`             → the eager kernel's own lowering, op for op: `diagonal` views for
//!   repeated subscripts, `expand` for size-1 broadcasts, `sum` of subscripts needed nowhere
//!   else, one batched `matmul` per pair of operands between `permute`/`reshape` views, and a
//!   final `permute` (so the values are bit-identical to the composite's)
//!
//! - a large reduction over every dim (`sum`, `mean` of f32/f64, `amax`, `amin`)
//!   → the same reduction over the last dim, then over the rest: one row per leading index
//!   instead of a single row, so the rows spread over threads (CPU) or blocks (GPU). Exact for
//!   `amax`/`amin`; a sum or mean is reassociated, as every parallel reduction is.
//!
//! f16/bf16 normalisations compute in f32 and round once at the end, as PyTorch's kernels
//! accumulate in f32. Ops over empty tensors are left alone (their reductions would refuse the
//! empty dims that the composite accepts). `gelu` (both approximations) and `silu` stay: they
//! are scalar ops of the kernel IR, so the fuser already sees through them, and spelling them
//! out would only add rounding steps.

use crate::Result;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::einsum::EinsumSpec;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use crate::ir::shape::{reduced_shape, reduction_dims};
use std::collections::{HashMap, HashSet};

/// A graph under construction, with fresh names that never collide with the source's.
struct Builder {
    g: Graph,
    taken: HashSet<String>,
    next: usize,
}

impl Builder {
    fn fresh(&mut self, base: &str) -> String {
        loop {
            let n = format!("{base}.d{}", self.next);
            self.next += 1;
            if !self.taken.contains(&n) && self.g.value(&n).is_none() {
                return n;
            }
        }
    }

    /// Adds an internal node of the decomposition of `base`.
    fn op(&mut self, base: &str, op: Op, args: &[ValueId]) -> Result<ValueId> {
        if matches!(op, Op::Scalar(_)) {
            return self.g.add_op(op, args);
        }
        let name = self.fresh(base);
        self.g.add_op_named(op, args, &name)
    }

    fn scalar(&mut self, s: Scalar) -> Result<ValueId> {
        self.g.add_scalar(s)
    }

    fn unary(&mut self, base: &str, u: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op(base, Op::Unary(u), &[x])
    }

    fn binary(&mut self, base: &str, b: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(base, Op::Binary(b), &[x, y])
    }

    fn reduce(
        &mut self,
        base: &str,
        op: ReduceOp,
        x: ValueId,
        dim: &Option<Vec<i64>>,
        keepdim: bool,
    ) -> Result<ValueId> {
        let dim = dim.clone();
        self.op(base, Op::Reduce { op, dim, keepdim }, &[x])
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.node(v).ty.dtype
    }

    /// `x` in f32 when it is f16/bf16 (the compute dtype of normalisations), else `x`.
    fn upcast(&mut self, base: &str, x: ValueId) -> Result<ValueId> {
        match self.dtype(x) {
            DType::F16 | DType::BF16 => self.op(base, Op::To { dtype: DType::F32 }, &[x]),
            _ => Ok(x),
        }
    }

    fn cast(&mut self, base: &str, x: ValueId, d: DType) -> Result<ValueId> {
        if self.dtype(x) == d {
            Ok(x)
        } else {
            self.op(base, Op::To { dtype: d }, &[x])
        }
    }
}

/// Rewrites every composite op of `g` into primitives; the result computes the same values.
pub fn decompose(g: &Graph) -> Result<Graph> {
    rebuild(g, |b, name, op, args, _| expand(b, name, op, args))
}

/// Every `AttentionGrad` of `g` written as matmul and softmax (the `[.., L, S]`
/// probabilities materialised), its three gradients flattened and concatenated as the op
/// packs them: for code generators without the fused kernel (CUDA), which then keep the
/// products and the softmax on their own device. A graph without one is returned as it is.
pub fn expand_attention_grads(g: &Graph) -> Result<std::borrow::Cow<'_, Graph>> {
    use crate::passes::autodiff::{graph_builder::Emit, vjp::attention_primitives};
    rebuild_where(
        g,
        |op| matches!(op, Op::AttentionGrad { .. }),
        |b, name, op, args| {
            let Op::AttentionGrad {
                has_mask,
                is_causal,
                scale,
            } = op
            else {
                return Ok(None);
            };
            let mut e = Emit { g: &mut b.g };
            let grads = attention_primitives(
                &mut e,
                &args[1..],
                *has_mask,
                *is_causal,
                scale.map(|s| s.get()),
                args[0],
                &[true, true, true, false],
            )?;
            let mut flat = Vec::with_capacity(3);
            for gx in grads.into_iter().take(3) {
                let gx = gx.ok_or_else(|| {
                    crate::Error::Value(
                        "scaled_dot_product_attention_backward: a gradient is missing".into(),
                    )
                })?;
                flat.push(e.op(Op::Reshape { shape: vec![-1] }, &[gx])?);
            }
            b.g.add_op_named(Op::Cat { dim: 0 }, &flat, name).map(Some)
        },
    )
}

/// Every `scaled_dot_product_attention` of `g` written as matmul and softmax (the
/// `[.., L, S]` probabilities materialised): for ahead-of-time models, whose run-time
/// library has no fused attention kernel. A graph without one is returned as it is.
pub fn expand_attentions(g: &Graph) -> Result<std::borrow::Cow<'_, Graph>> {
    use crate::passes::autodiff::{graph_builder::Emit, vjp::attention_forward};
    rebuild_where(
        g,
        |op| matches!(op, Op::Attention { .. }),
        |b, _, op, args| {
            let Op::Attention {
                has_mask,
                is_causal,
                scale,
            } = op
            else {
                return Ok(None);
            };
            let mut e = Emit { g: &mut b.g };
            attention_forward(&mut e, args, *has_mask, *is_causal, scale.map(|s| s.get())).map(Some)
        },
    )
}

/// `g` with each `scatter_reduce(x, index, src, reduce="mean")` written as a sum over a
/// count, `scatter_reduce(x, index, src, "sum") / (1 + scatter_add(zeros, index, ones))`:
/// ahead-of-time models' scatter steps combine one element at a time and keep no counts.
/// The count is i64; floats divide (one rounding, as the eager kernel's division in f64),
/// integers divide rounding down and convert back, as the eager kernel does.
pub fn expand_scatter_means(g: &Graph) -> Result<std::borrow::Cow<'_, Graph>> {
    use crate::ir::op::ScatterReduction;
    rebuild_where(
        g,
        |op| {
            matches!(
                op,
                Op::ScatterReduce {
                    reduce: ScatterReduction::Mean,
                    ..
                }
            )
        },
        |b, name, op, args| {
            let Op::ScatterReduce { dim, .. } = op else {
                return Ok(None);
            };
            let dim = *dim;
            let (x, index, src) = (args[0], args[1], args[2]);
            let (tx, ts) = (b.g.node(x).ty.clone(), b.g.node(src).ty.clone());
            let full = |size: &[usize], v: i64| Op::Full {
                size: size.to_vec(),
                fill_value: Scalar::Int(v),
                dtype: Some(DType::I64),
            };
            let reduce = ScatterReduction::Sum;
            let sum =
                b.g.add_op(Op::ScatterReduce { dim, reduce }, &[x, index, src])?;
            let zeros = b.g.add_op(full(&tx.shape, 0), &[])?;
            let ones = b.g.add_op(full(&ts.shape, 1), &[])?;
            let count = b.g.add_op(Op::ScatterAdd { dim }, &[zeros, index, ones])?;
            let one = b.g.add_op(Op::Scalar(Scalar::Int(1)), &[])?;
            let n = b.g.add_op(Op::Binary(BinaryOp::Add), &[count, one])?;
            if tx.dtype.is_float() {
                return b
                    .g
                    .add_op_named(Op::Binary(BinaryOp::Div), &[sum, n], name)
                    .map(Some);
            }
            let q = b.g.add_op(Op::Binary(BinaryOp::DivFloor), &[sum, n])?;
            b.g.add_op_named(Op::To { dtype: tx.dtype }, &[q], name)
                .map(Some)
        },
    )
}

/// `g` with each operand of a `cat` or `stack` cast to the result's dtype where it differs
/// (`cat` of a bf16 and a bool tensor), in the bodies of its control ops too: ahead-of-time
/// models join them by copying elements, which converts nothing.
pub fn cast_joined_operands(g: &Graph) -> Result<std::borrow::Cow<'_, Graph>> {
    if !joins_mixed(g) {
        return Ok(std::borrow::Cow::Borrowed(g));
    }
    let g = rebuild(g, |b, name, op, args, v| {
        if let Op::Control(c) = op {
            if !c.bodies.iter().any(|body| joins_mixed(body.graph())) {
                return Ok(None);
            }
            let bodies = c
                .bodies
                .iter()
                .map(|body| {
                    Ok(match cast_joined_operands(body.graph())? {
                        std::borrow::Cow::Borrowed(_) => body.clone(),
                        std::borrow::Cow::Owned(cast) => crate::ir::control::Body::new(cast),
                    })
                })
                .collect::<Result<_>>()?;
            let c = crate::ir::control::Control {
                kind: c.kind,
                bodies,
            };
            return b
                .g
                .add_op_named(Op::Control(Box::new(c)), args, name)
                .map(Some);
        }
        if !mixed_join(g, v) {
            return Ok(None);
        }
        let dtype = g.node(v).ty.dtype;
        let args = args
            .iter()
            .map(|&a| match b.g.node(a).ty.dtype == dtype {
                true => Ok(a),
                false => b.g.add_op(Op::To { dtype }, &[a]),
            })
            .collect::<Result<Vec<_>>>()?;
        b.g.add_op_named(op.clone(), &args, name).map(Some)
    })?;
    Ok(std::borrow::Cow::Owned(g))
}

/// Whether `v` joins operands of several dtypes (`cat`, `stack`).
fn mixed_join(g: &Graph, v: ValueId) -> bool {
    let joins = matches!(g.node(v).op(), Some(Op::Cat { .. } | Op::Stack { .. }));
    let d = g.node(v).ty.dtype;
    joins && g.operands(v).iter().any(|&a| g.node(a).ty.dtype != d)
}

/// Whether `g` or one of its bodies holds a join of several dtypes.
fn joins_mixed(g: &Graph) -> bool {
    g.topo_order().into_iter().any(|v| match g.node(v).op() {
        Some(Op::Control(c)) => c.bodies.iter().any(|b| joins_mixed(b.graph())),
        _ => mixed_join(g, v),
    })
}

/// `g` rebuilt with `f` replacing the nodes whose op `pick` selects, or `g` itself when
/// it has none.
fn rebuild_where(
    g: &Graph,
    pick: impl Fn(&Op) -> bool,
    mut f: impl FnMut(&mut Builder, &str, &Op, &[ValueId]) -> Result<Option<ValueId>>,
) -> Result<std::borrow::Cow<'_, Graph>> {
    let has = g
        .topo_order()
        .into_iter()
        .any(|v| g.node(v).op().is_some_and(&pick));
    if !has {
        return Ok(std::borrow::Cow::Borrowed(g));
    }
    rebuild(g, |b, name, op, args, _| {
        if pick(op) {
            f(b, name, op, args)
        } else {
            Ok(None)
        }
    })
    .map(std::borrow::Cow::Owned)
}

/// `g` rebuilt node by node: `f` gives the replacement of a node (its name, op, mapped
/// operands and id in `g`), or `None` to copy it.
fn rebuild(
    g: &Graph,
    mut f: impl FnMut(&mut Builder, &str, &Op, &[ValueId], ValueId) -> Result<Option<ValueId>>,
) -> Result<Graph> {
    let mut b = Builder {
        g: Graph::new(&g.name),
        taken: g.names().keys().cloned().collect(),
        next: 0,
    };
    // values added without a name (gradient formulas) skip the names copied later
    b.g.avoid_names_of(g);
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &v in g.inputs() {
        let n = g.node(v);
        map.insert(v, b.g.add_input(&n.name, n.ty.clone())?);
    }
    for v in g.topo_order() {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else { continue };
        let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
        let nv = match f(&mut b, &n.name, op, &args, v)? {
            Some(r) => r,
            None if n.is_inline_scalar() => b.g.add_op(op.clone(), &args)?,
            None => b.g.add_op_named(op.clone(), &args, &n.name)?,
        };
        map.insert(v, nv);
    }
    b.g.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(b.g)
}

/// Rewrites around channels_last values (`nhwc`, 4-D):
/// - per-channel reductions (a `sum`/`mean` over every dim but dim 1: batch norm's
///   statistics and their gradients, bias gradients) go over the NHWC view `[N, H, W, C]`,
///   whose pixels are contiguous rows of C: per image (a column reduction the fuser runs
///   at memory speed, where the NCHW order would walk each channel with a stride of C),
///   then across images. The view is a permute only, so a pointwise producer of the value
///   is computed inside the reduction (through a `[N·H·W, C]` reshape, which 16-bit values
///   still take to round once, it is stored first);
/// - a `reshape` or `flatten` that merges channels with pixels (`flatten(x, 1)` before a
///   linear layer) reads a row-major copy (`contiguous`), as eager `reshape` copies such a
///   tensor: no index map reads NHWC memory in NCHW's flattened order.
pub fn nhwc_rewrites(g: &Graph, nhwc: &HashSet<ValueId>) -> Result<Graph> {
    rebuild(g, |b, name, op, args, v| {
        if matches!(op, Op::Reshape { .. } | Op::Flatten { .. }) {
            let x = g.operands(v)[0];
            let shape = &g.node(x).ty.shape;
            if !nhwc.contains(&x) || shape[2] * shape[3] == 1 || g.node(v).ty.shape == *shape {
                return Ok(None);
            }
            let rows = b.op(name, Op::Contiguous, args)?;
            return b.g.add_op_named(op.clone(), &[rows], name).map(Some);
        }
        let Op::Reduce {
            op: rop @ (ReduceOp::Sum | ReduceOp::Mean),
            dim,
            keepdim,
        } = op
        else {
            return Ok(None);
        };
        let x = g.operands(v)[0];
        let shape = &g.node(x).ty.shape;
        if !nhwc.contains(&x) || shape.len() != 4 || reduction_dims(dim, 4)? != [0, 2, 3] {
            return Ok(None);
        }
        let c = shape[1] as i64;
        let p = b.op(
            name,
            Op::Permute {
                dims: vec![0, 2, 3, 1],
            },
            args,
        )?;
        let r = if matches!(g.node(x).ty.dtype, DType::F32 | DType::F64) {
            let per_image = b.reduce(name, *rop, p, &Some(vec![1, 2]), false)?;
            b.reduce(name, *rop, per_image, &Some(vec![0]), false)?
        } else {
            // one reduction: per-image partials of a 16-bit type would round twice
            let rows = b.op(name, Op::Reshape { shape: vec![-1, c] }, &[p])?;
            b.reduce(name, *rop, rows, &Some(vec![0]), false)?
        };
        let out = if *keepdim { vec![1, c, 1, 1] } else { vec![c] };
        b.g.add_op_named(Op::Reshape { shape: out }, &[r], name)
            .map(Some)
    })
}

/// The decomposition of one node, or `None` to copy it unchanged.
fn expand(b: &mut Builder, name: &str, op: &Op, args: &[ValueId]) -> Result<Option<ValueId>> {
    let Some(&x) = args.first() else {
        return Ok(None);
    };
    if b.g.node(x).ty.numel() == 0 && !matches!(op, Op::Linear { .. }) {
        return Ok(None);
    }
    if let Op::Einsum { equation } = op {
        return einsum(b, name, equation, args);
    }
    let r = match op {
        Op::Softmax { dim } => softmax(b, name, x, *dim, false)?,
        Op::LogSoftmax { dim } => softmax(b, name, x, *dim, true)?,
        Op::LayerNorm {
            normalized_shape,
            eps,
            has_weight,
            has_bias,
        } => {
            let w = has_weight.then(|| args[1]);
            let bias = has_bias.then(|| args[1 + *has_weight as usize]);
            layer_norm(b, name, x, normalized_shape.len(), *eps, w, bias)?
        }
        Op::BatchNorm(bn) => batch_norm(b, name, bn, args)?,
        Op::Var {
            dim,
            correction,
            keepdim,
        } => variance(b, name, x, dim, *correction, *keepdim, false)?,
        Op::Std {
            dim,
            correction,
            keepdim,
        } => variance(b, name, x, dim, *correction, *keepdim, true)?,
        Op::Reduce {
            op: ReduceOp::LogSumExp,
            dim,
            keepdim,
        } => logsumexp(b, name, x, dim, *keepdim)?,
        Op::Reduce { op, dim, keepdim } => {
            if let Some(r) = split_full_reduction(b, name, *op, x, dim, *keepdim)? {
                r
            } else if let Some(r) = tile_column_reduction(b, name, *op, x, dim, *keepdim)? {
                r
            } else {
                return Ok(None);
            }
        }
        Op::AdaptiveAvgPool2dGrad { input_size } => {
            match global_pool_grad(b, name, x, input_size)? {
                Some(r) => r,
                None => return Ok(None),
            }
        }
        Op::Tril { diagonal } => triangle(b, name, x, *diagonal, true)?,
        Op::Triu { diagonal } => triangle(b, name, x, *diagonal, false)?,
        Op::Linear { has_bias } => {
            let dt = b.g.node(x).ty.dtype;
            if *has_bias && matches!(dt, DType::F16 | DType::BF16) {
                // half precision adds the bias to the f32 product and rounds once, as
                // eager `linear` and PyTorch do: rounding the product first loses the
                // bias's digits where the two cancel
                let f32 = |b: &mut Builder, v| b.op(name, Op::To { dtype: DType::F32 }, &[v]);
                let (x32, w32, b32) = (f32(b, x)?, f32(b, args[1])?, f32(b, args[2])?);
                let wt = b.op(name, Op::T, &[w32])?;
                let mm = b.op(name, Op::Matmul, &[x32, wt])?;
                let sum = b.binary(name, BinaryOp::Add, mm, b32)?;
                b.op(name, Op::To { dtype: dt }, &[sum])?
            } else {
                let wt = b.op(name, Op::T, &[args[1]])?;
                let mm = b.op(name, Op::Matmul, &[x, wt])?;
                match has_bias {
                    true => b.binary(name, BinaryOp::Add, mm, args[2])?,
                    false => mm,
                }
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(r))
}

/// `tril` (`lower`) or `triu` over the last two dims as `where(j - i <= k, x, 0)` (`>=`
/// for `triu`), the positions from `arange`: a pointwise op that fuses with its
/// neighbours, where the library call would be a pass over memory of its own.
fn triangle(b: &mut Builder, name: &str, x: ValueId, k: i64, lower: bool) -> Result<ValueId> {
    let ty = b.g.node(x).ty.clone();
    let n = ty.shape.len();
    let positions = |b: &mut Builder, len: usize| {
        b.op(
            name,
            Op::Arange {
                start: Scalar::Int(0),
                end: Scalar::Int(len as i64),
                step: Scalar::Int(1),
                dtype: Some(DType::I64),
            },
            &[],
        )
    };
    let rows = positions(b, ty.shape[n - 2])?;
    let rows = b.op(name, Op::Unsqueeze { dim: 1 }, &[rows])?;
    let cols = positions(b, ty.shape[n - 1])?;
    let offset = b.binary(name, BinaryOp::Sub, cols, rows)?;
    let k = b.scalar(Scalar::Int(k))?;
    let side = if lower { BinaryOp::Le } else { BinaryOp::Ge };
    let keep = b.binary(name, side, offset, k)?;
    let zero = b.op(
        name,
        Op::Full {
            size: vec![],
            fill_value: Scalar::Int(0),
            dtype: Some(ty.dtype),
        },
        &[],
    )?;
    b.op(name, Op::Where, &[keep, x, zero])
}

/// The gradient of a global average pool (a 1×1 output) as `expand(g) / (H·W)`: a view
/// and a division that fuse into whatever reads the gradient, where the pooling kernel
/// would write a full-size buffer (in NCHW even when the network runs channels_last).
/// `None` for other output sizes.
fn global_pool_grad(
    b: &mut Builder,
    name: &str,
    g: ValueId,
    input_size: &[usize],
) -> Result<Option<ValueId>> {
    let gshape = b.g.node(g).ty.shape.clone();
    let n = gshape.len();
    if n < 3 || gshape[n - 2..] != [1, 1] || input_size.len() != n {
        return Ok(None);
    }
    let size = input_size.iter().map(|&d| d as i64).collect();
    let spread = b.op(name, Op::Expand { size }, &[g])?;
    let count = b.scalar(Scalar::Int((input_size[n - 2] * input_size[n - 1]) as i64))?;
    b.binary(name, BinaryOp::Div, spread, count).map(Some)
}

/// The type of `x` when `op` over it may run as a reduction of partial results: `x` has two
/// or more dims and `SPLIT_MIN_ELEMS` elements; amax/amin combine exactly in any order, f32/f64
/// sums and means within one more rounding (f16 partials would round to f16, integer sums are
/// left whole).
fn splittable(b: &Builder, op: ReduceOp, x: ValueId) -> Option<TensorType> {
    let ty = &b.g.node(x).ty;
    let combine = matches!(op, ReduceOp::Amax | ReduceOp::Amin)
        || matches!(op, ReduceOp::Sum | ReduceOp::Mean)
            && matches!(ty.dtype, DType::F32 | DType::F64);
    (combine && ty.shape.len() >= 2 && ty.numel() >= SPLIT_MIN_ELEMS).then(|| ty.clone())
}

/// Fewest elements for which a full reduction is split: below it one row is quick anyway.
const SPLIT_MIN_ELEMS: usize = 1 << 16;

/// `r(x)` over every dim as `r(r(x, dim=-1))` when `x` is large and has at least 8 rows.
fn split_full_reduction(
    b: &mut Builder,
    name: &str,
    op: ReduceOp,
    x: ValueId,
    dim: &Option<Vec<i64>>,
    keepdim: bool,
) -> Result<Option<ValueId>> {
    let Some(ty) = splittable(b, op, x) else {
        return Ok(None);
    };
    let n = ty.shape.len();
    if reduction_dims(dim, n)?.len() != n || ty.numel() / ty.shape[n - 1] < 8 {
        return Ok(None);
    }
    let rows = b.reduce(name, op, x, &Some(vec![-1]), keepdim)?;
    Ok(Some(b.reduce(name, op, rows, &None, keepdim)?))
}

/// Fewest rows a reduction across rows must have to be tiled.
const TILE_MIN_ROWS: usize = 1024;

/// `r(x, dim=d)` over a long dim `d` that is not the last, as `r(r(x', dim=d+1), dim=d)` on
/// `x'` = `x` with dim `d` split into tiles of `t` rows (`t` the largest divisor of the dim in
/// 8..=64). A kernel reducing across rows walks one element run per row and a memory page per
/// row; over a tile of `t` rows those pages stay in the TLB while the kernel moves along the
/// rows, instead of thousands of pages per step. Sums and means of f32/f64 and amax/amin only
/// (their tile partials combine exactly or within one more rounding).
fn tile_column_reduction(
    b: &mut Builder,
    name: &str,
    op: ReduceOp,
    x: ValueId,
    dim: &Option<Vec<i64>>,
    keepdim: bool,
) -> Result<Option<ValueId>> {
    let Some(ty) = splittable(b, op, x) else {
        return Ok(None);
    };
    let n = ty.shape.len();
    let dims = reduction_dims(dim, n)?;
    let [d] = dims[..] else {
        return Ok(None);
    };
    let rows = ty.shape[d];
    if d + 1 == n || rows < TILE_MIN_ROWS {
        return Ok(None);
    }
    let Some(t) = (8..=64).rev().find(|&t| rows.is_multiple_of(t)) else {
        return Ok(None);
    };
    let mut shape: Vec<i64> = ty.shape.iter().map(|&s| s as i64).collect();
    shape.splice(d..=d, [(rows / t) as i64, t as i64]);
    let tiled = b.op(name, Op::Reshape { shape }, &[x])?;
    let partial = b.reduce(name, op, tiled, &Some(vec![d as i64 + 1]), false)?;
    Ok(Some(b.reduce(
        name,
        op,
        partial,
        &Some(vec![d as i64]),
        keepdim,
    )?))
}

fn softmax(b: &mut Builder, name: &str, x: ValueId, dim: i64, log: bool) -> Result<ValueId> {
    let d = b.dtype(x);
    let xf = b.upcast(name, x)?;
    let dims = Some(vec![dim]);
    let m = b.reduce(name, ReduceOp::Amax, xf, &dims, true)?;
    let sh = b.binary(name, BinaryOp::Sub, xf, m)?;
    let e = b.unary(name, UnaryOp::Exp, sh)?;
    let s = b.reduce(name, ReduceOp::Sum, e, &dims, true)?;
    let y = if log {
        let l = b.unary(name, UnaryOp::Log, s)?;
        b.binary(name, BinaryOp::Sub, sh, l)?
    } else {
        let r = b.unary(name, UnaryOp::Reciprocal, s)?;
        b.binary(name, BinaryOp::Mul, e, r)?
    };
    b.cast(name, y, d)
}

fn layer_norm(
    b: &mut Builder,
    name: &str,
    x: ValueId,
    k: usize,
    eps: f64,
    w: Option<ValueId>,
    bias: Option<ValueId>,
) -> Result<ValueId> {
    let d = b.dtype(x);
    let xf = b.upcast(name, x)?;
    let dims = Some((1..=k as i64).rev().map(|i| -i).collect());
    let mean = b.reduce(name, ReduceOp::Mean, xf, &dims, true)?;
    let c = b.binary(name, BinaryOp::Sub, xf, mean)?;
    let sq = b.binary(name, BinaryOp::Mul, c, c)?;
    let var = b.reduce(name, ReduceOp::Mean, sq, &dims, true)?;
    let e = b.scalar(Scalar::Float(eps))?;
    let ve = b.binary(name, BinaryOp::Add, var, e)?;
    let r = b.unary(name, UnaryOp::Rsqrt, ve)?;
    let mut y = b.binary(name, BinaryOp::Mul, c, r)?;
    if let Some(w) = w {
        let wf = b.upcast(name, w)?;
        y = b.binary(name, BinaryOp::Mul, y, wf)?;
    }
    if let Some(bias) = bias {
        let bf = b.upcast(name, bias)?;
        y = b.binary(name, BinaryOp::Add, y, bf)?;
    }
    b.cast(name, y, d)
}

/// `batch_norm` over every dim but the channels: the batch's mean and biased variance when
/// training (two row reductions over N·H·W per channel), else the running statistics; the
/// per-channel vectors are viewed as `[C, 1, ..]` to broadcast.
fn batch_norm(
    b: &mut Builder,
    name: &str,
    bn: &crate::ir::conv::BatchNormAttrs,
    args: &[ValueId],
) -> Result<ValueId> {
    let x = args[0];
    let d = b.dtype(x);
    let shape = b.g.node(x).ty.shape.clone();
    let nd = shape.len();
    let mut chan: Vec<i64> = vec![shape[1] as i64];
    chan.extend(std::iter::repeat_n(1, nd - 2));
    let per_channel = |b: &mut Builder, i: Option<usize>| -> Result<Option<ValueId>> {
        let Some(i) = i else { return Ok(None) };
        let v = b.upcast(name, args[i])?;
        let shape = chan.clone();
        b.op(name, Op::View { shape }, &[v]).map(Some)
    };
    let [rm, rv, w, bias] = bn.positions();
    let (rm, rv) = (per_channel(b, rm)?, per_channel(b, rv)?);
    let (w, bias) = (per_channel(b, w)?, per_channel(b, bias)?);
    let xf = b.upcast(name, x)?;
    let eps = b.scalar(Scalar::Float(bn.eps.get()))?;
    let (c, var) = match (bn.training, rm, rv) {
        (true, _, _) | (false, None, _) | (false, _, None) => {
            let dims = Some(
                crate::ir::conv::BatchNormAttrs::reduced_dims(nd)
                    .into_iter()
                    .map(|d| d as i64)
                    .collect(),
            );
            let mean = b.reduce(name, ReduceOp::Mean, xf, &dims, true)?;
            let c = b.binary(name, BinaryOp::Sub, xf, mean)?;
            let sq = b.binary(name, BinaryOp::Mul, c, c)?;
            (c, b.reduce(name, ReduceOp::Mean, sq, &dims, true)?)
        }
        (false, Some(rm), Some(rv)) => (b.binary(name, BinaryOp::Sub, xf, rm)?, rv),
    };
    let ve = b.binary(name, BinaryOp::Add, var, eps)?;
    let mut scale = b.unary(name, UnaryOp::Rsqrt, ve)?;
    if let Some(w) = w {
        scale = b.binary(name, BinaryOp::Mul, scale, w)?;
    }
    let mut y = b.binary(name, BinaryOp::Mul, c, scale)?;
    if let Some(bias) = bias {
        y = b.binary(name, BinaryOp::Add, y, bias)?;
    }
    b.cast(name, y, d)
}

fn variance(
    b: &mut Builder,
    name: &str,
    x: ValueId,
    dim: &Option<Vec<i64>>,
    correction: f64,
    keepdim: bool,
    std: bool,
) -> Result<ValueId> {
    let ty = b.g.node(x).ty.clone();
    let dims = reduction_dims(dim, ty.ndim())?;
    let n: usize = dims.iter().map(|&i| ty.shape[i]).product();
    let xf = b.upcast(name, x)?;
    let all = Some(
        (0..ty.ndim() as i64)
            .filter(|i| dims.contains(&(*i as usize)))
            .collect(),
    );
    let mean = b.reduce(name, ReduceOp::Mean, xf, &all, true)?;
    let c = b.binary(name, BinaryOp::Sub, xf, mean)?;
    let sq = b.binary(name, BinaryOp::Mul, c, c)?;
    let s = b.reduce(name, ReduceOp::Sum, sq, &all, keepdim)?;
    let div = b.scalar(Scalar::Float((n as f64 - correction).max(0.0)))?;
    let mut y = b.binary(name, BinaryOp::Div, s, div)?;
    if std {
        y = b.unary(name, UnaryOp::Sqrt, y)?;
    }
    b.cast(name, y, ty.dtype)
}

fn logsumexp(
    b: &mut Builder,
    name: &str,
    x: ValueId,
    dim: &Option<Vec<i64>>,
    keepdim: bool,
) -> Result<ValueId> {
    let ty = b.g.node(x).ty.clone();
    let out = if ty.dtype.is_float() {
        ty.dtype
    } else {
        DType::F32
    };
    let xc = b.cast(name, x, out)?;
    let xf = b.upcast(name, xc)?;
    let dims = reduction_dims(dim, ty.ndim())?;
    let all = Some(dims.iter().map(|&i| i as i64).collect::<Vec<_>>());
    let m = b.reduce(name, ReduceOp::Amax, xf, &all, true)?;
    let am = b.unary(name, UnaryOp::Abs, m)?;
    let inf = b.scalar(Scalar::Float(f64::INFINITY))?;
    let is_inf = b.binary(name, BinaryOp::Eq, am, inf)?;
    let mf = b.op(
        name,
        Op::MaskedFill {
            value: Scalar::Float(0.0),
        },
        &[m, is_inf],
    )?;
    let sh = b.binary(name, BinaryOp::Sub, xf, mf)?;
    let e = b.unary(name, UnaryOp::Exp, sh)?;
    let s = b.reduce(name, ReduceOp::Sum, e, &all, keepdim)?;
    let l = b.unary(name, UnaryOp::Log, s)?;
    let mk = if keepdim || dims.is_empty() {
        mf
    } else {
        let shape = reduced_shape(&ty.shape, &dims, false);
        let shape = shape.iter().map(|&n| n as i64).collect();
        b.op(name, Op::Reshape { shape }, &[mf])?
    };
    let y = b.binary(name, BinaryOp::Add, l, mk)?;
    b.cast(name, y, out)
}

/// A value whose dims carry einsum labels.
struct Term {
    v: ValueId,
    labels: Vec<usize>,
}

fn einsum(
    b: &mut Builder,
    name: &str,
    equation: &str,
    args: &[ValueId],
) -> Result<Option<ValueId>> {
    if args.iter().any(|&a| b.g.node(a).ty.numel() == 0) {
        return Ok(None);
    }
    let shapes: Vec<Vec<usize>> = args.iter().map(|&a| b.g.node(a).ty.shape.clone()).collect();
    let refs: Vec<&[usize]> = shapes.iter().map(|s| &s[..]).collect();
    let spec = EinsumSpec::parse(equation, &refs)?;
    let out_dtype = b.dtype(args[0]);
    let mut terms = Vec::with_capacity(args.len());
    for (&x, labels) in args.iter().zip(&spec.inputs) {
        terms.push(einsum_prepare(b, name, x, labels, &spec)?);
    }
    let mut terms = terms.into_iter();
    let Some(mut acc) = terms.next() else {
        return Ok(None);
    };
    let rest: Vec<Term> = terms.collect();
    for (i, t) in rest.iter().enumerate() {
        // labels still needed after this pair: the output's and later operands'
        let later: Vec<usize> = spec
            .output
            .iter()
            .chain(rest[i + 1..].iter().flat_map(|t| t.labels.iter()))
            .copied()
            .collect();
        let a = einsum_sum_unneeded(b, name, acc, &[&later, &t.labels])?;
        let bt = Term {
            v: t.v,
            labels: t.labels.clone(),
        };
        let bt = einsum_sum_unneeded(b, name, bt, &[&later, &a.labels])?;
        acc = einsum_contract(b, name, a, bt, &later)?;
    }
    let acc = einsum_sum_unneeded(b, name, acc, &[&spec.output])?;
    let perm: Vec<i64> = spec
        .output
        .iter()
        .filter_map(|l| acc.labels.iter().position(|m| m == l).map(|p| p as i64))
        .collect();
    let y = permute(b, name, acc.v, perm)?;
    Ok(Some(b.cast(name, y, out_dtype)?))
}

fn permute(b: &mut Builder, name: &str, x: ValueId, dims: Vec<i64>) -> Result<ValueId> {
    if dims.iter().enumerate().all(|(i, &d)| d == i as i64) {
        return Ok(x);
    }
    b.op(name, Op::Permute { dims }, &[x])
}

/// Diagonals of repeated labels, then size-1 dims broadcast to their label's size.
fn einsum_prepare(
    b: &mut Builder,
    name: &str,
    x: ValueId,
    labels: &[usize],
    spec: &EinsumSpec,
) -> Result<Term> {
    let mut v = x;
    let mut labels = labels.to_vec();
    while let Some((i, j)) = (0..labels.len()).find_map(|j| {
        labels[..j]
            .iter()
            .position(|&l| l == labels[j])
            .map(|i| (i, j))
    }) {
        // diagonal removes dims i and j and appends their diagonal as the last dim
        let d = Op::Diagonal {
            offset: 0,
            dim1: i as i64,
            dim2: j as i64,
        };
        v = b.op(name, d, &[v])?;
        let l = labels[i];
        labels.remove(j);
        labels.remove(i);
        labels.push(l);
    }
    let full: Vec<usize> = labels.iter().map(|&l| spec.sizes[l]).collect();
    if full != b.g.node(v).ty.shape {
        let size = full.iter().map(|&n| n as i64).collect();
        v = b.op(name, Op::Expand { size }, &[v])?;
    }
    Ok(Term { v, labels })
}

/// Sums out the dims whose labels appear in none of `keep` (in the operand's dtype).
fn einsum_sum_unneeded(b: &mut Builder, name: &str, x: Term, keep: &[&[usize]]) -> Result<Term> {
    let dims: Vec<usize> = (0..x.labels.len())
        .filter(|&d| !keep.iter().any(|k| k.contains(&x.labels[d])))
        .collect();
    if dims.is_empty() {
        return Ok(x);
    }
    let dtype = b.dtype(x.v);
    let dim = Some(dims.iter().map(|&d| d as i64).collect());
    let s = b.reduce(name, ReduceOp::Sum, x.v, &dim, false)?;
    // integer sums widen to int64; einsum keeps the operands' dtype
    let v = b.cast(name, s, dtype)?;
    let labels = x
        .labels
        .iter()
        .enumerate()
        .filter(|(d, _)| !dims.contains(d))
        .map(|(_, &l)| l)
        .collect();
    Ok(Term { v, labels })
}

/// Contracts two terms with one batched matmul `[batch, m, k] @ [batch, k, n]`.
fn einsum_contract(b: &mut Builder, name: &str, x: Term, y: Term, later: &[usize]) -> Result<Term> {
    let in_y = |l: &usize| y.labels.contains(l);
    let batch: Vec<usize> = (x.labels.iter().copied())
        .filter(|l| in_y(l) && later.contains(l))
        .collect();
    let k: Vec<usize> = (x.labels.iter().copied())
        .filter(|l| in_y(l) && !later.contains(l))
        .collect();
    let m: Vec<usize> = x.labels.iter().copied().filter(|l| !in_y(l)).collect();
    let n: Vec<usize> = (y.labels.iter().copied())
        .filter(|l| !x.labels.contains(l))
        .collect();
    let size_of = |b: &Builder, t: &Term, ls: &[usize]| -> Vec<usize> {
        let shape = &b.g.node(t.v).ty.shape;
        ls.iter()
            .map(|l| t.labels.iter().position(|m| m == l).map_or(1, |d| shape[d]))
            .collect()
    };
    let prod = |v: &[usize]| v.iter().product::<usize>() as i64;
    let (bs, ms, ks, ns) = (
        size_of(b, &x, &batch),
        size_of(b, &x, &m),
        size_of(b, &x, &k),
        size_of(b, &y, &n),
    );
    let x3 = arrange(
        b,
        name,
        &x,
        &[&batch, &m, &k],
        vec![prod(&bs), prod(&ms), prod(&ks)],
    )?;
    let y3 = arrange(
        b,
        name,
        &y,
        &[&batch, &k, &n],
        vec![prod(&bs), prod(&ks), prod(&ns)],
    )?;
    let c = b.op(name, Op::Matmul, &[x3, y3])?;
    let shape: Vec<i64> = bs.iter().chain(&ms).chain(&ns).map(|&s| s as i64).collect();
    let v = b.op(name, Op::Reshape { shape }, &[c])?;
    let labels = batch.into_iter().chain(m).chain(n).collect();
    Ok(Term { v, labels })
}

/// Permutes `x` so its labels follow `groups`, then reshapes to one dim per group.
fn arrange(
    b: &mut Builder,
    name: &str,
    x: &Term,
    groups: &[&[usize]],
    shape: Vec<i64>,
) -> Result<ValueId> {
    let perm: Vec<i64> = groups
        .iter()
        .flat_map(|g| g.iter())
        .filter_map(|l| x.labels.iter().position(|m| m == l).map(|p| p as i64))
        .collect();
    let p = b.op(name, Op::Permute { dims: perm }, &[x.v])?;
    b.op(name, Op::Reshape { shape }, &[p])
}
