//! The lowering table: one function per ONNX op (and per opset range where the op's meaning
//! changed), each turning a node into smelt ops. `find` picks, for an op type, the entry with
//! the newest `since` that is not newer than the model's opset.

mod attention;
mod control;
mod elementwise;
mod grid_sample;
mod held;
mod index;
mod linalg;
mod loss;
mod ngrams;
mod nn;
mod pool_taps;
mod quant;
mod recurrent;
mod reduce;
mod resize;
mod shape;
mod signal;
mod training;

use super::import::{Cx, Val};
use crate::ir::attrs::Attr;
use crate::ir::graph::ValueId;
use crate::{Result, bail};

/// A lowering: the node's outputs, in order.
pub type Lower = fn(&mut Cx) -> Result<Vec<Val>>;

/// (op type, first opset this lowering is for, the lowering). Entries of one op type are
/// listed oldest first.
const TABLE: &[(&str, i64, Lower)] = &[
    // elementwise.rs
    ("Abs", 1, elementwise::abs),
    ("Acos", 7, elementwise::acos),
    ("Acosh", 9, elementwise::acosh),
    ("Add", 1, elementwise::add),
    ("And", 1, elementwise::and),
    ("Asin", 7, elementwise::asin),
    ("Asinh", 9, elementwise::asinh),
    ("Atan", 7, elementwise::atan),
    ("Atanh", 9, elementwise::atanh),
    ("BitCast", 26, elementwise::bit_cast),
    ("BitShift", 11, elementwise::bit_shift),
    ("BitwiseAnd", 18, elementwise::bitwise_and),
    ("BitwiseNot", 18, elementwise::bitwise_not),
    ("BitwiseOr", 18, elementwise::bitwise_or),
    ("BitwiseXor", 18, elementwise::bitwise_xor),
    ("Cast", 1, elementwise::cast),
    ("CastLike", 15, elementwise::cast_like),
    ("Ceil", 1, elementwise::ceil),
    ("Celu", 12, elementwise::celu),
    ("Clip", 1, elementwise::clip),
    ("Cos", 7, elementwise::cos),
    ("Cosh", 9, elementwise::cosh),
    ("Div", 1, elementwise::div),
    ("Elu", 1, elementwise::elu),
    ("Equal", 1, elementwise::equal),
    ("Erf", 9, elementwise::erf),
    ("Exp", 1, elementwise::exp),
    ("Floor", 1, elementwise::floor),
    ("Gelu", 20, elementwise::gelu),
    ("Greater", 1, elementwise::greater),
    ("GreaterOrEqual", 12, elementwise::greater_or_equal),
    ("HardSigmoid", 1, elementwise::hard_sigmoid),
    ("HardSwish", 14, elementwise::hard_swish),
    ("Identity", 1, elementwise::identity),
    ("IsInf", 10, elementwise::is_inf),
    ("IsNaN", 9, elementwise::is_nan),
    ("LeakyRelu", 1, elementwise::leaky_relu),
    ("Less", 1, elementwise::less),
    ("LessOrEqual", 12, elementwise::less_or_equal),
    ("Log", 1, elementwise::log),
    ("Max", 1, elementwise::max),
    ("Mean", 1, elementwise::mean),
    ("Min", 1, elementwise::min),
    ("Mish", 18, elementwise::mish),
    ("Mod", 10, elementwise::modulo),
    ("Mul", 1, elementwise::mul),
    ("Neg", 1, elementwise::neg),
    ("Not", 1, elementwise::not),
    ("Or", 1, elementwise::or),
    ("Pow", 1, elementwise::pow),
    ("PRelu", 1, elementwise::prelu),
    ("Reciprocal", 1, elementwise::reciprocal),
    ("Relu", 1, elementwise::relu),
    ("Round", 11, elementwise::round),
    ("Selu", 1, elementwise::selu),
    ("Shrink", 9, elementwise::shrink),
    ("Sigmoid", 1, elementwise::sigmoid),
    ("Sign", 9, elementwise::sign),
    ("Sin", 7, elementwise::sin),
    ("Sinh", 9, elementwise::sinh),
    ("Softplus", 1, elementwise::softplus),
    ("Softsign", 1, elementwise::softsign),
    ("Sqrt", 1, elementwise::sqrt),
    ("Sub", 1, elementwise::sub),
    ("Sum", 1, elementwise::sum),
    ("Swish", 24, elementwise::swish),
    ("SwiGLU", 24, elementwise::swiglu),
    ("Tan", 7, elementwise::tan),
    ("Tanh", 1, elementwise::tanh),
    ("ThresholdedRelu", 10, elementwise::thresholded_relu),
    ("Where", 9, elementwise::where_),
    ("Xor", 1, elementwise::xor),
    // reduce.rs
    ("ArgMax", 1, reduce::argmax),
    ("ArgMin", 1, reduce::argmin),
    ("CumProd", 26, reduce::cumprod),
    ("CumSum", 11, reduce::cumsum),
    ("LogSoftmax", 1, reduce::log_softmax_v1),
    ("LogSoftmax", 13, reduce::log_softmax),
    ("ReduceL1", 1, reduce::reduce_l1),
    ("ReduceL2", 1, reduce::reduce_l2),
    ("ReduceLogSum", 1, reduce::reduce_log_sum),
    ("ReduceLogSumExp", 1, reduce::reduce_log_sum_exp),
    ("ReduceMax", 1, reduce::reduce_max),
    ("ReduceMean", 1, reduce::reduce_mean),
    ("ReduceMin", 1, reduce::reduce_min),
    ("ReduceProd", 1, reduce::reduce_prod),
    ("ReduceSum", 1, reduce::reduce_sum),
    ("ReduceSumSquare", 1, reduce::reduce_sum_square),
    ("Hardmax", 1, reduce::hardmax_v1),
    ("Hardmax", 13, reduce::hardmax),
    ("Softmax", 1, reduce::softmax_v1),
    ("Softmax", 13, reduce::softmax),
    ("TopK", 1, reduce::top_k),
    // shape.rs
    ("Concat", 1, shape::concat),
    ("Constant", 1, shape::constant),
    ("ConstantOfShape", 9, shape::constant_of_shape),
    ("DepthToSpace", 1, shape::depth_to_space),
    ("Expand", 8, shape::expand),
    ("EyeLike", 9, shape::eye_like),
    ("Flatten", 1, shape::flatten),
    ("Gather", 1, shape::gather),
    ("GatherElements", 11, shape::gather_elements),
    ("OneHot", 9, shape::one_hot),
    ("Pad", 1, shape::pad),
    ("Range", 11, shape::range),
    ("Reshape", 5, shape::reshape),
    ("Scatter", 9, shape::scatter_elements),
    ("ScatterElements", 11, shape::scatter_elements),
    ("Shape", 1, shape::shape),
    ("Size", 1, shape::size),
    ("Slice", 1, shape::slice),
    ("SpaceToDepth", 1, shape::space_to_depth),
    ("Split", 1, shape::split),
    ("Squeeze", 1, shape::squeeze),
    ("Tile", 6, shape::tile),
    ("Transpose", 1, shape::transpose),
    ("Trilu", 14, shape::trilu),
    ("Unsqueeze", 1, shape::unsqueeze),
    ("CenterCropPad", 18, shape::center_crop_pad),
    // nn.rs
    ("AveragePool", 1, nn::average_pool),
    ("BatchNormalization", 6, nn::batch_norm),
    ("CausalConvWithState", 27, nn::causal_conv_with_state),
    ("Conv", 1, nn::conv),
    ("ConvTranspose", 1, nn::conv_transpose),
    ("Dropout", 1, nn::dropout),
    ("Einsum", 12, nn::einsum),
    ("Gemm", 1, nn::gemm),
    ("GlobalAveragePool", 1, nn::global_average_pool),
    ("GlobalMaxPool", 1, nn::global_max_pool),
    ("GroupNormalization", 18, nn::group_norm),
    ("InstanceNormalization", 1, nn::instance_norm),
    ("LayerNormalization", 17, nn::layer_norm),
    ("LpNormalization", 1, nn::lp_norm),
    ("LpPool", 2, nn::lp_pool),
    ("MatMul", 1, nn::matmul),
    ("MaxPool", 1, nn::max_pool),
    ("MeanVarianceNormalization", 9, nn::mean_variance_norm),
    ("RMSNormalization", 23, nn::rms_norm),
    ("LRN", 1, nn::lrn),
    // control.rs
    ("If", 1, control::if_),
    ("Loop", 1, control::loop_),
    ("Scan", 8, control::scan_8),
    ("Scan", 9, control::scan),
    ("OptionalGetElement", 18, control::optional_get_element),
    ("OptionalHasElement", 18, control::optional_has_element),
    // index.rs
    ("Col2Im", 18, index::col2im),
    ("Compress", 9, index::compress),
    ("GatherND", 11, index::gather_nd),
    ("MaxUnpool", 9, index::max_unpool),
    ("NonZero", 9, index::non_zero),
    ("ScatterND", 11, index::scatter_nd),
    ("TensorScatter", 24, index::tensor_scatter),
    ("ReverseSequence", 10, index::reverse_sequence),
    // recurrent.rs
    ("GRU", 7, recurrent::gru),
    ("LSTM", 7, recurrent::lstm),
    ("RNN", 7, recurrent::rnn),
    // quant.rs
    ("ConvInteger", 10, quant::conv_integer),
    ("DequantizeLinear", 10, quant::dequantize_linear),
    ("DynamicQuantizeLinear", 11, quant::dynamic_quantize_linear),
    ("MatMulInteger", 10, quant::matmul_integer),
    ("QLinearConv", 10, quant::qlinear_conv),
    ("QLinearMatMul", 10, quant::qlinear_matmul),
    ("QuantizeLinear", 10, quant::quantize_linear),
    // loss.rs, resize.rs, attention.rs
    ("NegativeLogLikelihoodLoss", 12, loss::nll_loss),
    (
        "SoftmaxCrossEntropyLoss",
        12,
        loss::softmax_cross_entropy_loss,
    ),
    ("Upsample", 7, resize::upsample_v7),
    ("Upsample", 9, resize::upsample),
    ("Resize", 10, resize::upsample),
    ("Resize", 11, resize::resize),
    ("Attention", 23, attention::attention),
    ("RotaryEmbedding", 23, attention::rotary_embedding),
    ("LinearAttention", 27, attention::linear_attention),
    ("AffineGrid", 20, resize::affine_grid),
    ("GridSample", 16, grid_sample::grid_sample),
    // linalg.rs
    ("Det", 11, linalg::det),
    // ngrams.rs
    ("TfIdfVectorizer", 9, ngrams::tf_idf_vectorizer),
    // signal.rs
    ("BlackmanWindow", 17, signal::blackman_window),
    ("DFT", 17, signal::dft),
    ("HammingWindow", 17, signal::hamming_window),
    ("HannWindow", 17, signal::hann_window),
    ("STFT", 17, signal::stft),
];

