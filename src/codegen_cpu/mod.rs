//! CPU backend: Cranelift JIT and the IR emitters it is built from.

pub mod jit;
pub mod math;
