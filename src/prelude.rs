//! What a training loop uses, in one line: `use smelt::prelude::*;`.
//!
//! Tensors and their dtypes and devices, the `tensor!` macro, errors, grad mode, the modules
//! and losses of `nn` (with `nn::functional` as `F`, as PyTorch users write it), the
//! optimisers, data loading, tracing and compiled functions.

pub use crate::autograd::{enable_grad_scope, no_grad, no_grad_scope};
pub use crate::data::DataLoader;
pub use crate::exec::{CompileOptions, CompiledFn};
pub use crate::jit::{trace, trace_with_params};
pub use crate::nn::functional as F;
pub use crate::nn::trace_module;
pub use crate::nn::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, CrossEntropyLoss,
    Dropout, Embedding, Flatten, LayerNorm, Linear, MSELoss, MaxPool2d, Module, ReLU, Reduction,
    Sequential,
};
pub use crate::optim::{Adam, AdamConfig, AdamW, GradScaler, Optimizer, SGD, SGDConfig};
pub use crate::runtime::{ConvOptions, MemoryFormat, PoolOptions};
pub use crate::train::{CompiledStep, LrSchedule, StepConfig};
pub use crate::{DType, Device, Error, Result, Scalar, Tensor, manual_seed, tensor};
