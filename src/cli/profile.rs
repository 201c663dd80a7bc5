//! `smelt profile`: times a graph three ways — eagerly (the eager kernels, node by node, as
//! `Tensor` ops run them), the compiled unfused schedule (one kernel per op) and the compiled fused
//! schedule — and prints a table per way (kernel, ops, time, bytes, GB/s, GFLOP/s) and a
//! summary with the speedups; `--json FILE` writes the same figures as JSON.

use super::model::{Loaded, load_model_for, read_inputs};
use super::{Backend, parse_input, pick};
use crate::exec::{CompileOptions, CompiledFn, Executable, KernelBackend, StepInfo};
use crate::ir::dtype::DType;
use crate::ir::graph::{Graph, NodeKind, ValueId};
use crate::ir::op::Op;
use crate::ir::shape::numel;
use crate::runtime::{Tensor, apply};
use crate::{Error, Result, bail};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Arguments of `smelt profile`.
#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    /// The .smelt or .onnx file.
    pub model: PathBuf,
    /// A graph input: NAME=FILE.npy (once per input).
    #[arg(long = "input", value_name = "NAME=FILE", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Random values for every input not given with --input (the default without --input).
    #[arg(long)]
    pub random_inputs: bool,
    /// Timed calls of each way (after one warm-up call); medians are reported.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub repeat: usize,
    /// Also write the figures to this file as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The graph to profile (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// What runs the compiled kernels on the CPU.
    #[arg(long, value_enum, default_value_t = Kernels::Cranelift)]
    pub kernels: Kernels,
    /// Where the graph runs: cpu (the compiled kernels above), interp (the kernel-IR
    /// interpreter) or cuda (GPU 0, timed with CUDA events).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Skip the comparison with the CPU interpreter (for graphs too large to run there).
    #[arg(long)]
    pub no_check: bool,
    /// Also record one call of each way and write them as a Chrome trace (Perfetto,
    /// chrome://tracing): eager, unfused and fused on separate tracks.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Also write a self-contained HTML report of fused against unfused.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Parameters of a .smelt graph, bound by name from a safetensors file.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
}

/// Kernel backends selectable on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// Machine code generated with Cranelift.
    Cranelift,
    /// The kernel-IR interpreter.
    Interp,
}

/// One timed way of running the graph.
pub(super) struct Way {
    /// Per step: name, ops, bytes, flops.
    pub(super) steps: Vec<StepInfo>,
    /// Per timed call: per-step times.
    pub(super) samples: Vec<Vec<Duration>>,
    /// Per timed call: the whole call.
    pub(super) totals: Vec<Duration>,
}

impl Way {
    pub(super) fn median_ms(&self) -> f64 {
        median(self.totals.iter().map(ms).collect())
    }
    pub(super) fn step_ms(&self, i: usize) -> f64 {
        median(
            self.samples
                .iter()
                .filter_map(|s| s.get(i))
                .map(ms)
                .collect(),
        )
    }
}

