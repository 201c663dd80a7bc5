//! The disk cache's home and the helpers its users share (compiled CPU code in `cpu/`,
//! CUBIN files in `cuda/`).
//!
//! It lives in `$SMELT_CACHE_DIR`, else `$XDG_CACHE_HOME/smelt`, else `~/.cache/smelt`;
//! `SMELT_CACHE_DIR=off` turns it off.
//!
//! Entries are written through a temporary name and renamed into place ([`store`]), so
//! processes writing the same entry at once each leave a whole file and readers never see
//! half of one. The cache holds at most `SMELT_CACHE_MAX_BYTES` (default 1 GiB): a write that
//! takes it past that removes the least recently used entries ([`evict`]); a hit marks its
//! entry used ([`touch`]). A process reads the cache's size once, at its first write, and
//! then adds what it writes: walking tens of thousands of entries at every write made each
//! compile cost a walk of the whole cache. Other processes' writes count at their own. `smelt cache stats` and `smelt cache clear` show and empty it.

use crate::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// The default size limit of the cache: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// The cache's root folder, or None when the cache is off or no home directory is known.
pub fn root() -> Option<PathBuf> {
    match std::env::var_os("SMELT_CACHE_DIR") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => match std::env::var_os("XDG_CACHE_HOME") {
            Some(v) if !v.is_empty() => Some(PathBuf::from(v).join("smelt")),
            _ => Some(
                PathBuf::from(std::env::var_os("HOME")?)
                    .join(".cache")
                    .join("smelt"),
            ),
        },
    }
}

/// The cache directory of `kind` (`"cpu"`, `"cuda"`), or None when the cache is off or no
/// home directory is known.
pub fn dir(kind: &str) -> Option<PathBuf> {
    Some(root()?.join(kind))
}

