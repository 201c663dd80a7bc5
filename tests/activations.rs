//! The activations of `torch.nn.functional` that version 2 of the format adds: leaky_relu,
//! elu, softplus, hardtanh, hardswish, mish and logsigmoid. Values and gradients against
//! formulas written out here in f64 (PyTorch's definitions) and known values; special values
//! (NaN, ±inf, -0.0, the branch points); the compiled CPU code, fused and unfused, against
//! the interpreter; the text format and the nn modules.

mod common;

use common::{Tol, assert_bits, assert_close};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::autograd::gradcheck;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::graph::Graph;
use smelt::ir::op::{BinaryOp, Op, TensorType, UnaryOp};
use smelt::ir::unary::Real;
use smelt::ir::{parse_module, print_module};
use smelt::kernel::Step;
use smelt::nn::Module;
use smelt::passes::autodiff::autodiff;
use smelt::runtime::interp;
use smelt::{DType, Tensor};

fn leaky(s: f64) -> UnaryOp {
    UnaryOp::LeakyRelu {
        negative_slope: Real(s),
    }
}
fn elu(a: f64) -> UnaryOp {
    UnaryOp::Elu { alpha: Real(a) }
}
fn softplus(b: f64, t: f64) -> UnaryOp {
    UnaryOp::Softplus {
        beta: Real(b),
        threshold: Real(t),
    }
}
fn hardtanh(lo: f64, hi: f64) -> UnaryOp {
    UnaryOp::Hardtanh {
        min_val: Real(lo),
        max_val: Real(hi),
    }
}

/// Each new op at PyTorch's defaults and at other attribute values.
fn cases() -> Vec<UnaryOp> {
    vec![
        leaky(0.01),
        leaky(0.2),
        leaky(-1.5),
        elu(1.0),
        elu(0.5),
        softplus(1.0, 20.0),
        softplus(2.0, 3.0),
        softplus(0.5, 1.0),
        hardtanh(-1.0, 1.0),
        hardtanh(-0.5, 2.0),
        UnaryOp::Hardswish,
        UnaryOp::Mish,
        UnaryOp::LogSigmoid,
    ]
}

/// PyTorch's definitions, written out independently of the library's formulas.
fn expected(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::LeakyRelu { negative_slope } => {
            if x > 0.0 {
                x
            } else {
                negative_slope.get() * x
            }
        }
        UnaryOp::Elu { alpha } => {
            if x <= 0.0 {
                alpha.get() * x.exp_m1()
            } else {
                x
            }
        }
        UnaryOp::Softplus { beta, threshold } => {
            let b = beta.get();
            if x * b > threshold.get() {
                x
            } else {
                ln_one_plus((b * x).exp()) / b
            }
        }
        UnaryOp::Hardtanh { min_val, max_val } => {
            if x.is_nan() {
                x
            } else {
                x.max(min_val.get()).min(max_val.get())
            }
        }
        UnaryOp::Hardswish => {
            if x.is_nan() {
                x
            } else if x <= -3.0 {
                0.0
            } else if x >= 3.0 {
                x
            } else {
                x * (x + 3.0) / 6.0
            }
        }
        UnaryOp::Mish => x * ln_one_plus(x.exp()).tanh(),
        // ln(sigmoid(x)) = -ln(1 + e^-x)
        UnaryOp::LogSigmoid => -ln_one_plus((-x).exp()),
        other => panic!("not a new activation: {other:?}"),
    }
}

/// `ln(1 + t)` for `t >= 0`, by its series where `1 + t` would round `t` away (the test's
/// own route, not the library's `ln_1p`).
fn ln_one_plus(t: f64) -> f64 {
    if t < 1e-4 {
        t - t * t / 2.0 + t * t * t / 3.0 - t * t * t * t / 4.0
    } else {
        (1.0 + t).ln()
    }
}

