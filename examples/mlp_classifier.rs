//! An MLP classifier on two interleaved spirals, trained twice from the same initial
//! weights: eagerly (autograd + `optim::SGD`) and as one compiled step per batch
//! (`train::CompiledStep`), each loop with a progress bar. Prints both accuracies and the
//! speedup: `cargo run --release --example mlp_classifier`.
//!
//! With `--profile DIR` it then records a few more steps of each loop with
//! `smelt::profiler` and writes `DIR/trace.json` (open it in Perfetto or `chrome://tracing`;
//! eager and compiled are two processes) and `DIR/report.html`, and prints the op tables.

use smelt::exec::CompileOptions;
use smelt::nn::Module;
use smelt::nn::functional::cross_entropy;
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::profiler;

#[path = "common/profiling.rs"]
mod profiling;
#[path = "common/progress.rs"]
mod progress;
#[path = "common/spirals.rs"]
mod spirals;
use indicatif::ProgressBar;
use progress::progress;
use smelt::train::CompiledStep;
use smelt::{Generator, Result, Tensor};
use spirals::{accuracy, spirals, twin_models};
use std::time::Instant;

const POINTS_PER_CLASS: usize = 512;
const BATCH: usize = 128;
const EPOCHS: usize = 150;
const HIDDEN: usize = 64;

/// Advances `bar` past step `i`; every 50 steps it shows the loss and the step rate.
fn tick(bar: &ProgressBar, i: usize, loss: f64, t0: Instant) {
    if (i + 1).is_multiple_of(50) {
        let rate = (i + 1) as f64 / t0.elapsed().as_secs_f64();
        bar.set_message(format!("loss {loss:.4}  {rate:.0} steps/s"));
    }
    bar.inc(1);
}

/// Steps recorded per loop with `--profile`.
const PROFILED_STEPS: usize = 5;

fn main() -> Result<()> {
    let profile_to = profiling::profile_dir()?;
    let mut g = Generator::new(2024);
    let (x, y) = spirals(POINTS_PER_CLASS, &mut g)?;
    let (x_test, y_test) = spirals(POINTS_PER_CLASS / 2, &mut g)?;
    let (eager, compiled) = twin_models(&[2, HIDDEN, HIDDEN, 2], &mut g)?;
    let n = x.shape()[0];
    let batches: Vec<(Tensor, Tensor)> = (0..n / BATCH)
        .map(|b| {
            let (s, e) = (Some((b * BATCH) as i64), Some(((b + 1) * BATCH) as i64));
            Ok((x.slice(0, s, e, 1)?, y.slice(0, s, e, 1)?))
        })
        .collect::<Result<_>>()?;
    let mut cfg = SGDConfig::new(0.1);
    cfg.momentum = 0.9;
    let steps = EPOCHS * batches.len();

    let mut opt = SGD::new(eager.parameters(), cfg)?;
    let bar = progress(steps, "eager");
    let t0 = Instant::now();
    let mut eager_loss = f64::NAN;
    for i in 0..steps {
        let (xb, yb) = &batches[i % batches.len()];
        opt.zero_grad();
        let loss = cross_entropy(&eager.forward(xb)?, yb)?;
        loss.backward()?;
        opt.step()?;
        eager_loss = loss.item_f64()?;
        tick(&bar, i, eager_loss, t0);
    }
    let t_eager = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();

    let t0 = Instant::now();
    let mut step = CompiledStep::new(
        |xs: &[Tensor]| cross_entropy(&compiled.forward(&xs[0])?, &xs[1]),
        &[batches[0].0.clone(), batches[0].1.clone()],
        compiled.named_parameters(),
        cfg,
        &CompileOptions::default(),
    )?;
    let compile = t0.elapsed().as_secs_f64();
    let bar = progress(steps, "compiled");
    let t0 = Instant::now();
    let mut compiled_loss = f64::NAN;
    for i in 0..steps {
        let (xb, yb) = &batches[i % batches.len()];
        compiled_loss = step.step(&[xb.clone(), yb.clone()])?.item_f64()?;
        tick(&bar, i, compiled_loss, t0);
    }
    let t_compiled = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();

    println!(
        "two spirals: {n} training points, {} test points; MLP 2-{HIDDEN}-{HIDDEN}-2, cross-entropy, SGD lr {} momentum {}, {steps} steps of {BATCH}",
        x_test.shape()[0],
        cfg.lr,
        cfg.momentum
    );
    for (name, m, loss, t) in [
        ("eager   ", &eager, eager_loss, t_eager),
        ("compiled", &compiled, compiled_loss, t_compiled),
    ] {
        println!(
            "{name}: final loss {loss:.4}, train accuracy {:.1}%, test accuracy {:.1}%, {:.1} ms ({:.1} us/step)",
            100.0 * accuracy(m, &x, &y)?,
            100.0 * accuracy(m, &x_test, &y_test)?,
            t * 1e3,
            t * 1e6 / steps as f64
        );
    }
    println!(
        "compiled step: {:.2}x faster than eager ({:.1} ms to compile, {} kernels)",
        t_eager / t_compiled,
        compile * 1e3,
        step.compiled().schedule().kernel_count()
    );

    if let Some(dir) = profile_to {
        profiling::profile_training(
            &dir,
            "mlp_classifier: eager and compiled training steps",
            PROFILED_STEPS,
            |i| {
                let (xb, yb) = &batches[i % batches.len()];
                opt.zero_grad();
                let loss = {
                    let _f = profiler::record_function("forward");
                    cross_entropy(&eager.forward(xb)?, yb)?
                };
                {
                    let _b = profiler::record_function("backward");
                    loss.backward()?;
                }
                let _o = profiler::record_function("optimizer");
                opt.step()
            },
            |i| {
                let (xb, yb) = &batches[i % batches.len()];
                step.step(&[xb.clone(), yb.clone()]).map(drop)
            },
        )?;
    }
    Ok(())
}
