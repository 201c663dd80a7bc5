//! CPU backend: Cranelift JIT and the IR emitters it is built from.

pub mod exec;
pub mod jit;
pub mod lower;
pub mod math;

pub use exec::{CompileOptions, CompiledFn, KernelBackend, StepInfo, StepTimes};
pub use lower::{CodegenOptions, CpuKernel, compile_kernel};
