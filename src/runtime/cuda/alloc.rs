//! A caching device allocator in PyTorch's manner: freed blocks are kept in size-binned free
//! lists and handed out again, so steady-state training loops stop calling the driver.
//!
//! Requests are rounded up (to 512 bytes up to 1 MiB, to 2 MiB above) and served best-fit
//! from the free blocks of their pool (small ≤ 1 MiB, large above); a large block is reused
//! only for a request of at least half its size, so a small tensor never pins a huge block.
//! When the raw allocation fails, the cache is released and the allocation retried once;
//! failing again is an out-of-memory error that says what was asked and what is held.
//! The bookkeeping is written against [`RawAlloc`], so it is tested without a GPU.

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

/// The raw device allocation the cache sits on (`cuMemAlloc`/`cuMemFree` on a GPU).
pub trait RawAlloc {
    /// Allocates `bytes` (> 0) and returns the device address.
    fn raw_alloc(&mut self, bytes: usize) -> std::result::Result<u64, RawError>;
    /// Frees an address `raw_alloc` returned.
    fn raw_free(&mut self, ptr: u64) -> std::result::Result<(), RawError>;
    /// `(free, total)` bytes of the device, when known (for error messages).
    fn mem_info(&self) -> Option<(usize, usize)> {
        None
    }
}

/// A live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// The device address (0 for an empty allocation).
    pub ptr: u64,
    /// The bytes held (the rounded request).
    pub size: usize,
}

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
    /// Free blocks per pool: size → addresses.
    small: BTreeMap<usize, Vec<u64>>,
    large: BTreeMap<usize, Vec<u64>>,
    live: HashMap<u64, usize>,
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

    fn pool(&mut self, size: usize) -> &mut BTreeMap<usize, Vec<u64>> {
        if size <= SMALL_LIMIT {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// A cached block for `size` (rounded), best fit.
    fn take_cached(&mut self, size: usize) -> Option<Block> {
        let large = size > SMALL_LIMIT;
        let pool = self.pool(size);
        let (&found, _) = pool.range(size..).next()?;
        // a large block serves only requests of at least half its size
        if large && found > size.saturating_mul(2) {
            return None;
        }
        let list = pool.get_mut(&found)?;
        let ptr = list.pop()?;
        if list.is_empty() {
            pool.remove(&found);
        }
        Some(Block { ptr, size: found })
    }

    /// Allocates at least `bytes`.
    pub fn alloc(&mut self, bytes: usize) -> Result<Block> {
        if bytes == 0 {
            return Ok(Block { ptr: 0, size: 0 });
        }
        let Some(size) = round_size(bytes) else {
            return Err(self.oom(bytes));
        };
        let block = match self.take_cached(size) {
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
                Block { ptr, size }
            }
        };
        self.live.insert(block.ptr, block.size);
        self.stats.allocated += block.size;
        self.stats.max_allocated = self.stats.max_allocated.max(self.stats.allocated);
        Ok(block)
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
        Error::Device(format!(
            "CUDA out of memory. Tried to allocate {}. {device}Of the memory held by smelt, {} is allocated and {} is reserved but unallocated.",
            mib(bytes),
            mib(self.stats.allocated),
            mib(cached)
        ))
    }

    /// Returns a block to the cache. An address that is not live is an error.
    pub fn free(&mut self, block: Block) -> Result<()> {
        if block.ptr == 0 && block.size == 0 {
            return Ok(());
        }
        match self.live.remove(&block.ptr) {
            Some(size) => {
                self.stats.allocated -= size;
                self.pool(size).entry(size).or_default().push(block.ptr);
                Ok(())
            }
            None => Err(Error::Device(format!(
                "free of device address {:#x}, which this allocator does not hold",
                block.ptr
            ))),
        }
    }

    /// `torch.cuda.empty_cache()`: hands every cached block back to the device.
    pub fn empty_cache(&mut self) -> Result<()> {
        let pools = [
            std::mem::take(&mut self.small),
            std::mem::take(&mut self.large),
        ];
        let mut first_err = None;
        for pool in pools {
            for (size, ptrs) in pool {
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
    }

    impl Fake {
        fn new(capacity: usize) -> Fake {
            Fake {
                capacity,
                used: 0,
                next: 0x1000,
                sizes: HashMap::new(),
                fail_other: false,
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
        let b1 = a.alloc(1000).unwrap();
        assert_eq!(b1.size, 1024);
        a.free(b1).unwrap();
        let b2 = a.alloc(700).unwrap();
        assert_eq!(b2, b1, "the cached 1024-byte block is reused");
        assert_eq!(a.stats().raw_allocs, 1);
        assert_eq!(a.memory_allocated(), 1024);
        assert_eq!(a.memory_reserved(), 1024);
    }

    #[test]
    fn statistics_follow_torch_cuda() {
        let mut a = CachingAllocator::new(Fake::new(64 * MIB), 0);
        let x = a.alloc(3 * MIB).unwrap();
        let y = a.alloc(100).unwrap();
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
        let big = a.alloc(8 * MIB).unwrap();
        a.free(big).unwrap();
        let small = a.alloc(2 * MIB).unwrap();
        assert_ne!(small.ptr, big.ptr);
        assert_eq!(a.stats().raw_allocs, 2);
        a.free(small).unwrap();
        // half the size or more reuses it
        let half = a.alloc(4 * MIB).unwrap();
        assert_eq!(half.ptr, big.ptr);
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 0);
        let x = a.alloc(6 * MIB).unwrap();
        a.free(x).unwrap();
        // 6 MiB cached, 4 free: 8 MiB only fits once the cache is released
        let y = a.alloc(8 * MIB).unwrap();
        assert_eq!(y.size, 8 * MIB);
        assert_eq!(a.memory_reserved(), 8 * MIB);
        assert_eq!(a.stats().raw_frees, 1);
    }

    #[test]
    fn out_of_memory_says_what_was_asked_and_held() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 3);
        let _x = a.alloc(6 * MIB).unwrap();
        let y = a.alloc(2 * MIB).unwrap();
        a.free(y).unwrap();
        let e = a.alloc(7 * MIB).unwrap_err().to_string();
        assert!(
            e.contains("CUDA out of memory. Tried to allocate 7.00 MiB"),
            "{e}"
        );
        assert!(e.contains("GPU 3 has a total capacity of 10.00 MiB"), "{e}");
        assert!(e.contains("6.00 MiB is allocated"), "{e}");
        // the cached 2 MiB was released while retrying
        assert!(e.contains("0.00 MiB is reserved but unallocated"), "{e}");
        let huge = a.alloc(usize::MAX).unwrap_err().to_string();
        assert!(huge.contains("Tried to allocate"), "{huge}");
    }

    #[test]
    fn bad_frees_and_driver_errors_are_errors() {
        let mut a = CachingAllocator::new(Fake::new(10 * MIB), 0);
        let x = a.alloc(10).unwrap();
        a.free(x).unwrap();
        let e = a.free(x).unwrap_err().to_string();
        assert!(e.contains("does not hold"), "{e}");
        assert_eq!(a.alloc(0).unwrap().size, 0);
        a.free(Block { ptr: 0, size: 0 }).unwrap();
        a.raw.fail_other = true;
        let e = a.alloc(4 * MIB).unwrap_err().to_string();
        assert!(e.contains("driver gone"), "{e}");
    }
}
