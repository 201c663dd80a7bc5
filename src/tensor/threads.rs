//! How eager kernels use threads: how many they may take and how they enter rayon
//! (`smelt_rt::threads`, shared with the library kernels of compiled models), the size below
//! which an eager kernel stays on its thread, and compiled calls' polling pools ([`hot`]).

use super::storage::{add_allocations, allocation_count};

/// [`eager_par_min`] out of a compiled call: high enough that a kernel split over the pool
/// pays for waking its sleeping workers, low enough that the activations of a small
/// model's eager step are still split (the measurements that chose it are in
/// BENCHMARKS.md's history).
const EAGER_PAR_MIN: usize = 1 << 17;

/// Eager kernels with fewer elements than this run on the calling thread. Between eager ops
/// the pool's workers go to sleep, and a kernel handed to them pays for waking them: for a
/// cheap elementwise op on a small tensor that costs more than the split saves, even in a
/// tight loop of such ops. Inside a
/// [`hot`] call (an extern step of a compiled graph), the workers poll and the bar is lower.
pub fn eager_par_min() -> usize {
    smelt_rt::hot::par_min(EAGER_PAR_MIN)
}

pub use smelt_rt::ranges::Ranges;

/// The threads a kernel started on this thread may use: 1 inside [`serial`], else the size
/// of the current rayon pool ([`smelt_rt::threads::available`]).
pub fn available() -> usize {
    smelt_rt::threads::available()
}

/// Runs `f(i)` for every `i` in `0..count` across the current rayon pool.
pub fn par_for(count: usize, f: &(dyn Fn(usize) + Sync)) {
    smelt_rt::threads::par_for(count, f)
}

/// Runs `f(c, lo, hi)` for every range `c` of `r` across the current rayon pool.
pub fn par_each(r: &Ranges, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    smelt_rt::threads::par_each(r, f)
}

/// Runs `f` so that every kernel it starts on this thread runs on this thread (library
/// kernels of `smelt_rt` included).
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    smelt_rt::threads::serial(f)
}

/// Runs `f` on a worker of `pool` (rayon's global pool for `None`) while the pool's other
/// workers poll for work instead of sleeping (`smelt_rt::hot`), and returns its result: how
/// compiled calls run. The profiler's events of `f` nest in the ranges open here, and the
/// storages `f` allocates count as this thread's. Under [`serial`], or where the call would
/// not move (`smelt_rt::hot::moves`: a nested call, a pool of one thread), `f` just runs.
pub fn hot<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    if smelt_rt::threads::is_serial() || !smelt_rt::hot::moves(pool) {
        return f();
    }
    let nesting = crate::profiler::Nesting::here();
    let (r, allocated) = smelt_rt::hot::hot(pool, move || {
        let before = allocation_count();
        let r = nesting.enter(f);
        (r, allocation_count() - before)
    });
    // the storages the call allocated count as the caller's
    add_allocations(allocated);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_each_runs_every_range_once() {
        let r = Ranges::new(100, 3, 16);
        let hits: Vec<std::sync::atomic::AtomicUsize> =
            (0..100).map(|_| Default::default()).collect();
        par_each(&r, &|_, lo, hi| {
            for h in &hits[lo..hi] {
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        assert!(
            hits.iter()
                .all(|h| h.load(std::sync::atomic::Ordering::Relaxed) == 1)
        );
    }

    #[test]
    fn hot_runs_on_a_worker_while_others_poll_and_leaves_no_trace() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let outside = smelt_rt::hot::par_min_elems();
        let sum = hot(Some(&pool), || {
            assert!(rayon::current_thread_index().is_some(), "on a worker");
            assert!(
                smelt_rt::hot::par_min_elems() < outside,
                "the lower bar inside"
            );
            // a nested call runs where it is
            let inner = hot(None, rayon::current_thread_index);
            assert_eq!(inner, rayon::current_thread_index());
            let hits: Vec<std::sync::atomic::AtomicUsize> =
                (0..1000).map(|_| Default::default()).collect();
            par_for(1000, &|i| {
                hits[i].fetch_add(i, std::sync::atomic::Ordering::Relaxed);
            });
            hits.iter()
                .map(|h| h.load(std::sync::atomic::Ordering::Relaxed))
                .sum::<usize>()
        });
        assert_eq!(sum, 999 * 1000 / 2);
        assert_eq!(smelt_rt::hot::par_min_elems(), outside);
        // a panic inside comes back to the caller, and the pool still works after it
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hot(Some(&pool), || panic!("kernel failed"))
        }));
        assert!(r.is_err());
        assert_eq!(hot(Some(&pool), || 7), 7);
        assert_eq!(hot(None, || 8), 8);
        // a pool of one thread: `f` runs here, and what it allocates counts once
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let before = allocation_count();
        let here = hot(Some(&one), || {
            let _t = crate::tensor::Tensor::alloc(crate::DType::F32, &[4]);
            std::thread::current().id()
        });
        assert_eq!(here, std::thread::current().id());
        assert_eq!(allocation_count() - before, 1);
        // under `serial`, the calling thread
        let me = std::thread::current().id();
        assert_eq!(
            serial(|| hot(Some(&pool), || std::thread::current().id())),
            me
        );
    }

    #[test]
    fn serial_limits_this_thread_only_and_restores() {
        let global = rayon::current_num_threads();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            assert_eq!(available(), 3);
            serial(|| {
                assert_eq!(available(), 1);
                serial(|| assert_eq!(available(), 1));
                assert_eq!(available(), 1, "a nested call keeps the outer setting");
                // other threads are not limited
                let other = std::thread::scope(|s| s.spawn(available).join().unwrap());
                assert_eq!(other, global);
            });
            assert_eq!(available(), 3);
        });
        let r = std::panic::catch_unwind(|| serial(|| panic!("kernel failed")));
        assert!(r.is_err());
        assert_eq!(available(), global, "restored after a panic");
    }
}
