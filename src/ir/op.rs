//! The op set. Each op's shape and dtype rule is defined here once; eager tensors, the graph
//! verifier and the parser all call `Op::infer`.

use super::conv::{BatchNormAttrs, ConvAttrs, PoolAttrs};
use super::dtype::{DType, PromoteArg, Scalar, result_type};
use super::shape::{
    Shape, arange_len, broadcast_all, broadcast_shapes, expand_shape, flatten_shape, infer_size,
    matmul_shape, numel, permute_shape, reduced_shape, wrap_dim, wrap_dims,
};
use super::unary::Real;
use crate::{Error, Result, bail};
use std::sync::Arc;

pub use super::unary::UnaryOp;
// The shape math moved to `ir::shape`; these re-exports keep the runtime's imports working.
pub use super::shape::{
    diagonal_len, diagonal_shape, narrow_range, reduction_dims, select_index, slice_range,
};

/// The type of a value: dtype, shape, and whether it is a wrapped Python number.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub shape: Shape,
    /// A Python scalar operand ("wrapped number"): 0-d, lowest priority in type promotion.
    pub wrapped: bool,
}

impl TensorType {
    /// A tensor type that is not a wrapped number.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
            wrapped: false,
        }
    }
    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    fn promote_arg(&self) -> PromoteArg {
        PromoteArg {
            dtype: self.dtype,
            zero_dim: self.shape.is_empty(),
            wrapped: self.wrapped,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
/// A pointwise op of two broadcast operands.
pub enum BinaryOp {
    /// `torch.add`: `a + b`.
    Add,
    /// `torch.sub`: `a - b` (refused for two bools).
    Sub,
    /// `torch.mul`: `a * b`.
    Mul,
    /// `torch.div`: true division (integers give the default float).
    Div,
    /// `torch.pow`: `a ** b`.
    Pow,
    /// `torch.maximum`: the larger element (NaN propagates).
    Maximum,
    /// `torch.minimum`: the smaller element (NaN propagates).
    Minimum,
    /// `torch.remainder`: Python's `%` (the result has the divisor's sign).
    Remainder,
    /// `torch.div(a, b, rounding_mode="floor")` (`torch.floor_divide`): the quotient
    /// rounded down, in the operands' common dtype (Python's `//`).
    DivFloor,
    /// `torch.div(a, b, rounding_mode="trunc")`: the quotient rounded toward zero, in the
    /// operands' common dtype.
    DivTrunc,
    /// `torch.eq`: `a == b`, as bool.
    Eq,
    /// `torch.ne`: `a != b`, as bool.
    Ne,
    /// `torch.lt`: `a < b`, as bool.
    Lt,
    /// `torch.le`: `a <= b`, as bool.
    Le,
    /// `torch.gt`: `a > b`, as bool.
    Gt,
    /// `torch.ge`: `a >= b`, as bool.
    Ge,
    /// `torch.logical_and`: both nonzero, as bool.
    LogicalAnd,
    /// `torch.logical_or`: either nonzero, as bool.
    LogicalOr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
/// A reduction over some dims (`Op::Reduce`).
pub enum ReduceOp {
    /// `torch.sum` (integers and bool sum in i64).
    Sum,
    /// `torch.mean` (floating dtypes only).
    Mean,
    /// `torch.prod` (integers and bool multiply in i64).
    Prod,
    /// `torch.amax`: the maximum.
    Amax,
    /// `torch.amin`: the minimum.
    Amin,
    /// `torch.all`: whether every element is nonzero.
    All,
    /// `torch.any`: whether some element is nonzero.
    Any,
    /// `torch.logsumexp`: `log(sum(exp(x)))`, computed stably.
    LogSumExp,
}

/// Tensor data embedded in a graph (a captured constant): raw little-endian bytes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Literal {
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub shape: Shape,
    /// The elements, row-major (shared, so cloning an op is cheap).
    pub bytes: Arc<Vec<u8>>,
}

/// One operation. Attribute names follow PyTorch's argument names.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    // leaves
    /// A Python scalar operand.
    Scalar(Scalar),
    /// A captured tensor.
    Constant(Literal),
    /// `torch.full`: a tensor of `size` filled with `fill_value`.
    Full {
        /// The result's sizes.
        size: Vec<usize>,
        /// The value of every element.
        fill_value: Scalar,
        /// The result dtype; `None` infers it from `fill_value`.
        dtype: Option<DType>,
    },
    /// `torch.arange`: `start, start + step, ...` below `end` (above it for a negative step).
    Arange {
        /// First value.
        start: Scalar,
        /// Bound, excluded.
        end: Scalar,
        /// Difference between neighbours (nonzero).
        step: Scalar,
        /// The result dtype; `None` infers it from the bounds and step.
        dtype: Option<DType>,
    },
    // pointwise
    /// A unary pointwise op (the table in `ir/unary.rs`).
    Unary(UnaryOp),
    /// A binary pointwise op, operands broadcast.
    Binary(BinaryOp),
    /// `torch.where(cond, x, y)`: `x` where `cond`, else `y`. Operands: cond (bool), x, y.
    Where,
    /// `torch.clamp`: `x` limited to `[min, max]`; at least one bound is given.
    Clamp {
        /// Lower bound.
        min: Option<Scalar>,
        /// Upper bound.
        max: Option<Scalar>,
    },
    /// `Tensor.to(dtype)`: conversion with PyTorch's cast semantics.
    To {
        /// The target dtype.
        dtype: DType,
    },
    /// `Tensor.masked_fill(mask, value)`: `value` where `mask`. Operands: x, mask (bool).
    MaskedFill {
        /// The fill value.
        value: Scalar,
    },
    // reductions
    /// A reduction (`sum`, `mean`, `amax`, ...) over `dim`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The dims reduced; `None` reduces all of them.
        dim: Option<Vec<i64>>,
        /// Keep the reduced dims with size 1.
        keepdim: bool,
    },
    /// `torch.argmax`: index of the first maximum along `dim`, as i64.
    ArgMax {
        /// The dim searched; `None` searches the flattened tensor.
        dim: Option<i64>,
        /// Keep the reduced dim with size 1.
        keepdim: bool,
    },
    /// `torch.argmin`: index of the first minimum along `dim`, as i64.
    ArgMin {
        /// The dim searched; `None` searches the flattened tensor.
        dim: Option<i64>,
        /// Keep the reduced dim with size 1.
        keepdim: bool,
    },
    /// `torch.var`: variance over `dim`.
    Var {
        /// The dims reduced; `None` reduces all of them.
        dim: Option<Vec<i64>>,
        /// Subtracted from the element count in the divisor (1: Bessel's correction).
        correction: f64,
        /// Keep the reduced dims with size 1.
        keepdim: bool,
    },
    /// `torch.std`: standard deviation over `dim`.
    Std {
        /// The dims reduced; `None` reduces all of them.
        dim: Option<Vec<i64>>,
        /// Subtracted from the element count in the divisor (1: Bessel's correction).
        correction: f64,
        /// Keep the reduced dims with size 1.
        keepdim: bool,
    },
    /// `torch.cumsum`: running sums along `dim`.
    Cumsum {
        /// The dim summed along.
        dim: i64,
    },
    // normalisation
    /// `torch.softmax`: `exp(x)` normalised to sum to 1 along `dim`.
    Softmax {
        /// The dim normalised.
        dim: i64,
    },
    /// `torch.log_softmax`: `log(softmax(x))`, computed stably.
    LogSoftmax {
        /// The dim normalised.
        dim: i64,
    },
    /// Operands: x, then weight and bias when present.
    LayerNorm {
        /// The trailing sizes normalised over.
        normalized_shape: Vec<usize>,
        /// Added to the variance before the square root.
        eps: f64,
        /// Whether a weight operand follows `x`.
        has_weight: bool,
        /// Whether a bias operand is last.
        has_bias: bool,
    },
    // linear algebra
    /// `torch.matmul`, with its rules for 1-D, 2-D and batched operands.
    Matmul,
    /// Operands: x, weight, then bias when present.
    Linear {
        /// Whether a bias operand follows the weight.
        has_bias: bool,
    },
    /// `torch.nn.functional.scaled_dot_product_attention`: `softmax(q kᵀ · scale + mask) v`
    /// over the last two dims. Operands: q `[.., L, E]`, k `[.., S, E]`, v `[.., S, Ev]`
    /// (the same leading dims), then a mask broadcastable to `[.., L, S]` when present:
    /// bool (true takes part) or of q's dtype (added to the scores).
    Attention {
        /// Whether a mask operand follows v.
        has_mask: bool,
        /// Only positions `j <= i` take part (a lower-triangular mask aligned at the top
        /// left, as PyTorch's).
        is_causal: bool,
        /// The scale of the scores; `None`: `1 / sqrt(E)`.
        scale: Option<crate::ir::unary::Real>,
    },
    /// The gradients of [`Op::Attention`] with respect to q, k and v in one pass
    /// (`aten::_scaled_dot_product_flash_attention_backward`): per block of query rows the
    /// probabilities are recomputed, so no `[L, S]` matrix of the whole batch exists.
    /// Operands: the output's gradient `[.., L, Ev]`, q, k, v, then the mask when present
    /// (as for `Attention`). Result: 1-D, the three gradients flattened and concatenated
    /// (q's, then k's, then v's), in q's dtype.
    AttentionGrad {
        /// Whether a mask operand follows v.
        has_mask: bool,
        /// As `Attention`'s.
        is_causal: bool,
        /// As `Attention`'s.
        scale: Option<crate::ir::unary::Real>,
    },
    /// `torch.einsum`: a sum of products named by `equation`, over any number of operands.
    Einsum {
        /// The subscripts (`ij,jk->ik`).
        equation: String,
    },
    // movement
    /// `Tensor.reshape`: the same elements in another shape (a copy only when needed).
    Reshape {
        /// The new sizes; one may be `-1` (inferred).
        shape: Vec<i64>,
    },
    /// `Tensor.view`: `reshape` that must not copy.
    View {
        /// The new sizes; one may be `-1` (inferred).
        shape: Vec<i64>,
    },
    /// `Tensor.permute`: the dims reordered.
    Permute {
        /// For each result dim, the operand dim it takes.
        dims: Vec<i64>,
    },
    /// `torch.transpose`: two dims swapped.
    Transpose {
        /// One dim.
        dim0: i64,
        /// The other.
        dim1: i64,
    },
    /// `Tensor.t`: transpose of a tensor of at most 2 dims.
    T,
    /// `Tensor.expand`: size-1 dims broadcast to a larger size (a view, stride 0).
    Expand {
        /// The new sizes; `-1` keeps a dim's size; extra leading dims may be added.
        size: Vec<i64>,
    },
    /// `torch.squeeze`: size-1 dims removed.
    Squeeze {
        /// The dims to remove if they have size 1; `None`: every size-1 dim.
        dim: Option<Vec<i64>>,
    },
    /// `torch.unsqueeze`: a size-1 dim inserted at `dim`.
    Unsqueeze {
        /// Where the new dim goes (negative counts from the end of the result).
        dim: i64,
    },
    /// `torch.flatten`: dims `start_dim..=end_dim` merged into one.
    Flatten {
        /// First dim merged.
        start_dim: i64,
        /// Last dim merged (inclusive).
        end_dim: i64,
    },
    /// `torch.narrow`: `length` elements of `dim` from `start`.
    Narrow {
        /// The dim narrowed.
        dim: i64,
        /// First index kept.
        start: i64,
        /// Number of indices kept.
        length: i64,
    },
    /// `torch.select`: index `index` of `dim`, that dim removed.
    Select {
        /// The dim indexed.
        dim: i64,
        /// The index (negative counts from the end).
        index: i64,
    },
    /// Python slicing `x[start:end:step]` along one dim (bounds clamp as in Python).
    Slice {
        /// The dim sliced.
        dim: i64,
        /// First index; `None`: the start (the end for a negative step).
        start: Option<i64>,
        /// Bound, excluded; `None`: past the end.
        end: Option<i64>,
        /// Stride between kept indices.
        step: i64,
    },
    /// `torch.diagonal`: the diagonal of the `dim1`/`dim2` planes, as a last dim.
    Diagonal {
        /// Which diagonal: 0 the main one, positive above it, negative below.
        offset: i64,
        /// First dim of the planes.
        dim1: i64,
        /// Second dim of the planes.
        dim2: i64,
    },
    /// `Tensor.contiguous`: the elements in row-major order (a copy only when needed).
    Contiguous,
    /// `Tensor.repeat`: the tensor tiled `repeats[d]` times along each dim.
    Repeat {
        /// Copies along each dim (may add leading dims).
        repeats: Vec<usize>,
    },
    /// `torch.cat`: the operands joined along `dim`.
    Cat {
        /// The dim joined along.
        dim: i64,
    },
    /// `torch.stack`: the operands joined along a new dim `dim`.
    Stack {
        /// Where the new dim goes.
        dim: i64,
    },
    /// `torch.flip`: the order of `dims` reversed.
    Flip {
        /// The dims reversed.
        dims: Vec<i64>,
    },
    /// `torch.tril`: elements above the `diagonal`-th diagonal of the last two dims zeroed.
    Tril {
        /// 0 the main diagonal, positive above it, negative below.
        diagonal: i64,
    },
    /// `torch.triu`: elements below the `diagonal`-th diagonal of the last two dims zeroed.
    Triu {
        /// 0 the main diagonal, positive above it, negative below.
        diagonal: i64,
    },
    // indexing
    /// `torch.index_select`: the entries of `dim` at a 1-D index. Operands: x, index.
    IndexSelect {
        /// The dim indexed.
        dim: i64,
    },
    /// `torch.gather`: `out[i][j] = x[index[i][j]][j]` for `dim = 0`. Operands: x, index.
    Gather {
        /// The dim indexed.
        dim: i64,
    },
    /// `torch.scatter`: `x` with `out[index[i][j]][j] = src[i][j]` for `dim = 0`. Operands: x,
    /// index, src.
    Scatter {
        /// The dim indexed.
        dim: i64,
    },
    /// `torch.scatter_add`: as `Scatter`, but `src` is added (duplicates accumulate). Operands: x,
    /// index, src.
    ScatterAdd {
        /// The dim indexed.
        dim: i64,
    },
    /// `torch.index_add`: `source`'s entries of `dim` added to `x`'s at a 1-D index. Operands: x,
    /// index, source.
    IndexAdd {
        /// The dim indexed.
        dim: i64,
    },
    /// Operands: index, weight (the order of `torch.nn.functional.embedding`).
    Embedding,
    // convolutional networks (attributes and shape rules in `ir::conv`)
    /// `conv1d`/`conv2d(x, weight, bias)`: x `[N, C, *spatial]` (or without N), weight
    /// `[C_out, C / groups, *kernel]`, then a bias `[C_out]` when present.
    Conv {
        /// Stride, padding, dilation, groups.
        conv: ConvAttrs,
        /// Whether a bias operand follows the weight.
        has_bias: bool,
    },
    /// The gradient of a convolution with respect to its input (a transposed convolution).
    /// Operands: the output's gradient `[N, C_out, *out]`, the weight.
    ConvInputGrad {
        /// The forward convolution's attributes.
        conv: ConvAttrs,
        /// The input's shape `[N, C, *spatial]`.
        input_size: Vec<usize>,
    },
    /// The gradient of a convolution with respect to its weight. Operands: the output's
    /// gradient, the input `[N, C, *spatial]`.
    ConvWeightGrad {
        /// The forward convolution's attributes.
        conv: ConvAttrs,
        /// The weight's shape.
        weight_size: Vec<usize>,
    },
    /// `max_pool2d(x)` over `[N, C, H, W]` or `[C, H, W]`.
    MaxPool2d {
        /// Window, stride, padding, dilation, ceil_mode.
        pool: PoolAttrs,
    },
    /// The gradient of `max_pool2d`, routed to the first maximal element of each window.
    /// Operands: the output's gradient, the input.
    MaxPool2dGrad {
        /// The forward pooling's attributes.
        pool: PoolAttrs,
    },
    /// `avg_pool2d(x)` over `[N, C, H, W]` or `[C, H, W]`.
    AvgPool2d {
        /// Window, stride, padding, ceil_mode (dilation is 1).
        pool: PoolAttrs,
        /// Whether padded zeros count in a window's divisor.
        count_include_pad: bool,
    },
    /// The gradient of `avg_pool2d`. Operand: the output's gradient.
    AvgPool2dGrad {
        /// The forward pooling's attributes.
        pool: PoolAttrs,
        /// Whether padded zeros count in a window's divisor.
        count_include_pad: bool,
        /// The input's shape.
        input_size: Vec<usize>,
    },
    /// `adaptive_avg_pool2d(x, output_size)`: windows that tile the input into the output size.
    AdaptiveAvgPool2d {
        /// Output height and width.
        output_size: Vec<i64>,
    },
    /// The gradient of `adaptive_avg_pool2d`. Operand: the output's gradient.
    AdaptiveAvgPool2dGrad {
        /// The input's shape.
        input_size: Vec<usize>,
    },
    /// `batch_norm(x, running_mean, running_var, weight, bias)` over dim 1 of `[N, C, ..]`;
    /// the optional operands follow `x` in that order when present.
    BatchNorm(BatchNormAttrs),
    /// `dropout(x, p)`: each element zeroed with probability `p` and the rest scaled by
    /// `1 / (1 - p)`; the mask is a pure function of `seed` and the element's index.
    Dropout {
        /// The probability of zeroing an element.
        p: Real,
        /// Whether to drop at all (`false`: the identity).
        training: bool,
        /// The mask's seed.
        seed: u64,
    },
    // communication
    /// `torch.distributed.all_reduce` of a copy of the operand over the default process
    /// group: every rank gets the elementwise `op` of all ranks' values. An extern step
    /// with a side effect (it talks to the other ranks): never folded, and run in the
    /// graph's order, which every rank shares.
    AllReduce {
        /// How the ranks' values combine.
        op: super::collective::ReduceOp,
    },
    // control flow (`ir::control`)
    /// `cond`, `while_loop`, `fori_loop` or `scan`: the op's node has the marker type
    /// [`tuple_type`](super::control::tuple_type); its values are the `Result` nodes.
    Control(Box<super::control::Control>),
    /// Result `index` of the control op that is its operand, of type `ty`.
    Result {
        /// Which result.
        index: usize,
        /// Its type (the control op's typing rule gives it; the verifier checks it).
        ty: TensorType,
    },
}

