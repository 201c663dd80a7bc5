//! Calls that keep the thread pool's workers polling for work while they run.
//!
//! A compiled call runs dozens of parallel kernels with serial ones between them. Handed
//! over one by one from the caller's thread, each parallel kernel paid a cross-thread
//! wake-up and a sleep, and the pool's workers had gone to sleep again by the next one: a
//! GPT training step ran no faster on two threads than on one. [`hot`] hands the whole call
//! over once; the kernels' parallel halves are then picked up by workers that are already
//! running, and the workers go back to sleep when the call returns (what OpenMP's
//! spin-wait gives PyTorch). The caller polls for the call's end for a while too, rather
//! than sleeping until a worker wakes it (`hand_over`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this worker has been given its own CPU (or found it cannot be).
    static PINNED: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread runs a [`hot`] call.
    static HOT: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread polls for the work of a [`hot`] call.
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

/// [`par_min_elems`] inside a [`hot`] call: the GPT training step of `cargo bench --bench
/// models` ran faster with the bar at 2^14 elements than at 2^18, and no faster at 2^13 or
/// 2^11 (2 threads; BENCHMARKS.md).
pub const PAR_MIN_ELEMS_HOT: usize = 1 << 14;

/// Kernels whose index space has fewer elements than this run on the calling thread:
/// below it, waking other threads costs more than it saves.
pub const PAR_MIN_ELEMS: usize = 1 << 18;

/// Whether this thread runs a [`hot`] call.
pub fn in_hot_call() -> bool {
    HOT.with(Cell::get)
}

/// The fewest elements a kernel splits across threads: `outside` out of a [`hot`] call,
/// [`PAR_MIN_ELEMS_HOT`] inside one, where a hand-off to the polling workers costs a few µs
/// rather than tens.
pub fn par_min(outside: usize) -> usize {
    if in_hot_call() {
        PAR_MIN_ELEMS_HOT
    } else {
        outside
    }
}

/// The bar of compiled kernels: [`par_min`] of [`PAR_MIN_ELEMS`].
pub fn par_min_elems() -> usize {
    par_min(PAR_MIN_ELEMS)
}

/// Whether a compiled kernel of `rows` rows over `elems` elements splits inside a [`hot`]
/// call: what makes moving a call to a worker worth its hand-off.
pub fn kernel_splits(rows: usize, elems: usize) -> bool {
    rows >= 2 && elems >= PAR_MIN_ELEMS_HOT
}

/// Whether [`hot`] runs `f` on a worker of `pool` (rayon's global pool for `None`): not on a
/// worker thread already (a nested call), nor with a pool of one thread.
pub fn moves(pool: Option<&rayon::ThreadPool>) -> bool {
    let threads = pool.map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
    rayon::current_thread_index().is_none() && threads >= 2
}

