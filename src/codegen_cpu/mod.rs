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
