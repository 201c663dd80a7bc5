//! `smelt._smelt`, the native half of the `smelt` Python package: tensor handles, DLPack,
//! the generic op entry and compiled functions. The Python half (`python/smelt/`) gives
//! them PyTorch's surface.

mod dlpack;
mod errors;
mod function;
mod onnx;
mod profile;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _smelt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::RawTensor>()?;
    m.add_class::<function::Function>()?;
    m.add_function(wrap_pyfunction!(tensor::op, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::from_values, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::random, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::clone, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::to_device, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(function::compile, m)?)?;
    m.add_class::<onnx::OnnxModel>()?;
    m.add_function(wrap_pyfunction!(onnx::onnx_load, m)?)?;
    m.add_function(wrap_pyfunction!(onnx::cli, m)?)?;
    m.add_class::<profile::Session>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
