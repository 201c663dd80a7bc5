//! Graph passes, each `Graph → Graph` (meaning preserved), and the fusion partitioner that
//! turns a graph into a kernel schedule.

pub mod decompose;
pub mod fuse;
pub mod rewrite;

pub use decompose::decompose;
pub use fuse::{FuseOptions, compile, fuse, fuse_with};
