//! Compiled graphs callable from Python: a `.smelt` text (as `torch.compile`'s backend
//! writes it, or a file) compiled by smelt's passes and Cranelift, called on smelt tensors.

use crate::errors::{IntoPy, PyResult};
use crate::tensor::RawTensor;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use smelt::exec::{CompileOptions, SymbolicFn};
use smelt::ir::text::SymbolicModule;
use smelt::{Device, Tensor};

/// A compiled graph: call it with tensors in the graph's input order; it returns the
/// graph's outputs as a list. Symbolic dims bind from each call's inputs.
// an `Executable` stays on the thread that compiled it, and so does this
#[pyclass(name = "Function", module = "smelt._smelt", unsendable)]
pub struct Function {
    f: SymbolicFn,
}

/// Lets a closure that only runs on this very thread carry a `!Send` value across
/// `Python::detach` (which releases the GIL around a closure; it never moves it).
struct SameThread<T>(T);
// SAFETY: `detach` runs the closure on the calling thread, so the value never leaves it.
unsafe impl<T> Send for SameThread<T> {}

#[pymethods]
impl Function {
    #[pyo3(signature = (*args))]
    fn __call__(&self, py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<Vec<RawTensor>> {
        let inputs: Vec<Tensor> = args
            .iter()
            .map(|a| crate::tensor::from_dlpack(&a).map(|t| t.0))
            .collect::<PyResult<_>>()?;
        let f = SameThread(&self.f);
        // the GIL is released while the kernels run: a DLPack deleter on a worker thread
        // may need it
        let out = py.detach(move || {
            let f = f;
            f.0.call(&inputs)
        });
        Ok(out.py()?.into_iter().map(RawTensor).collect())
    }

    /// How many variants were compiled so far (one per binding of the symbols).
    #[getter]
    fn compiles(&self) -> usize {
        self.f.compiles()
    }

    /// The graph's text, with its symbols.
    fn text(&self) -> PyResult<String> {
        self.f.module().print(None).py()
    }
}

/// Compiles `text` (a `.smelt` module; `graph` picks the entry, the first by default) for
/// `device` (`"cpu"` or `"cuda"`), fused unless `fuse` is false, with the approximations
/// of `CompileOptions::fast_math` when `fast_math` is true.
#[pyfunction]
#[pyo3(signature = (text, graph=None, fuse=true, device="cpu", file="<python>", fast_math=false))]
pub fn compile(
    text: &str,
    graph: Option<&str>,
    fuse: bool,
    device: &str,
    file: &str,
    fast_math: bool,
) -> PyResult<Function> {
    let module = SymbolicModule::parse(text, file).py()?;
    let device: Device = device.parse().py()?;
    let opts = CompileOptions::default().fused(fuse).fast_math(fast_math);
    let f = SymbolicFn::new(module, graph, device, &opts).py()?;
    Ok(Function { f })
}
