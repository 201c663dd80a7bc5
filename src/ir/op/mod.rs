//! The op set. Each op's shape and dtype rule is defined once, in `Op::infer` (the `infer`
//! module, one file per op family); eager tensors, the graph verifier and the parser all
//! call it.

mod binary;
mod flops;
mod infer;

use super::conv::{BatchNormAttrs, ConvAttrs, PoolAttrs};
use super::dtype::{DType, PromoteArg, Scalar};
use super::shape::{Shape, numel};
use super::unary::Real;
use crate::{Error, Result, bail};
use std::sync::Arc;

pub use super::unary::UnaryOp;
pub use binary::{BinaryOp, check_alpha, div_floor_float, div_floor_int, div_trunc_int};
pub use infer::matmul_type;
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

/// The `reduce` of `torch.scatter_reduce`: how the values sent to one element combine with
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ScatterReduction {
    /// `"sum"`.
    Sum,
    /// `"prod"`.
    Prod,
    /// `"mean"`: the sum over the element and its values, divided by their count (rounded
    /// down for integers, as PyTorch).
    Mean,
    /// `"amax"`: the largest (NaN propagates).
    Amax,
    /// `"amin"`: the smallest (NaN propagates).
    Amin,
}

impl ScatterReduction {
    /// Every reduction.
    pub const ALL: [ScatterReduction; 5] = [
        ScatterReduction::Sum,
        ScatterReduction::Prod,
        ScatterReduction::Mean,
        ScatterReduction::Amax,
        ScatterReduction::Amin,
    ];

    /// PyTorch's name for it (`"amax"`).
    pub fn name(self) -> &'static str {
        match self {
            ScatterReduction::Sum => "sum",
            ScatterReduction::Prod => "prod",
            ScatterReduction::Mean => "mean",
            ScatterReduction::Amax => "amax",
            ScatterReduction::Amin => "amin",
        }
    }

    /// The reduction named `s`, or PyTorch's error.
    pub fn parse(s: &str) -> Result<ScatterReduction> {
        match ScatterReduction::ALL.iter().find(|r| r.name() == s) {
            Some(r) => Ok(*r),
            None => bail!(
                Value,
                "reduce argument must be either sum, prod, mean, amax or amin, got {s}"
            ),
        }
    }
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
    /// `Tensor.view(dtype)`: the same bytes read as `dtype`, which has the operand's element
    /// size (text: `view(%x, dtype=i32)`).
    ViewDtype {
        /// The dtype the bytes are read as.
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
    /// `torch.scatter_reduce(x, dim, index, src, reduce)` with `include_self=True`: every
    /// element of `src` combined into `x`'s element its index names, by `reduce`. Operands:
    /// x, index, src.
    ScatterReduce {
        /// The dim indexed.
        dim: i64,
        /// How the values combine.
        reduce: ScatterReduction,
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
            Op::View { .. } | Op::ViewDtype { .. } => "view",
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
            Op::ScatterReduce { .. } => "scatter_reduce",
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
}
