//! Eager execution: tensors, storage, layouts and the reference kernels.

pub mod access;
pub mod device;
mod display;
pub mod element;
pub mod kernels;
pub mod layout;
mod ops;
pub mod random;
pub mod storage;
pub mod strided;
pub mod tensor;

pub use device::Device;
pub use element::Element;
pub use tensor::{Tensor, apply};
