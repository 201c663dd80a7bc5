//! Data-parallel training across processes (`torch.distributed`): a process group over an
//! existing engine — MPI between CPU processes and machines (the `mpi` feature, through the
//! `mpi` crate), NCCL between GPUs (cudarc, loaded at run time like the driver) — and
//! collectives on tensors.
//!
//! Every collective of a group runs on one communication thread, in the order the caller
//! issued them (every rank issues the same collectives in the same order, as in PyTorch).
//! The `_async` forms return a [`Work`] at once, so that communication overlaps with
//! computation (`nn::DistributedDataParallel` all-reduces gradient buckets while the rest
//! of the backward pass runs); the plain forms wait for it.
//!
//! Before the data moves, the ranks exchange a small header (which collective, dtype,
//! shape, root): ranks that disagree all return the same [`Error::Distributed`] naming the
//! mismatch, and a rank that does not join within the group's timeout makes the others
//! return an error naming it, instead of hanging. A timeout leaves the group broken: later
//! collectives fail at once, as NCCL's watchdog aborts a communicator.

mod comm_thread;
mod header;
#[cfg(feature = "mpi")]
mod mpi;
mod nccl;
mod rendezvous;

pub use comm_thread::Work;
pub use rendezvous::{LaunchEnv, exchange_bytes};

