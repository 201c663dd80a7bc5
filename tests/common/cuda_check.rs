//! What the CUDA execution tests share: one-output graphs from text, random inputs for a
//! graph and the comparison of a result with the interpreter's.

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

/// Tolerance of a dtype, relative and absolute: the GPU's math library and the CPU's agree
/// to a few ulps; halves round after every op.
pub fn tol(d: DType) -> f64 {
    match d {
        DType::F16 | DType::BF16 => 2e-2,
        DType::F32 => 2e-5,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let t = tol(want.dtype());
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= t * (1.0 + b.abs())
        };
        assert!(ok, "{what}: element {i}: got {a}, want {b}");
    }
}

/// The graph `g_{name}(params)` of `body`, returning `%y`.
pub fn graph_of(name: &str, params: &str, body: &str) -> Graph {
    let text = format!("graph g_{name}({params}) {{\n {body}\n return %y\n}}\n");
    let m = parse_module(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    m.graphs[0].clone()
}
