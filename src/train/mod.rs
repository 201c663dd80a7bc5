//! Compiled training steps: forward, loss, backward and the optimiser update traced into one
//! graph and compiled once, so that the update and the backward's pointwise ops fuse.

mod step;
mod update;

pub use step::{CompiledStep, build_step_graph};
pub use update::{LrSchedule, Phase, StepConfig, StepOptimizer, build_update_graph};
