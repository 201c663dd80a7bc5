//! The `smelt` command line: `run` a `.smelt` graph on `.npy` inputs, `profile` it, take its
//! gradients (`grad`), `compile` it ahead of time for CUDA, `check` and print it, or draw it as
//! Graphviz (`dot`). Errors print as `error: ...` and exit with status 1; usage errors exit
//! with status 2.

pub mod cache;
pub mod check;
pub mod compile;
pub mod export;
pub mod fuzz;
pub mod grad;
pub mod import;
pub mod model;
mod profile;
mod profile_cuda;
mod report;
mod roof;

use crate::exec::{self, CompileOptions};
use crate::ir::graph::{Graph, Module};
use crate::runtime::{Device, interp, npy};
use crate::{Error, Result, Tensor};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Command-line arguments.
#[derive(Parser, Debug)]
#[command(
    name = "smelt",
    version,
    about = "Run, check and draw .smelt tensor graphs"
)]
pub struct Cli {
    #[command(subcommand)]
    /// The subcommand to run.
    pub command: Command,
}

/// The subcommands. More may come, so a `match` outside this crate needs a wildcard arm.
#[derive(Subcommand, Debug)]
#[non_exhaustive]
pub enum Command {
    /// Run a graph on .npy inputs and write its outputs as DIR/out0.npy, DIR/out1.npy, ...
    Run(RunArgs),
    /// Parse and verify a model, then print it with every type written out.
    Check(check::CheckArgs),
    /// Print a graph as Graphviz dot.
    Dot(DotArgs),
    /// Gradients of the sum of all outputs w.r.t. inputs, written as DIR/grad_<input>.npy.
    Grad(grad::GradArgs),
    /// Compile a graph's fused kernels for a target (CUDA: .cu, .ptx, .cubin, manifest.json).
    Compile(compile::CompileArgs),
    /// Time a graph eager, compiled unfused and compiled fused, kernel by kernel.
    Profile(profile::ProfileArgs),
    /// Show (`stats`) or empty (`clear`) the disk cache of compiled code.
    Cache(cache::CacheArgs),
    /// Turn an ONNX model into DIR/NAME.smelt and DIR/NAME.safetensors (its weights).
    Import(import::ImportArgs),
    /// Write a graph (and its --weights) as an ONNX model.
    Export(export::ExportArgs),
    /// Run random graphs on every CPU path against a float64 oracle; shrink and write
    /// each failing one.
    Fuzz(fuzz::FuzzArgs),
}

/// Arguments of `smelt run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The .smelt or .onnx file.
    pub model: PathBuf,
    /// A graph input: NAME=FILE.npy (once per input; for ONNX, NAME as written in the
    /// model).
    #[arg(long = "input", value_name = "NAME=FILE", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Directory for the outputs (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Where the graph runs.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Compile every op as its own kernel (no effect on the interpreter).
    #[arg(long)]
    pub no_fuse: bool,
    /// The graph to run (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// Parameters of a .smelt graph, bound by name from a safetensors file.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Also time N more calls after the first and print the load-and-compile time and the
    /// calls' median, minimum and maximum (to standard error).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub repeat: usize,
}

/// Arguments of `smelt dot`.
#[derive(clap::Args, Debug)]
pub struct DotArgs {
    /// The .smelt or .onnx file.
    pub model: PathBuf,
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The graph to draw (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
}

/// Execution backends.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The reference interpreter (eager kernels, node by node).
    Interp,
    /// Cranelift-compiled CPU code.
    Cpu,
    /// CUDA kernels through NVRTC.
    Cuda,
}

/// Parses `NAME=FILE` (a leading `%` on the name is allowed).
fn parse_input(s: &str) -> std::result::Result<(String, PathBuf), String> {
    let (name, file) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=FILE, got '{s}'"))?;
    let name = name.strip_prefix('%').unwrap_or(name);
    if name.is_empty() || file.is_empty() {
        return Err(format!("expected NAME=FILE, got '{s}'"));
    }
    Ok((name.to_string(), PathBuf::from(file)))
}

