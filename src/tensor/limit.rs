//! The host-memory limit of tensor storages (`SMELT_MAX_ALLOC_BYTES`): a storage that would
//! take the bytes held past it is an error, `Error::OutOfMemory`, before the system is asked,
//! so that a hostile model's huge tensor is refused cleanly even where the system would
//! promise the memory (overcommit) and kill the process when it is touched.

use crate::Error;
use std::sync::OnceLock;

/// The limit, read once: `SMELT_MAX_ALLOC_BYTES` (bytes; `0` or `off` for none), or by
/// default 90% of the machine's physical memory (none where that is unknown).
pub fn max_alloc_bytes() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| match std::env::var("SMELT_MAX_ALLOC_BYTES") {
        Ok(v) if v.trim() == "off" || v.trim() == "0" => None,
        Ok(v) => v.trim().parse().ok().or_else(default_limit),
        Err(_) => default_limit(),
    })
}

/// 90% of `MemTotal` in `/proc/meminfo`.
fn default_limit() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024) / 10 * 9)
}

/// An error when `nbytes` more, with `live` bytes held, would pass the limit.
pub fn check(nbytes: usize, live: u64) -> Result<(), Error> {
    match max_alloc_bytes() {
        Some(limit) if live.saturating_add(nbytes as u64) > limit => {
            Err(Error::OutOfMemory(format!(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate {nbytes} bytes, \
             which with the {live} bytes tensors hold passes the limit of {limit} bytes \
             (SMELT_MAX_ALLOC_BYTES)"
            )))
        }
        _ => Ok(()),
    }
}