fn not_implemented(name: &str, d: DType) -> Error {
    Error::DType(format!(
        "\"{name}\" not implemented for '{}'",
        d.scalar_name()
    ))
}

fn check_arity(name: &str, inputs: &[&TensorType], n: usize) -> Result<()> {
    if inputs.len() != n {
        bail!(
            Value,
            "{name}() takes {n} tensor operand{}, but {} were given",
            if n == 1 { "" } else { "s" },
            inputs.len()
        );
    }
    Ok(())
}

fn is_index_dtype(d: DType) -> bool {
    matches!(d, DType::I64 | DType::I32)
}

impl Op {
    /// Arithmetic operations of the op on operands of shapes `inputs` with result shape
    /// `out` (what profilers report): `2·m·n·k` for a matrix product, `2·L·S·(E + Ev)` per
    /// batch for attention, none for a view, one per result element otherwise.
    pub fn flops(&self, inputs: &[&[usize]], out: &[usize]) -> u64 {
        let n = numel(out) as u64;
        let last = |i: usize| inputs.get(i).and_then(|s| s.last()).copied().unwrap_or(1) as u64;
        match self {
            Op::Matmul | Op::Linear { .. } => 2 * n * last(0),
            Op::Attention { .. } => {
                // out is [.., L, Ev]; k is [.., S, E]
                let k = inputs.get(1).copied().unwrap_or(&[]);
                let s = if k.len() >= 2 { k[k.len() - 2] } else { 1 } as u64;
                let ev = out.last().copied().unwrap_or(1).max(1) as u64;
                2 * (n / ev) * s * (last(0) + ev)
            }
            Op::AttentionGrad { .. } => {
                // g is [.., L, Ev], q [.., L, E], k [.., S, E]: five products of the
                // forward's sizes (scores, dP, dV, dQ, dK)
                let (g, q, k) = (
                    inputs.first().copied().unwrap_or(&[]),
                    inputs.get(1).copied().unwrap_or(&[]),
                    inputs.get(2).copied().unwrap_or(&[]),
                );
                let rows = numel(q) as u64 / last(1).max(1);
                let s = if k.len() >= 2 { k[k.len() - 2] } else { 1 } as u64;
                let ev = g.last().copied().unwrap_or(1) as u64;
                let e = last(1);
                2 * rows * s * (3 * e + 2 * ev)
            }
            // per output element, one multiply-add per tap of its input channels
            Op::Conv { .. } => 2 * n * inputs.get(1).map_or(1, |w| numel(&w[1..]) as u64),
            Op::ConvInputGrad { .. } => {
                let g = inputs.first().map_or(0, |g| numel(g)) as u64;
                2 * g * inputs.get(1).map_or(1, |w| numel(&w[1..]) as u64)
            }
            Op::ConvWeightGrad { weight_size, .. } => {
                let g = inputs.first().map_or(0, |g| numel(g)) as u64;
                2 * g * numel(&weight_size[1..]) as u64
            }
            _ if self.is_view() => 0,
            _ => n,
        }
    }
}

