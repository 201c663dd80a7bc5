//! The disk cache of compiled CPU code: a graph compiled once is loaded by later processes
//! with neither the passes nor Cranelift running.
//!
//! An entry is keyed by the graph's text, the options that change the code, the CPU
//! features the code may use (the ISA's and the strip helpers' level, which `SMELT_CPU` caps),
//! and the smelt version with a hash of its sources (`build.rs`). Entries are never evicted:
//! removing the directory clears the cache.
//! It holds the schedule, and the kernels as one relocatable object, the same code
//! generation as ahead-of-time models ([`crate::aot`]), loaded by [`Loaded`]. A file whose
//! checksum, key, schedule or object does not check out is compiled afresh and overwritten,
//! never executed. On a miss the graph is compiled into an object, stored, and loaded the
//! same way, so a hit runs exactly the code a miss ran.
//!
//! It lives in `$SMELT_CACHE_DIR/cpu` ([`crate::runtime::cache`]); `SMELT_CACHE_DIR=off`
//! turns it off (then the JIT compiles in memory).

use super::{CompileOptions, DiskCache, KernelBackend};
use crate::Result;
use crate::codegen_cpu::linker::Loaded;
use crate::codegen_cpu::lower::{
    CodeStats, CodegenOptions, CpuKernel, cache_key, define_kernel, loaded_kernel, localize,
};
use crate::codegen_cpu::object::{CpuTarget, ObjectCode};
use crate::exec::Planned;
use crate::ir::graph::Graph;
use crate::kernel::{Schedule, Step};
use crate::runtime::cache::{fnv1a, store};
use cranelift_module::Linkage;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The file format of an entry (2: kernels report their row softmax calls).
const FORMAT: u32 = 2;
const MAGIC: &[u8; 8] = b"SMELTCPU";

/// Where a compiled function's code came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CodeOrigin {
    /// Compiled in memory by the JIT (the disk cache is off, or the backend is not
    /// Cranelift).
    #[default]
    Jit,
    /// Compiled now and written to the disk cache.
    Compiled,
    /// Loaded from the disk cache: neither the passes nor Cranelift ran.
    Disk,
}

impl CodeOrigin {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            CodeOrigin::Jit => "jit",
            CodeOrigin::Compiled => "compiled, stored in the disk cache",
            CodeOrigin::Disk => "disk cache",
        }
    }
}

/// What an entry holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Entry {
    /// The full key, compared on load (the file name is only its hash).
    key: String,
    schedule: Schedule,
    input_names: Vec<String>,
    may_alias: Vec<bool>,
    /// Per kernel step: its step index, function index in the object and code statistics.
    kernels: Vec<(usize, usize, CodeStats)>,
    object: Vec<u8>,
}

/// A compiled graph from the cache: the pass pipeline's result and each kernel step's code.
pub(super) struct Cached {
    pub planned: Planned,
    pub kernels: Vec<Option<Arc<CpuKernel>>>,
    pub origin: CodeOrigin,
}

/// The CPU features this process's code is compiled for, as the key writes them.
fn host_features() -> &'static str {
    static F: OnceLock<String> = OnceLock::new();
    F.get_or_init(|| match CpuTarget::Native.isa(true) {
        Ok(isa) => isa.isa_flags().iter().map(|v| format!("{v} ")).collect(),
        Err(_) => String::new(),
    })
}

fn key(g: &Graph, opts: &CompileOptions) -> String {
    format!(
        "smelt {} {}|format {FORMAT}|{} strips {}|{:?}|{:?}|{}",
        env!("CARGO_PKG_VERSION"),
        env!("SMELT_SOURCE_HASH"),
        host_features(),
        // what the kernels hand to native helpers depends on it (`SMELT_CPU` caps it)
        crate::codegen_cpu::vmath::isa(),
        // every pass option shapes the schedule, every codegen option the code
        opts.passes,
        opts.cpu.codegen,
        // constants by a hash of their bytes: a traced model's weights written out in
        // decimal cost seconds per 100 MB
        crate::ir::text::print_graph_digest(g, &|lit| {
            format!("{:016x}/{}", fnv1a(&[&lit.bytes]), lit.bytes.len())
        })
    )
}

fn file_of(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{:016x}.bin", fnv1a(&[key.as_bytes()])))
}

/// Compiles `g` through the disk cache when it is on and the backend is Cranelift; Ok(None)
/// otherwise (the caller then compiles in memory).
pub(super) fn compile(g: &Graph, opts: &CompileOptions) -> Result<Option<Cached>> {
    let dir = match &opts.cpu.disk_cache {
        DiskCache::Env => crate::runtime::cache::dir("cpu"),
        DiskCache::Off => None,
        DiskCache::At(d) => Some(d.clone()),
    };
    match dir {
        Some(dir) if opts.cpu.kernels == KernelBackend::Cranelift => compile_in(&dir, g, opts),
        _ => Ok(None),
    }
}

