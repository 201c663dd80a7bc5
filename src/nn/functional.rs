//! Stateless forms of the layers and losses (`torch.nn.functional`).
//!
//! Losses are composed of tensor ops and keep PyTorch's numerics: `cross_entropy` goes
//! through `log_softmax`, `binary_cross_entropy_with_logits` uses the overflow-free
//! `max(-x, 0) + log1p(exp(-|x|))` form. Under autocast they compute in f32.

use crate::runtime::Tensor;
use crate::runtime::random::{Generator, with_global};
use crate::{DType, Result, bail};

/// How a loss combines its per-element values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The per-element losses, unreduced.
    None,
    /// Their mean (weighted mean for class-weighted losses).
    #[default]
    Mean,
    /// Their sum.
    Sum,
}

/// `torch.Size([2, 3])`, as PyTorch prints shapes in messages.
pub(crate) fn torch_size(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("torch.Size([{}])", dims.join(", "))
}

fn require_float(name: &str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        bail!(
            DType,
            "\"{name}\" not implemented for '{}'",
            t.dtype().scalar_name()
        );
    }
    Ok(())
}

fn reduce(loss: Tensor, reduction: Reduction) -> Result<Tensor> {
    match reduction {
        Reduction::None => Ok(loss),
        Reduction::Mean => loss.mean(),
        Reduction::Sum => loss.sum(),
    }
}

pub(crate) fn check_dropout_p(p: f64) -> Result<()> {
    crate::ir::conv::check_dropout(p)
}

/// Dropout drawing its mask from the global generator (`F.dropout`).
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    with_global(|g| dropout_with(x, p, training, g))
}

/// Dropout drawing its mask from `g`: in training mode each element is kept with
/// probability `1 - p` and scaled by `1/(1-p)`; otherwise `x` is returned unchanged.
pub fn dropout_with(x: &Tensor, p: f64, training: bool, g: &mut Generator) -> Result<Tensor> {
    check_dropout_p(p)?;
    require_float("dropout", x)?;
    if !training || p == 0.0 {
        return Ok(x.clone());
    }
    // one op whose mask is a pure function of the seed: a traced or compiled graph draws
    // the same mask as eager mode
    x.dropout_seeded(p, true, g.next_seed())
}

/// Mean squared error `(input - target)²`, reduced (`F.mse_loss`). Shapes must match.
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    require_float("mse_loss", input)?;
    require_float("mse_loss", target)?;
    if input.shape() != target.shape() {
        bail!(
            Shape,
            "Using a target size ({}) that is different to the input size ({}). This will likely lead to incorrect results due to broadcasting. Please ensure they have the same size.",
            torch_size(target.shape()),
            torch_size(input.shape())
        );
    }
    let input = crate::amp::autocast_f32(input)?;
    let target = crate::amp::autocast_f32(target)?;
    reduce(input.sub(&target)?.square()?, reduction)
}

/// Options of the class-index losses (`nll_loss`, `cross_entropy`), PyTorch's defaults.
#[derive(Clone, Debug)]
pub struct ClassLossOptions {
    /// A rescaling weight per class, 1-D of size C.
    pub weight: Option<Tensor>,
    /// Targets equal to this contribute nothing, not even to the mean's denominator.
    pub ignore_index: i64,
    /// How the per-element losses are combined.
    pub reduction: Reduction,
    /// Mixes the one-hot target with the uniform distribution (cross-entropy only).
    pub label_smoothing: f64,
}

impl Default for ClassLossOptions {
    fn default() -> Self {
        ClassLossOptions {
            weight: None,
            ignore_index: -100,
            reduction: Reduction::Mean,
            label_smoothing: 0.0,
        }
    }
}

impl ClassLossOptions {
    /// The defaults with another reduction.
    pub fn reduction(reduction: Reduction) -> Self {
        ClassLossOptions {
            reduction,
            ..Default::default()
        }
    }
}

/// Cross-entropy between `input` logits (`[N, C]`, `[C]` or `[N, C, d1, ...]`) and class
/// indices (`[N]`, `[]` or `[N, d1, ...]`, int64) with PyTorch's defaults
/// (`F.cross_entropy(input, target)`); [`cross_entropy_with`] takes the options.
pub fn cross_entropy(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    cross_entropy_with(input, target, &ClassLossOptions::default())
}

