//! `DistributedDataParallel`: the same module on every rank of a process group, its
//! gradients averaged over the ranks during the backward pass.
//!
//! At construction rank 0's parameters and buffers are broadcast, so every replica starts
//! equal. The parameters are put in buckets of at most `bucket_cap_mb` megabytes, in the
//! reverse of their registration order (the order a backward pass produces their
//! gradients, as PyTorch does). A hook on each parameter marks its gradient ready once the
//! backward pass has accumulated it; when a bucket's last gradient is ready, the bucket is
//! flattened and all-reduced asynchronously on the group's communication thread while the
//! backward pass goes on. When the last bucket has been launched, every bucket is waited
//! for and the averages are written back into the `.grad`s.

use super::module::Module;
use crate::distributed::{self, ProcessGroup, ReduceOp, Work};
use crate::ir::dtype::DType;
use crate::runtime::Tensor;
use crate::{Result, bail};
use std::sync::{Arc, Mutex, Weak};

/// A module replicated over a process group (`torch.nn.parallel.DistributedDataParallel`).
pub struct DistributedDataParallel<M: Module> {
    module: M,
    group: Arc<ProcessGroup>,
    reducer: Arc<Mutex<Reducer>>,
}

/// Turns the gradient all-reduce off until dropped (`with model.no_sync():`): gradients
/// accumulate locally, and the next backward outside it reduces the accumulated ones.
pub struct NoSync {
    reducer: Arc<Mutex<Reducer>>,
}

impl Drop for NoSync {
    fn drop(&mut self) {
        lock(&self.reducer).sync = true;
    }
}

struct Bucket {
    /// Parameter indices (registration order numbers).
    members: Vec<usize>,
    ready: usize,
    /// The flattened gradients in flight, and their all-reduce.
    flight: Option<(Tensor, Work)>,
}

struct Reducer {
    group: Arc<ProcessGroup>,
    params: Vec<Tensor>,
    /// Per parameter: its bucket and whether its gradient is ready this iteration.
    bucket_of: Vec<usize>,
    ready: Vec<bool>,
    buckets: Vec<Bucket>,
    launched: usize,
    sync: bool,
}

fn lock(r: &Mutex<Reducer>) -> std::sync::MutexGuard<'_, Reducer> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

impl Reducer {
    /// Parameter `i`'s gradient is final for this backward pass.
    fn mark_ready(&mut self, i: usize) -> Result<()> {
        if !self.sync {
            return Ok(());
        }
        if self.ready[i] {
            bail!(
                Value,
                "Expected to mark a variable ready only once. Parameter {i} had its gradient accumulated twice in one backward pass while its bucket was being reduced."
            );
        }
        self.ready[i] = true;
        let b = self.bucket_of[i];
        self.buckets[b].ready += 1;
        if self.buckets[b].ready == self.buckets[b].members.len() {
            self.launch(b)?;
        }
        if self.launched == self.buckets.len() {
            self.finish()?;
        }
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let _off = crate::autograd::no_grad();
        let mut flat = Vec::with_capacity(self.buckets[b].members.len());
        for &i in &self.buckets[b].members {
            let Some(g) = self.params[i].grad() else {
                bail!(
                    Value,
                    "DistributedDataParallel: parameter {i} has no gradient"
                );
            };
            flat.push(g.reshape(&[-1i64])?);
        }
        let refs: Vec<&Tensor> = flat.iter().collect();
        let flat = Tensor::cat(&refs, 0)?;
        let work = self.group.all_reduce_async(&flat, ReduceOp::Avg)?;
        self.buckets[b].flight = Some((flat, work));
        self.launched += 1;
        Ok(())
    }