/// The derivative PyTorch's backward computes (derivatives.yaml), at every point including
/// the kinks.
fn expected_grad(u: UnaryOp, x: f64) -> f64 {
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    match u {
        UnaryOp::LeakyRelu { negative_slope } => {
            if x > 0.0 {
                1.0
            } else {
                negative_slope.get()
            }
        }
        UnaryOp::Elu { alpha } => {
            if x <= 0.0 {
                alpha.get() * x.exp()
            } else {
                1.0
            }
        }
        UnaryOp::Softplus { beta, threshold } => {
            if x * beta.get() > threshold.get() {
                1.0
            } else {
                sigmoid(beta.get() * x)
            }
        }
        UnaryOp::Hardtanh { min_val, max_val } => {
            if x <= min_val.get() || x >= max_val.get() {
                0.0
            } else {
                1.0
            }
        }
        UnaryOp::Hardswish => {
            if x < -3.0 {
                0.0
            } else if x <= 3.0 {
                (2.0 * x + 3.0) / 6.0
            } else {
                1.0
            }
        }
        UnaryOp::Mish => {
            let sp = (1.0 + x.exp()).ln();
            let t = sp.tanh();
            t + x * sigmoid(x) * (1.0 - t * t)
        }
        UnaryOp::LogSigmoid => 1.0 - sigmoid(x),
        other => panic!("not a new activation: {other:?}"),
    }
}

/// Points on both sides of every branch, the branch points themselves, and specials.
const POINTS: [f64; 26] = [
    -50.0, -20.0, -6.0, -3.5, -3.0, -2.5, -1.0, -0.7, -0.5, -1e-3, -1e-9, 0.0, 1e-9, 1e-3, 0.5,
    0.7, 1.0, 1.5, 2.0, 3.0, 3.5, 6.0, 10.5, 19.0, 21.0, 45.0,
];

fn t64(v: &[f64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn eager(u: UnaryOp, x: &Tensor) -> Tensor {
    smelt::runtime::tensor::apply(Op::Unary(u), &[x]).unwrap()
}

#[test]
fn values_follow_pytorch_definitions() {
    for u in cases() {
        let got = eager(u, &t64(&POINTS));
        let want: Vec<f64> = POINTS.iter().map(|&x| expected(u, x)).collect();
        assert_close(&got, &want, Tol::allclose(1e-13, 1e-300), u.name());
    }
}

#[test]
fn known_values() {
    let at = |u: UnaryOp, x: f64| eager(u, &t64(&[x])).item_f64().unwrap();
    let close = |got: f64, want: f64| {
        assert!(
            (got - want).abs() <= 1e-15 * want.abs().max(1.0),
            "{got} vs {want}"
        )
    };
    close(at(leaky(0.01), -2.0), -0.02);
    close(at(elu(1.0), -1.0), -0.632_120_558_828_557_7);
    close(at(softplus(1.0, 20.0), 1.0), 1.313_261_687_518_222_8);
    close(at(softplus(1.0, 20.0), 0.0), std::f64::consts::LN_2);
    close(at(hardtanh(-1.0, 1.0), 2.5), 1.0);
    close(at(UnaryOp::Hardswish, 1.0), 2.0 / 3.0);
    close(at(UnaryOp::Mish, 1.0), 0.865_098_388_267_310_3);
    close(at(UnaryOp::LogSigmoid, 0.0), -std::f64::consts::LN_2);
    close(at(UnaryOp::LogSigmoid, -100.0), -100.0);
}

#[test]
fn nan_infinities_and_negative_zero() {
    let x = t64(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0]);
    let want = |u: UnaryOp| -> Vec<f64> {
        match u {
            // x > 0 ? x : slope·x
            UnaryOp::LeakyRelu { negative_slope } => {
                let s = negative_slope.get();
                vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY * s, -0.0 * s]
            }
            // alpha·expm1(-inf) = -alpha; expm1(-0) = -0
            UnaryOp::Elu { alpha } => {
                let a = alpha.get();
                vec![f64::NAN, f64::INFINITY, -a, -0.0 * a]
            }
            // linear above the threshold; log1p(e^-inf) = 0; -0.0 is on the soft side
            UnaryOp::Softplus { beta, .. } => {
                vec![f64::NAN, f64::INFINITY, 0.0, 2f64.ln() / beta.get()]
            }
            UnaryOp::Hardtanh { min_val, max_val } => {
                vec![f64::NAN, max_val.get(), min_val.get(), -0.0]
            }
            // -inf · clamp(-inf + 3, 0, 6) = -inf · 0
            UnaryOp::Hardswish => vec![f64::NAN, f64::INFINITY, f64::NAN, -0.0],
            // -inf · tanh(log1p(0)) = -inf · 0
            UnaryOp::Mish => vec![f64::NAN, f64::INFINITY, f64::NAN, -0.0],
            UnaryOp::LogSigmoid => vec![f64::NAN, 0.0, f64::NEG_INFINITY, -std::f64::consts::LN_2],
            other => panic!("{other:?}"),
        }
    };
    for u in cases() {
        let w = want(u);
        assert_bits(&eager(u, &x), &w, u.name());
        // f32 keeps the same specials
        let x32 = x.to_dtype(DType::F32).unwrap();
        let w32 = t64(&w).to_dtype(DType::F32).unwrap();
        assert_bits(&eager(u, &x32), &w32, u.name());
    }
}