use crate::ir::dtype::DType;
use crate::runtime::Tensor;
use crate::{Error, Result, bail};
use comm_thread::{Collective, Engine};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The engine a process group runs on (`init_process_group(backend=...)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// MPI (OpenMPI, MPICH): CPU tensors, processes started by `mpirun`. Needs the `mpi`
    /// feature at build time.
    Mpi,
    /// NCCL: CUDA tensors, one GPU per process; rank and world size from `mpirun` or from
    /// `RANK`/`WORLD_SIZE` as `torchrun` sets them.
    Nccl,
}

impl Backend {
    /// PyTorch's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
        }
    }
}

pub use crate::ir::collective::ReduceOp;

/// MPI's C interface as the `mpi` crate binds it, for programs that call MPI themselves
/// beside smelt (when [`mpi_thread_multiple`] says any thread may).
#[cfg(feature = "mpi")]
pub use ::mpi::ffi as mpi_ffi;

/// The MPI library's `MPI_IN_PLACE` (the `mpi` crate does not bind it), for programs that
/// call MPI themselves.
#[cfg(feature = "mpi")]
pub fn mpi_in_place() -> *const std::ffi::c_void {
    mpi::in_place()
}

/// Whether MPI is initialised with MPI_THREAD_MULTIPLE, so that threads other than smelt's
/// communication thread may call it too (false without the `mpi` feature).
pub fn mpi_thread_multiple() -> bool {
    #[cfg(feature = "mpi")]
    {
        mpi::thread_multiple()
    }
    #[cfg(not(feature = "mpi"))]
    {
        false
    }
}

/// PyTorch's default gradient bucket size, in megabytes (`bucket_cap_mb`).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

/// Groups tensors of `(bytes, dtype)` into gradient buckets as `DistributedDataParallel`
/// does: in reverse order (the order backward produces gradients), one dtype per bucket, at
/// most `cap` bytes each (a larger tensor is a bucket of its own). Returns the members of
/// each bucket, by index, in the order they join.
pub fn buckets(tensors: &[(usize, DType)], cap: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0usize;
    for i in (0..tensors.len()).rev() {
        let (nb, dtype) = tensors[i];
        match out.last_mut() {
            Some(b) if bytes + nb <= cap && tensors[b[0]].1 == dtype => {
                b.push(i);
                bytes += nb;
            }
            _ => {
                out.push(vec![i]);
                bytes = nb;
            }
        }
    }
    out
}

/// Settings of a process group.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// How long a collective waits for every rank (PyTorch's `timeout=`, 30 minutes by
    /// default there; 5 minutes here, or `SMELT_DIST_TIMEOUT` seconds).
    pub timeout: Duration,
    /// Whether the ranks compare each collective's arguments before moving data (on by
    /// default; it costs one small message per peer and collective).
    pub check_arguments: bool,
    /// The CUDA device of this process (NCCL); by default the local rank modulo the devices.
    pub device: Option<usize>,
}

impl Default for InitOptions {
    fn default() -> InitOptions {
        let secs = std::env::var("SMELT_DIST_TIMEOUT")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(300.0);
        InitOptions {
            timeout: Duration::from_secs_f64(secs),
            check_arguments: true,
            device: None,
        }
    }
}

impl InitOptions {
    /// The collectives' timeout.
    pub fn timeout(mut self, t: Duration) -> InitOptions {
        self.timeout = t;
        self
    }
    /// Whether the ranks compare each collective's arguments first.
    pub fn check_arguments(mut self, on: bool) -> InitOptions {
        self.check_arguments = on;
        self
    }
    /// The CUDA device of this process (NCCL).
    pub fn device(mut self, d: usize) -> InitOptions {
        self.device = Some(d);
        self
    }
}

/// A set of processes that run collectives together (`ProcessGroup`).
pub struct ProcessGroup {
    backend: Backend,
    rank: usize,
    size: usize,
    engine: Engine,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup({}, rank {} of {})",
            self.backend.name(),
            self.rank,
            self.size
        )
    }
}

impl ProcessGroup {
    /// Joins the processes of the launch (`mpirun`, or `torchrun`'s environment) in a new
    /// group.
    pub fn new(backend: Backend, opts: &InitOptions) -> Result<ProcessGroup> {
        let connect: comm_thread::Connect = match backend {
            Backend::Mpi => mpi_connect(opts)?,
            Backend::Nccl => nccl::connect(opts.clone()),
        };
        let (engine, rank, size) = Engine::start(connect, opts)?;
        Ok(ProcessGroup {
            backend,
            rank,
            size,
            engine,
        })
    }

    /// The engine this group runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }
    /// This process's rank, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// Reduces `t` over the ranks in place: afterwards every rank holds the result.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(t, op)?.wait()
    }
    /// [`ProcessGroup::all_reduce`] without waiting: `t` holds the result once the
    /// returned work is waited for, and must not be used before.
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        op.check(t.dtype(), "all_reduce")?;
        self.engine
            .submit(Collective::AllReduce(op), t.clone(), t.clone())
    }

    /// Copies rank `src`'s `t` into every rank's `t`.
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        self.broadcast_async(t, src)?.wait()
    }
    /// [`ProcessGroup::broadcast`] without waiting.
    pub fn broadcast_async(&self, t: &Tensor, src: usize) -> Result<Work> {
        self.check_rank(src, "broadcast")?;
        self.engine
            .submit(Collective::Broadcast(src), t.clone(), t.clone())
    }

    /// Every rank's `input`, in rank order (`all_gather(tensor_list, tensor)`).
    pub fn all_gather(&self, input: &Tensor) -> Result<Vec<Tensor>> {
        let mut shape = vec![self.size];
        shape.extend_from_slice(input.shape());
        let out = Tensor::empty(&shape, input.dtype()).to_device(input.device())?;
        self.all_gather_into_tensor(&out, input)?;
        (0..self.size)
            .map(|r| out.select(0, r as i64))
            .collect::<Result<_>>()
    }
    /// Writes every rank's `input` into `output`, stacked along dim 0 in rank order:
    /// `output` is `[world_size * n, ...]` or `[world_size, n, ...]` for an `input` of
    /// `[n, ...]` (`all_gather_into_tensor`).
    pub fn all_gather_into_tensor(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        self.all_gather_into_tensor_async(output, input)?.wait()
    }
    /// [`ProcessGroup::all_gather_into_tensor`] without waiting.
    pub fn all_gather_into_tensor_async(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        check_parts(output, input, self.size, "all_gather_into_tensor")?;
        self.engine
            .submit(Collective::AllGather, input.clone(), output.clone())
    }

    /// Reduces `input` (`[world_size * n, ...]`) over the ranks and leaves rank `r` the
    /// `r`-th of its `world_size` equal parts along dim 0 in `output` (`[n, ...]`)
    /// (`reduce_scatter_tensor`).
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        self.reduce_scatter_async(output, input, op)?.wait()
    }
    /// [`ProcessGroup::reduce_scatter`] without waiting.
    pub fn reduce_scatter_async(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
    ) -> Result<Work> {
        op.check(input.dtype(), "reduce_scatter")?;
        check_parts(input, output, self.size, "reduce_scatter")?;
        self.engine
            .submit(Collective::ReduceScatter(op), input.clone(), output.clone())
    }

    /// Waits until every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        let none = Tensor::empty(&[0], DType::U8);
        self.engine
            .submit(Collective::Barrier, none.clone(), none)?
            .wait()
    }

    /// Ends the group: waits for its queued collectives and shuts the engine down.
    pub fn shutdown(self) -> Result<()> {
        self.engine.shutdown()
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.size {
            bail!(
                Value,
                "{what}: rank {r} is out of range for a group of {} processes",
                self.size
            );
        }
        Ok(())
    }
}

/// Checks that `whole` holds `world` copies of `part` along dim 0, as `all_gather` and
/// `reduce_scatter` lay them out.
fn check_parts(whole: &Tensor, part: &Tensor, world: usize, what: &str) -> Result<()> {
    if whole.dtype() != part.dtype() {
        bail!(
            DType,
            "{what}: output and input must have the same dtype, got {} and {}",
            whole.dtype(),
            part.dtype()
        );
    }
    if whole.device() != part.device() {
        bail!(
            Device,
            "{what}: output and input must be on the same device, got {} and {}",
            whole.device(),
            part.device()
        );
    }
    let ok = whole.numel() == world * part.numel()
        && match (whole.shape(), part.shape()) {
            ([w, rest @ ..], [p, prest @ ..]) if rest == prest => *w == world * p,
            ([w, rest @ ..], _) => *w == world && rest == part.shape(),
            ([], _) => false,
        };
    if !ok {
        bail!(
            Shape,
            "{what}: the larger tensor must hold world_size ({world}) parts of {:?} along dim 0, got {:?}",
            part.shape(),
            whole.shape()
        );
    }
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_connect(opts: &InitOptions) -> Result<comm_thread::Connect> {
    let checked = opts.check_arguments;
    Ok(Box::new(move || mpi::connect(checked)))
}

#[cfg(not(feature = "mpi"))]
fn mpi_connect(_: &InitOptions) -> Result<comm_thread::Connect> {
    Err(Error::Unsupported(
        "the mpi backend needs smelt built with the `mpi` feature (and an MPI library such as Debian's libopenmpi-dev)".into(),
    ))
}

/// The default group (`torch.distributed`'s global state).
static DEFAULT: Mutex<Option<Arc<ProcessGroup>>> = Mutex::new(None);

fn lock_default() -> std::sync::MutexGuard<'static, Option<Arc<ProcessGroup>>> {
    DEFAULT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Joins the processes of this launch in the default group
/// (`torch.distributed.init_process_group(backend)`).
pub fn init_process_group(backend: Backend) -> Result<()> {
    init_process_group_with(backend, &InitOptions::default())
}

/// [`init_process_group`] with settings (the timeout, argument checks, the device).
pub fn init_process_group_with(backend: Backend, opts: &InitOptions) -> Result<()> {
    let mut g = lock_default();
    if g.is_some() {
        bail!(
            Value,
            "trying to initialize the default process group twice!"
        );
    }
    let pg = ProcessGroup::new(backend, opts)?;
    *g = Some(Arc::new(pg));
    drop(g);
    crate::runtime::hooks::COLLECTIVE.register(graph_all_reduce);
    Ok(())
}

/// Ends the default group (`destroy_process_group`); with MPI, finalises MPI, so call it
/// once at the end of the program.
pub fn destroy_process_group() -> Result<()> {
    let Some(pg) = lock_default().take() else {
        bail!(Value, "Default process group has not been initialized");
    };
    match Arc::try_unwrap(pg) {
        Ok(pg) => pg.shutdown(),
        Err(_) => bail!(
            Value,
            "destroy_process_group: the default group is still in use (a DistributedDataParallel or a compiled step holds it)"
        ),
    }
}

/// Whether the default group exists (`is_initialized`).
pub fn is_initialized() -> bool {
    lock_default().is_some()
}

/// The default group, shared (what `DistributedDataParallel` holds).
pub fn default_group() -> Result<Arc<ProcessGroup>> {
    match lock_default().as_ref() {
        Some(g) => Ok(g.clone()),
        None => Err(Error::Value(
            "Default process group has not been initialized, please make sure to call init_process_group.".into(),
        )),
    }
}

/// This process's rank in the default group (`get_rank`).
pub fn rank() -> Result<usize> {
    Ok(default_group()?.rank())
}

/// The number of processes in the default group (`get_world_size`).
pub fn world_size() -> Result<usize> {
    Ok(default_group()?.world_size())
}

/// Waits until every rank of the default group has called it.
pub fn barrier() -> Result<()> {
    default_group()?.barrier()
}

/// [`ProcessGroup::all_reduce`] on the default group.
pub fn all_reduce(t: &Tensor, op: ReduceOp) -> Result<()> {
    default_group()?.all_reduce(t, op)
}

/// [`ProcessGroup::all_reduce_async`] on the default group.
pub fn all_reduce_async(t: &Tensor, op: ReduceOp) -> Result<Work> {
    default_group()?.all_reduce_async(t, op)
}

/// [`ProcessGroup::broadcast`] on the default group.
pub fn broadcast(t: &Tensor, src: usize) -> Result<()> {
    default_group()?.broadcast(t, src)
}

/// [`ProcessGroup::broadcast_async`] on the default group.
pub fn broadcast_async(t: &Tensor, src: usize) -> Result<Work> {
    default_group()?.broadcast_async(t, src)
}

/// [`ProcessGroup::all_gather`] on the default group.
pub fn all_gather(input: &Tensor) -> Result<Vec<Tensor>> {
    default_group()?.all_gather(input)
}

/// [`ProcessGroup::all_gather_into_tensor`] on the default group.
pub fn all_gather_into_tensor(output: &Tensor, input: &Tensor) -> Result<()> {
    default_group()?.all_gather_into_tensor(output, input)
}

/// [`ProcessGroup::all_gather_into_tensor_async`] on the default group.
pub fn all_gather_into_tensor_async(output: &Tensor, input: &Tensor) -> Result<Work> {
    default_group()?.all_gather_into_tensor_async(output, input)
}

/// [`ProcessGroup::reduce_scatter`] on the default group.
pub fn reduce_scatter(output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
    default_group()?.reduce_scatter(output, input, op)
}

/// [`ProcessGroup::reduce_scatter_async`] on the default group.
pub fn reduce_scatter_async(output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
    default_group()?.reduce_scatter_async(output, input, op)
}

/// The `all_reduce` graph op's eager kernel: reduces a copy of `x` over the default group.
fn graph_all_reduce(x: &Tensor, op: ReduceOp) -> Result<Tensor> {
    let out = Tensor::empty(x.shape(), x.dtype()).to_device(x.device())?;
    out.copy_(x)?;
    all_reduce(&out, op)?;
    Ok(out)
}
