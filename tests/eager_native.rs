//! Eager f32 transcendentals run on the compiled kernels' native helpers
//! (`runtime::native`), the reference interpreter keeps the float64 formulas: eager results
//! are the helpers' bits, within the documented ulps of the reference, for contiguous,
//! strided and small tensors; the interpreter's are the reference's own.

mod common;

use common::close::ulps;
use smelt::codegen_cpu::vmath::{self, StripOp};
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::graph::Graph;
use smelt::ir::op::{Op, TensorType, UnaryOp};
use smelt::jit::run_graph;
use smelt::{DType, Generator, Tensor};

/// Each op, its eager method, its exact value in f64 (written so that no tail cancels:
/// GELU through `erfc`, the tanh GELU as `x·sigmoid(2u)`), and the ulps its helper may be
/// from it (`codegen_cpu::math`'s table; GELU's documented exception is 4.36).
type Case = (
    UnaryOp,
    fn(&Tensor) -> smelt::Result<Tensor>,
    fn(f64) -> f64,
    u64,
);

fn ops() -> Vec<Case> {
    use std::f64::consts::{FRAC_1_SQRT_2, PI};
    vec![
        (UnaryOp::Exp, Tensor::exp, f64::exp, 1),
        (UnaryOp::Tanh, Tensor::tanh, f64::tanh, 3),
        (
            UnaryOp::Sigmoid,
            Tensor::sigmoid,
            |v| 1.0 / (1.0 + (-v).exp()),
            3,
        ),
        (UnaryOp::Silu, Tensor::silu, |v| v / (1.0 + (-v).exp()), 4),
        (
            UnaryOp::Gelu { tanh: false },
            Tensor::gelu,
            |v| 0.5 * v * libm::erfc(-v * FRAC_1_SQRT_2),
            5,
        ),
        (
            UnaryOp::Gelu { tanh: true },
            Tensor::gelu_tanh,
            |v| {
                let u = (2.0 / PI).sqrt() * (v + 0.044715 * v * v * v);
                v / (1.0 + (-2.0 * u).exp())
            },
            3,
        ),
        (UnaryOp::Erf, Tensor::erf, libm::erf, 3),
        // the slopes: in ulps of 1 (their terms cancel where they cross 0)
        (
            UnaryOp::GeluSlope { tanh: false },
            Tensor::gelu_slope,
            |v| 0.5 * libm::erfc(-v * FRAC_1_SQRT_2) + v * (-0.5 * v * v).exp() / (2.0 * PI).sqrt(),
            5,
        ),
        (
            UnaryOp::GeluSlope { tanh: true },
            Tensor::gelu_tanh_slope,
            |v| {
                let k = 2.0 * (2.0 / PI).sqrt();
                let w = k * (v + 0.044715 * v * v * v);
                let (s, r) = (1.0 / (1.0 + (-w).exp()), 1.0 / (1.0 + w.exp()));
                s + v * s * r * k * (1.0 + 3.0 * 0.044715 * v * v)
            },
            5,
        ),
    ]
}

