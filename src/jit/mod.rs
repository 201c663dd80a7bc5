//! Just-in-time compilation front end: tracing eager code into graphs.

pub mod control;
pub mod trace;

pub use control::{cond, fori_loop, scan, while_loop};

pub use trace::{
    GuardPolicy, TraceOptions, Traced, is_tracing, record_inplace, run_graph, trace, trace_with,
    trace_with_params,
};