#[test]
fn integer_and_bool_inputs_are_refused() {
    for u in cases() {
        for d in [DType::I64, DType::I32, DType::U8, DType::Bool] {
            let x = Tensor::from_vec(vec![1i64, -2], &[2])
                .unwrap()
                .to_dtype(d)
                .unwrap();
            let e = smelt::runtime::tensor::apply(Op::Unary(u), &[&x]).unwrap_err();
            let want = format!("\"{}\" not implemented for '{}'", u.name(), d.scalar_name());
            assert!(e.to_string().contains(&want), "{}: {e}", u.name());
        }
    }
}

#[test]
fn half_precision_rounds_once_from_f64() {
    let x = t64(&POINTS);
    for u in cases() {
        for d in [DType::F16, DType::BF16] {
            let xd = x.to_dtype(d).unwrap();
            let exact = eager(u, &xd.to_dtype(DType::F64).unwrap());
            assert_bits(&eager(u, &xd), &exact.to_dtype(d).unwrap(), u.name());
        }
    }
}

// ---- gradients ------------------------------------------------------------------------------

#[test]
fn eager_gradients_follow_pytorch_backward_formulas() {
    // the branch points of every op, where PyTorch's formulas pick a side
    let mut pts = POINTS.to_vec();
    pts.extend([-1.0, 1.0, 2.0, -0.5, 10.0, 1.5]);
    for u in cases() {
        let x = t64(&pts);
        x.requires_grad_(true).unwrap();
        eager(u, &x).sum().unwrap().backward().unwrap();
        let want: Vec<f64> = pts.iter().map(|&p| expected_grad(u, p)).collect();
        assert_close(&x.grad().unwrap(), &want, 1e-12, u.name());
    }
}

#[test]
fn gradients_pass_gradcheck_away_from_kinks() {
    let smooth = [-4.2, -2.2, -1.3, -0.4, 0.3, 0.8, 1.7, 2.6, 4.1, 12.0];
    for u in cases() {
        let x = t64(&smooth);
        gradcheck(|xs: &[Tensor]| eager(u, &xs[0]).mul_scalar(1.5), &[x])
            .unwrap_or_else(|e| panic!("{}: {e}", u.name()));
    }
}

// ---- compiled code --------------------------------------------------------------------------

fn values(rng: &mut StdRng, n: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        -3.0,
        3.0,
        -1.0,
        1.0,
        20.0,
        -30.0,
        90.0,
    ];
    for (i, s) in specials.into_iter().enumerate().take(n) {
        v[(i * 7) % n] = s;
    }
    v
}

/// `op(x) * 0.5 + b` over `x` of `shape` (b broadcast along the last dim) and `op(x)` alone.
fn chain(u: UnaryOp, d: DType, shape: &[usize]) -> Graph {
    let mut g = Graph::new(&format!("{}_{d}", u.name()));
    let x = g
        .add_input("x", TensorType::new(d, shape.to_vec()))
        .unwrap();
    let last = shape.last().copied().unwrap_or(1);
    let b = g.add_input("b", TensorType::new(d, vec![last])).unwrap();
    let y = g.add_op(Op::Unary(u), &[x]).unwrap();
    let h = g.add_scalar(smelt::Scalar::Float(0.5)).unwrap();
    let s = g.add_op(Op::Binary(BinaryOp::Mul), &[y, h]).unwrap();
    let z = g.add_op(Op::Binary(BinaryOp::Add), &[s, b]).unwrap();
    g.set_outputs(vec![y, z]);
    g
}

