//! A small ResNet (a conv-bn-relu stem, two basic blocks with residual adds — the second
//! downsampling through a strided 1×1 projection — global average pooling, dropout and a
//! linear head) that learns to tell four kinds of shapes apart in noisy 16×16 images it
//! draws itself: discs, squares, crosses and rings, at random places and sizes.
//!
//! It trains once eagerly on channels_last images (autograd, SGD with momentum), and once
//! as one compiled step per batch on NCHW images (`CompiledStep`), each with a progress
//! bar, switching batch norm and dropout to evaluation mode to measure the accuracy on
//! held-out images. A compiled step keeps no running statistics (the graph computes the
//! normalised values only), so before evaluating the compiled model its batch norms are
//! re-estimated with a few forward passes in training mode, as PyTorch's
//! `torch.optim.swa_utils.update_bn` does.
//!
//! `cargo run --release --example resnet` (well under a minute on two cores).

use smelt::autograd::no_grad;
use smelt::exec::CompileOptions;
use smelt::nn::{self, BatchNorm2d, Conv2d, Dropout, Linear, Module};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::runtime::{ConvOptions, MemoryFormat};
use smelt::train::{CompiledStep, LrSchedule, StepConfig};
use smelt::{Generator, Result, Tensor};
use std::time::Instant;

#[path = "common/progress.rs"]
mod progress;
use progress::progress;

const SIZE: usize = 16;
const CLASSES: usize = 4;
const BATCH: usize = 64;
const STEPS: usize = 250;
const TARGET: f64 = 0.95;

/// One noisy image of class `c`: a shape of random centre and size, plus Gaussian noise.
fn draw(c: usize, g: &mut Generator) -> Result<Vec<f32>> {
    let u = |g: &mut Generator| Tensor::rand_with(&[1], None, g).and_then(|t| t.item::<f32>());
    let (cx, cy) = (4.0 + 8.0 * u(g)?, 4.0 + 8.0 * u(g)?);
    let r = 2.5 + 2.0 * u(g)?;
    let noise = Tensor::randn_with(&[SIZE * SIZE], None, g)?.to_vec::<f32>()?;
    let mut img = vec![0.0f32; SIZE * SIZE];
    for y in 0..SIZE {
        for x in 0..SIZE {
            let (dx, dy) = (x as f32 - cx, y as f32 - cy);
            let d = (dx * dx + dy * dy).sqrt();
            let on = match c {
                0 => d <= r,                                               // disc
                1 => dx.abs() <= r && dy.abs() <= r,                       // square
                2 => (dx.abs() <= 1.0 || dy.abs() <= 1.0) && d <= r + 1.0, // cross
                _ => (d - r).abs() <= 0.8,                                 // ring
            };
            img[y * SIZE + x] = if on { 1.0 } else { 0.0 } + 0.3 * noise[y * SIZE + x];
        }
    }
    Ok(img)
}

/// `n` images `[n, 1, SIZE, SIZE]` and their labels.
fn images(n: usize, g: &mut Generator) -> Result<(Tensor, Tensor)> {
    let mut data = Vec::with_capacity(n * SIZE * SIZE);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let c = i % CLASSES;
        data.extend(draw(c, g)?);
        labels.push(c as i64);
    }
    Ok((
        Tensor::from_vec(data, &[n, 1, SIZE, SIZE])?,
        Tensor::from_vec(labels, &[n])?,
    ))
}

/// conv3x3-bn-relu-conv3x3-bn, plus the input (projected when the shape changes), relu.
struct Block {
    c1: Conv2d,
    b1: BatchNorm2d,
    c2: Conv2d,
    b2: BatchNorm2d,
    proj: Option<(Conv2d, BatchNorm2d)>,
}

impl Block {
    fn new(cin: usize, cout: usize, stride: i64) -> Result<Block> {
        let o = ConvOptions::default().padding(1);
        let proj = if cin != cout || stride != 1 {
            Some((
                Conv2d::new(
                    cin,
                    cout,
                    [1, 1],
                    ConvOptions::default().stride(stride),
                    1,
                    false,
                )?,
                BatchNorm2d::new_2d(cout)?,
            ))
        } else {
            None
        };
        Ok(Block {
            c1: Conv2d::new(cin, cout, [3, 3], o.clone().stride(stride), 1, false)?,
            b1: BatchNorm2d::new_2d(cout)?,
            c2: Conv2d::new(cout, cout, [3, 3], o, 1, false)?,
            b2: BatchNorm2d::new_2d(cout)?,
            proj,
        })
    }