/// Checks a convolution gradient's operands: the forward convolution of `x` by `w` has the
/// gradient's type, and both gradient ops take batched operands.
fn conv_grad_type(
    op: &Op,
    conv: &super::conv::ConvAttrs,
    g: &TensorType,
    x: &TensorType,
    w: &TensorType,
) -> Result<()> {
    if x.ndim() != conv.spatial() + 2 {
        bail!(
            Shape,
            "{}: expected a batched input of {} dims, got {:?}",
            op.name(),
            conv.spatial() + 2,
            x.shape
        );
    }
    let y = super::conv::conv_type(conv, x, w, None)?;
    grad_matches(op.name(), g, &y)
}

/// A gradient operand must have its forward result's type.
fn grad_matches(name: &str, g: &TensorType, y: &TensorType) -> Result<()> {
    if g.shape != y.shape || g.dtype != y.dtype {
        bail!(
            Shape,
            "{name}: expected a gradient of type {}{:?}, got {}{:?}",
            y.dtype,
            y.shape,
            g.dtype,
            g.shape
        );
    }
    Ok(())
}

/// The result type of attention over q, k, v (and a mask): checks PyTorch's rules.
fn attention_type(inputs: &[&TensorType], has_mask: bool) -> Result<TensorType> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let name = "scaled_dot_product_attention";
    if !q.dtype.is_float() {
        bail!(
            DType,
            "{name}: expected a floating-point query, got {}",
            q.dtype.scalar_name()
        );
    }
    if k.dtype != q.dtype || v.dtype != q.dtype {
        bail!(
            DType,
            "Expected query, key, and value to have the same dtype, but got query.dtype: {} key.dtype: {} and value.dtype: {} instead.",
            q.dtype.scalar_name(),
            k.dtype.scalar_name(),
            v.dtype.scalar_name()
        );
    }
    if q.ndim() < 2 || k.ndim() != q.ndim() || v.ndim() != q.ndim() {
        bail!(
            Shape,
            "{name}: query, key and value must have the same number of dims, at least 2; got {:?}, {:?} and {:?}",
            q.shape,
            k.shape,
            v.shape
        );
    }
    let n = q.ndim();
    let (l, e) = (q.shape[n - 2], q.shape[n - 1]);
    let (s, ek) = (k.shape[n - 2], k.shape[n - 1]);
    if q.shape[..n - 2] != k.shape[..n - 2] || q.shape[..n - 2] != v.shape[..n - 2] {
        bail!(
            Shape,
            "{name}: query, key and value must have the same batch dims; got {:?}, {:?} and {:?}",
            q.shape,
            k.shape,
            v.shape
        );
    }
    if ek != e || v.shape[n - 2] != s {
        bail!(
            Shape,
            "{name}: key must be [.., {s}, {e}] and value [.., {s}, Ev] for a query [.., {l}, {e}]; got key {:?} and value {:?}",
            k.shape,
            v.shape
        );
    }
    if has_mask {
        let m = inputs[3];
        if !m.dtype.is_bool() && m.dtype != q.dtype {
            bail!(
                DType,
                "Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: {} and query.dtype: {} instead.",
                m.dtype.scalar_name(),
                q.dtype.scalar_name()
            );
        }
        let mut scores = q.shape[..n - 2].to_vec();
        scores.extend([l, s]);
        if broadcast_shapes(&m.shape, &scores).ok().as_ref() != Some(&scores) {
            bail!(
                Shape,
                "{name}: attn_mask of shape {:?} does not broadcast to the scores' shape {:?}",
                m.shape,
                scores
            );
        }
    }
    let mut shape = q.shape[..n - 1].to_vec();
    shape.push(v.shape[n - 1]);
    Ok(TensorType::new(q.dtype, shape))
}

