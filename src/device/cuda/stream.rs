//! Streams and events, as `torch.cuda.Stream`, `torch.cuda.stream(s)` and `torch.cuda.Event`.
//!
//! Every thread has a current stream, the default (legacy) stream until [`with_stream`] sets
//! another; kernels, cuBLAS calls, device copies and allocations of the thread go to it.
//! Streams are created blocking (`CU_STREAM_DEFAULT`): work on the default stream waits for
//! the work queued before it on every stream and the other way round, so code that leaves a
//! `with_stream` block and reads results on the default stream (a `cpu()`, a later op) sees
//! them. Streams made with [`Stream::new`] run concurrently with each other; order them with
//! [`Stream::wait_stream`] or events, and tell the allocator with `Tensor::record_stream`
//! when a tensor allocated on one is used on another.

use super::driver::{Gpu, err};
use super::memory;
use crate::{Error, Result};
use cudarc::driver::{result, sys};
use std::cell::RefCell;
use std::sync::Arc;

struct Inner {
    /// The driver's handle as an integer (0: the default stream).
    raw: u64,
    gpu: Arc<Gpu>,
}

// SAFETY: a stream handle may be used from any thread with its context current.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`: shared, the stream handle is only passed to driver calls,
// which may be made from any thread with the context current.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.raw == 0 || self.gpu.bind().is_err() {
            return;
        }
        let s = self.raw as sys::CUstream;
        // SAFETY: created in `Stream::new`, destroyed once; its work is finished first, so
        // the blocks it freed can serve any stream, and a later stream that gets the same
        // handle starts with an empty pool.
        unsafe {
            let _ = result::stream::synchronize(s);
            let _ = memory::release_stream(self.gpu.ordinal(), self.raw);
            let _ = result::stream::destroy(s);
        }
    }
}

/// A queue of GPU work; clones name the same stream, destroyed with the last of them.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "<smelt.cuda.Stream device=cuda:{} cuda_stream={:#x}>",
            self.device(),
            self.inner.raw
        )
    }
}

impl PartialEq for Stream {
    fn eq(&self, o: &Stream) -> bool {
        self.inner.raw == o.inner.raw && self.device() == o.device()
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Stream>> = const { RefCell::new(None) };
}

/// The raw handle of the thread's current stream when it belongs to `device`, else the
/// default stream's (null).
pub(crate) fn raw_for(device: usize) -> sys::CUstream {
    CURRENT.with(|c| match &*c.borrow() {
        Some(s) if s.device() == device => s.inner.raw as sys::CUstream,
        _ => std::ptr::null_mut(),
    })
}

impl Stream {
    /// A new stream on the current device.
    pub fn new() -> Result<Stream> {
        let gpu = Gpu::get(super::current_device()?)?;
        gpu.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::Default)
            .map_err(|e| err("cuStreamCreate", e))?;
        Ok(Stream {
            inner: Arc::new(Inner {
                raw: raw as u64,
                gpu,
            }),
        })
    }

    /// The default stream of GPU `device`.
    pub fn default_stream(device: usize) -> Result<Stream> {
        Ok(Stream {
            inner: Arc::new(Inner {
                raw: 0,
                gpu: Gpu::get(device)?,
            }),
        })
    }

    /// The device the stream queues work for.
    pub fn device(&self) -> usize {
        self.inner.gpu.ordinal()
    }

    /// Whether this is a device's default stream.
    pub fn is_default(&self) -> bool {
        self.inner.raw == 0
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.inner.raw as sys::CUstream
    }

    /// The allocator's name for the stream.
    pub(crate) fn id(&self) -> u64 {
        self.inner.raw
    }

    /// Waits until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.gpu.bind()?;
        // SAFETY: a live stream (or the default one).
        unsafe { result::stream::synchronize(self.raw()) }
            .map_err(|e| err("cuStreamSynchronize", e))
    }

    /// Whether all work queued on the stream is done.
    pub fn query(&self) -> Result<bool> {
        self.inner.gpu.bind()?;
        // SAFETY: a live stream (or the default one).
        match unsafe { sys::cuStreamQuery(self.raw()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(err("cuStreamQuery", result::DriverError(e))),
        }
    }

    /// Makes work queued later on this stream wait for the work queued so far on `other`.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        let e = Event::new(false)?;
        e.record(other)?;
        self.wait_event(&e)
    }

    /// Makes work queued later on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.inner.gpu.bind()?;
        // SAFETY: a live stream and a live event of the same context.
        unsafe {
            result::stream::wait_event(
                self.raw(),
                event.raw,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| err("cuStreamWaitEvent", e))
    }

    /// An event recorded now on this stream.
    pub fn record_event(&self) -> Result<Event> {
        let e = Event::new(false)?;
        e.record(self)?;
        Ok(e)
    }
}