    /// Waits for every bucket and writes the averages back; ready for the next iteration.
    fn finish(&mut self) -> Result<()> {
        let _off = crate::autograd::no_grad();
        let mut first_err = None;
        for b in 0..self.buckets.len() {
            let Some((flat, work)) = self.buckets[b].flight.take() else {
                continue;
            };
            if let Err(e) = work.wait() {
                first_err.get_or_insert(e);
                continue;
            }
            let mut off = 0;
            for &i in &self.buckets[b].members {
                let p = &self.params[i];
                let n = p.numel();
                // the averaged gradient is a view of the bucket (PyTorch's
                // gradient_as_bucket_view): no copy, and the backward's own gradient
                // tensor, which later ops of the sweep may still read, stays as it was
                if p.grad().is_some() {
                    let part = flat.narrow(0, off as i64, n as i64)?.reshape(p.shape())?;
                    p.set_grad(Some(part));
                }
                off += n;
            }
        }
        self.reset();
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn reset(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        for b in &mut self.buckets {
            b.ready = 0;
            b.flight = None;
        }
        self.launched = 0;
    }
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` over the default process group with 25 MB buckets.
    pub fn new(module: M) -> Result<DistributedDataParallel<M>> {
        Self::with_group(
            module,
            distributed::default_group()?,
            distributed::DEFAULT_BUCKET_MB,
        )
    }

    /// Wraps `module` over `group` with buckets of at most `bucket_cap_mb` megabytes.
    pub fn with_group(
        module: M,
        group: Arc<ProcessGroup>,
        bucket_cap_mb: f64,
    ) -> Result<DistributedDataParallel<M>> {
        if bucket_cap_mb.is_nan() || bucket_cap_mb <= 0.0 {
            bail!(Value, "bucket_cap_mb must be positive, got {bucket_cap_mb}");
        }
        // every replica starts from rank 0's state
        for (_, t) in module
            .named_parameters()
            .into_iter()
            .chain(module.named_buffers())
        {
            group.broadcast(&t, 0)?;
        }
        let params: Vec<Tensor> = module
            .parameters()
            .into_iter()
            .filter(Tensor::requires_grad)
            .collect();
        let cap = (bucket_cap_mb * 1024.0 * 1024.0) as usize;
        let sizes: Vec<(usize, DType)> = params
            .iter()
            .map(|p| (p.numel() * p.element_size(), p.dtype()))
            .collect();
        let mut bucket_of = vec![0; params.len()];
        let buckets: Vec<Bucket> = distributed::buckets(&sizes, cap)
            .into_iter()
            .enumerate()
            .map(|(b, members)| {
                for &i in &members {
                    bucket_of[i] = b;
                }
                Bucket {
                    members,
                    ready: 0,
                    flight: None,
                }
            })
            .collect();
        let reducer = Arc::new(Mutex::new(Reducer {
            group: group.clone(),
            ready: vec![false; params.len()],
            params: params.clone(),
            bucket_of,
            buckets,
            launched: 0,
            sync: true,
        }));
        for (i, p) in params.iter().enumerate() {
            let weak: Weak<Mutex<Reducer>> = Arc::downgrade(&reducer);
            p.register_post_accumulate_grad_hook(move |_| match weak.upgrade() {
                Some(r) => lock(&r).mark_ready(i),
                None => Ok(()),
            })?;
        }
        Ok(DistributedDataParallel {
            module,
            group,
            reducer,
        })
    }

    /// The wrapped module (`ddp.module`).
    pub fn module(&self) -> &M {
        &self.module
    }
    /// The wrapped module, mutably.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }
    /// The group it reduces over.
    pub fn process_group(&self) -> &Arc<ProcessGroup> {
        &self.group
    }
    /// How many buckets the parameters form.
    pub fn num_buckets(&self) -> usize {
        lock(&self.reducer).buckets.len()
    }
    /// Skips the all-reduce until the guard drops (`no_sync()`).
    pub fn no_sync(&self) -> NoSync {
        lock(&self.reducer).sync = false;
        NoSync {
            reducer: self.reducer.clone(),
        }
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut r = lock(&self.reducer);
        if r.ready.iter().any(|&x| x) {
            r.reset();
            bail!(
                Value,
                "Expected to have finished reduction in the prior iteration before starting a new one. Some parameters did not receive a gradient in the last backward pass (DistributedDataParallel needs every parameter to take part in the loss)."
            );
        }
        drop(r);
        self.module.forward(x)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        prefixed(self.module.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        prefixed(self.module.named_buffers())
    }
    fn train(&mut self, mode: bool) {
        self.module.train(mode)
    }
    fn is_training(&self) -> bool {
        self.module.is_training()
    }
}

/// PyTorch's DDP names its parameters `module.NAME`.
fn prefixed(v: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    v.into_iter()
        .map(|(n, t)| (format!("module.{n}"), t))
        .collect()
}
