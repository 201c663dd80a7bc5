//! smelt: a tensor library whose core is a JIT compiler with kernel fusion.
//!
//! Eager tensor code runs on reference kernels (`runtime`); the same ops, defined once in
//! `ir::op`, are what graphs are built from.

#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[macro_use]
pub mod macros;
pub mod amp;
pub mod aot;
pub mod autograd;
pub mod cli;
pub mod codegen_cpu;
pub mod codegen_cuda;
pub mod data;
pub mod device;
pub mod distributed;
pub mod error;
pub mod exec;
#[doc(hidden)]
pub mod fuzz;
pub mod ir;
pub mod jit;
pub mod kernel;
pub mod kernels;
pub mod layout;
pub mod nn;
pub mod onnx;
pub mod optim;
pub mod passes;
pub mod prelude;
pub mod profiler;
pub mod runtime;
pub mod tensor;
pub mod train;

pub use error::{Error, Result};
pub use ir::dtype::{DType, Scalar};
pub use runtime::random::{Generator, manual_seed};
pub use runtime::{Device, Element, Tensor};

/// The user guide (docs/guide), its code blocks run as doctests.
#[cfg(doctest)]
pub mod guide {
    #[doc = include_str!("../docs/guide/01-tensors.md")]
    pub struct Tensors;
    #[doc = include_str!("../docs/guide/02-autograd.md")]
    pub struct Autograd;
    #[doc = include_str!("../docs/guide/03-nn-and-optim.md")]
    pub struct NnAndOptim;
    #[doc = include_str!("../docs/guide/04-mixed-precision.md")]
    pub struct MixedPrecision;
    #[doc = include_str!("../docs/guide/05-data.md")]
    pub struct Data;
    #[doc = include_str!("../docs/guide/06-tracing-and-compiling.md")]
    pub struct TracingAndCompiling;
    #[doc = include_str!("../docs/guide/07-compiled-training.md")]
    pub struct CompiledTraining;
    #[doc = include_str!("../docs/guide/08-cuda.md")]
    pub struct Cuda;
    #[doc = include_str!("../docs/guide/09-profiling.md")]
    pub struct Profiling;
    #[doc = include_str!("../docs/guide/10-cnn.md")]
    pub struct Cnn;
    #[doc = include_str!("../docs/guide/11-aot.md")]
    pub struct Aot;
    #[doc = include_str!("../docs/guide/12-from-pytorch.md")]
    pub struct FromPytorch;
    #[doc = include_str!("../docs/profiling.md")]
    pub struct ProfilerGuide;
}