/// Runs `f` on a worker of `pool` (rayon's global pool for `None`) while the pool's other
/// workers poll for work instead of sleeping, and returns its result; where it would not move
/// ([`moves`]), `f` just runs.
pub fn hot<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    if !moves(pool) {
        return f();
    }
    let run = move || {
        pin_worker();
        let active = AtomicBool::new(true);
        rayon::scope(|s| {
            for _ in 1..rayon::current_num_threads() {
                s.spawn(|_| {
                    // a poller that a poller picked up as work leaves at once: this
                    // thread polls already
                    if POLLING.with(|p| p.replace(true)) {
                        return;
                    }
                    pin_worker();
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
    hand_over(pool, run)
}

/// How long a caller polls for the end of a [`hot`] call before it sleeps until woken.
const POLL_FOR: std::time::Duration = std::time::Duration::from_millis(2);

/// Runs `job` on a worker of `pool` (rayon's global pool for `None`) and returns its result
/// (or resumes its panic) once it is done. The caller polls, yielding its CPU, for up to
/// [`POLL_FOR`], then parks: a caller blocked on rayon's latch (`install`) was woken by the
/// scheduler well after the call's end (a third-party thread wake-up), where a polling
/// caller sees the end at once; calls longer than the poll pay one wake-up.
fn hand_over<R: Send>(pool: Option<&rayon::ThreadPool>, job: impl FnOnce() -> R + Send) -> R {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    struct Slot<R> {
        result: std::cell::UnsafeCell<Option<std::thread::Result<R>>>,
        done: AtomicBool,
    }
    // SAFETY: `result` is written by the worker before `done` is set (release) and read by
    // the caller after it sees `done` (acquire), never both at once.
    unsafe impl<R: Send> Sync for Slot<R> {}
    let slot = Slot {
        result: std::cell::UnsafeCell::new(None),
        done: AtomicBool::new(false),
    };
    let caller = std::thread::current();
    let slot_ref = &slot;
    let task = move || {
        let r = catch_unwind(AssertUnwindSafe(job));
        // SAFETY: see `Slot`; the caller reads nothing before `done`.
        unsafe { *slot_ref.result.get() = Some(r) };
        slot_ref.done.store(true, Ordering::Release);
        // `slot` may be gone from here on; the handle is the task's own
        caller.unpark();
    };
    let task: Box<dyn FnOnce() + Send + '_> = Box::new(task);
    // SAFETY: the task borrows `slot` and what `job` borrows, all of which outlive it: this
    // function returns only after the task has set `done`, its last use of them (it never
    // unwinds: `job`'s panic is caught).
    let task: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(task) };
    match pool {
        Some(p) => p.spawn(task),
        None => rayon::spawn(task),
    }
    let start = std::time::Instant::now();
    while !slot.done.load(Ordering::Acquire) {
        if start.elapsed() < POLL_FOR {
            std::thread::yield_now();
        } else {
            // a wake-up before `done` (or a spurious one) loops back to the check
            std::thread::park_timeout(POLL_FOR);
        }
    }
    // SAFETY: `done` was set after the result was written.
    match unsafe { (*slot.result.get()).take() } {
        Some(Ok(r)) => r,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => unreachable!("a finished hot call left its result"),
    }
}

/// Keeps this pool worker on a CPU of its own: worker `i` of the pool runs on the `i`-th CPU
/// the process may use, where the pool has no more workers than those CPUs. A worker woken
/// onto its waker's CPU stayed there: the caller of a [`hot`] call and its poller then
/// shared one CPU, the other idle, and a step of eager training stalled for a scheduler
/// slice in a third of its steps (seen with `perf sched timehist`). Done once per
/// worker, the first time it runs or polls for a [`hot`] call; `SMELT_PIN_THREADS=0` leaves
/// the workers where the OS puts them.
fn pin_worker() {
    if PINNED.with(|p| p.replace(true)) {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        if std::env::var("SMELT_PIN_THREADS").is_ok_and(|v| v == "0") {
            return;
        }
        let Some(i) = rayon::current_thread_index() else {
            return;
        };
        let threads = rayon::current_num_threads();
        // SAFETY: `cpu_set_t` is plain data; the calls read and write only the set passed.
        unsafe {
            let mut allowed: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
                return;
            }
            let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &allowed))
                .collect();
            if threads > cpus.len() || i >= cpus.len() {
                return;
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpus[i], &mut one);
            // a refusal (a cgroup that forbids it) leaves the worker where it is
            let _ = libc::sched_setaffinity(0, size, &one);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The CPUs this thread may run on.
    fn allowed() -> Vec<usize> {
        // SAFETY: as in `pin_worker`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// A call longer than the caller polls for: the caller parks and is woken with the
    /// result; a short one and a panicking one come back too, the panic as a panic.
    #[test]
    fn the_caller_gets_each_result_after_polling_or_parking() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let data = [1u64, 2, 3];
        let long = hot(Some(&pool), || {
            std::thread::sleep(POLL_FOR * 3);
            data.iter().sum::<u64>()
        });
        assert_eq!(long, 6);
        assert_eq!(hot(Some(&pool), || data.len()), 3);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hot(Some(&pool), || panic!("inside"))
        }));
        assert!(r.is_err());
        assert_eq!(hot(None, || 5), 5);
    }

    #[test]
    fn a_hot_call_keeps_each_worker_on_a_cpu_of_its_own() {
        let cpus = allowed();
        if cpus.len() < 2 || std::env::var("SMELT_PIN_THREADS").is_ok_and(|v| v == "0") {
            println!("skipped: one CPU, or pinning turned off");
            return;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (index, mine) = hot(Some(&pool), || {
            (rayon::current_thread_index().unwrap(), allowed())
        });
        assert_eq!(mine, vec![cpus[index]]);
        // a pool with more workers than CPUs leaves them free
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cpus.len() + 1)
            .build()
            .unwrap();
        let mine = hot(Some(&pool), allowed);
        assert_eq!(mine, cpus);
    }
}