/// `u` of `x` by the reference interpreter (a one-op graph).
fn reference(u: UnaryOp, x: &Tensor) -> Vec<f32> {
    let mut g = Graph::new("one");
    let v = g
        .add_input("x", TensorType::new(DType::F32, x.shape().to_vec()))
        .unwrap();
    let y = g.add_op(Op::Unary(u), &[v]).unwrap();
    g.set_outputs(vec![y]);
    run_graph(&g, std::slice::from_ref(x)).unwrap()[0]
        .contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

fn inputs() -> Vec<Tensor> {
    let mut g = Generator::new(3);
    let big = Tensor::randn_with(&[1000, 37], Some(DType::F32), &mut g)
        .unwrap()
        .mul_scalar(4.0)
        .unwrap();
    let wide = Tensor::randn_with(&[37, 2000], Some(DType::F32), &mut g).unwrap();
    let special = Tensor::from_vec(
        vec![
            0.0f32,
            -0.0,
            1e-30,
            -1e-30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            30.0,
            -30.0,
            -9.5,
        ],
        &[10],
    )
    .unwrap();
    vec![
        big,
        // a transposed view and every other column: read through strides
        wide.t().unwrap(),
        wide.slice(1, Some(0), Some(2000), 2).unwrap(),
        special,
        Tensor::zeros(&[0, 4], DType::F32),
    ]
}

#[test]
fn eager_transcendentals_run_the_native_helpers() {
    for x in inputs() {
        let dense = x.contiguous().unwrap().to_vec::<f32>().unwrap();
        for (u, eager, exact, bound) in ops() {
            let got = eager(&x).unwrap();
            assert_eq!(got.shape(), x.shape());
            let got = got.contiguous().unwrap().to_vec::<f32>().unwrap();
            for (&g, &xi) in got.iter().zip(&dense) {
                let w = exact(f64::from(xi)) as f32;
                // GELUs flush results below the normal range to ±0, as documented
                let gelus = matches!(u, UnaryOp::Gelu { .. } | UnaryOp::GeluSlope { .. });
                let flushed = gelus && w.abs() < f32::MIN_POSITIVE && g == 0.0;
                let near = match u {
                    UnaryOp::GeluSlope { .. } => {
                        f64::from((g - w).abs()) <= bound as f64 * f64::from(f32::EPSILON)
                    }
                    _ => ulps(g, w) <= bound,
                };
                let close = (g.is_nan() && w.is_nan()) || flushed || near;
                assert!(close, "{u:?}({xi:e}): eager {g:e}, exact {w:e}");
            }
            if vmath::available() {
                // the helpers' own bits: the native path ran
                let op = smelt::runtime::native::strip_of(u).unwrap();
                let mut helper = dense.clone();
                vmath::apply(op, &mut helper);
                // (results below the normal range are the reference formula's instead)
                let same = got
                    .iter()
                    .zip(&helper)
                    .all(|(a, b)| a.to_bits() == b.to_bits() || b.abs() < f32::MIN_POSITIVE);
                assert!(same, "{u:?}: eager is not the helper's result");
            }
        }
    }
    // strip ops cover exactly these
    assert_eq!(StripOp::ALL.len(), ops().len());
}

#[test]
fn results_that_round_to_zero_keep_their_sign() {
    // far below each op's last non-zero result the helpers' ±0 stands without the reference
    // formula: it must be the exact value rounded (with its sign), eager and compiled
    let xs = [
        -11.6f32, -12.5, -14.0, -15.5, -20.0, -106.0, -111.0, -300.0, -1e6,
    ];
    let x = Tensor::from_vec(xs.to_vec(), &[xs.len()]).unwrap();
    for (u, eager, exact, _) in ops() {
        let mut g = Graph::new("one");
        let v = g
            .add_input("x", TensorType::new(DType::F32, vec![xs.len()]))
            .unwrap();
        let y = g.add_op(Op::Unary(u), &[v]).unwrap();
        g.set_outputs(vec![y]);
        let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        let compiled = f.call(std::slice::from_ref(&x)).unwrap()[0]
            .to_vec::<f32>()
            .unwrap();
        let got = eager(&x).unwrap().to_vec::<f32>().unwrap();
        let mut zeros = 0;
        for ((&e, &c), xi) in got.iter().zip(&compiled).zip(xs) {
            let w = exact(f64::from(xi)) as f32;
            if w == 0.0 {
                zeros += 1;
                // (a slope's f64 formula is a sum of two terms that underflow, whose zero has
                // no reliable sign)
                let slope = matches!(u, UnaryOp::GeluSlope { .. });
                for (r, path) in [(e, "eager"), (c, "compiled")] {
                    let same = if slope {
                        r == w
                    } else {
                        r.to_bits() == w.to_bits()
                    };
                    assert!(same, "{u:?}({xi:e}): {path} {r:e}, exact {w:e}");
                }
            }
        }
        // every op but tanh and erf vanishes somewhere here
        let vanishes = !matches!(u, UnaryOp::Tanh | UnaryOp::Erf);
        assert_eq!(zeros > 0, vanishes, "{u:?}");
    }
}

#[test]
fn the_interpreter_keeps_the_reference_formulas() {
    // the reference is PyTorch's formula evaluated in f64 and rounded once
    let x = inputs().remove(0);
    let dense = x.to_vec::<f32>().unwrap();
    let got = reference(UnaryOp::Gelu { tanh: false }, &x);
    for (&g, &v) in got.iter().zip(&dense) {
        let v = f64::from(v);
        let want = (0.5 * v * (1.0 + libm::erf(v * std::f64::consts::FRAC_1_SQRT_2))) as f32;
        assert_eq!(g.to_bits(), want.to_bits(), "gelu({v:e})");
    }
    // and eager differs from it somewhere (else the first test could not tell the paths apart)
    if vmath::available() {
        let eager = x.gelu().unwrap().to_vec::<f32>().unwrap();
        assert!(
            eager
                .iter()
                .zip(&got)
                .any(|(a, b)| a.to_bits() != b.to_bits())
        );
    }
}

/// `softmax` or `log_softmax` over the last dim by the reference interpreter.
fn reference_softmax(x: &Tensor, log: bool) -> Vec<f32> {
    let mut g = Graph::new("one");
    let v = g
        .add_input("x", TensorType::new(DType::F32, x.shape().to_vec()))
        .unwrap();
    let op = if log {
        Op::LogSoftmax { dim: -1 }
    } else {
        Op::Softmax { dim: -1 }
    };
    let y = g.add_op(op, &[v]).unwrap();
    g.set_outputs(vec![y]);
    run_graph(&g, std::slice::from_ref(x)).unwrap()[0]
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn eager_softmax_runs_the_native_exp() {
    let mut rows = inputs();
    // rows with -inf (masked keys), all -inf, and a NaN
    let ninf = f32::NEG_INFINITY;
    rows.push(
        Tensor::from_vec(
            vec![
                1.0,
                ninf,
                2.0,
                0.5,
                3.0, //
                ninf,
                ninf,
                ninf,
                ninf,
                ninf, //
                1.0,
                f32::NAN,
                0.0,
                -1.0,
                2.0,
            ],
            &[3, 5],
        )
        .unwrap(),
    );
    for x in rows {
        let dense = x.contiguous().unwrap().to_vec::<f32>().unwrap();
        let len = x.shape().last().copied().unwrap_or(1).max(1);
        for log in [false, true] {
            let got = if log {
                x.log_softmax(-1)
            } else {
                x.softmax(-1)
            }
            .unwrap();
            assert!(got.is_contiguous() && got.shape() == x.shape());
            let got = got.to_vec::<f32>().unwrap();
            let want = reference_softmax(&x, log);
            if vmath::available() && x.numel() > 10_000 {
                // f32 arithmetic, not the reference's f64: the native path ran
                assert!(
                    got.iter()
                        .zip(&want)
                        .any(|(a, b)| a.to_bits() != b.to_bits())
                );
            }
            for (r, row) in dense.chunks(len).enumerate() {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let lo = row.iter().copied().fold(f32::INFINITY, f32::min);
                let span = f64::from(m - lo).min(1e30);
                for (j, &xi) in row.iter().enumerate() {
                    let (g, w) = (got[r * len + j], want[r * len + j]);
                    // x - max rounds in f32 (as in PyTorch's kernel): a relative error of
                    // up to ε·|x - max| in each exponential, so up to ε·span in their sum
                    // (log_softmax's logarithm), on top of a few roundings
                    let dx = if log { span } else { f64::from((xi - m).abs()) };
                    let eps = f64::from(f32::EPSILON) * (dx + 4.0);
                    let err = f64::from((g - w).abs());
                    let scale = if log {
                        1.0 + f64::from(w.abs())
                    } else {
                        f64::from(w.abs())
                    };
                    let close = (g.is_nan() && w.is_nan()) || g == w || err <= eps * scale;
                    assert!(close, "log={log} x={xi:e}: eager {g:e}, reference {w:e}");
                }
            }
        }
    }
}

/// The exactly rounded f32 of the f64 sum (or mean) of each run of `n` values.
fn exact_sums(v: &[f32], n: usize, mean: bool) -> Vec<f32> {
    v.chunks(n)
        .map(|r| {
            // f64 holds every partial sum of these f32s of one sign range exactly enough
            let s: f64 = r.iter().map(|&x| f64::from(x)).sum();
            (if mean { s / n as f64 } else { s }) as f32
        })
        .collect()
}

#[test]
fn eager_f32_sums_over_trailing_dims_are_the_f64_sums_rounded_once() {
    let mut g = Generator::new(11);
    // shapes for each path: one thread, many outputs split over threads, few long outputs
    for shape in [
        vec![3usize, 5],
        vec![512, 300],
        vec![2, 1 << 17],
        vec![1 << 18],
    ] {
        let x = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let v = x.to_vec::<f32>().unwrap();
        let last = *shape.last().unwrap();
        for mean in [false, true] {
            let rows = if mean {
                x.mean_dim(&[-1], false).unwrap()
            } else {
                x.sum_dim(&[-1], false).unwrap()
            };
            let all = if mean {
                x.mean().unwrap()
            } else {
                x.sum().unwrap()
            };
            for (got, n) in [(rows, last), (all, v.len())] {
                let want = exact_sums(&v, n, mean);
                for (a, b) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                    assert!(ulps(*a, *b) <= 1, "{shape:?} mean={mean}: {a} against {b}");
                }
            }
        }
        // a transposed view takes the reference loop, with the same values
        if shape.len() == 2 {
            let t = x.t().unwrap().contiguous().unwrap().t().unwrap();
            let a = t.sum_dim(&[1], true).unwrap().to_vec::<f32>().unwrap();
            let want = exact_sums(&v, last, false);
            for (a, b) in a.iter().zip(&want) {
                assert!(ulps(*a, *b) <= 1, "strided {shape:?}: {a} against {b}");
            }
        }
    }
    // empty runs: sums of nothing are 0, their means NaN, as PyTorch gives
    let e = Tensor::zeros(&[4, 0], DType::F32);
    assert_eq!(
        e.sum_dim(&[1], false).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 4]
    );
    assert!(
        e.mean_dim(&[1], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|m| m.is_nan())
    );
}

