//! The GPT of `examples/gpt.rs` (and of `benches/models.rs`): its vocabulary, data and
//! model, shared so that the example, the benchmark and the PyTorch comparison
//! (`scripts/torch_models.py`) train the same thing.

#![allow(dead_code)] // each user takes what it needs

use smelt::nn::functional::cross_entropy;
use smelt::nn::{Embedding, GELU, LayerNorm, Linear, Module, MultiheadAttention};
use smelt::{DType, Generator, Result, Tensor};

pub const VOCAB: &[u8] = b"0123456789+=;";
pub const CTX: usize = 32;
pub const WIDTH: usize = 96;
pub const HEADS: usize = 4;
pub const LAYERS: usize = 2;
pub const BATCH: usize = 32;

pub fn token(c: u8) -> i64 {
    VOCAB.iter().position(|&v| v == c).map_or(0, |p| p as i64)
}

/// `a+b=s;` for two numbers below 100.
pub fn problem(g: &mut Generator) -> Result<(u32, u32)> {
    let r = Tensor::randint_with(0, 100, &[2], None, g)?.to_i64_vec();
    Ok((r[0] as u32, r[1] as u32))
}

/// A batch of windows of CTX + 1 tokens from a stream of problems: inputs and the next
/// tokens to predict.
pub fn batch(g: &mut Generator) -> Result<(Tensor, Tensor)> {
    let mut xs = Vec::with_capacity(BATCH * CTX);
    let mut ys = Vec::with_capacity(BATCH * CTX);
    for _ in 0..BATCH {
        let mut text = String::new();
        while text.len() < 3 * CTX {
            let (a, b) = problem(g)?;
            text.push_str(&format!("{a}+{b}={};", a + b));
        }
        let start = Tensor::randint_with(0, 2 * CTX as i64, &[1], None, g)?.to_i64_vec()[0];
        let toks: Vec<i64> = text.bytes().map(token).collect();
        let w = &toks[start as usize..start as usize + CTX + 1];
        xs.extend_from_slice(&w[..CTX]);
        ys.extend_from_slice(&w[1..]);
    }
    Ok((
        Tensor::from_vec(xs, &[BATCH, CTX])?,
        Tensor::from_vec(ys, &[BATCH, CTX])?,
    ))
}

/// One pre-norm block.
pub struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    fc: Linear,
    proj: Linear,
}

/// Token and position embeddings, pre-norm blocks, a final norm, tied output.
pub struct Gpt {
    tok: Embedding,
    pos: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    training: bool,
}

impl Gpt {
    /// A model initialised as GPT-2 does its embeddings (normal, std 0.02), the rest as
    /// PyTorch's layers are.
    pub fn new() -> Result<Gpt> {
        let tok = Embedding::new(VOCAB.len(), WIDTH)?;
        smelt::nn::init::normal_(&tok.weight, 0.0, 0.02)?;
        let pos = Tensor::zeros(&[CTX, WIDTH], DType::F32);
        smelt::nn::init::normal_(&pos, 0.0, 0.02)?;
        pos.requires_grad_(true)?;
        let blocks = (0..LAYERS)
            .map(|_| {
                Ok(Block {
                    ln1: LayerNorm::new(&[WIDTH], 1e-5, true)?,
                    attn: MultiheadAttention::new(WIDTH, HEADS)?.causal(true),
                    ln2: LayerNorm::new(&[WIDTH], 1e-5, true)?,
                    fc: Linear::new(WIDTH, 4 * WIDTH, true)?,
                    proj: Linear::new(4 * WIDTH, WIDTH, true)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Gpt {
            tok,
            pos,
            blocks,
            ln_f: LayerNorm::new(&[WIDTH], 1e-5, true)?,
            training: true,
        })
    }
}

impl Module for Gpt {
    /// Token ids `[B, T]` (T at most CTX) → logits `[B, T, vocab]`.
    fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let t = idx.shape()[1] as i64;
        let mut x = self.tok.forward(idx)?.add(&self.pos.narrow(0, 0, t)?)?;
        let gelu = GELU::new();
        for b in &self.blocks {
            x = x.add(&b.attn.forward(&b.ln1.forward(&x)?)?)?;
            let h = gelu.forward(&b.fc.forward(&b.ln2.forward(&x)?)?)?;
            x = x.add(&b.proj.forward(&h)?)?;
        }
        // the output projection is the token embedding, transposed
        self.ln_f.forward(&x)?.matmul(&self.tok.weight.t()?)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![
            ("tok.weight".to_string(), self.tok.weight.clone()),
            ("pos".to_string(), self.pos.clone()),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            let parts: [(&str, &dyn Module); 5] = [
                ("ln1", &b.ln1),
                ("attn", &b.attn),
                ("ln2", &b.ln2),
                ("fc", &b.fc),
                ("proj", &b.proj),
            ];
            for (name, m) in parts {
                for (n, p) in m.named_parameters() {
                    v.push((format!("blocks.{i}.{name}.{n}"), p));
                }
            }
        }
        for (n, p) in self.ln_f.named_parameters() {
            v.push((format!("ln_f.{n}"), p));
        }
        v
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
    fn is_training(&self) -> bool {
        self.training
    }
}

pub fn loss(model: &Gpt, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let logits = model.forward(x)?;
    let n = (BATCH * CTX) as i64;
    cross_entropy(
        &logits.reshape(&[n, VOCAB.len() as i64])?,
        &y.reshape(&[n])?,
    )
}

/// A model (seed 0) and `steps` batches (data seed 1), both written to `dir` as `.npy`
/// files for `scripts/torch_models.py`: `param.NAME.npy`, `x{i}.npy`, `y{i}.npy`.
pub fn export_start(dir: &std::path::Path, steps: usize) -> Result<(Gpt, Vec<(Tensor, Tensor)>)> {
    use smelt::runtime::npy::write_npy;
    std::fs::create_dir_all(dir).map_err(|e| smelt::Error::Io(e.to_string()))?;
    smelt::manual_seed(0);
    let model = Gpt::new()?;
    for (name, p) in model.named_parameters() {
        write_npy(dir.join(format!("param.{name}.npy")), &p)?;
    }
    let mut data = Generator::new(1);
    let batches: Vec<(Tensor, Tensor)> = (0..steps)
        .map(|_| batch(&mut data))
        .collect::<Result<_>>()?;
    for (i, (x, y)) in batches.iter().enumerate() {
        write_npy(dir.join(format!("x{i}.npy")), x)?;
        write_npy(dir.join(format!("y{i}.npy")), y)?;
    }
    Ok((model, batches))
}

/// The AdamW step both sides train with (lr 3e-3, PyTorch's other defaults, clipping at
/// 1.0), compiled for `model`.
pub fn compiled_adamw_step<'a>(
    model: &'a Gpt,
    example: &(Tensor, Tensor),
) -> Result<smelt::train::CompiledStep<'a>> {
    smelt::train::CompiledStep::with_config(
        move |b: &[Tensor]| loss(model, &b[0], &b[1]),
        &[example.0.clone(), example.1.clone()],
        model.named_parameters(),
        smelt::train::StepConfig::adamw(smelt::optim::AdamConfig::new(3e-3)).clip_grad_norm(1.0),
        &smelt::exec::CompileOptions::default(),
    )
}
