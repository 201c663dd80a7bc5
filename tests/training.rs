//! End-to-end training: nn modules, losses, autograd and optimisers together.

use smelt::nn::functional::{Reduction, cross_entropy, mse_loss};
use smelt::nn::{Linear, Module, ReLU, Sequential};
use smelt::optim::{Adam, AdamConfig, Optimizer, SGD, SGDConfig};
use smelt::{Generator, Tensor};

#[test]
fn linear_regression_converges_to_the_true_line() {
    let mut g = Generator::new(7);
    let x = Tensor::randn_with(&[256, 1], None, &mut g).unwrap();
    let noise = Tensor::randn_with(&[256, 1], None, &mut g)
        .unwrap()
        .mul_scalar(0.05)
        .unwrap();
    let y = x
        .mul_scalar(2.0)
        .unwrap()
        .add_scalar(1.0)
        .unwrap()
        .add(&noise)
        .unwrap();
    let model = Linear::new(1, 1, true).unwrap();
    let mut opt = SGD::new(model.parameters(), SGDConfig::new(0.1)).unwrap();
    let mut first = None;
    let mut last = f64::NAN;
    for _ in 0..200 {
        opt.zero_grad();
        let loss = mse_loss(&model.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        last = loss.item_f64().unwrap();
        first.get_or_insert(last);
    }
    let p = model.named_parameters();
    let w = p[0].1.to_f64_vec()[0];
    let b = p[1].1.to_f64_vec()[0];
    assert!((w - 2.0).abs() < 0.02, "w = {w}");
    assert!((b - 1.0).abs() < 0.02, "b = {b}");
    // The noise variance (0.05²) is the floor the loss reaches.
    assert!(
        last < 0.01 && last < first.unwrap() / 100.0,
        "loss {first:?} -> {last}"
    );
}

#[test]
fn mlp_learns_two_separable_classes() {
    // Class 1 when x0 + x1 > 0: a linearly separable task a small MLP fits quickly.
    let mut g = Generator::new(11);
    let x = Tensor::randn_with(&[128, 2], None, &mut g).unwrap();
    let labels: Vec<i64> = x
        .to_f64_vec()
        .chunks(2)
        .map(|r| i64::from(r[0] + r[1] > 0.0))
        .collect();
    let y = Tensor::from_vec(labels.clone(), &[128]).unwrap();
    let model = Sequential::new()
        .add(Linear::new(2, 16, true).unwrap())
        .add(ReLU::new())
        .add(Linear::new(16, 2, true).unwrap());
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(0.05)).unwrap();
    for _ in 0..60 {
        opt.zero_grad();
        let loss = cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    let logits = model.forward(&x).unwrap().to_f64_vec();
    let correct = logits
        .chunks(2)
        .zip(&labels)
        .filter(|(l, c)| i64::from(l[1] > l[0]) == **c)
        .count();
    assert!(correct >= 122, "{correct}/128 correct");
}

/// One `use` line for a training loop: the prelude.
mod with_the_prelude {
    use smelt::prelude::*;

    #[test]
    fn a_training_loop_needs_one_use_line() -> Result<()> {
        manual_seed(3);
        let x = Tensor::randn(&[64, 1], None)?;
        let y = (&x * 3.0 - 0.5).to_dtype(DType::F32)?;
        let model = Linear::new(1, 1, true)?;
        let mut opt = AdamW::new(model.parameters(), AdamConfig::new(0.1))?;
        let mut loss = f64::NAN;
        for _ in 0..150 {
            opt.zero_grad();
            let l = F::mse_loss(&model.forward(&x)?, &y, Reduction::Mean)?;
            l.backward()?;
            opt.step()?;
            loss = l.item_f64()?;
        }
        assert!(loss < 1e-2, "loss {loss}");
        let w = no_grad_scope(|| model.forward(&tensor![[1.0f32]]?))?;
        assert!((w.item_f64()? - 2.5).abs() < 0.1, "{w:?}");
        Ok(())
    }
}
