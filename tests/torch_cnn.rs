//! A small CNN against PyTorch, in float64: conv (bias, padding) → batch norm (training,
//! running statistics) → relu → max pool (ceil_mode) → grouped dilated conv with
//! `padding="same"` → batch norm → residual add → relu → avg pool (ceil_mode,
//! count_include_pad=false) → adaptive avg pool → linear, three SGD steps with momentum,
//! then evaluation-mode logits. The same weights and batch go to `scripts/torch_cnn.py`;
//! losses, the first step's gradients, the running statistics and the logits must agree
//! to 1e-9. It needs a Python with torch and numpy (`SMELT_TORCH_PYTHON`, else `python3`);
//! without one, and always in CI, it says why it skips.

mod common;

use smelt::nn::functional as F;
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::runtime::npy::write_npy;
use smelt::runtime::{ConvOptions, PoolOptions};
use smelt::{DType, Generator, Tensor};
use std::collections::HashMap;
use std::process::Command;

const NAMES: [&str; 9] = ["w1", "b1", "g1", "be1", "w2", "g2", "be2", "wl", "bl"];

fn forward(
    p: &HashMap<&str, Tensor>,
    s: &HashMap<&str, Tensor>,
    x: &Tensor,
    training: bool,
) -> Tensor {
    let bn = |h: &Tensor, m: &str, v: &str, g: &str, b: &str| {
        F::batch_norm(
            h,
            Some(&s[m]),
            Some(&s[v]),
            Some(&p[g]),
            Some(&p[b]),
            training,
            0.1,
            1e-5,
        )
        .unwrap()
    };
    let h = x
        .conv2d(&p["w1"], Some(&p["b1"]), &ConvOptions::default().padding(1))
        .unwrap();
    let h = bn(&h, "rm1", "rv1", "g1", "be1").relu().unwrap();
    let h = h
        .max_pool2d(&PoolOptions::new(3).stride(2).padding(1).ceil_mode(true))
        .unwrap();
    let o = ConvOptions::default().padding_same().dilation(2).groups(2);
    let r = h.conv2d(&p["w2"], None, &o).unwrap();
    let r = bn(&r, "rm2", "rv2", "g2", "be2");
    let h = r.add(&h).unwrap().relu().unwrap();
    let pool = PoolOptions::new(2)
        .padding(1)
        .ceil_mode(true)
        .count_include_pad(false);
    let h = h.avg_pool2d(&pool).unwrap();
    let h = h
        .adaptive_avg_pool2d(2usize)
        .unwrap()
        .flatten(1, -1)
        .unwrap();
    h.linear(&p["wl"], Some(&p["bl"])).unwrap()
}

fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            "{what}[{i}]: smelt {g}, PyTorch {w}"
        );
    }
}

#[test]
fn a_small_cnn_trains_as_pytorch_trains_it() {
    let Some(python) = common::torch::python_with_torch() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("smelt-torch-cnn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Generator::new(3);
    let mut randn = |shape: &[usize], scale: f64| {
        Tensor::randn_with(shape, Some(DType::F64), &mut g)
            .unwrap()
            .mul_scalar(scale)
            .unwrap()
    };
    let shapes: [(&str, Vec<usize>, f64); 9] = [
        ("w1", vec![8, 3, 3, 3], 0.3),
        ("b1", vec![8], 0.1),
        ("g1", vec![8], 0.2),
        ("be1", vec![8], 0.1),
        ("w2", vec![8, 4, 3, 3], 0.2),
        ("g2", vec![8], 0.2),
        ("be2", vec![8], 0.1),
        ("wl", vec![3, 32], 0.3),
        ("bl", vec![3], 0.1),
    ];
    let mut p: HashMap<&str, Tensor> = HashMap::new();
    for (name, shape, scale) in &shapes {
        let t = randn(shape, *scale);
        let t = if name.starts_with('g') {
            t.add_scalar(1.0).unwrap()
        } else {
            t
        };
        write_npy(dir.join(format!("{name}.npy")), &t).unwrap();
        t.requires_grad_(true).unwrap();
        p.insert(name, t);
    }
    let mut s: HashMap<&str, Tensor> = HashMap::new();
    for (name, init) in [("rm1", 0.0), ("rv1", 1.0), ("rm2", 0.0), ("rv2", 1.0)] {
        let t = Tensor::full(&[8], init, Some(DType::F64)).unwrap();
        write_npy(dir.join(format!("{name}.npy")), &t).unwrap();
        s.insert(name, t);
    }
    let x = randn(&[4, 3, 11, 10], 1.0);
    let y = Tensor::from_vec(vec![0i64, 2, 1, 2], &[4]).unwrap();
    write_npy(dir.join("x.npy"), &x).unwrap();
    write_npy(dir.join("y.npy"), &y).unwrap();

    let params: Vec<Tensor> = NAMES.iter().map(|n| p[n].clone()).collect();
    let cfg = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.1)
    };
    let mut opt = SGD::new(params, cfg).unwrap();
    let mut ours: HashMap<String, Vec<f64>> = HashMap::new();
    let mut losses = Vec::new();
    for step in 0..3 {
        opt.zero_grad();
        let l = F::cross_entropy(&forward(&p, &s, &x, true), &y).unwrap();
        l.backward().unwrap();
        if step == 0 {
            for n in NAMES {
                ours.insert(format!("grad.{n}"), p[n].grad().unwrap().to_f64_vec());
            }
        }
        opt.step().unwrap();
        losses.push(l.item_f64().unwrap());
    }
    ours.insert("losses".into(), losses);
    for (n, t) in &s {
        ours.insert(n.to_string(), t.to_f64_vec());
    }
    let logits = smelt::autograd::no_grad_scope(|| forward(&p, &s, &x, false));
    ours.insert("logits".into(), logits.to_f64_vec());

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_cnn.py");
    let out = Command::new(&python)
        .args([script, dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen = 0;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let Some(name) = parts.next() else { continue };
        let want: Vec<f64> = parts.map(|v| v.parse().unwrap()).collect();
        let got = ours
            .get(name)
            .unwrap_or_else(|| panic!("PyTorch printed {name}, which smelt did not compute"));
        close(name, got, &want);
        seen += 1;
    }
    assert_eq!(seen, ours.len(), "every result compared");
    std::fs::remove_dir_all(&dir).ok();
}
