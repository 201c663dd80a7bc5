//! The kernel IR: the one form both backends (Cranelift on the CPU, CUDA C on the GPU) read.
//!
//! A [`Schedule`] is a whole compiled graph: its [`Buffer`]s (inputs, captured constants,
//! temporaries) and an ordered list of [`Step`]s, each either a fused [`Kernel`] or an
//! [`ExternCall`] (GEMM and other library kernels). Graph outputs are strided [`View`]s of
//! buffers, so a transposed or sliced result is returned without a copy.
//!
//! A kernel iterates over an index space `outer ++ inner`:
//! - `outer` ("rows") is parallel: every point is independent;
//! - `inner` ("the row") is empty for pointwise kernels; otherwise it is the space the
//!   kernel's reductions run over. One program instance handles one row completely
//!   ("persistent reduction"): it runs the reduction passes in order, then the stores.
//!
//! Inside a kernel a scalar expression DAG of typed [`Value`]s (SSA, operands before users)
//! is built from loads through affine [`IndexMap`]s (broadcasts, transposes, slices, selects
//! and expands are strides and offsets, never copies), constants, the positions of the index
//! space, the scalar ops of the op set, casts, and reductions over `inner`. A value whose
//! inputs do not depend on an inner index is computed once per row ([`Level::Outer`]).
//!
//! Execution of one row (one point of `outer`):
//! 1. for each pass `p` in `passes`, in order: walk the inner space once and accumulate every
//!    reduction of pass `p` (a reduction of pass `p` only reads reductions of earlier passes);
//! 2. then the stores: an outer-level store is written once per row, an inner-level store
//!    for every point of the inner space.
//!
//! Buffers are dense row-major arrays of their shape; the runtime hands non-contiguous graph
//! inputs over as contiguous copies. Every index map is checked to stay inside its buffer
//! ([`Schedule::validate`]) before anything runs.

mod coalesce;
pub mod interp;
mod print;
mod verify;

pub use coalesce::{coalesce, store_order};
pub use verify::{check_kernel, check_ops};

use crate::ir::control::Control;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::op::{BinaryOp, Literal, Op, UnaryOp};
use crate::ir::shape::{Shape, numel};
use crate::{Result, bail};

/// Index of a buffer in [`Schedule::buffers`].
pub type BufferId = usize;
/// Index of a value in [`Kernel::values`].
pub type ValId = usize;

/// Where a buffer's contents come from.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum BufferKind {
    /// The `i`-th graph input.
    Input(usize),
    /// Data captured in the graph.
    Constant(Literal),
    /// Written by a step of the schedule (graph outputs included).
    Temp,
}

/// A dense row-major array.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Buffer {
    /// The graph value it holds (for dumps).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Sizes (row-major, contiguous unless `channels_last`).
    pub shape: Shape,
    /// Where its contents come from.
    pub kind: BufferKind,
    /// A 4-D buffer stored NHWC: the strides of a channels_last tensor of `shape`.
    pub channels_last: bool,
}

impl Buffer {
    /// The buffer's layout (offset 0).
    pub fn layout(&self) -> crate::runtime::layout::Layout {
        crate::runtime::layout::Layout {
            shape: self.shape.clone(),
            strides: self.strides(),
            offset: 0,
        }
    }

    /// `t` in this buffer's layout: `t` itself when its strides already are, else a copy
    /// (channels_last or contiguous).
    pub fn conform(&self, t: &crate::runtime::Tensor) -> crate::Result<crate::runtime::Tensor> {
        use crate::runtime::kernels::copy;
        if !self.channels_last {
            return copy::contiguous(t);
        }
        if t.strides() == self.strides().as_slice() {
            return Ok(t.clone());
        }
        copy::to_channels_last(t)
    }

