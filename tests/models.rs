//! The example models under examples/models, run through `smelt run` on random inputs and
//! compared with the same computation written here with f64 loops.

mod common;

use common::{Tol, assert_close, smelt, temp_dir};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::runtime::npy::{read_npy, write_npy};
use smelt::{DType, Tensor};
use std::path::PathBuf;

/// An f32 input: its name, shape and values.
struct Input {
    name: &'static str,
    shape: Vec<usize>,
    data: Vec<f32>,
}

fn input(rng: &mut StdRng, name: &'static str, shape: &[usize], scale: f32) -> Input {
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect();
    Input {
        name,
        shape: shape.to_vec(),
        data,
    }
}

/// The input values widened to f64 (what the references compute with).
fn f64s(i: &Input) -> Vec<f64> {
    i.data.iter().map(|&v| v as f64).collect()
}

/// Runs `examples/models/{model}.smelt` on the inputs; returns each output's shape and values.
fn run_model(model: &str, seed: u64, inputs: &[Input]) -> Vec<(Vec<usize>, Vec<f32>)> {
    let dir = temp_dir(&format!("{model}-{seed}"));
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("examples/models/{model}.smelt"));
    let mut args = vec!["run".to_string(), path.display().to_string()];
    for i in inputs {
        let file = dir.join(format!("{}.npy", i.name));
        write_npy(&file, &Tensor::from_vec(i.data.clone(), &i.shape).unwrap()).unwrap();
        args.push("--input".into());
        args.push(format!("{}={}", i.name, file.display()));
    }
    args.push("--out".into());
    args.push(dir.join("out").display().to_string());
    let o = smelt(&args);
    assert!(
        o.status.success(),
        "{model}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut outs = Vec::new();
    while let Ok(t) = read_npy(dir.join(format!("out/out{}.npy", outs.len()))) {
        assert_eq!(t.dtype(), DType::F32, "{model}: output {}", outs.len());
        outs.push((t.shape().to_vec(), t.to_vec::<f32>().unwrap()));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    outs
}

/// Float32 results against an f64 reference: |got - want| <= 2e-5 + 1e-4 |want|.
const F32_VS_F64: Tol = Tol::allclose(1e-4, 2e-5);

/// `x[rows, k] @ w[k, cols]` with w stored as given (row-major k x cols).
fn matmul(x: &[f64], w: &[f64], rows: usize, k: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            y[i * cols + j] = (0..k).map(|p| x[i * k + p] * w[p * cols + j]).sum();
        }
    }
    y
}

/// `torch.nn.functional.linear`: x[rows, k] @ w[out, k]^T + b[out].
fn linear(x: &[f64], w: &[f64], b: &[f64], rows: usize, k: usize, out: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * out];
    for i in 0..rows {
        for j in 0..out {
            y[i * out + j] = b[j] + (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f64>();
        }
    }
    y
}

fn softmax_rows(x: &[f64], cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
        y.extend(row.iter().map(|v| (v - m).exp() / z));
    }
    y
}

fn layer_norm_rows(x: &[f64], w: &[f64], b: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (var + eps).sqrt();
        y.extend(
            row.iter()
                .enumerate()
                .map(|(j, v)| (v - mean) * inv * w[j] + b[j]),
        );
    }
    y
}

const SEEDS: [u64; 2] = [1, 2];

#[test]
fn linear_regression() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [
            input(&mut rng, "x", &[8, 16], 1.0),
            input(&mut rng, "w", &[16, 1], 0.5),
            input(&mut rng, "b", &[1], 1.0),
            input(&mut rng, "y", &[8, 1], 2.0),
        ];
        let outs = run_model("linear_regression", seed, &ins);
        let [x, w, b, y] = ins.each_ref().map(f64s);
        let pred: Vec<f64> = matmul(&x, &w, 8, 16, 1).iter().map(|v| v + b[0]).collect();
        let loss = pred
            .iter()
            .zip(&y)
            .map(|(p, t)| (p - t).powi(2))
            .sum::<f64>()
            / 8.0;
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0].0, vec![8, 1]);
        assert_close(&outs[0].1, &pred, F32_VS_F64, "pred");
        assert_eq!(outs[1].0, Vec::<usize>::new());
        assert_close(&outs[1].1, &[loss], F32_VS_F64, "loss");
    }
}

