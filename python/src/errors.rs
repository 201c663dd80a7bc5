//! smelt's errors as Python exceptions, chosen by kind as PyTorch users expect them.

use pyo3::PyErr;
use pyo3::exceptions::{
    PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use smelt::Error;

/// The Python exception for a smelt error, with smelt's message.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Shape(_) | Error::Value(_) | Error::Parse { .. } => PyValueError::new_err(msg),
        Error::DType(_) => PyTypeError::new_err(msg),
        Error::Index(_) => PyIndexError::new_err(msg),
        Error::OutOfMemory(_) => PyMemoryError::new_err(msg),
        Error::Io(_) => PyOSError::new_err(msg),
        Error::Device(_) | Error::Unsupported(_) | Error::Distributed(_) => {
            PyRuntimeError::new_err(msg)
        }
    }
}

/// `Result` whose error is already a Python exception.
pub type PyResult<T> = Result<T, PyErr>;

/// Turns a smelt result into a Python one.
pub trait IntoPy<T> {
    /// The value, or the error as a Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for smelt::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
