//! nn: modules, initialisers (statistics on large tensors), losses against f64 references,
//! dropout, and state dicts through safetensors files.

mod common;

use common::temp_dir;
use smelt::nn::functional::{
    self as F, ClassLossOptions, Reduction, binary_cross_entropy_with_logits, cross_entropy,
    cross_entropy_with, mse_loss, nll_loss_with,
};
use smelt::nn::init::{self, FanMode, Nonlinearity};
use smelt::nn::{
    BCEWithLogitsLoss, CrossEntropyLoss, Dropout, Embedding, GELU, LayerNorm, Linear, MSELoss,
    Module, NLLLoss, ReLU, Sequential, SiLU, Sigmoid, Tanh, state_dict,
};
use smelt::{DType, Generator, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn idx(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "got {got:?}, want {want:?}");
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

// ---- modules ---------------------------------------------------------------------------

#[test]
fn linear_default_init_and_forward() {
    let l = Linear::new(7, 3, true).unwrap();
    assert_eq!(l.weight.shape(), &[3, 7]);
    assert!(l.weight.requires_grad());
    let bound = 1.0 / 7f64.sqrt();
    for v in l
        .weight
        .to_f64_vec()
        .into_iter()
        .chain(l.bias.as_ref().unwrap().to_f64_vec())
    {
        assert!(v.abs() <= bound, "{v} outside ±{bound}");
    }
    let x = Tensor::randn(&[5, 7], None).unwrap();
    let y = l.forward(&x).unwrap();
    assert_eq!(y.shape(), &[5, 3]);
    let (xv, wv, bv) = (
        x.to_f64_vec(),
        l.weight.to_f64_vec(),
        l.bias.as_ref().unwrap().to_f64_vec(),
    );
    let mut want = vec![0.0; 15];
    for i in 0..5 {
        for o in 0..3 {
            want[i * 3 + o] = bv[o] + (0..7).map(|k| xv[i * 7 + k] * wv[o * 7 + k]).sum::<f64>();
        }
    }
    close(&y.to_f64_vec(), &want, 1e-5);
    assert_eq!(l.num_parameters(), 24);
}

#[test]
fn linear_weight_statistics_match_pytorch_default() {
    // kaiming_uniform(a=√5) on fan_in 400 is U(-1/20, 1/20): std 1/(20√3).
    smelt::manual_seed(1);
    let l = Linear::new(400, 300, false).unwrap();
    assert!(l.bias.is_none());
    let v = l.weight.to_f64_vec();
    let (m, s) = mean_std(&v);
    assert!(v.iter().all(|x| x.abs() <= 0.05));
    assert!(m.abs() < 1e-3, "mean {m}");
    assert!((s - 0.05 / 3f64.sqrt()).abs() < 0.02 * s, "std {s}");
}

#[test]
fn sequential_names_modes_and_zero_grad() {
    let mut model = Sequential::new()
        .add(Linear::new(4, 8, true).unwrap())
        .add(ReLU::new())
        .add(Dropout::new(0.5).unwrap())
        .add(Linear::new(8, 2, false).unwrap());
    let names: Vec<String> = model.named_parameters().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["0.weight", "0.bias", "3.weight"]);
    assert_eq!(model.len(), 4);
    assert!(model.is_training());
    model.eval();
    assert!(!model.is_training());
    assert!(!model.get(2).unwrap().is_training());
    // In eval mode dropout is the identity, so forward is deterministic.
    let x = Tensor::randn(&[3, 4], None).unwrap();
    let a = model.forward(&x).unwrap().to_f64_vec();
    let b = model.forward(&x).unwrap().to_f64_vec();
    assert_eq!(a, b);
    model.train(true);
    assert!(model.get(2).unwrap().is_training());
    for p in model.parameters() {
        p.set_grad(Some(p.ones_like()));
    }
    model.zero_grad();
    assert!(model.parameters().iter().all(|p| p.grad().is_none()));
    // Nested sequentials prefix names recursively.
    let outer = Sequential::new().add(Sequential::new().add(Linear::new(2, 2, true).unwrap()));
    let names: Vec<String> = outer.named_parameters().into_iter().map(|p| p.0).collect();
    assert_eq!(names, ["0.0.weight", "0.0.bias"]);
}

/// An f64 reference function.
type Reference = Box<dyn Fn(f64) -> f64>;

