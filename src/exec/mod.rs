//! Running compiled graphs: the CPU executor ([`CompiledFn`], Cranelift kernels and extern
//! GEMMs on rayon) and the CUDA executor ([`CudaFn`], NVRTC kernels and cuBLAS), side by side,
//! and eager ops on GPU tensors, which run as one-op compiled graphs.

pub mod cpu;
pub mod cuda;
pub mod cuda_eager;
mod device;

pub use cpu::{CompileOptions, CompiledFn, KernelBackend, PAR_MIN_ELEMS, StepInfo, StepTimes};
pub use cuda::{CudaCompileOptions, CudaFn};
