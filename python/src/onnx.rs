//! ONNX models as callables: each call imports the model for its inputs' shapes (cached per
//! shape) and runs the compiled graph with the model's weights.

use crate::errors::{IntoPy, PyResult};
use crate::tensor::RawTensor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use smelt::exec::{CompileOptions, Executable, compile};
use smelt::onnx::{Imported, Model};
use smelt::{Device, Tensor};
use std::cell::RefCell;
use std::collections::HashMap;

/// The model imported and compiled for one set of input shapes.
type Variant = (Imported, Box<dyn Executable>);

/// A loaded ONNX model: call it with the model's inputs, positionally in the model's order
/// or by name; it returns the outputs as a list, in the model's order.
#[pyclass(name = "OnnxModel", module = "smelt._smelt", unsendable)]
pub struct OnnxModel {
    model: Model,
    names: Vec<String>,
    device: Device,
    opts: CompileOptions,
    variants: RefCell<HashMap<Vec<Vec<usize>>, Variant>>,
}

#[pymethods]
impl OnnxModel {
    /// The model's input names, in order (initializers excluded).
    #[getter]
    fn input_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// How many shapes it was compiled for so far.
    #[getter]
    fn compiles(&self) -> usize {
        self.variants.borrow().len()
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        &self,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<RawTensor>> {
        let mut given: Vec<(String, Tensor)> = Vec::new();
        if args.len() > self.names.len() {
            return Err(PyValueError::new_err(format!(
                "the model takes {} inputs ({}), got {}",
                self.names.len(),
                self.names.join(", "),
                args.len()
            )));
        }
        for (name, a) in self.names.iter().zip(args.iter()) {
            given.push((name.clone(), crate::tensor::from_dlpack(&a)?.0));
        }
        if let Some(kw) = kwargs {
            for (k, v) in kw.iter() {
                let k: String = k.extract()?;
                if given.iter().any(|(n, _)| *n == k) {
                    return Err(PyValueError::new_err(format!("input '{k}' given twice")));
                }
                given.push((k, crate::tensor::from_dlpack(&v)?.0));
            }
        }
        let mut key: Vec<(usize, Vec<usize>)> = given
            .iter()
            .map(|(n, t)| {
                let i = self.names.iter().position(|m| m == n).unwrap_or(usize::MAX);
                (i, t.shape().to_vec())
            })
            .collect();
        key.sort();
        let key: Vec<Vec<usize>> = key.into_iter().map(|(_, s)| s).collect();
        let mut variants = self.variants.borrow_mut();
        if !variants.contains_key(&key) {
            let refs: Vec<(&str, &Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let imported = self.model.import_for(&refs).py()?;
            let exe = compile(&imported.graph, self.device, &self.opts).py()?;
            variants.insert(key.clone(), (imported, exe));
        }
        let (imported, exe) = &variants[&key];
        let pairs: Vec<(&str, Tensor)> =
            given.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let inputs = imported.bind(&pairs).py()?;
        Ok(exe
            .call_from_host(&inputs)
            .py()?
            .into_iter()
            .map(RawTensor)
            .collect())
    }
}

/// Loads `path` (external data from beside it) to run on `device`, fused unless `fuse` is
/// false, with `CompileOptions::fast_math` when `fast_math` is true.
#[pyfunction]
#[pyo3(signature = (path, fuse=true, device="cpu", fast_math=false))]
pub fn onnx_load(path: &str, fuse: bool, device: &str, fast_math: bool) -> PyResult<OnnxModel> {
    let model = smelt::onnx::load(path).py()?;
    let names = model.inputs().py()?.into_iter().map(|i| i.name).collect();
    Ok(OnnxModel {
        model,
        names,
        device: device.parse().py()?,
        opts: CompileOptions::default().fused(fuse).fast_math(fast_math),
        variants: RefCell::new(HashMap::new()),
    })
}

/// Runs the `smelt` command line with `args` (without the program name), as the binary
/// would: `cli(["compile", "m.smelt", "--target", "cpu", "--out", "out"])`.
#[pyfunction]
pub fn cli(py: Python<'_>, args: Vec<String>) -> PyResult<()> {
    use clap::Parser;
    let argv = std::iter::once("smelt".to_string()).chain(args);
    let parsed = smelt::cli::Cli::try_parse_from(argv)
        .map_err(|e| PyValueError::new_err(e.render().to_string()))?;
    py.detach(move || smelt::cli::execute(&parsed.command)).py()
}
