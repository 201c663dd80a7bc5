//! Finite differences (f64) against the analytic gradients of every differentiable op, on
//! small random shapes, with broadcasting, views and non-contiguous operands.

use proptest::prelude::*;
use smelt::autograd::gradcheck;
use smelt::{DType, Result, Scalar, Tensor};

/// Deterministic values in `[lo, hi)`.
fn vals(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn t(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(vals(n, seed, -1.0, 1.0), shape).unwrap()
}

fn pos(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(vals(n, seed, 0.5, 2.0), shape).unwrap()
}

fn idx(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn check1(x: Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) {
    gradcheck(|a| f(&a[0]), &[x]).unwrap();
}

fn check2(a: Tensor, b: Tensor, f: impl Fn(&Tensor, &Tensor) -> Result<Tensor>) {
    gradcheck(|x| f(&x[0], &x[1]), &[a, b]).unwrap();
}

fn wide_atan() -> Tensor {
    Tensor::from_vec(vals(6, 13, -5.0, 5.0), &[2, 3]).unwrap()
}

#[test]
fn unary_ops() {
    let x = || t(&[2, 3], 1);
    let p = || pos(&[2, 3], 2);
    check1(x(), |a| a.neg());
    check1(x(), |a| a.abs());
    check1(x(), |a| a.exp());
    check1(p(), |a| a.log());
    check1(p(), |a| a.log1p());
    check1(x(), |a| a.expm1());
    check1(p(), |a| a.sqrt());
    check1(p(), |a| a.rsqrt());
    check1(x(), |a| a.sin());
    check1(x(), |a| a.cos());
    // inside (-1, 1), away from the poles of the derivatives
    let inner = || Tensor::from_vec(vals(6, 12, -0.9, 0.9), &[2, 3]).unwrap();
    check1(inner(), |a| a.asin());
    check1(inner(), |a| a.acos());
    check1(wide_atan(), |a| a.atan());
    check1(x(), |a| a.tanh());
    check1(x(), |a| a.sigmoid());
    check1(x(), |a| a.relu());
    check1(x(), |a| a.gelu());
    check1(x(), |a| a.gelu_tanh());
    check1(x(), |a| a.gelu_slope());
    check1(x(), |a| a.gelu_tanh_slope());
    // the slopes' tails, where the second derivatives change sign
    let wide = || Tensor::from_vec(vals(6, 11, -4.0, 4.0), &[2, 3]).unwrap();
    check1(wide(), |a| a.gelu_slope());
    check1(wide(), |a| a.gelu_tanh_slope());
    check1(x(), |a| a.silu());
    check1(x(), |a| a.erf());
    check1(p(), |a| a.reciprocal());
    check1(x(), |a| a.square());
    check1(x(), |a| a.floor());
}

#[test]
fn binary_ops_broadcast() {
    let a = || t(&[2, 3], 3);
    let b = || t(&[3], 4);
    check2(a(), b(), |x, y| x.add(y));
    check2(a(), b(), |x, y| x.sub(y));
    check2(a(), t(&[2, 1], 5), |x, y| x.mul(y));
    check2(a(), pos(&[1, 3], 6), |x, y| x.div(y));
    check2(pos(&[2, 3], 7), t(&[3], 8), |x, y| x.pow(y));
    check1(pos(&[4], 9), |x| x.pow_scalar(3));
    check1(pos(&[4], 9), |x| x.pow_scalar(-1.5));
    check2(a(), b(), |x, y| x.maximum(y));
    check2(a(), b(), |x, y| x.minimum(y));
    check2(
        pos(&[5], 10),
        Tensor::from_vec(vec![0.7f64; 5], &[5]).unwrap(),
        |x, y| x.remainder(y),
    );
    check1(a(), |x| x.mul_scalar(2.5)?.add_scalar(1)?.rsub_scalar(3));
}

#[test]
fn select_and_mask_ops() {
    let c = Tensor::from_slice(&[true, false, true], &[3]).unwrap();
    check2(t(&[2, 3], 1), t(&[2, 1], 2), |x, y| {
        Tensor::where_cond(&c, x, y)
    });
    check1(t(&[2, 3], 3), |x| {
        x.clamp(Some(Scalar::Float(-0.5)), Some(Scalar::Float(0.4)))
    });
    check1(t(&[2, 3], 4), |x| x.masked_fill(&c, 2.0));
}

#[test]
fn reductions() {
    let x = || t(&[3, 4], 11);
    check1(x(), |a| a.sum());
    check1(x(), |a| a.sum_dim(&[1], false));
    check1(x(), |a| a.mean_dim(&[0], true));
    check1(x(), |a| a.mean());
    check1(x(), |a| a.prod_dim(1, false));
    check1(t(&[5], 12), |a| a.prod_dim(0, true));
    check1(x(), |a| a.amax_dim(&[1], false));
    check1(x(), |a| a.amin_dim(&[0], true));
    check1(x(), |a| a.logsumexp(&[1], false));
    check1(x(), |a| a.var(Some(&[1]), 1.0, false));
    check1(x(), |a| a.std(None, 0.0, false));
    check1(x(), |a| a.cumsum(1));
    check1(x(), |a| a.softmax(1));
    check1(x(), |a| a.log_softmax(0));
}

#[test]
fn prod_with_zeros() {
    // One zero: only that element sees the product of the rest; two zeros: none does.
    let one = Tensor::from_slice(&[2.0f64, 0.0, 3.0], &[3]).unwrap();
    check1(one, |a| a.prod_dim(0, false));
    let two = Tensor::from_slice(&[0.0f64, 0.0, 3.0, 1.5], &[2, 2]).unwrap();
    check1(two, |a| a.prod_dim(1, false));
}

#[test]
fn normalisation() {
    let x = t(&[2, 3, 4], 13);
    let w = t(&[4], 14);
    let b = t(&[4], 15);
    gradcheck(
        |a| a[0].layer_norm(&[4], Some(&a[1]), Some(&a[2]), 1e-5),
        &[x.clone(), w, b],
    )
    .unwrap();
    check1(x, |a| a.layer_norm(&[3, 4], None, None, 1e-5));
}

#[test]
fn linear_algebra() {
    check2(t(&[2, 3], 1), t(&[3, 4], 2), |a, b| a.matmul(b));
    check2(t(&[3], 1), t(&[3], 2), |a, b| a.matmul(b));
    check2(t(&[3], 1), t(&[2, 3, 2], 2), |a, b| a.matmul(b));
    check2(t(&[2, 2, 3], 1), t(&[3], 2), |a, b| a.matmul(b));
    check2(t(&[2, 2, 3], 1), t(&[3, 2], 2), |a, b| a.matmul(b));
    check2(t(&[1, 2, 3], 1), t(&[2, 3, 2], 2), |a, b| a.matmul(b));
    // a weight shared by a batch of two dims: its gradient is one folded product
    check2(t(&[2, 3, 2, 3], 1), t(&[3, 4], 2), |a, b| a.matmul(b));
    // ... also read through transposed views on both sides
    check2(t(&[3, 2, 3], 1), t(&[4, 3], 2), |a, b| {
        a.transpose(0, 1)?.matmul(&b.t()?)
    });
    gradcheck(
        |a| a[0].linear(&a[1], Some(&a[2])),
        &[t(&[2, 3], 3), t(&[4, 3], 4), t(&[4], 5)],
    )
    .unwrap();
    check2(t(&[2, 3], 1), t(&[3, 4], 2), |a, b| {
        Tensor::einsum("ij,jk->ik", &[a, b])
    });
    check2(t(&[2, 3], 1), t(&[4, 3], 2), |a, b| {
        Tensor::einsum("ij,kj", &[a, b])
    });
    check2(t(&[2, 3], 1), t(&[5], 2), |a, b| {
        Tensor::einsum("ij,k->i", &[a, b])
    });
}

#[test]
fn views() {
    let x = || t(&[2, 3, 4], 21);
    check1(x(), |a| a.reshape(&[6, 4]));
    check1(x(), |a| a.transpose(0, 2));
    check1(x(), |a| a.permute(&[2, 0, 1]));
    check1(t(&[3, 1], 22), |a| a.expand(&[2, 3, 4]));
    check1(t(&[3, 1], 22), |a| a.squeeze_dim(1));
    check1(x(), |a| a.unsqueeze(1));
    check1(x(), |a| a.flatten(1, 2));
    check1(x(), |a| a.narrow(2, 1, 2));
    check1(x(), |a| a.select(1, -1));
    check1(x(), |a| a.slice(2, Some(0), None, 2));
    check1(x(), |a| a.flip(&[0, 2]));
    check1(t(&[3, 4], 23), |a| a.diagonal(1, 0, 1));
    check1(t(&[4, 3], 23), |a| a.diagonal(-1, 1, 0));
    check1(x(), |a| a.diagonal(0, 0, 2));
    check1(t(&[2, 3], 24), |a| a.repeat(&[2, 1, 2]));
    check1(t(&[3, 3], 25), |a| a.tril(0));
    check1(t(&[3, 3], 25), |a| a.triu(1));
    // A non-contiguous input: the function sees a transposed, step-sliced view.
    check1(t(&[4, 5], 26), |a| a.t()?.slice(0, Some(1), None, 2)?.exp());
}

#[test]
fn joins_and_indexing() {
    check2(t(&[2, 3], 1), t(&[2, 2], 2), |a, b| Tensor::cat(&[a, b], 1));
    check2(t(&[2, 3], 1), t(&[2, 3], 2), |a, b| {
        Tensor::stack(&[a, b], 1)
    });
    let i = idx(&[2, 0, 2], &[3]);
    check1(t(&[3, 4], 3), |a| a.index_select(0, &i));
    let gi = idx(&[0, 2, 1, 1, 0, 0], &[2, 3]);
    check1(t(&[2, 3], 4), |a| a.gather(1, &gi));
    // scatter with repeated indices keeps one write of several: unique indices only.
    let si = idx(&[0, 2, 1, 0], &[2, 2]);
    check2(t(&[2, 3], 5), t(&[2, 3], 6), |a, s| a.scatter(1, &si, s));
    let sa = idx(&[0, 2, 1, 1], &[2, 2]);
    check2(t(&[2, 3], 5), t(&[2, 3], 6), |a, s| {
        a.scatter_add(1, &sa, s)
    });
    check2(t(&[4, 2], 7), t(&[3, 2], 8), |a, s| a.index_add(0, &i, s));
    let e = idx(&[1, 0, 1, 2], &[2, 2]);
    check1(t(&[3, 2], 9), |w| Tensor::embedding(&e, w));
}

#[test]
fn casts_and_zero_size() {
    // f64 → f32 → f64 rounds, so this uses a loose step.
    let opts = smelt::autograd::GradcheckOptions {
        eps: 1e-3,
        atol: 1e-3,
        rtol: 1e-2,
    };
    smelt::autograd::gradcheck_with(
        |a| a[0].to_dtype(DType::F32)?.exp()?.to_dtype(DType::F64),
        &[t(&[3], 1)],
        opts,
    )
    .unwrap();
    check1(t(&[0, 3], 2), |a| a.sum_dim(&[0], false));
    check1(Tensor::scalar(0.7f64).to_dtype(DType::F64).unwrap(), |a| {
        a.tanh()?.mul_scalar(3)
    });
}

#[test]
fn gradcheck_catches_a_wrong_gradient() {
    // A custom function whose backward is off by a factor of 2 must be reported.
    use smelt::autograd::{Context, Function, apply_function};
    struct Wrong;
    impl Function for Wrong {
        fn forward(&self, _ctx: &mut Context, x: &[Tensor]) -> Result<Tensor> {
            x[0].mul_scalar(3)
        }
        fn backward(&self, _ctx: &Context, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(g.mul_scalar(6)?)])
        }
    }
    let e = gradcheck(|a| apply_function(Wrong, &[&a[0]]), &[t(&[2], 1)]).unwrap_err();
    assert!(e.to_string().contains("Jacobian mismatch"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn broadcast_mul_add_random_shapes(
        r in 1usize..4, c in 1usize..5, br in proptest::bool::ANY, seed in 0u64..1000
    ) {
        let a = t(&[r, c], seed);
        let b = if br { t(&[1, c], seed + 1) } else { t(&[r, 1], seed + 1) };
        gradcheck(|x| x[0].mul(&x[1])?.add(&x[1])?.tanh(), &[a, b]).unwrap();
    }

    #[test]
    fn softmax_matmul_random_shapes(
        m in 1usize..4, k in 1usize..4, n in 1usize..4, seed in 0u64..1000
    ) {
        gradcheck(
            |x| x[0].matmul(&x[1])?.softmax(-1),
            &[t(&[m, k], seed), t(&[k, n], seed + 7)],
        ).unwrap();
    }
}

#[test]
fn a_mismatch_on_single_precision_says_why() {
    // f32 inputs with the default step: the numerical gradient is noise, and the error says
    // that the input is not double precision (PyTorch's warning)
    let x = Tensor::from_vec(vec![0.3f32, 1.7, -0.4], &[3]).unwrap();
    let e = smelt::autograd::gradcheck(|a| a[0].exp()?.mul_scalar(1e3), &[x])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("Jacobian mismatch"), "{e}");
    assert!(
        e.contains("Input #0 requires gradient and is not a double precision floating point (f32)"),
        "{e}"
    );
    // f64 inputs pass, and a genuine mismatch in f64 carries no such hint
    let x64 = Tensor::from_vec(vec![0.3f64, 1.7, -0.4], &[3]).unwrap();
    smelt::autograd::gradcheck(|a| a[0].exp()?.mul_scalar(1e3), std::slice::from_ref(&x64))
        .unwrap();
    let e = smelt::autograd::gradcheck(|a| a[0].detach().exp()?.add(&a[0]), &[x64])
        .unwrap_err()
        .to_string();
    assert!(!e.contains("double precision"), "{e}");
}
