//! Calls that keep the thread pool's workers polling for work while they run.
//!
//! A compiled call runs dozens of parallel kernels with serial ones between them. Handed
//! over one by one from the caller's thread, each parallel kernel paid a cross-thread
//! wake-up and a sleep, and the pool's workers had gone to sleep again by the next one: a
//! GPT training step ran no faster on two threads than on one. [`hot`] hands the whole call
//! over once; the kernels' parallel halves are then picked up by workers that are already
//! running, and the workers go back to sleep when the call returns (what OpenMP's
//! spin-wait gives PyTorch).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread runs a [`hot`] call.
    static HOT: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread polls for the work of a [`hot`] call.
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

/// [`par_min_elems`] inside a [`hot`] call: the GPT training step of `cargo bench --bench
/// models` took 16.0-16.5 ms with the bar at 2^18 elements, 13.2-15.2 ms at 2^14, and no
/// less at 2^13 or 2^11 (2 threads).
pub const PAR_MIN_ELEMS_HOT: usize = 1 << 14;

/// Whether this thread runs a [`hot`] call.
pub fn in_hot_call() -> bool {
    HOT.with(Cell::get)
}

/// Kernels with fewer elements than this run on the calling thread: [`PAR_MIN_ELEMS`]
/// (crate::model::PAR_MIN_ELEMS), or inside a [`hot`] call, where a hand-off to the polling
/// workers costs a few µs rather than tens, [`PAR_MIN_ELEMS_HOT`].
///
/// [`PAR_MIN_ELEMS`]: crate::model::PAR_MIN_ELEMS
pub fn par_min_elems() -> usize {
    if in_hot_call() {
        PAR_MIN_ELEMS_HOT
    } else {
        crate::model::PAR_MIN_ELEMS
    }
}

/// Runs `f` on a worker of `pool` (rayon's global pool for `None`) while the pool's other
/// workers poll for work instead of sleeping, and returns its result. On a worker thread
/// already (a nested call), or with a pool of one thread, `f` just runs.
pub fn hot<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    let threads = pool.map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
    if rayon::current_thread_index().is_some() || threads < 2 {
        return f();
    }
    let run = move || {
        let active = AtomicBool::new(true);
        rayon::scope(|s| {
            for _ in 1..rayon::current_num_threads() {
                s.spawn(|_| {
                    // a poller that a poller picked up as work leaves at once: this
                    // thread polls already
                    if POLLING.with(|p| p.replace(true)) {
                        return;
                    }
                    while active.load(Ordering::Acquire) {
                        if rayon::yield_now() != Some(rayon::Yield::Executed) {
                            std::hint::spin_loop();
                        }
                    }
                    POLLING.with(|p| p.set(false));
                });
            }
            // however `f` ends: the pollers stop (so that the scope can close) and this
            // worker leaves the hot state
            struct Leave<'a>(&'a AtomicBool, bool);
            impl Drop for Leave<'_> {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                    HOT.with(|h| h.set(self.1));
                }
            }
            let _leave = Leave(&active, HOT.with(|h| h.replace(true)));
            f()
        })
    };
    match pool {
        Some(p) => p.install(run),
        None => run(),
    }
}