#[test]
fn activations_match_f64() {
    let xs = [-3.0, -0.5, 0.0, 0.25, 2.0, 7.0];
    let x = t(&xs, &[6]).to_dtype(DType::F32).unwrap();
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let cases: Vec<(Box<dyn Module>, Reference)> = vec![
        (Box::new(ReLU::new()), Box::new(|v: f64| v.max(0.0))),
        (Box::new(Tanh::new()), Box::new(f64::tanh)),
        (Box::new(Sigmoid::new()), Box::new(sig)),
        (Box::new(SiLU::new()), Box::new(move |v: f64| v * sig(v))),
        (
            Box::new(GELU::tanh()),
            Box::new(|v: f64| {
                0.5 * v
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
            }),
        ),
    ];
    for (m, f) in cases {
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        close(&m.forward(&x).unwrap().to_f64_vec(), &want, 1e-6);
        assert!(m.named_parameters().is_empty());
    }
    // Exact GELU: x·Φ(x); Φ(0) = 1/2, and at 2 from the known Φ(2) = 0.977249868051821.
    let g = GELU::new().forward(&t(&[0.0, 2.0], &[2])).unwrap();
    close(&g.to_f64_vec(), &[0.0, 2.0 * 0.977249868051821], 1e-12);
}

#[test]
fn layer_norm_module_matches_f64() {
    let ln = LayerNorm::new(&[5], 1e-5, true).unwrap();
    assert_eq!(ln.weight.as_ref().unwrap().to_f64_vec(), vec![1.0; 5]);
    assert_eq!(ln.bias.as_ref().unwrap().to_f64_vec(), vec![0.0; 5]);
    let xs: Vec<f64> = (0..15).map(|i| ((i * 7) % 11) as f64 - 4.0).collect();
    let y = ln
        .forward(&t(&xs, &[3, 5]).to_dtype(DType::F32).unwrap())
        .unwrap();
    let mut want = Vec::new();
    for row in xs.chunks(5) {
        let (m, s) = mean_std(row);
        want.extend(row.iter().map(|v| (v - m) / (s * s + 1e-5).sqrt()));
    }
    close(&y.to_f64_vec(), &want, 1e-5);
    let plain = LayerNorm::new(&[5], 1e-5, false).unwrap();
    assert!(plain.named_parameters().is_empty());
}