/// Entry point of the `smelt` binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    match execute(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs one subcommand.
pub fn execute(command: &Command) -> Result<()> {
    match command {
        Command::Run(a) => run(a),
        Command::Check(a) => check::check(a),
        Command::Dot(a) => dot(a),
        Command::Grad(a) => grad::grad(a),
        Command::Compile(a) => compile::run(a),
        Command::Profile(a) => profile::profile(a),
        Command::Cache(a) => cache::cache(a),
        Command::Import(a) => import::import(a),
        Command::Export(a) => export::export(a),
        Command::Fuzz(a) => fuzz::fuzz(a),
    }
}

/// Runs `smelt run`: the graph on the `.npy` inputs, the outputs written as
/// `out0.npy`, `out1.npy`, ... in `a.out`.
pub fn run(a: &RunArgs) -> Result<()> {
    let given = model::read_inputs(&a.inputs)?;
    let t0 = std::time::Instant::now();
    let loaded = model::load_model_for(&a.model, a.weights.as_deref(), &given, a.graph.as_deref())?;
    let g = pick(&loaded.module, a.graph.as_deref())?;
    let inputs = loaded.named_inputs(g, given)?;
    let call = prepare(g, a.backend, a.no_fuse)?;
    let ordered = interp::ordered_inputs(g, &inputs)?;
    let ready = t0.elapsed();
    let outputs = call(&ordered)?;
    if a.repeat > 0 {
        let mut ms: Vec<f64> = (0..a.repeat)
            .map(|_| {
                let t = std::time::Instant::now();
                call(&ordered).map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_>>()?;
        ms.sort_by(f64::total_cmp);
        eprintln!(
            "load and compile {:.1} ms; {} calls: median {:.3} ms (min {:.3}, max {:.3})",
            ready.as_secs_f64() * 1e3,
            ms.len(),
            ms[ms.len() / 2],
            ms[0],
            ms[ms.len() - 1]
        );
    }
    std::fs::create_dir_all(&a.out).map_err(|e| Error::Io(format!("{}: {e}", a.out.display())))?;
    for (i, t) in outputs.iter().enumerate() {
        let path = a.out.join(format!("out{i}.npy"));
        match loaded.output_types.get(i) {
            Some(&elem_type) => crate::onnx::write_output(path, t, elem_type)?,
            None => npy::write_npy(path, t)?,
        }
    }
    Ok(())
}

/// A call of the graph with its inputs in graph order.
type Call<'g> = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'g>;

/// `g` ready to call on the chosen backend (outputs on the host).
fn prepare(g: &Graph, backend: Backend, no_fuse: bool) -> Result<Call<'_>> {
    let device = match backend {
        Backend::Interp => return Ok(Box::new(move |x| interp::run_positional(g, x))),
        Backend::Cpu => Device::Cpu,
        Backend::Cuda => Device::Cuda(0),
    };
    // Compiled first, so that a missing device is the error even without inputs; then the
    // interpreter's binding gives the same messages on every backend.
    let f = exec::compile(g, device, &CompileOptions::default().fused(!no_fuse))?;
    Ok(Box::new(move |x| f.call_from_host(x)))
}

/// Runs `g` on the chosen backend (outputs on the host).
fn evaluate(
    g: &Graph,
    inputs: &[(String, Tensor)],
    backend: Backend,
    no_fuse: bool,
) -> Result<Vec<Tensor>> {
    let call = prepare(g, backend, no_fuse)?;
    call(&interp::ordered_inputs(g, inputs)?)
}

fn dot(a: &DotArgs) -> Result<()> {
    let text = match model::read_smelt(&a.model)? {
        // drawn with its sizes as the symbols give them (`render` of a module without
        // symbols is its drawing)
        Some(m) => m.render(|module| Ok(pick(module, a.graph.as_deref())?.to_dot()))?,
        None => pick(&load(&a.model)?, a.graph.as_deref())?.to_dot(),
    };
    match &a.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Reads a model file: `.smelt` text (the parser verifies every graph) or ONNX (imported
/// with every named dim 1).
fn load(path: &Path) -> Result<Module> {
    Ok(model::load_model(path, None, &[])?.module)
}

fn pick<'m>(module: &'m Module, name: Option<&str>) -> Result<&'m Graph> {
    module.pick(name)
}
