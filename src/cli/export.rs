//! `smelt export MODEL.smelt [--weights W.safetensors] --onnx OUT.onnx [--opset N]`: a graph
//! as an ONNX model (its parameters, from `--weights`, as initializers).

use super::model::load_model;
use super::pick;
use crate::onnx;
use crate::{Error, Result};
use prost::Message;
use std::path::PathBuf;

/// Arguments of `smelt export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The .smelt file (or .onnx, to write it again from smelt's graph).
    pub model: PathBuf,
    /// Parameters bound by name from a safetensors file; they become initializers.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// The ONNX file to write.
    #[arg(long, value_name = "FILE")]
    pub onnx: PathBuf,
    /// The opset of the standard ops to write.
    #[arg(long, default_value_t = 17, value_name = "N")]
    pub opset: i64,
    /// The graph to export (default: the first one in the file).
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
}

/// Runs `smelt export`.
pub fn export(a: &ExportArgs) -> Result<()> {
    let loaded = load_model(&a.model, a.weights.as_deref(), &[])?;
    let g = pick(&loaded.module, a.graph.as_deref())?;
    let model = onnx::export(g, &loaded.weights, a.opset)?;
    std::fs::write(&a.onnx, model.encode_to_vec())
        .map_err(|e| Error::Io(format!("{}: {e}", a.onnx.display())))
}