#[test]
fn embedding_looks_up_rows() {
    let w = t(&[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2]);
    let e = Embedding::from_pretrained(w).unwrap();
    let y = e.forward(&idx(&[2, 0, 2], &[3])).unwrap();
    assert_eq!(y.to_f64_vec(), vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
    assert!(e.forward(&idx(&[3], &[1])).is_err());
    let fresh = Embedding::new(10, 4).unwrap();
    assert_eq!(fresh.weight.shape(), &[10, 4]);
    assert!(Embedding::from_pretrained(t(&[1.0], &[1])).is_err());
}

// ---- dropout ---------------------------------------------------------------------------

#[test]
fn dropout_scales_kept_elements_and_is_seeded() {
    let x = Tensor::ones(&[20000], DType::F32);
    let d = Dropout::with_generator(0.25, Generator::new(7)).unwrap();
    let y = d.forward(&x).unwrap().to_f64_vec();
    let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / y.len() as f64;
    assert!((kept - 0.75).abs() < 0.015, "kept {kept}");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    // The same seed gives the same mask; the generator advances between calls.
    let d2 = Dropout::with_generator(0.25, Generator::new(7)).unwrap();
    assert_eq!(d2.forward(&x).unwrap().to_f64_vec(), y);
    assert_ne!(d2.forward(&x).unwrap().to_f64_vec(), y);
    // Global seeding reproduces masks too.
    smelt::manual_seed(3);
    let a = F::dropout(&x, 0.5, true).unwrap().to_f64_vec();
    smelt::manual_seed(3);
    let b = F::dropout(&x, 0.5, true).unwrap().to_f64_vec();
    assert_eq!(a, b);
}

#[test]
fn dropout_edge_cases() {
    let x = t(&[1.0, -2.0, 3.0], &[3]);
    let mut d = Dropout::new(0.9).unwrap();
    d.eval();
    assert_eq!(d.forward(&x).unwrap().to_f64_vec(), x.to_f64_vec());
    assert_eq!(
        F::dropout(&x, 1.0, true).unwrap().to_f64_vec(),
        vec![0.0, 0.0, 0.0]
    );
    assert_eq!(
        F::dropout(&x, 0.0, true).unwrap().to_f64_vec(),
        x.to_f64_vec()
    );
    let e = Dropout::new(1.5).err().unwrap();
    assert_eq!(
        e.to_string(),
        "dropout probability has to be between 0 and 1, but got 1.5"
    );
    assert!(F::dropout(&idx(&[1], &[1]), 0.5, true).is_err());
    let empty = Tensor::zeros(&[0, 3], DType::F32);
    assert_eq!(F::dropout(&empty, 0.5, true).unwrap().shape(), &[0, 3]);
}

// ---- init ------------------------------------------------------------------------------

#[test]
fn fans_and_gains() {
    let w = Tensor::zeros(&[16, 8, 3, 3], DType::F32);
    assert_eq!(init::calculate_fan_in_and_fan_out(&w).unwrap(), (72, 144));
    let e = init::calculate_fan_in_and_fan_out(&Tensor::zeros(&[4], DType::F32)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
    );
    assert_eq!(init::calculate_gain(Nonlinearity::Relu), 2f64.sqrt());
    assert_eq!(init::calculate_gain(Nonlinearity::Tanh), 5.0 / 3.0);
    assert_eq!(init::calculate_gain(Nonlinearity::Sigmoid), 1.0);
    assert_eq!(
        init::calculate_gain(Nonlinearity::LeakyRelu(0.01)),
        (2.0 / 1.0001f64).sqrt()
    );
}

#[test]
fn init_statistics_on_large_tensors() {
    smelt::manual_seed(1234);
    let (fan_in, fan_out) = (500.0f64, 300.0f64);
    let w = Tensor::zeros(&[300, 500], DType::F32);

    init::kaiming_uniform_(&w, 0.0, FanMode::FanIn, Nonlinearity::Relu).unwrap();
    let bound = 2f64.sqrt() * (3.0 / fan_in).sqrt();
    let v = w.to_f64_vec();
    assert!(v.iter().all(|x| x.abs() <= bound));
    let (m, s) = mean_std(&v);
    assert!(m.abs() < 0.01 * bound);
    assert!((s - bound / 3f64.sqrt()).abs() < 0.02 * s);

    init::kaiming_normal_(&w, 0.0, FanMode::FanOut, Nonlinearity::Relu).unwrap();
    let (m, s) = mean_std(&w.to_f64_vec());
    let want = 2f64.sqrt() / fan_out.sqrt();
    assert!(m.abs() < 0.01 * want);
    assert!((s - want).abs() < 0.02 * want, "std {s}, want {want}");

    init::xavier_uniform_(&w, 1.0).unwrap();
    let a = (6.0 / (fan_in + fan_out)).sqrt();
    let v = w.to_f64_vec();
    assert!(v.iter().all(|x| x.abs() <= a));
    let (_, s) = mean_std(&v);
    assert!((s - a / 3f64.sqrt()).abs() < 0.02 * s);

    init::xavier_normal_(&w, 5.0 / 3.0).unwrap();
    let (_, s) = mean_std(&w.to_f64_vec());
    let want = 5.0 / 3.0 * (2.0 / (fan_in + fan_out)).sqrt();
    assert!((s - want).abs() < 0.02 * want);

    // Leaky ReLU takes its slope from `a`.
    init::kaiming_normal_(&w, 0.2, FanMode::FanIn, Nonlinearity::LeakyRelu(0.0)).unwrap();
    let (_, s) = mean_std(&w.to_f64_vec());
    let want = (2.0 / 1.04f64).sqrt() / fan_in.sqrt();
    assert!((s - want).abs() < 0.02 * want);

    init::zeros_(&w).unwrap();
    assert!(w.to_f64_vec().iter().all(|&x| x == 0.0));
    init::ones_(&w).unwrap();
    assert!(w.to_f64_vec().iter().all(|&x| x == 1.0));
    init::constant_(&w, 0.5).unwrap();
    assert!(w.to_f64_vec().iter().all(|&x| x == 0.5));
}

#[test]
fn init_works_in_place_on_views_and_other_dtypes() {
    smelt::manual_seed(5);
    let w = Tensor::zeros(&[64, 32], DType::F64);
    let view = w.t().unwrap();
    init::xavier_uniform_(&view, 1.0).unwrap();
    assert!(w.to_f64_vec().iter().any(|&x| x != 0.0));
    let h = Tensor::zeros(&[64, 32], DType::BF16);
    init::uniform_(&h, -1.0, 1.0).unwrap();
    assert!(h.to_f64_vec().iter().all(|x| x.abs() <= 1.0));
    assert!(init::uniform_(&Tensor::zeros(&[2], DType::I64), 0.0, 1.0).is_err());
    assert!(init::normal_(&h, 0.0, -1.0).is_err());
    // Empty tensors are a no-op, as in PyTorch.
    let e = Tensor::zeros(&[0, 3], DType::F32);
    init::kaiming_uniform_(&e, 0.0, FanMode::FanIn, Nonlinearity::Relu).unwrap();
}

// ---- losses ----------------------------------------------------------------------------

fn reduce_ref(v: &[f64], r: Reduction) -> Vec<f64> {
    match r {
        Reduction::None => v.to_vec(),
        Reduction::Sum => vec![v.iter().sum()],
        Reduction::Mean => vec![v.iter().sum::<f64>() / v.len() as f64],
    }
}

const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Mean, Reduction::Sum];

