//! Reference-counted, lockable element buffers. Every tensor view of the same data shares
//! one `Storage`; the lock makes concurrent reads and in-place writes sound, and the version
//! counter tells autograd when saved data was overwritten.

use super::element::Element;
use crate::device::Device;
use crate::ir::dtype::DType;
use crate::{Error, Result};
use std::any::Any;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::pages::{self, ALIGN};

enum Owner {
    /// A block from [`pages::alloc_zeroed`] of the storage's size.
    Block,
    /// Nothing to free (empty buffer).
    Empty,
    /// A caller's `Vec` adopted without copying; dropping it frees the memory.
    Adopted(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// GPU memory from the caching allocator (`ptr` is a device address, never read here).
    Cuda(crate::device::cuda::memory::DeviceBuffer),
    /// Page-locked host memory (`pin_memory`), freed through the driver.
    Pinned(#[allow(dead_code)] crate::device::cuda::driver::PinnedHost),
}

/// A tensor's memory: one allocation of one dtype on one device, with a version counter and a lock.
pub struct Storage {
    ptr: NonNull<u8>,
    nbytes: usize,
    owner: Owner,
    dtype: DType,
    device: Device,
    lock: RwLock<()>,
    version: AtomicU64,
    id: u64,
    /// Came from the pool of freed buffers (so it is not known to be zero).
    reused: bool,
}

// SAFETY: the buffer is only read under `lock.read()` and written under `lock.write()`
// (see `read`/`write`), and the memory itself is plain data owned by the storage.
unsafe impl Send for Storage {}
// SAFETY: as for `Send`: shared references reach the bytes only through `read` and
// `write`, which hold `lock` for reading or writing.
unsafe impl Sync for Storage {}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// PyTorch's error for host memory the system refuses.
pub(crate) fn cpu_oom(nbytes: usize) -> Error {
    Error::OutOfMemory(format!(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate {nbytes} bytes"
    ))
}

/// The bytes of `len` elements of `dtype`; an error when no allocation can hold them.
pub(crate) fn byte_len(dtype: DType, len: usize) -> Result<usize> {
    len.checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::OutOfMemory(format!(
                "DefaultCPUAllocator: can't allocate memory: {len} elements of {dtype} overflow the address space"
            ))
        })
}

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Number of storages this thread has allocated, the compiled calls it made included (they
/// run on a pool worker): tests use it to prove that views, `expand` and buffer reuse
/// allocate nothing.
pub fn allocation_count() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

/// Counts `n` storages that another thread allocated for this one.
pub(crate) fn add_allocations(n: u64) {
    ALLOCATIONS.with(|c| c.set(c.get() + n));
}

/// Host memory held by tensor storages, like `torch.cuda.memory_stats()` for the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryStats {
    /// Bytes held by live storages now.
    pub allocated: u64,
    /// The most bytes held at once.
    pub max_allocated: u64,
    /// Bytes of every storage ever created.
    pub total_allocated: u64,
    /// Bytes of every storage ever dropped.
    pub total_freed: u64,
}

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static TOTAL_ALLOC: AtomicU64 = AtomicU64::new(0);
static TOTAL_FREED: AtomicU64 = AtomicU64::new(0);

/// The process's host-memory statistics (every thread's storages).
pub fn memory_stats() -> HostMemoryStats {
    HostMemoryStats {
        allocated: LIVE.load(Ordering::Relaxed),
        max_allocated: PEAK.load(Ordering::Relaxed),
        total_allocated: TOTAL_ALLOC.load(Ordering::Relaxed),
        total_freed: TOTAL_FREED.load(Ordering::Relaxed),
    }
}