/// `layer_norm` over the last `len` values of `v`, in f64 (two passes: mean, then the
/// biased variance), rounded once to f32.
fn exact_layer_norm(v: &[f32], len: usize, w: Option<&[f32]>, b: Option<&[f32]>) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len());
    for row in v.chunks(len) {
        let n = len as f64;
        let m = row.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = row.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for (i, &x) in row.iter().enumerate() {
            let mut y = (f64::from(x) - m) * rstd;
            if let Some(w) = w {
                y *= f64::from(w[i]);
            }
            if let Some(b) = b {
                y += f64::from(b[i]);
            }
            out.push(y as f32);
        }
    }
    out
}

#[test]
fn eager_f32_layer_norm_is_the_f64_formula_rounded_once() {
    let mut g = Generator::new(12);
    // one row, rows split over the threads, two normalised dims, rows of one value
    for (shape, norm) in [
        (vec![3usize, 5], vec![5usize]),
        (vec![700, 300], vec![300]),
        (vec![6, 2, 1024], vec![2, 1024]),
        (vec![9, 1], vec![1]),
    ] {
        let x = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let len: usize = norm.iter().product();
        let w = Tensor::randn_with(&norm, Some(DType::F32), &mut g).unwrap();
        let b = Tensor::randn_with(&norm, Some(DType::F32), &mut g).unwrap();
        let (wv, bv) = (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        // the same values through a transposed view: the kernel reads it contiguous first
        let xt = if shape.len() == 2 {
            x.t().unwrap().contiguous().unwrap().t().unwrap()
        } else {
            x.clone()
        };
        let v = x.to_vec::<f32>().unwrap();
        for (wt, bt) in [
            (Some(&w), Some(&b)),
            (Some(&w), None),
            (None, Some(&b)),
            (None, None),
        ] {
            let want = exact_layer_norm(&v, len, wt.map(|_| &wv[..]), bt.map(|_| &bv[..]));
            for input in [&x, &xt] {
                let got = input.layer_norm(&norm, wt, bt, 1e-5).unwrap();
                assert_eq!(got.shape(), &shape[..]);
                for (a, e) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                    let near = ulps(*a, *e) <= 1 || (a - e).abs() <= 1e-12;
                    assert!(
                        near,
                        "{shape:?} w={} b={}: {a} against {e}",
                        wt.is_some(),
                        bt.is_some()
                    );
                }
            }
        }
    }
    // no rows: an empty result of the same shape
    let e = Tensor::zeros(&[0, 8], DType::F32);
    assert_eq!(
        e.layer_norm(&[8], None, None, 1e-5).unwrap().shape(),
        &[0, 8]
    );
}

