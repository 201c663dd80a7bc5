//! The disk cache's home and the helpers its users share (compiled CPU code in `cpu/`,
//! CUBIN files in `cuda/`).
//!
//! It lives in `$SMELT_CACHE_DIR`, else `$XDG_CACHE_HOME/smelt`, else `~/.cache/smelt`;
//! `SMELT_CACHE_DIR=off` turns it off.

use std::path::{Path, PathBuf};

/// The cache directory of `kind` (`"cpu"`, `"cuda"`), or None when the cache is off or no
/// home directory is known.
pub fn dir(kind: &str) -> Option<PathBuf> {
    let base = match std::env::var_os("SMELT_CACHE_DIR") {
        Some(v) if v == "off" => return None,
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => match std::env::var_os("XDG_CACHE_HOME") {
            Some(v) if !v.is_empty() => PathBuf::from(v).join("smelt"),
            _ => PathBuf::from(std::env::var_os("HOME")?)
                .join(".cache")
                .join("smelt"),
        },
    };
    Some(base.join(kind))
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

/// Writes a cache file through a temporary name, so readers never see half a file. A
/// cache that cannot be written only costs a later compile.
pub fn store(file: &Path, bytes: &[u8]) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"kernel"]), fnv1a(&[b"kernel"]));
        assert_ne!(fnv1a(&[b"kernel", b"sm_90"]), fnv1a(&[b"kernel", b"sm_80"]));
    }
}
