//! `DataLoader`: batches of a dataset, shuffled by a seeded generator, optionally prepared
//! by worker threads ahead of the consumer.

use super::{Dataset, DistributedSampler, collate};
use crate::runtime::Tensor;
use crate::runtime::random::Generator;
use crate::{DType, Error, Result, bail};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// Iterates a dataset in batches (`torch.utils.data.DataLoader`).
///
/// Each call to `iter` is one epoch. With `shuffle`, every epoch draws a new permutation
/// from the loader's generator, so a given seed gives the same sequence of epochs. With
/// `num_workers > 0`, that many threads build batches (fetch and stack) while the consumer
/// works, each at most `prefetch_factor` batches ahead; batches still arrive in the order
/// `num_workers = 0` gives.
pub struct DataLoader<D: Dataset + 'static> {
    dataset: Arc<D>,
    batch_size: usize,
    shuffle: bool,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    pin_memory: bool,
    generator: Generator,
    sampler: Option<DistributedSampler>,
}

impl<D: Dataset + 'static> DataLoader<D> {
    /// A loader of `batch_size` samples per batch, in order, without workers.
    pub fn new(dataset: D, batch_size: usize) -> Result<DataLoader<D>> {
        if batch_size == 0 {
            bail!(
                Value,
                "batch_size should be a positive integer value, but got batch_size=0"
            );
        }
        Ok(DataLoader {
            dataset: Arc::new(dataset),
            batch_size,
            shuffle: false,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
            pin_memory: false,
            generator: Generator::default(),
            sampler: None,
        })
    }

    /// Shuffles every epoch with a generator seeded by `seed`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle = true;
        self.generator = Generator::new(seed);
        self
    }

    /// Takes its samples from `sampler` (this rank's shard) instead of the whole dataset;
    /// the sampler shuffles, so `shuffle` is then ignored, as PyTorch refuses both.
    pub fn sampler(mut self, sampler: DistributedSampler) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// Drops the last batch when it would be smaller than `batch_size`.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Builds batches on `n` worker threads (0: on the consumer's thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }

    /// How many batches each worker may prepare ahead (at least 1; default 2).
    pub fn prefetch_factor(mut self, n: usize) -> Self {
        self.prefetch_factor = n.max(1);
        self
    }

    /// Puts every batch in page-locked host memory, so that moving it to a GPU needs no
    /// staging copy. Without a GPU the batches stay in ordinary memory, and the first epoch
    /// says so once on stderr (PyTorch warns the same way).
    pub fn pin_memory(mut self, on: bool) -> Self {
        self.pin_memory = on;
        self
    }

    /// Whether `pin_memory` was requested.
    pub fn is_pin_memory(&self) -> bool {
        self.pin_memory
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The number of batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// True when an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sample order of the next epoch (advances the generator when shuffling).
    fn order(&mut self) -> Result<Vec<usize>> {
        let n = self.dataset.len();
        if let Some(s) = &self.sampler {
            if s.dataset_len() != n {
                bail!(
                    Value,
                    "DistributedSampler was made for {} samples, but the dataset has {n}",
                    s.dataset_len()
                );
            }
            return s.indices();
        }
        if self.shuffle {
            permutation(n, &mut self.generator)
        } else {
            Ok((0..n).collect())
        }
    }

    /// One epoch of batches.
    pub fn iter(&mut self) -> Result<Batches> {
        let order = self.order()?;
        let mut plan: Vec<Vec<usize>> = order
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        if self.drop_last && plan.last().is_some_and(|b| b.len() < self.batch_size) {
            plan.pop();
        }
        let dataset: Arc<dyn Dataset> = self.dataset.clone();
        let pin = self.pin_memory && pinning_available();
        if self.num_workers == 0 {
            return Ok(Batches {
                total: plan.len(),
                next: 0,
                source: Source::Inline { dataset, plan, pin },
            });
        }
        let workers = self.num_workers.min(plan.len()).max(1);
        let plan = Arc::new(plan);
        let mut receivers = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel(self.prefetch_factor);
            let dataset = dataset.clone();
            let plan = plan.clone();
            let handle = std::thread::Builder::new()
                .name(format!("smelt-data-{w}"))
                .spawn(move || {
                    for batch in plan.iter().skip(w).step_by(workers) {
                        if tx.send(load_batch(&*dataset, batch, pin)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::Io(format!("DataLoader: cannot start a worker: {e}")))?;
            receivers.push(rx);
            handles.push(handle);
        }
        Ok(Batches {
            total: plan.len(),
            next: 0,
            source: Source::Workers { receivers, handles },
        })
    }
}

/// A random order of `0..n` drawn from `generator` (Fisher-Yates on uniform draws).
pub(crate) fn permutation(n: usize, generator: &mut Generator) -> Result<Vec<usize>> {
    let mut order: Vec<usize> = (0..n).collect();
    if n > 1 {
        let u = Tensor::rand_with(&[n], Some(DType::F64), generator)?.to_vec::<f64>()?;
        for i in (1..n).rev() {
            let j = ((u[i] * (i + 1) as f64) as usize).min(i);
            order.swap(i, j);
        }
    }
    Ok(order)
}

/// Whether batches can be pinned here; says once why not when they cannot.
fn pinning_available() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if crate::runtime::cuda::is_available() {
        return true;
    }
    WARNED.call_once(|| {
        eprintln!(
            "warning: 'pin_memory' is set but no GPU is available, so the batches stay in ordinary memory"
        )
    });
    false
}

fn load_batch(dataset: &dyn Dataset, indices: &[usize], pin: bool) -> Result<Vec<Tensor>> {
    let samples = indices
        .iter()
        .map(|&i| dataset.get(i))
        .collect::<Result<Vec<_>>>()?;
    let batch = collate(&samples)?;
    if pin {
        return batch.iter().map(Tensor::pin_memory).collect();
    }
    Ok(batch)
}

enum Source {
    Inline {
        dataset: Arc<dyn Dataset>,
        plan: Vec<Vec<usize>>,
        pin: bool,
    },
    Workers {
        /// Batch `i` comes from worker `i % receivers.len()`.
        receivers: Vec<Receiver<Result<Vec<Tensor>>>>,
        handles: Vec<JoinHandle<()>>,
    },
}

/// One epoch of batches; each item is the stacked fields of a batch, or the error fetching
/// it raised.
pub struct Batches {
    source: Source,
    next: usize,
    total: usize,
}

impl Iterator for Batches {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some(match &self.source {
            Source::Inline { dataset, plan, pin } => load_batch(&**dataset, &plan[i], *pin),
            Source::Workers { receivers, .. } => {
                receivers[i % receivers.len()].recv().unwrap_or_else(|_| {
                    // The worker is gone (it panicked): nothing more will come.
                    self.next = self.total;
                    Err(Error::Value(
                        "DataLoader worker exited unexpectedly".to_string(),
                    ))
                })
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.total - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Batches {}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Source::Workers { receivers, handles } = &mut self.source {
            // Closing the channels makes blocked workers return.
            receivers.clear();
            for h in handles.drain(..) {
                let _ = h.join();
            }
        }
    }
}
