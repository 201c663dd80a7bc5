//! What every command reads: a `.smelt` file (with its parameters from `--weights`) or an
//! `.onnx` file (imported for the shapes of the inputs given, its initializers as
//! parameters).

use crate::ir::SymbolicModule;
use crate::ir::graph::{Graph, Module};
use crate::runtime::npy;
use crate::{DType, Error, Result, Tensor, bail, onnx};
use std::path::{Path, PathBuf};

/// A model ready to run: its graphs, the parameters to bind, and how the names users give
/// map to graph input names.
pub struct Loaded {
    /// The graphs (an ONNX model gives one).
    pub module: Module,
    /// Parameters bound by name, after the inputs users give.
    pub weights: Vec<(String, Tensor)>,
    /// (name users give, graph input name) where they differ (ONNX names with characters
    /// the text format cannot spell).
    renames: Vec<(String, String)>,
    /// The ONNX element type of each output (empty for a `.smelt` file).
    pub(crate) output_types: Vec<i32>,
}

/// Whether `path` names an ONNX file.
pub fn is_onnx(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Reads a model. For ONNX, `inputs` give the shapes the graph is imported for (named dims
/// left unbound are 1); `weights` is a safetensors file of parameters (`.smelt` only).
pub fn load_model(
    path: &Path,
    weights: Option<&Path>,
    inputs: &[(String, Tensor)],
) -> Result<Loaded> {
    load_model_for(path, weights, inputs, None)
}

/// [`load_model`] for graph `graph` of the file (the first when `None`): a `.smelt` graph
/// with symbolic dims is read at the sizes its inputs and weights give.
pub fn load_model_for(
    path: &Path,
    weights: Option<&Path>,
    inputs: &[(String, Tensor)],
    graph: Option<&str>,
) -> Result<Loaded> {
    if is_onnx(path) {
        if weights.is_some() {
            bail!(
                Value,
                "--weights is for .smelt files; an ONNX model carries its own weights"
            );
        }
        let model = onnx::load(path)?;
        let declared = model.inputs()?;
        let converted: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| {
                let dtype = declared.iter().find(|i| i.name == *n).map(|i| i.dtype);
                Ok((n.as_str(), as_declared(t.clone(), dtype)?))
            })
            .collect::<Result<_>>()?;
        let given: Vec<(&str, &Tensor)> = converted.iter().map(|(n, t)| (*n, t)).collect();
        let imported = model.import_for(&given)?;
        let renames = imported
            .inputs
            .iter()
            .filter(|(o, g)| o != g)
            .cloned()
            .collect();
        return Ok(Loaded {
            module: Module {
                graphs: vec![imported.graph],
            },
            weights: imported.weights,
            renames,
            output_types: model.output_elem_types(),
        });
    }
    let symbolic = parse_smelt(path)?;
    let weights = match weights {
        Some(w) => crate::nn::state_dict::load_safetensors(w)?,
        None => Vec::new(),
    };
    let module = if symbolic.is_symbolic() {
        let shapes: Vec<(&str, &[usize])> = inputs
            .iter()
            .chain(&weights)
            .map(|(n, t)| (n.as_str(), t.shape()))
            .collect();
        symbolic.instantiate(&symbolic.bind(graph, &shapes)?)?
    } else {
        symbolic.into_sample()
    };
    Ok(Loaded {
        module,
        weights,
        renames: Vec::new(),
        output_types: Vec::new(),
    })
}

/// A `.smelt` file, verified for every size of its symbols if it has any; `None` for an
/// ONNX file.
pub fn read_smelt(path: &Path) -> Result<Option<SymbolicModule>> {
    match is_onnx(path) {
        true => Ok(None),
        false => parse_smelt(path).map(Some),
    }
}

fn parse_smelt(path: &Path) -> Result<SymbolicModule> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{name}: {e}")))?;
    SymbolicModule::parse(&text, &name)
}

impl Loaded {
    /// The graph input name for a name a user gave.
    pub fn graph_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.renames
            .iter()
            .find(|(o, _)| o == name)
            .map_or(name, |(_, g)| g.as_str())
    }

    /// The named inputs of `g`: those given (by the names users know), then every parameter
    /// of `g` not given.
    pub fn named_inputs(
        &self,
        g: &Graph,
        given: Vec<(String, Tensor)>,
    ) -> Result<Vec<(String, Tensor)>> {
        let mut out: Vec<(String, Tensor)> = Vec::new();
        for (n, t) in given {
            let name = self.graph_name(&n).to_string();
            let declared = g
                .inputs()
                .iter()
                .map(|&v| g.node(v))
                .find(|node| node.name == name)
                .map(|node| node.ty.dtype);
            out.push((name, as_declared(t, declared)?));
        }
        for (name, t) in &self.weights {
            if out.iter().any(|(n, _)| n == name) {
                continue;
            }
            if !g.inputs().iter().any(|&v| g.node(v).name == *name) {
                bail!(
                    Value,
                    "the weights hold '{name}', which is no input of graph {}",
                    g.name
                );
            }
            out.push((name.clone(), t.clone()));
        }
        Ok(out)
    }
}

/// `t` for an input declared as `dtype`: `.npy` has no bf16, so a bf16 input arrives as f32
/// (what `smelt run` writes for bf16 outputs) and is converted; anything else is unchanged.
fn as_declared(t: Tensor, dtype: Option<DType>) -> Result<Tensor> {
    if dtype == Some(DType::BF16) && t.dtype() == DType::F32 {
        t.to_dtype(DType::BF16)
    } else {
        Ok(t)
    }
}

/// Reads every `NAME=FILE.npy` input.
pub fn read_inputs(inputs: &[(String, PathBuf)]) -> Result<Vec<(String, Tensor)>> {
    inputs
        .iter()
        .map(|(name, file)| Ok((name.clone(), npy::read_npy(file)?)))
        .collect()
}