pub use smelt_rt::scalar::div_floor_float;

/// Floor division of integers (`div_floor_integer`), wrapping (`MIN // -1` is `MIN`); the
/// caller refuses a zero divisor.
pub fn div_floor_int(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if a.wrapping_rem(b) != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// Truncating division of integers (C's `/`), wrapping; the caller refuses a zero divisor.
pub fn div_trunc_int(a: i64, b: i64) -> i64 {
    if b == 0 { 0 } else { a.wrapping_div(b) }
}

/// PyTorch's checks of `alpha` in `add(x, y, alpha=)` and `sub` against the operands'
/// common dtype: a bool `alpha` only for bool results, a float one only for float results.
pub fn check_alpha(alpha: Scalar, common: DType) -> Result<()> {
    if matches!(alpha, Scalar::Bool(_)) && common != DType::Bool {
        bail!(Value, "Boolean alpha only supported for Boolean results.");
    }
    if matches!(alpha, Scalar::Float(_)) && !common.is_float() {
        bail!(
            Value,
            "For integral input tensors, argument alpha must not be a floating point number."
        );
    }
    Ok(())
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: &'static [BinaryOp] = {
        use BinaryOp::*;
        &[
            Add, Sub, Mul, Div, Pow, Maximum, Minimum, Remainder, DivFloor, DivTrunc, Eq, Ne, Lt,
            Le, Gt, Ge, LogicalAnd, LogicalOr,
        ]
    };

    /// The op's name in `.smelt` text and messages (`add`); the rounding divisions are
    /// `div` with a `rounding_mode` attribute.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div | DivFloor | DivTrunc => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Remainder => "remainder",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
        }
    }

    /// The `rounding_mode` attribute of a division (`None` for every other op).
    pub fn rounding_mode(self) -> Option<&'static str> {
        match self {
            BinaryOp::DivFloor => Some("floor"),
            BinaryOp::DivTrunc => Some("trunc"),
            _ => None,
        }
    }

    /// Whether the op compares (`eq`, `lt`, ...): its result is bool.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge)
    }

    /// Whether the op is `logical_and` or `logical_or` (bool result).
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::LogicalAnd | BinaryOp::LogicalOr)
    }

    /// The dtype both operands are converted to before the op runs.
    pub fn compute_dtype(self, a: &TensorType, b: &TensorType) -> Result<DType> {
        use BinaryOp::*;
        let common = result_type(&[a.promote_arg(), b.promote_arg()]);
        Ok(match self {
            Div if !common.is_float() => crate::ir::dtype::DEFAULT_FLOAT,
            Sub if common.is_bool() => bail!(
                DType,
                "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` operator instead."
            ),
            Remainder if common.is_bool() => return Err(not_implemented("remainder", common)),
            DivFloor if common.is_bool() => return Err(not_implemented("div_floor_cpu", common)),
            DivTrunc if common.is_bool() => return Err(not_implemented("div_trunc_cpu", common)),
            Pow if common.is_bool() => DType::I64,
            _ => common,
        })
    }

    /// The result dtype: the compute dtype, or bool for comparisons and logical ops.
    pub fn out_dtype(self, a: &TensorType, b: &TensorType) -> Result<DType> {
        let c = self.compute_dtype(a, b)?;
        Ok(if self.is_comparison() || self.is_logical() {
            DType::Bool
        } else {
            c
        })
    }
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: &'static [ReduceOp] = {
        use ReduceOp::*;
        &[Sum, Mean, Prod, Amax, Amin, All, Any, LogSumExp]
    };

    /// The op's name in `.smelt` text and messages (`sum`).
    pub fn name(self) -> &'static str {
        use ReduceOp::*;
        match self {
            Sum => "sum",
            Mean => "mean",
            Prod => "prod",
            Amax => "amax",
            Amin => "amin",
            All => "all",
            Any => "any",
            LogSumExp => "logsumexp",
        }
    }

    /// The result dtype for an operand of dtype `d`, or PyTorch's error.
    pub fn out_dtype(self, d: DType) -> Result<DType> {
        use ReduceOp::*;
        Ok(match self {
            Sum | Prod if !d.is_float() => DType::I64,
            Mean if !d.is_float() => bail!(
                DType,
                "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {}",
                d.scalar_name()
            ),
            LogSumExp if !d.is_float() => crate::ir::dtype::DEFAULT_FLOAT,
            All | Any if d == DType::U8 => DType::U8,
            All | Any => DType::Bool,
            _ => d,
        })
    }
}