    /// The element strides of the buffer's layout.
    pub fn strides(&self) -> Vec<usize> {
        let s = &self.shape;
        if self.channels_last && s.len() == 4 {
            vec![s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]]
        } else {
            crate::ir::shape::contiguous_strides(s)
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        numel(&self.shape)
    }
    /// True for a buffer without elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

/// An affine map from a kernel's index space to an element of a buffer:
/// `offset + Σ_d strides[d] * i[d]` over the dims of `outer ++ inner`. A stride of 0
/// broadcasts along that dim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct IndexMap {
    /// Elements to step per unit of each dim (`outer` dims, then `inner`).
    pub strides: Vec<usize>,
    /// Element offset of index 0.
    pub offset: usize,
}

impl IndexMap {
    /// True when the map does not move along any of the dims from `first` on.
    pub fn ignores_from(&self, first: usize) -> bool {
        self.strides.iter().skip(first).all(|&s| s == 0)
    }
    /// Largest element index reached over `space`, plus one (0 for an empty space);
    /// `usize::MAX` where that overflows, so that a bounds check on it fails.
    pub fn extent(&self, space: &[usize]) -> usize {
        if space.contains(&0) {
            return 0;
        }
        space
            .iter()
            .zip(&self.strides)
            .fold(self.offset.saturating_add(1), |e, (&n, &s)| {
                e.saturating_add((n - 1).saturating_mul(s))
            })
    }
}

/// A strided view of a buffer (extern-call operands and graph outputs).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct View {
    /// The buffer viewed.
    pub buffer: BufferId,
    /// Sizes of the view.
    pub shape: Shape,
    /// Strides in elements, one per dim.
    pub strides: Vec<usize>,
    /// Element offset of the first element.
    pub offset: usize,
}

/// How a reduction combines the elements of the inner space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Combiner {
    /// Sum.
    Sum,
    /// Sum divided by the number of inner elements.
    Mean,
    /// Product.
    Prod,
    /// Maximum (`amax`).
    Max,
    /// Minimum (`amin`).
    Min,
    /// Logical and (result bool, or u8 for u8 input as in PyTorch).
    All,
    /// Logical or (result bool, or u8 for u8 input).
    Any,
    /// Position of the first maximum in the row-major order of `inner` (i64; NaN wins).
    ArgMax,
    /// Position of the first minimum (i64; NaN wins).
    ArgMin,
}

impl Combiner {
    /// Name in dumps.
    pub fn name(self) -> &'static str {
        match self {
            Combiner::Sum => "sum",
            Combiner::Mean => "mean",
            Combiner::Prod => "prod",
            Combiner::Max => "max",
            Combiner::Min => "min",
            Combiner::All => "all",
            Combiner::Any => "any",
            Combiner::ArgMax => "argmax",
            Combiner::ArgMin => "argmin",
        }
    }
}

/// The accumulator dtype of a reduction over `d`: f16/bf16 accumulate in f32, integers and
/// bool in i64, f32 and f64 in themselves.
pub fn accumulator(d: DType) -> DType {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => DType::F32,
        DType::F64 => DType::F64,
        _ => DType::I64,
    }
}

/// How a value is computed. Operands are earlier values of the same kernel.
///
/// Typing contract: a `Binary` op's operands both have the op's computation dtype
/// (`BinaryOp::compute_dtype`; casts are explicit), its result is that dtype or bool for
/// comparisons and logical ops; `Where`'s branches have the result dtype; `Clamp`'s operand
/// has the result dtype; a `Unary` op reads its operand in its own dtype and produces
/// `UnaryOp::out_dtype`. Semantics of every op are those of the eager kernels (PyTorch's).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Expr {
    /// The element of `buffer` at `map(i)`.
    Load {
        /// The buffer read.
        buffer: BufferId,
        /// Where in it.
        map: IndexMap,
    },
    /// `map(i)` itself as an i64 (positions for `arange`, masks such as `tril`).
    Index {
        /// The map whose value is taken.
        map: IndexMap,
    },
    /// A constant, converted to the value's dtype with cast semantics.
    Const(Scalar),
    /// A unary op of a value.
    Unary(UnaryOp, ValId),
    /// A binary op of two values (both already in the compute dtype).
    Binary(BinaryOp, ValId, ValId),
    /// `cond ? a : b`.
    Where(ValId, ValId, ValId),
    /// `clamp(x, min, max)`, bounds optional.
    Clamp {
        /// The value clamped.
        x: ValId,
        /// Lower bound.
        min: Option<Scalar>,
        /// Upper bound.
        max: Option<Scalar>,
    },
    /// Conversion to the value's dtype with PyTorch's cast semantics.
    Cast(ValId),
    /// `mask ? value : x`, `value` converted to `x`'s dtype.
    MaskedFill {
        /// The value kept where `mask` is false.
        x: ValId,
        /// A bool value.
        mask: ValId,
        /// The fill value.
        value: Scalar,
    },
    /// A reduction of `arg` over the inner space, accumulated in `acc`; an outer-level value.
    Reduce {
        /// How the elements are combined.
        combiner: Combiner,
        /// The value reduced (an inner-level value).
        arg: ValId,
        /// The accumulator's dtype.
        acc: DType,
    },
}