/// Counts a host storage coming or going, and tells the profiler.
fn account(nbytes: usize, alloc: bool) {
    if nbytes == 0 {
        return;
    }
    let n = nbytes as u64;
    if alloc {
        TOTAL_ALLOC.fetch_add(n, Ordering::Relaxed);
        let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
        PEAK.fetch_max(live, Ordering::Relaxed);
        crate::profiler::record_memory(crate::profiler::MemDevice::Cpu, nbytes as i64);
    } else {
        TOTAL_FREED.fetch_add(n, Ordering::Relaxed);
        LIVE.fetch_sub(n, Ordering::Relaxed);
        crate::profiler::record_memory(crate::profiler::MemDevice::Cpu, -(nbytes as i64));
    }
}

impl Storage {
    /// A zero-filled buffer of `len` elements of `dtype`; an error when memory cannot hold it.
    pub fn zeros(dtype: DType, len: usize) -> Result<Storage> {
        let s = Storage::for_overwrite(dtype, len)?;
        if s.reused {
            // SAFETY: the buffer has nbytes bytes and nobody else holds it yet.
            unsafe { std::ptr::write_bytes(s.ptr.as_ptr(), 0, s.nbytes) };
        }
        Ok(s)
    }

    /// A buffer whose every element the caller will overwrite before reading: its contents
    /// are initialised but unspecified (zeros, or the data of a recycled buffer).
    /// A failed allocation is an error (PyTorch's "can't allocate memory"), never an abort.
    pub fn for_overwrite(dtype: DType, len: usize) -> Result<Storage> {
        let nbytes = byte_len(dtype, len)?;
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        if let Some(ptr) = pool::take(nbytes) {
            let mut s = Storage::from_parts(ptr, nbytes, Owner::Block, dtype);
            s.reused = true;
            return Ok(s);
        }
        if nbytes == 0 {
            // dangling but aligned, so empty slices of any element type are valid
            let ptr = NonNull::new(ALIGN as *mut u8).unwrap_or(NonNull::dangling());
            return Ok(Storage::from_parts(ptr, 0, Owner::Empty, dtype));
        }
        super::limit::check(nbytes, LIVE.load(Ordering::Relaxed))?;
        let ptr = pages::alloc_zeroed(nbytes).ok_or_else(|| cpu_oom(nbytes))?;
        Ok(Storage::from_parts(ptr, nbytes, Owner::Block, dtype))
    }

    /// Adopts a vector's memory without copying it.
    pub fn from_vec<T: Element>(v: Vec<T>) -> Storage {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        let mut v = v;
        let nbytes = std::mem::size_of_val(v.as_slice());
        let ptr = NonNull::new(v.as_mut_ptr() as *mut u8).unwrap_or(NonNull::dangling());
        Storage::from_parts(ptr, nbytes, Owner::Adopted(Box::new(v)), T::DTYPE)
    }

    /// Lends another library's host memory (DLPack, NumPy) without copying: `keep` is
    /// dropped, releasing the memory to its owner, when the storage goes.
    ///
    /// # Safety
    /// `ptr` must point to `nbytes` bytes, aligned for `dtype`, that stay valid for reads
    /// and writes until `keep` is dropped.
    pub(crate) unsafe fn from_foreign(
        ptr: NonNull<u8>,
        nbytes: usize,
        dtype: DType,
        keep: Box<dyn Any + Send + Sync>,
    ) -> Storage {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        Storage::from_parts(ptr, nbytes, Owner::Adopted(keep), dtype)
    }

    /// `len` elements of `dtype` on GPU `device`, contents unspecified (every kernel output
    /// overwrites them).
    pub fn cuda_for_overwrite(device: usize, dtype: DType, len: usize) -> Result<Storage> {
        let nbytes = byte_len(dtype, len)?;
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        let buf = crate::device::cuda::memory::DeviceBuffer::alloc(device, nbytes)?;
        Ok(Storage::from_device(buf, dtype))
    }

    /// A storage of `dtype` elements over device buffer `buf` (its contents as they are).
    pub fn from_device(buf: crate::device::cuda::memory::DeviceBuffer, dtype: DType) -> Storage {
        let ptr = NonNull::new(buf.ptr() as *mut u8).unwrap_or(NonNull::dangling());
        let device = Device::Cuda(buf.device());
        let mut s = Storage::from_parts(ptr, buf.len(), Owner::Cuda(buf), dtype);
        s.device = device;
        s
    }