impl Op {
    /// The op's name in `.smelt` text and in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Scalar(_) => "scalar",
            Op::Constant(_) => "constant",
            Op::Full { .. } => "full",
            Op::Arange { .. } => "arange",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Clamp { .. } => "clamp",
            Op::To { .. } => "to",
            Op::MaskedFill { .. } => "masked_fill",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgMax { .. } => "argmax",
            Op::ArgMin { .. } => "argmin",
            Op::Var { .. } => "var",
            Op::Std { .. } => "std",
            Op::Cumsum { .. } => "cumsum",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Matmul => "matmul",
            Op::Linear { .. } => "linear",
            Op::Einsum { .. } => "einsum",
            Op::Attention { .. } => "scaled_dot_product_attention",
            Op::AttentionGrad { .. } => "scaled_dot_product_attention_backward",
            Op::Reshape { .. } => "reshape",
            Op::View { .. } => "view",
            Op::Permute { .. } => "permute",
            Op::Transpose { .. } => "transpose",
            Op::T => "t",
            Op::Expand { .. } => "expand",
            Op::Squeeze { .. } => "squeeze",
            Op::Unsqueeze { .. } => "unsqueeze",
            Op::Flatten { .. } => "flatten",
            Op::Narrow { .. } => "narrow",
            Op::Select { .. } => "select",
            Op::Slice { .. } => "slice",
            Op::Diagonal { .. } => "diagonal",
            Op::Contiguous => "contiguous",
            Op::Repeat { .. } => "repeat",
            Op::Cat { .. } => "cat",
            Op::Stack { .. } => "stack",
            Op::Flip { .. } => "flip",
            Op::Tril { .. } => "tril",
            Op::Triu { .. } => "triu",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::Scatter { .. } => "scatter",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::IndexAdd { .. } => "index_add",
            Op::Embedding => "embedding",
            Op::Conv { conv, .. } => conv.op_name(),
            Op::ConvInputGrad { .. } => "convolution_backward_input",
            Op::ConvWeightGrad { .. } => "convolution_backward_weight",
            Op::MaxPool2d { .. } => "max_pool2d",
            Op::MaxPool2dGrad { .. } => "max_pool2d_backward",
            Op::AvgPool2d { .. } => "avg_pool2d",
            Op::AvgPool2dGrad { .. } => "avg_pool2d_backward",
            Op::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
            Op::AdaptiveAvgPool2dGrad { .. } => "adaptive_avg_pool2d_backward",
            Op::BatchNorm(_) => "batch_norm",
            Op::Dropout { .. } => "dropout",
            Op::AllReduce { .. } => "all_reduce",
            Op::Control(c) => c.name(),
            Op::Result { .. } => "result",
        }
    }

    /// Ops that only reinterpret their operand's layout (no data is computed or copied).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View { .. }
                | Op::Permute { .. }
                | Op::Transpose { .. }
                | Op::T
                | Op::Expand { .. }
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
                | Op::Narrow { .. }
                | Op::Select { .. }
                | Op::Slice { .. }
                | Op::Diagonal { .. }
        )
    }

    /// Ops whose result holds exactly its operand's elements, in another shape or layout: the
    /// views, and `reshape`, `flatten` and `contiguous` (which copy only when they must).
    pub fn keeps_elements(&self) -> bool {
        self.is_view()
            || matches!(
                self,
                Op::Reshape { .. } | Op::Flatten { .. } | Op::Contiguous
            )
    }

    /// Ops that talk to other processes: their value is not a function of their operands
    /// alone, so they are never evaluated at compile time or moved out of a loop, and they
    /// run in the graph's order on every rank.
    pub fn communicates(&self) -> bool {
        matches!(self, Op::AllReduce { .. })
    }

    /// Ops computed element by element from broadcast operands.
    pub fn is_pointwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Where
                | Op::Clamp { .. }
                | Op::To { .. }
                | Op::MaskedFill { .. }
        )
    }

    /// The type of the op's result. This is the single shape and dtype rule of every op.
    pub fn infer(&self, inputs: &[&TensorType]) -> Result<TensorType> {
        let name = self.name();
        let one = |n| check_arity(name, inputs, n);
        let out = |dtype, shape| Ok(TensorType::new(dtype, shape));
        match self {
            Op::Scalar(s) => {
                one(0)?;
                let dtype = match s {
                    Scalar::Bool(_) => DType::Bool,
                    Scalar::Int(_) => DType::I64,
                    Scalar::Float(_) => DType::F64,
                };
                Ok(TensorType {
                    dtype,
                    shape: vec![],
                    wrapped: true,
                })
            }
            Op::Constant(lit) => {
                one(0)?;
                if lit.bytes.len() != numel(&lit.shape) * lit.dtype.size() {
                    bail!(
                        Value,
                        "constant: {} bytes do not fill a {} tensor of shape {:?}",
                        lit.bytes.len(),
                        lit.dtype,
                        lit.shape
                    );
                }
                out(lit.dtype, lit.shape.clone())
            }
            Op::Full {
                size,
                fill_value,
                dtype,
            } => {
                one(0)?;
                let d = dtype.unwrap_or(match fill_value {
                    Scalar::Bool(_) => DType::Bool,
                    Scalar::Int(_) => DType::I64,
                    Scalar::Float(_) => crate::ir::dtype::DEFAULT_FLOAT,
                });
                out(d, size.clone())
            }
            Op::Arange {
                start,
                end,
                step,
                dtype,
            } => {
                one(0)?;
                let len = arange_len(*start, *end, *step)?;
                let any_float = start.is_float() || end.is_float() || step.is_float();
                let d = dtype.unwrap_or(if any_float {
                    crate::ir::dtype::DEFAULT_FLOAT
                } else {
                    DType::I64
                });
                out(d, vec![len])
            }
            Op::Unary(u) => {
                one(1)?;
                out(u.out_dtype(inputs[0].dtype)?, inputs[0].shape.clone())
            }
            Op::Binary(b) => {
                one(2)?;
                let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
                out(b.out_dtype(inputs[0], inputs[1])?, shape)
            }
            Op::Where => {
                one(3)?;
                if inputs[0].dtype != DType::Bool {
                    bail!(
                        DType,
                        "where expected condition to be a boolean tensor, but got a tensor with dtype {}",
                        inputs[0].dtype.scalar_name()
                    );
                }
                let shape = broadcast_all(&[&inputs[0].shape, &inputs[1].shape, &inputs[2].shape])?;
                let d = result_type(&[inputs[1].promote_arg(), inputs[2].promote_arg()]);
                out(d, shape)
            }
            Op::Clamp { min, max } => {
                one(1)?;
                if min.is_none() && max.is_none() {
                    bail!(
                        Value,
                        "torch.clamp: At least one of 'min' or 'max' must not be None"
                    );
                }
                let x = inputs[0];
                if x.dtype.is_bool() {
                    return Err(not_implemented("clamp", x.dtype));
                }
                let mut args = vec![x.promote_arg()];
                for s in [min, max].into_iter().flatten() {
                    args.push(PromoteArg {
                        dtype: s.dtype(),
                        zero_dim: true,
                        wrapped: true,
                    });
                }
                out(result_type(&args), x.shape.clone())
            }
            Op::To { dtype } => {
                one(1)?;
                out(*dtype, inputs[0].shape.clone())
            }
            Op::MaskedFill { .. } => {
                one(2)?;
                if inputs[1].dtype != DType::Bool {
                    bail!(
                        DType,
                        "masked_fill_ only supports boolean masks, but got mask with dtype {}",
                        inputs[1].dtype.scalar_name()
                    );
                }
                let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
                out(inputs[0].dtype, shape)
            }
            Op::Reduce { op, dim, keepdim } => {
                one(1)?;
                let x = inputs[0];
                if *op == ReduceOp::Prod
                    && let Some(d) = dim
                    && d.len() > 1
                {
                    bail!(Value, "prod(): dim must be a single int, got {d:?}");
                }
                let dims = reduction_dims(dim, x.ndim())?;
                if matches!(op, ReduceOp::Amax | ReduceOp::Amin) {
                    for &d in &dims {
                        if x.shape[d] == 0 {
                            bail!(
                                Shape,
                                "{}(): Expected reduction dim {d} to have non-zero size.",
                                op.name()
                            );
                        }
                    }
                }
                out(
                    op.out_dtype(x.dtype)?,
                    reduced_shape(&x.shape, &dims, *keepdim),
                )
            }
            Op::ArgMax { dim, keepdim } | Op::ArgMin { dim, keepdim } => {
                one(1)?;
                let x = inputs[0];
                if x.dtype.is_bool() {
                    return Err(not_implemented(name, x.dtype));
                }
                match dim {
                    None => {
                        if x.numel() == 0 {
                            bail!(
                                Shape,
                                "{name}(): Expected reduction dim to be specified for input.numel() == 0."
                            );
                        }
                        let shape = if *keepdim { vec![1; x.ndim()] } else { vec![] };
                        out(DType::I64, shape)
                    }
                    Some(d) => {
                        let d = wrap_dim(*d, x.ndim())?;
                        if x.ndim() > 0 && x.shape[d] == 0 {
                            bail!(
                                Shape,
                                "{name}(): Expected reduction dim {d} to have non-zero size."
                            );
                        }
                        let dims: Vec<usize> = if x.ndim() == 0 { vec![] } else { vec![d] };
                        out(DType::I64, reduced_shape(&x.shape, &dims, *keepdim))
                    }
                }
            }
            Op::Var { dim, keepdim, .. } | Op::Std { dim, keepdim, .. } => {
                one(1)?;
                let x = inputs[0];
                if !x.dtype.is_float() {
                    bail!(
                        DType,
                        "std and var only support floating point and complex dtypes"
                    );
                }
                let dims = reduction_dims(dim, x.ndim())?;
                out(x.dtype, reduced_shape(&x.shape, &dims, *keepdim))
            }
            Op::Cumsum { dim } => {
                one(1)?;
                let x = inputs[0];
                wrap_dim(*dim, x.ndim())?;
                let d = if x.dtype.is_float() {
                    x.dtype
                } else {
                    DType::I64
                };
                out(d, x.shape.clone())
            }
            Op::Softmax { dim } | Op::LogSoftmax { dim } => {
                one(1)?;
                let x = inputs[0];
                wrap_dim(*dim, x.ndim())?;
                if !x.dtype.is_float() {
                    return Err(not_implemented(name, x.dtype));
                }
                out(x.dtype, x.shape.clone())
            }
            Op::LayerNorm {
                normalized_shape,
                has_weight,
                has_bias,
                ..
            } => {
                one(1 + *has_weight as usize + *has_bias as usize)?;
                let x = inputs[0];
                let k = normalized_shape.len();
                if k == 0 || x.ndim() < k || x.shape[x.ndim() - k..] != normalized_shape[..] {
                    bail!(
                        Shape,
                        "Given normalized_shape={normalized_shape:?}, expected input with shape [*, {}], but got input of size{:?}",
                        normalized_shape
                            .iter()
                            .map(|s| s.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        x.shape
                    );
                }
                if !x.dtype.is_float() {
                    return Err(not_implemented(name, x.dtype));
                }
                for (i, p) in inputs[1..].iter().enumerate() {
                    let what = if i == 0 && *has_weight {
                        "weight"
                    } else {
                        "bias"
                    };
                    if p.shape != *normalized_shape {
                        bail!(
                            Shape,
                            "Expected {what} to be of same shape as normalized_shape, but got {what} of shape {:?} and normalized_shape = {normalized_shape:?}",
                            p.shape
                        );
                    }
                    if p.dtype != x.dtype {
                        bail!(
                            DType,
                            "expected scalar type {} but found {}",
                            x.dtype.scalar_name(),
                            p.dtype.scalar_name()
                        );
                    }
                }
                out(x.dtype, x.shape.clone())
            }
            Op::Matmul => {
                one(2)?;
                matmul_type(inputs[0], inputs[1])
            }
            Op::Linear { has_bias } => {
                one(2 + *has_bias as usize)?;
                let (x, w) = (inputs[0], inputs[1]);
                if w.ndim() != 2 && w.ndim() != 1 {
                    bail!(
                        Shape,
                        "linear(): weight must be 1-D or 2-D, got {}-D",
                        w.ndim()
                    );
                }
                let wt_shape: Shape = w.shape.iter().rev().copied().collect();
                let t = matmul_type(x, &TensorType::new(w.dtype, wt_shape))?;
                if *has_bias {
                    let b = inputs[2];
                    if b.dtype != t.dtype {
                        bail!(
                            DType,
                            "expected m1 and bias to have the same dtype, but got: {} != {}",
                            t.dtype.scalar_name(),
                            b.dtype.scalar_name()
                        );
                    }
                    let shape = broadcast_shapes(&t.shape, &b.shape)?;
                    if shape != t.shape {
                        bail!(
                            Shape,
                            "linear(): bias of shape {:?} does not broadcast to the output shape {:?}",
                            b.shape,
                            t.shape
                        );
                    }
                }
                Ok(t)
            }
            Op::Attention { has_mask, .. } => {
                one(3 + *has_mask as usize)?;
                attention_type(inputs, *has_mask)
            }
            Op::AttentionGrad { has_mask, .. } => {
                one(4 + *has_mask as usize)?;
                let y = attention_type(&inputs[1..], *has_mask)?;
                grad_matches(name, inputs[0], &y)?;
                let n: usize = inputs[1..4].iter().map(|t| t.numel()).sum();
                Ok(TensorType::new(inputs[1].dtype, vec![n]))
            }
            Op::Conv { conv, has_bias } => {
                one(2 + *has_bias as usize)?;
                let bias = has_bias.then(|| inputs[2]);
                super::conv::conv_type(conv, inputs[0], inputs[1], bias)
            }
            Op::ConvInputGrad { conv, input_size } => {
                one(2)?;
                let x = TensorType::new(inputs[1].dtype, input_size.clone());
                conv_grad_type(self, conv, inputs[0], &x, inputs[1])?;
                Ok(x)
            }
            Op::ConvWeightGrad { conv, weight_size } => {
                one(2)?;
                let w = TensorType::new(inputs[1].dtype, weight_size.clone());
                conv_grad_type(self, conv, inputs[0], inputs[1], &w)?;
                Ok(w)
            }
            Op::MaxPool2d { pool } => {
                one(1)?;
                pool.pool_type(name, inputs[0])
            }
            Op::AvgPool2d { pool, .. } => {
                one(1)?;
                pool.pool_type(name, inputs[0])
            }
            Op::MaxPool2dGrad { pool } => {
                one(2)?;
                let y = pool.pool_type("max_pool2d", inputs[1])?;
                grad_matches(name, inputs[0], &y)?;
                Ok(inputs[1].clone())
            }
            Op::AvgPool2dGrad {
                pool, input_size, ..
            } => {
                one(1)?;
                let x = TensorType::new(inputs[0].dtype, input_size.clone());
                grad_matches(name, inputs[0], &pool.pool_type("avg_pool2d", &x)?)?;
                Ok(x)
            }
            Op::AdaptiveAvgPool2d { output_size } => {
                one(1)?;
                super::conv::adaptive_pool_type(output_size, inputs[0])
            }
            Op::AdaptiveAvgPool2dGrad { input_size } => {
                one(1)?;
                let g = inputs[0];
                let x = TensorType::new(g.dtype, input_size.clone());
                let nd = g.ndim();
                if nd < 2 {
                    bail!(
                        Shape,
                        "{name}: expected a 3-D or 4-D gradient, got {:?}",
                        g.shape
                    );
                }
                let size = [g.shape[nd - 2] as i64, g.shape[nd - 1] as i64];
                grad_matches(name, g, &super::conv::adaptive_pool_type(&size, &x)?)?;
                Ok(x)
            }
            Op::BatchNorm(bn) => {
                let [_, _, w, b] = bn.positions();
                one(1 + 2 * bn.has_running as usize + w.is_some() as usize + b.is_some() as usize)?;
                bn.infer(inputs)
            }
            Op::Control(c) => {
                c.result_types(inputs)?;
                Ok(super::control::tuple_type())
            }
            Op::Result { ty, .. } => {
                one(1)?;
                if *inputs[0] != super::control::tuple_type() {
                    bail!(Value, "result: the operand is not a control op");
                }
                Ok(ty.clone())
            }
            Op::AllReduce { op } => {
                one(1)?;
                op.check(inputs[0].dtype, name)?;
                Ok(inputs[0].clone())
            }
            Op::Dropout { p, .. } => {
                one(1)?;
                super::conv::check_dropout(p.get())?;
                if !inputs[0].dtype.is_float() {
                    return Err(not_implemented(name, inputs[0].dtype));
                }
                Ok(inputs[0].clone())
            }
            Op::Einsum { equation } => {
                let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.shape[..]).collect();
                let plan = super::einsum::EinsumSpec::parse(equation, &shapes)?;
                let mut d = inputs.first().map(|t| t.dtype).ok_or_else(|| {
                    Error::Value("einsum(): must provide at least one operand".into())
                })?;
                for t in &inputs[1..] {
                    if t.dtype != d {
                        bail!(
                            DType,
                            "einsum(): expected all operands to have the same dtype, but got {} and {}",
                            d.scalar_name(),
                            t.dtype.scalar_name()
                        );
                    }
                    d = t.dtype;
                }
                out(d, plan.output_shape())
            }
            Op::Reshape { shape } | Op::View { shape } => {
                one(1)?;
                let x = inputs[0];
                out(x.dtype, infer_size(shape, x.numel())?)
            }
            Op::Permute { dims } => {
                one(1)?;
                let x = inputs[0];
                out(x.dtype, permute_shape(&x.shape, dims)?)
            }
            Op::Transpose { dim0, dim1 } => {
                one(1)?;
                let x = inputs[0];
                let (a, b) = (wrap_dim(*dim0, x.ndim())?, wrap_dim(*dim1, x.ndim())?);
                let mut s = x.shape.clone();
                if !s.is_empty() {
                    s.swap(a, b);
                }
                out(x.dtype, s)
            }
            Op::T => {
                one(1)?;
                let x = inputs[0];
                if x.ndim() > 2 {
                    bail!(
                        Shape,
                        "t() expects a tensor with <= 2 dimensions, but self is {}D",
                        x.ndim()
                    );
                }
                out(x.dtype, x.shape.iter().rev().copied().collect::<Shape>())
            }
            Op::Expand { size } => {
                one(1)?;
                let x = inputs[0];
                out(x.dtype, expand_shape(&x.shape, size)?)
            }
            Op::Squeeze { dim } => {
                one(1)?;
                let x = inputs[0];
                let dims = match dim {
                    None => (0..x.ndim()).collect(),
                    Some(d) => wrap_dims(d, x.ndim())?,
                };
                let s: Shape = x
                    .shape
                    .iter()
                    .enumerate()
                    .filter(|&(i, &n)| !(n == 1 && dims.contains(&i)))
                    .map(|(_, &n)| n)
                    .collect();
                out(x.dtype, s)
            }
            Op::Unsqueeze { dim } => {
                one(1)?;
                let x = inputs[0];
                let d = wrap_dim(*dim, x.ndim() + 1)?;
                let mut s = x.shape.clone();
                s.insert(d, 1);
                out(x.dtype, s)
            }
            Op::Flatten { start_dim, end_dim } => {
                one(1)?;
                let x = inputs[0];
                out(x.dtype, flatten_shape(&x.shape, *start_dim, *end_dim)?)
            }
            Op::Narrow { dim, start, length } => {
                one(1)?;
                let x = inputs[0];
                let (d, _) = narrow_range(&x.shape, *dim, *start, *length)?;
                let mut s = x.shape.clone();
                s[d] = *length as usize;
                out(x.dtype, s)
            }
            Op::Select { dim, index } => {
                one(1)?;
                let x = inputs[0];
                let (d, _) = select_index(&x.shape, *dim, *index)?;
                let mut s = x.shape.clone();
                s.remove(d);
                out(x.dtype, s)
            }
            Op::Slice {
                dim,
                start,
                end,
                step,
            } => {
                one(1)?;
                let x = inputs[0];
                let (d, _, len) = slice_range(&x.shape, *dim, *start, *end, *step)?;
                let mut s = x.shape.clone();
                s[d] = len;
                out(x.dtype, s)
            }
            Op::Diagonal { offset, dim1, dim2 } => {
                one(1)?;
                let x = inputs[0];
                out(x.dtype, diagonal_shape(&x.shape, *offset, *dim1, *dim2)?)
            }
            Op::Contiguous => {
                one(1)?;
                out(inputs[0].dtype, inputs[0].shape.clone())
            }
            Op::Repeat { repeats } => {
                one(1)?;
                let x = inputs[0];
                if repeats.len() < x.ndim() {
                    bail!(
                        Shape,
                        "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor"
                    );
                }
                let lead = repeats.len() - x.ndim();
                let s: Shape = repeats
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| if i < lead { r } else { r * x.shape[i - lead] })
                    .collect();
                out(x.dtype, s)
            }
            Op::Cat { dim } => cat_type(inputs, *dim),
            Op::Stack { dim } => {
                let first = inputs
                    .first()
                    .ok_or_else(|| Error::Value("stack expects a non-empty TensorList".into()))?;
                for (i, t) in inputs.iter().enumerate() {
                    if t.shape != first.shape {
                        bail!(
                            Shape,
                            "stack expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {i}",
                            first.shape,
                            t.shape
                        );
                    }
                }
                let d = wrap_dim(*dim, first.ndim() + 1)?;
                let mut s = first.shape.clone();
                s.insert(d, inputs.len());
                let dtype =
                    result_type(&inputs.iter().map(|t| t.promote_arg()).collect::<Vec<_>>());
                out(dtype, s)
            }
            Op::Flip { dims } => {
                one(1)?;
                wrap_dims(dims, inputs[0].ndim())?;
                out(inputs[0].dtype, inputs[0].shape.clone())
            }
            Op::Tril { .. } | Op::Triu { .. } => {
                one(1)?;
                let x = inputs[0];
                if x.ndim() < 2 {
                    bail!(
                        Shape,
                        "{name}: input tensor must have at least 2 dimensions"
                    );
                }
                out(x.dtype, x.shape.clone())
            }
            Op::IndexSelect { dim } => {
                one(2)?;
                let (x, idx) = (inputs[0], inputs[1]);
                let d = wrap_dim(*dim, x.ndim())?;
                if !is_index_dtype(idx.dtype) {
                    bail!(
                        DType,
                        "index_select(): Expected dtype int32/int64 for index but got: {}",
                        idx.dtype.scalar_name()
                    );
                }
                if idx.ndim() > 1 {
                    bail!(Shape, "index_select(): Index is supposed to be a vector");
                }
                let mut s = x.shape.clone();
                if !s.is_empty() {
                    s[d] = idx.numel();
                }
                out(x.dtype, s)
            }
            Op::Gather { dim } => {
                one(2)?;
                let (x, idx) = (inputs[0], inputs[1]);
                let d = wrap_dim(*dim, x.ndim())?;
                check_index_dtype("gather", idx.dtype)?;
                check_same_ndim("gather", x, idx)?;
                for i in 0..idx.ndim() {
                    if i != d && idx.shape[i] > x.shape[i] {
                        bail!(
                            Shape,
                            "Size does not match at dimension {i} expected index {:?} to be smaller than self {:?} apart from dimension {d}",
                            idx.shape,
                            x.shape
                        );
                    }
                }
                out(x.dtype, idx.shape.clone())
            }
            Op::Scatter { dim } | Op::ScatterAdd { dim } => {
                one(3)?;
                let (x, idx, src) = (inputs[0], inputs[1], inputs[2]);
                let d = wrap_dim(*dim, x.ndim())?;
                check_index_dtype(name, idx.dtype)?;
                if src.dtype != x.dtype {
                    bail!(
                        DType,
                        "{name}(): Expected self.dtype to be equal to src.dtype"
                    );
                }
                check_same_ndim(name, x, idx)?;
                check_same_ndim(name, src, idx)?;
                for i in 0..idx.ndim() {
                    if idx.shape[i] > src.shape[i] || (i != d && idx.shape[i] > x.shape[i]) {
                        bail!(
                            Shape,
                            "Expected index {:?} to be smaller than self {:?} apart from dimension {d} and to be smaller size than src {:?}",
                            idx.shape,
                            x.shape,
                            src.shape
                        );
                    }
                }
                out(x.dtype, x.shape.clone())
            }
            Op::IndexAdd { dim } => {
                one(3)?;
                let (x, idx, src) = (inputs[0], inputs[1], inputs[2]);
                let d = wrap_dim(*dim, x.ndim())?;
                if !is_index_dtype(idx.dtype) {
                    bail!(DType, "index_add_(): Expected dtype int32/int64 for index");
                }
                if idx.ndim() > 1 {
                    bail!(Shape, "index_add_(): Index is supposed to be a vector");
                }
                if src.dtype != x.dtype {
                    bail!(
                        DType,
                        "index_add_(): self ({}) and source ({}) must have the same scalar type",
                        x.dtype.scalar_name(),
                        src.dtype.scalar_name()
                    );
                }
                let mut expect = x.shape.clone();
                if !expect.is_empty() {
                    expect[d] = idx.numel();
                }
                if src.shape != expect && !(x.ndim() == 0 && src.numel() == idx.numel()) {
                    bail!(
                        Shape,
                        "index_add_(): source of shape {:?} does not match self of shape {:?} with {} indices along dim {d}",
                        src.shape,
                        x.shape,
                        idx.numel()
                    );
                }
                out(x.dtype, x.shape.clone())
            }
            Op::Embedding => {
                one(2)?;
                let (idx, w) = (inputs[0], inputs[1]);
                if !is_index_dtype(idx.dtype) {
                    bail!(
                        DType,
                        "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {} instead",
                        idx.dtype.torch_name()
                    );
                }
                if w.ndim() != 2 {
                    bail!(Shape, "'weight' must be 2-D");
                }
                let mut s = idx.shape.clone();
                s.push(w.shape[1]);
                out(w.dtype, s)
            }
        }
    }
}

