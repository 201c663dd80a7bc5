//! Layers with parameters (`Linear`, `LayerNorm`, `Embedding`), `Dropout` and `Sequential`.

use crate::nn::init::{self, FanMode, Nonlinearity};
use crate::nn::module::stateless_module;
use crate::nn::{Module, functional};
use crate::runtime::Tensor;
use crate::runtime::random::Generator;
use crate::{DType, Result, bail};
use std::sync::Mutex;

/// A new f32 parameter of `shape` that requires grad.
fn parameter(shape: &[usize]) -> Result<Tensor> {
    let p = Tensor::zeros(shape, DType::F32);
    p.requires_grad_(true)?;
    Ok(p)
}

/// `y = x · Wᵀ + b` (`nn.Linear`); `weight` is `[out_features, in_features]`.
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, when the layer has a bias.
    pub bias: Option<Tensor>,
    training: bool,
}

impl Linear {
    /// A layer initialised as PyTorch does: `kaiming_uniform_(W, a=√5)`, which is
    /// U(-1/√in, 1/√in), and the bias from the same range.
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = parameter(&[out_features, in_features])?;
        init::kaiming_uniform_(
            &weight,
            5f64.sqrt(),
            FanMode::FanIn,
            Nonlinearity::LeakyRelu(0.0),
        )?;
        let bias = if bias {
            let b = parameter(&[out_features])?;
            let bound = if in_features > 0 {
                1.0 / (in_features as f64).sqrt()
            } else {
                0.0
            };
            init::uniform_(&b, -bound, bound)?;
            Some(b)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            training: true,
        })
    }

    /// A layer over existing tensors (`weight` `[out, in]`, `bias` `[out]`).
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        if weight.dim() != 2 {
            bail!(
                Shape,
                "Linear: weight must be 2-D, got {:?}",
                weight.shape()
            );
        }
        if let Some(b) = &bias
            && b.shape() != [weight.shape()[0]]
        {
            bail!(
                Shape,
                "Linear: bias of shape {:?} does not match {} output features",
                b.shape(),
                weight.shape()[0]
            );
        }
        Ok(Linear {
            weight,
            bias,
            training: true,
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
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

/// Layer normalisation over the trailing `normalized_shape` dims (`nn.LayerNorm`).
pub struct LayerNorm {
    /// The trailing sizes normalised over.
    pub normalized_shape: Vec<usize>,
    /// Added to the variance for numerical stability (PyTorch: `1e-5`).
    pub eps: f64,
    /// Ones at creation; present when `elementwise_affine`.
    pub weight: Option<Tensor>,
    /// Zeros at creation; present when `elementwise_affine`.
    pub bias: Option<Tensor>,
    training: bool,
}

impl LayerNorm {
    /// A layer with weight 1 and bias 0 when `elementwise_affine` (PyTorch's eps is 1e-5).
    pub fn new(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> Result<LayerNorm> {
        let (weight, bias) = if elementwise_affine {
            let w = parameter(normalized_shape)?;
            init::ones_(&w)?;
            (Some(w), Some(parameter(normalized_shape)?))
        } else {
            (None, None)
        };
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight,
            bias,
            training: true,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        if let Some(w) = &self.weight {
            v.push(("weight".to_string(), w.clone()));
        }
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
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

/// A lookup table of `num_embeddings` vectors of size `embedding_dim` (`nn.Embedding`);
/// `forward` takes an integer index tensor.
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`: row `i` is the vector of index `i`.
    pub weight: Tensor,
    training: bool,
}

impl Embedding {
    /// A table initialised from N(0, 1), as PyTorch does.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Result<Embedding> {
        let weight = parameter(&[num_embeddings, embedding_dim])?;
        init::normal_(&weight, 0.0, 1.0)?;
        Ok(Embedding {
            weight,
            training: true,
        })
    }

    /// A table over an existing 2-D `weight` (`nn.Embedding.from_pretrained`).
    pub fn from_pretrained(weight: Tensor) -> Result<Embedding> {
        if weight.dim() != 2 {
            bail!(
                Shape,
                "Embeddings parameter is expected to be 2-dimensional"
            );
        }
        Ok(Embedding {
            weight,
            training: true,
        })
    }
}

impl Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        Tensor::embedding(indices, &self.weight)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
    }
    fn is_training(&self) -> bool {
        self.training
    }
}

/// Zeroes each element with probability `p` in training mode and scales the rest by
/// `1/(1-p)`; the identity in evaluation mode (`nn.Dropout`).
pub struct Dropout {
    /// Probability of zeroing an element.
    pub p: f64,
    /// Draws masks from this generator when set, else from the global one.
    generator: Option<Mutex<Generator>>,
    training: bool,
}

impl Dropout {
    /// Dropout drawing its masks from the global generator (`smelt::manual_seed`).
    pub fn new(p: f64) -> Result<Dropout> {
        functional::check_dropout_p(p)?;
        Ok(Dropout {
            p,
            generator: None,
            training: true,
        })
    }

    /// Dropout drawing its masks from its own generator.
    pub fn with_generator(p: f64, generator: Generator) -> Result<Dropout> {
        functional::check_dropout_p(p)?;
        Ok(Dropout {
            p,
            generator: Some(Mutex::new(generator)),
            training: true,
        })
    }
}

stateless_module!(Dropout, |s, x| match &s.generator {
    Some(g) => {
        let mut g = g.lock().unwrap_or_else(|e| e.into_inner());
        functional::dropout_with(x, s.p, s.training, &mut g)
    }
    None => functional::dropout(x, s.p, s.training),
});

/// Modules applied one after another (`nn.Sequential`); parameters are named by position
/// (`0.weight`, `2.bias`).
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
    training: bool,
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Sequential {
    /// An empty sequence (the identity).
    pub fn new() -> Sequential {
        Sequential {
            layers: Vec::new(),
            training: true,
        }
    }

    /// Appends a module (builder style).
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends a module.
    pub fn push(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are no modules.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The `i`-th module.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|m| &**m)
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h)?;
        }
        Ok(h)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                m.named_parameters()
                    .into_iter()
                    .map(move |(name, p)| (format!("{i}.{name}"), p))
            })
            .collect()
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                m.named_buffers()
                    .into_iter()
                    .map(move |(name, p)| (format!("{i}.{name}"), p))
            })
            .collect()
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        for layer in &mut self.layers {
            layer.train(mode);
        }
    }
    fn is_training(&self) -> bool {
        self.training
    }
}
