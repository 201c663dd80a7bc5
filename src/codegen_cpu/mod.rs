//! CPU backend: kernels lowered to Cranelift machine code (the executor that runs a compiled
//! schedule is [`crate::exec::cpu`]).

mod generator;
pub mod helpers;
pub mod jit;
pub mod linker;
pub mod lower;
pub mod math;
pub mod object;
mod row_lanes;
mod rowcache;
mod scalar;
mod softmax;
mod streamed_stores;
mod strip;
mod vector;
pub use smelt_rt::vmath;

pub use lower::{CodegenOptions, CpuKernel, compile_kernel};
pub use streamed_stores::STREAM_MIN_BYTES;

/// The object loader's old path.
#[deprecated(since = "0.2.0", note = "renamed `codegen_cpu::linker`")]
pub mod loader {
    pub use super::linker::*;
}
