//! `smelt compile MODEL --target cuda --out DIR`: the fused schedule of a graph as CUDA C,
//! PTX and CUBIN files, one set per kernel, plus `manifest.json` describing how to run them.
//!
//! `smelt compile MODEL --target cpu --out DIR`: the model as an object file with a C header
//! and a manifest ([`crate::aot`]), the run-time library beside it, and `link-flags.txt`.

use super::{load, pick};
use crate::codegen_cuda::nvrtc::{self, CompileOptions};
use crate::codegen_cuda::{CudaOptions, CudaProgram, CudaStep, Launch, c_type, generate};
use crate::ir::control::ControlKind;
use crate::kernel::{BufferKind, Schedule, Step, View};
use crate::passes::fuse;
use crate::{Error, Result};
use clap::ValueEnum;
use std::path::{Path, PathBuf};

/// Compilation targets.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// CUDA C compiled by NVRTC to PTX and CUBIN.
    Cuda,
    /// An object file and a C header for the CPU, linked against `libsmelt_rt.a`.
    Cpu,
}

/// Arguments of `smelt compile`.
#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// The .smelt file.
    pub model: PathBuf,
    /// What to generate.
    #[arg(long, value_enum, default_value_t = Target::Cuda)]
    pub target: Target,
    /// Directory for the files (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The GPU architecture of the CUBIN files (PTX is for the matching compute_XY).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// The graph to compile (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// Compile with --use_fast_math.
    #[arg(long)]
    pub fast_math: bool,
    /// The prefix of the C symbols (cpu; default: the graph's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The CPU the code is for (cpu): native, x86-64-v3 or x86-64-v4.
    #[arg(long, default_value = "native")]
    pub cpu: String,
    /// The machine the code is for (cpu): x86_64-unknown-linux-gnu or
    /// aarch64-unknown-linux-gnu (default: this one). Another machine's object is written
    /// without the run-time library, which is built for it with `cargo build --release -p
    /// smelt-rt --target TRIPLE`.
    #[arg(long, value_name = "TRIPLE")]
    pub target_triple: Option<String>,
    /// A safetensors file of the graph's parameters (cpu): they are compiled into the
    /// object's read-only data instead of being inputs. An ONNX model's initializers
    /// always are.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Also link `libNAME.so` (cpu): the object and the run-time library as one shared
    /// library that exports only the model's entry points (needs a C compiler as `cc`, or
    /// `$CC`).
    #[arg(long)]
    pub shared: bool,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
}

/// Runs `smelt compile`.
pub fn run(a: &CompileArgs) -> Result<()> {
    if a.target == Target::Cpu {
        let loaded =
            super::model::load_model_for(&a.model, a.weights.as_deref(), &[], a.graph.as_deref())?;
        let g = pick(&loaded.module, a.graph.as_deref())?;
        if loaded.weights.is_empty() {
            return cpu(a, g);
        }
        return cpu(a, &crate::passes::fold::bind_inputs(g, &loaded.weights)?);
    }
    if a.shared || a.weights.is_some() || a.target_triple.is_some() {
        return Err(Error::Value(
            "--shared, --weights and --target-triple are for --target cpu".into(),
        ));
    }
    let module = load(&a.model)?;
    let g = pick(&module, a.graph.as_deref())?;
    let expanded = crate::passes::decompose::expand_attention_grads(g)?;
    let g = &*expanded;
    let schedule = fuse::compile(g)?;
    let opts = CudaOptions {
        use_fast_math: a.fast_math,
    };
    let prog = generate(&schedule, &opts)?;
    // a control op's bodies: programs of their own, each with its manifest
    let bodies = crate::codegen_cuda::generate_bodies(g, &opts)?;
    let mut copts = CompileOptions::for_arch(&a.arch);
    copts.use_fast_math = a.fast_math;
    // compile everything before writing anything, so a failure leaves no partial output
    let mut compiled = Vec::new();
    for p in std::iter::once(&prog).chain(bodies.iter().map(|(_, _, p)| p)) {
        for i in 0..p.kernels.len() {
            let unit = p.unit(i).unwrap_or_default();
            let name = format!("{}.cu", p.kernels[i].name);
            compiled.push((
                p.kernels[i].name.clone(),
                unit.clone(),
                nvrtc::compile(&unit, &name, &copts)?,
            ));
        }
    }
    std::fs::create_dir_all(&a.out).map_err(|e| Error::Io(format!("{}: {e}", a.out.display())))?;
    for (name, unit, c) in &compiled {
        write(&a.out.join(format!("{name}.cu")), unit.as_bytes())?;
        write(&a.out.join(format!("{name}.ptx")), c.ptx.as_bytes())?;
        write(&a.out.join(format!("{name}.cubin")), &c.cubin)?;
    }
    let nv = nvrtc::version()?;
    for (name, s, p) in &bodies {
        let m = manifest(s, p, &a.arch, nv);
        write(&a.out.join(format!("body_{name}.json")), m.as_bytes())?;
    }
    let manifest = manifest(&schedule, &prog, &a.arch, nv);
    write(&a.out.join("manifest.json"), manifest.as_bytes())
}

