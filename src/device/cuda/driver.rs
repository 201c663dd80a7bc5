//! The few driver calls execution needs, on one device's primary context: copies, loading
//! compiled modules, launching kernels, timing.
//!
//! Work goes to the thread's current stream ([`super::stream`]): kernels, cuBLAS calls and
//! device copies of one stream are ordered without extra synchronisation. Host copies are
//! synchronous and on the default stream, which waits for every stream's earlier work.

use super::stream::{Event, raw_for};
use super::{device_count, guarded};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) fn err(what: &str, e: result::DriverError) -> Error {
    Error::Device(format!("CUDA error in {what}: {e:?}"))
}

/// One GPU's context.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    ordinal: usize,
}

impl Gpu {
    /// The context of GPU `ordinal`, created once per process.
    pub fn get(ordinal: usize) -> Result<Arc<Gpu>> {
        static ALL: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
        let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = all.get(&ordinal) {
            return Ok(g.clone());
        }
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::Device(format!(
                "CUDA error: invalid device ordinal {ordinal} ({n} present)"
            )));
        }
        let ctx = guarded("cuDevicePrimaryCtxRetain", || {
            CudaContext::new(ordinal).map_err(|e| err("cuDevicePrimaryCtxRetain", e))
        })?;
        let g = Arc::new(Gpu { ctx, ordinal });
        all.insert(ordinal, g.clone());
        Ok(g)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the context current on this thread (cheap when it already is).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| err("cuCtxSetCurrent", e))
    }

    /// Copies host bytes to device address `dst`.
    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let _span = copy_span("memcpy HtoD", src.len());
        // SAFETY: `dst` holds at least `src.len()` bytes (the caller's allocation).
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(|e| err("cuMemcpyHtoD", e))
    }

    /// Queues a copy of host bytes to device address `dst` on the thread's current stream.
    ///
    /// # Safety
    /// `src` must stay allocated until the copy has run (page-locked memory, kept alive by
    /// the destination); writes to it before then may or may not be seen.
    pub unsafe fn htod_async(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let _span = copy_span("memcpy HtoD (async)", src.len());
        // SAFETY: `dst` holds at least `src.len()` bytes; `src` as the caller promises.
        unsafe { result::memcpy_htod_async(dst, src, raw_for(self.ordinal)) }
            .map_err(|e| err("cuMemcpyHtoDAsync", e))
    }

    /// Copies device bytes at `src` to the host (waits for earlier work on the stream).
    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let _span = copy_span("memcpy DtoH", dst.len());
        // SAFETY: `src` holds at least `dst.len()` bytes.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(|e| err("cuMemcpyDtoH", e))
    }

    /// Copies `bytes` between device addresses, in stream order.
    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are live allocations of at least `bytes`.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, raw_for(self.ordinal)) }
            .map_err(|e| err("cuMemcpyDtoD", e))
    }

    /// Sets `bytes` at `dst` to zero, in stream order.
    pub fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live allocation of at least `bytes`.
        unsafe { result::memset_d8_async(dst, 0, bytes, raw_for(self.ordinal)) }
            .map_err(|e| err("cuMemsetD8", e))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        result::ctx::synchronize().map_err(|e| err("cuCtxSynchronize", e))
    }

    /// Loads a CUBIN (or PTX) image.
    pub fn load(self: &Arc<Self>, image: &[u8]) -> Result<Module> {
        self.bind()?;
        // the driver reads PTX as a NUL-terminated string; a CUBIN carries its own length
        let mut owned = image.to_vec();
        owned.push(0);
        // SAFETY: a complete image, alive for the call.
        let m = unsafe { result::module::load_data(owned.as_ptr() as *const c_void) }
            .map_err(|e| err("cuModuleLoadData", e))?;
        Ok(Module {
            gpu: self.clone(),
            raw: m,
        })
    }
}

/// A loaded module; unloaded when dropped.
pub struct Module {
    gpu: Arc<Gpu>,
    raw: sys::CUmodule,
}

// SAFETY: a CUmodule handle may be used from any thread with its context current.
unsafe impl Send for Module {}
// SAFETY: as for `Send`: `&Module` only passes the handle to driver calls, which
// are thread-safe for a handle with its context current.
unsafe impl Sync for Module {}

