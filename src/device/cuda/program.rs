//! Generated CUDA C → loaded modules, with two caches: in memory (per device and source)
//! and on disk (CUBIN files keyed by source hash, architecture and NVRTC version), so a
//! model compiled once loads without NVRTC in later processes.
//!
//! The disk cache lives in `$SMELT_CACHE_DIR/cuda`, else `$XDG_CACHE_HOME/smelt/cuda`, else
//! `~/.cache/smelt/cuda`; `SMELT_CACHE_DIR=off` turns it off.

use super::driver::{Gpu, Module};
use super::nvrtc;
use crate::Result;
use crate::device::cache::{fnv1a, store};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Where a module came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Already loaded in this process.
    Memory,
    /// A CUBIN from the disk cache.
    Disk,
    /// Compiled by NVRTC now.
    Nvrtc,
}

impl Origin {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Memory => "memory",
            Origin::Disk => "disk",
            Origin::Nvrtc => "nvrtc",
        }
    }
}

/// The directory of cached CUBIN files (see [`crate::device::cache`]).
pub fn cache_dir() -> Option<PathBuf> {
    crate::device::cache::dir("cuda")
}

type MemCache = Mutex<HashMap<(usize, u64), Arc<Module>>>;

fn memory() -> &'static MemCache {
    static M: OnceLock<MemCache> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Loads `source` on `gpu`: from memory, the disk cache, or NVRTC (which then fills both).
pub fn load(
    gpu: &Arc<Gpu>,
    source: &str,
    name: &str,
    use_fast_math: bool,
) -> Result<(Arc<Module>, Origin)> {
    let arch = super::arch(gpu.ordinal())?;
    let (ma, mi) = nvrtc::version()?;
    let flags = if use_fast_math { "fast" } else { "exact" };
    let key = fnv1a(&[source.as_bytes(), flags.as_bytes(), arch.as_bytes()]);
    if let Some(m) = memory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(gpu.ordinal(), key))
    {
        return Ok((m.clone(), Origin::Memory));
    }
    let file = cache_dir().map(|d| d.join(format!("{key:016x}-{arch}-nvrtc{ma}.{mi}.cubin")));
    let cached = file.as_ref().and_then(|f| std::fs::read(f).ok());
    // a damaged cache file is not fatal: compile afresh and overwrite it
    let from_disk = cached.and_then(|image| gpu.load(&image).ok());
    let (module, origin) = match from_disk {
        Some(m) => {
            if let Some(f) = &file {
                crate::device::cache::touch(f);
            }
            (m, Origin::Disk)
        }
        None => {
            let mut opts = nvrtc::CompileOptions::for_arch(&arch);
            opts.use_fast_math = use_fast_math;
            let cubin = nvrtc::compile_cubin(source, name, &opts)?;
            if let Some(f) = &file {
                store(f, &cubin);
            }
            (gpu.load(&cubin)?, Origin::Nvrtc)
        }
    };
    let module = Arc::new(module);
    memory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((gpu.ordinal(), key), module.clone());
    Ok((module, origin))
}