/// `--target cpu`: the object, header and manifest, the run-time library and the link
/// flags, all in `--out`.
fn cpu(a: &CompileArgs, g: &crate::ir::graph::Graph) -> Result<()> {
    use crate::aot::CpuTarget;
    let cpu = match &a.target_triple {
        Some(t) => CpuTarget::from_triple(t, &a.cpu)?,
        None => CpuTarget::parse(&a.cpu)?,
    };
    if a.shared && !cpu.is_host() {
        return Err(Error::Value(format!(
            "--shared links with this machine's run-time library, not one for {}: link the object on that machine",
            cpu.triple()
        )));
    }
    let opts = crate::aot::AotOptions {
        name: a.name.clone(),
        cpu,
        graph: None,
    };
    // everything that can fail before writing comes first, so a failure leaves no output
    let m = crate::aot::compile(g, &opts)?;
    if !cpu.is_host() {
        return cross(&m, &a.out);
    }
    let rt = crate::aot::runtime_library()?;
    let lib = std::fs::read(&rt).map_err(|e| Error::Io(format!("{}: {e}", rt.display())))?;
    m.write(&a.out)?;
    let dest = a.out.join("libsmelt_rt.a");
    write(&dest, &lib)?;
    let dest =
        std::fs::canonicalize(&dest).map_err(|e| Error::Io(format!("{}: {e}", dest.display())))?;
    let flags = crate::aot::link_flags(&dest) + "\n";
    write(&a.out.join("link-flags.txt"), flags.as_bytes())?;
    println!(
        "{}: {} input(s), {} output(s), {} scratch bytes, CPU {} ({}) -> {}",
        m.name,
        m.inputs.len(),
        m.outputs.len(),
        m.scratch_bytes,
        m.cpu.name(),
        m.features.join(" "),
        a.out.display()
    );
    if a.shared {
        let so = crate::aot::link_shared(&m, &a.out, &dest)?;
        println!("shared library: {}", so.display());
    }
    Ok(())
}

/// A cross-compiled model: the object, header and manifest, and link flags that name the
/// run-time library the user builds for that machine and copies beside the object.
fn cross(m: &crate::aot::AotModel, out: &Path) -> Result<()> {
    m.write(out)?;
    // where the user puts that library: beside the object, as for this machine
    let dir =
        std::fs::canonicalize(out).map_err(|e| Error::Io(format!("{}: {e}", out.display())))?;
    let flags = crate::aot::link_flags(&dir.join("libsmelt_rt.a")) + "\n";
    write(&out.join("link-flags.txt"), flags.as_bytes())?;
    println!(
        "{}: {} input(s), {} output(s), {} scratch bytes, {} -> {}\n\
         link it with the run-time library built for that machine, copied beside it:\n  \
         cargo build --release -p smelt-rt --target {}",
        m.name,
        m.inputs.len(),
        m.outputs.len(),
        m.scratch_bytes,
        m.cpu.triple(),
        out.display(),
        m.cpu.triple()
    );
    Ok(())
}

/// A JSON string literal.
fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn list<T: ToString>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

fn view_json(v: &View) -> String {
    format!(
        "{{\"buffer\": {}, \"shape\": {}, \"strides\": {}, \"offset\": {}}}",
        v.buffer,
        list(&v.shape),
        list(&v.strides),
        v.offset
    )
}

fn launch_json(l: &Launch) -> String {
    match *l {
        Launch::Pointwise { n, block, grid } => format!(
            "{{\"kind\": \"pointwise\", \"elements\": {n}, \"grid\": {grid}, \"block\": {block}, \"shared_bytes\": 0}}"
        ),
        Launch::Rows {
            per_thread,
            rows,
            row_len,
            block,
            grid,
            shared_bytes,
        } => format!(
            "{{\"kind\": \"rows\", \"rows\": {rows}, \"row_len\": {row_len}, \"grid\": {grid}, \"block\": {block}, \"shared_bytes\": {shared_bytes}, \"thread_per_row\": {per_thread}}}"
        ),
    }
}

