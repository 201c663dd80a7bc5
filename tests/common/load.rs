//! What the load tests share: how long to run and the process's resident memory.

use std::time::Duration;

/// Resident memory of this process in bytes (Linux; None elsewhere).
pub fn rss_bytes() -> Option<u64> {
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
pub fn assert_flat(samples: &[u64], calls: usize, threads: usize, secs: f64) {
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
