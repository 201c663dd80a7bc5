//! Data loading (`torch.utils.data`): datasets, batching with seeded shuffling, and worker
//! threads that prepare batches ahead of the training loop.
//!
//! A sample is a `Vec<Tensor>` (the fields of one example, e.g. input and label); a batch
//! stacks each field of `batch_size` samples along a new leading dim.

mod loader;
mod prefetch;
mod sampler;

pub use loader::{Batches, DataLoader};
pub use prefetch::{BackgroundGenerator, Prefetch};
pub use sampler::DistributedSampler;

use crate::runtime::Tensor;
use crate::{Result, bail};

/// A map-style dataset: `len` samples, each fetched by index.
pub trait Dataset: Send + Sync {
    /// The number of samples.
    fn len(&self) -> usize;

    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fields of sample `index` (`0 <= index < len`).
    fn get(&self, index: usize) -> Result<Vec<Tensor>>;
}

/// Samples that are the rows of tensors sharing their first dim (`TensorDataset`).
#[derive(Clone)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
}

impl TensorDataset {
    /// A dataset whose sample `i` is `[t[i] for t in tensors]`.
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let Some(first) = tensors.first() else {
            bail!(Value, "TensorDataset needs at least one tensor");
        };
        if tensors.iter().any(|t| t.dim() == 0) {
            bail!(
                Shape,
                "TensorDataset: every tensor needs a first dim to index"
            );
        }
        let n = first.shape()[0];
        if tensors.iter().any(|t| t.shape()[0] != n) {
            bail!(Shape, "Size mismatch between tensors");
        }
        Ok(TensorDataset { tensors })
    }

    /// The underlying tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.tensors[0].shape()[0]
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index >= self.len() {
            bail!(
                Index,
                "index {index} is out of bounds for dimension 0 with size {}",
                self.len()
            );
        }
        self.tensors
            .iter()
            .map(|t| t.select(0, index as i64))
            .collect()
    }
}

/// Stacks the samples field by field (`default_collate`): field `k` of the batch is
/// `stack([s[k] for s in samples])`.
pub fn collate(samples: &[Vec<Tensor>]) -> Result<Vec<Tensor>> {
    let Some(first) = samples.first() else {
        bail!(Value, "collate: a batch needs at least one sample");
    };
    let fields = first.len();
    if samples.iter().any(|s| s.len() != fields) {
        bail!(
            Value,
            "each element in list of batch should be of equal size"
        );
    }
    (0..fields)
        .map(|k| {
            let column: Vec<&Tensor> = samples.iter().map(|s| &s[k]).collect();
            Tensor::stack(&column, 0)
        })
        .collect()
}