/// [`cross_entropy`] with class weights, `ignore_index`, reduction and label smoothing.
pub fn cross_entropy_with(
    input: &Tensor,
    target: &Tensor,
    opts: &ClassLossOptions,
) -> Result<Tensor> {
    require_float("cross_entropy", input)?;
    if !(0.0..=1.0).contains(&opts.label_smoothing) {
        bail!(
            Value,
            "label_smoothing must be between 0.0 and 1.0. Got: {}",
            opts.label_smoothing
        );
    }
    if input.dim() == 0 {
        bail!(Shape, "Expected 1 or more dimensions (got 0)");
    }
    let class_dim = if input.dim() == 1 { 0 } else { 1 };
    let input = crate::amp::autocast_f32(input)?;
    let logp = input.log_softmax(class_dim)?;
    class_loss(&logp, target, opts, opts.label_smoothing)
}

/// Negative log-likelihood of class indices under log-probabilities `input` with PyTorch's
/// defaults (`F.nll_loss(input, target)`); shapes as `cross_entropy`.
pub fn nll_loss(input: &Tensor, target: &Tensor) -> Result<Tensor> {
    nll_loss_with(input, target, &ClassLossOptions::default())
}

/// [`nll_loss`] with options; `label_smoothing` is not used.
pub fn nll_loss_with(input: &Tensor, target: &Tensor, opts: &ClassLossOptions) -> Result<Tensor> {
    require_float("nll_loss", input)?;
    if input.dim() == 0 {
        bail!(Shape, "Expected 1 or more dimensions (got 0)");
    }
    let input = crate::amp::autocast_f32(input)?;
    class_loss(&input, target, opts, 0.0)
}

/// Flattens to `[M, C]` log-probabilities and `[M]` targets, checks them, then computes the
/// (optionally smoothed) weighted NLL.
fn class_loss(
    logp: &Tensor,
    target: &Tensor,
    opts: &ClassLossOptions,
    smoothing: f64,
) -> Result<Tensor> {
    if target.dtype() != DType::I64 {
        bail!(
            DType,
            "expected scalar type Long but found {}",
            target.dtype().scalar_name()
        );
    }
    let (logp2, target_shape) = match logp.dim() {
        1 => {
            if target.dim() != 0 {
                bail!(
                    Shape,
                    "1D target tensor expects 2D input tensors, but found inputs with sizes {:?} and {:?}.",
                    logp.shape(),
                    target.shape()
                );
            }
            (logp.unsqueeze(0)?, Vec::new())
        }
        2 => {
            if target.dim() != 1 || target.shape()[0] != logp.shape()[0] {
                if target.dim() == 1 {
                    bail!(
                        Shape,
                        "Expected input batch_size ({}) to match target batch_size ({}).",
                        logp.shape()[0],
                        target.shape()[0]
                    );
                }
                bail!(
                    Shape,
                    "0D or 1D target tensor expected, multi-target not supported"
                );
            }
            (logp.clone(), target.shape().to_vec())
        }
        n => {
            let mut expected = vec![logp.shape()[0]];
            expected.extend_from_slice(&logp.shape()[2..]);
            if target.shape() != expected.as_slice() {
                bail!(
                    Shape,
                    "Expected target size {:?}, got {:?}",
                    expected,
                    target.shape()
                );
            }
            // Move the class dim last, then flatten everything else.
            let mut perm: Vec<i64> = vec![0];
            perm.extend(2..n as i64);
            perm.push(1);
            let c = logp.shape()[1] as i64;
            (logp.permute(&perm)?.reshape(&[-1, c])?, expected)
        }
    };
    let classes = logp2.shape()[1];
    let flat_target = target.reshape(&[-1])?;
    for t in flat_target.to_i64_vec() {
        if t != opts.ignore_index && (t < 0 || t as usize >= classes) {
            bail!(Index, "Target {t} is out of bounds.");
        }
    }
    if let Some(w) = &opts.weight
        && (w.dim() != 1 || w.numel() != classes)
    {
        bail!(
            Shape,
            "weight tensor should be defined either for all {classes} classes or no classes but got weight tensor of shape: {:?}",
            w.shape()
        );
    }
    let valid = flat_target.ne_scalar(opts.ignore_index)?;
    let safe = Tensor::where_scalar(&valid, &flat_target, 0i64)?;
    let picked = logp2.gather(1, &safe.unsqueeze(1)?)?.squeeze_dim(1)?;
    let mask = valid.to_dtype(logp2.dtype())?;
    let w_i = match &opts.weight {
        Some(w) => w.index_select(0, &safe)?.mul(&mask)?,
        None => mask,
    };
    let mut loss = picked.mul(&w_i)?.neg()?;
    if smoothing > 0.0 {
        let weighted = match &opts.weight {
            Some(w) => logp2.mul(&w.unsqueeze(0)?)?,
            None => logp2.clone(),
        };
        let valid_f = valid.to_dtype(logp2.dtype())?;
        let smooth = weighted.sum_dim(&[1], false)?.neg()?.mul(&valid_f)?;
        loss = loss
            .mul_scalar(1.0 - smoothing)?
            .add(&smooth.mul_scalar(smoothing / classes as f64)?)?;
    }
    match opts.reduction {
        Reduction::None => {
            let shape: Vec<i64> = target_shape.iter().map(|&d| d as i64).collect();
            loss.reshape(&shape)
        }
        Reduction::Sum => loss.sum(),
        Reduction::Mean => loss.sum()?.div(&w_i.sum()?),
    }
}