/// [`compile`] with the cache in `dir`.
fn compile_in(dir: &Path, g: &Graph, opts: &CompileOptions) -> Result<Option<Cached>> {
    if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        return Ok(None);
    }
    let key = key(g, opts);
    let file = file_of(dir, &key);
    if let Some(c) = std::fs::read(&file).ok().and_then(|b| load(&b, &key).ok()) {
        crate::device::cache::touch(&file);
        return Ok(Some(Cached {
            origin: CodeOrigin::Disk,
            ..c
        }));
    }
    let planned = super::super::plan(g, &opts.passes)?;
    planned.schedule.validate()?;
    let entry = build(key, planned, &opts.cpu.codegen)?;
    let bytes = encode(&entry)?;
    // loaded from the entry itself: what a later process will load
    let c = load(&bytes, &entry.key)
        .map_err(|why| crate::Error::Unsupported(format!("disk cache: a fresh entry: {why}")))?;
    store(&file, &bytes);
    Ok(Some(Cached {
        origin: CodeOrigin::Compiled,
        ..c
    }))
}

/// Compiles the kernels of a planned graph into one object.
fn build(key: String, planned: Planned, cg: &CodegenOptions) -> Result<Entry> {
    let s = &planned.schedule;
    let mut obj = ObjectCode::new("smelt_cache", CpuTarget::Native)?;
    let mut index: HashMap<String, (usize, CodeStats)> = HashMap::new();
    let mut kernels = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        let Step::Kernel(k) = step else { continue };
        let (local, bufs, _) = localize(k, &s.buffers)?;
        let ck = cache_key(&local, &bufs, cg);
        let (f, stats) = match index.get(&ck) {
            Some(&x) => x,
            None => {
                crate::kernel::check_kernel(k, &s.buffers)?;
                let f = index.len();
                let (_, stats) = define_kernel(
                    &mut obj,
                    (&format!("k{f}"), Linkage::Export),
                    &local,
                    &bufs,
                    cg,
                )?;
                index.insert(ck, (f, stats));
                (f, stats)
            }
        };
        kernels.push((i, f, stats));
    }
    Ok(Entry {
        key,
        input_names: planned.input_names,
        may_alias: planned.may_alias,
        schedule: planned.schedule,
        kernels,
        object: obj.finish()?,
    })
}

fn encode(e: &Entry) -> Result<Vec<u8>> {
    let payload = postcard::to_stdvec(e)
        .map_err(|x| crate::Error::Unsupported(format!("disk cache: encoding an entry: {x}")))?;
    Ok(framed(&payload))
}

