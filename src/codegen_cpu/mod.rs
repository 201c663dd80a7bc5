//! CPU backend: Cranelift JIT and the IR emitters it is built from.

pub mod helpers;
pub mod jit;
pub mod lower;
pub mod math;
mod scalar;
mod vector;

pub use lower::{CodegenOptions, CpuKernel, compile_kernel};