#[test]
fn mse_loss_reductions_and_dtypes() {
    let a: Vec<f64> = (0..7).map(|i| i as f64 * 0.7 - 2.0).collect();
    let b: Vec<f64> = (0..7).map(|i| (i as f64).sin()).collect();
    let sq: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).collect();
    for r in REDUCTIONS {
        for (dtype, tol) in [(DType::F64, 1e-14), (DType::F32, 1e-6), (DType::BF16, 2e-2)] {
            let x = t(&a, &[7]).to_dtype(dtype).unwrap();
            let y = t(&b, &[7]).to_dtype(dtype).unwrap();
            let got = mse_loss(&x, &y, r).unwrap();
            assert_eq!(got.dtype(), dtype);
            let xr: Vec<f64> = x.to_f64_vec();
            let yr: Vec<f64> = y.to_f64_vec();
            let sq: Vec<f64> = xr.iter().zip(&yr).map(|(x, y)| (x - y) * (x - y)).collect();
            close(&got.to_f64_vec(), &reduce_ref(&sq, r), tol);
        }
    }
    // Non-contiguous operands.
    let x = t(&a[..6], &[2, 3]).t().unwrap();
    let y = t(&b[..6], &[3, 2]);
    let xv = x.to_f64_vec();
    let want: f64 = xv.iter().zip(&b[..6]).map(|(p, q)| (p - q) * (p - q)).sum();
    close(
        &MSELoss::new(Reduction::Sum)
            .forward(&x, &y)
            .unwrap()
            .to_f64_vec(),
        &[want],
        1e-12,
    );
    let _ = sq;
    let e = mse_loss(&t(&a, &[7]), &t(&b[..6], &[6]), Reduction::Mean).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Using a target size (torch.Size([6])) that is different to the input size (torch.Size([7]))"),
        "{e}"
    );
    assert!(mse_loss(&idx(&[1], &[1]), &idx(&[1], &[1]), Reduction::Mean).is_err());
    // Empty: the mean is NaN, the sum 0 (as PyTorch).
    let z = Tensor::zeros(&[0], DType::F32);
    assert!(
        mse_loss(&z, &z, Reduction::Mean)
            .unwrap()
            .item_f64()
            .unwrap()
            .is_nan()
    );
    assert_eq!(
        mse_loss(&z, &z, Reduction::Sum)
            .unwrap()
            .item_f64()
            .unwrap(),
        0.0
    );
}

/// f64 cross-entropy of `[n, c]` logits with weights, ignore_index and label smoothing.
fn ce_ref(
    logits: &[f64],
    c: usize,
    target: &[i64],
    weight: Option<&[f64]>,
    ignore: i64,
    eps: f64,
    r: Reduction,
) -> Vec<f64> {
    let mut losses = Vec::new();
    let mut denom = 0.0;
    for (i, &ti) in target.iter().enumerate() {
        let row = &logits[i * c..(i + 1) * c];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
        let logp: Vec<f64> = row.iter().map(|v| v - lse).collect();
        if ti == ignore {
            losses.push(0.0);
            continue;
        }
        let w = |k: usize| weight.map_or(1.0, |w| w[k]);
        let wt = w(ti as usize);
        denom += wt;
        let nll = -wt * logp[ti as usize];
        let smooth = -(0..c).map(|k| w(k) * logp[k]).sum::<f64>() / c as f64;
        losses.push((1.0 - eps) * nll + eps * smooth);
    }
    match r {
        Reduction::None => losses,
        Reduction::Sum => vec![losses.iter().sum()],
        Reduction::Mean => vec![losses.iter().sum::<f64>() / denom],
    }
}

