//! An ONNX model imported once for every size of its named dims (`dim_param`): each becomes
//! a symbol of a `.smelt` version-3 graph.
//!
//! The importer folds shapes into attributes as it goes, so it is run at three sample sizes
//! of the symbols and the three printed graphs are merged: a size that differs between them
//! is written as the expression of the symbols that gives it at all three (`B*S`, `S-1`).
//! What the import computes from the sizes in any other way (a mask folded into a weight, a
//! float) makes the graphs differ elsewhere, and the import is refused with the reason.

use super::{Dim, Model, same_elements};
use crate::ir::print_graph;
use crate::ir::sym::{Bindings, is_symbol_name, on_some_ladder, sample_point};
use crate::ir::text::SymbolicModule;
use crate::{DType, Error, Result, Tensor, bail};

/// A model imported with its named dims as symbols.
#[derive(Debug)]
pub struct SymbolicImport {
    /// The graph, verified for every size of its symbols.
    pub module: SymbolicModule,
    /// Its `.smelt` text.
    pub text: String,
    /// The parameters: the graph input's name and its value (the same at every size).
    pub weights: Vec<(String, Tensor)>,
    /// For each model input: its ONNX name and the name of its graph input.
    pub inputs: Vec<(String, String)>,
    /// The ONNX names of the outputs, in order.
    pub outputs: Vec<String>,
    /// Each named dim (or `?input:axis` for a dim without a name) and its symbol.
    pub symbols: Vec<(String, String)>,
}

impl Model {
    /// The graph for every size of the inputs' named dims, each a symbol. An error when the
    /// model has none, or when the import depends on the sizes in a way a symbol cannot
    /// express (`Model::import_for` then imports for fixed sizes).
    pub fn import_symbolic(&self) -> Result<SymbolicImport> {
        let inputs = self.inputs()?;
        let mut symbols: Vec<(String, String)> = Vec::new();
        for input in &inputs {
            for (axis, d) in input.dims.iter().enumerate() {
                let key = match d {
                    Dim::Named(p) => p.clone(),
                    Dim::Unknown => format!("?{}:{axis}", input.name),
                    Dim::Size(_) => continue,
                };
                if !symbols.iter().any(|(k, _)| *k == key) {
                    let taken: Vec<&str> = symbols.iter().map(|(_, s)| s.as_str()).collect();
                    let name = symbol_for(&key, &taken);
                    symbols.push((key, name));
                }
            }
        }
        if symbols.is_empty() {
            bail!(Value, "the model's inputs have no named dims");
        }
        let names: Vec<String> = symbols.iter().map(|(_, s)| s.clone()).collect();
        on_some_ladder(|ladder| self.import_at_samples(&inputs, &symbols, &names, ladder))
    }

    fn import_at_samples(
        &self,
        inputs: &[super::Input],
        symbols: &[(String, String)],
        names: &[String],
        ladder: usize,
    ) -> Result<SymbolicImport> {
        let points: Vec<Bindings> = (0..3).map(|p| sample_point(names, ladder, p)).collect();
        let mut texts = Vec::new();
        let mut first: Option<super::Imported> = None;
        for point in &points {
            let shapes: Vec<(String, Vec<usize>)> = inputs
                .iter()
                .map(|input| {
                    let dims = input.dims.iter().enumerate().map(|(axis, d)| {
                        let key = match d {
                            Dim::Size(n) => return *n,
                            Dim::Named(p) => p.clone(),
                            Dim::Unknown => format!("?{}:{axis}", input.name),
                        };
                        symbols
                            .iter()
                            .find(|(k, _)| *k == key)
                            .map_or(1, |(_, s)| point[s] as usize)
                    });
                    (input.name.clone(), dims.collect())
                })
                .collect();
            let given: Vec<(&str, &[usize])> = shapes
                .iter()
                .map(|(n, s)| (n.as_str(), s.as_slice()))
                .collect();
            let imported = self.import_with(&given, Default::default(), true)?;
            if let Some((name, _)) = imported.specialized.first() {
                bail!(
                    Value,
                    "the import needs the value of input '{name}', not only its shape"
                );
            }
            texts.push(print_graph(&imported.graph));
            match &first {
                None => first = Some(imported),
                Some(f) => check_same_weights(&f.weights, &imported.weights)?,
            }
        }
        let first = first.ok_or_else(|| Error::Value("no sample sizes".into()))?;
        let module = SymbolicModule::from_samples(&texts, names, &points, &first.graph.name)?;
        Ok(SymbolicImport {
            text: module.print(None)?,
            module,
            weights: first.weights,
            inputs: first.inputs,
            outputs: first.outputs,
            symbols: symbols.to_vec(),
        })
    }
}

/// Weights folded at import must not depend on the sizes.
fn check_same_weights(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<()> {
    if a.len() != b.len() {
        bail!(
            Value,
            "the import folds a different number of tensors at different sizes"
        );
    }
    for ((n, x), (m, y)) in a.iter().zip(b) {
        if n != m || !same_elements(x, y) {
            bail!(
                Value,
                "the import folds '{n}' from the sizes of the inputs (it differs between sizes)"
            );
        }
    }
    Ok(())
}

/// A symbol name for a named dim: its characters that a symbol may hold, starting with a
/// letter, not a word the text format reserves, and not one of `taken`.
fn symbol_for(dim: &str, taken: &[&str]) -> String {
    let mut s: String = dim
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s.insert(0, 'd');
    }
    let reserved = |w: &str| {
        matches!(w, "true" | "false" | "none" | "inf" | "nan") || DType::from_name(w).is_some()
    };
    let base = s.clone();
    let mut k = 1;
    while reserved(&s) || taken.contains(&s.as_str()) || !is_symbol_name(&s) {
        s = format!("{base}_{k}");
        k += 1;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::symbol_for;

    #[test]
    fn named_dims_become_valid_distinct_symbols() {
        assert_eq!(symbol_for("batch_size", &[]), "batch_size");
        assert_eq!(symbol_for("2B", &[]), "d2B");
        assert_eq!(symbol_for("?x:0", &[]), "d_x_0");
        assert_eq!(symbol_for("seq-len", &["seq_len"]), "seq_len_1");
        assert_eq!(symbol_for("f32", &[]), "f32_1");
    }
}
