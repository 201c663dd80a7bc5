//! The communication thread of a process group: it owns the transport (MPI or NCCL), runs
//! the collectives in the order they were issued, checks the ranks' headers first, stages
//! tensors in the dtype and layout the transport moves, and enforces the timeout.

use super::header::{self, Header};
use super::{InitOptions, ReduceOp};
use crate::ir::dtype::DType;
use crate::profiler::{self, EventKind};
use crate::runtime::{Device, Tensor};
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a transport does; the engine calls it from its one thread only. Buffers are
/// contiguous tensors in [`Transport::wire_dtype`] on [`Transport::device`]; reductions are
/// `Sum`, `Max`, `Min` or `Product` (the engine turns `Avg` into a sum and a division).
pub(crate) trait Transport {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Where the tensors of this transport live.
    fn device(&self) -> Device;
    /// The dtype a tensor of `dtype` travels in.
    fn wire_dtype(&self, dtype: DType) -> DType;
    /// Sends `mine` to every peer and returns every rank's header (in rank order), or an
    /// error naming the ranks that sent none before `deadline`.
    fn exchange(&mut self, seq: u64, mine: &Header, deadline: Instant) -> Result<Vec<Header>>;
    /// `recv` = the reduction of every rank's `send`.
    fn all_reduce(&mut self, send: &Tensor, recv: &Tensor, op: ReduceOp, at: Instant)
    -> Result<()>;
    /// Every rank's `buf` = rank `root`'s.
    fn broadcast(&mut self, buf: &Tensor, root: usize, at: Instant) -> Result<()>;
    /// `recv` = every rank's `send`, concatenated in rank order.
    fn all_gather(&mut self, send: &Tensor, recv: &Tensor, at: Instant) -> Result<()>;
    /// `recv` = this rank's part of the reduction of every rank's `send`.
    fn reduce_scatter(
        &mut self,
        send: &Tensor,
        recv: &Tensor,
        op: ReduceOp,
        at: Instant,
    ) -> Result<()>;
    /// Returns once every rank has entered it.
    fn barrier(&mut self, at: Instant) -> Result<()>;
    /// Ends the transport (MPI_Finalize); `clean` is false after a timeout, when a peer may
    /// never complete what is still in flight.
    fn finish(self: Box<Self>, clean: bool) -> Result<()>;
}

/// Makes the transport on the communication thread (MPI is initialised by the thread
/// that will make every MPI call).
pub(crate) type Connect = Box<dyn FnOnce() -> Result<Box<dyn Transport>> + Send>;

/// A collective and its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Collective {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
    Barrier,
}

impl Collective {
    fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::Broadcast(_) => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter(_) => "reduce_scatter",
            Collective::Barrier => "barrier",
        }
    }
}

/// Where a collective's outcome is left for its [`Work`].
#[derive(Default)]
struct Slot {
    outcome: Mutex<Option<Result<()>>>,
    ready: Condvar,
}

impl Slot {
    fn set(&self, r: Result<()>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.ready.notify_all();
    }
}

/// A collective in flight (`torch.distributed.Work`): its tensors hold the result once
/// [`Work::wait`] has returned `Ok`.
#[must_use = "a collective's result is only there after wait()"]
pub struct Work {
    slot: Arc<Slot>,
}