#[test]
fn cross_entropy_matches_f64() {
    let (n, c) = (7, 5);
    let logits: Vec<f64> = (0..n * c)
        .map(|i| ((i * 37) % 17) as f64 * 0.4 - 3.0)
        .collect();
    let target: Vec<i64> = (0..n as i64).map(|i| (i * 3) % c as i64).collect();
    let weight = [0.5, 1.0, 2.0, 1.5, 0.25];
    let mut ignored = target.clone();
    ignored[2] = -100;
    ignored[5] = -100;
    for r in REDUCTIONS {
        for eps in [0.0, 0.1] {
            for w in [None, Some(&weight[..])] {
                for tg in [&target, &ignored] {
                    let opts = ClassLossOptions {
                        weight: w.map(|w| t(w, &[c])),
                        reduction: r,
                        label_smoothing: eps,
                        ..Default::default()
                    };
                    let want = ce_ref(&logits, c, tg, w, -100, eps, r);
                    let got =
                        cross_entropy_with(&t(&logits, &[n, c]), &idx(tg, &[n]), &opts).unwrap();
                    close(&got.to_f64_vec(), &want, 1e-12);
                    let opts32 = ClassLossOptions {
                        weight: w.map(|w| t(w, &[c]).to_dtype(DType::F32).unwrap()),
                        ..opts
                    };
                    let got32 = CrossEntropyLoss::new(opts32)
                        .forward(
                            &t(&logits, &[n, c]).to_dtype(DType::F32).unwrap(),
                            &idx(tg, &[n]),
                        )
                        .unwrap();
                    assert_eq!(got32.dtype(), DType::F32);
                    close(&got32.to_f64_vec(), &want, 1e-5);
                }
            }
        }
    }
}

#[test]
fn cross_entropy_shapes() {
    // [C] logits with a 0-d target.
    let l = [1.0, 2.0, 0.5];
    let got = cross_entropy(&t(&l, &[3]), &Tensor::scalar(1i64)).unwrap();
    assert_eq!(got.dim(), 0);
    close(
        &got.to_f64_vec(),
        &ce_ref(&l, 3, &[1], None, -100, 0.0, Reduction::Mean),
        1e-12,
    );
    // [N, C, d] logits: class dim 1.
    let (n, c, d) = (2, 3, 4);
    let logits: Vec<f64> = (0..n * c * d).map(|i| ((i * 5) % 7) as f64 * 0.3).collect();
    let target: Vec<i64> = (0..(n * d) as i64).map(|i| i % c as i64).collect();
    let x = t(&logits, &[n, c, d]);
    let got = cross_entropy_with(
        &x,
        &idx(&target, &[n, d]),
        &ClassLossOptions::reduction(Reduction::None),
    )
    .unwrap();
    assert_eq!(got.shape(), &[n, d]);
    // Reference: move the class dim last.
    let mut flat = Vec::new();
    for i in 0..n {
        for k in 0..d {
            for j in 0..c {
                flat.push(logits[i * c * d + j * d + k]);
            }
        }
    }
    close(
        &got.to_f64_vec(),
        &ce_ref(&flat, c, &target, None, -100, 0.0, Reduction::None),
        1e-12,
    );
    // Non-contiguous logits.
    let xt = t(&logits[..n * c], &[c, n]).t().unwrap();
    let tg = idx(&[0, 2], &[2]);
    let got = cross_entropy(&xt, &tg).unwrap();
    let rows = xt.to_f64_vec();
    close(
        &got.to_f64_vec(),
        &ce_ref(&rows, c, &[0, 2], None, -100, 0.0, Reduction::Mean),
        1e-12,
    );
    // Every target ignored: the mean is NaN, as in PyTorch.
    let all = cross_entropy(&t(&logits[..6], &[2, 3]), &idx(&[-100, -100], &[2])).unwrap();
    assert!(all.item_f64().unwrap().is_nan());
}

#[test]
fn cross_entropy_is_stable_for_huge_logits() {
    let x = t(&[1000.0, 0.0, -1000.0], &[1, 3])
        .to_dtype(DType::F32)
        .unwrap();
    let l = cross_entropy(&x, &idx(&[1], &[1])).unwrap();
    close(&l.to_f64_vec(), &[1000.0], 1e-6);
}

