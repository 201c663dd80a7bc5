//! NVRTC, loaded at run time from an explicit path: CUDA C to PTX and CUBIN without a GPU.
//!
//! The library is located first ([`super::locate`]) and opened by its path, so a missing
//! library is a clear error rather than a failed search by bare name, and any major version
//! (12 or 13) works: the handful of entry points used here have the same C signatures in both.

use super::locate;
use crate::{Error, Result};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

type Prog = *mut c_void;
type Status = c_int;

/// The entry points used, resolved once.
struct Api {
    _lib: libloading::Library,
    path: PathBuf,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Prog) -> Status,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
}

// SAFETY: the function pointers and the library handle are immutable after loading, and NVRTC
// programs are never shared between threads (each compile owns its own).
unsafe impl Send for Api {}
// SAFETY: as for `Send`: the table is immutable after loading, and the NVRTC entry
// points it holds are thread-safe for distinct programs.
unsafe impl Sync for Api {}

static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();

fn load() -> std::result::Result<Api, String> {
    let path = locate::nvrtc_library().map_err(|tried| {
        let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        format!(
            "NVRTC (libnvrtc.so) was not found; install it with `python3 -m pip install nvidia-cuda-nvrtc-cu12` or set SMELT_NVRTC_LIB to its path (searched: {})",
            list.join(", ")
        )
    })?;
    // SAFETY: loading NVRTC runs only its own initialisers.
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| format!("NVRTC at {} could not be loaded: {e}", path.display()))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has this C signature in NVRTC 12 and 13.
            *unsafe { lib.get($name) }.map_err(|e| {
                format!(
                    "NVRTC at {} lacks {}: {e}",
                    path.display(),
                    String::from_utf8_lossy($name)
                )
            })?
        };
    }
    let api = Api {
        version: sym!(b"nvrtcVersion"),
        error_string: sym!(b"nvrtcGetErrorString"),
        create: sym!(b"nvrtcCreateProgram"),
        compile: sym!(b"nvrtcCompileProgram"),
        destroy: sym!(b"nvrtcDestroyProgram"),
        log_size: sym!(b"nvrtcGetProgramLogSize"),
        log: sym!(b"nvrtcGetProgramLog"),
        ptx_size: sym!(b"nvrtcGetPTXSize"),
        ptx: sym!(b"nvrtcGetPTX"),
        cubin_size: sym!(b"nvrtcGetCUBINSize"),
        cubin: sym!(b"nvrtcGetCUBIN"),
        path: path.clone(),
        _lib: lib,
    };
    Ok(api)
}

fn api() -> Result<&'static Api> {
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Unsupported(e.clone()))
}

/// True when NVRTC can be loaded.
pub fn is_available() -> bool {
    api().is_ok()
}

/// The path NVRTC was loaded from.
pub fn library_path() -> Result<PathBuf> {
    Ok(api()?.path.clone())
}

/// NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32)> {
    let a = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let st = unsafe { (a.version)(&mut major, &mut minor) };
    check(a, st, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(a: &Api, st: Status, what: &str) -> Result<()> {
    if st == 0 {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static string for every status.
    let msg = unsafe {
        let p = (a.error_string)(st);
        if p.is_null() {
            format!("status {st}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(Error::Unsupported(format!("{what} failed: {msg}")))
}

/// What to produce.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// A real architecture such as `sm_90`: PTX for `compute_XX` and CUBIN for `sm_XX`.
    pub arch: String,
    /// Folders for `#include` (the CUDA headers for f16/bf16).
    pub include_dirs: Vec<PathBuf>,
    /// Pass `--use_fast_math` (approximate transcendentals, flushed denormals).
    pub use_fast_math: bool,
}

impl CompileOptions {
    /// Options for `arch` with the CUDA headers found on this machine, if any.
    pub fn for_arch(arch: &str) -> CompileOptions {
        CompileOptions {
            arch: arch.to_string(),
            include_dirs: locate::cuda_include().into_iter().collect(),
            use_fast_math: false,
        }
    }
}

/// A compiled translation unit.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The PTX text (for `compute_XX`).
    pub ptx: String,
    /// The CUBIN binary (for `sm_XX`).
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings), empty when clean.
    pub log: String,
}

/// Checks that `arch` is `sm_XY` or `sm_XYZ` with an optional `a` suffix; returns the digits.
fn arch_digits(arch: &str) -> Result<&str> {
    let d = arch.strip_prefix("sm_").unwrap_or("");
    let digits = d.strip_suffix('a').unwrap_or(d);
    if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(Error::Value(format!(
            "unknown GPU architecture '{arch}': expected sm_XY such as sm_90"
        )));
    }
    Ok(d)
}

/// Compiles `source` (named `name` in messages) to PTX for `compute_XX` and CUBIN for
/// `sm_XX`. A compile error returns NVRTC's log.
pub fn compile(source: &str, name: &str, opts: &CompileOptions) -> Result<Compiled> {
    let digits = arch_digits(&opts.arch)?;
    let a = api()?;
    let ptx_run = run(
        a,
        source,
        name,
        opts,
        &format!("--gpu-architecture=compute_{digits}"),
    )?;
    let cubin_run = run(
        a,
        source,
        name,
        opts,
        &format!("--gpu-architecture=sm_{digits}"),
    )?;
    Ok(Compiled {
        ptx: ptx_run.0,
        cubin: cubin_run.1,
        log: ptx_run.2,
    })
}

/// Compiles `source` straight to CUBIN for `sm_XX` (one NVRTC run: what the runtime loads).
pub fn compile_cubin(source: &str, name: &str, opts: &CompileOptions) -> Result<Vec<u8>> {
    let digits = arch_digits(&opts.arch)?;
    let a = api()?;
    Ok(run(
        a,
        source,
        name,
        opts,
        &format!("--gpu-architecture=sm_{digits}"),
    )?
    .1)
}

/// One NVRTC compile: (PTX, CUBIN when the target is real, log).
fn run(
    a: &Api,
    source: &str,
    name: &str,
    opts: &CompileOptions,
    arch_flag: &str,
) -> Result<(String, Vec<u8>, String)> {
    let src = CString::new(source).map_err(|_| Error::Value("CUDA source holds a NUL".into()))?;
    let cname = CString::new(name).map_err(|_| Error::Value("kernel name holds a NUL".into()))?;
    let mut flags = vec![
        arch_flag.to_string(),
        "-std=c++17".to_string(),
        "--device-as-default-execution-space".to_string(),
    ];
    if opts.use_fast_math {
        flags.push("--use_fast_math".to_string());
    }
    for d in &opts.include_dirs {
        flags.push(format!("--include-path={}", d.display()));
    }
    let cflags: Vec<CString> = flags
        .iter()
        .map(|f| CString::new(f.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::Value("a compile option holds a NUL".into()))?;
    let ptrs: Vec<*const c_char> = cflags.iter().map(|c| c.as_ptr()).collect();
    let mut prog: Prog = std::ptr::null_mut();
    // SAFETY: valid C strings; no headers passed in memory.
    let st = unsafe {
        (a.create)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(a, st, "nvrtcCreateProgram")?;
    let guard = ProgGuard(a, prog);
    // SAFETY: `prog` is a live program; `ptrs` point into `cflags`, alive for the call.
    let st = unsafe { (a.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
    let log = read_log(a, prog)?;
    if st != 0 {
        drop(guard);
        return Err(Error::Value(format!(
            "NVRTC could not compile {name} for {arch_flag}:\n{log}"
        )));
    }
    let ptx = read_bytes(a, prog, a.ptx_size, a.ptx)?;
    let ptx = String::from_utf8_lossy(ptx.strip_suffix(&[0]).unwrap_or(&ptx)).into_owned();
    let cubin = if arch_flag.contains("=sm_") {
        read_bytes(a, prog, a.cubin_size, a.cubin)?
    } else {
        Vec::new()
    };
    drop(guard);
    Ok((ptx, cubin, log))
}

/// Destroys a program on every exit path.
struct ProgGuard<'a>(&'a Api, Prog);

impl Drop for ProgGuard<'_> {
    fn drop(&mut self) {
        let mut p = self.1;
        // SAFETY: `p` was created by nvrtcCreateProgram and is destroyed once.
        unsafe { (self.0.destroy)(&mut p) };
    }
}

fn read_log(a: &Api, prog: Prog) -> Result<String> {
    let bytes = read_bytes(a, prog, a.log_size, a.log)?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end])
        .trim_end()
        .to_string())
}

type SizeFn = unsafe extern "C" fn(Prog, *mut usize) -> Status;
type DataFn = unsafe extern "C" fn(Prog, *mut c_char) -> Status;

fn read_bytes(a: &Api, prog: Prog, size: SizeFn, data: DataFn) -> Result<Vec<u8>> {
    let mut n = 0usize;
    // SAFETY: a live program and a valid out-pointer.
    check(a, unsafe { size(prog, &mut n) }, "nvrtc size query")?;
    let mut buf = vec![0u8; n];
    if n > 0 {
        check(
            a,
            // SAFETY: a live program, and `buf` holds the `n` bytes NVRTC reported for it.
            unsafe { data(prog, buf.as_mut_ptr().cast()) },
            "nvrtc read",
        )?;
    }
    Ok(buf)
}
