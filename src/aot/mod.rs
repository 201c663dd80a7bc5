//! Ahead-of-time compiled models for the CPU: a graph's fused schedule as a relocatable
//! object file, a C header and a manifest, linked against the run-time library
//! (`libsmelt_rt.a`, the `smelt-rt` crate) instead of carrying the compiler.
//!
//! The object holds the kernels (the same Cranelift lowering as the JIT), the model's plan
//! and constants, and two exported functions: `NAME_run`, which hands the tables to
//! `smelt_rt_run` (buffers in the caller's scratch, kernels over threads, GEMMs), and
//! `NAME_error_string`. [`compile`] builds it; [`AotModel::write`] writes the files;
//! [`compile_model`] is the one-call form for a `build.rs`. Kernels are emitted exactly as
//! for the JIT's disk cache (`exec::cpu`'s entries), and a schedule that cache holds for
//! the graph is reused instead of running the passes again.

mod files;
mod library;
mod model_layout;
mod run;
mod windows;

use crate::codegen_cpu::jit::CodeModule;
use crate::codegen_cpu::lower::{CodegenOptions, cache_key, define_kernel, localize};
use crate::codegen_cpu::object::{ObjectCode, Target, feature_mask};
use crate::ir::dtype::DType;
use crate::ir::graph::Graph;
use crate::kernel::{Schedule, View};
use crate::{Error, Result, bail};
use cranelift_codegen::ir::InstBuilder;
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_module::Linkage;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use crate::codegen_cpu::object::CpuTarget;
pub use files::{link_flags, link_shared, runtime_library};
pub use run::LoadedModel;

/// How to compile a model ahead of time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AotOptions {
    /// The prefix of the C symbols (default: the graph's name); a C identifier.
    pub name: Option<String>,
    /// The CPU the code is for.
    pub cpu: CpuTarget,
    /// The graph of the file to compile (default: the first); for [`compile_model`].
    pub graph: Option<String>,
}

/// An input or output of a compiled model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// Its name in the graph (without `%`).
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
}

