//! Host functions that generated kernels call: each unary op's f64 reference formula
//! ([`UnaryOp::f64_helper`], so f64 results are bit-identical to eager ones), and the run-time
//! library's scalar and strip helpers ([`smelt_rt::helpers`]).
//!
//! Every function is `extern "C"` and re-entrant, and touches only its arguments (the strip
//! helpers the buffers they are given); [`symbols`] lists them with their Cranelift
//! signatures so a JIT can import them by name.

use crate::ir::op::UnaryOp;

pub use smelt_rt::Sig;

/// Every helper: symbol name, address, signature.
pub fn symbols() -> Vec<(&'static str, *const u8, Sig)> {
    use Sig::*;
    let unary = UnaryOp::ALL
        .iter()
        .map(|u| (u.helper_symbol(), u.f64_helper() as *const u8, Unary));
    unary.chain(smelt_rt::helpers()).collect()
}
