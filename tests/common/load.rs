//! What the load tests share: how long to run and the process's resident memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Callers at once in the load tests.
pub const THREADS: usize = 64;

/// Runs `call(thread, i)` on [`THREADS`] threads until `run` has passed, thread `t` taking
/// `i = t, t + THREADS, ...`; a call that returns an error message stops every thread and
/// fails the test with it. Samples resident memory every 50 ms once the first half of the
/// run has warmed every path up, then asserts it stayed flat ([`assert_flat`]). Returns the
/// number of calls. (Half: in CI's 8-second runs on 2 busy cores, the fresh traces and
/// malloc's per-thread arenas were still growing 2 s in, 45.6 to 54.3 MiB; the 10-minute
/// run of docs/fuzzing.md is the one that measures a slow leak.)
pub fn soak(run: Duration, call: impl Fn(usize, usize) -> Result<(), String> + Sync) -> usize {
    let deadline = Instant::now() + run;
    let warm_at = Instant::now() + run / 2;
    let calls = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut samples = Vec::new();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (call, calls, stop) = (&call, &calls, &stop);
            s.spawn(move || {
                let mut i = t;
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    if let Err(e) = call(t, i) {
                        stop.store(true, Ordering::Relaxed);
                        panic!("thread {t}, call {i}: {e}");
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                    i += THREADS;
                }
            });
        }
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            if Instant::now() >= warm_at
                && let Some(r) = rss_bytes()
            {
                samples.push(r);
            }
        }
    });
    let n = calls.load(Ordering::Relaxed);
    let secs = run.as_secs_f64();
    assert!(n >= THREADS, "only {n} calls in {secs} s");
    assert_flat(&samples, n, THREADS, secs);
    n
}

/// Resident memory of this process in bytes (Linux; None elsewhere).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// How long a soak runs: `SMELT_LOAD_SECONDS`, else `default`.
pub fn seconds(default: f64) -> Duration {
    let s = std::env::var("SMELT_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Duration::from_secs_f64(s)
}

/// Prints the run's figures and asserts that memory stayed flat: the last sample within
/// 5% of the first (taken once warm), plus a page-table's slack for short runs.
fn assert_flat(samples: &[u64], calls: usize, threads: usize, secs: f64) {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    let (Some(&first), Some(&max), Some(&last)) =
        (samples.first(), samples.iter().max(), samples.last())
    else {
        return;
    };
    println!(
        "{calls} calls from {threads} threads in {secs} s ({:.0}/s); resident memory after \
         warm-up {:.1} MiB, at most {:.1} MiB, at the end {:.1} MiB",
        calls as f64 / secs,
        mb(first),
        mb(max),
        mb(last)
    );
    let allowed = first + first / 20 + (4 << 20);
    assert!(
        last <= allowed,
        "resident memory grew from {:.1} to {:.1} MiB under load",
        mb(first),
        mb(last)
    );
}
