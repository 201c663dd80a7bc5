//! Linear regression as the seeds teach it: fit y = 2x + 1 + noise with `nn::Linear`,
//! `mse_loss` and SGD; the weight goes to 2 and the bias to 1.

use indicatif::{ProgressBar, ProgressStyle};
use smelt::nn::functional::{Reduction, mse_loss};
use smelt::nn::{Linear, Module};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::{Result, Tensor, manual_seed};
use std::time::Instant;

fn main() -> Result<()> {
    manual_seed(0);
    let x = Tensor::randn(&[100, 1], None)?;
    let noise = Tensor::randn(&[100, 1], None)?.mul_scalar(0.1)?;
    let y = x.mul_scalar(2.0)?.add_scalar(1.0)?.add(&noise)?;

    let model = Linear::new(1, 1, true)?;
    let mut opt = SGD::new(model.parameters(), SGDConfig::new(0.1))?;
    let steps = 100;
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let mut loss_value = f64::NAN;
    for step in 0..steps {
        opt.zero_grad();
        let loss = mse_loss(&model.forward(&x)?, &y, Reduction::Mean)?;
        loss.backward()?;
        opt.step()?;
        loss_value = loss.item_f64()?;
        let rate = (step + 1) as f64 / start.elapsed().as_secs_f64();
        bar.set_message(format!("loss {loss_value:.5}  {rate:.0} steps/s"));
        bar.inc(1);
    }
    bar.finish();
    let per_step = start.elapsed().as_secs_f64() * 1e6 / steps as f64;
    let params = model.named_parameters();
    for (name, p) in &params {
        println!("{name} = {:.4}", p.to_f64_vec()[0]);
    }
    println!("final loss {loss_value:.5}; {per_step:.1} µs per eager step");
    Ok(())
}
