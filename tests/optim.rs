//! Optimisers: each step against PyTorch's update formulas computed in f64 by hand-written
//! loops, with gradients set by hand.

mod common;

use common::{Tol, assert_close};
use smelt::optim::{Adam, AdamConfig, AdamW, Optimizer, SGD, SGDConfig};
use smelt::runtime::storage::allocation_count;
use smelt::{DType, Tensor};

fn param(v: &[f64], dtype: DType) -> Tensor {
    let t = Tensor::from_slice(v, &[v.len()])
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    t.requires_grad_(true).unwrap();
    t
}

fn grad(v: &[f64], dtype: DType) -> Tensor {
    Tensor::from_slice(v, &[v.len()])
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Within `tol + tol·|expected|`.
fn near(tol: f64) -> Tol {
    Tol::allclose(tol, tol)
}

/// Gradients for step `k` of a 3-element parameter: varied signs and magnitudes.
fn grads_at(k: usize) -> Vec<f64> {
    let k = k as f64;
    vec![0.5 + 0.1 * k, -1.5 + 0.3 * k, 2.0 * (0.7 * k).sin()]
}

fn sgd_reference(p0: &[f64], c: SGDConfig, steps: usize) -> Vec<Vec<f64>> {
    let mut p = p0.to_vec();
    let mut buf: Option<Vec<f64>> = None;
    let mut out = Vec::new();
    for k in 0..steps {
        let g0 = grads_at(k);
        let d: Vec<f64> = (0..p.len())
            .map(|i| g0[i] + c.weight_decay * p[i])
            .collect();
        let dir = if c.momentum != 0.0 {
            let b: Vec<f64> = match &buf {
                None => d.clone(),
                Some(b) => (0..p.len())
                    .map(|i| c.momentum * b[i] + (1.0 - c.dampening) * d[i])
                    .collect(),
            };
            let dir = if c.nesterov {
                (0..p.len()).map(|i| d[i] + c.momentum * b[i]).collect()
            } else {
                b.clone()
            };
            buf = Some(b);
            dir
        } else {
            d
        };
        for i in 0..p.len() {
            p[i] -= c.lr * dir[i];
        }
        out.push(p.clone());
    }
    out
}

fn run_sgd(c: SGDConfig, dtype: DType, tol: f64) {
    let p0 = [1.0, -2.0, 0.25];
    let p = param(&p0, dtype);
    let mut opt = SGD::new(vec![p.clone()], c).unwrap();
    let want = sgd_reference(&p0, c, 5);
    for (k, w) in want.iter().enumerate() {
        p.set_grad(Some(grad(&grads_at(k), dtype)));
        opt.step().unwrap();
        assert_close(
            &p.to_f64_vec(),
            w,
            near(tol),
            &format!("sgd {dtype:?} step {k}"),
        );
    }
}

#[test]
fn sgd_plain_exact_value() {
    let p = param(&[1.0], DType::F64);
    let mut opt = SGD::new(vec![p.clone()], SGDConfig::new(0.1)).unwrap();
    p.set_grad(Some(grad(&[1.0], DType::F64)));
    opt.step().unwrap();
    assert_eq!(p.to_f64_vec(), vec![0.9]);
}

#[test]
fn sgd_momentum_by_hand() {
    // buf1 = g = 1, p1 = 1 - 0.1; buf2 = 0.9 * 1 + 1 = 1.9, p2 = 0.9 - 0.19.
    let p = param(&[1.0], DType::F64);
    let c = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    };
    let mut opt = SGD::new(vec![p.clone()], c).unwrap();
    p.set_grad(Some(grad(&[1.0], DType::F64)));
    opt.step().unwrap();
    assert_close(&p.to_f64_vec(), &[0.9], near(1e-15), "step 1");
    // as in PyTorch, the buffer is one tensor updated in place: a handle taken after the
    // first step sees the second
    let first = opt.momentum_buffer(0).unwrap().clone();
    opt.step().unwrap();
    assert_close(&p.to_f64_vec(), &[0.71], near(1e-15), "step 2");
    assert_close(
        &first.to_f64_vec(),
        &[1.9],
        near(1e-15),
        "the buffer taken at step 1",
    );
    let buf = opt.momentum_buffer(0).unwrap();
    assert_close(&buf.to_f64_vec(), &[1.9], near(1e-15), "momentum buffer");
    // The grad itself is untouched by the momentum buffer updates.
    assert_eq!(p.grad().unwrap().to_f64_vec(), vec![1.0]);
}

