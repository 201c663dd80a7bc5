//! What the CUDA execution tests share: one-output graphs from text, random inputs for a
//! graph and the comparison of a result with the interpreter's.

use super::close::{Tol, assert_close};
use smelt::ir::graph::Graph;
use smelt::ir::parse_module;
use smelt::{DType, Tensor};

/// Random inputs for `g`: normal floats, small integers (no zero, so integer division is
/// defined), random bools.
pub fn inputs(g: &Graph) -> Vec<Tensor> {
    g.inputs()
        .iter()
        .map(|&v| {
            let ty = &g.node(v).ty;
            let t = if ty.dtype.is_float() {
                Tensor::randn(&ty.shape, Some(DType::F32))
                    .and_then(|t| t.mul_scalar(3.0))
                    .and_then(|t| t.to_dtype(ty.dtype))
            } else if ty.dtype.is_bool() {
                Tensor::randint(0, 2, &ty.shape, Some(DType::I64))
                    .and_then(|t| t.to_dtype(ty.dtype))
            } else {
                let lo = if ty.dtype == DType::U8 { 1 } else { -6 };
                Tensor::randint(lo, 7, &ty.shape, Some(DType::I64))
                    .and_then(|t| {
                        // no zeros: add 7 to them
                        let z = t.eq_scalar(0)?;
                        t.masked_fill(&z, 7)
                    })
                    .and_then(|t| t.to_dtype(ty.dtype))
            };
            t.unwrap()
        })
        .collect()
}

/// Tolerance of a dtype, `t + t·|expected|`: the GPU's math library and the CPU's agree to a
/// few ulps; halves round after every op.
pub fn tol(d: DType) -> Tol {
    let t = match d {
        DType::F16 | DType::BF16 => 2e-2,
        DType::F32 => 2e-5,
        DType::F64 => 1e-12,
        _ => 0.0,
    };
    Tol::allclose(t, t)
}

/// Asserts that a GPU result matches the interpreter's within the tolerance of its dtype.
#[track_caller]
pub fn assert_matches(what: &str, got: &Tensor, want: &Tensor) {
    assert_close(got, want, tol(want.dtype()), what);
}

/// The graph `g_{name}(params)` of `body`, returning `%y`.
pub fn graph_of(name: &str, params: &str, body: &str) -> Graph {
    let text = format!("graph g_{name}({params}) {{\n {body}\n return %y\n}}\n");
    let m = parse_module(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    m.graphs[0].clone()
}
