//! CUDA C from the kernel IR: one `extern "C" __global__` function per fused kernel, compiled
//! with NVRTC to PTX and CUBIN (no GPU needed for that).
//!
//! [`generate`] turns a [`Schedule`] into a [`CudaProgram`]: the shared prelude (helpers for
//! wrapping integer ops, NaN-propagating max/min, block reductions), and per kernel its source,
//! its parameters (one pointer per buffer it touches, then the error flag) and its launch
//! rule. The data-movement extern calls (cat, stack, gather, ...) get kernels of their own
//! ([`indexing`]); the other extern calls (GEMMs, scatters) are listed for the runtime, which
//! serves them with libraries (cuBLAS) or its own kernels.
//!
//! Semantics are those of the eager kernels: f16/bf16 compute in f32 and round after every
//! op, integers wrap, max/min propagate NaN, an integer remainder by zero sets the error flag
//! (`*sm_err = 1`) instead of trapping, float→int casts saturate (NaN gives 0).

mod cnn;
mod emit;
pub mod indexing;
pub use crate::runtime::cuda::{locate, nvrtc};
mod preamble;
mod scalar;
mod vector;

use crate::Result;
use crate::ir::dtype::DType;
use crate::kernel::{BufferId, Schedule, Step, View};

/// Code generation options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// Compile with `--use_fast_math` (approximate transcendentals, flushed denormals).
    pub use_fast_math: bool,
}

/// How a kernel parameter is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamAccess {
    /// Read only (`const T*`).
    Read,
    /// Written only.
    Write,
    /// Read and written (an in-place update).
    ReadWrite,
    /// A device `unsigned int` set to 1 when an integer division by zero happened.
    ErrorFlag,
}

impl ParamAccess {
    /// Name in manifests.
    pub fn name(self) -> &'static str {
        match self {
            ParamAccess::Read => "read",
            ParamAccess::Write => "write",
            ParamAccess::ReadWrite => "read_write",
            ParamAccess::ErrorFlag => "error_flag",
        }
    }
}

/// One pointer parameter of a kernel, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelParam {
    /// Its name in the C source (`b3`, `sm_err`).
    pub name: String,
    /// The schedule buffer it points to (`None` for the error flag).
    pub buffer: Option<BufferId>,
    /// Its C type (`const float*`).
    pub ctype: String,
    /// Whether the kernel reads it, writes it, or both.
    pub access: ParamAccess,
}

/// How a kernel is launched (1-d grids and blocks, no dynamic shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// A grid-stride loop over `n` elements.
    Pointwise {
        /// Number of elements.
        n: u64,
        /// Threads per block.
        block: u32,
        /// Blocks in the grid.
        grid: u64,
    },
    /// One block per row (grid-stride over rows), or one thread per row when
    /// `per_thread` (rows strided in memory, consecutive rows adjacent: each thread walks
    /// its row alone, so a warp reads 32 adjacent elements at every step); `shared_bytes`
    /// of static shared memory.
    Rows {
        /// One thread per row instead of one block.
        per_thread: bool,
        /// Number of rows.
        rows: u64,
        /// Elements per row.
        row_len: u64,
        /// Threads per block.
        block: u32,
        /// Blocks in the grid.
        grid: u64,
        /// Bytes of static shared memory per block.
        shared_bytes: u32,
    },
}

impl Launch {
    /// Threads per block.
    pub fn block(&self) -> u32 {
        match *self {
            Launch::Pointwise { block, .. } | Launch::Rows { block, .. } => block,
        }
    }

    /// Blocks in the grid; 0 means the kernel has nothing to do and is not launched.
    pub fn grid(&self) -> u64 {
        match *self {
            Launch::Pointwise { grid, .. } | Launch::Rows { grid, .. } => grid,
        }
    }
}

/// The CUDA source of one fused kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaKernelSrc {
    /// The C function name (unique in the program).
    pub name: String,
    /// The kernel's name in the schedule (`k0`).
    pub ir_name: String,
    /// The `__global__` function alone (see [`CudaProgram::unit`] for a compilable file).
    pub source: String,
    /// The pointer parameters, in order.
    pub params: Vec<KernelParam>,
    /// Grid and block sizes.
    pub launch: Launch,
    /// Whether it needs the f16/bf16 headers.
    pub uses_half: bool,
}

impl CudaKernelSrc {
    /// Whether the kernel may set its error flag (an integer remainder or division by zero,
    /// or an index out of range).
    pub fn may_raise(&self) -> bool {
        self.source.contains("sm_irem")
            || self.source.contains("sm_idiv_")
            || self.source.contains("*sm_err =")
    }
}

/// A library call the runtime serves itself.
#[derive(Clone, Debug, PartialEq)]
pub struct ExternInfo {
    /// The op's name (`matmul`).
    pub op: String,
    /// Strided views of the operands.
    pub args: Vec<View>,
    /// The buffer the result is written to.
    pub out: BufferId,
}