/// An entry's file: the magic, the format, the payload's checksum, then the payload.
fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 20);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&fnv1a(&[payload]).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The schedule of `g` compiled with `opts` when the disk cache holds it (for
/// ahead-of-time compilation, which then skips the passes).
pub(crate) fn cached_plan(g: &Graph, opts: &CompileOptions) -> Option<Planned> {
    let dir = match &opts.cpu.disk_cache {
        DiskCache::Env => crate::runtime::cache::dir("cpu")?,
        DiskCache::Off => return None,
        DiskCache::At(d) => d.clone(),
    };
    let key = key(g, opts);
    let e = decode(&std::fs::read(file_of(&dir, &key)).ok()?, &key).ok()?;
    Some(Planned {
        schedule: e.schedule,
        input_names: e.input_names,
        may_alias: e.may_alias,
    })
}

/// An entry whose header, checksum, key and schedule check out.
fn decode(bytes: &[u8], key: &str) -> std::result::Result<Entry, String> {
    let payload = bytes.strip_prefix(MAGIC.as_slice()).ok_or("not an entry")?;
    let (format, rest) = payload.split_at_checked(4).ok_or("truncated")?;
    let (sum, payload) = rest.split_at_checked(8).ok_or("truncated")?;
    if format != FORMAT.to_le_bytes() {
        return Err("another format".into());
    }
    if sum != fnv1a(&[payload]).to_le_bytes() {
        return Err("checksum mismatch".into());
    }
    let e: Entry = postcard::from_bytes(payload).map_err(|x| format!("decoding: {x}"))?;
    if e.key != key {
        return Err("another key".into());
    }
    e.schedule.validate().map_err(|x| x.to_string())?;
    Ok(e)
}

/// An entry's compiled graph, or why it does not check out.
fn load(bytes: &[u8], key: &str) -> std::result::Result<Cached, String> {
    let e = decode(bytes, key)?;
    let image = Arc::new(Loaded::new(&e.object, &resolve).map_err(|x| x.to_string())?);
    let s = &e.schedule;
    let mut kernels = vec![None; s.steps.len()];
    for &(i, f, stats) in &e.kernels {
        let Some(Step::Kernel(k)) = s.steps.get(i) else {
            return Err(format!("step {i} is not a kernel"));
        };
        let func = image
            .symbol(&format!("k{f}"))
            .ok_or_else(|| format!("no function k{f}"))?;
        // SAFETY: `k{f}` is the function `build` defined for this step's kernel structure.
        let code = unsafe { loaded_kernel(k, &s.buffers, func, stats, image.clone()) }
            .map_err(|x| x.to_string())?;
        kernels[i] = Some(code);
    }
    let missing = s
        .steps
        .iter()
        .zip(&kernels)
        .any(|(st, k)| matches!(st, Step::Kernel(_)) && k.is_none());
    if missing {
        return Err("a kernel without code".into());
    }
    Ok(Cached {
        planned: Planned {
            schedule: e.schedule,
            input_names: e.input_names,
            may_alias: e.may_alias,
        },
        kernels,
        origin: CodeOrigin::Disk,
    })
}

/// Decodes and links `payload` as an entry's (framed here so that its checksum holds,
/// under whatever key it names): the fuzz target of the entry reader ([`crate::fuzz`]).
pub(crate) fn fuzz_entry(payload: &[u8]) {
    if let Ok(e) = postcard::from_bytes::<Entry>(payload) {
        let _ = load(&framed(payload), &e.key);
    }
}

/// The address of a function the cached code calls: a helper of the code generator or of
/// the run-time library, or a libcall ([`smelt_rt::libcalls`]).
pub(crate) fn resolve(name: &str) -> Option<usize> {
    // built once: a load resolves a symbol per relocation
    static HELPERS: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    let helpers = HELPERS.get_or_init(|| {
        crate::codegen_cpu::helpers::symbols()
            .into_iter()
            .map(|(n, p, _)| (n, p as usize))
            .collect()
    });
    helpers
        .get(name)
        .copied()
        .or_else(|| smelt_rt::libcalls::address(name).map(|f| f as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> Graph {
        let text = "graph g(%x: f32[3,5], %b: f32[5]) {\n  %r = relu(%x)\n  %y = add(%r, %b)\n  %e = exp(%y)\n  return %e\n}\n";
        crate::ir::text::parse_module(text, "g")
            .unwrap()
            .graphs
            .remove(0)
    }

    fn entry_bytes(g: &Graph, opts: &CompileOptions) -> (String, Vec<u8>) {
        let key = key(g, opts);
        let planned = crate::exec::plan(g, &opts.passes).unwrap();
        let e = build(key.clone(), planned, &opts.cpu.codegen).unwrap();
        (key, encode(&e).unwrap())
    }

    #[test]
    fn an_entry_loads_only_under_its_own_key_and_intact() {
        let opts = CompileOptions::default();
        let (key, bytes) = entry_bytes(&graph(), &opts);
        assert!(load(&bytes, &key).is_ok());
        // another graph, or the same under other options, has another key
        let fast = opts.clone().fast_math(true);
        assert_ne!(super::key(&graph(), &fast), key);
        let mut lanes = opts.clone();
        lanes.cpu.codegen.f32_lane_sums = true;
        assert_ne!(super::key(&graph(), &lanes), key);
        assert_eq!(load(&bytes, "another").err().unwrap(), "another key");
        // any flipped byte is caught by the checksum (or the header), before decoding
        for at in [0, 9, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(load(&bad, &key).is_err(), "byte {at}");
        }
        assert!(load(&bytes[..bytes.len() - 3], &key).is_err());
        assert!(load(b"SMELTCPU", &key).is_err());
    }

    #[test]
    fn a_valid_looking_entry_with_a_broken_schedule_or_object_is_refused() {
        let g = graph();
        let opts = CompileOptions::default();
        let key = super::key(&g, &opts);
        let planned = crate::exec::plan(&g, &opts.passes).unwrap();
        let mut e = build(key.clone(), planned, &opts.cpu.codegen).unwrap();
        // an object that is not one, under a correct checksum
        let object = std::mem::take(&mut e.object);
        e.object = b"\x7fELF-truncated".to_vec();
        assert!(load(&encode(&e).unwrap(), &key).is_err());
        // a schedule that reads a buffer that does not exist
        e.object = object;
        if let Some(Step::Kernel(k)) = e.schedule.steps.first_mut() {
            k.stores[0].buffer = 999;
        }
        assert!(load(&encode(&e).unwrap(), &key).is_err());
    }
}