fn check_index_dtype(name: &str, d: DType) -> Result<()> {
    if d != DType::I64 {
        bail!(
            DType,
            "{name}(): Expected dtype int64 for index, but got {}",
            d.scalar_name()
        );
    }
    Ok(())
}

fn check_same_ndim(name: &str, a: &TensorType, idx: &TensorType) -> Result<()> {
    if a.ndim() != idx.ndim() && !(a.ndim() <= 1 && idx.ndim() <= 1) {
        bail!(
            Shape,
            "Index tensor must have the same number of dimensions as {} tensor",
            if name == "gather" { "input" } else { "self" }
        );
    }
    Ok(())
}

/// Shape of `matmul(a, b)` with PyTorch's rules for 1-D, 2-D and batched operands.
pub fn matmul_type(a: &TensorType, b: &TensorType) -> Result<TensorType> {
    if a.dtype != b.dtype {
        bail!(
            DType,
            "expected m1 and m2 to have the same dtype, but got: {} != {}",
            a.dtype.scalar_name(),
            b.dtype.scalar_name()
        );
    }
    if a.dtype.is_bool() {
        return Err(not_implemented("matmul", a.dtype));
    }
    Ok(TensorType::new(a.dtype, matmul_shape(&a.shape, &b.shape)?))
}

