//! Long training runs hold no more memory after their first steps: the host memory held by
//! tensor storages (the process-wide `memory_stats`, which is why this file holds one test)
//! is the same after 300 steps as after 50, eager and compiled.

use smelt::nn::functional::cross_entropy;
use smelt::nn::{BatchNorm1d, Linear, Module, ReLU, Sequential};
use smelt::optim::{AdamConfig, AdamW, Optimizer};
use smelt::runtime::storage::memory_stats;
use smelt::train::{CompiledStep, StepConfig};
use smelt::{DType, Generator, Tensor};

fn net() -> Sequential {
    smelt::manual_seed(11);
    Sequential::new()
        .add(Linear::new(8, 32, true).unwrap())
        .add(BatchNorm1d::new_1d(32).unwrap())
        .add(ReLU::new())
        .add(Linear::new(32, 4, true).unwrap())
}

#[test]
fn memory_stops_growing_after_the_first_steps() {
    let mut g = Generator::new(5);
    let batches: Vec<(Tensor, Tensor)> = (0..2)
        .map(|_| {
            let x = Tensor::randn_with(&[16, 8], Some(DType::F32), &mut g).unwrap();
            let y = Tensor::from_vec((0..16).map(|i| i % 4).collect::<Vec<i64>>(), &[16]).unwrap();
            (x, y)
        })
        .collect();
    // compiled: AdamW with clipping, running statistics written back
    let compiled = net();
    let mut step = CompiledStep::with_buffers(
        |xs: &[Tensor]| cross_entropy(&compiled.forward(&xs[0])?, &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        compiled.named_parameters(),
        compiled.named_buffers(),
        StepConfig::adamw(AdamConfig::new(1e-3)).clip_grad_norm(1.0),
        &Default::default(),
    )
    .unwrap();
    // eager: the same optimiser
    let eager = net();
    let mut opt = AdamW::new(eager.parameters(), AdamConfig::new(1e-3)).unwrap();
    let mut held = Vec::new();
    let mut losses = Vec::new();
    for i in 0..300 {
        let (x, y) = &batches[i % 2];
        let lc = step
            .step(&[x.clone(), y.clone()])
            .unwrap()
            .item_f64()
            .unwrap();
        opt.zero_grad();
        let l = cross_entropy(&eager.forward(x).unwrap(), y).unwrap();
        l.backward().unwrap();
        smelt::autograd::clip_grad_norm_(&eager.parameters(), 1.0, 2.0).unwrap();
        opt.step().unwrap();
        losses.push((l.item_f64().unwrap(), lc));
        drop(l);
        if i == 49 || i == 299 {
            held.push(memory_stats().allocated);
        }
    }
    assert!(
        held[1] <= held[0],
        "host memory held grew from {} to {} bytes between steps 50 and 300",
        held[0],
        held[1]
    );
    // both trained, and alike
    let (first, last) = (losses[0], losses[299]);
    assert!(
        last.0 < first.0 && last.1 < first.1,
        "{first:?} -> {last:?}"
    );
    assert!((last.0 - last.1).abs() < 1e-3, "{last:?}");
}