    /// The device buffer of a GPU storage.
    pub fn device_buffer(&self) -> Option<&crate::device::cuda::memory::DeviceBuffer> {
        match &self.owner {
            Owner::Cuda(b) => Some(b),
            _ => None,
        }
    }

    /// A zero-filled buffer of `len` elements in page-locked host memory; an error without
    /// a GPU driver.
    pub fn pinned(dtype: DType, len: usize) -> Result<Storage> {
        let nbytes = byte_len(dtype, len)?;
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        let block = crate::device::cuda::driver::PinnedHost::alloc(nbytes)?;
        let ptr = block.ptr();
        // SAFETY: the block holds at least `nbytes` bytes and nobody else has it yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, nbytes) };
        Ok(Storage::from_parts(
            ptr,
            nbytes,
            Owner::Pinned(block),
            dtype,
        ))
    }

    /// Whether the buffer is page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        matches!(self.owner, Owner::Pinned(_))
    }

    /// The device address of a GPU storage (`None` on the CPU).
    pub fn device_ptr(&self) -> Option<u64> {
        matches!(self.owner, Owner::Cuda(_)).then(|| self.ptr.as_ptr() as u64)
    }

    fn from_parts(ptr: NonNull<u8>, nbytes: usize, owner: Owner, dtype: DType) -> Storage {
        // device memory is the caching allocator's to count
        if !matches!(owner, Owner::Cuda(_)) {
            account(nbytes, true);
        }
        Storage {
            ptr,
            nbytes,
            owner,
            dtype,
            device: Device::Cpu,
            lock: RwLock::new(()),
            version: AtomicU64::new(0),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            reused: false,
        }
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.nbytes / self.dtype.size()
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }
    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }
    /// A process-unique id; also the global lock order.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Bumped by every in-place write.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
    /// Records an in-place write.
    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }
    /// Host code never dereferences device memory: the CUDA paths move data with the
    /// driver. Reaching this with a GPU storage is a bug in smelt, not bad input.
    fn assert_host(&self) {
        assert!(
            self.device == Device::Cpu,
            "internal error: host access to a {} storage",
            self.device
        );
    }

    /// Address of the first byte (for identity checks and zero-copy tests).
    pub fn data_addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Locks host memory for reading (shared with other readers); panics on device memory.
    pub fn read(&self) -> ReadGuard<'_> {
        self.assert_host();
        ReadGuard {
            storage: self,
            _g: self.lock.read().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Locks host memory for writing (exclusive); panics on device memory.
    pub fn write(&self) -> WriteGuard<'_> {
        self.assert_host();
        WriteGuard {
            storage: self,
            _g: self.lock.write().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

impl Storage {
    /// The elements as a `Vec`: the adopted vector itself when there is one (no copy).
    pub fn into_vec<T: Element>(mut self) -> Vec<T> {
        match std::mem::replace(&mut self.owner, Owner::Empty) {
            Owner::Adopted(b) => match b.downcast::<Vec<T>>() {
                Ok(v) => return *v,
                Err(b) => self.owner = Owner::Adopted(b),
            },
            other => self.owner = other,
        }
        self.read().as_slice::<T>().to_vec()
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if !matches!(self.owner, Owner::Cuda(_)) {
            account(self.nbytes, false);
        }
        if let Owner::Block = self.owner
            && !pool::give(self.ptr, self.nbytes)
        {
            // SAFETY: allocated in `for_overwrite` with exactly this size.
            unsafe { pages::free(self.ptr, self.nbytes) }
        }
    }
}

/// Shared access to a storage's elements.
pub struct ReadGuard<'a> {
    storage: &'a Storage,
    _g: RwLockReadGuard<'a, ()>,
}

/// Exclusive access to a storage's elements.
pub struct WriteGuard<'a> {
    storage: &'a Storage,
    _g: RwLockWriteGuard<'a, ()>,
}