impl Port {
    /// Bytes of the C-contiguous array that holds it.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// A compiled model: the object file and what describes it.
pub struct AotModel {
    /// The prefix of its symbols.
    pub name: String,
    /// The graph it was compiled from.
    pub graph: String,
    /// The relocatable object (ELF on Linux).
    pub object: Vec<u8>,
    /// Inputs, in parameter order.
    pub inputs: Vec<Port>,
    /// Outputs, in return order.
    pub outputs: Vec<Port>,
    /// Bytes of scratch a call needs.
    pub scratch_bytes: usize,
    /// The CPU target and the extensions its code needs.
    pub cpu: CpuTarget,
    /// Names of the CPU extensions the code needs.
    pub features: Vec<&'static str>,
    /// The manifest (JSON): kernels, buffers, memory plan, features.
    pub manifest: String,
}

/// Whether `s` is a C identifier.
fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Compiles graph `g` into an object file for `opts.cpu`.
pub fn compile(g: &Graph, opts: &AotOptions) -> Result<AotModel> {
    let name = opts.name.clone().unwrap_or_else(|| g.name.clone());
    if !is_identifier(&name) {
        bail!(
            Value,
            "aot: the name '{name}' is not a C identifier (letters, digits and _, not starting with a digit)"
        );
    }
    // (the ports keep the names of the caller's graph: `given`)
    let given = g;
    let mut obj = ObjectCode::new(&name, opts.cpu)?;
    let features = feature_mask(obj.isa());
    let tiles = runs_tiles(features);
    let (s, windows) = prepare(g, tiles)?;

    // kernels: one function per distinct structure, as the JIT's cache shares them
    let cg = CodegenOptions::default();
    let mut index: HashMap<String, (usize, bool, usize)> = HashMap::new();
    let mut funcs = Vec::new();
    let mut kernel_names = Vec::new();
    let mut kernel = |k: &crate::kernel::Kernel, buffers: &[crate::kernel::Buffer]| {
        let (local, bufs, slots) = localize(k, buffers)?;
        let key = cache_key(&local, &bufs, &cg);
        let code = |(index, streams, block)| model_layout::KernelCode {
            index,
            streams,
            block,
            slots,
        };
        if let Some(&found) = index.get(&key) {
            return Ok(code(found));
        }
        crate::kernel::check_kernel(k, buffers)?;
        let i = funcs.len();
        let symbol = format!("{name}_kernel{i}");
        let (id, stats) = define_kernel(&mut obj, (&symbol, Linkage::Local), &local, &bufs, &cg)?;
        let found = (i, stats.stream_loops > 0, stats.lane_rows.max(1));
        funcs.push(id);
        kernel_names.push((k.name.clone(), symbol));
        index.insert(key, found);
        Ok(code(found))
    };
    let built = model_layout::build(&s, &windows, features, &mut kernel, &|g| prepare(g, tiles))?;

    // the tables `smelt_rt_run` reads
    let words: Vec<u8> = built.words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let plan = obj.data((&format!("{name}_plan"), Linkage::Local), words, 8, &[])?;
    let consts = obj.data(
        (&format!("{name}_consts"), Linkage::Local),
        built.consts.clone(),
        64,
        &[],
    )?;
    let relocs: Vec<(u32, Target)> = funcs
        .iter()
        .enumerate()
        .map(|(i, &f)| ((i * 8) as u32, Target::Func(f)))
        .collect();
    let kernels = obj.data(
        (&format!("{name}_kernels"), Linkage::Local),
        vec![0; funcs.len() * 8],
        8,
        &relocs,
    )?;
    // the call counter dropout masks are drawn with (`smelt_rt::model::ModelTables`)
    let calls = obj.writable_data(&format!("{name}_calls"), vec![0; 8], 8)?;
    let counts = [
        0,
        built.words.len() as u64,
        0,
        funcs.len() as u64,
        0,
        built.consts.len() as u64,
        0,
    ];
    let tables = obj.data(
        (&format!("{name}_tables"), Linkage::Local),
        counts.iter().flat_map(|c| c.to_le_bytes()).collect(),
        8,
        &[
            (0, Target::Data(plan)),
            (16, Target::Data(kernels)),
            (32, Target::Data(consts)),
            (48, Target::Data(calls)),
        ],
    )?;
    let inputs = ports(
        given,
        &s,
        given.inputs(),
        &s.inputs.iter().map(|&b| whole(&s, b)).collect::<Vec<_>>(),
    );
    let outputs = ports(given, &s, given.outputs(), &s.outputs);
    let sizes = |ps: &[Port]| -> Vec<u8> {
        ps.iter()
            .flat_map(|p| (p.bytes() as u64).to_le_bytes())
            .collect()
    };
    obj.data(
        (&format!("{name}_input_bytes"), Linkage::Export),
        sizes(&inputs),
        8,
        &[],
    )?;
    obj.data(
        (&format!("{name}_output_bytes"), Linkage::Export),
        sizes(&outputs),
        8,
        &[],
    )?;

    // the entry points
    let ptr = obj.pointer_type();
    let run_sig = obj.signature(&[ptr, ptr, ptr, ptr, I64], &[I32]);
    let rt_run = obj.import("smelt_rt_run", &run_sig)?;
    obj.define(
        &format!("{name}_run"),
        Linkage::Export,
        &obj.signature(&[ptr, ptr, ptr, I64], &[I32]),
        &mut |fb| {
            let p = fb.b.block_params(entry_block(fb)?).to_vec();
            let gv = fb.data_ref(tables);
            let t = fb.b.ins().symbol_value(ptr, gv);
            let f = fb.func_ref(rt_run);
            let call = fb.b.ins().call(f, &[t, p[0], p[1], p[2], p[3]]);
            let rc = fb.b.inst_results(call)[0];
            fb.b.ins().return_(&[rc]);
            Ok(())
        },
    )?;
    let err_sig = obj.signature(&[I32], &[ptr]);
    let rt_err = obj.import("smelt_rt_error_string", &err_sig)?;
    obj.define(
        &format!("{name}_error_string"),
        Linkage::Export,
        &err_sig,
        &mut |fb| {
            let p = fb.b.block_params(entry_block(fb)?).to_vec();
            let f = fb.func_ref(rt_err);
            let call = fb.b.ins().call(f, &[p[0]]);
            let r = fb.b.inst_results(call)[0];
            fb.b.ins().return_(&[r]);
            Ok(())
        },
    )?;
    let cpu = opts.cpu;
    let object = obj.finish()?;
    files::check_imports(&object)?;
    let feature_names = smelt_rt::model::FEATURES
        .iter()
        .enumerate()
        .filter(|(i, _)| features & (1 << i) != 0)
        .map(|(_, (_, n))| *n)
        .collect();
    let mut m = AotModel {
        name,
        graph: g.name.clone(),
        object,
        inputs,
        outputs,
        scratch_bytes: built.scratch_bytes,
        cpu,
        features: feature_names,
        manifest: String::new(),
    };
    m.manifest = files::manifest(&m, &s, &built, &kernel_names);
    Ok(m)
}

/// The schedule of `g` as an object runs it, and its window steps: what the JIT's passes
/// make of it (its disk cache's schedule when it holds one), with attention and its
/// gradient as products and a softmax (the run-time library has no fused attention), a
/// scatter mean as a sum and a count, and the operands of a copy joined in one dtype.
fn prepare(g: &Graph, tiles: bool) -> Result<model_layout::Prepared> {
    let g = &*crate::passes::decompose::expand_attentions(g)?;
    let g = &*crate::passes::decompose::expand_attention_grads(g)?;
    let g = &*crate::passes::decompose::expand_scatter_means(g)?;
    let g = &*crate::passes::decompose::cast_joined_operands(g)?;
    let jit = crate::exec::CompileOptions::default();
    let planned = match crate::exec::cpu::cached_plan(g, &jit) {
        Some(p) => p,
        None => crate::exec::plan(g, &jit.passes)?,
    };
    let mut s = planned.schedule;
    s.validate()?;
    let windows = windows::prepare(&mut s, tiles)?;
    Ok((s, windows))
}

/// Whether the CPU of code needing `features` (`smelt_rt::model::FEATURES` bits) runs the
/// run-time library's register tiles (AVX2 and FMA): what the library's convolutions decide
/// there, and so the weights' order the object lays out. An AArch64 object needs none.
fn runs_tiles(features: u64) -> bool {
    ["has_avx2", "has_fma"].iter().all(|f| {
        let i = smelt_rt::model::FEATURES.iter().position(|(cl, _)| cl == f);
        i.is_some_and(|i| features & (1 << i) != 0)
    })
}

/// The block a function body starts in (where its parameters are).
fn entry_block(fb: &crate::codegen_cpu::jit::FnBody) -> Result<cranelift_codegen::ir::Block> {
    fb.b.current_block()
        .ok_or_else(|| Error::Unsupported("aot: a function body without its entry block".into()))
}

/// The whole of buffer `b` as a view.
fn whole(s: &Schedule, b: usize) -> View {
    let shape = s.buffers[b].shape.clone();
    View {
        buffer: b,
        offset: 0,
        strides: crate::ir::shape::contiguous_strides(&shape),
        shape,
    }
}

/// The ports of `values` (graph inputs or outputs) with the schedule's views of them.
fn ports(
    g: &Graph,
    s: &Schedule,
    values: &[crate::ir::graph::ValueId],
    views: &[View],
) -> Vec<Port> {
    values
        .iter()
        .zip(views)
        .map(|(&v, view)| Port {
            name: g.node(v).name.clone(),
            dtype: s.buffers[view.buffer].dtype,
            shape: view.shape.clone(),
        })
        .collect()
}

impl AotModel {
    /// The C header (`NAME.h`).
    pub fn header(&self) -> String {
        files::header(self)
    }