/// The manifest: buffers (with sizes), steps in order, kernels with parameters and launch
/// configuration, extern calls, outputs.
pub fn manifest(s: &Schedule, p: &CudaProgram, arch: &str, nvrtc: (i32, i32)) -> String {
    let mut o = String::from("{\n");
    o.push_str(&format!("  \"schedule\": {},\n", js(&s.name)));
    o.push_str("  \"target\": \"cuda\",\n");
    o.push_str(&format!("  \"arch\": {},\n", js(arch)));
    o.push_str(&format!("  \"nvrtc\": \"{}.{}\",\n", nvrtc.0, nvrtc.1));
    o.push_str(&format!("  \"fast_math\": {},\n", p.options.use_fast_math));
    let bufs: Vec<String> = s
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let kind = match &b.kind {
                BufferKind::Input(k) => format!("\"input\", \"input\": {k}"),
                BufferKind::Constant(_) => "\"constant\"".to_string(),
                BufferKind::Temp => "\"temp\"".to_string(),
            };
            format!(
                "    {{\"id\": {i}, \"name\": {}, \"dtype\": \"{}\", \"ctype\": \"{}\", \"shape\": {}, \"bytes\": {}, \"kind\": {kind}}}",
                js(&b.name),
                b.dtype.name(),
                c_type(b.dtype),
                list(&b.shape),
                b.bytes()
            )
        })
        .collect();
    o.push_str(&format!("  \"buffers\": [\n{}\n  ],\n", bufs.join(",\n")));
    o.push_str(&format!("  \"inputs\": {},\n", list(&s.inputs)));
    let outs: Vec<String> = s
        .outputs
        .iter()
        .map(|v| format!("    {}", view_json(v)))
        .collect();
    o.push_str(&format!("  \"outputs\": [\n{}\n  ],\n", outs.join(",\n")));
    // the schedule's control calls, in the order of the program's control steps
    let mut calls = s.steps.iter().filter_map(|st| match st {
        Step::Control(c) => Some(c),
        _ => None,
    });
    let steps: Vec<String> = p
        .steps
        .iter()
        .map(|st| match st {
            CudaStep::Kernel(i) => format!("    {{\"kernel\": {}}}", js(&p.kernels[*i].name)),
            CudaStep::Extern(e) => {
                let args: Vec<String> = e.args.iter().map(view_json).collect();
                format!(
                    "    {{\"extern\": {}, \"args\": [{}], \"out\": {}}}",
                    js(&e.op),
                    args.join(", "),
                    e.out
                )
            }
            CudaStep::Control { op, bodies } => {
                let b: Vec<String> = bodies
                    .iter()
                    .map(|n| js(&format!("body_{n}.json")))
                    .collect();
                // what a host driver needs besides the bodies, as for an extern call: the
                // operands' views and the results' buffers (null: unread), and a scan's
                // carry count and direction
                let (mut args, mut outs, mut scan) = (Vec::new(), Vec::new(), String::new());
                if let Some(c) = calls.next() {
                    args = c.args.iter().map(view_json).collect();
                    outs = c
                        .outs
                        .iter()
                        .map(|o| o.map_or("null".to_string(), |b| b.to_string()))
                        .collect();
                    if let ControlKind::Scan { carries, reverse } = c.control.kind {
                        scan = format!(", \"carries\": {carries}, \"reverse\": {reverse}");
                    }
                }
                format!(
                    "    {{\"control\": {}, \"bodies\": [{}], \"args\": [{}], \"outs\": [{}]{scan}}}",
                    js(op),
                    b.join(", "),
                    args.join(", "),
                    outs.join(", ")
                )
            }
        })
        .collect();
    o.push_str(&format!("  \"steps\": [\n{}\n  ],\n", steps.join(",\n")));
    let kernels: Vec<String> = p
        .kernels
        .iter()
        .map(|k| {
            let params: Vec<String> = k
                .params
                .iter()
                .map(|q| {
                    let buf = q.buffer.map_or("null".to_string(), |b| b.to_string());
                    format!(
                        "{{\"name\": {}, \"buffer\": {buf}, \"ctype\": {}, \"access\": \"{}\"}}",
                        js(&q.name),
                        js(&q.ctype),
                        q.access.name()
                    )
                })
                .collect();
            format!(
                "    {{\"name\": {}, \"ir_name\": {}, \"cu\": {}, \"ptx\": {}, \"cubin\": {}, \"params\": [{}], \"launch\": {}}}",
                js(&k.name),
                js(&k.ir_name),
                js(&format!("{}.cu", k.name)),
                js(&format!("{}.ptx", k.name)),
                js(&format!("{}.cubin", k.name)),
                params.join(", "),
                launch_json(&k.launch)
            )
        })
        .collect();
    o.push_str(&format!("  \"kernels\": [\n{}\n  ]\n", kernels.join(",\n")));
    o.push_str("}\n");
    o
}