impl ReadGuard<'_> {
    /// Address of the first byte.
    pub fn ptr(&self) -> *const u8 {
        self.storage.ptr.as_ptr()
    }
    /// The whole buffer as `T`. Panics if `T` is not the storage's dtype (a bug, not input).
    pub fn as_slice<T: Element>(&self) -> &[T] {
        assert_eq!(T::DTYPE, self.storage.dtype, "storage dtype mismatch");
        // SAFETY: the buffer holds `len` initialised elements of T (zeroed or adopted, bool
        // buffers only ever hold 0 or 1), aligned for T, and no writer exists while we read.
        unsafe { std::slice::from_raw_parts(self.ptr() as *const T, self.storage.len()) }
    }
}

impl WriteGuard<'_> {
    /// Address of the first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.storage.ptr.as_ptr()
    }
    /// The whole buffer as `T`. Panics if `T` is not the storage's dtype.
    pub fn as_slice<T: Element>(&self) -> &[T] {
        assert_eq!(T::DTYPE, self.storage.dtype, "storage dtype mismatch");
        // SAFETY: as in ReadGuard::as_slice; we hold the only guard.
        unsafe { std::slice::from_raw_parts(self.ptr() as *const T, self.storage.len()) }
    }
    /// The whole buffer as mutable `T`. Panics if `T` is not the storage's dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        assert_eq!(T::DTYPE, self.storage.dtype, "storage dtype mismatch");
        // SAFETY: as above, and the write lock makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr() as *mut T, self.storage.len()) }
    }
}

/// Recently freed large buffers, kept for reuse. On these machines a fresh 64 MiB allocation
/// costs more in first-touch page faults than the kernel that fills it, so eager outputs
/// take memory of the same size that an earlier tensor gave back (a caching allocator, as
/// PyTorch keeps for CUDA).
pub(crate) mod pool {
    use super::pages;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    /// Smaller buffers come from malloc's own free lists cheaply. Above this size, a chunk
    /// malloc recycles comes back cleared by a `memset` (`alloc_zeroed`), so the pool keeps
    /// buffers from here up: the activations of a small model's eager step, a few hundred
    /// KiB each, are then reused rather than cleared again (the figures are in
    /// BENCHMARKS.md's history).
    pub(crate) const MIN_BYTES: usize = 1 << 16;
    /// At most this much freed memory is held.
    const MAX_BYTES: usize = 512 << 20;

    struct Block(NonNull<u8>, usize);
    // SAFETY: a pooled block is owned by the pool alone until `take` hands it out.
    unsafe impl Send for Block {}

    static FREE: Mutex<(Vec<Block>, usize)> = Mutex::new((Vec::new(), 0));

    /// A pooled block of exactly `nbytes`, if there is one.
    pub fn take(nbytes: usize) -> Option<NonNull<u8>> {
        if nbytes < MIN_BYTES {
            return None;
        }
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.0.iter().position(|b| b.1 == nbytes)?;
        let b = free.0.swap_remove(i);
        free.1 -= nbytes;
        Some(b.0)
    }

    /// Keeps a freed block; false when it should go back to the allocator instead.
    pub fn give(ptr: NonNull<u8>, nbytes: usize) -> bool {
        if nbytes < MIN_BYTES {
            return false;
        }
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        while free.1 + nbytes > MAX_BYTES && !free.0.is_empty() {
            // evict the oldest block
            let old = free.0.remove(0);
            free.1 -= old.1;
            // SAFETY: pooled blocks came from `pages::alloc_zeroed` with this size.
            unsafe { pages::free(old.0, old.1) }
        }
        if nbytes > MAX_BYTES {
            return false;
        }
        free.1 += nbytes;
        free.0.push(Block(ptr, nbytes));
        true
    }
}
