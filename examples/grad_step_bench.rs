//! Eager cost of one training step of linear regression (forward, backward, SGD update):
//! `cargo run --release --example grad_step_bench`.

use smelt::autograd::{no_grad, zero_grad};
use smelt::{Result, Tensor};
use std::time::Instant;

fn main() -> Result<()> {
    let n = 64;
    let x: Vec<f32> = (0..n * 4).map(|i| ((i * 7) % 13) as f32 / 13.0).collect();
    let x = Tensor::from_vec(x, &[n, 4])?;
    let true_w = Tensor::from_slice(&[1.5f32, -2.0, 0.5, 3.0], &[4, 1])?;
    let y = x.matmul(&true_w)?.add_scalar(0.25)?;
    let w = Tensor::zeros(&[4, 1], smelt::DType::F32);
    let b = Tensor::zeros(&[1], smelt::DType::F32);
    w.requires_grad_(true)?;
    b.requires_grad_(true)?;
    let step = |lr: f64| -> Result<f64> {
        let r = x.matmul(&w)?.add(&b)?.sub(&y)?;
        let loss = r.mul(&r)?.mean()?;
        loss.backward()?;
        {
            let _g = no_grad();
            if let (Some(gw), Some(gb)) = (w.grad(), b.grad()) {
                w.sub_(&gw.mul_scalar(lr)?)?;
                b.sub_(&gb.mul_scalar(lr)?)?;
            }
        }
        zero_grad(&[w.clone(), b.clone()]);
        loss.item_f64()
    };
    for _ in 0..100 {
        step(0.05)?;
    }
    let steps = 100;
    let mut best = f64::INFINITY;
    let mut last = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..steps {
            last = step(0.05)?;
        }
        best = best.min(t.elapsed().as_secs_f64() / steps as f64);
    }
    println!(
        "linear regression [{n}x4]: {:.1} us per eager step (best of 5 x {steps}), loss {last:.2e}",
        best * 1e6
    );
    // The forward alone without recording: what the kernels cost by themselves.
    let mut fwd = f64::INFINITY;
    for _ in 0..5 {
        let _g = no_grad();
        let t = Instant::now();
        for _ in 0..steps {
            let r = x.matmul(&w)?.add(&b)?.sub(&y)?;
            r.mul(&r)?.mean()?.item_f64()?;
        }
        fwd = fwd.min(t.elapsed().as_secs_f64() / steps as f64);
    }
    println!("forward only, no recording: {:.1} us", fwd * 1e6);
    Ok(())
}