#[test]
fn class_loss_errors() {
    let x = t(&[0.0; 6], &[2, 3]);
    let opts = ClassLossOptions::default();
    let e = cross_entropy_with(&x, &idx(&[0, 3], &[2]), &opts).unwrap_err();
    assert_eq!(e.to_string(), "Target 3 is out of bounds.");
    let e = cross_entropy_with(&x, &idx(&[-1, 0], &[2]), &opts).unwrap_err();
    assert_eq!(e.to_string(), "Target -1 is out of bounds.");
    let e = cross_entropy_with(&x, &idx(&[0, 1, 2], &[3]), &opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Expected input batch_size (2) to match target batch_size (3)."
    );
    let e =
        cross_entropy_with(&x, &Tensor::from_slice(&[0i32, 1], &[2]).unwrap(), &opts).unwrap_err();
    assert_eq!(e.to_string(), "expected scalar type Long but found Int");
    let e = cross_entropy_with(&x, &t(&[0.0, 1.0], &[2]), &opts).unwrap_err();
    assert_eq!(e.to_string(), "expected scalar type Long but found Double");
    assert!(cross_entropy_with(&idx(&[0; 6], &[2, 3]), &idx(&[0, 1], &[2]), &opts).is_err());
    assert!(cross_entropy_with(&Tensor::scalar(1.0), &idx(&[0], &[1]), &opts).is_err());
    let bad_w = ClassLossOptions {
        weight: Some(t(&[1.0, 1.0], &[2])),
        ..Default::default()
    };
    assert!(cross_entropy_with(&x, &idx(&[0, 1], &[2]), &bad_w).is_err());
    let bad_s = ClassLossOptions {
        label_smoothing: 1.5,
        ..Default::default()
    };
    assert!(cross_entropy_with(&x, &idx(&[0, 1], &[2]), &bad_s).is_err());
    let e = nll_loss_with(&x, &idx(&[0, 1], &[2, 1]), &opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0D or 1D target tensor expected, multi-target not supported"
    );
}

#[test]
fn nll_loss_picks_log_probabilities() {
    let lp = [-0.1, -2.0, -3.0, -1.5, -0.4, -2.5];
    let x = t(&lp, &[2, 3]);
    let target = idx(&[0, 2], &[2]);
    for r in REDUCTIONS {
        let got = nll_loss_with(&x, &target, &ClassLossOptions::reduction(r)).unwrap();
        close(&got.to_f64_vec(), &reduce_ref(&[0.1, 2.5], r), 1e-15);
    }
    // Weighted mean divides by the picked weights; ignored rows drop out of both sums.
    let opts = ClassLossOptions {
        weight: Some(t(&[2.0, 1.0, 3.0], &[3])),
        ignore_index: 1,
        ..Default::default()
    };
    let got = NLLLoss::new(opts)
        .forward(
            &t(
                &[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0],
                &[3, 3],
            ),
            &idx(&[0, 1, 2], &[3]),
        )
        .unwrap();
    close(&got.to_f64_vec(), &[(2.0 * 1.0 + 3.0 * 9.0) / 5.0], 1e-15);
}

fn bce_ref(x: f64, y: f64, pw: f64) -> f64 {
    // -[pw·y·log σ(x) + (1-y)·log(1-σ(x))], with log σ(x) = -softplus(-x).
    let softplus = |v: f64| {
        if v > 0.0 {
            v + (-v).exp().ln_1p()
        } else {
            v.exp().ln_1p()
        }
    };
    pw * y * softplus(-x) + (1.0 - y) * softplus(x)
}

#[test]
fn bce_with_logits_is_stable_and_matches_f64() {
    let xs = [-800.0, -30.0, -2.0, -0.1, 0.0, 0.3, 5.0, 40.0, 900.0];
    let ys = [0.0, 1.0, 0.25, 1.0, 0.5, 0.0, 1.0, 0.0, 1.0];
    let n = xs.len();
    let plain: Vec<f64> = xs
        .iter()
        .zip(&ys)
        .map(|(&x, &y)| bce_ref(x, y, 1.0))
        .collect();
    for r in REDUCTIONS {
        for (dtype, tol) in [(DType::F64, 1e-13), (DType::F32, 1e-6)] {
            let x = t(&xs, &[n]).to_dtype(dtype).unwrap();
            let y = t(&ys, &[n]).to_dtype(dtype).unwrap();
            let got = binary_cross_entropy_with_logits(&x, &y, None, None, r).unwrap();
            let v = got.to_f64_vec();
            assert!(v.iter().all(|v| v.is_finite()));
            close(&v, &reduce_ref(&plain, r), tol);
        }
    }
    // pos_weight per class (broadcast over rows) and an element weight.
    let x = t(&xs[..6], &[2, 3]);
    let y = t(&ys[..6], &[2, 3]);
    let pw = [2.0, 0.5, 3.0];
    let w = [1.0, 0.0, 2.0];
    let loss = BCEWithLogitsLoss {
        weight: Some(t(&w, &[3])),
        pos_weight: Some(t(&pw, &[3])),
        reduction: Reduction::None,
    };
    let want: Vec<f64> = (0..6)
        .map(|i| w[i % 3] * bce_ref(xs[i], ys[i], pw[i % 3]))
        .collect();
    close(&loss.forward(&x, &y).unwrap().to_f64_vec(), &want, 1e-13);
    let e = binary_cross_entropy_with_logits(&x, &t(&ys[..3], &[3]), None, None, Reduction::Mean)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Target size (torch.Size([3])) must be the same as input size (torch.Size([2, 3]))"
    );
    assert!(
        binary_cross_entropy_with_logits(
            &idx(&[1], &[1]),
            &t(&[1.0], &[1]),
            None,
            None,
            Reduction::Mean
        )
        .is_err()
    );
}

