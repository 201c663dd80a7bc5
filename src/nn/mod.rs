//! Neural-network building blocks in the shape of `torch.nn`: the `Module` trait, layers,
//! activations, losses, weight initialisation and state dicts saved as safetensors.
//!
//! Everything here is built from ordinary tensor ops, so gradients flow through a model
//! wherever autograd records those ops.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod ddp;
pub mod functional;
pub mod init;
pub mod layers;
pub mod loss;
pub mod module;
pub mod state_dict;
pub mod utils;

pub use activation::{
    ELU, GELU, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, Mish, ReLU, SiLU, Sigmoid, Softplus,
    Tanh,
};
pub use attention::MultiheadAttention;
pub use conv::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, Flatten,
    MaxPool2d,
};
pub use ddp::{DistributedDataParallel, NoSync};
pub use functional::Reduction;
pub use layers::{Dropout, Embedding, LayerNorm, Linear, Sequential};
pub use loss::{BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss};
pub use module::{Module, trace_module};
