//! `smelt grad`: gradients of the sum of every element of every output of a graph with
//! respect to chosen inputs, written as `DIR/grad_<input>.npy`.

use super::model::{load_model_for, read_inputs};
use super::{Backend, evaluate, parse_input, pick};
use crate::runtime::npy;
use crate::{Error, Result, bail};
use std::path::PathBuf;

/// Arguments of `smelt grad`.
#[derive(clap::Args, Debug)]
pub struct GradArgs {
    /// The .smelt or .onnx file.
    pub model: PathBuf,
    /// The inputs to differentiate with respect to, comma-separated (`--wrt x,w`).
    #[arg(long, value_name = "NAMES", value_delimiter = ',', required = true)]
    pub wrt: Vec<String>,
    /// A graph input: NAME=FILE.npy (once per input).
    #[arg(long = "input", value_name = "NAME=FILE", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Directory for the gradients (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Where the gradient graph runs.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Compile every op as its own kernel (no effect on the interpreter).
    #[arg(long)]
    pub no_fuse: bool,
    /// The graph to differentiate (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// Parameters of a .smelt graph, bound by name from a safetensors file.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
}

/// Runs `smelt grad`.
pub fn grad(a: &GradArgs) -> Result<()> {
    let given = read_inputs(&a.inputs)?;
    let loaded = load_model_for(&a.model, a.weights.as_deref(), &given, a.graph.as_deref())?;
    let g = pick(&loaded.module, a.graph.as_deref())?;
    let wrt: Vec<&str> = a
        .wrt
        .iter()
        .map(|s| s.trim().trim_start_matches('%'))
        .collect();
    for (i, w) in wrt.iter().enumerate() {
        if w.is_empty() {
            bail!(Value, "--wrt: empty input name");
        }
        if wrt[..i].contains(w) {
            bail!(Value, "--wrt: input {w} is named twice");
        }
    }
    let grad_graph = crate::passes::autodiff::autodiff(g, &wrt)?;
    let inputs = loaded.named_inputs(g, given)?;
    let outputs = evaluate(&grad_graph, &inputs, a.backend, a.no_fuse)?;
    std::fs::create_dir_all(&a.out).map_err(|e| Error::Io(format!("{}: {e}", a.out.display())))?;
    let first = g.outputs().len();
    for (name, t) in wrt.iter().zip(&outputs[first..]) {
        npy::write_npy(a.out.join(format!("grad_{name}.npy")), t)?;
    }
    Ok(())
}
