//! The small ResNet of `examples/resnet.rs` and its procedurally drawn images, shared by
//! the example, `benches/models.rs` and `tests/torch_models.rs`.

#![allow(dead_code)] // each user takes what it needs

use smelt::nn::{self, BatchNorm2d, Conv2d, Dropout, Linear, Module};
use smelt::runtime::ConvOptions;
use smelt::{Generator, Result, Tensor};

/// Image side.
pub const SIZE: usize = 16;
/// Shape classes.
pub const CLASSES: usize = 4;
/// Images per batch.
pub const BATCH: usize = 64;

/// One noisy image of class `c`: a shape of random centre and size, plus Gaussian noise.
pub fn draw(c: usize, g: &mut Generator) -> Result<Vec<f32>> {
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
pub fn images(n: usize, g: &mut Generator) -> Result<(Tensor, Tensor)> {
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
pub struct Block {
    c1: Conv2d,
    b1: BatchNorm2d,
    c2: Conv2d,
    b2: BatchNorm2d,
    proj: Option<(Conv2d, BatchNorm2d)>,
}

impl Block {
    pub fn new(cin: usize, cout: usize, stride: i64) -> Result<Block> {
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
pub struct ResNet {
    stem: Conv2d,
    bn: BatchNorm2d,
    blocks: [Block; 2],
    drop: Dropout,
    head: Linear,
}

impl ResNet {
    pub fn new() -> Result<ResNet> {
        ResNet::with_dropout(0.1)
    }

    /// The network with dropout of probability `p` before the head (0 for comparisons
    /// with another library, whose random masks differ).
    pub fn with_dropout(p: f64) -> Result<ResNet> {
        Ok(ResNet {
            stem: Conv2d::new(1, 16, [3, 3], ConvOptions::default().padding(1), 1, false)?,
            bn: BatchNorm2d::new_2d(16)?,
            blocks: [Block::new(16, 16, 1)?, Block::new(16, 32, 2)?],
            drop: Dropout::new(p)?,
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

/// Cross-entropy of the model on a batch.
pub fn loss(model: &ResNet, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    nn::functional::cross_entropy(&model.forward(x)?, y)
}

/// Fixed initial weights (dropout off) and `steps` fixed batches, written as `.npy` files
/// to `dir` for `scripts/torch_models.py` (`resnet.param.NAME.npy`, `resnet.x{i}.npy`,
/// `resnet.y{i}.npy`). The running statistics start as PyTorch's do (zeros and ones).
pub fn export_start(
    dir: &std::path::Path,
    steps: usize,
) -> Result<(ResNet, Vec<(Tensor, Tensor)>)> {
    use smelt::runtime::npy::write_npy;
    std::fs::create_dir_all(dir).map_err(|e| smelt::Error::Io(e.to_string()))?;
    smelt::manual_seed(0);
    let model = ResNet::with_dropout(0.0)?;
    for (name, t) in model.named_parameters() {
        write_npy(dir.join(format!("resnet.param.{name}.npy")), &t)?;
    }
    let mut g = Generator::new(7);
    let mut batches = Vec::with_capacity(steps);
    for i in 0..steps {
        let (x, y) = images(BATCH, &mut g)?;
        write_npy(dir.join(format!("resnet.x{i}.npy")), &x)?;
        write_npy(dir.join(format!("resnet.y{i}.npy")), &y)?;
        batches.push((x, y));
    }
    Ok((model, batches))
}

/// The SGD (momentum 0.9, lr 0.05) configuration the comparisons train with.
pub fn sgd() -> smelt::optim::SGDConfig {
    smelt::optim::SGDConfig {
        momentum: 0.9,
        ..smelt::optim::SGDConfig::new(0.05)
    }
}

/// One compiled SGD step of `model` (forward, backward and update; the running statistics
/// move as in PyTorch's training mode).
pub fn compiled_sgd_step<'a>(
    model: &'a ResNet,
    example: &(Tensor, Tensor),
) -> Result<smelt::train::CompiledStep<'a>> {
    smelt::train::CompiledStep::with_buffers(
        move |b: &[Tensor]| loss(model, &b[0], &b[1]),
        &[example.0.clone(), example.1.clone()],
        model.named_parameters(),
        model.named_buffers(),
        smelt::train::StepConfig::sgd(sgd()),
        &smelt::exec::CompileOptions::default(),
    )
}
