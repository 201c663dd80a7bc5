//! Eager execution: tensors, storage, layouts and the reference kernels.

pub mod access;
mod bytes;
pub mod control;
pub mod cuda;
mod display;
pub mod element;
pub mod hooks;
pub mod interp;
pub mod kernels;
pub mod native;
pub mod npy;
mod ops;
mod pages;
pub mod random;
pub mod storage;
pub mod strided;
pub mod tensor;
pub mod threads;

// Modules that moved below the runtime, at their old paths.
pub use crate::device::{self, Device, cache};
pub use crate::layout;
pub use element::Element;
pub use ops::{ClampBound, ConvOptions, IntoSizes, MemoryFormat, PoolOptions};
pub use tensor::{Dim, Tensor, apply};