    fn parts(&self) -> Vec<(&str, &dyn Module)> {
        let mut v: Vec<(&str, &dyn Module)> = vec![
            ("conv1", &self.c1),
            ("bn1", &self.b1),
            ("conv2", &self.c2),
            ("bn2", &self.b2),
        ];
        if let Some((c, b)) = &self.proj {
            v.push(("proj.0", c));
            v.push(("proj.1", b));
        }
        v
    }
}

fn prefixed(prefix: &str, v: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    v.into_iter()
        .map(|(n, t)| (format!("{prefix}.{n}"), t))
        .collect()
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.b1.forward(&self.c1.forward(x)?)?.relu()?;
        let h = self.b2.forward(&self.c2.forward(&h)?)?;
        let skip = match &self.proj {
            Some((c, b)) => b.forward(&c.forward(x)?)?,
            None => x.clone(),
        };
        h.add(&skip)?.relu()
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.parts()
            .into_iter()
            .flat_map(|(n, m)| prefixed(n, m.named_parameters()))
            .collect()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.parts()
            .into_iter()
            .flat_map(|(n, m)| prefixed(n, m.named_buffers()))
            .collect()
    }
    fn train(&mut self, mode: bool) {
        for m in [&mut self.b1, &mut self.b2] {
            m.train(mode);
        }
        self.c1.train(mode);
        self.c2.train(mode);
        if let Some((c, b)) = &mut self.proj {
            c.train(mode);
            b.train(mode);
        }
    }
    fn is_training(&self) -> bool {
        self.b1.is_training()
    }
}

/// stem → block(16) → block(16→32, stride 2) → global average pool → dropout → linear.
struct ResNet {
    stem: Conv2d,
    bn: BatchNorm2d,
    blocks: [Block; 2],
    drop: Dropout,
    head: Linear,
}

impl ResNet {
    fn new() -> Result<ResNet> {
        Ok(ResNet {
            stem: Conv2d::new(1, 16, [3, 3], ConvOptions::default().padding(1), 1, false)?,
            bn: BatchNorm2d::new_2d(16)?,
            blocks: [Block::new(16, 16, 1)?, Block::new(16, 32, 2)?],
            drop: Dropout::new(0.1)?,
            head: Linear::new(32, CLASSES, true)?,
        })
    }
}

impl Module for ResNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.bn.forward(&self.stem.forward(x)?)?.relu()?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        let h = h.adaptive_avg_pool2d(1usize)?.flatten(1, -1)?;
        self.head.forward(&self.drop.forward(&h)?)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("stem", self.stem.named_parameters());
        v.extend(prefixed("bn", self.bn.named_parameters()));
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(prefixed(&format!("blocks.{i}"), b.named_parameters()));
        }
        v.extend(prefixed("head", self.head.named_parameters()));
        v
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("bn", self.bn.named_buffers());
        for (i, b) in self.blocks.iter().enumerate() {
            v.extend(prefixed(&format!("blocks.{i}"), b.named_buffers()));
        }
        v
    }
    fn train(&mut self, mode: bool) {
        self.stem.train(mode);
        self.bn.train(mode);
        for b in &mut self.blocks {
            b.train(mode);
        }
        self.drop.train(mode);
        self.head.train(mode);
    }
    fn is_training(&self) -> bool {
        self.bn.is_training()
    }
}

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

fn loss(model: &ResNet, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    nn::functional::cross_entropy(&model.forward(x)?, y)
}

fn main() -> Result<()> {
    let mut data = Generator::new(1);
    let (test_x, test_y) = images(1000, &mut Generator::new(99))?;
    let sgd = SGDConfig {
        momentum: 0.9,
        ..SGDConfig::new(0.05)
    };
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
    let mut step = CompiledStep::with_config(
        |b: &[Tensor]| loss(&model, &b[0], &b[1]),
        &[x0, y0],
        model.named_parameters(),
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
    // the compiled step kept no running statistics: estimate them from 60 batches (what
    // is left of the statistics of the untrained model weighs 0.9^60 < 0.2%)
    {
        let _off = no_grad();
        for _ in 0..60 {
            model.forward(&images(BATCH, &mut data)?.0)?;
        }
    }
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
