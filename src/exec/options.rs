//! How to compile a graph: one tree of options, handed by reference down the floors.
//!
//! [`CompileOptions`] holds what each floor reads and nothing twice: the passes' options
//! ([`PassOptions`]: folding, control flow, rewriting, fusion), then what the CPU executor and
//! its code generator read ([`CpuOptions`]) and what the CUDA executor and NVRTC read
//! ([`GpuOptions`]). A floor takes the branch it needs (`exec::plan` the passes, the
//! Cranelift lowering `cpu.codegen`), so an option has one home and one meaning.

use crate::codegen_cpu::lower::CodegenOptions;
use crate::codegen_cuda::CudaOptions;
use crate::passes::PassOptions;

/// What runs the fused kernels on the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelBackend {
    /// Machine code generated with Cranelift.
    #[default]
    Cranelift,
    /// The kernel-IR reference interpreter (slow; needs no code generation).
    Interp,
}

impl KernelBackend {
    /// Name in reports and errors.
    pub fn name(self) -> &'static str {
        match self {
            KernelBackend::Cranelift => "cranelift",
            KernelBackend::Interp => "kernel-interp",
        }
    }
}

/// Where [`CompiledFn::compile`](super::CompiledFn::compile) caches compiled code between
/// processes ([`CodeOrigin`](super::CodeOrigin)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DiskCache {
    /// `$SMELT_CACHE_DIR/cpu` (the default; `SMELT_CACHE_DIR=off` turns it off).
    #[default]
    Env,
    /// No disk cache: the JIT compiles in memory.
    Off,
    /// This directory.
    At(std::path::PathBuf),
}

/// How to compile a graph, for either executor.
///
/// The builder methods set the common cases; the fields reach every option:
///
/// ```
/// use smelt::exec::CompileOptions;
/// let mut o = CompileOptions::default().fused(false).threads(1);
/// o.passes.rewrite.node_limit = 2_000;
/// assert!(!o.passes.fuse.fuse);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// The passes: folding, control flow, rewriting (`rewrite.non_ieee_rules`) and fusion
    /// (`fuse.fuse`, `fuse.channels_last_inputs`).
    pub passes: PassOptions,
    /// The CPU executor and its code generator.
    pub cpu: CpuOptions,
    /// The CUDA executor and NVRTC.
    pub gpu: GpuOptions,
}

/// What the CPU executor reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// What runs the kernels.
    pub kernels: KernelBackend,
    /// Options of the Cranelift lowering (`f32_lane_sums`, `inline_math`, streamed stores).
    pub codegen: CodegenOptions,
    /// Threads for one call (`None`: rayon's global pool).
    pub threads: Option<usize>,
    /// Where compiled code is cached between processes.
    pub disk_cache: DiskCache,
    /// Run a convolution's pointwise epilogue inside it, on each tile of its output while
    /// the tile is in cache (on by default; off runs it as a step of its own, for
    /// comparisons).
    pub conv_epilogues: bool,
}

impl Default for CpuOptions {
    fn default() -> CpuOptions {
        CpuOptions {
            kernels: KernelBackend::Cranelift,
            codegen: CodegenOptions::default(),
            threads: None,
            disk_cache: DiskCache::Env,
            conv_epilogues: true,
        }
    }
}

/// What the CUDA executor reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// The GPU's ordinal.
    pub device: usize,
    /// Options of the CUDA C generator and NVRTC (`use_fast_math`).
    pub codegen: CudaOptions,
}

impl CompileOptions {
    /// Fused kernels on `backend`.
    pub fn with_backend(backend: KernelBackend) -> CompileOptions {
        let mut o = CompileOptions::default();
        o.cpu.kernels = backend;
        o
    }
    /// The same options with fusion on or off; off gives the unfused baseline (one kernel
    /// per op, same code generation).
    pub fn fused(mut self, fuse: bool) -> CompileOptions {
        self.passes.fuse.fuse = fuse;
        self
    }
    /// Whether ops are fused into kernels.
    pub fn fuses(&self) -> bool {
        self.passes.fuse.fuse
    }
    /// The same options with every approximation allowed or none: rewrite rules that can
    /// change IEEE results, f32 sums in f32 lanes on the CPU, `--use_fast_math` for NVRTC.
    pub fn fast_math(mut self, on: bool) -> CompileOptions {
        self.passes.rewrite.non_ieee_rules = on;
        self.cpu.codegen.f32_lane_sums = on;
        self.gpu.codegen.use_fast_math = on;
        self
    }
    /// The same options with a fixed number of threads (a pool of its own; with 1, every
    /// kernel runs on the calling thread).
    pub fn threads(mut self, n: usize) -> CompileOptions {
        self.cpu.threads = Some(n);
        self
    }
    /// The same options with these inputs taken in the channels_last memory format: they
    /// are read through their strides with no copy, and the 4-D values computed from them
    /// are kept NHWC (convolutions and pooling run their NHWC kernels, results come back
    /// channels_last).
    pub fn channels_last<S: AsRef<str>>(mut self, inputs: &[S]) -> CompileOptions {
        self.passes.fuse.channels_last_inputs =
            inputs.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }
    /// The graph inputs taken in the channels_last memory format.
    pub fn channels_last_inputs(&self) -> &[String] {
        &self.passes.fuse.channels_last_inputs
    }
    /// The same options with compiled code cached in `cache`.
    pub fn disk_cache(mut self, cache: DiskCache) -> CompileOptions {
        self.cpu.disk_cache = cache;
        self
    }
    /// The same options with convolutions' epilogues run inside them or not.
    pub fn conv_epilogues(mut self, nest: bool) -> CompileOptions {
        self.cpu.conv_epilogues = nest;
        self
    }
    /// The same options with transcendentals kept inline (no strips) or not.
    pub fn inline_math(mut self, inline: bool) -> CompileOptions {
        self.cpu.codegen.inline_math = inline;
        self
    }
    /// The same options for GPU `device`.
    pub fn on_gpu(mut self, device: usize) -> CompileOptions {
        self.gpu.device = device;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_math_sets_each_approximation_and_nothing_else() {
        let o = CompileOptions::default().fast_math(true);
        assert!(o.passes.rewrite.non_ieee_rules);
        assert!(o.cpu.codegen.f32_lane_sums);
        assert!(o.gpu.codegen.use_fast_math);
        assert_eq!(o.clone().fast_math(false), CompileOptions::default());
    }

    #[test]
    fn builders_write_into_the_branch_that_reads_them() {
        let o = CompileOptions::with_backend(KernelBackend::Interp)
            .fused(false)
            .threads(2)
            .channels_last(&["x"])
            .inline_math(true)
            .conv_epilogues(false)
            .on_gpu(1);
        assert_eq!(o.cpu.kernels, KernelBackend::Interp);
        assert!(!o.fuses());
        assert_eq!(o.cpu.threads, Some(2));
        assert_eq!(o.channels_last_inputs(), ["x".to_string()]);
        assert!(o.cpu.codegen.inline_math);
        assert!(!o.cpu.conv_epilogues);
        assert_eq!(o.gpu.device, 1);
    }
}