pub(super) fn ms(d: &Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs `smelt profile`.
pub fn profile(a: &ProfileArgs) -> Result<()> {
    if a.repeat == 0 {
        bail!(Value, "--repeat must be at least 1");
    }
    let backend = match (a.backend, a.kernels) {
        (Backend::Cuda, _) if a.trace.is_some() || a.html.is_some() => bail!(
            Unsupported,
            "--trace and --html record the CPU backends; for a GPU, use smelt::profiler from Rust"
        ),
        (Backend::Cuda, _) => return super::profile_cuda::profile(a),
        (Backend::Interp, _) | (_, Kernels::Interp) => KernelBackend::Interp,
        (Backend::Cpu, Kernels::Cranelift) => KernelBackend::Cranelift,
    };
    crate::runtime::random::manual_seed(0);
    // Parse, passes and code generation of the fused schedule, on a cold kernel cache.
    let t0 = Instant::now();
    let (loaded, given) = load_with_inputs(a)?;
    let g = pick(&loaded.module, a.graph.as_deref())?;
    let fused = CompiledFn::compile(g, &CompileOptions::with_backend(backend))?;
    let compile_ms = ms(&t0.elapsed());
    let unfused = CompiledFn::compile(g, &CompileOptions::with_backend(backend).fused(false))?;
    let inputs = gather_inputs(g, a, &loaded, given)?;

    let eager = time_eager(g, &inputs, a.repeat)?;
    let unf = time_compiled(&unfused, &inputs, a.repeat)?;
    let fus = time_compiled(&fused, &inputs, a.repeat)?;
    let (reference, _) = eager_run(g, &inputs)?;
    let diff = max_abs_diff(&reference, &fused.call(&inputs)?);
    let bytes_min = bytes_min(g);
    // the memory roof, right after the kernels it bounds
    let (read, written) = min_traffic(g);
    let roof = super::roof::measure(read, written, a.repeat.max(5))?;

    let mut out = String::new();
    let title = format!("{} ({} kernels: {})", g.name, "compiled", backend.name());
    let _ = writeln!(out, "profile of {title}, median of {} calls\n", a.repeat);
    table(&mut out, "eager (eager kernels, one op at a time)", &eager);
    table(&mut out, "unfused (one kernel per op)", &unf);
    table(&mut out, "fused", &fus);
    let (e, u, f) = (eager.median_ms(), unf.median_ms(), fus.median_ms());
    let _ = writeln!(out, "summary");
    let _ = writeln!(
        out,
        "  compile (parse + passes + codegen, cold): {compile_ms:.3} ms; code: {}",
        fused.code_origin().name()
    );
    let _ = writeln!(
        out,
        "  eager {e:.3} ms | unfused {u:.3} ms ({} steps) | fused {f:.3} ms ({} steps)",
        unf.steps.len(),
        fus.steps.len()
    );
    note_folded(&mut out, &fus);
    let _ = writeln!(
        out,
        "  fused is {:.2}x eager, {:.2}x unfused",
        ratio(e, f),
        ratio(u, f)
    );
    let _ = writeln!(
        out,
        "  minimum traffic {} (inputs read once, outputs written once): {:.2} GB/s fused",
        human_bytes(bytes_min),
        gbps(bytes_min, f)
    );
    let _ = writeln!(
        out,
        "  memory roof (a parallel read of the inputs' bytes, then a write of the outputs'): \
         {:.3} ms ({:.3} + {:.3}); fused at {:.0}% of it",
        roof.ms(),
        roof.read_ms,
        roof.write_ms,
        100.0 * ratio(roof.ms(), f)
    );
    let _ = writeln!(out, "  max |fused - eager| = {diff:e}");
    print!("{out}");

    if let Some(path) = &a.json {
        let j = json!({
            "graph": g.name,
            "backend": backend.name(),
            // the vector width of the CPU kernels' native helpers (SMELT_CPU caps it)
            "strip_isa": crate::codegen_cpu::vmath::isa(),
            "repeat": a.repeat,
            "compile_ms": compile_ms,
            "code_origin": fused.code_origin().name(),
            "cranelift_functions": crate::codegen_cpu::jit::functions_compiled(),
            "bytes_min": bytes_min,
            "roof_read_ms": roof.read_ms,
            "roof_write_ms": roof.write_ms,
            "max_abs_diff": diff,
            "eager": way_json(&eager),
            "unfused": way_json(&unf),
            "fused": way_json(&fus),
        });
        write_json(path, &j)?;
    }
    if a.trace.is_some() || a.html.is_some() {
        let recorded = super::report::record(g, &inputs, &unfused, &fused)?;
        if let Some(path) = &a.trace {
            super::report::write_trace(path, &recorded)?;
            println!("  trace written to {}", path.display());
        }
        if let Some(path) = &a.html {
            let copy_gbps = super::report::copy_bandwidth();
            let page = super::report::html(&super::report::ReportInput {
                graph: g,
                backend: backend.name(),
                eager: &eager,
                unfused: &unf,
                fused: &fus,
                unfused_fn: &unfused,
                fused_fn: &fused,
                recorded: &recorded,
                copy_gbps,
                compile_ms,
                bytes_min,
                repeat: a.repeat,
            })?;
            crate::profiler::write_file(path, &page)?;
            println!(
                "  report written to {} (copy bandwidth {copy_gbps:.1} GB/s)",
                path.display()
            );
        }
    }
    Ok(())
}

/// Writes `j` to `path` as one line of JSON.
pub(super) fn write_json(path: &std::path::Path, j: &Value) -> Result<()> {
    crate::profiler::write_file(path, &format!("{j}\n"))
}

pub(super) fn ratio(base: f64, x: f64) -> f64 {
    if x > 0.0 { base / x } else { f64::NAN }
}

pub(super) fn gbps(bytes: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms * 1e6)
    } else {
        f64::NAN
    }
}

pub(super) fn human_bytes(b: usize) -> String {
    crate::profiler::human_bytes(b as u64)
}

/// Each graph input read once plus each graph output written once, in bytes. An output that
/// is a view (or a reshape or copy of one) is only as large as the memory behind it: the
/// smallest value along that chain (an `expand` adds no memory), and nothing at all when the
/// chain ends at an input, whose memory the output may share. An output returned twice is
/// written once.
pub fn bytes_min(g: &Graph) -> usize {
    let (read, written) = min_traffic(g);
    read + written
}

