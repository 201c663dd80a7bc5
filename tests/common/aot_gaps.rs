//! What ahead-of-time objects do not compile yet, shared by tests/aot_ops.rs (which checks
//! the list both ways, op by op) and tests/aot.rs (whose models may be refused only for an
//! op listed here).

/// Ops (by name, with a dtype where only some dtypes are refused) that the JIT compiles and
/// AOT refuses, and why.
pub const GAPS: &[(&str, &str)] = &[];

/// Ops that stay out of ahead-of-time models by design, and why.
pub const EXCLUDED: &[(&str, &str)] = &[(
    "all_reduce",
    "a collective needs the process group a JIT run joins; an object has none",
)];
