//! Running compiled graphs: the CPU executor ([`CompiledFn`], Cranelift kernels and extern
//! GEMMs on rayon) and the CUDA executor ([`CudaFn`], NVRTC kernels and cuBLAS), side by side,
//! and eager ops on GPU tensors, which run as one-op compiled graphs.

pub mod cpu;
pub mod cuda;
pub mod cuda_eager;
mod device;
mod executable;
mod options;
mod symbolic;

pub use cpu::{CodeOrigin, CompiledFn, PAR_MIN_ELEMS, StepInfo, StepTimes, step_buffers};
pub use cuda::CudaFn;
pub use executable::{Executable, compile};
pub use options::{CompileOptions, CpuOptions, DiskCache, GpuOptions, KernelBackend};
pub use symbolic::SymbolicFn;

use crate::ir::graph::Graph;
use crate::kernel::Schedule;
use crate::passes::{PassOptions, Pipeline};
use crate::{Error, Result};

/// What both executors compile from: a graph's schedule and facts about its interface.
pub(crate) struct Planned {
    pub schedule: Schedule,
    /// The graph's input names, for errors.
    pub input_names: Vec<String>,
    /// Per output: whether it may share memory with an input (a view or reshape of one).
    pub may_alias: Vec<bool>,
}

/// Every name given as a channels_last input must be an input of `g`.
pub(crate) fn check_channels_last(g: &Graph, channels_last: &[String]) -> Result<()> {
    let names: Vec<&str> = g
        .inputs()
        .iter()
        .map(|&v| g.node(v).name.as_str())
        .collect();
    if let Some(bad) = channels_last.iter().find(|n| !names.contains(&n.as_str())) {
        return Err(Error::Value(format!(
            "channels_last: graph {} has no input named '{bad}' (its inputs: {})",
            g.name,
            names.join(", ")
        )));
    }
    Ok(())
}

/// Runs the pass pipeline up to fusion with `passes`: fused kernels, or the unfused
/// baseline (`passes.fuse.fuse` false: the ops as written, one kernel each, nothing
/// rewritten).
pub(crate) fn plan(g: &Graph, passes: &PassOptions) -> Result<Planned> {
    check_channels_last(g, &passes.fuse.channels_last_inputs)?;
    let mut pipeline = Pipeline {
        options: passes.clone(),
        ..Pipeline::default()
    };
    if !passes.fuse.fuse {
        // the unfused baseline: one op at a time, nothing rewritten or folded away
        pipeline
            .graph_passes
            .retain(|p| p.name() != "rewrite" && p.name() != "fold_bn");
    }
    let mut schedule = pipeline
        .run_until(g, "fuse")?
        .schedule
        .ok_or_else(|| Error::Value("the pass pipeline produced no schedule".into()))?;
    crate::passes::memplan::hoist_last_readers(&mut schedule);
    Ok(Planned {
        schedule,
        input_names: g.inputs().iter().map(|&v| g.node(v).name.clone()).collect(),
        may_alias: g.outputs().iter().map(|&v| g.may_alias_input(v)).collect(),
    })
}