fn cat_type(inputs: &[&TensorType], dim: i64) -> Result<TensorType> {
    if inputs.is_empty() {
        bail!(Value, "torch.cat(): expected a non-empty list of Tensors");
    }
    // PyTorch skips legacy empty 1-D tensors of shape [0].
    let parts: Vec<(usize, &&TensorType)> = inputs
        .iter()
        .enumerate()
        .filter(|(_, t)| !(t.ndim() == 1 && t.shape[0] == 0))
        .collect();
    let dtype = result_type(&inputs.iter().map(|t| t.promote_arg()).collect::<Vec<_>>());
    let Some((_, first)) = parts.first() else {
        return Ok(TensorType::new(dtype, vec![0]));
    };
    if first.ndim() == 0 {
        bail!(
            Shape,
            "zero-dimensional tensor (at position 0) cannot be concatenated"
        );
    }
    let d = wrap_dim(dim, first.ndim())?;
    let mut shape = first.shape.clone();
    shape[d] = 0;
    for &(i, t) in &parts {
        if t.ndim() != first.ndim() {
            bail!(
                Shape,
                "Tensors must have same number of dimensions: got {} and {}",
                first.ndim(),
                t.ndim()
            );
        }
        for j in 0..t.ndim() {
            if j != d && t.shape[j] != first.shape[j] {
                bail!(
                    Shape,
                    "Sizes of tensors must match except in dimension {d}. Expected size {} but got size {} for tensor number {i} in the list.",
                    first.shape[j],
                    t.shape[j]
                );
            }
        }
        shape[d] += t.shape[d];
    }
    Ok(TensorType::new(dtype, shape))
}