// ---- state dicts ---------------------------------------------------------------------------

fn mlp() -> Sequential {
    Sequential::new()
        .add(Linear::new(3, 4, true).unwrap())
        .add(GELU::new())
        .add(LayerNorm::new(&[4], 1e-5, true).unwrap())
        .add(Linear::new(4, 2, true).unwrap())
}

#[test]
fn state_dict_round_trips_through_a_file() {
    let a = mlp();
    let b = mlp();
    let x = Tensor::randn(&[5, 3], None).unwrap();
    assert_ne!(
        a.forward(&x).unwrap().to_f64_vec(),
        b.forward(&x).unwrap().to_f64_vec()
    );
    let dir = temp_dir("roundtrip");
    let path = dir.join("roundtrip.safetensors");
    state_dict::save(&a, &path).unwrap();
    state_dict::load(&b, &path).unwrap();
    assert_eq!(
        a.forward(&x).unwrap().to_f64_vec(),
        b.forward(&x).unwrap().to_f64_vec()
    );
    // Loading copies into the existing parameters: they keep their identity.
    let before = b.parameters()[0].data_ptr();
    state_dict::load(&b, &path).unwrap();
    assert_eq!(b.parameters()[0].data_ptr(), before);
}

#[test]
fn safetensors_keeps_every_dtype_and_shape() {
    let tensors = vec![
        (
            "b".to_string(),
            Tensor::from_slice(&[true, false, true], &[3]).unwrap(),
        ),
        (
            "u8".to_string(),
            Tensor::from_slice(&[1u8, 255], &[2, 1]).unwrap(),
        ),
        (
            "i8".to_string(),
            Tensor::from_slice(&[-1i8, 7], &[2]).unwrap(),
        ),
        (
            "i16".to_string(),
            Tensor::from_slice(&[-300i16], &[1]).unwrap(),
        ),
        (
            "i32".to_string(),
            Tensor::from_slice(&[1i32 << 30], &[1, 1]).unwrap(),
        ),
        (
            "i64".to_string(),
            Tensor::from_slice(&[i64::MIN, 5], &[2]).unwrap(),
        ),
        (
            "f16".to_string(),
            t(&[0.5, -2.0], &[2]).to_dtype(DType::F16).unwrap(),
        ),
        (
            "bf16".to_string(),
            t(&[3.0], &[]).to_dtype(DType::BF16).unwrap(),
        ),
        (
            "f32".to_string(),
            t(&[1.5, 2.5, 3.5, 4.5, 5.5, 6.5], &[2, 3])
                .to_dtype(DType::F32)
                .unwrap()
                .t()
                .unwrap(),
        ),
        ("f64".to_string(), t(&[std::f64::consts::PI], &[1])),
        ("empty".to_string(), Tensor::zeros(&[0, 4], DType::F32)),
    ];
    let bytes = state_dict::to_safetensors_bytes(&tensors).unwrap();
    let back = state_dict::from_safetensors_bytes(&bytes).unwrap();
    assert_eq!(back.len(), tensors.len());
    for (name, orig) in &tensors {
        let (_, got) = back.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(got.dtype(), orig.dtype(), "{name}");
        assert_eq!(got.shape(), orig.shape(), "{name}");
        assert_eq!(got.to_f64_vec(), orig.to_f64_vec(), "{name}");
    }
    let dup = vec![
        ("x".to_string(), t(&[1.0], &[1])),
        ("x".to_string(), t(&[1.0], &[1])),
    ];
    assert!(state_dict::to_safetensors_bytes(&dup).is_err());
}