/// One step of the program, in schedule order.
#[derive(Clone, Debug, PartialEq)]
pub enum CudaStep {
    /// Index into [`CudaProgram::kernels`].
    Kernel(usize),
    /// An extern op with no generated kernel, run by the executor (a cuBLAS GEMM).
    Extern(ExternInfo),
    /// A control op, driven from the host; each body is a program of its own
    /// ([`generate_bodies`]).
    Control {
        /// The op's name (`fori_loop`).
        op: String,
        /// The bodies' graph names, in the op's body order.
        bodies: Vec<String>,
    },
}

/// The CUDA form of a schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaProgram {
    /// The schedule's name.
    pub name: String,
    /// The generated kernels; [`CudaStep::Kernel`] indexes them.
    pub kernels: Vec<CudaKernelSrc>,
    /// What runs, in schedule order.
    pub steps: Vec<CudaStep>,
    /// For each schedule step, the range of [`CudaProgram::steps`] that runs it (a scatter
    /// longer than a gather scans is two kernels).
    pub spans: Vec<std::ops::Range<usize>>,
    /// The options the code was generated with.
    pub options: CudaOptions,
}

impl CudaProgram {
    /// True when some kernel reads or writes f16/bf16.
    pub fn uses_half(&self) -> bool {
        self.kernels.iter().any(|k| k.uses_half)
    }

    /// The prelude for units that do (or do not) need the half headers.
    pub fn prelude(half: bool) -> String {
        let mut s = String::new();
        if half {
            s.push_str(preamble::HALF_INCLUDES);
            s.push_str(preamble::HALF_HELPERS);
        }
        s.push_str(preamble::COMMON);
        s
    }

    /// A self-contained translation unit holding kernel `i` (what `smelt compile` writes as
    /// `NAME.cu`).
    pub fn unit(&self, i: usize) -> Option<String> {
        let k = self.kernels.get(i)?;
        Some(format!("{}\n{}", Self::prelude(k.uses_half), k.source))
    }

    /// One translation unit holding every kernel.
    pub fn whole(&self) -> String {
        let mut s = Self::prelude(self.uses_half());
        for k in &self.kernels {
            s.push('\n');
            s.push_str(&k.source);
        }
        s
    }
}

/// A C identifier made of `name`'s letters, digits and underscores.
fn c_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// Generates CUDA C for every kernel of `s` (validated first).
pub fn generate(s: &Schedule, opts: &CudaOptions) -> Result<CudaProgram> {
    s.validate()?;
    let base = c_ident(&s.name);
    let mut kernels = Vec::new();
    let mut steps = Vec::new();
    let mut spans = Vec::with_capacity(s.steps.len());
    for step in &s.steps {
        let first = steps.len();
        match step {
            Step::Kernel(k) => {
                let name = format!("smelt_{base}_{}_{}", kernels.len(), c_ident(&k.name));
                kernels.push(emit::kernel(s, k, &name, opts)?);
                steps.push(CudaStep::Kernel(kernels.len() - 1));
            }
            Step::Extern(e) => {
                let name = format!("smelt_{base}_{}_{}", kernels.len(), c_ident(e.op.name()));
                let ks = indexing::kernels(s, e, &name)?;
                if ks.is_empty() {
                    steps.push(CudaStep::Extern(ExternInfo {
                        op: e.op.name().to_string(),
                        args: e.args.clone(),
                        out: e.out,
                    }));
                }
                for k in ks {
                    kernels.push(k);
                    steps.push(CudaStep::Kernel(kernels.len() - 1));
                }
            }
            Step::Control(c) => steps.push(CudaStep::Control {
                op: c.control.name().to_string(),
                bodies: c.control.bodies.iter().map(|b| b.0.name.clone()).collect(),
            }),
        }
        spans.push(first..steps.len());
    }
    Ok(CudaProgram {
        name: s.name.clone(),
        kernels,
        steps,
        spans,
        options: opts.clone(),
    })
}

/// The programs of every body that `g`'s control ops call (bodies of bodies too), each
/// partitioned as `smelt compile` partitions a graph: `(graph name, schedule, program)`.
pub fn generate_bodies(
    g: &crate::ir::graph::Graph,
    opts: &CudaOptions,
) -> Result<Vec<(String, Schedule, CudaProgram)>> {
    crate::ir::control::Control::bodies_of(g)
        .iter()
        .map(|b| {
            let expanded = crate::passes::decompose::expand_attention_grads(b)?;
            let b = &*expanded;
            let s = crate::passes::fuse::compile(b)?;
            let p = generate(&s, opts)?;
            Ok((b.name.clone(), s, p))
        })
        .collect()
}

/// The C element type of a buffer of `d` (for manifests).
pub fn c_type(d: DType) -> &'static str {
    scalar::mem_type(d)
}
