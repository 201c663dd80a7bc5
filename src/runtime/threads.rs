//! How many threads a kernel may split its work across.
//!
//! Kernels ask [`available`] rather than rayon directly, so that a caller can keep a whole
//! computation on its own thread with [`serial`]: handing work to even a one-thread pool costs
//! a cross-thread wake-up (tens of µs here), more than a small kernel takes.

use std::cell::Cell;

thread_local! {
    static SERIAL: Cell<bool> = const { Cell::new(false) };
}

/// The threads a kernel started on this thread may use: 1 inside [`serial`], else the size
/// of the current rayon pool.
pub fn available() -> usize {
    if SERIAL.with(Cell::get) {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Runs `f(i)` for every `i` in `0..count` across the current rayon pool.
///
/// The one place eager kernels enter rayon: `f` is a trait object, so rayon's splitting and
/// job machinery is compiled once here, not again for every kernel closure and element type
/// (it was a third of the library's generated code). `f` runs once per chunk of work, so
/// the indirect call costs nothing measurable.
pub fn par_for(count: usize, f: &(dyn Fn(usize) + Sync)) {
    use rayon::prelude::*;
    (0..count).into_par_iter().for_each(f);
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

#[cfg(test)]
mod tests {
    use super::*;

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