/// The domain of the preview training ops.
pub const TRAINING_DOMAIN: &str = "ai.onnx.preview.training";

/// The domain of the other preview ops.
pub const PREVIEW_DOMAIN: &str = "ai.onnx.preview";

/// The ops of the preview domains (version 1 of each): (domain, op type, lowering).
const PREVIEW: &[(&str, &str, Lower)] = &[
    (TRAINING_DOMAIN, "Adagrad", training::adagrad),
    (TRAINING_DOMAIN, "Adam", training::adam),
    (TRAINING_DOMAIN, "Momentum", training::momentum),
    (PREVIEW_DOMAIN, "FlexAttention", attention::flex_attention),
];

/// The lowering of `op_type` of preview domain `domain`.
pub fn find_preview(domain: &str, op_type: &str) -> Option<Lower> {
    PREVIEW
        .iter()
        .find(|(d, name, _)| *d == domain && *name == op_type)
        .map(|(_, _, f)| *f)
}

/// The lowering of `op_type` for a model importing `opset` of the standard ops.
pub fn find(op_type: &str, opset: i64) -> Option<Lower> {
    TABLE
        .iter()
        .filter(|(name, since, _)| *name == op_type && *since <= opset)
        .max_by_key(|(_, since, _)| *since)
        .map(|(_, _, f)| *f)
}

