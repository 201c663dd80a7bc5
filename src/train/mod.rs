//! Compiled training steps: forward, loss, backward and the optimiser update traced into one
//! graph and compiled once, so that the update and the backward's pointwise ops fuse.

mod step;

pub use step::{CompiledStep, build_step_graph};
