//! A caching device allocator in PyTorch's manner: freed blocks are kept in size-binned free
//! lists and handed out again, so steady-state training loops stop calling the driver.
//!
//! Requests are rounded up (to 512 bytes up to 1 MiB, to 2 MiB above) and served best-fit
//! from the free blocks of their pool (small ≤ 1 MiB, large above); a large block is reused
//! only for a request of at least half its size, so a small tensor never pins a huge block.
//! When the raw allocation fails, the cache is released and the allocation retried once;
//! failing again is an out-of-memory error that says what was asked and what is held.
//! The bookkeeping is written against [`RawAlloc`], so it is tested without a GPU.
//!
//! Streams: a block belongs to the stream it was allocated on and goes back to that stream's
//! free lists, so only work ordered after its last use can receive it again. A block that
//! other streams used too ([`CachingAllocator::record_stream`], PyTorch's `record_stream`)
//! waits, when freed, for an event recorded on each of them before it is handed out again.

use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// Largest request served from the small pool.
pub const SMALL_LIMIT: usize = 1 << 20;
/// Rounding of small requests.
pub const SMALL_ROUND: usize = 512;
/// Rounding of large requests.
pub const LARGE_ROUND: usize = 2 << 20;

/// Why a raw allocation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawError {
    /// The device has no room for it.
    OutOfMemory,
    /// Any other driver failure.
    Other(String),
}

/// A stream as the allocator knows it: the driver's handle, 0 for the default stream.
pub type StreamId = u64;

/// The raw device allocation the cache sits on (`cuMemAlloc`/`cuMemFree` on a GPU), and
/// the events that tell it when a stream's work is done.
pub trait RawAlloc {
    /// Allocates `bytes` (> 0) and returns the device address.
    fn raw_alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError>;
    /// Frees an address `raw_alloc` returned.
    fn raw_free(&mut self, ptr: u64) -> std::result::Result<(), RawError>;
    /// `(free, total)` bytes of the device, when known (for error messages).
    fn mem_info(&self) -> Option<(usize, usize)> {
        None
    }
    /// Records an event at the current end of `stream`'s work.
    fn record_event(&mut self, stream: StreamId) -> std::result::Result<u64, RawError>;
    /// Whether the work before `event` is done; a finished event is destroyed.
    fn event_done(&mut self, event: u64) -> std::result::Result<bool, RawError>;
    /// Waits for the work before `event` and destroys it.
    fn event_wait(&mut self, event: u64) -> std::result::Result<(), RawError>;
}

/// A live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// The device address (0 for an empty allocation).
    pub ptr: u64,
    /// The bytes held (the rounded request).
    pub size: usize,
    /// The stream it was allocated on.
    pub stream: StreamId,
}

/// What the allocator knows of a live block.
struct Live {
    size: usize,
    stream: StreamId,
    /// Other streams that used it.
    uses: Vec<StreamId>,
}

/// Free lists of one pool: (stream, size) → addresses.
type Pool = BTreeMap<(StreamId, usize), Vec<u64>>;

/// The memory statistics of `torch.cuda` (`memory_allocated()` and friends).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in live blocks.
    pub allocated: usize,
    /// Peak of `allocated` since creation or the last reset.
    pub max_allocated: usize,
    /// Bytes obtained from the device: live plus cached blocks.
    pub reserved: usize,
    /// Peak of `reserved`.
    pub max_reserved: usize,
    /// Raw allocations made.
    pub raw_allocs: usize,
    /// Raw frees made.
    pub raw_frees: usize,
}

/// The caching allocator of one device.
pub struct CachingAllocator<B: RawAlloc> {
    raw: B,
    device: usize,
    /// Free blocks per pool.
    small: Pool,
    large: Pool,
    live: HashMap<u64, Live>,
    /// Freed blocks waiting for events on the other streams that used them.
    pending: Vec<(Block, Vec<u64>)>,
    stats: MemoryStats,
}

/// Bytes in MiB with two decimals, as PyTorch prints them.
fn mib(b: usize) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn device_err(e: RawError) -> Error {
    match e {
        RawError::OutOfMemory => Error::OutOfMemory("CUDA error: out of memory".into()),
        RawError::Other(e) => Error::Device(e),
    }
}

/// The size a request of `bytes` is served with.
pub fn round_size(bytes: usize) -> Option<usize> {
    let r = if bytes <= SMALL_LIMIT {
        SMALL_ROUND
    } else {
        LARGE_ROUND
    };
    bytes.max(1).checked_next_multiple_of(r)
}

