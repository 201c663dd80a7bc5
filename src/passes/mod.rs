//! Graph passes, each `Graph → Graph` (meaning preserved), and the fusion partitioner that
//! turns a graph into a kernel schedule.

pub mod autodiff;
pub mod decompose;
pub mod fold;
pub mod fold_bn;
pub mod fuse;
pub mod memplan;
pub mod pipeline;
pub mod rewrite;
pub mod simplify;
pub mod simplify_control;

pub use decompose::decompose;
pub use fold::{FoldOptions, fold, fold_with};
pub use fuse::{FuseOptions, compile, fuse, fuse_with};
pub use memplan::{MemoryPlan, plan};
pub use pipeline::{Compiled, GraphPass, PassOptions, PassStats, Pipeline, Stage};
pub use simplify::{cse, dce};

/// [`simplify_control`] under the module's earlier name.
pub use simplify_control as control;
