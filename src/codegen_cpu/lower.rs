//! Lowering of kernel-IR kernels to machine code with Cranelift.
//!
//! This build has no lowering yet: [`compile_kernel`] reports `Unsupported`, and the
//! executor's kernel-interpreter backend runs the same schedules.

use crate::kernel::{Buffer, Kernel};
use crate::{Error, Result};
use std::sync::Arc;

/// Code generation switches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    /// Allow reassociation and approximate math where it is faster.
    pub fast_math: bool,
}

/// A compiled kernel: re-entrant, callable from several threads at once.
pub struct CpuKernel {
    rows: usize,
}

/// Compiles `k` over the schedule buffers `buffers` (cached process-wide).
pub fn compile_kernel(
    k: &Kernel,
    buffers: &[Buffer],
    opts: &CodegenOptions,
) -> Result<Arc<CpuKernel>> {
    let _ = (k, buffers, opts);
    Err(Error::Unsupported(
        "cranelift lowering not built yet".into(),
    ))
}

impl CpuKernel {
    /// Number of rows: the element count of the kernel's outer space.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Runs rows `[begin, end)`; `bufs[i]` points to element 0 of schedule buffer `i`.
    ///
    /// # Safety
    /// Every buffer the kernel reads or writes must be allocated with its schedule size and
    /// dtype, and no other thread may write the rows' outputs meanwhile.
    pub unsafe fn run_rows(&self, bufs: &[*mut u8], begin: usize, end: usize) -> Result<()> {
        let _ = (bufs, begin, end);
        Err(Error::Unsupported(
            "cranelift lowering not built yet".into(),
        ))
    }
}