/// The current stream of the current device (`torch.cuda.current_stream()`).
pub fn current_stream() -> Result<Stream> {
    let device = super::current_device()?;
    match CURRENT.with(|c| c.borrow().clone()) {
        Some(s) if s.device() == device => Ok(s),
        _ => Stream::default_stream(device),
    }
}

/// Restores the thread's stream and device when a `with_stream` block ends, also by panic.
struct Restore {
    stream: Option<Stream>,
    device: Option<usize>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let s = self.stream.take();
        CURRENT.with(|c| *c.borrow_mut() = s);
        if let Some(d) = self.device {
            let _ = super::set_device(d);
        }
    }
}

/// Runs `f` with `s` as the thread's current stream and its device as the current device
/// (`with torch.cuda.stream(s):`); both are restored afterwards.
pub fn with_stream<R>(s: &Stream, f: impl FnOnce() -> R) -> Result<R> {
    let device = super::current_device().ok();
    super::set_device(s.device())?;
    let previous = CURRENT.with(|c| c.borrow_mut().replace(s.clone()));
    let _restore = Restore {
        stream: previous,
        device,
    };
    Ok(f())
}

/// A marker in a stream's work (`torch.cuda.Event`): wait for it, ask whether the work
/// before it is done, time the work between two.
pub struct Event {
    raw: sys::CUevent,
    gpu: Arc<Gpu>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<smelt.cuda.Event device=cuda:{}>", self.gpu.ordinal())
    }
}

// SAFETY: an event handle may be used from any thread with its context current.
unsafe impl Send for Event {}
// SAFETY: as for `Send`: shared, the event handle is only passed to driver calls,
// which may be made from any thread with the context current.
unsafe impl Sync for Event {}

impl Event {
    /// A new event on the current device; `timing` makes it usable by [`Event::elapsed_ms`].
    pub fn new(timing: bool) -> Result<Event> {
        Self::on(&Gpu::get(super::current_device()?)?, timing)
    }

    pub(crate) fn on(gpu: &Arc<Gpu>, timing: bool) -> Result<Event> {
        gpu.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let raw = result::event::create(flags).map_err(|e| err("cuEventCreate", e))?;
        Ok(Event {
            raw,
            gpu: gpu.clone(),
        })
    }

    /// Records the event at the current end of `stream`'s work.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.gpu.ordinal() {
            return Err(Error::Device(format!(
                "an event of cuda:{} cannot be recorded on a stream of cuda:{}",
                self.gpu.ordinal(),
                stream.device()
            )));
        }
        self.gpu.bind()?;
        // SAFETY: a live event and stream of one context.
        unsafe { result::event::record(self.raw, stream.raw()) }
            .map_err(|e| err("cuEventRecord", e))
    }

    /// Records the event on the thread's current stream of the event's device.
    pub(crate) fn record_current(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: a live event; the stream is live and of this device.
        unsafe { result::event::record(self.raw, raw_for(self.gpu.ordinal())) }
            .map_err(|e| err("cuEventRecord", e))
    }

    /// Waits for the work recorded before the event.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: a live event.
        unsafe { result::event::synchronize(self.raw) }.map_err(|e| err("cuEventSynchronize", e))
    }

    /// Whether the work recorded before the event is done.
    pub fn query(&self) -> Result<bool> {
        self.gpu.bind()?;
        // SAFETY: a live event.
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(err("cuEventQuery", e)),
        }
    }

    /// Milliseconds from this event to `end` (both recorded with timing; waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.synchronize()?;
        // SAFETY: both events are live and were recorded.
        unsafe { result::event::elapsed(self.raw, end.raw) }
            .map_err(|e| err("cuEventElapsedTime", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created in `on`, destroyed once; the driver releases a pending event
            // when its work completes.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}