/// The bytes of [`bytes_min`] read (the inputs) and written (the outputs).
fn min_traffic(g: &Graph) -> (usize, usize) {
    let bytes = |v: ValueId| {
        let t = &g.node(v).ty;
        numel(&t.shape) * t.dtype.size()
    };
    let written = |mut v: ValueId| {
        let mut least = bytes(v);
        loop {
            let base = g.operands(v).first().copied();
            match (g.node(v).op(), base) {
                (None, _) => return 0,
                (Some(op), Some(b)) if op.keeps_elements() => {
                    v = b;
                    least = least.min(bytes(v));
                }
                _ => return least,
            }
        }
    };
    let mut seen = HashSet::new();
    let read: usize = g.inputs().iter().map(|&v| bytes(v)).sum();
    let outputs = g.outputs().iter().filter(|&&v| seen.insert(v));
    (read, outputs.map(|&v| written(v)).sum::<usize>())
}

/// A fused schedule without steps was computed whole by constant folding: its time is only
/// the copy of the folded outputs into fresh tensors, which the summary should say.
pub(super) fn note_folded(out: &mut String, fused: &Way) {
    if fused.steps.is_empty() {
        let _ = writeln!(
            out,
            "  no fused kernels: constant folding computed every output while compiling; \
             a call only copies them into fresh tensors"
        );
    }
}

pub(super) fn table(out: &mut String, title: &str, w: &Way) {
    let _ = writeln!(out, "{title}: {:.3} ms", w.median_ms());
    let _ = writeln!(
        out,
        "  {:<28} {:>10} {:>11} {:>9} {:>9}  ops",
        "kernel", "ms", "bytes", "GB/s", "GFLOP/s"
    );
    for (i, s) in w.steps.iter().enumerate() {
        let t = w.step_ms(i);
        let _ = writeln!(
            out,
            "  {:<28} {:>10.4} {:>11} {:>9.2} {:>9.2}  {}",
            s.name,
            t,
            human_bytes(s.bytes),
            gbps(s.bytes, t),
            if t > 0.0 {
                s.flops as f64 / (t * 1e6)
            } else {
                f64::NAN
            },
            s.ops.join(" ")
        );
    }
    let _ = writeln!(out);
}

pub(super) fn way_json(w: &Way) -> Value {
    let kernels: Vec<Value> = w
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "name": s.name,
                "ops": s.ops,
                "median_ms": w.step_ms(i),
                "bytes": s.bytes,
                "flops": s.flops,
                "extern": s.is_extern,
            })
        })
        .collect();
    json!({"median_ms": w.median_ms(), "kernels": kernels})
}

/// The model and the inputs given with `--input` (an ONNX model is imported for their
/// shapes).
pub(super) fn load_with_inputs(a: &ProfileArgs) -> Result<(Loaded, Vec<(String, Tensor)>)> {
    let given = read_inputs(&a.inputs)?;
    let loaded = load_model_for(&a.model, a.weights.as_deref(), &given, a.graph.as_deref())?;
    Ok((loaded, given))
}

/// The inputs in graph order: read from files, the model's parameters, random values for the
/// rest when asked (or when no file is given at all).
pub(super) fn gather_inputs(
    g: &Graph,
    a: &ProfileArgs,
    loaded: &Loaded,
    given: Vec<(String, Tensor)>,
) -> Result<Vec<Tensor>> {
    let mut named: HashMap<String, Tensor> = HashMap::new();
    for (name, t) in loaded.named_inputs(g, given)? {
        if !g.inputs().iter().any(|&v| g.node(v).name == name) {
            bail!(Value, "graph {} has no input named '{name}'", g.name);
        }
        if named.insert(name.clone(), t).is_some() {
            bail!(Value, "input {name} is given more than once");
        }
    }
    let random = a.random_inputs || a.inputs.is_empty();
    let high = index_bound(g);
    let mut out = Vec::new();
    for &v in g.inputs() {
        let n = g.node(v);
        match named.remove(n.name.as_str()) {
            Some(t) => out.push(t),
            None if random => out.push(random_tensor(n.ty.dtype, &n.ty.shape, high)?),
            None => bail!(
                Value,
                "missing input {} (give it with --input or use --random-inputs)",
                n.name
            ),
        }
    }
    Ok(out)
}

/// Integer inputs are drawn below the smallest dim of any input (so they are valid indices
/// into any of them) and below 100.
fn index_bound(g: &Graph) -> i64 {
    g.inputs()
        .iter()
        .flat_map(|&v| g.node(v).ty.shape.clone())
        .filter(|&d| d > 0)
        .min()
        .map_or(100, |d| d.min(100) as i64)
}

fn random_tensor(dtype: DType, shape: &[usize], high: i64) -> Result<Tensor> {
    if dtype.is_float() {
        Tensor::randn(shape, Some(dtype))
    } else if dtype.is_bool() {
        let t = Tensor::randint(0, 2, shape, Some(DType::I64))?;
        apply(Op::To { dtype }, &[&t])
    } else {
        Tensor::randint(0, high, shape, Some(dtype))
    }
}

