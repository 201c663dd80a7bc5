//! Zeroed host blocks for storages. Blocks of [`HUGE_MIN`] bytes or more are mapped on
//! their own on Linux, aligned to 2 MiB and marked for transparent huge pages (which the
//! kernel's `madvise` mode of THP waits for): with 4 KiB pages a kernel streaming a large
//! buffer takes a TLB miss every 4 KiB, with huge pages one every 2 MiB (the figures are in
//! BENCHMARKS.md's history). Smaller blocks come from the global allocator.
//! `SMELT_HUGE_PAGES=0` maps large blocks with ordinary pages.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Buffers are aligned for the widest SIMD loads any backend emits.
pub const ALIGN: usize = 64;

/// The smallest block mapped on its own: one huge page.
pub const HUGE_MIN: usize = 2 << 20;

/// A zeroed block of `nbytes > 0` bytes aligned to [`ALIGN`]; None when memory is short.
pub fn alloc_zeroed(nbytes: usize) -> Option<NonNull<u8>> {
    #[cfg(target_os = "linux")]
    if nbytes >= HUGE_MIN {
        return linux::map(nbytes);
    }
    let layout = Layout::from_size_align(nbytes, ALIGN).ok()?;
    // SAFETY: the layout has a non-zero size.
    NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
}

/// Frees a block from [`alloc_zeroed`] of the same `nbytes`.
///
/// # Safety
/// `ptr` came from `alloc_zeroed(nbytes)` and is not used again.
pub unsafe fn free(ptr: NonNull<u8>, nbytes: usize) {
    #[cfg(target_os = "linux")]
    if nbytes >= HUGE_MIN {
        // SAFETY: the caller's promise; the block is the whole mapping.
        unsafe { linux::unmap(ptr, nbytes) };
        return;
    }
    if let Ok(layout) = Layout::from_size_align(nbytes, ALIGN) {
        // SAFETY: allocated by `alloc_zeroed` with this layout.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::HUGE_MIN;
    use std::ptr::NonNull;
    use std::sync::OnceLock;

    fn huge_pages() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| std::env::var("SMELT_HUGE_PAGES").map_or(true, |v| v != "0"))
    }

    fn page_round(n: usize) -> Option<usize> {
        n.checked_add(4095).map(|n| n & !4095)
    }

    /// An anonymous mapping of `nbytes` (rounded up to whole pages) that starts on a 2 MiB
    /// boundary: a larger one is mapped and the ends cut off. Anonymous pages read as zeros.
    pub fn map(nbytes: usize) -> Option<NonNull<u8>> {
        let len = page_round(nbytes)?;
        let span = len.checked_add(HUGE_MIN)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        let start = (base + HUGE_MIN - 1) & !(HUGE_MIN - 1);
        let (head, tail) = (start - base, span - (start - base) - len);
        // SAFETY: both ranges lie inside the mapping made above and outside the block kept.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
            if huge_pages() {
                // advice only: where the system refuses it, the block keeps ordinary pages
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
        }
        NonNull::new(start as *mut u8)
    }

    /// Unmaps a block from [`map`].
    ///
    /// # Safety
    /// `ptr` came from `map(nbytes)` and is not used again.
    pub unsafe fn unmap(ptr: NonNull<u8>, nbytes: usize) {
        if let Some(len) = page_round(nbytes) {
            // SAFETY: the caller's promise: the block is exactly this mapping.
            unsafe { libc::munmap(ptr.as_ptr() as *mut libc::c_void, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zeroed_aligned_and_writable() {
        for n in [
            1,
            100,
            HUGE_MIN - 1,
            HUGE_MIN,
            HUGE_MIN + 4097,
            3 * HUGE_MIN + 5,
        ] {
            let p = alloc_zeroed(n).expect("memory");
            assert_eq!(p.as_ptr() as usize % ALIGN, 0, "{n} bytes");
            // SAFETY: the block has n bytes.
            let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n) };
            assert!(s.iter().all(|&b| b == 0), "{n} bytes not zeroed");
            s.fill(7);
            assert_eq!(s[n - 1], 7);
            // SAFETY: from alloc_zeroed(n), not used after.
            unsafe { free(p, n) };
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_blocks_start_on_a_huge_page() {
        let p = alloc_zeroed(HUGE_MIN + 1).expect("memory");
        assert_eq!(p.as_ptr() as usize % HUGE_MIN, 0);
        // SAFETY: from alloc_zeroed, not used after.
        unsafe { free(p, HUGE_MIN + 1) };
    }
}