impl<B: RawAlloc> CachingAllocator<B> {
    /// A cache over `raw` for device `device` (used in messages).
    pub fn new(raw: B, device: usize) -> Self {
        CachingAllocator {
            raw,
            device,
            small: BTreeMap::new(),
            large: BTreeMap::new(),
            live: HashMap::new(),
            pending: Vec::new(),
            stats: MemoryStats::default(),
        }
    }

    /// The raw backend.
    pub fn raw(&self) -> &B {
        &self.raw
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// `torch.cuda.memory_allocated()`.
    pub fn memory_allocated(&self) -> usize {
        self.stats.allocated
    }

    /// `torch.cuda.max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> usize {
        self.stats.max_allocated
    }

    /// `torch.cuda.memory_reserved()`.
    pub fn memory_reserved(&self) -> usize {
        self.stats.reserved
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_memory_stats(&mut self) {
        self.stats.max_allocated = self.stats.allocated;
        self.stats.max_reserved = self.stats.reserved;
    }

    fn pool(&mut self, size: usize) -> &mut Pool {
        if size <= SMALL_LIMIT {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// A cached block of `stream` for `size` (rounded), best fit.
    fn take_cached(&mut self, size: usize, stream: StreamId) -> Option<Block> {
        let large = size > SMALL_LIMIT;
        let pool = self.pool(size);
        let (&key, _) = pool.range((stream, size)..=(stream, usize::MAX)).next()?;
        let found = key.1;
        // a large block serves only requests of at least half its size
        if large && found > size.saturating_mul(2) {
            return None;
        }
        let list = pool.get_mut(&key)?;
        let ptr = list.pop()?;
        if list.is_empty() {
            pool.remove(&key);
        }
        Some(Block {
            ptr,
            size: found,
            stream,
        })
    }

    fn put_free(&mut self, b: Block) {
        self.pool(b.size)
            .entry((b.stream, b.size))
            .or_default()
            .push(b.ptr);
    }

    /// Moves the freed blocks whose events have all completed to their free lists.
    fn collect_pending(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let events = &mut self.pending[i].1;
            let mut left = Vec::new();
            for &e in events.iter() {
                if !self.raw.event_done(e).map_err(device_err)? {
                    left.push(e);
                }
            }
            *events = left;
            if events.is_empty() {
                let (b, _) = self.pending.swap_remove(i);
                self.put_free(b);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Allocates at least `bytes` for work on `stream`.
    pub fn alloc(&mut self, bytes: usize, stream: StreamId) -> Result<Block> {
        if bytes == 0 {
            return Ok(Block {
                ptr: 0,
                size: 0,
                stream,
            });
        }
        let Some(size) = round_size(bytes) else {
            return Err(self.oom(bytes));
        };
        if !self.pending.is_empty() {
            self.collect_pending()?;
        }
        let block = match self.take_cached(size, stream) {
            Some(b) => b,
            None => {
                let ptr = match self.raw.raw_alloc(size) {
                    Ok(p) => p,
                    Err(RawError::OutOfMemory) => {
                        // give the cache back to the device and try once more
                        self.empty_cache()?;
                        match self.raw.raw_alloc(size) {
                            Ok(p) => p,
                            Err(RawError::OutOfMemory) => return Err(self.oom(bytes)),
                            Err(RawError::Other(e)) => return Err(Error::Device(e)),
                        }
                    }
                    Err(RawError::Other(e)) => return Err(Error::Device(e)),
                };
                self.stats.raw_allocs += 1;
                self.stats.reserved += size;
                self.stats.max_reserved = self.stats.max_reserved.max(self.stats.reserved);
                Block { ptr, size, stream }
            }
        };
        self.live.insert(
            block.ptr,
            Live {
                size: block.size,
                stream,
                uses: Vec::new(),
            },
        );
        self.stats.allocated += block.size;
        self.stats.max_allocated = self.stats.max_allocated.max(self.stats.allocated);
        self.tell_profiler(block.size as i64);
        Ok(block)
    }

    fn tell_profiler(&self, delta: i64) {
        let device = crate::profiler::MemDevice::Cuda(self.device as u32);
        crate::profiler::record_memory(device, delta);
    }

    fn oom(&self, bytes: usize) -> Error {
        let cached = self.stats.reserved - self.stats.allocated;
        let device = match self.raw.mem_info() {
            Some((free, total)) => format!(
                "GPU {} has a total capacity of {} of which {} is free. ",
                self.device,
                mib(total),
                mib(free)
            ),
            None => format!("GPU {}. ", self.device),
        };
        Error::OutOfMemory(format!(
            "CUDA out of memory. Tried to allocate {}. {device}Of the memory held by smelt, {} is allocated and {} is reserved but unallocated.",
            mib(bytes),
            mib(self.stats.allocated),
            mib(cached)
        ))
    }

    fn not_held(ptr: u64) -> Error {
        Error::Device(format!(
            "device address {ptr:#x} is not an allocation this allocator holds"
        ))
    }

    /// Notes that work on `stream` uses live block `ptr` (PyTorch's `record_stream`): when
    /// freed, the block waits for that work before it is reused.
    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<()> {
        let l = self.live.get_mut(&ptr).ok_or_else(|| Self::not_held(ptr))?;
        if l.stream != stream && !l.uses.contains(&stream) {
            l.uses.push(stream);
        }
        Ok(())
    }

    /// Returns a block to the cache. An address that is not live is an error.
    pub fn free(&mut self, block: Block) -> Result<()> {
        if block.ptr == 0 && block.size == 0 {
            return Ok(());
        }
        let l = self
            .live
            .remove(&block.ptr)
            .ok_or_else(|| Self::not_held(block.ptr))?;
        self.stats.allocated -= l.size;
        self.tell_profiler(-(l.size as i64));
        let b = Block {
            ptr: block.ptr,
            size: l.size,
            stream: l.stream,
        };
        if l.uses.is_empty() {
            self.put_free(b);
            return Ok(());
        }
        let mut events = Vec::new();
        for s in l.uses {
            match self.raw.record_event(s) {
                Ok(e) => events.push(e),
                Err(e) => {
                    // without its events the block is never known to be free: it stays
                    // out of the free lists (still reserved)
                    for e in events {
                        let _ = self.raw.event_wait(e);
                    }
                    return Err(device_err(e));
                }
            }
        }
        self.pending.push((b, events));
        Ok(())
    }

    /// Forgets stream `stream`, whose work is done and which is about to be destroyed (its
    /// handle may name another stream later): blocks of its free lists go to the default
    /// stream's, live blocks allocated on it will return there too, and its recorded uses
    /// need no event.
    pub fn release_stream(&mut self, stream: StreamId) {
        for l in self.live.values_mut() {
            if l.stream == stream {
                l.stream = 0;
            }
            l.uses.retain(|&s| s != stream);
        }
        for large in [false, true] {
            let pool = if large {
                &mut self.large
            } else {
                &mut self.small
            };
            let keys: Vec<(StreamId, usize)> = pool
                .range((stream, 0)..=(stream, usize::MAX))
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                if let Some(ptrs) = pool.remove(&k) {
                    pool.entry((0, k.1)).or_default().extend(ptrs);
                }
            }
        }
    }

    /// `torch.cuda.empty_cache()`: hands every cached block back to the device (after the
    /// events of freed blocks other streams used).
    pub fn empty_cache(&mut self) -> Result<()> {
        for (b, events) in std::mem::take(&mut self.pending) {
            for e in events {
                self.raw.event_wait(e).map_err(device_err)?;
            }
            self.put_free(b);
        }
        let pools = [
            std::mem::take(&mut self.small),
            std::mem::take(&mut self.large),
        ];
        let mut first_err = None;
        for pool in pools {
            for ((_, size), ptrs) in pool {
                for p in ptrs {
                    match self.raw.raw_free(p) {
                        Ok(()) => {
                            self.stats.raw_frees += 1;
                            self.stats.reserved -= size;
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(RawError::OutOfMemory) => Err(Error::Device("cuMemFree failed".into())),
            Some(RawError::Other(e)) => Err(Error::Device(e)),
        }
    }

    /// Bytes held in free lists.
    pub fn cached_bytes(&self) -> usize {
        self.stats.reserved - self.stats.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `capacity` bytes handing out increasing fake addresses.
    struct Fake {
        capacity: usize,
        used: usize,
        next: u64,
        sizes: HashMap<u64, usize>,
        fail_other: bool,
        /// Recorded events and their streams.
        events: HashMap<u64, StreamId>,
        /// Streams whose work is done.
        idle: Vec<StreamId>,
    }

    impl Fake {
        fn new(capacity: usize) -> Fake {
            Fake {
                capacity,
                used: 0,
                next: 0x1000,
                sizes: HashMap::new(),
                fail_other: false,
                events: HashMap::new(),
                idle: Vec::new(),
            }
        }
    }

    impl RawAlloc for Fake {
        fn raw_alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError> {
            if self.fail_other {
                return Err(RawError::Other("driver gone".into()));
            }
            if self.used + bytes > self.capacity {
                return Err(RawError::OutOfMemory);
            }
            self.used += bytes;
            let p = self.next;
            self.next += bytes as u64;
            self.sizes.insert(p, bytes);
            Ok(p)
        }
        fn raw_free(&mut self, ptr: u64) -> std::result::Result<(), RawError> {
            let s = self
                .sizes
                .remove(&ptr)
                .ok_or(RawError::Other("bad free".into()))?;
            self.used -= s;
            Ok(())
        }
        fn mem_info(&self) -> Option<(usize, usize)> {
            Some((self.capacity - self.used, self.capacity))
        }
        fn record_event(&mut self, stream: StreamId) -> std::result::Result<u64, RawError> {
            let e = self.events.len() as u64 + 100;
            self.events.insert(e, stream);
            Ok(e)
        }
        fn event_done(&mut self, event: u64) -> std::result::Result<bool, RawError> {
            Ok(self.idle.contains(&self.events[&event]))
        }
        fn event_wait(&mut self, event: u64) -> std::result::Result<(), RawError> {
            let s = self.events[&event];
            self.idle.push(s);
            Ok(())
        }
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn sizes_round_by_pool() {
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(MIB), Some(MIB));
        assert_eq!(round_size(MIB + 1), Some(2 * MIB));
        assert_eq!(round_size(5 * MIB), Some(6 * MIB));
        assert_eq!(round_size(usize::MAX), None);
    }

    #[test]
    fn freed_blocks_are_reused_without_the_driver() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let b1 = a.alloc(1000, 0).unwrap();
        assert_eq!(b1.size, 1024);
        a.free(b1).unwrap();
        let b2 = a.alloc(700, 0).unwrap();
        assert_eq!(b2, b1, "the cached 1024-byte block is reused");
        assert_eq!(a.stats().raw_allocs, 1);
        assert_eq!(a.memory_allocated(), 1024);
        assert_eq!(a.memory_reserved(), 1024);
    }

    #[test]
    fn statistics_follow_torch_cuda() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let x = a.alloc(3 * MIB, 0).unwrap();
        let y = a.alloc(100, 0).unwrap();
        assert_eq!(a.memory_allocated(), 4 * MIB + 512);
        a.free(x).unwrap();
        assert_eq!(a.memory_allocated(), 512);
        assert_eq!(a.max_memory_allocated(), 4 * MIB + 512);
        assert_eq!(a.memory_reserved(), 4 * MIB + 512);
        assert_eq!(a.cached_bytes(), 4 * MIB);
        a.empty_cache().unwrap();
        assert_eq!(a.memory_reserved(), 512);
        assert_eq!(a.raw().used, 512);
        a.reset_peak_memory_stats();
        assert_eq!(a.max_memory_allocated(), 512);
        a.free(y).unwrap();
        assert_eq!(a.memory_allocated(), 0);
    }

    #[test]
    fn a_small_request_does_not_take_a_large_block() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let big = a.alloc(8 * MIB, 0).unwrap();
        a.free(big).unwrap();
        let small = a.alloc(2 * MIB, 0).unwrap();
        assert_ne!(small.ptr, big.ptr);
        assert_eq!(a.stats().raw_allocs, 2);
        a.free(small).unwrap();
        // half the size or more reuses it
        let half = a.alloc(4 * MIB, 0).unwrap();
        assert_eq!(half.ptr, big.ptr);
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 0);
        let x = a.alloc(6 * MIB, 0).unwrap();
        a.free(x).unwrap();
        // 6 MiB cached, 4 free: 8 MiB only fits once the cache is released
        let y = a.alloc(8 * MIB, 0).unwrap();
        assert_eq!(y.size, 8 * MIB);
        assert_eq!(a.memory_reserved(), 8 * MIB);
        assert_eq!(a.stats().raw_frees, 1);
    }

    #[test]
    fn out_of_memory_says_what_was_asked_and_held() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 3);
        let _x = a.alloc(6 * MIB, 0).unwrap();
        let y = a.alloc(2 * MIB, 0).unwrap();
        a.free(y).unwrap();
        let e = a.alloc(7 * MIB, 0).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("CUDA out of memory. Tried to allocate 7.00 MiB"),
            "{e}"
        );
        assert!(e.contains("GPU 3 has a total capacity of 10.00 MiB"), "{e}");
        assert!(e.contains("6.00 MiB is allocated"), "{e}");
        // the cached 2 MiB was released while retrying
        assert!(e.contains("0.00 MiB is reserved but unallocated"), "{e}");
        let huge = a.alloc(usize::MAX, 0).unwrap_err().to_string();
        assert!(huge.contains("Tried to allocate"), "{huge}");
    }

    #[test]
    fn bad_frees_and_driver_errors_are_errors() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 0);
        let x = a.alloc(10, 0).unwrap();
        a.free(x).unwrap();
        let e = a.free(x).unwrap_err().to_string();
        assert!(e.contains("not an allocation"), "{e}");
        assert_eq!(a.alloc(0, 0).unwrap().size, 0);
        a.free(Block {
            ptr: 0,
            size: 0,
            stream: 0,
        })
        .unwrap();
        a.raw.fail_other = true;
        let e = a.alloc(4 * MIB, 0).unwrap_err().to_string();
        assert!(e.contains("driver gone"), "{e}");
    }

