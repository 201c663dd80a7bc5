//! Host functions that generated kernels call: each unary op's f64 reference formula
//! ([`UnaryOp::f64_helper`], so f64 results are bit-identical to eager ones), and the run-time
//! library's scalar and strip helpers ([`smelt_rt::helpers`]).
//!
//! Every function is `extern "C"` and re-entrant, and touches only its arguments (the strip
//! helpers the buffers they are given); [`symbols`] lists them with their Cranelift
//! signatures so a JIT can import them by name.

use crate::ir::op::UnaryOp;

pub use smelt_rt::Sig;

/// Every helper: symbol name, address, signature. A unary op whose formula the run-time
/// library exports is called there (the same function an ahead-of-time model links); the
/// others through [`UnaryOp::f64_helper`].
pub fn symbols() -> Vec<(&'static str, *const u8, Sig)> {
    use Sig::*;
    let rt = smelt_rt::helpers();
    let mut all: Vec<(&'static str, *const u8, Sig)> = UnaryOp::ALL
        .iter()
        .filter(|u| !rt.iter().any(|(n, _, _)| *n == u.helper_symbol()))
        .map(|u| (u.helper_symbol(), u.f64_helper() as *const u8, Unary))
        .collect();
    all.extend(rt);
    all
}
