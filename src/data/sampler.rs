//! `DistributedSampler`: each rank of a process group reads a disjoint shard of the
//! dataset, reshuffled every epoch with a seed all ranks share.

use super::loader::permutation;
use crate::runtime::random::Generator;
use crate::{Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The indices of one rank's shard (`torch.utils.data.DistributedSampler`).
///
/// Without `drop_last` the order is padded with its own first indices up to a multiple of
/// the number of replicas, so every rank gets the same number of samples; with it, the
/// tail that does not divide evenly is dropped. Clones share the epoch, so a clone kept
/// by the training loop can call [`DistributedSampler::set_epoch`] on the loader's copy.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: Arc<AtomicU64>,
}

impl DistributedSampler {
    /// The shard of rank `rank` out of `num_replicas` over a dataset of `len` samples;
    /// shuffled with seed 0, padded (PyTorch's defaults).
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            bail!(
                Value,
                "Invalid rank {rank}, rank should be in the interval [0, {}]",
                num_replicas as i64 - 1
            );
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: Arc::new(AtomicU64::new(0)),
        })
    }

    /// This process's shard, by the default process group's rank and world size.
    pub fn for_default_group(len: usize) -> Result<DistributedSampler> {
        let g = crate::distributed::default_group()?;
        Self::new(len, g.world_size(), g.rank())
    }

    /// Whether to shuffle (on by default).
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// The seed every rank must share.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Drops the tail that does not divide evenly instead of padding.
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// Sets the epoch, which with the seed decides the next order (`set_epoch`).
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }
    /// The dataset length it was made for.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// The number of samples of each rank's shard.
    pub fn num_samples(&self) -> usize {
        let (n, r) = (self.len, self.num_replicas);
        if self.drop_last && n % r != 0 {
            n.saturating_sub(r).div_ceil(r)
        } else {
            n.div_ceil(r)
        }
    }

    /// This rank's indices for the current epoch.
    pub fn indices(&self) -> Result<Vec<usize>> {
        let mut order = if self.shuffle {
            let seed = self.seed.wrapping_add(self.epoch.load(Ordering::Relaxed));
            permutation(self.len, &mut Generator::new(seed))?
        } else {
            (0..self.len).collect()
        };
        let total = self.num_samples() * self.num_replicas;
        if order.len() < total && !order.is_empty() {
            let mut k = 0;
            while order.len() < total {
                order.push(order[k]);
                k += 1;
            }
        }
        order.truncate(total);
        Ok(order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_cover_the_data_and_follow_the_epoch() {
        for (len, world, drop_last) in [
            (10, 3, false),
            (10, 3, true),
            (9, 3, false),
            (2, 4, false),
            (0, 2, false),
        ] {
            let shards: Vec<Vec<usize>> = (0..world)
                .map(|r| {
                    DistributedSampler::new(len, world, r)
                        .unwrap()
                        .seed(7)
                        .drop_last(drop_last)
                        .indices()
                        .unwrap()
                })
                .collect();
            let n = shards[0].len();
            assert!(shards.iter().all(|s| s.len() == n), "{len} {world}");
            let mut all: Vec<usize> = shards.concat();
            if drop_last {
                assert_eq!(n, len / world);
                let before = all.len();
                all.sort();
                all.dedup();
                assert_eq!(all.len(), before, "dropped shards overlap");
            } else {
                assert_eq!(n, len.div_ceil(world));
                all.sort();
                all.dedup();
                assert_eq!(
                    all,
                    (0..len).collect::<Vec<_>>(),
                    "padded shards cover the data"
                );
            }
        }
        // PyTorch's order without shuffling: rank r takes r, r + world, ... of the padded list
        let s = DistributedSampler::new(5, 2, 1).unwrap().shuffle(false);
        assert_eq!(s.indices().unwrap(), vec![1, 3, 0]);
        // the epoch reshuffles; clones share it
        let s = DistributedSampler::new(100, 2, 0).unwrap();
        let e0 = s.indices().unwrap();
        s.clone().set_epoch(1);
        assert_ne!(s.indices().unwrap(), e0);
        assert!(DistributedSampler::new(4, 2, 2).is_err());
    }
}