/// The exactly rounded f32 of the f64 sum (or mean) of each column of `rows` rows.
fn exact_col_sums(v: &[f32], rows: usize, mean: bool) -> Vec<f32> {
    let cols = v.len() / rows;
    (0..cols)
        .map(|c| {
            let s: f64 = (0..rows).map(|r| f64::from(v[r * cols + c])).sum();
            (if mean { s / rows as f64 } else { s }) as f32
        })
        .collect()
}

#[test]
fn eager_f32_sums_over_leading_dims_are_the_f64_sums_rounded_once() {
    let mut g = Generator::new(13);
    // one thread, columns split over threads (odd widths), two leading dims, one column
    for (shape, lead) in [
        (vec![3usize, 5], 1usize),
        (vec![700, 333], 1),
        (vec![4, 50, 257], 2),
        (vec![40_000, 1], 1),
    ] {
        let x = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let v = x.to_vec::<f32>().unwrap();
        let rows: usize = shape[..lead].iter().product();
        let dims: Vec<i64> = (0..lead as i64).collect();
        for mean in [false, true] {
            for keep in [false, true] {
                let got = if mean {
                    x.mean_dim(&dims, keep).unwrap()
                } else {
                    x.sum_dim(&dims, keep).unwrap()
                };
                let mut want_shape = shape.clone();
                if keep {
                    want_shape[..lead].fill(1);
                } else {
                    want_shape.drain(..lead);
                }
                assert_eq!(got.shape(), &want_shape[..]);
                let want = exact_col_sums(&v, rows, mean);
                for (a, b) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
                    assert!(ulps(*a, *b) <= 1, "{shape:?} mean={mean}: {a} against {b}");
                }
            }
        }
    }
    // no rows: sums of nothing are 0, their means NaN
    let e = Tensor::zeros(&[0, 3], DType::F32);
    assert_eq!(
        e.sum_dim(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 3]
    );
    assert!(
        e.mean_dim(&[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|m| m.is_nan())
    );
}
