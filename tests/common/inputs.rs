//! Random inputs for a graph's parameters, drawn from a seed so that a failure reproduces.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::ir::graph::Graph;
use smelt::ir::op::{Op, TensorType};
use smelt::{DType, Tensor};

/// What random inputs are drawn from.
#[derive(Clone, Copy, Debug)]
pub struct Dist {
    /// Float values are uniform in `[-span, span)` (then cast to the input's dtype).
    pub span: f64,
    /// Integer values are uniform in `lo..hi` when given; otherwise they are float values
    /// cast to the dtype (truncated toward zero).
    pub ints: Option<(i64, i64)>,
    /// Bools are true with this probability when given; otherwise they are float values cast
    /// to bool (non-zero is true).
    pub bools: Option<f64>,
}

impl Dist {
    /// What [`inputs_for`] draws: floats in `[-3, 3)`, integers cast from them, bools true
    /// with probability 0.3.
    pub const DEFAULT: Dist = Dist {
        span: 3.0,
        ints: None,
        bools: Some(0.3),
    };
}

/// A random tensor of `dtype` and `shape` drawn from `d`.
pub fn random_tensor(rng: &mut StdRng, dtype: DType, shape: &[usize], d: &Dist) -> Tensor {
    let n: usize = shape.iter().product();
    let cast = |t: Tensor| smelt::runtime::apply(Op::To { dtype }, &[&t]).unwrap();
    match (d.bools, d.ints) {
        (Some(p), _) if dtype == DType::Bool => {
            let b: Vec<bool> = (0..n).map(|_| rng.random_bool(p)).collect();
            Tensor::from_vec(b, shape).unwrap()
        }
        (_, Some((lo, hi))) if !dtype.is_float() && dtype != DType::Bool => {
            let v: Vec<i64> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
            cast(Tensor::from_vec(v, shape).unwrap())
        }
        _ => {
            let v: Vec<f64> = (0..n).map(|_| rng.random_range(-d.span..d.span)).collect();
            let t = Tensor::from_vec(v, shape).unwrap();
            if dtype == DType::F64 { t } else { cast(t) }
        }
    }
}

/// Random inputs for every parameter of `g`, drawn from `d` with `seed`.
pub fn inputs_with(g: &Graph, seed: u64, d: &Dist) -> Vec<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    g.inputs()
        .iter()
        .map(|&v| {
            let ty = &g.node(v).ty;
            random_tensor(&mut rng, ty.dtype, &ty.shape, d)
        })
        .collect()
}

/// Random inputs for every parameter of `g` ([`Dist::DEFAULT`]), drawn with `seed`.
pub fn inputs_for(g: &Graph, seed: u64) -> Vec<Tensor> {
    inputs_with(g, seed, &Dist::DEFAULT)
}

/// Values that stress IEEE corner cases.
pub const SPECIAL: [f64; 10] = [
    f64::NAN,
    0.0,
    -0.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -1.5,
    2.5,
    1e-40,
    -3.0,
    65504.0,
];

/// A tensor of `ty` where about 30% of float values are [`SPECIAL`] and the rest are small
/// multiples of 0.75 (integers: small integers; bools: true with probability 0.4).
fn special_tensor(rng: &mut StdRng, ty: &TensorType) -> Tensor {
    let n: usize = ty.shape.iter().product();
    if ty.dtype == DType::Bool {
        let b: Vec<bool> = (0..n).map(|_| rng.random_bool(0.4)).collect();
        return Tensor::from_vec(b, &ty.shape).unwrap();
    }
    let v: Vec<f64> = (0..n)
        .map(|i| {
            if ty.dtype.is_float() && rng.random_bool(0.3) {
                SPECIAL[(i + rng.random_range(0..SPECIAL.len())) % SPECIAL.len()]
            } else {
                rng.random_range(-4.0..4.0_f64).round()
                    * if ty.dtype.is_float() { 0.75 } else { 1.0 }
            }
        })
        .collect();
    let t = Tensor::from_vec(v, &ty.shape).unwrap();
    smelt::runtime::apply(Op::To { dtype: ty.dtype }, &[&t]).unwrap()
}

/// Named inputs for every parameter of `g` with IEEE corner cases among the values (NaN,
/// signed zeros, infinities, a subnormal, f16's largest value), drawn with `seed`.
pub fn special_inputs_for(g: &Graph, seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = StdRng::seed_from_u64(seed);
    g.inputs()
        .iter()
        .map(|&v| {
            let n = g.node(v);
            (n.name.clone(), special_tensor(&mut rng, &n.ty))
        })
        .collect()
}

/// The interpreter's outputs of `g` on `inputs`, given in the graph's input order.
pub fn interpret(g: &smelt::ir::Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let named: Vec<(String, Tensor)> = g
        .inputs()
        .iter()
        .zip(inputs)
        .map(|(&v, t)| (g.node(v).name.clone(), t.clone()))
        .collect();
    smelt::runtime::interp::run(g, &named).unwrap()
}

/// Per output and element: the largest change of `run`'s results (against `want`, its
/// results on `inputs`) when every float input element moves by up to two ulps of its
/// dtype, up or down (three draws; a draw `run` refuses is skipped). Rounding inside a
/// program moves a result about as far, so a comparison may allow a few times this spread:
/// a chain of `exp`s, or a layer_norm of nearly equal values, has a large one, and
/// differences of that size between two correct programs are rounding, not a bug.
pub fn spread(
    run: impl Fn(&[Tensor]) -> Option<Vec<Tensor>>,
    inputs: &[Tensor],
    want: &[Tensor],
) -> Vec<Vec<f64>> {
    let want: Vec<Vec<f64>> = want.iter().map(|t| t.try_to_f64_vec().unwrap()).collect();
    let mut spread: Vec<Vec<f64>> = want.iter().map(|w| vec![0.0; w.len()]).collect();
    let mut r = StdRng::seed_from_u64(0x5eed);
    for _ in 0..3 {
        let moved: Vec<Tensor> = inputs
            .iter()
            .map(|t| {
                let eps = match t.dtype() {
                    DType::F64 => f64::EPSILON,
                    DType::F32 => f32::EPSILON as f64,
                    DType::F16 | DType::BF16 => 2f64.powi(-7),
                    _ => return t.clone(),
                };
                let v: Vec<f64> = t
                    .try_to_f64_vec()
                    .unwrap()
                    .iter()
                    .map(|&x| x * (1.0 + r.random_range(-2i32..=2) as f64 * eps))
                    .collect();
                Tensor::from_vec(v, t.shape())
                    .unwrap()
                    .to_dtype(t.dtype())
                    .unwrap()
            })
            .collect();
        let Some(out) = run(&moved) else { continue };
        for (i, o) in out.iter().enumerate().take(want.len()) {
            let o = o.try_to_f64_vec().unwrap();
            for (k, (x, w)) in o.iter().zip(&want[i]).enumerate() {
                let d = (x - w).abs();
                spread[i][k] = spread[i][k].max(if d.is_nan() { f64::INFINITY } else { d });
            }
        }
    }
    spread
}
