//! Loss modules: the functional losses with their options held (`nn.MSELoss`, ...).

use crate::Result;
use crate::nn::functional::{self, ClassLossOptions, Reduction};
use crate::runtime::Tensor;

/// Mean squared error (`nn.MSELoss`).
#[derive(Clone, Debug, Default)]
pub struct MSELoss {
    /// How the per-element losses are combined.
    pub reduction: Reduction,
}

impl MSELoss {
    /// The loss with the given reduction.
    pub fn new(reduction: Reduction) -> MSELoss {
        MSELoss { reduction }
    }
    /// The loss of `input` against `target`.
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::mse_loss(input, target, self.reduction)
    }
}

/// Cross-entropy of logits against class indices (`nn.CrossEntropyLoss`).
#[derive(Clone, Debug, Default)]
pub struct CrossEntropyLoss {
    /// Class weights, ignored index, reduction and label smoothing.
    pub options: ClassLossOptions,
}

impl CrossEntropyLoss {
    /// The loss with the given options.
    pub fn new(options: ClassLossOptions) -> CrossEntropyLoss {
        CrossEntropyLoss { options }
    }
    /// The loss of `logits` against `target` class indices.
    pub fn forward(&self, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::cross_entropy_with(logits, target, &self.options)
    }
}

/// Negative log-likelihood of class indices (`nn.NLLLoss`).
#[derive(Clone, Debug, Default)]
pub struct NLLLoss {
    /// Class weights, ignored index and reduction (`label_smoothing` is for cross-entropy only).
    pub options: ClassLossOptions,
}

impl NLLLoss {
    /// The loss with the given options.
    pub fn new(options: ClassLossOptions) -> NLLLoss {
        NLLLoss { options }
    }
    /// The loss of log-probabilities against `target` class indices.
    pub fn forward(&self, log_probs: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::nll_loss_with(log_probs, target, &self.options)
    }
}

/// Binary cross-entropy on logits (`nn.BCEWithLogitsLoss`).
#[derive(Clone, Debug, Default)]
pub struct BCEWithLogitsLoss {
    /// Per-element rescaling, broadcast against the loss.
    pub weight: Option<Tensor>,
    /// Weight of the positive examples, broadcast against the target (per class).
    pub pos_weight: Option<Tensor>,
    /// How the per-element losses are combined.
    pub reduction: Reduction,
}

impl BCEWithLogitsLoss {
    /// The loss with no weights and the given reduction.
    pub fn new(reduction: Reduction) -> BCEWithLogitsLoss {
        BCEWithLogitsLoss {
            weight: None,
            pos_weight: None,
            reduction,
        }
    }
    /// The loss of `logits` against `target` probabilities.
    pub fn forward(&self, logits: &Tensor, target: &Tensor) -> Result<Tensor> {
        functional::binary_cross_entropy_with_logits(
            logits,
            target,
            self.weight.as_ref(),
            self.pos_weight.as_ref(),
            self.reduction,
        )
    }
}