    /// A Rust module with a typed function per model (`fn NAME(inputs..) ->
    /// Result<outputs, AotError>`), for `include!` in a crate that links the object.
    pub fn rust_module(&self) -> String {
        files::rust_module(self)
    }

    /// Writes `NAME.o`, `NAME.h` and `manifest.json` into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> Result<()> {
        files::create_dir(dir)?;
        files::write(&dir.join(format!("{}.o", self.name)), &self.object)?;
        files::write(
            &dir.join(format!("{}.h", self.name)),
            self.header().as_bytes(),
        )?;
        files::write(&dir.join("manifest.json"), self.manifest.as_bytes())
    }
}

/// Compiles the graph of a `.smelt` file for a `build.rs`: writes `NAME.o`, `NAME.h`,
/// `manifest.json`, a static library `libNAME.a` holding the object, and `NAME.rs` (the
/// typed Rust function) into `out_dir`, and prints the `cargo:` lines that link the library
/// and rerun the build when the model changes. Returns the model. In a cross build (cargo's
/// `TARGET` is not its `HOST`) the default CPU target means `TARGET`'s, as
/// [`CpuTarget::from_triple`] reads it.
///
/// ```no_run
/// // build.rs
/// let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
/// smelt::aot::compile_model("model.smelt", &out, &smelt::aot::AotOptions::default()).unwrap();
/// // src/main.rs: include!(concat!(env!("OUT_DIR"), "/model.rs"));
/// ```
pub fn compile_model(
    path: impl AsRef<Path>,
    out_dir: &Path,
    opts: &AotOptions,
) -> Result<AotModel> {
    let path = path.as_ref();
    let text =
        std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let module = crate::ir::text::parse_module(&text, &path.display().to_string())?;
    let g = module.pick(opts.graph.as_deref())?;
    let m = compile(g, &for_build_target(opts)?)?;
    m.write(out_dir)?;
    let lib = out_dir.join(format!("lib{}.a", m.name));
    files::write_archive(&lib, &format!("{}.o", m.name), &m.object)?;
    files::write(
        &out_dir.join(format!("{}.rs", m.name)),
        m.rust_module().as_bytes(),
    )?;
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    println!("cargo:rustc-link-lib=static={}", m.name);
    Ok(m)
}

/// `opts` for the crate a build script builds: a cross build (cargo's `TARGET` other than its
/// `HOST`) compiles for `TARGET` where `opts` names this machine (`CpuTarget::Native`).
fn for_build_target(opts: &AotOptions) -> Result<AotOptions> {
    let (Ok(target), Ok(host)) = (std::env::var("TARGET"), std::env::var("HOST")) else {
        return Ok(opts.clone());
    };
    if opts.cpu != CpuTarget::Native || target == host {
        return Ok(opts.clone());
    }
    Ok(AotOptions {
        cpu: CpuTarget::from_triple(&target, "native")?,
        ..opts.clone()
    })
}

/// Where [`compile_model`] and `smelt compile --target cpu` put a model's files.
pub fn object_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.o"))
}
