//! Device memory of real GPUs: the caching allocator over `cuMemAlloc`/`cuMemFree`, one per
//! device, and the `torch.cuda` memory functions on top of it.

use super::alloc::{Block, CachingAllocator, MemoryStats, RawAlloc, RawError, StreamId};
use super::stream::Event;
use super::{device_count, guarded};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, result, sys};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// `cuMemAlloc`/`cuMemFree` in the primary context of one device.
pub struct DriverAlloc {
    ctx: Arc<CudaContext>,
}

impl DriverAlloc {
    /// The primary context of GPU `device`.
    pub fn new(device: usize) -> Result<DriverAlloc> {
        let n = device_count()?;
        if device >= n {
            return Err(Error::Device(format!(
                "CUDA error: invalid device ordinal {device} ({n} present)"
            )));
        }
        let ctx = guarded("cuDevicePrimaryCtxRetain", || {
            CudaContext::new(device).map_err(|e| Error::Device(format!("CUDA context: {e:?}")))
        })?;
        Ok(DriverAlloc { ctx })
    }

    /// The context allocations live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

fn raw_err(e: result::DriverError) -> RawError {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        RawError::OutOfMemory
    } else {
        RawError::Other(format!("CUDA error: {e:?}"))
    }
}

impl RawAlloc for DriverAlloc {
    fn raw_alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError> {
        self.ctx.bind_to_thread().map_err(raw_err)?;
        // SAFETY: the context is current; the memory is only handed out as raw bytes.
        unsafe { result::malloc_sync(bytes) }.map_err(raw_err)
    }

    fn raw_free(&mut self, ptr: u64) -> std::result::Result<(), RawError> {
        self.ctx.bind_to_thread().map_err(raw_err)?;
        // SAFETY: `ptr` came from `malloc_sync` in this context and is freed once.
        unsafe { result::free_sync(ptr) }.map_err(raw_err)
    }

    fn mem_info(&self) -> Option<(usize, usize)> {
        self.ctx.mem_get_info().ok()
    }

    fn record_event(&mut self, stream: StreamId) -> std::result::Result<u64, RawError> {
        self.ctx.bind_to_thread().map_err(raw_err)?;
        let e =
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(raw_err)?;
        // SAFETY: a fresh event; `stream` is a live stream of this context (streams wait
        // for their work and leave the allocator before they are destroyed).
        if let Err(err) = unsafe { result::event::record(e, stream as sys::CUstream) } {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { result::event::destroy(e) };
            return Err(raw_err(err));
        }
        Ok(e as u64)
    }

    fn event_done(&mut self, event: u64) -> std::result::Result<bool, RawError> {
        let e = event as sys::CUevent;
        // SAFETY: an event `record_event` made and nobody destroyed yet.
        match unsafe { result::event::query(e) } {
            Ok(()) => {
                // SAFETY: as above; destroyed once, here.
                let _ = unsafe { result::event::destroy(e) };
                Ok(true)
            }
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(err) => Err(raw_err(err)),
        }
    }

    fn event_wait(&mut self, event: u64) -> std::result::Result<(), RawError> {
        let e = event as sys::CUevent;
        // SAFETY: an event `record_event` made and nobody destroyed yet; destroyed once.
        unsafe {
            let r = result::event::synchronize(e);
            let _ = result::event::destroy(e);
            r.map_err(raw_err)
        }
    }
}

type Shared = Arc<Mutex<CachingAllocator<DriverAlloc>>>;

/// The allocator of GPU `device`, created on first use.
pub fn allocator(device: usize) -> Result<Shared> {
    static ALL: OnceLock<Mutex<HashMap<usize, Shared>>> = OnceLock::new();
    let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
    let mut all = all
        .lock()
        .map_err(|_| Error::Device("the CUDA allocator table is poisoned".into()))?;
    if let Some(a) = all.get(&device) {
        return Ok(a.clone());
    }
    let a = Arc::new(Mutex::new(CachingAllocator::new(
        DriverAlloc::new(device)?,
        device,
    )));
    all.insert(device, a.clone());
    Ok(a)
}

fn with<T>(device: usize, f: impl FnOnce(&mut CachingAllocator<DriverAlloc>) -> T) -> Result<T> {
    let a = allocator(device)?;
    let mut g = a
        .lock()
        .map_err(|_| Error::Device("the CUDA allocator is poisoned".into()))?;
    Ok(f(&mut g))
}

/// Device memory from the cache, returned to it when dropped.
pub struct DeviceBuffer {
    device: usize,
    block: Block,
    len: usize,
    /// The pinned source of an asynchronous copy into the buffer, and an event after the
    /// copy: the source is released only once the copy has run.
    keep: Option<(Arc<dyn std::any::Any + Send + Sync>, Event)>,
}

impl DeviceBuffer {
    /// At least `bytes` of uninitialised memory on GPU `device`, for work on the thread's
    /// current stream of that device.
    pub fn alloc(device: usize, bytes: usize) -> Result<DeviceBuffer> {
        let stream = super::stream::raw_for(device) as StreamId;
        let block = with(device, |a| a.alloc(bytes, stream))??;
        Ok(DeviceBuffer {
            device,
            block,
            len: bytes,
            keep: None,
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.block.ptr
    }

    /// The bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Keeps `x` alive until the buffer is dropped and `copied` has completed.
    pub fn keep_alive(&mut self, x: Arc<dyn std::any::Any + Send + Sync>, copied: Event) {
        self.keep = Some((x, copied));
    }

    /// Marks the buffer as used by work on `stream` (see [`CachingAllocator::record_stream`]).
    pub fn record_stream(&self, stream: StreamId) -> Result<()> {
        if self.block.ptr == 0 {
            return Ok(());
        }
        with(self.device, |a| a.record_stream(self.block.ptr, stream))?
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some((_, copied)) = &self.keep {
            // the copy may still read the source, which is released below
            let _ = copied.synchronize();
        }
        // the allocator exists: it made this buffer
        let _ = with(self.device, |a| a.free(self.block));
    }
}

/// `torch.cuda.memory_allocated(device)`.
pub fn memory_allocated(device: usize) -> Result<usize> {
    with(device, |a| a.memory_allocated())
}

/// `torch.cuda.max_memory_allocated(device)`.
pub fn max_memory_allocated(device: usize) -> Result<usize> {
    with(device, |a| a.max_memory_allocated())
}

/// `torch.cuda.memory_reserved(device)`.
pub fn memory_reserved(device: usize) -> Result<usize> {
    with(device, |a| a.memory_reserved())
}

/// Every statistic at once.
pub fn memory_stats(device: usize) -> Result<MemoryStats> {
    with(device, |a| a.stats())
}

/// Hands stream `stream`'s cached blocks to the default stream of `device` (its work is
/// done).
pub(crate) fn release_stream(device: usize, stream: StreamId) -> Result<()> {
    with(device, |a| a.release_stream(stream))
}

/// `torch.cuda.empty_cache()` for one device.
pub fn empty_cache(device: usize) -> Result<()> {
    with(device, |a| a.empty_cache())?
}