impl Work {
    /// Blocks until the collective has finished; its error if it failed.
    pub fn wait(self) -> Result<()> {
        let mut g = self.slot.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.slot.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether the collective has finished (`is_completed`).
    pub fn is_completed(&self) -> bool {
        self.slot
            .outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

struct Job {
    seq: u64,
    what: Collective,
    input: Tensor,
    output: Tensor,
    slot: Arc<Slot>,
}

/// A process group's engine: a queue into the communication thread.
pub(crate) struct Engine {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    seq: AtomicU64,
    thread: Mutex<Option<JoinHandle<Result<()>>>>,
}

/// How a collective failed.
enum Fail {
    /// Every rank saw the same problem before any data moved: the group goes on.
    Agreed(Error),
    /// A transport error or a timeout: the group is broken.
    Fatal(Error),
}

impl Engine {
    /// Starts the communication thread, which makes the transport with `connect`; returns
    /// once it is connected, with its rank and size.
    pub fn start(connect: Connect, opts: &InitOptions) -> Result<(Engine, usize, usize)> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, usize)>>();
        let opts = opts.clone();
        let thread = std::thread::Builder::new()
            .name("smelt-comm".into())
            .spawn(move || {
                let t = match connect() {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                let _ = ready_tx.send(Ok((t.rank(), t.size())));
                serve(t, rx, &opts)
            })
            .map_err(|e| {
                Error::Distributed(format!("cannot start the communication thread: {e}"))
            })?;
        let (rank, size) = match ready_rx.recv() {
            Ok(Ok(rs)) => rs,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                return Err(Error::Distributed(
                    "the communication thread stopped while connecting".into(),
                ));
            }
        };
        let engine = Engine {
            tx: Mutex::new(Some(tx)),
            seq: AtomicU64::new(0),
            thread: Mutex::new(Some(thread)),
        };
        Ok((engine, rank, size))
    }

    /// Queues a collective; its work completes when the thread has run it.
    pub fn submit(&self, what: Collective, input: Tensor, output: Tensor) -> Result<Work> {
        let slot = Arc::new(Slot::default());
        let job = Job {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            what,
            input,
            output,
            slot: slot.clone(),
        };
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref().map(|tx| tx.send(job)) {
            Some(Ok(())) => Ok(Work { slot }),
            _ => Err(Error::Distributed(
                "the process group has been shut down".into(),
            )),
        }
    }

    /// Runs what is queued, then ends the transport.
    pub fn shutdown(&self) -> Result<()> {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        match thread.map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Distributed(
                "the communication thread panicked".into(),
            )),
            None => Ok(()),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The communication thread's loop.
fn serve(mut t: Box<dyn Transport>, rx: mpsc::Receiver<Job>, opts: &InitOptions) -> Result<()> {
    let _off = crate::autograd::no_grad();
    let mut broken: Option<String> = None;
    for job in rx {
        if let Some(why) = &broken {
            job.slot.set(Err(Error::Distributed(format!(
                "{} #{}: the process group is broken by an earlier failure: {why}",
                job.what.name(),
                job.seq
            ))));
            continue;
        }
        let _span = profiler::span(EventKind::Collective, || {
            format!(
                "{} {}{:?}",
                job.what.name(),
                job.input.dtype(),
                job.input.shape()
            )
        });
        let r = match run(t.as_mut(), &job, opts) {
            Ok(()) => Ok(()),
            Err(Fail::Agreed(e)) => Err(e),
            Err(Fail::Fatal(e)) => {
                broken = Some(e.to_string());
                Err(e)
            }
        };
        job.slot.set(r);
    }
    t.finish(broken.is_none())
}

/// The buffers a collective moves, in the transport's dtype and layout.
struct Staged {
    send: Tensor,
    recv: Tensor,
    /// Whether `recv` is a copy that must be written back into the job's output.
    copy_back: bool,
}

fn run(t: &mut dyn Transport, job: &Job, opts: &InitOptions) -> Result<(), Fail> {
    let deadline = Instant::now() + opts.timeout;
    let name = job.what.name();
    let staged = if job.what == Collective::Barrier {
        None
    } else {
        match stage(t, job) {
            Ok(s) => Some(s),
            Err(e) => {
                // tell the peers, so that they fail now rather than wait for this rank
                if opts.check_arguments {
                    let failed = failed_header(job.seq);
                    let _ = t.exchange(job.seq, &failed, deadline);
                }
                return Err(Fail::Agreed(e));
            }
        }
    };
    if opts.check_arguments {
        let mine = header::encode(job.seq, job.what, job.input.dtype(), job.input.shape());
        let all = t.exchange(job.seq, &mine, deadline).map_err(Fail::Fatal)?;
        header::agree(job.seq, name, &all).map_err(Fail::Agreed)?;
    }
    let fatal = |e: Error| Fail::Fatal(Error::Distributed(format!("{name} #{}: {e}", job.seq)));
    let Some(s) = staged else {
        return t.barrier(deadline).map_err(fatal);
    };
    let bool_op = |op: ReduceOp| match (job.input.dtype(), op) {
        // bool: sum and max are logical or, product and min logical and
        (DType::Bool, ReduceOp::Sum) => ReduceOp::Max,
        (DType::Bool, ReduceOp::Product) => ReduceOp::Min,
        (_, ReduceOp::Avg) => ReduceOp::Sum,
        (_, op) => op,
    };
    match job.what {
        Collective::AllReduce(op) => t.all_reduce(&s.send, &s.recv, bool_op(op), deadline),
        Collective::Broadcast(root) => t.broadcast(&s.recv, root, deadline),
        Collective::AllGather => t.all_gather(&s.send, &s.recv, deadline),
        Collective::ReduceScatter(op) => t.reduce_scatter(&s.send, &s.recv, bool_op(op), deadline),
        Collective::Barrier => Ok(()),
    }
    .map_err(fatal)?;
    let local = |e: Error| Fail::Agreed(Error::Distributed(format!("{name} #{}: {e}", job.seq)));
    if matches!(
        job.what,
        Collective::AllReduce(ReduceOp::Avg) | Collective::ReduceScatter(ReduceOp::Avg)
    ) {
        s.recv.div_scalar_(t.size() as f64).map_err(local)?;
    }
    if s.copy_back {
        job.output.copy_(&s.recv).map_err(local)?;
    }
    Ok(())
}

/// A header that says this rank could not run collective `seq`.
fn failed_header(seq: u64) -> Header {
    let mut h = [0u64; header::WORDS];
    h[0] = seq;
    h[1] = 6;
    h
}

/// The send and receive buffers of a job: the job's own tensors where they already are
/// contiguous in the wire dtype, copies otherwise.
fn stage(t: &dyn Transport, job: &Job) -> Result<Staged> {
    let dev = t.device();
    for (what, x) in [("input", &job.input), ("output", &job.output)] {
        if x.device() != dev {
            return Err(Error::Device(format!(
                "{}: the {what} tensor is on {}, but this process group's tensors are on {dev}",
                job.what.name(),
                x.device()
            )));
        }
    }
    let wire = t.wire_dtype(job.input.dtype());
    let fits = |x: &Tensor| x.is_contiguous() && x.dtype() == wire;
    let copy_of = |x: &Tensor| -> Result<Tensor> {
        let c = Tensor::empty(x.shape(), wire).to_device(dev)?;
        c.copy_(x)?;
        Ok(c)
    };
    let empty = |x: &Tensor| Tensor::empty(x.shape(), wire).to_device(dev);
    let same = |a: &Tensor, b: &Tensor| {
        a.shares_storage(b) && a.storage_offset() == b.storage_offset() && a.shape() == b.shape()
    };
    let (send, recv, copy_back) = match job.what {
        // one buffer: the root's data goes out of it, everyone's comes back into it
        Collective::Broadcast(_) if fits(&job.output) => {
            (job.output.clone(), job.output.clone(), false)
        }
        Collective::Broadcast(_) => {
            let buf = copy_of(&job.input)?;
            (buf.clone(), buf, true)
        }
        // in place where the tensor already is what the wire wants (the transport sees
        // one buffer as send and receive: MPI_IN_PLACE, or NCCL's in-place form)
        Collective::AllReduce(_) if fits(&job.output) && same(&job.input, &job.output) => {
            (job.output.clone(), job.output.clone(), false)
        }
        Collective::AllReduce(_) => {
            let send = copy_of(&job.input)?;
            if fits(&job.output) {
                (send, job.output.clone(), false)
            } else {
                (send, empty(&job.output)?, true)
            }
        }
        _ => {
            let send = if fits(&job.input) {
                job.input.clone()
            } else {
                copy_of(&job.input)?
            };
            if fits(&job.output) {
                (send, job.output.clone(), false)
            } else {
                (send, empty(&job.output)?, true)
            }
        }
    };
    Ok(Staged {
        send,
        recv,
        copy_back,
    })
}

/// How long [`poll_until`] polls without sleeping.
const SPIN: Duration = Duration::from_millis(2);

/// Polls `done` until it returns true: at first continuously, yielding the core between
/// polls (MPI moves a non-blocking collective forward only inside these polls, so a nap
/// here stalls the transfer), then, once the wait is long enough to mean a peer is away,
/// sleeping a little longer each time (the communication thread must not take a core from
/// the computation for the whole timeout); an error once `deadline` has passed.
pub(crate) fn poll_until(
    mut done: impl FnMut() -> Result<bool>,
    deadline: Instant,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let start = Instant::now();
    let mut nap = Duration::from_micros(10);
    loop {
        if done()? {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Distributed(format!(
                "timed out waiting for {} (the group's timeout has passed)",
                what()
            )));
        }
        if now - start < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_micros(250));
        }
    }
}