/// Binary cross-entropy on logits (`F.binary_cross_entropy_with_logits`), in the
/// overflow-free form `(1 - y)·x + l·(log1p(exp(-|x|)) + max(-x, 0))` with
/// `l = 1 + (pos_weight - 1)·y`; `weight` rescales each element.
pub fn binary_cross_entropy_with_logits(
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    pos_weight: Option<&Tensor>,
    reduction: Reduction,
) -> Result<Tensor> {
    require_float("binary_cross_entropy_with_logits", input)?;
    require_float("binary_cross_entropy_with_logits", target)?;
    if input.shape() != target.shape() {
        bail!(
            Shape,
            "Target size ({}) must be the same as input size ({})",
            torch_size(target.shape()),
            torch_size(input.shape())
        );
    }
    let x = crate::amp::autocast_f32(input)?;
    let y = crate::amp::autocast_f32(target)?;
    let softplus_neg = x
        .abs()?
        .neg()?
        .exp()?
        .log1p()?
        .add(&x.neg()?.clamp_min(0.0)?)?;
    let log_weight = match pos_weight {
        Some(pw) => pw.sub_scalar(1.0)?.mul(&y)?.add_scalar(1.0)?,
        None => Tensor::ones(&[], x.dtype()),
    };
    let mut loss = y
        .rsub_scalar(1.0)?
        .mul(&x)?
        .add(&log_weight.mul(&softplus_neg)?)?;
    if let Some(w) = weight {
        loss = loss.mul(w)?;
    }
    reduce(loss, reduction)
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=, scale=)`
/// ([`Tensor::scaled_dot_product_attention`]).
pub fn scaled_dot_product_attention(
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    query.scaled_dot_product_attention(key, value, attn_mask, is_causal, scale)
}

/// `F.conv1d(x, weight, bias, stride=, padding=, dilation=, groups=)` ([`Tensor::conv1d`]).
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &crate::runtime::ConvOptions,
) -> Result<Tensor> {
    x.conv1d(weight, bias, opts)
}

/// `F.conv2d(x, weight, bias, stride=, padding=, dilation=, groups=)` ([`Tensor::conv2d`]).
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: &crate::runtime::ConvOptions,
) -> Result<Tensor> {
    x.conv2d(weight, bias, opts)
}

/// `F.max_pool2d` ([`Tensor::max_pool2d`]).
pub fn max_pool2d(x: &Tensor, opts: &crate::runtime::PoolOptions) -> Result<Tensor> {
    x.max_pool2d(opts)
}

/// `F.avg_pool2d` ([`Tensor::avg_pool2d`]).
pub fn avg_pool2d(x: &Tensor, opts: &crate::runtime::PoolOptions) -> Result<Tensor> {
    x.avg_pool2d(opts)
}

/// `F.adaptive_avg_pool2d(x, output_size)` ([`Tensor::adaptive_avg_pool2d`]).
pub fn adaptive_avg_pool2d(x: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    x.adaptive_avg_pool2d(output_size)
}

/// `F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`
/// over dim 1 ([`Tensor::batch_norm`]). Training normalises with the batch's statistics
/// and, when running statistics are given, updates them in place, outside autograd:
/// `running = (1 - momentum) · running + momentum · batch`, with the batch's unbiased
/// variance (as PyTorch). Evaluation uses the running statistics.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Tensor> {
    let y = x.batch_norm(
        running_mean,
        running_var,
        weight,
        bias,
        training,
        momentum,
        eps,
    )?;
    if let (true, Some(rm), Some(rv)) = (training, running_mean, running_var) {
        let _g = crate::autograd::no_grad();
        let dims: Vec<i64> = (0..x.dim() as i64).filter(|&d| d != 1).collect();
        let mean = x.mean_dim(&dims, false)?;
        let var = x.var(Some(&dims), 1.0, false)?;
        rm.mul_scalar_(1.0 - momentum)?;
        rm.add_(&mean.mul_scalar(momentum)?)?;
        rv.mul_scalar_(1.0 - momentum)?;
        rv.add_(&var.mul_scalar(momentum)?)?;
    }
    Ok(y)
}
