//! A small ResNet (a conv-bn-relu stem, two basic blocks with residual adds — the second
//! downsampling through a strided 1×1 projection — global average pooling, dropout and a
//! linear head) that learns to tell four kinds of shapes apart in noisy 16×16 images it
//! draws itself: discs, squares, crosses and rings, at random places and sizes.
//!
//! It trains once eagerly on channels_last images (autograd, SGD with momentum), and once
//! as one compiled step per batch on NCHW images (`CompiledStep`), each with a progress
//! bar, switching batch norm and dropout to evaluation mode to measure the accuracy on
//! held-out images. The compiled step takes the model's buffers too, so batch norm's
//! running statistics move in it as in eager training.
//!
//! `cargo run --release --example resnet` (well under a minute on two cores).

use smelt::autograd::no_grad;
use smelt::exec::CompileOptions;
use smelt::nn::Module;
use smelt::optim::{Optimizer, SGD};
use smelt::runtime::MemoryFormat;
use smelt::train::{CompiledStep, LrSchedule, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::time::Instant;

#[path = "common/progress.rs"]
mod progress;
use progress::progress;

#[path = "common/resnet_model.rs"]
mod resnet_model;
use resnet_model::{BATCH, ResNet, images, loss};

const STEPS: usize = 250;
const TARGET: f64 = 0.95;

/// The share of `x` the model classifies right, in evaluation mode.
fn accuracy(model: &mut ResNet, x: &Tensor, y: &Tensor) -> Result<f64> {
    model.eval();
    let _off = no_grad();
    let pred = model.forward(x)?.argmax(Some(-1), false)?.to_i64_vec();
    model.train(true);
    let right = pred
        .iter()
        .zip(y.to_i64_vec())
        .filter(|(p, y)| **p == *y)
        .count();
    Ok(right as f64 / pred.len() as f64)
}

fn main() -> Result<()> {
    let mut data = Generator::new(1);
    let (test_x, test_y) = images(1000, &mut Generator::new(99))?;
    let sgd = resnet_model::sgd();
    // warmup, then a cosine to a small rate: the running statistics that batch norm
    // averages over the last batches then describe the final weights
    let schedule = LrSchedule::WarmupCosine {
        warmup_steps: 10,
        total_steps: STEPS as u64,
        min_lr: 5e-4,
    };

    // eager, channels_last: the whole network stays NHWC
    smelt::manual_seed(0);
    let mut eager = ResNet::new()?;
    let mut opt = SGD::new(eager.parameters(), sgd)?;
    let bar = progress(STEPS, "eager, channels_last");
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for i in 0..STEPS {
        let (x, y) = images(BATCH, &mut data)?;
        let x = x.to_memory_format(MemoryFormat::ChannelsLast)?;
        opt.set_lr(schedule.lr(sgd.lr, i as u64));
        opt.zero_grad();
        let l = loss(&eager, &x, &y)?;
        l.backward()?;
        opt.step()?;
        last = l.item_f64()?;
        bar.set_message(format!("loss {last:.3}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let eager_s = t0.elapsed().as_secs_f64();
    let eager_acc = accuracy(
        &mut eager,
        &test_x.to_memory_format(MemoryFormat::ChannelsLast)?,
        &test_y,
    )?;
    println!(
        "eager (channels_last): {STEPS} steps in {eager_s:.1} s, final loss {last:.3}, test accuracy {:.1}%",
        100.0 * eager_acc
    );

    // compiled, NCHW: forward, backward and the SGD update as one compiled step per batch
    smelt::manual_seed(0);
    let mut model = ResNet::new()?;
    let (x0, y0) = images(BATCH, &mut data)?;
    let t0 = Instant::now();
    let mut step = CompiledStep::with_buffers(
        |b: &[Tensor]| loss(&model, &b[0], &b[1]),
        &[x0, y0],
        model.named_parameters(),
        model.named_buffers(),
        StepConfig::sgd(sgd).schedule(schedule),
        &CompileOptions::default(),
    )?;
    let compile_s = t0.elapsed().as_secs_f64();
    let bar = progress(STEPS, "compiled, NCHW");
    let t0 = Instant::now();
    for _ in 0..STEPS {
        let (x, y) = images(BATCH, &mut data)?;
        last = step.step(&[x, y])?.item_f64()?;
        bar.set_message(format!("loss {last:.3}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let compiled_s = t0.elapsed().as_secs_f64();
    let kernels = step.compiled().schedule().kernel_count();
    drop(step);
    let compiled_acc = accuracy(&mut model, &test_x, &test_y)?;
    println!(
        "compiled (NCHW): {STEPS} steps in {compiled_s:.1} s ({compile_s:.2} s to compile, {kernels} kernels; {:.1}x eager), final loss {last:.3}, test accuracy {:.1}%",
        eager_s / compiled_s,
        100.0 * compiled_acc
    );
    for (what, acc) in [("eager", eager_acc), ("compiled", compiled_acc)] {
        if acc < TARGET {
            return Err(smelt::Error::Value(format!(
                "{what}: test accuracy {:.1}% is under the {:.0}% target",
                100.0 * acc,
                100.0 * TARGET
            )));
        }
    }
    println!("both reach the {:.0}% target", 100.0 * TARGET);
    Ok(())
}
