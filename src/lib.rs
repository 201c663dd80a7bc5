//! smelt: a tensor library whose core is a JIT compiler with kernel fusion.
//!
//! Eager tensor code runs on reference kernels (`runtime`); the same ops, defined once in
//! `ir::op`, are what graphs are built from.

pub mod codegen_cpu;
pub mod error;
pub mod ir;
pub mod runtime;

pub use error::{Error, Result};
pub use ir::dtype::{DType, Scalar};
pub use runtime::{Device, Element, Tensor};