#[test]
fn sgd_variants_match_reference() {
    let configs = [
        SGDConfig::new(0.05),
        SGDConfig {
            momentum: 0.9,
            ..SGDConfig::new(0.05)
        },
        SGDConfig {
            momentum: 0.8,
            dampening: 0.3,
            ..SGDConfig::new(0.05)
        },
        SGDConfig {
            momentum: 0.9,
            nesterov: true,
            ..SGDConfig::new(0.05)
        },
        SGDConfig {
            momentum: 0.9,
            weight_decay: 0.01,
            nesterov: true,
            ..SGDConfig::new(0.05)
        },
        SGDConfig {
            weight_decay: 0.1,
            ..SGDConfig::new(0.2)
        },
    ];
    for c in configs {
        run_sgd(c, DType::F64, 1e-12);
        run_sgd(c, DType::F32, 1e-5);
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Adam,
    AdamW,
}

fn adam_reference(p0: &[f64], c: AdamConfig, kind: Kind, steps: usize) -> Vec<Vec<f64>> {
    let n = p0.len();
    let (mut p, mut m, mut v, mut vmax) = (
        p0.to_vec(),
        vec![0.0f64; n],
        vec![0.0f64; n],
        vec![0.0f64; n],
    );
    let (b1, b2) = c.betas;
    // PyTorch's defaults when none is set: Adam 0, AdamW 1e-2
    let wd = c.weight_decay.unwrap_or(match kind {
        Kind::Adam => 0.0,
        Kind::AdamW => 1e-2,
    });
    let mut out = Vec::new();
    for k in 0..steps {
        let t = (k + 1) as i32;
        let mut g = grads_at(k);
        for i in 0..n {
            match kind {
                Kind::Adam => g[i] += wd * p[i],
                Kind::AdamW => p[i] *= 1.0 - c.lr * wd,
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            vmax[i] = vmax[i].max(v[i]);
            let second = if c.amsgrad { vmax[i] } else { v[i] };
            let bc1 = 1.0 - b1.powi(t);
            let bc2 = 1.0 - b2.powi(t);
            p[i] -= c.lr / bc1 * m[i] / (second.sqrt() / bc2.sqrt() + c.eps);
        }
        out.push(p.clone());
    }
    out
}

fn run_adam(c: AdamConfig, kind: Kind, dtype: DType, tol: f64) {
    let p0 = [0.3, -1.2, 2.5];
    let p = param(&p0, dtype);
    let mut opt: Box<dyn Optimizer> = match kind {
        Kind::Adam => Box::new(Adam::new(vec![p.clone()], c).unwrap()),
        Kind::AdamW => Box::new(AdamW::new(vec![p.clone()], c).unwrap()),
    };
    let want = adam_reference(&p0, c, kind, 8);
    for (k, w) in want.iter().enumerate() {
        p.set_grad(Some(grad(&grads_at(k), dtype)));
        opt.step().unwrap();
        assert_close(
            &p.to_f64_vec(),
            w,
            near(tol),
            &format!("{kind:?} {dtype:?} step {k}"),
        );
    }
}

#[test]
fn adam_first_step_moves_by_lr() {
    // Bias correction makes the first step exactly lr·sign(g) (up to eps).
    let p = param(&[1.0, 1.0], DType::F64);
    let mut opt = Adam::new(vec![p.clone()], AdamConfig::new(0.1)).unwrap();
    p.set_grad(Some(grad(&[3.0, -0.02], DType::F64)));
    opt.step().unwrap();
    assert_close(&p.to_f64_vec(), &[0.9, 1.1], near(1e-6), "first step");
    assert_eq!(opt.step_count(0), 1);
}

#[test]
fn adam_and_adamw_match_reference() {
    let configs = [
        AdamConfig::new(0.01),
        AdamConfig {
            betas: (0.5, 0.9),
            eps: 1e-3,
            ..AdamConfig::new(0.05)
        },
        AdamConfig {
            weight_decay: Some(0.1),
            ..AdamConfig::new(0.02)
        },
        AdamConfig {
            weight_decay: Some(0.0),
            ..AdamConfig::new(0.02)
        },
        AdamConfig {
            amsgrad: true,
            weight_decay: Some(0.05),
            ..AdamConfig::new(0.02)
        },
    ];
    for c in configs {
        for kind in [Kind::Adam, Kind::AdamW] {
            run_adam(c, kind, DType::F64, 1e-12);
            run_adam(c, kind, DType::F32, 2e-5);
        }
    }
}

#[test]
fn adamw_decay_is_decoupled() {
    // With a zero gradient Adam's update is zero, so only AdamW's decay moves p.
    let p = param(&[2.0], DType::F64);
    let c = AdamConfig {
        weight_decay: Some(0.5),
        ..AdamConfig::new(0.1)
    };
    let mut opt = AdamW::new(vec![p.clone()], c).unwrap();
    p.set_grad(Some(grad(&[0.0], DType::F64)));
    opt.step().unwrap();
    assert_close(&p.to_f64_vec(), &[2.0 * (1.0 - 0.05)], near(1e-15), "decay");
}

#[test]
fn params_without_grad_are_skipped_and_zero_grad_clears() {
    let a = param(&[1.0, 2.0], DType::F32);
    let b = param(&[3.0], DType::F32);
    let mut opt = Adam::new(vec![a.clone(), b.clone()], AdamConfig::new(0.1)).unwrap();
    a.set_grad(Some(grad(&[1.0, 1.0], DType::F32)));
    opt.step().unwrap();
    assert_eq!(b.to_f64_vec(), vec![3.0]);
    assert_eq!(opt.step_count(1), 0);
    assert_ne!(a.to_f64_vec(), vec![1.0, 2.0]);
    opt.zero_grad();
    assert!(a.grad().is_none());
}

#[test]
fn works_on_non_contiguous_grads_and_2d_params() {
    let p = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    p.requires_grad_(true).unwrap();
    let g = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])
        .unwrap()
        .t()
        .unwrap();
    assert!(!g.is_contiguous());
    p.set_grad(Some(g.clone()));
    let mut opt = SGD::new(
        vec![p.clone()],
        SGDConfig {
            momentum: 0.5,
            ..SGDConfig::new(1.0)
        },
    )
    .unwrap();
    opt.step().unwrap();
    let gv = g.to_f64_vec();
    let want: Vec<f64> = (0..6).map(|i| (i + 1) as f64 - gv[i]).collect();
    assert_eq!(p.to_f64_vec(), want);
}