/// Every op type the table lowers, sorted.
pub fn supported() -> Vec<&'static str> {
    let mut v: Vec<&str> = TABLE.iter().map(|(n, _, _)| *n).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Ops never run on a scratch graph even when their inputs are known: those with subgraphs,
/// whose nodes may name values of the enclosing graph that the node does not list as inputs
/// (their own nodes fold one by one where they can).
pub fn never_folded(op_type: &str) -> bool {
    matches!(op_type, "If" | "Loop" | "Scan" | "FlexAttention")
}

/// The most elements a constant built at import may hold (a window, a DFT matrix, a base
/// grid): a hostile size is an error before anything is allocated.
const MAX_IMPORT_ELEMS: usize = 1 << 26;

/// Refuses a constant of `elems` elements (`None`: the count overflowed) above the bound.
fn import_elems(elems: Option<usize>, what: &str) -> Result<usize> {
    match elems {
        Some(n) if n <= MAX_IMPORT_ELEMS => Ok(n),
        _ => bail!(
            Value,
            "{what} would hold more than {MAX_IMPORT_ELEMS} elements, built at import"
        ),
    }
}

/// One output that is a graph node.
fn one(v: ValueId) -> Result<Vec<Val>> {
    Ok(vec![Val::node(v)])
}

/// An integer-list attribute.
fn list(xs: &[i64]) -> Attr {
    Attr::List(xs.iter().map(|&x| Attr::Int(x)).collect())
}

/// `axis` counted from the end when negative, checked against `rank` (a rank-0 tensor has
/// no axis).
fn axis(a: i64, rank: i64) -> Result<i64> {
    let r = if a < 0 { a + rank } else { a };
    if r < 0 || r >= rank {
        bail!(Value, "axis {a} is out of range for rank {rank}");
    }
    Ok(r)
}