#[test]
fn load_state_dict_reports_mismatches() {
    let m = Linear::new(3, 2, true).unwrap();
    let w = m.weight.to_f64_vec();
    let e = state_dict::load_state_dict(
        &m,
        &[("weight".into(), Tensor::zeros(&[2, 3], DType::F32))],
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("Missing key(s) in state_dict: \"bias\"."), "{e}");
    let e = state_dict::load_state_dict(
        &m,
        &[
            ("weight".into(), Tensor::zeros(&[3, 3], DType::F32)),
            ("bias".into(), Tensor::zeros(&[2], DType::F64)),
            ("extra".into(), Tensor::zeros(&[1], DType::F32)),
        ],
        true,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("Unexpected key(s) in state_dict: \"extra\"."),
        "{e}"
    );
    assert!(e.contains(
        "size mismatch for weight: copying a param with shape torch.Size([3, 3]) from checkpoint, the shape in current model is torch.Size([2, 3])."
    ), "{e}");
    assert!(e.contains("dtype mismatch for bias"), "{e}");
    // A failed load changes nothing.
    assert_eq!(m.weight.to_f64_vec(), w);
    // Non-strict loads what matches and ignores the rest.
    state_dict::load_state_dict(
        &m,
        &[
            ("weight".into(), Tensor::ones(&[2, 3], DType::F32)),
            ("extra".into(), Tensor::zeros(&[1], DType::F32)),
        ],
        false,
    )
    .unwrap();
    assert_eq!(m.weight.to_f64_vec(), vec![1.0; 6]);
}

#[test]
fn malformed_files_are_errors_not_panics() {
    let sd = state_dict::state_dict(&mlp());
    let bytes = state_dict::to_safetensors_bytes(&sd).unwrap();
    // Every truncation is an error.
    for cut in [0, 1, 7, 8, 9, 20, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            state_dict::from_safetensors_bytes(&bytes[..cut]).is_err(),
            "cut {cut}"
        );
    }
    // Flipping bytes in the header either fails cleanly or decodes something; never panics.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for i in (0..8 + header_len).step_by(3) {
        let mut b = bytes.clone();
        b[i] ^= 0x5a;
        let _ = state_dict::from_safetensors_bytes(&b);
    }
    // A huge announced header length.
    let mut b = bytes.clone();
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(state_dict::from_safetensors_bytes(&b).is_err());
    // Bool bytes other than 0/1 are refused.
    let bools = state_dict::to_safetensors_bytes(&[(
        "m".into(),
        Tensor::from_slice(&[true], &[1]).unwrap(),
    )])
    .unwrap();
    let mut b = bools.clone();
    *b.last_mut().unwrap() = 7;
    assert!(state_dict::from_safetensors_bytes(&b).is_err());
    // Files: a missing one and a corrupted one.
    let dir = temp_dir("corrupt");
    assert!(state_dict::load_safetensors(dir.join("does-not-exist")).is_err());
    let path = dir.join("corrupt.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let e = state_dict::load(&mlp(), &path).unwrap_err().to_string();
    assert!(e.contains("corrupt.safetensors"), "{e}");
    std::fs::remove_file(&path).unwrap();
}

/// `trace_module` keeps the weights as graph inputs, as `torch.jit.trace(model, x)` keeps them
/// parameters: no weight data in the graph, and updates of the weights show in later calls,
/// traced and compiled.
#[test]
fn traced_modules_take_their_parameters_as_inputs() {
    use smelt::exec::CompileOptions;
    use smelt::nn::{Linear, ReLU, Sequential, trace_module};
    smelt::manual_seed(5);
    let model = Sequential::new()
        .add(Linear::new(3, 8, true).unwrap())
        .add(ReLU::new())
        .add(Linear::new(8, 2, true).unwrap());
    let x = Tensor::randn(&[4, 3], None).unwrap();
    let traced = trace_module(&model, &x).unwrap();
    let g = traced.graph();
    let names: Vec<&str> = g
        .inputs()
        .iter()
        .map(|&v| g.node(v).name.as_str())
        .collect();
    assert_eq!(names, ["x", "0.weight", "0.bias", "2.weight", "2.bias"]);
    let text = smelt::ir::print_graph(g);
    assert!(!text.contains("constant("), "{text}");
    let compiled = traced.compile(&CompileOptions::default()).unwrap();
    let check = |what: &str| {
        let want = model.forward(&x).unwrap().to_f64_vec();
        let got = traced.call(std::slice::from_ref(&x)).unwrap();
        assert_eq!(got[0].to_f64_vec(), want, "{what}: traced");
        let got = compiled.call(std::slice::from_ref(&x)).unwrap();
        let diff = got[0]
            .to_f64_vec()
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-5, "{what}: compiled differs by {diff}");
    };
    check("before");
    // an optimiser's in-place update of a weight
    smelt::autograd::no_grad_scope(|| model.parameters()[0].mul_scalar_(-0.5).map(|_| ())).unwrap();
    check("after an in-place update");
}