#[test]
fn relu_scale() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [input(&mut rng, "x", &[8, 16], 3.0)];
        let outs = run_model("relu_scale", seed, &ins);
        let want: Vec<f64> = f64s(&ins[0]).iter().map(|&v| v.max(0.0) * 0.5).collect();
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].0, vec![8, 16]);
        assert_close(&outs[0].1, &want, F32_VS_F64, "y");
    }
}

#[test]
fn mlp_block() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [
            input(&mut rng, "x", &[8, 16], 1.0),
            input(&mut rng, "w1", &[32, 16], 0.5),
            input(&mut rng, "b1", &[32], 0.5),
            input(&mut rng, "w2", &[16, 32], 0.5),
            input(&mut rng, "b2", &[16], 0.5),
        ];
        let outs = run_model("mlp_block", seed, &ins);
        let [x, w1, b1, w2, b2] = ins.each_ref().map(f64s);
        let h = linear(&x, &w1, &b1, 8, 16, 32);
        let a: Vec<f64> = h
            .iter()
            .map(|&v| 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)))
            .collect();
        let y = linear(&a, &w2, &b2, 8, 32, 16);
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].0, vec![8, 16]);
        assert_close(&outs[0].1, &y, F32_VS_F64, "y");
    }
}

#[test]
fn softmax() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [input(&mut rng, "x", &[8, 16], 10.0)];
        let outs = run_model("softmax", seed, &ins);
        assert_eq!(outs[0].0, vec![8, 16]);
        assert_close(
            &outs[0].1,
            &softmax_rows(&f64s(&ins[0]), 16),
            F32_VS_F64,
            "y",
        );
    }
}

#[test]
fn layer_norm() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [
            input(&mut rng, "x", &[8, 16], 4.0),
            input(&mut rng, "weight", &[16], 1.0),
            input(&mut rng, "bias", &[16], 1.0),
        ];
        let outs = run_model("layer_norm", seed, &ins);
        let [x, w, b] = ins.each_ref().map(f64s);
        assert_eq!(outs[0].0, vec![8, 16]);
        assert_close(
            &outs[0].1,
            &layer_norm_rows(&x, &w, &b, 16, 1e-5),
            F32_VS_F64,
            "y",
        );
    }
}

#[test]
fn attention() {
    let (batch, seq, d) = (2, 8, 16);
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [
            input(&mut rng, "q", &[batch, seq, d], 1.0),
            input(&mut rng, "k", &[batch, seq, d], 1.0),
            input(&mut rng, "v", &[batch, seq, d], 1.0),
        ];
        let outs = run_model("attention", seed, &ins);
        let [q, k, v] = ins.each_ref().map(f64s);
        let mut want = vec![0.0; batch * seq * d];
        for bi in 0..batch {
            let at = |t: &[f64], i: usize, j: usize| t[(bi * seq + i) * d + j];
            for i in 0..seq {
                // Only keys up to the query's own position take part.
                let scores: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|c| at(&q, i, c) * at(&k, j, c)).sum::<f64>() / 4.0)
                    .collect();
                let p = softmax_rows(&scores, i + 1);
                for c in 0..d {
                    want[(bi * seq + i) * d + c] = (0..=i).map(|j| p[j] * at(&v, j, c)).sum();
                }
            }
        }
        assert_eq!(outs.len(), 1);
        assert_eq!(outs[0].0, vec![batch, seq, d]);
        assert_close(&outs[0].1, &want, F32_VS_F64, "out");
    }
}

#[test]
fn residual() {
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let ins = [
            input(&mut rng, "x", &[8, 16], 2.0),
            input(&mut rng, "ln_w", &[16], 1.0),
            input(&mut rng, "ln_b", &[16], 1.0),
            input(&mut rng, "w", &[16, 16], 0.5),
            input(&mut rng, "b", &[16], 0.5),
        ];
        let outs = run_model("residual", seed, &ins);
        let [x, ln_w, ln_b, w, b] = ins.each_ref().map(f64s);
        let n = layer_norm_rows(&x, &ln_w, &ln_b, 16, 1e-5);
        let r: Vec<f64> = n.iter().map(|v| v.max(0.0)).collect();
        let l = linear(&r, &w, &b, 8, 16, 16);
        let y: Vec<f64> = x.iter().zip(&l).map(|(a, b)| a + b).collect();
        assert_eq!(outs[0].0, vec![8, 16]);
        assert_close(&outs[0].1, &y, F32_VS_F64, "y");
    }
}