fn kernels(f: &CompiledFn) -> usize {
    f.schedule()
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Kernel(_)))
        .count()
}

#[test]
fn compiled_cpu_code_matches_the_interpreter() {
    let mut rng = StdRng::seed_from_u64(7);
    // vector loops with a tail, a long f32 row, a scalar, empty, and a size-1 dim
    let shapes: [&[usize]; 5] = [&[3, 37], &[4099], &[], &[0, 5], &[1, 9]];
    for u in cases() {
        for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for shape in shapes {
                let g = chain(u, d, shape);
                let n: usize = shape.iter().product();
                let last = shape.last().copied().unwrap_or(1);
                let x = Tensor::from_vec(values(&mut rng, n.max(1))[..n].to_vec(), shape)
                    .unwrap()
                    .to_dtype(d)
                    .unwrap();
                let b = Tensor::from_vec(values(&mut rng, last), &[last])
                    .unwrap()
                    .to_dtype(d)
                    .unwrap();
                let want = interp::run(&g, &[("x", x.clone()), ("b", b.clone())]).unwrap();
                for fuse in [true, false] {
                    let f =
                        CompiledFn::compile(&g, &CompileOptions::default().fused(fuse)).unwrap();
                    // (a 0-d x and its [1]-shaped sum are two index spaces)
                    if fuse && n > 0 && !shape.is_empty() {
                        assert_eq!(
                            kernels(&f),
                            1,
                            "{}: one kernel:\n{}",
                            g.name,
                            smelt::ir::print_graph(&g)
                        );
                    }
                    let got = f.call(&[x.clone(), b.clone()]).unwrap();
                    for (gt, wt) in got.iter().zip(&want) {
                        let what = format!("{} {shape:?} fused={fuse}", g.name);
                        if d == DType::F32 {
                            // f32 exp/log1p/tanh/expm1 are polynomials (≤ 4.5 ulp each)
                            // (and `* 0.5 + b` may cancel)
                            assert_close(gt, wt, Tol::rel(2e-6).or_ulps(16), &what);
                        } else {
                            // f64 calls the reference formula; f16/bf16 round once from it
                            assert_bits(gt, wt, &what);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn compiled_code_reads_transposed_and_sliced_views() {
    let mut rng = StdRng::seed_from_u64(8);
    for u in cases() {
        let g = chain(u, DType::F32, &[6, 5]);
        let base = Tensor::from_vec(values(&mut rng, 5 * 13), &[5, 13]).unwrap();
        let base = base.to_dtype(DType::F32).unwrap();
        // [5,13] -> narrow to [5,6] -> transpose to [6,5]
        let x = base.narrow(1, 4, 6).unwrap().t().unwrap();
        let b = Tensor::from_vec(values(&mut rng, 5), &[5])
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let want = interp::run(&g, &[("x", x.clone()), ("b", b.clone())]).unwrap();
        let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        let got = f.call(&[x, b]).unwrap();
        for (gt, wt) in got.iter().zip(&want) {
            assert_close(gt, wt, Tol::rel(2e-6).or_ulps(16), u.name());
        }
    }
}

#[test]
fn gradient_graphs_compile_and_match_eager_backward() {
    let mut rng = StdRng::seed_from_u64(9);
    for u in cases() {
        let mut g = Graph::new(&format!("grad_{}", u.name()));
        let x = g
            .add_input("x", TensorType::new(DType::F64, vec![4, 11]))
            .unwrap();
        let y = g.add_op(Op::Unary(u), &[x]).unwrap();
        g.set_outputs(vec![y]);
        let gg = autodiff(&g, &["x"]).unwrap();
        let mut v = values(&mut rng, 44);
        v.iter_mut()
            .filter(|p| !p.is_finite())
            .for_each(|p| *p = 0.25);
        let xv = Tensor::from_vec(v, &[4, 11]).unwrap();
        let want = interp::run(&gg, &[("x", xv.clone())]).unwrap();
        // eager backward of the sum gives the same gradient
        let leaf = xv.clone();
        leaf.requires_grad_(true).unwrap();
        eager(u, &leaf).sum().unwrap().backward().unwrap();
        let grad = want.last().unwrap();
        assert_close(&leaf.grad().unwrap(), grad, 1e-12, u.name());
        for fuse in [true, false] {
            let f = CompiledFn::compile(&gg, &CompileOptions::default().fused(fuse)).unwrap();
            let got = f.call(std::slice::from_ref(&xv)).unwrap();
            for (gt, wt) in got.iter().zip(&want) {
                assert_close(gt, wt, 1e-12, &format!("{} fused={fuse}", u.name()));
            }
        }
    }
}

// ---- text format and modules ----------------------------------------------------------------

#[test]
fn text_form_round_trips_and_drops_defaults() {
    let text = "graph g(%x: f32[3]) {
  %a = leaky_relu(%x, negative_slope=0.2)
  %b = elu(%a)
  %c = softplus(%b, beta=2, threshold=10.0)
  %d = hardtanh(%c, min_val=-2.0, max_val=2.0)
  %e = hardswish(%d)
  %f = mish(%e)
  %h = logsigmoid(%f)
  %i = leaky_relu(%h, negative_slope=0.01)
  return %h, %i
}
";
    let m = parse_module(text, "m").unwrap();
    let printed = print_module(&m);
    assert!(
        printed.contains("leaky_relu(%x, negative_slope=0.2)"),
        "{printed}"
    );
    assert!(
        printed.contains("softplus(%b, beta=2.0, threshold=10.0)"),
        "{printed}"
    );
    assert!(printed.contains("= elu(%a)"), "{printed}");
    assert!(
        printed.contains("= leaky_relu(%h)"),
        "defaults are dropped: {printed}"
    );
    assert_eq!(parse_module(&printed, "m").unwrap(), m);
    let x = Tensor::from_vec(vec![-1.5f32, 0.25, 4.0], &[3]).unwrap();
    let out = interp::run(m.entry(), &[("x", x.clone())]).unwrap();
    let mut want = x.to_dtype(DType::F64).unwrap();
    for u in [
        leaky(0.2),
        elu(1.0),
        softplus(2.0, 10.0),
        hardtanh(-2.0, 2.0),
        UnaryOp::Hardswish,
        UnaryOp::Mish,
        UnaryOp::LogSigmoid,
    ] {
        want = eager(u, &want)
            .to_dtype(DType::F32)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap();
    }
    assert_close(
        &out[0],
        &want.to_dtype(DType::F32).unwrap(),
        Tol::EXACT,
        "chain",
    );
}

#[test]
fn bad_attributes_are_errors() {
    let bad = |body: &str| {
        let text = format!("graph g(%x: f32[3]) {{\n  %y = {body}\n  return %y\n}}\n");
        parse_module(&text, "m").unwrap_err().to_string()
    };
    let e = bad("leaky_relu(%x, negative_slope=\"steep\")");
    assert!(
        e.contains("attribute 'negative_slope' of 'leaky_relu' must be a number"),
        "{e}"
    );
    let e = bad("elu(%x, beta=1.0)");
    assert!(e.contains("unknown attribute 'beta'"), "{e}");
    let e = bad("mish(%x, %x)");
    assert!(e.contains("mish"), "{e}");
}

#[test]
fn nn_modules_apply_their_attributes() {
    let x = t64(&[-2.0, -0.5, 0.5, 2.0]);
    let check = |m: &dyn Module, u: UnaryOp| {
        assert_bits(&m.forward(&x).unwrap(), &eager(u, &x), u.name());
    };
    check(&smelt::nn::LeakyReLU::new(), leaky(0.01));
    check(&smelt::nn::LeakyReLU::with(0.3), leaky(0.3));
    check(&smelt::nn::ELU::new(), elu(1.0));
    check(&smelt::nn::Softplus::with(2.0, 20.0), softplus(2.0, 20.0));
    check(&smelt::nn::Hardtanh::with(-0.5, 2.0), hardtanh(-0.5, 2.0));
    check(&smelt::nn::ELU::with(0.5), elu(0.5));
    check(&smelt::nn::Hardtanh::new(), hardtanh(-1.0, 1.0));
    check(&smelt::nn::Hardswish::new(), UnaryOp::Hardswish);
    check(&smelt::nn::Mish::new(), UnaryOp::Mish);
    check(&smelt::nn::LogSigmoid::new(), UnaryOp::LogSigmoid);
}
