//! Compiled training steps: forward, loss, backward and the optimiser update traced into one
//! graph and compiled once, so that the update and the backward's pointwise ops fuse.

mod compiled_loop;
mod step;
mod update;

pub use compiled_loop::CompiledLoop;

pub use step::{CompiledStep, build_step_graph};
pub use update::{LrSchedule, Phase, StepConfig, StepOptimizer, build_update_graph};
