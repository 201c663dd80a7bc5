//! `train::CompiledLoop`: N optimiser steps as one compiled `scan` agree with N calls of
//! `CompiledStep` on the same batches from the same weights (SGD with momentum, Adam with a
//! warmup-cosine schedule, AdamW with clipping), across two calls (the step count carries
//! over into the schedule), and bad stacked inputs are errors.

use smelt::exec::CompileOptions;
use smelt::nn::{Linear, Module, Sequential, Tanh};
use smelt::optim::{AdamConfig, SGDConfig};
use smelt::train::{CompiledLoop, CompiledStep, LrSchedule, StepConfig};
use smelt::{DType, Generator, Tensor};

/// Two twin 4 → 16 → 3 tanh MLPs (same weights, separate storage) and 8 batches of 8.
fn setup(seed: u64) -> (Sequential, Sequential, Vec<(Tensor, Tensor)>) {
    let mut g = Generator::new(seed);
    let mut a = Sequential::new();
    let mut b = Sequential::new();
    for (i, (fan_in, fan_out)) in [(4usize, 16usize), (16, 3)].into_iter().enumerate() {
        if i > 0 {
            a = a.add(Tanh::new());
            b = b.add(Tanh::new());
        }
        let w = Tensor::randn_with(&[fan_out, fan_in], Some(DType::F32), &mut g).unwrap();
        let bias = Tensor::randn_with(&[fan_out], Some(DType::F32), &mut g).unwrap();
        let twin = |t: &Tensor| Tensor::from_vec(t.to_vec::<f32>().unwrap(), t.shape()).unwrap();
        a = a.add(Linear::from_tensors(twin(&w), Some(twin(&bias))).unwrap());
        b = b.add(Linear::from_tensors(twin(&w), Some(twin(&bias))).unwrap());
    }
    let batches = (0..8)
        .map(|_| {
            let x = Tensor::randn_with(&[8, 4], Some(DType::F32), &mut g).unwrap();
            let y = Tensor::randn_with(&[8, 3], Some(DType::F32), &mut g).unwrap();
            (x, y)
        })
        .collect();
    (a, b, batches)
}

fn loss(m: &Sequential, x: &Tensor, y: &Tensor) -> smelt::Result<Tensor> {
    m.forward(x)?.sub(y)?.square()?.mean()
}

fn max_param_diff(a: &Sequential, b: &Sequential) -> f64 {
    a.parameters()
        .iter()
        .zip(b.parameters())
        .flat_map(|(p, q)| {
            p.to_f64_vec()
                .into_iter()
                .zip(q.to_f64_vec())
                .map(|(x, y)| (x - y).abs())
        })
        .fold(0.0, f64::max)
}

fn stacked(batches: &[(Tensor, Tensor)]) -> [Tensor; 2] {
    let xs: Vec<&Tensor> = batches.iter().map(|b| &b.0).collect();
    let ys: Vec<&Tensor> = batches.iter().map(|b| &b.1).collect();
    [
        Tensor::stack(&xs, 0).unwrap(),
        Tensor::stack(&ys, 0).unwrap(),
    ]
}

fn agree(cfg: StepConfig) {
    let (a, b, batches) = setup(7);
    let opts = CompileOptions::default();
    let mut step = CompiledStep::with_config(
        |xs: &[Tensor]| loss(&a, &xs[0], &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        a.named_parameters(),
        cfg,
        &opts,
    )
    .unwrap();
    let mut lp = CompiledLoop::new(
        |xs: &[Tensor]| loss(&b, &xs[0], &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        b.named_parameters(),
        cfg,
        4,
        &opts,
    )
    .unwrap();
    // two calls of four steps: the schedule's step count carries over
    for half in batches.chunks(4) {
        let want: Vec<f64> = half
            .iter()
            .map(|(x, y)| {
                step.step(&[x.clone(), y.clone()])
                    .unwrap()
                    .item_f64()
                    .unwrap()
            })
            .collect();
        let got = lp.run(&stacked(half)).unwrap().to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "loss {g} vs {w}");
        }
        let d = max_param_diff(&a, &b);
        assert!(d < 1e-5, "parameters differ by {d}");
    }
    assert_eq!(lp.steps_done(), 8);
    assert_eq!(
        lp.graph()
            .topo_order()
            .into_iter()
            .filter(|&v| lp.graph().node(v).op().is_some_and(|o| o.name() == "scan"))
            .count(),
        1
    );
}

#[test]
fn sgd_with_momentum_matches_step_by_step() {
    agree(StepConfig::sgd(SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.05)
    }));
}

#[test]
fn adam_with_a_schedule_matches_step_by_step() {
    let cfg = StepConfig::adam(AdamConfig {
        lr: 0.01,
        ..AdamConfig::default()
    })
    .schedule(LrSchedule::WarmupCosine {
        warmup_steps: 3,
        total_steps: 8,
        min_lr: 0.001,
    });
    agree(cfg);
}

#[test]
fn adamw_with_clipping_matches_step_by_step() {
    let cfg = StepConfig::adamw(AdamConfig {
        lr: 0.01,
        weight_decay: Some(0.1),
        ..AdamConfig::default()
    })
    .clip_grad_norm(0.5);
    agree(cfg);
}

#[test]
fn refused_configs_and_bad_batches_are_errors() {
    let (a, _, batches) = setup(3);
    let opts = CompileOptions::default();
    let ex = [batches[0].0.clone(), batches[0].1.clone()];
    let acc = CompiledLoop::new(
        |xs: &[Tensor]| loss(&a, &xs[0], &xs[1]),
        &ex,
        a.named_parameters(),
        StepConfig::sgd(SGDConfig::new(0.1)).accumulate(2),
        4,
        &opts,
    );
    assert!(acc.err().unwrap().to_string().contains("accumulation"));
    let mut lp = CompiledLoop::new(
        |xs: &[Tensor]| loss(&a, &xs[0], &xs[1]),
        &ex,
        a.named_parameters(),
        StepConfig::sgd(SGDConfig::new(0.1)),
        4,
        &opts,
    )
    .unwrap();
    // three steps' batches for a four-step loop
    let e = lp.run(&stacked(&batches[..3])).unwrap_err();
    assert!(
        e.to_string().contains("stacked input 0 must be f32[4,8,4]"),
        "{e}"
    );
}
