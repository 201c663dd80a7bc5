//! How many threads a kernel may split its work across, and the one place library kernels
//! enter rayon.
//!
//! Kernels ask [`available`] rather than rayon directly, so that a caller can keep a whole
//! computation on its own thread with [`serial`]: handing work to even a one-thread pool
//! costs a cross-thread wake-up (tens of µs), more than a small kernel takes.

use crate::ranges::Ranges;
use std::cell::Cell;

thread_local! {
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// The threads a kernel started on this thread may use: 1 inside [`serial`], else the size
/// of the current rayon pool.
pub fn available() -> usize {
    if is_serial() {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Whether this thread runs inside [`serial`].
pub fn is_serial() -> bool {
    SERIAL.with(Cell::get)
}

/// Runs `f` so that every kernel it starts on this thread runs on this thread.
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SERIAL.with(|s| s.replace(true)));
    f()
}

/// Runs `f(i)` for every `i` in `0..count` across the current rayon pool.
///
/// `f` is a trait object, so rayon's splitting and job machinery is compiled once here, not
/// again for every kernel closure and element type. `f` runs once per chunk of work, so the
/// indirect call costs nothing measurable.
pub fn par_for(count: usize, f: &(dyn Fn(usize) + Sync)) {
    use rayon::prelude::*;
    (0..count).into_par_iter().for_each(f);
}

/// Runs `f(c, lo, hi)` for every range `c` of `r` across the current rayon pool.
pub fn par_each(r: &Ranges, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    par_for(r.count(), &|c| {
        let (lo, hi) = r.get(c);
        f(c, lo, hi)
    });
}

/// Runs `f(chunk, lo, hi)` for `0..count` cut into at most `chunks` contiguous ranges,
/// across the available threads (on this thread alone when only one is available).
pub fn run_chunks(count: usize, chunks: usize, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    if count == 0 {
        return;
    }
    let r = Ranges::new(count, chunks, 1);
    if available() <= 1 || r.count() == 1 {
        for c in 0..r.count() {
            let (lo, hi) = r.get(c);
            f(c, lo, hi);
        }
    } else {
        par_each(&r, f);
    }
}

/// A pointer that parallel tasks share, each touching its own elements through it.
#[derive(Clone, Copy, Debug)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: only used by kernels whose parallel chunks touch disjoint elements.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as for `Send`: a shared `SendPtr` only yields a copy of the pointer (`get`); the
// kernels that share one write disjoint elements through it.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer. A method, so closures capture the whole `SendPtr` and not its field.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}