#[test]
fn invalid_settings_are_errors() {
    let p = param(&[1.0], DType::F32);
    let err = |r: smelt::Result<SGD>| r.err().unwrap().to_string();
    assert_eq!(
        err(SGD::new(vec![p.clone()], SGDConfig::new(-1.0))),
        "Invalid learning rate: -1"
    );
    assert_eq!(
        err(SGD::new(
            vec![p.clone()],
            SGDConfig {
                nesterov: true,
                ..SGDConfig::new(0.1)
            }
        )),
        "Nesterov momentum requires a momentum and zero dampening"
    );
    let e = Adam::new(
        vec![p.clone()],
        AdamConfig {
            betas: (0.9, 1.0),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(e.to_string(), "Invalid beta parameter at index 1: 1");
    let e = AdamW::new(
        vec![p.clone()],
        AdamConfig {
            eps: -1e-8,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().starts_with("Invalid epsilon value"));
    let i = Tensor::from_slice(&[1i64], &[1]).unwrap();
    assert!(SGD::new(vec![i], SGDConfig::new(0.1)).is_err());
    // A gradient of the wrong shape is an error, not a broadcast.
    p.set_grad(Some(grad(&[1.0, 2.0], DType::F32)));
    let mut opt = SGD::new(vec![p.clone()], SGDConfig::new(0.1)).unwrap();
    assert!(opt.step().is_err());
    assert_eq!(p.to_f64_vec(), vec![1.0]);
}

#[test]
fn set_lr_changes_the_step() {
    let p = param(&[1.0], DType::F64);
    let mut opt = SGD::new(vec![p.clone()], SGDConfig::new(0.1)).unwrap();
    opt.set_lr(0.5);
    assert_eq!(opt.lr(), 0.5);
    p.set_grad(Some(grad(&[1.0], DType::F64)));
    opt.step().unwrap();
    assert_eq!(p.to_f64_vec(), vec![0.5]);
}

#[test]
fn weight_decay_defaults_are_each_optimisers_own() {
    // torch.optim.Adam: weight_decay=0; torch.optim.AdamW: weight_decay=0.01
    let p = param(&[2.0], DType::F64);
    let adam = Adam::new(vec![p.clone()], AdamConfig::new(0.1)).unwrap();
    let mut adamw = AdamW::new(vec![p.clone()], AdamConfig::new(0.1)).unwrap();
    assert_eq!(adam.weight_decay(), 0.0);
    assert_eq!(adamw.weight_decay(), 0.01);
    // a zero gradient: only the default decay moves p, by lr · 0.01
    p.set_grad(Some(grad(&[0.0], DType::F64)));
    adamw.step().unwrap();
    assert_close(
        &p.to_f64_vec(),
        &[2.0 * (1.0 - 0.1 * 0.01)],
        near(1e-15),
        "default decay",
    );
    let set = AdamConfig {
        weight_decay: Some(0.0),
        ..AdamConfig::new(0.1)
    };
    assert_eq!(AdamW::new(vec![p], set).unwrap().weight_decay(), 0.0);
}

/// An f32 parameter of 6 values as a contiguous [3, 2] tensor and as a transposed view of a
/// [2, 3] one, which the optimisers update with tensor ops rather than in one pass.
fn both_layouts(v: &[f64]) -> (Tensor, Tensor) {
    let dense = Tensor::from_slice(v, &[3, 2])
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let stored = dense.t().unwrap().contiguous().unwrap();
    let view = stored.t().unwrap();
    assert!(!view.is_contiguous());
    for t in [&dense, &view] {
        t.requires_grad_(true).unwrap();
    }
    (dense, view)
}

#[test]
fn the_one_pass_f32_update_gives_the_bits_of_the_tensor_ops() {
    let p0 = [0.3, -1.2, 2.5, 1e-3, -4.0, 0.0];
    let configs = [
        (Kind::AdamW, AdamConfig::new(3e-3)),
        (
            Kind::Adam,
            AdamConfig {
                weight_decay: Some(0.1),
                amsgrad: true,
                ..AdamConfig::new(1e-2)
            },
        ),
        (Kind::Adam, AdamConfig::new(1e-3)),
    ];
    for (kind, c) in configs {
        let (a, b) = both_layouts(&p0);
        let make = |p: &Tensor| -> Box<dyn Optimizer> {
            match kind {
                Kind::Adam => Box::new(Adam::new(vec![p.clone()], c).unwrap()),
                Kind::AdamW => Box::new(AdamW::new(vec![p.clone()], c).unwrap()),
            }
        };
        let (mut oa, mut ob) = (make(&a), make(&b));
        for k in 0..6 {
            let g: Vec<f64> = (0..6).map(|i| ((k * 7 + i) as f64 * 0.37).sin()).collect();
            let g = Tensor::from_slice(&g, &[3, 2])
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            a.set_grad(Some(g.clone()));
            b.set_grad(Some(g));
            let before = allocation_count();
            oa.step().unwrap();
            let one_pass = allocation_count() - before;
            let before = allocation_count();
            ob.step().unwrap();
            let tensor_ops = allocation_count() - before;
            if k > 0 {
                // once the state exists, the one pass allocates nothing; the ops do
                assert_eq!(
                    one_pass, 0,
                    "{kind:?}: the contiguous parameter took one pass"
                );
                assert!(tensor_ops > 0, "{kind:?}: the view took the tensor ops");
            }
            let bits =
                |t: &Tensor| -> Vec<u64> { t.to_f64_vec().iter().map(|x| x.to_bits()).collect() };
            assert_eq!(bits(&a), bits(&b), "{kind:?} {c:?} step {k}");
        }
    }
}
