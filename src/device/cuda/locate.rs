//! Finding NVRTC and the CUDA headers at run time, without a toolkit install: environment
//! variables first, then the layout of NVIDIA's pip wheels in Python's site-packages, then
//! the usual toolkit folders.
//!
//! - `SMELT_NVRTC_LIB`: the path of `libnvrtc.so.*` itself;
//! - `SMELT_CUDNN_LIB`: the path of `libcudnn.so.9` itself;
//! - `SMELT_CUDA_INCLUDE`: a folder holding `cuda_fp16.h`;
//! - `CUDA_HOME` / `CUDA_PATH`: a toolkit (`lib64/`, `include/`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// File names of NVRTC, newest major version first.
const NVRTC_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Python's site-packages folders: those of an active virtual environment and the user's,
/// then whatever `python3` reports.
fn site_packages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut push_glob = |root: PathBuf| {
        // root/lib/python3.*/site-packages
        if let Ok(rd) = std::fs::read_dir(root.join("lib")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("python3") {
                    out.push(e.path().join("site-packages"));
                    out.push(e.path().join("dist-packages"));
                }
            }
        }
    };
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        push_glob(PathBuf::from(v));
    }
    if let Some(h) = std::env::var_os("HOME") {
        push_glob(PathBuf::from(h).join(".local"));
    }
    push_glob(PathBuf::from("/usr/local"));
    push_glob(PathBuf::from("/usr"));
    out.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let script =
        "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
    if let Ok(o) = Command::new("python3").args(["-c", script]).output()
        && o.status.success()
    {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            out.push(PathBuf::from(l.trim()));
        }
    }
    out.retain(|p| p.is_dir());
    out.dedup();
    out
}

/// Toolkit roots named by the environment, then the default install folder.
fn toolkit_roots() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    v.push(PathBuf::from("/usr/local/cuda"));
    v
}

/// The first of `names` found: at the path in environment variable `var`, then in the
/// wheel folders `wheel_dirs` under every site-packages, then in the toolkits' `lib64/`
/// and `lib/` and the system's library folder; or the list of places searched.
fn find_library(var: &str, wheel_dirs: &[&str], names: &[&str]) -> Result<PathBuf, Vec<PathBuf>> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    let mut dirs = Vec::new();
    for sp in site_packages() {
        dirs.extend(wheel_dirs.iter().map(|w| sp.join(w)));
    }
    for r in toolkit_roots() {
        dirs.push(r.join("lib64"));
        dirs.push(r.join("lib"));
    }
    dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    for d in dirs {
        if let Some(p) = names.iter().map(|n| d.join(n)).find(|p| p.is_file()) {
            return Ok(p);
        }
        tried.push(d);
    }
    Err(tried)
}

/// Where NVRTC is, or the list of places searched.
pub fn nvrtc_library() -> Result<PathBuf, Vec<PathBuf>> {
    find_library(
        "SMELT_NVRTC_LIB",
        &["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"],
        &NVRTC_NAMES,
    )
}

/// Where cuDNN's main library is (its sublibraries lie beside it), or the places searched.
pub fn cudnn_library() -> Result<PathBuf, Vec<PathBuf>> {
    find_library("SMELT_CUDNN_LIB", &["nvidia/cudnn/lib"], &["libcudnn.so.9"])
}

fn has_headers(d: &Path) -> bool {
    d.join("cuda_fp16.h").is_file() && d.join("cuda_bf16.h").is_file()
}

/// A folder holding `cuda_fp16.h` and `cuda_bf16.h`, or the list of places searched.
pub fn cuda_include() -> Result<PathBuf, Vec<PathBuf>> {
    let mut cands = Vec::new();
    if let Some(p) = std::env::var_os("SMELT_CUDA_INCLUDE") {
        cands.push(PathBuf::from(p));
    }
    for sp in site_packages() {
        cands.push(sp.join("nvidia/cuda_runtime/include"));
        cands.push(sp.join("nvidia/cu13/include"));
    }
    for r in toolkit_roots() {
        cands.push(r.join("include"));
    }
    match cands.iter().find(|d| has_headers(d)) {
        Some(d) => Ok(d.clone()),
        None => Err(cands),
    }
}
