//! Just-in-time compilation front end: tracing eager code into graphs.

pub mod trace;
pub mod trace_control;

pub use trace_control::{cond, fori_loop, scan, while_loop};

pub use trace::{
    GuardPolicy, TraceOptions, Traced, is_tracing, record_inplace, run_graph, trace, trace_with,
    trace_with_params,
};

/// [`trace_control`] under the module's earlier name.
pub use trace_control as control;
