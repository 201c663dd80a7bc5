//! Writing a file whole: the bytes go to a temporary name in the same folder, which is then
//! renamed over the real one, so that a reader, or a process killed mid-write (a training
//! run stopped while saving its checkpoint), never finds half a file under the real name.

use crate::{Error, Result};
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` atomically (no `fsync`: this guards against killed processes,
/// not against power loss).
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
