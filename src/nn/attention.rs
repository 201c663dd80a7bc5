//! `nn.MultiheadAttention` (batch first): input projections, attention per head with the
//! fused `scaled_dot_product_attention`, output projection.

use crate::nn::init;
use crate::nn::{Linear, Module};
use crate::runtime::Tensor;
use crate::{DType, Result, bail};

/// Multi-head attention over `[batch, seq, embed_dim]` inputs (`nn.MultiheadAttention`
/// with `batch_first=True`, no dropout). Parameters as PyTorch names them:
/// `in_proj_weight` `[3E, E]`, `in_proj_bias` `[3E]`, `out_proj.weight`, `out_proj.bias`.
pub struct MultiheadAttention {
    /// The model width E.
    pub embed_dim: usize,
    /// Heads; each has E / heads features.
    pub num_heads: usize,
    /// The stacked query, key and value projections, `[3E, E]`.
    pub in_proj_weight: Tensor,
    /// Their biases, `[3E]`.
    pub in_proj_bias: Tensor,
    /// The output projection.
    pub out_proj: Linear,
    /// Whether `forward` attends causally (each position to itself and earlier ones).
    pub causal: bool,
    training: bool,
}

impl MultiheadAttention {
    /// A layer initialised as PyTorch does: `xavier_uniform_` input projections, zero
    /// biases, the output projection as a `Linear`'s weight.
    pub fn new(embed_dim: usize, num_heads: usize) -> Result<MultiheadAttention> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            bail!(Value, "embed_dim must be divisible by num_heads");
        }
        let w = Tensor::zeros(&[3 * embed_dim, embed_dim], DType::F32);
        init::xavier_uniform_(&w, 1.0)?;
        w.requires_grad_(true)?;
        let b = Tensor::zeros(&[3 * embed_dim], DType::F32);
        b.requires_grad_(true)?;
        let out_proj = Linear::new(embed_dim, embed_dim, true)?;
        if let Some(ob) = &out_proj.bias {
            init::zeros_(ob)?;
        }
        Ok(MultiheadAttention {
            embed_dim,
            num_heads,
            in_proj_weight: w,
            in_proj_bias: b,
            out_proj,
            causal: false,
            training: true,
        })
    }

    /// The same layer, attending causally in `forward` (a decoder's self-attention).
    pub fn causal(mut self, on: bool) -> MultiheadAttention {
        self.causal = on;
        self
    }

    /// `[B, T, E]` → `[B, heads, T, E / heads]`.
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        let s = x.shape();
        let (b, t) = (s[0] as i64, s[1] as i64);
        let h = self.num_heads as i64;
        x.reshape(&[b, t, h, self.embed_dim as i64 / h])?
            .transpose(1, 2)
    }

    /// Attention of `query` `[B, L, E]` over `key`, `value` `[B, S, E]`. `attn_mask`
    /// follows `nn.MultiheadAttention`: `[L, S]` or `[B·heads, L, S]`, bool with true
    /// where attention is *not* allowed, or float, added to the scores. `is_causal` adds
    /// the causal mask.
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        for (name, t) in [("query", query), ("key", key), ("value", value)] {
            if t.dim() != 3 || t.shape()[2] != self.embed_dim {
                bail!(
                    Shape,
                    "MultiheadAttention: {name} must be [batch, seq, {}], got {:?}",
                    self.embed_dim,
                    t.shape()
                );
            }
        }
        let e = self.embed_dim as i64;
        let w = &self.in_proj_weight;
        let b = &self.in_proj_bias;
        let proj = |x: &Tensor, i: i64| -> Result<Tensor> {
            x.linear(&w.narrow(0, i * e, e)?, Some(&b.narrow(0, i * e, e)?))
        };
        let (q, k, v) = (
            self.heads(&proj(query, 0)?)?,
            self.heads(&proj(key, 1)?)?,
            self.heads(&proj(value, 2)?)?,
        );
        // SDPA's bool masks keep where true: the opposite of this layer's
        let mask = match attn_mask {
            Some(m) if m.dtype().is_bool() => Some(m.logical_not()?),
            Some(m) => Some(m.clone()),
            None => None,
        };
        let mask = match mask {
            Some(m) if m.dim() == 3 => {
                let s = m.shape();
                let h = self.num_heads as i64;
                Some(m.reshape(&[s[0] as i64 / h, h, s[1] as i64, s[2] as i64])?)
            }
            m => m,
        };
        let o = q.scaled_dot_product_attention(&k, &v, mask.as_ref(), is_causal, None)?;
        let (bs, l) = (query.shape()[0] as i64, query.shape()[1] as i64);
        let o = o.transpose(1, 2)?.reshape(&[bs, l, e])?;
        self.out_proj.forward(&o)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention of `x` `[B, T, E]` (causal when the layer is).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.attend(x, x, x, None, self.causal)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![
            ("in_proj_weight".to_string(), self.in_proj_weight.clone()),
            ("in_proj_bias".to_string(), self.in_proj_bias.clone()),
        ];
        for (n, p) in self.out_proj.named_parameters() {
            v.push((format!("out_proj.{n}"), p));
        }
        v
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.out_proj.train(mode);
    }
    fn is_training(&self) -> bool {
        self.training
    }
}