impl Module {
    /// The kernel named `name`.
    pub fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name).map_err(|_| Error::Value("kernel name holds a NUL".into()))?;
        self.gpu.bind()?;
        // SAFETY: a loaded module and a C string.
        let f = unsafe { result::module::get_function(self.raw, c) }
            .map_err(|e| err(&format!("cuModuleGetFunction({name})"), e))?;
        Ok(Function {
            raw: f,
            device: self.gpu.ordinal,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: loaded once, unloaded once; no launch uses it after the last owner.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// A kernel of a loaded module (valid while the module is).
#[derive(Clone, Copy)]
pub struct Function {
    raw: sys::CUfunction,
    device: usize,
}

// SAFETY: a CUfunction handle may be used from any thread with its context current.
unsafe impl Send for Function {}
// SAFETY: as for `Send`: a shared `Function` is a copyable handle that is only read.
unsafe impl Sync for Function {}

impl Function {
    /// Launches the kernel with pointer (or 64-bit) arguments `args`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters, and every pointer must address a live
    /// allocation of the size the kernel touches.
    pub unsafe fn launch(&self, grid: u32, block: u32, shared: u32, args: &[u64]) -> Result<()> {
        let mut vals: Vec<u64> = args.to_vec();
        let mut ptrs: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: as the caller promises; `vals` outlives the call, which copies the values.
        unsafe { self.launch_raw(grid, block, shared, &mut ptrs) }
    }

    /// Launches the kernel with `params[i]` pointing at the value of parameter `i`.
    ///
    /// # Safety
    /// As [`Function::launch`]; each pointer addresses a value of its parameter's type.
    pub unsafe fn launch_raw(
        &self,
        grid: u32,
        block: u32,
        shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: as the caller promises; the driver copies the values before returning.
        unsafe {
            result::launch_kernel(
                self.raw,
                (grid, 1, 1),
                (block, 1, 1),
                shared,
                raw_for(self.device),
                params,
            )
        }
        .map_err(|e| err("cuLaunchKernel", e))
    }
}

/// A pair of events timing the work between [`Timer::start`] and [`Timer::stop`] on the
/// thread's current stream.
pub struct Timer {
    start: Event,
    end: Event,
}

impl Timer {
    /// Two fresh timing events on `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Timer> {
        Ok(Timer {
            start: Event::on(gpu, true)?,
            end: Event::on(gpu, true)?,
        })
    }

    /// Records the start.
    pub fn start(&self) -> Result<()> {
        self.start.record_current()
    }

    /// Records the end.
    pub fn stop(&self) -> Result<()> {
        self.end.record_current()
    }

    /// Milliseconds between the two records (waits for the end).
    pub fn elapsed_ms(&self) -> Result<f32> {
        self.start.elapsed_ms(&self.end)
    }
}

/// Page-locked host memory (`cuMemHostAlloc`): the GPU's copy engines read and write it
/// directly, without staging through a driver buffer, so transfers from it run at the bus's
/// full speed. It is ordinary host memory to everything else.
pub struct PinnedHost {
    ptr: std::ptr::NonNull<u8>,
    gpu: Arc<Gpu>,
}

// SAFETY: the block is plain host memory owned by this value; the storage that holds it
// serialises access to the bytes.
unsafe impl Send for PinnedHost {}
// SAFETY: as for `Send`: `&PinnedHost` hands out the pointer only; the storage that
// holds it serialises access to the bytes.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `bytes` bytes (at least one) of page-locked memory, through GPU 0's context.
    pub fn alloc(bytes: usize) -> Result<PinnedHost> {
        let gpu = Gpu::get(0)?;
        gpu.bind()?;
        // SAFETY: a plain allocation; the pointer is freed once, in `drop`.
        let p = unsafe { result::malloc_host(bytes.max(1), 0) }.map_err(|e| {
            Error::Device(format!(
                "CUDA error in cuMemHostAlloc: cannot pin {bytes} bytes of host memory: {e:?}"
            ))
        })?;
        let ptr = std::ptr::NonNull::new(p as *mut u8)
            .ok_or_else(|| Error::Device("cuMemHostAlloc returned a null pointer".into()))?;
        Ok(PinnedHost { ptr, gpu })
    }

    /// The first byte.
    pub fn ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by `malloc_host` in `alloc`, freed only here.
            let _ = unsafe { result::free_host(self.ptr.as_ptr() as *mut c_void) };
        }
    }
}

/// A profiler event for a copy of `bytes` between host and device (the span ends when the
/// synchronous copy returns, or when an asynchronous one is queued).
fn copy_span(name: &str, bytes: usize) -> Option<crate::profiler::Span> {
    let mut s = crate::profiler::span(crate::profiler::EventKind::Copy, || name.to_string())?;
    s.work(bytes as u64, 0);
    Some(s)
}
