//! An MLP classifier on two interleaved spirals, trained twice from the same initial
//! weights: eagerly (autograd + `optim::SGD`) and as one compiled step per batch
//! (`train::CompiledStep`), each loop with a progress bar. Prints both accuracies and the
//! speedup: `cargo run --release --example mlp_classifier`.
//!
//! With `--profile DIR` it then records a few more steps of each loop with
//! `smelt::profiler` and writes `DIR/trace.json` (open it in Perfetto or `chrome://tracing`;
//! eager and compiled are two processes) and `DIR/report.html`, and prints the op tables.

use smelt::autograd::no_grad;
use smelt::exec::CompileOptions;
use smelt::nn::functional::cross_entropy;
use smelt::nn::{Linear, Module, ReLU, Sequential};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::profiler;

#[path = "common/profiling.rs"]
mod profiling;
#[path = "common/progress.rs"]
mod progress;
use indicatif::ProgressBar;
use progress::progress;
use smelt::train::CompiledStep;
use smelt::{Generator, Result, Tensor};
use std::f64::consts::PI;
use std::time::Instant;

const POINTS_PER_CLASS: usize = 512;
const BATCH: usize = 128;
const EPOCHS: usize = 150;
const HIDDEN: usize = 64;

/// Two spirals (class 0 and class 1, half a turn apart) with Gaussian noise, shuffled.
fn spirals(n: usize, g: &mut Generator) -> Result<(Tensor, Tensor)> {
    let t = Tensor::rand_with(&[2 * n], None, g)?.to_f64_vec();
    let noise = Tensor::randn_with(&[2 * n, 2], None, g)?.to_f64_vec();
    // A seeded shuffle: the points sorted by random keys.
    let keys = Tensor::rand_with(&[2 * n], None, g)?.to_f64_vec();
    let mut order: Vec<usize> = (0..2 * n).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    let mut xs = vec![0f32; 4 * n];
    let mut ys = vec![0i64; 2 * n];
    for (row, &i) in order.iter().enumerate() {
        let class = i / n;
        // Radius grows with the angle: 1.5 turns from the centre outwards.
        let a = t[i] * 3.0 * PI;
        let r = 0.1 + t[i];
        let phase = class as f64 * PI;
        xs[2 * row] = (r * (a + phase).cos() + 0.03 * noise[2 * i]) as f32;
        xs[2 * row + 1] = (r * (a + phase).sin() + 0.03 * noise[2 * i + 1]) as f32;
        ys[row] = class as i64;
    }
    Ok((
        Tensor::from_vec(xs, &[2 * n, 2])?,
        Tensor::from_vec(ys, &[2 * n])?,
    ))
}

/// Two copies of the same randomly initialised 2 → H → H → 2 MLP.
fn twin_models(g: &mut Generator) -> Result<(Sequential, Sequential)> {
    let widths = [2, HIDDEN, HIDDEN, 2];
    let (mut a, mut b) = (Sequential::new(), Sequential::new());
    for (i, io) in widths.windows(2).enumerate() {
        if i > 0 {
            a = a.add(ReLU::new());
            b = b.add(ReLU::new());
        }
        let bound = 1.0 / (io[0] as f64).sqrt();
        let w = Tensor::rand_with(&[io[1], io[0]], None, g)?.to_f64_vec();
        let bias = Tensor::rand_with(&[io[1]], None, g)?.to_f64_vec();
        let init = |v: &[f64], shape: &[usize]| -> Result<Tensor> {
            let v: Vec<f32> = v.iter().map(|u| ((2.0 * u - 1.0) * bound) as f32).collect();
            let t = Tensor::from_vec(v, shape)?;
            t.requires_grad_(true)?;
            Ok(t)
        };
        let shape = [io[1], io[0]];
        a = a.add(Linear::from_tensors(
            init(&w, &shape)?,
            Some(init(&bias, &[io[1]])?),
        )?);
        b = b.add(Linear::from_tensors(
            init(&w, &shape)?,
            Some(init(&bias, &[io[1]])?),
        )?);
    }
    Ok((a, b))
}

/// Advances `bar` past step `i`; every 50 steps it shows the loss and the step rate.
fn tick(bar: &ProgressBar, i: usize, loss: f64, t0: Instant) {
    if (i + 1).is_multiple_of(50) {
        let rate = (i + 1) as f64 / t0.elapsed().as_secs_f64();
        bar.set_message(format!("loss {loss:.4}  {rate:.0} steps/s"));
    }
    bar.inc(1);
}

/// Share of the points whose largest logit is their class.
fn accuracy(model: &Sequential, x: &Tensor, y: &Tensor) -> Result<f64> {
    let _off = no_grad();
    let logits = model.forward(x)?.to_f64_vec();
    let labels = y.to_i64_vec();
    let hits = logits
        .chunks(2)
        .zip(&labels)
        .filter(|(l, c)| i64::from(l[1] > l[0]) == **c)
        .count();
    Ok(hits as f64 / labels.len() as f64)
}

/// Steps recorded per loop with `--profile`.
const PROFILED_STEPS: usize = 5;

fn main() -> Result<()> {
    let profile_to = profiling::profile_dir()?;
    let mut g = Generator::new(2024);
    let (x, y) = spirals(POINTS_PER_CLASS, &mut g)?;
    let (x_test, y_test) = spirals(POINTS_PER_CLASS / 2, &mut g)?;
    let (eager, compiled) = twin_models(&mut g)?;
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
