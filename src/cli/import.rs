//! `smelt import MODEL.onnx --out DIR [--name NAME]`: an ONNX model as two plain files,
//! `DIR/NAME.smelt` (the graph, its weights as inputs) and `DIR/NAME.safetensors` (the
//! weights under the same names), which `smelt run|profile MODEL.smelt --weights` binds.

use crate::ir::print_graph;
use crate::nn::state_dict::save_safetensors;
use crate::onnx::{self, Dim};
use crate::{Error, Result, bail};
use std::path::PathBuf;

/// Arguments of `smelt import`.
#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The .onnx file.
    pub model: PathBuf,
    /// Directory for the files (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The files' stem and the graph's name (default: the model file's stem).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
}

/// Runs `smelt import`.
pub fn import(a: &ImportArgs) -> Result<()> {
    if !super::model::is_onnx(&a.model) {
        bail!(
            Value,
            "{}: smelt import reads .onnx files",
            a.model.display()
        );
    }
    let model = onnx::load(&a.model)?;
    let named = model
        .inputs()?
        .iter()
        .any(|i| i.dims.iter().any(|d| !matches!(d, Dim::Size(_))));
    // named dims become symbols where the import allows; otherwise they are imported as 1
    let (text, weights) = match named.then(|| model.import_symbolic()) {
        Some(Ok(s)) => {
            let dims: Vec<String> = s
                .symbols
                .iter()
                .map(|(d, n)| format!("{d} as {n}"))
                .collect();
            eprintln!("note: named dims are symbols: {}", dims.join(", "));
            (s.text, s.weights)
        }
        fallback => {
            if let Some(Err(e)) = fallback {
                eprintln!("note: named dims are imported as 1 ({e})");
            }
            let imported = model.import(&[])?;
            (print_graph(&imported.graph), imported.weights)
        }
    };
    let stem = a.name.clone().unwrap_or_else(|| {
        a.model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let name = onnx::graph_name(&stem);
    if name.is_empty() {
        bail!(Value, "'{stem}' gives no usable name; pass --name");
    }
    let text = rename_graph(&text, &name);
    std::fs::create_dir_all(&a.out).map_err(|e| Error::Io(format!("{}: {e}", a.out.display())))?;
    let graph = a.out.join(format!("{name}.smelt"));
    let text = format!(
        "# imported from {} (opset {})\n{}",
        a.model
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
        model.opset(),
        text
    );
    std::fs::write(&graph, text).map_err(|e| Error::Io(format!("{}: {e}", graph.display())))?;
    save_safetensors(a.out.join(format!("{name}.safetensors")), &weights)?;
    Ok(())
}

/// The text of one graph (`graph OLD(...`) with the graph called `name`.
fn rename_graph(text: &str, name: &str) -> String {
    match text.strip_prefix("graph ").and_then(|t| t.split_once('(')) {
        Some((_, rest)) => format!("graph {name}({rest}"),
        None => text.to_string(),
    }
}
