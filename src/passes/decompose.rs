//! Decomposition of composite ops into the primitives the fuser understands (pointwise ops,
//! views, simple reductions and `matmul`), so that e.g. softmax becomes one kernel with two
//! reduction passes instead of an opaque call.
//!
//! - `softmax(x, d)`      → `e = exp(x - amax(x, d)); e / sum(e, d)`
//! - `log_softmax(x, d)`  → `s = x - amax(x, d); s - log(sum(exp(s), d))`
//! - `layer_norm`         → `c = x - mean(x); c * rsqrt(mean(c*c) + eps) * w + b`
//! - `var/std`            → `sum((x - mean(x))^2) / max(0, N - correction)` (then `sqrt`)
//! - `logsumexp`          → `log(sum(exp(x - m))) + m`, `m = amax(x)` with ±inf maxima set to 0
//! - `linear(x, w, b)`    → `matmul(x, t(w)) + b` (the transpose is a view, never a copy)
//!
//! f16/bf16 normalisations compute in f32 and round once at the end, as PyTorch's kernels
//! accumulate in f32. Ops over empty tensors are left alone (their reductions would refuse the
//! empty dims that the composite accepts). `gelu` and `silu` stay: they are scalar ops of the
//! kernel IR, and spelling them out would only add rounding steps.

use crate::Result;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, UnaryOp, reduction_dims};
use crate::ir::shape::reduced_shape;
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
    let mut b = Builder {
        g: Graph::new(&g.name),
        taken: g.names().keys().cloned().collect(),
        next: 0,
    };
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for &v in g.inputs() {
        let n = g.node(v);
        map.insert(v, b.g.add_input(&n.name, n.ty.clone())?);
    }
    for v in g.topo_order() {
        let n = g.node(v);
        let NodeKind::Op(op) = &n.kind else { continue };
        let args: Vec<ValueId> = g.operands(v).iter().map(|o| map[o]).collect();
        let nv = match expand(&mut b, &n.name, op, &args)? {
            Some(r) => r,
            None if n.is_inline_scalar() => b.g.add_op(op.clone(), &args)?,
            None => b.g.add_op_named(op.clone(), &args, &n.name)?,
        };
        map.insert(v, nv);
    }
    b.g.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    Ok(b.g)
}

/// The decomposition of one node, or `None` to copy it unchanged.
fn expand(b: &mut Builder, name: &str, op: &Op, args: &[ValueId]) -> Result<Option<ValueId>> {
    let Some(&x) = args.first() else {
        return Ok(None);
    };
    if b.g.node(x).ty.numel() == 0 && !matches!(op, Op::Linear { .. }) {
        return Ok(None);
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
        Op::Linear { has_bias } => {
            let wt = b.op(name, Op::T, &[args[1]])?;
            let mm = b.op(name, Op::Matmul, &[x, wt])?;
            if *has_bias {
                b.binary(name, BinaryOp::Add, mm, args[2])?
            } else {
                mm
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(r))
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
        b.binary(name, BinaryOp::Div, e, s)?
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
