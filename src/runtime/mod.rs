//! Eager execution: `apply`, the `Tensor` methods of every op, reading elements out and
//! printing, the graph interpreter, control flow, `.npy`, random numbers and tensors on GPUs
//! (`cuda::tensor`, cuDNN). The floors below it (`device`, `layout`, `tensor`, `kernels`)
//! are re-exported here at their old paths.

mod apply;
mod bytes;
pub(crate) use bytes::literal;
pub mod control;
pub mod cuda;
mod display;
pub mod interp;
pub mod npy;
mod ops;
pub mod random;

// Modules that moved below the runtime, at their old paths.
pub use crate::device::{self, Device, cache};
pub use crate::kernels::{self, native};
pub use crate::layout;
pub use crate::tensor::{access, element, hooks, storage, strided, threads};

/// `Tensor` and `apply` at their old path.
pub mod tensor {
    pub use super::apply::apply;
    pub(crate) use crate::tensor::{AutogradMeta, Inner};
    pub use crate::tensor::{Dim, PostAccumulateHook, Tensor};
}
pub use element::Element;
pub use ops::{ClampBound, ConvOptions, IntoSizes, MemoryFormat, PoolOptions};
pub use tensor::{Dim, Tensor, apply};