/// `repeat` timed calls of `f` after one warm-up, by its device's clock.
pub(super) fn time_compiled(f: &dyn Executable, inputs: &[Tensor], repeat: usize) -> Result<Way> {
    f.call(inputs)?;
    let mut w = Way {
        steps: f.steps().to_vec(),
        samples: Vec::new(),
        totals: Vec::new(),
    };
    for _ in 0..repeat {
        let (whole, steps) = f.time(inputs)?;
        w.totals.push(whole);
        w.samples.push(steps);
    }
    Ok(w)
}

fn time_eager(g: &Graph, inputs: &[Tensor], repeat: usize) -> Result<Way> {
    let (_, first) = eager_run(g, inputs)?;
    let mut w = Way {
        steps: first.1,
        samples: Vec::new(),
        totals: Vec::new(),
    };
    for _ in 0..repeat {
        let t0 = Instant::now();
        let (out, (times, _)) = eager_run(g, inputs)?;
        drop(out);
        w.totals.push(t0.elapsed());
        w.samples.push(times);
    }
    Ok(w)
}

pub(super) type EagerSteps = (Vec<Duration>, Vec<StepInfo>);

/// Evaluates `g` node by node on the eager kernels, timing every op.
pub(super) fn eager_run(g: &Graph, inputs: &[Tensor]) -> Result<(Vec<Tensor>, EagerSteps)> {
    eager_run_synced(g, inputs, &|| Ok(()))
}

/// [`eager_run`] that calls `sync` after every op (a GPU's work is asynchronous).
pub(super) fn eager_run_synced(
    g: &Graph,
    inputs: &[Tensor],
    sync: &dyn Fn() -> Result<()>,
) -> Result<(Vec<Tensor>, EagerSteps)> {
    let mut vals: HashMap<ValueId, Tensor> = HashMap::new();
    for (&v, t) in g.inputs().iter().zip(inputs) {
        vals.insert(v, t.clone());
    }
    let mut times = Vec::new();
    let mut infos = Vec::new();
    for v in g.topo_order() {
        let node = g.node(v);
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        let args: Vec<Tensor> = g
            .operands(v)
            .iter()
            .map(|o| {
                vals.get(o)
                    .cloned()
                    .ok_or_else(|| Error::Value(format!("graph {}: operand not computed", g.name)))
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = args.iter().collect();
        let t0 = Instant::now();
        let t = apply(op.clone(), &refs)?;
        sync()?;
        times.push(t0.elapsed());
        let bytes = args
            .iter()
            .chain(std::iter::once(&t))
            .map(|x| x.numel() * x.element_size())
            .sum();
        let shapes: Vec<&[usize]> = args.iter().map(|a| a.shape()).collect();
        let flops = op.flops(&shapes, t.shape());
        infos.push(StepInfo {
            name: format!("%{}", node.name),
            ops: vec![op.name().to_string()],
            bytes,
            flops,
            is_extern: false,
        });
        vals.insert(v, t);
    }
    let outs = g
        .outputs()
        .iter()
        .map(|o| {
            vals.get(o)
                .cloned()
                .ok_or_else(|| Error::Value(format!("graph {}: output not computed", g.name)))
        })
        .collect::<Result<_>>()?;
    Ok((outs, (times, infos)))
}

/// Largest absolute difference between two lists of outputs (NaN where both are NaN counts
/// as equal; a NaN on one side only gives NaN).
pub(super) fn max_abs_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    let mut m = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        let (x, y) = without_shared_broadcasts(x, y);
        for (p, q) in x.to_f64_vec().into_iter().zip(y.to_f64_vec()) {
            if p == q || (p.is_nan() && q.is_nan()) {
                continue;
            }
            let d = (p - q).abs();
            m = if d.is_nan() { f64::NAN } else { m.max(d) };
        }
    }
    m
}

/// `x` and `y` narrowed to one element along every dim both broadcast (stride 0): those
/// elements repeat, so comparing one of each is comparing all, without materialising an
/// expanded output (`expand` to 10⁹ elements would otherwise become gigabytes of f64).
fn without_shared_broadcasts(x: &Tensor, y: &Tensor) -> (Tensor, Tensor) {
    let (mut x, mut y) = (x.clone(), y.clone());
    if x.shape() != y.shape() {
        return (x, y);
    }
    for d in 0..x.dim() {
        if x.shape()[d] > 1 && x.strides()[d] == 0 && y.strides()[d] == 0 {
            match (x.narrow(d as i64, 0, 1), y.narrow(d as i64, 0, 1)) {
                (Ok(a), Ok(b)) => (x, y) = (a, b),
                _ => break,
            }
        }
    }
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
