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
//! Then it writes what `examples/aot` runs from C and Python: the compiled model's inference
//! graph on 200 held-out images (`resnet.smelt`), the images and their labels
//! (`images.npy`, `labels.npy`) and the JIT's logits on them (`out0.npy`, from `smelt run`,
//! checked against the model's), in `$TMPDIR/smelt-resnet`.
//!
//! `cargo run --release --example resnet` (well under a minute on two cores);
//! `-- --steps N` trains N steps each way instead of 250 (the accuracy target then
//! applies only from 250 steps on).

use smelt::autograd::no_grad;
use smelt::exec::CompileOptions;
use smelt::nn::Module;
use smelt::optim::{Optimizer, SGD};
use smelt::runtime::MemoryFormat;
use smelt::train::{CompiledStep, LrSchedule, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::time::Instant;

#[path = "common/args.rs"]
mod args;
#[path = "common/export.rs"]
mod export;
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
    let steps = args::steps_arg(STEPS)?;
    let mut data = Generator::new(1);
    let (test_x, test_y) = images(1000, &mut Generator::new(99))?;
    let sgd = resnet_model::sgd();
    // warmup, then a cosine to a small rate: the running statistics that batch norm
    // averages over the last batches then describe the final weights
    let schedule = LrSchedule::WarmupCosine {
        warmup_steps: 10,
        total_steps: steps as u64,
        min_lr: 5e-4,
    };

    // eager, channels_last: the whole network stays NHWC
    smelt::manual_seed(0);
    let mut eager = ResNet::new()?;
    let mut opt = SGD::new(eager.parameters(), sgd)?;
    let bar = progress(steps, "eager, channels_last");
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for i in 0..steps {
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
        "eager (channels_last): {steps} steps in {eager_s:.1} s, final loss {last:.3}, test accuracy {:.1}%",
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
    let bar = progress(steps, "compiled, NCHW");
    let t0 = Instant::now();
    for _ in 0..steps {
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
        "compiled (NCHW): {steps} steps in {compiled_s:.1} s ({compile_s:.2} s to compile, {kernels} kernels; {:.1}x eager), final loss {last:.3}, test accuracy {:.1}%",
        eager_s / compiled_s,
        100.0 * compiled_acc
    );
    export(&mut model, &test_x, &test_y)?;
    for (what, acc) in [("eager", eager_acc), ("compiled", compiled_acc)] {
        if acc < TARGET && steps >= STEPS {
            return Err(smelt::Error::Value(format!(
                "{what}: test accuracy {:.1}% is under the {:.0}% target",
                100.0 * acc,
                100.0 * TARGET
            )));
        }
    }
    match steps >= STEPS {
        true => println!("both reach the {:.0}% target", 100.0 * TARGET),
        false => println!("(the accuracy target applies from {STEPS} steps on)"),
    }
    Ok(())
}

/// Writes the compiled model's inference graph on the first 200 held-out images, the images,
/// their labels and the JIT's logits (`smelt run`, checked against the model's) to
/// `$TMPDIR/smelt-resnet`.
fn export(model: &mut ResNet, test_x: &Tensor, test_y: &Tensor) -> Result<()> {
    let dir = std::env::temp_dir().join("smelt-resnet");
    model.eval();
    let x = test_x.narrow(0, 0, 200)?.contiguous()?;
    let graph = export::inference_graph(model, &x)?;
    let (jit, graph_path) = export::run_exported(&dir, "resnet", &graph, (&x, "images.npy"))?;
    let labels = test_y.narrow(0, 0, 200)?.contiguous()?;
    smelt::runtime::npy::write_npy(dir.join("labels.npy"), &labels)?;
    let eager = {
        let _off = no_grad();
        model.forward(&x)?
    };
    model.train(true);
    let diff = jit.sub(&eager)?.abs()?.amax()?.item_f64()?;
    println!(
        "wrote {}: smelt run on it gives the model's logits within {diff:.1e}",
        graph_path.display()
    );
    if diff > 1e-4 {
        return Err(smelt::Error::Value(format!(
            "smelt run disagrees with the model by {diff}"
        )));
    }
    Ok(())
}