impl Expr {
    /// Renames the values this expression reads.
    pub fn map_operands(&mut self, f: impl Fn(ValId) -> ValId) {
        match self {
            Expr::Load { .. } | Expr::Index { .. } | Expr::Const(_) => {}
            Expr::Unary(_, a) | Expr::Cast(a) | Expr::Clamp { x: a, .. } => *a = f(*a),
            Expr::Reduce { arg, .. } => *arg = f(*arg),
            Expr::Binary(_, a, b) | Expr::MaskedFill { x: a, mask: b, .. } => {
                *a = f(*a);
                *b = f(*b);
            }
            Expr::Where(c, a, b) => {
                *c = f(*c);
                *a = f(*a);
                *b = f(*b);
            }
        }
    }

    /// The values this expression reads.
    pub fn operands(&self) -> Vec<ValId> {
        match *self {
            Expr::Load { .. } | Expr::Index { .. } | Expr::Const(_) => vec![],
            Expr::Unary(_, a) | Expr::Cast(a) | Expr::Clamp { x: a, .. } => vec![a],
            Expr::Reduce { arg, .. } => vec![arg],
            Expr::Binary(_, a, b) | Expr::MaskedFill { x: a, mask: b, .. } => vec![a, b],
            Expr::Where(c, a, b) => vec![c, a, b],
        }
    }
}

/// One SSA value of a kernel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Value {
    /// How it is computed.
    pub expr: Expr,
    /// Its dtype.
    pub dtype: DType,
}

/// Whether a value varies along the inner space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// One value per row: computed once per point of `outer`.
    Outer,
    /// One value per point of `outer ++ inner`.
    Inner,
}

/// A write of `value` to `buffer` at `map(i)`. A store whose map has zero inner strides is a
/// row store: it runs once per row, after the passes; any other store runs over the whole
/// space (an outer-level value is then broadcast along the row).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Store {
    /// The buffer written.
    pub buffer: BufferId,
    /// Where in it.
    pub map: IndexMap,
    /// The value written (of the buffer's dtype).
    pub value: ValId,
}

/// One fused kernel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Kernel {
    /// The kernel's name (`k0`), for dumps and generated code.
    pub name: String,
    /// The parallel ("rows") index space; the whole space of a pointwise kernel.
    pub outer: Shape,
    /// The reduced ("row") index space; empty for pointwise kernels.
    pub inner: Shape,
    /// The scalar DAG, operands before users.
    pub values: Vec<Value>,
    /// Reduction passes over the row, in order; each lists `Reduce` values.
    pub passes: Vec<Vec<ValId>>,
    /// The writes, in order.
    pub stores: Vec<Store>,
}