/// The size limit: `SMELT_CACHE_MAX_BYTES` (a byte count), else [`DEFAULT_MAX_BYTES`].
pub fn max_bytes() -> u64 {
    std::env::var("SMELT_CACHE_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_BYTES)
}

/// One file of the cache.
struct Entry {
    path: PathBuf,
    bytes: u64,
    used: SystemTime,
}

/// Every file below `folder` (its kinds' folders included).
fn entries(folder: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut todo = vec![folder.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(list) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in list.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                todo.push(e.path());
            } else if meta.is_file() {
                out.push(Entry {
                    path: e.path(),
                    bytes: meta.len(),
                    used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
    }
    out
}

/// What a cache folder holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Files.
    pub entries: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// The files and bytes below `folder`.
pub fn stats(folder: &Path) -> Stats {
    let all = entries(folder);
    Stats {
        entries: all.len(),
        bytes: all.iter().map(|e| e.bytes).sum(),
    }
}

/// Removes every file below `folder`; returns how many went.
pub fn clear(folder: &Path) -> usize {
    entries(folder)
        .iter()
        .filter(|e| std::fs::remove_file(&e.path).is_ok())
        .count()
}

/// Removes the least recently used files below `folder` until the rest hold at most `max`
/// bytes; returns how many went. A file another process removed first is simply gone.
pub fn evict(folder: &Path, max: u64) -> usize {
    evict_to(folder, max).0
}

/// [`evict`], returning the number of entries removed and the bytes left.
fn evict_to(folder: &Path, max: u64) -> (usize, u64) {
    let mut all = entries(folder);
    let mut total: u64 = all.iter().map(|e| e.bytes).sum();
    if total <= max {
        return (0, total);
    }
    all.sort_by_key(|e| e.used);
    let mut removed = 0;
    for e in all {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&e.path).is_ok() {
            removed += 1;
        }
        total = total.saturating_sub(e.bytes);
    }
    (removed, total)
}

/// The bytes this process takes the cache folder of its last write to hold: the size read
/// at its first write there (or its last eviction), plus what it has written since.
static HELD: Mutex<Option<(PathBuf, u64)>> = Mutex::new(None);

/// Counts `bytes` just written to `folder` and evicts once the count passes the limit.
fn written(folder: &Path, bytes: u64) {
    let max = max_bytes();
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let total = match held.as_mut() {
        Some((f, total)) if f.as_path() == folder => {
            *total = total.saturating_add(bytes);
            *total
        }
        // the first write here: read the size, this entry included
        _ => u64::MAX,
    };
    if total > max {
        let (_, left) = evict_to(folder, max);
        *held = Some((folder.to_path_buf(), left));
    }
}

/// Marks `file` as used now, so that eviction keeps it longer than entries not read since.
pub fn touch(file: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(file) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The folder whose size limit a file of the cache counts against: the whole cache for a
/// file of one of its kinds' folders, else the file's own folder (a cache placed by hand).
fn scope(file: &Path) -> Option<PathBuf> {
    let folder = file.parent()?;
    match root() {
        Some(r) if folder.parent() == Some(r.as_path()) => Some(r),
        _ => Some(folder.to_path_buf()),
    }
}

/// FNV-1a: stable across builds and platforms, unlike `std`'s hasher.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Writes a file whole: the bytes go to a temporary name in the same folder, which is then
/// renamed over the real one, so that a reader, or a process killed mid-write (a training
/// run stopped while saving its checkpoint), never finds half a file under the real name.
/// No `fsync`: this guards against killed processes, not against power loss.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
    let Some(name) = path.file_name() else {
        return Err(Error::Io(format!("{}: not a file name", path.display())));
    };
    // a name of this writer's own: threads and processes may write the same file at once
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// Writes a cache file whole (`write_atomic`), so readers never see half a file. A
/// cache that cannot be written only costs a later compile.
pub fn store(file: &Path, bytes: &[u8]) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    if write_atomic(file, bytes).is_err() {
        return;
    }
    if let Some(folder) = scope(file) {
        written(&folder, bytes.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_is_left() {
        let dir = std::env::temp_dir().join(format!("smelt-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("w.bin");
        write_atomic(&f, b"first").unwrap();
        write_atomic(&f, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("w.bin")]);
        let missing = dir.join("no-such-folder").join("x.bin");
        let e = write_atomic(&missing, b"x").unwrap_err().to_string();
        assert!(e.contains("x.bin"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    use super::*;

    fn folder(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smelt-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn aged(path: &Path, bytes: usize, secs_ago: u64) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![7u8; bytes]).unwrap();
        let t = SystemTime::now() - std::time::Duration::from_secs(secs_ago);
        std::fs::File::options()
            .append(true)
            .open(path)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn eviction_removes_the_least_recently_used_until_under_the_limit() {
        let d = folder("evict");
        aged(&d.join("cpu/old.bin"), 400, 300);
        aged(&d.join("cuda/middle.cubin"), 400, 200);
        aged(&d.join("cpu/new.bin"), 400, 100);
        assert_eq!(
            stats(&d),
            Stats {
                entries: 3,
                bytes: 1200
            }
        );
        // under the limit: nothing goes
        assert_eq!(evict(&d, 1200), 0);
        // a hit makes the oldest the most recently used
        touch(&d.join("cpu/old.bin"));
        assert_eq!(evict(&d, 800), 1);
        assert!(!d.join("cuda/middle.cubin").exists());
        assert!(d.join("cpu/old.bin").exists() && d.join("cpu/new.bin").exists());
        assert_eq!(evict(&d, 0), 2);
        assert_eq!(stats(&d), Stats::default());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn clear_removes_every_file_and_stats_count_them() {
        let d = folder("clear");
        aged(&d.join("cpu/a.bin"), 10, 1);
        aged(&d.join("cuda/b.cubin"), 20, 1);
        assert_eq!(
            stats(&d),
            Stats {
                entries: 2,
                bytes: 30
            }
        );
        assert_eq!(clear(&d), 2);
        assert_eq!(stats(&d).entries, 0);
        // a folder that does not exist is an empty cache
        assert_eq!(stats(&d.join("missing")), Stats::default());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn writers_of_one_entry_at_once_leave_a_whole_file() {
        let d = folder("race");
        let file = d.join("entry.bin");
        let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1 << 16]).collect();
        std::thread::scope(|s| {
            for p in &payloads {
                let file = &file;
                s.spawn(move || {
                    for _ in 0..20 {
                        store(file, p);
                    }
                });
            }
        });
        let got = std::fs::read(&file).unwrap();
        assert_eq!(got.len(), 1 << 16);
        assert!(got.iter().all(|&b| b == got[0]), "a torn entry");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"kernel"]), fnv1a(&[b"kernel"]));
        assert_ne!(fnv1a(&[b"kernel", b"sm_90"]), fnv1a(&[b"kernel", b"sm_80"]));
    }
}