    #[test]
    fn a_block_returns_to_the_stream_it_was_allocated_on() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let x = a.alloc(1000, 7).unwrap();
        assert_eq!(x.stream, 7);
        a.free(x).unwrap();
        // another stream's work may not be ordered after the last use: a fresh block
        let y = a.alloc(1000, 0).unwrap();
        assert_ne!(y.ptr, x.ptr);
        // the same stream is
        let z = a.alloc(1000, 7).unwrap();
        assert_eq!(z.ptr, x.ptr);
        assert_eq!(a.stats().raw_allocs, 2);
    }

    #[test]
    fn a_block_used_on_other_streams_waits_for_their_events() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let x = a.alloc(3 * MIB, 0).unwrap();
        a.record_stream(x.ptr, 5).unwrap();
        a.record_stream(x.ptr, 5).unwrap();
        // its own stream needs no event
        a.record_stream(x.ptr, 0).unwrap();
        a.free(x).unwrap();
        assert_eq!(a.raw().events.len(), 1, "one event, on stream 5");
        assert_eq!(a.memory_allocated(), 0);
        assert_eq!(a.memory_reserved(), 4 * MIB);
        // stream 5 is still busy: not reused
        let y = a.alloc(3 * MIB, 0).unwrap();
        assert_ne!(y.ptr, x.ptr);
        a.free(y).unwrap();
        a.raw.idle.push(5);
        let z1 = a.alloc(3 * MIB, 0).unwrap();
        let z2 = a.alloc(3 * MIB, 0).unwrap();
        let mut got = [z1.ptr, z2.ptr];
        got.sort();
        let mut want = [x.ptr, y.ptr];
        want.sort();
        assert_eq!(got, want, "both blocks are free again");
        assert_eq!(a.stats().raw_allocs, 2);
        let e = a.record_stream(0x42, 1).unwrap_err().to_string();
        assert!(e.contains("not an allocation"), "{e}");
    }

    #[test]
    fn empty_cache_waits_for_pending_blocks_and_released_streams_share() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let x = a.alloc(100, 3).unwrap();
        let live = a.alloc(100, 3).unwrap();
        a.record_stream(live.ptr, 4).unwrap();
        a.free(x).unwrap();
        a.release_stream(3);
        a.release_stream(4);
        let y = a.alloc(100, 0).unwrap();
        assert_eq!(
            y.ptr, x.ptr,
            "a released stream's blocks serve the default stream"
        );
        // a live block of a released stream returns to the default stream, with no event
        // for a released stream that used it
        a.free(live).unwrap();
        assert!(a.raw().events.is_empty());
        let z = a.alloc(100, 0).unwrap();
        assert_eq!(z.ptr, live.ptr);
        a.free(z).unwrap();
        a.record_stream(y.ptr, 9).unwrap();
        a.free(y).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.raw().idle, vec![9], "waited for stream 9's event");
        assert_eq!(a.memory_reserved(), 0);
        assert_eq!(a.raw().used, 0);
    }
}
