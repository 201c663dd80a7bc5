//! Cost of one training step, eager (autograd + `optim::SGD`) against one compiled step
//! (`train::CompiledStep`), in the same run:
//! `cargo run --release --example grad_step_bench [-- linreg | mlp]`.
//!
//! - the seeds' linear regression: y = 2x + 1 + noise, 100 points, `nn::Linear(1, 1)`,
//!   `mse_loss`, SGD; µs per step;
//! - an MLP step: [256,1024] → Linear(1024,4096) → ReLU → Linear(4096,1024) → MSE, forward +
//!   backward + SGD; ms per step and the eager/compiled ratio.

use smelt::exec::CompileOptions;
use smelt::nn::functional::{Reduction, mse_loss};
use smelt::nn::{Module, Sequential};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::train::CompiledStep;
use smelt::{Generator, Result, Tensor};
use std::time::Instant;

#[allow(dead_code)] // shared with the classifier examples; this one needs only the models
#[path = "common/spirals.rs"]
mod spirals;
use spirals::twin_models;

/// Best time per call of `f` over `rounds` rounds of `calls` calls, in seconds.
fn best_of(rounds: usize, calls: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        best = best.min(t.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(best)
}

fn mse(out: &Tensor, y: &Tensor) -> Result<Tensor> {
    mse_loss(out, y, Reduction::Mean)
}

fn linear_regression() -> Result<()> {
    let mut g = Generator::new(0);
    let x = Tensor::randn_with(&[100, 1], None, &mut g)?;
    let noise = Tensor::randn_with(&[100, 1], None, &mut g)?.mul_scalar(0.1)?;
    let y = x.mul_scalar(2.0)?.add_scalar(1.0)?.add(&noise)?;
    let (eager, compiled) = twin_models(&[1, 1], &mut g)?;
    let mut opt = SGD::new(eager.parameters(), SGDConfig::new(0.1))?;
    let mut eager_step = || -> Result<()> {
        opt.zero_grad();
        let loss = mse(&eager.forward(&x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        loss.item_f64()?;
        Ok(())
    };
    let steps = 100;
    // Warm-up: the first steps plan (and, once hot, compile) the backward.
    best_of(1, steps, &mut eager_step)?;
    let t_eager = best_of(10, steps, &mut eager_step)?;

    let t0 = Instant::now();
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| mse(&compiled.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        compiled.named_parameters(),
        SGDConfig::new(0.1),
        &CompileOptions::default(),
    )?;
    let compile = t0.elapsed().as_secs_f64();
    let s = step.compiled().schedule();
    let (kernels, gemms) = (s.kernel_count(), s.gemm_count());
    let batch = [x.clone(), y.clone()];
    let mut compiled_step = || -> Result<()> {
        step.step(&batch)?.item_f64()?;
        Ok(())
    };
    best_of(1, steps, &mut compiled_step)?;
    let t_comp = best_of(10, steps, &mut compiled_step)?;
    let w =
        |m: &Sequential| -> Vec<f64> { m.parameters().iter().map(|p| p.to_f64_vec()[0]).collect() };
    println!(
        "linear regression (100 points, Linear(1,1), MSE, SGD lr 0.1; best of 10 x {steps} steps after {steps} warm-up steps):"
    );
    println!("  eager step    {:8.2} us", t_eager * 1e6);
    println!(
        "  compiled step {:8.2} us   (compile {:.1} ms; {kernels} kernels, {gemms} GEMMs)   eager/compiled {:.1}x",
        t_comp * 1e6,
        compile * 1e3,
        t_eager / t_comp
    );
    println!(
        "  w, b: eager {:.4?}, compiled {:.4?}",
        w(&eager),
        w(&compiled)
    );
    Ok(())
}

fn mlp() -> Result<()> {
    let mut g = Generator::new(1);
    let x = Tensor::randn_with(&[256, 1024], None, &mut g)?;
    let y = Tensor::randn_with(&[256, 1024], None, &mut g)?;
    let (eager, compiled) = twin_models(&[1024, 4096, 1024], &mut g)?;
    let cfg = SGDConfig::new(0.01);
    let mut opt = SGD::new(eager.parameters(), cfg)?;
    let mut eager_step = || -> Result<()> {
        opt.zero_grad();
        let loss = mse(&eager.forward(&x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        loss.item_f64()?;
        Ok(())
    };
    eager_step()?;
    let t_eager = best_of(5, 1, &mut eager_step)?;
    let t0 = Instant::now();
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| mse(&compiled.forward(&xs[0])?, &xs[1]),
        &[x.clone(), y.clone()],
        compiled.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )?;
    let compile = t0.elapsed().as_secs_f64();
    let s = step.compiled().schedule();
    let (kernels, gemms) = (s.kernel_count(), s.gemm_count());
    let batch = [x.clone(), y.clone()];
    let mut compiled_step = || -> Result<()> {
        step.step(&batch)?.item_f64()?;
        Ok(())
    };
    compiled_step()?;
    let t_comp = best_of(5, 1, &mut compiled_step)?;
    println!(
        "MLP step ([256,1024] -> 4096 -> 1024, ReLU, MSE, SGD; best of 5, {} threads):",
        rayon::current_num_threads()
    );
    println!("  eager step    {:8.2} ms", t_eager * 1e3);
    println!(
        "  compiled step {:8.2} ms   (compile {:.1} ms; {kernels} kernels, {gemms} GEMMs)",
        t_comp * 1e3,
        compile * 1e3
    );
    println!("  eager/compiled {:.2}x", t_eager / t_comp);
    Ok(())
}

fn main() -> Result<()> {
    // `-- linreg` or `-- mlp` runs one part alone (for profiling).
    let only = std::env::args().nth(1);
    if only.as_deref() != Some("mlp") {
        linear_regression()?;
    }
    if only.as_deref() != Some("linreg") {
        mlp()?;
    }
    Ok(())
}