impl Kernel {
    /// Drops the values no store and no reduction needs (constants a cast replaced, say),
    /// renumbering the rest in order; what the kernel computes is unchanged.
    pub fn prune(&mut self) {
        let mut live = vec![false; self.values.len()];
        let mut stack: Vec<ValId> = self.stores.iter().map(|s| s.value).collect();
        stack.extend(self.passes.iter().flatten());
        while let Some(v) = stack.pop() {
            if v < live.len() && !live[v] {
                live[v] = true;
                stack.extend(self.values[v].expr.operands());
            }
        }
        if live.iter().all(|&l| l) {
            return;
        }
        let mut new_id = vec![usize::MAX; self.values.len()];
        let mut values = Vec::with_capacity(self.values.len());
        for (i, v) in std::mem::take(&mut self.values).into_iter().enumerate() {
            if live[i] {
                new_id[i] = values.len();
                let mut v = v;
                v.expr.map_operands(|o| new_id[o]);
                values.push(v);
            }
        }
        self.values = values;
        for p in &mut self.passes {
            p.iter_mut().for_each(|r| *r = new_id[*r]);
        }
        self.stores
            .iter_mut()
            .for_each(|s| s.value = new_id[s.value]);
    }

    /// The full index space `outer ++ inner`.
    pub fn space(&self) -> Shape {
        let mut s = self.outer.clone();
        s.extend_from_slice(&self.inner);
        s
    }

    /// Number of reductions.
    pub fn reductions(&self) -> usize {
        self.passes.iter().map(Vec::len).sum()
    }

    /// The level of every value.
    pub fn levels(&self) -> Vec<Level> {
        let k = self.outer.len();
        let mut lv = Vec::with_capacity(self.values.len());
        for v in &self.values {
            let l = match &v.expr {
                Expr::Load { map, .. } | Expr::Index { map } => {
                    if map.ignores_from(k) {
                        Level::Outer
                    } else {
                        Level::Inner
                    }
                }
                Expr::Const(_) | Expr::Reduce { .. } => Level::Outer,
                e => {
                    if e.operands()
                        .iter()
                        .any(|&o| lv.get(o) == Some(&Level::Inner))
                    {
                        Level::Inner
                    } else {
                        Level::Outer
                    }
                }
            };
            lv.push(l);
        }
        lv
    }
}

/// A call to a library kernel: `op` applied to strided views, result in `out`.
/// `Op::Matmul` is a GEMM (the gemm crate on the CPU, cuBLAS on the GPU); any other op runs
/// the eager reference kernel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExternCall {
    /// The op (its attributes; operands come from `args`).
    pub op: Op,
    /// The operands, as strided views.
    pub args: Vec<View>,
    /// The buffer the (contiguous) result is written to.
    pub out: BufferId,
}

/// A control op (`cond`, `while_loop`, `fori_loop`, `scan`): the executor runs its bodies,
/// each compiled as a schedule of its own, and hands the results over as buffers.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ControlCall {
    /// The op and its bodies.
    pub control: Control,
    /// The operands, as strided views.
    pub args: Vec<View>,
    /// The buffer of each result (`None`: nothing reads it).
    pub outs: Vec<Option<BufferId>>,
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Step {
    /// A fused kernel.
    Kernel(Kernel),
    /// A library call.
    Extern(ExternCall),
    /// A branch or a loop over sub-schedules.
    Control(ControlCall),
}

