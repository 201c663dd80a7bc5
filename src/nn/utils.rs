//! Gradient utilities (`torch.nn.utils`): the clipping functions live with autograd.

pub use crate::autograd::{clip_grad_norm_, clip_grad_value_};
