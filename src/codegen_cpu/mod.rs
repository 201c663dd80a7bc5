//! CPU backend: kernels lowered to Cranelift machine code (the executor that runs a compiled
//! schedule is [`crate::exec::cpu`]).

pub mod helpers;
pub mod jit;
mod lanes;
pub mod loader;
pub mod lower;
pub mod math;
pub mod object;
mod rowcache;
mod scalar;
mod softmax;
mod stream;
mod strip;
mod vector;
pub use smelt_rt::vmath;

pub use lower::{CodegenOptions, CpuKernel, compile_kernel};
pub use stream::STREAM_MIN_BYTES;