/// A compiled graph: buffers, steps in execution order, and where the outputs are.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    /// The graph's name.
    pub name: String,
    /// Every buffer: inputs, constants and temporaries.
    pub buffers: Vec<Buffer>,
    /// The buffers of the graph inputs, in order.
    pub inputs: Vec<BufferId>,
    /// The graph outputs, in order.
    pub outputs: Vec<View>,
    /// What runs, in order.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// Which outputs a call must return as fresh copies: those the passes resolved to a
    /// constant (a call must not hand out, for in-place writes, memory that later calls
    /// read), and those resolved to an input where the graph's output (`may_alias[i]`, from
    /// [`Graph::may_alias_input`](crate::ir::graph::Graph::may_alias_input)) would be new
    /// memory in PyTorch (`x * 1` folded to `x`).
    pub fn fresh_outputs(&self, may_alias: &[bool]) -> Vec<bool> {
        self.outputs
            .iter()
            .enumerate()
            .map(|(i, v)| match self.buffers[v.buffer].kind {
                BufferKind::Constant(_) => true,
                BufferKind::Input(_) => !may_alias.get(i).copied().unwrap_or(true),
                BufferKind::Temp => false,
            })
            .collect()
    }

    /// The fused kernels, in order.
    pub fn kernels(&self) -> impl Iterator<Item = &Kernel> {
        self.steps.iter().filter_map(|s| match s {
            Step::Kernel(k) => Some(k),
            Step::Extern(_) | Step::Control(_) => None,
        })
    }

    /// The extern calls, in order.
    pub fn externs(&self) -> impl Iterator<Item = &ExternCall> {
        self.steps.iter().filter_map(|s| match s {
            Step::Extern(e) => Some(e),
            Step::Kernel(_) | Step::Control(_) => None,
        })
    }

    /// The control steps, in order.
    pub fn controls(&self) -> impl Iterator<Item = &ControlCall> {
        self.steps.iter().filter_map(|s| match s {
            Step::Control(c) => Some(c),
            Step::Kernel(_) | Step::Extern(_) => None,
        })
    }

    /// Number of fused kernels.
    pub fn kernel_count(&self) -> usize {
        self.kernels().count()
    }

    /// Number of GEMM extern calls.
    pub fn gemm_count(&self) -> usize {
        self.externs().filter(|e| e.op == Op::Matmul).count()
    }

    /// Checks every invariant a backend relies on: ids in range, SSA order, typing of loads
    /// and stores, pass structure, and that every map stays inside its buffer.
    pub fn validate(&self) -> Result<()> {
        // sizes first: everything below multiplies them
        for (i, b) in self.buffers.iter().enumerate() {
            let bytes = crate::ir::shape::checked_numel(&b.shape)
                .ok()
                .and_then(|n| n.checked_mul(b.dtype.size()));
            if bytes.is_none_or(|n| n > isize::MAX as usize) {
                bail!(
                    Value,
                    "schedule: buffer b{i} of shape {:?} is too large",
                    b.shape
                );
            }
        }
        for &b in &self.inputs {
            self.buffer(b)?;
        }
        for v in &self.outputs {
            self.check_view(v)?;
        }
        for s in &self.steps {
            match s {
                Step::Kernel(k) => check_kernel(k, &self.buffers)?,
                Step::Extern(e) => {
                    self.buffer(e.out)?;
                    for a in &e.args {
                        self.check_view(a)?;
                    }
                }
                Step::Control(c) => {
                    for a in &c.args {
                        self.check_view(a)?;
                    }
                    let tys: Vec<crate::ir::op::TensorType> = c
                        .args
                        .iter()
                        .map(|a| {
                            let b = self.buffer(a.buffer)?;
                            Ok(crate::ir::op::TensorType::new(b.dtype, a.shape.clone()))
                        })
                        .collect::<Result<_>>()?;
                    let res = c.control.result_types(&tys.iter().collect::<Vec<_>>())?;
                    if res.len() != c.outs.len() {
                        bail!(
                            Value,
                            "schedule: a {} step has {} results but {} buffers",
                            c.control.name(),
                            res.len(),
                            c.outs.len()
                        );
                    }
                    for (t, b) in res.iter().zip(&c.outs) {
                        if let Some(b) = b {
                            let buf = self.buffer(*b)?;
                            if buf.dtype != t.dtype || buf.shape != t.shape {
                                bail!(
                                    Value,
                                    "schedule: b{b} does not have the type of its {} result",
                                    c.control.name()
                                );
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn buffer(&self, b: BufferId) -> Result<&Buffer> {
        buffer_in(&self.buffers, b)
    }

    fn check_view(&self, v: &View) -> Result<()> {
        let buf = self.buffer(v.buffer)?;
        let map = IndexMap {
            strides: v.strides.clone(),
            offset: v.offset,
        };
        if v.strides.len() != v.shape.len() || map.extent(&v.shape) > buf.len() {
            bail!(Value, "schedule: a view of b{} leaves the buffer", v.buffer);
        }
        Ok(())
    }
}

fn buffer_in(buffers: &[Buffer], b: BufferId) -> Result<&Buffer> {
    match buffers.get(b) {
        Some(buf) => Ok(buf),
        None => bail!(Value, "schedule: buffer b{b} does not exist"),
    }
}
