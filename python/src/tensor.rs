//! The native tensor handle and the one generic entry to smelt's ops: `op(name, operands,
//! attrs)` builds the op from its `.smelt` name exactly as the text parser does, so every
//! op is defined once, in the Rust op table, and the Python surface only names them.

use crate::dlpack;
use crate::errors::{IntoPy, PyResult};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use smelt::ir::attrs::Attr;
use smelt::ir::op::Op;
use smelt::{DType, Device, Scalar, Tensor};

/// A smelt tensor as Python holds it (the `smelt.Tensor` class wraps one).
#[pyclass(name = "RawTensor", module = "smelt._smelt", frozen)]
pub struct RawTensor(pub Tensor);

/// A dtype from its `.smelt` name (`"f32"`).
pub fn dtype_of(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| PyTypeError::new_err(format!("unknown dtype '{name}'")))
}

/// NumPy's type string for a dtype (`__array_interface__`).
fn typestr(d: DType) -> PyResult<&'static str> {
    Ok(match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::BF16 => {
            return Err(PyTypeError::new_err(
                "NumPy has no bfloat16: convert with .to(\"f32\") first",
            ));
        }
    })
}

#[pymethods]
impl RawTensor {
    /// The sizes.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.0.shape().to_vec()
    }
    /// The strides, in elements.
    #[getter]
    fn strides(&self) -> Vec<usize> {
        self.0.strides().to_vec()
    }
    /// The `.smelt` name of the dtype (`"f32"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.0.dtype().name()
    }
    /// `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        self.0.device().to_string()
    }
    /// The offset of the first element in its storage, in elements.
    #[getter]
    fn storage_offset(&self) -> usize {
        self.0.storage_offset()
    }
    /// The address of the first element.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.0.data_ptr()
    }
    /// Whether the elements are laid out row-major without gaps.
    fn is_contiguous(&self) -> bool {
        self.0.is_contiguous()
    }
    /// Whether the two share memory (views of one storage).
    fn shares_storage(&self, other: &RawTensor) -> bool {
        self.0.shares_storage(&other.0)
    }
    /// The elements in row-major order, as Python numbers.
    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let t = self.0.cpu().py()?;
        match t.dtype() {
            DType::Bool => PyList::new(py, t.to_i64_vec().into_iter().map(|v| v != 0)),
            d if d.is_float() => PyList::new(py, t.try_to_f64_vec().py()?),
            _ => PyList::new(py, t.to_i64_vec()),
        }
    }
    /// PyTorch's printout of the tensor.
    fn __repr__(&self) -> String {
        self.0.to_string()
    }

    /// DLPack export (the consumer's `from_dlpack` calls this): a capsule over the same
    /// memory, or over a copy when `copy` is true.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version);
        if let Some((kind, _)) = dl_device
            && kind != dlpack::KDL_CPU
        {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "__dlpack__: smelt exports to the host only, not to DLPack device type {kind}"
            )));
        }
        match copy {
            Some(true) => dlpack::to_capsule(py, &copy_of(&self.0)?),
            _ => dlpack::to_capsule(py, &self.0),
        }
    }
    /// `(device type, device id)`: DLPack's host.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        match self.0.device() {
            Device::Cpu => Ok((dlpack::KDL_CPU, 0)),
            d => Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "__dlpack_device__: smelt exports host tensors only, this one is on {d}"
            ))),
        }
    }
    /// NumPy's array interface: `numpy.asarray(t)` views the same memory.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.0.device() != Device::Cpu {
            return Err(PyTypeError::new_err(format!(
                "can't convert a tensor on {} to numpy: copy it to the host first",
                self.0.device()
            )));
        }
        let size = self.0.element_size();
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, self.0.shape())?)?;
        d.set_item("typestr", typestr(self.0.dtype())?)?;
        d.set_item("data", (self.0.data_ptr(), false))?;
        let strides: Vec<usize> = self.0.strides().iter().map(|s| s * size).collect();
        d.set_item("strides", PyTuple::new(py, strides)?)?;
        Ok(d)
    }
}

/// One operand of `op`: a tensor, a Python number (a wrapped scalar), or `None` (an
/// optional operand left out).
fn operand(obj: &Bound<'_, PyAny>) -> PyResult<Option<Tensor>> {
    if obj.is_none() {
        return Ok(None);
    }
    if let Ok(t) = obj.cast::<RawTensor>() {
        return Ok(Some(t.get().0.clone()));
    }
    match scalar(obj)? {
        Some(s) => Ok(Some(Tensor::wrapped(s))),
        None => Err(PyTypeError::new_err(format!(
            "expected a tensor, a number or None as an operand, got {}",
            obj.get_type().name()?
        ))),
    }
}

/// A Python bool, int or float as a smelt scalar (`None` for anything else).
fn scalar(obj: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    // bool first: a Python bool is also an int
    Ok(if obj.is_instance_of::<PyBool>() {
        Some(Scalar::Bool(obj.extract()?))
    } else if obj.is_instance_of::<PyInt>() {
        Some(Scalar::Int(obj.extract().map_err(|_| {
            PyValueError::new_err(format!("the integer {obj} does not fit in 64 bits"))
        })?))
    } else if obj.is_instance_of::<PyFloat>() {
        Some(Scalar::Float(obj.extract()?))
    } else {
        None
    })
}

/// An attribute value: numbers, booleans, strings, lists, None; a string under `dtype`
/// names a dtype.
fn attr(key: &str, v: &Bound<'_, PyAny>) -> PyResult<Attr> {
    if v.is_none() {
        return Ok(Attr::None);
    }
    if let Some(s) = scalar(v)? {
        return Ok(match s {
            Scalar::Bool(b) => Attr::Bool(b),
            Scalar::Int(i) => Attr::Int(i),
            Scalar::Float(f) => Attr::Float(f),
        });
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_str()?;
        return Ok(match key {
            "dtype" => Attr::DType(dtype_of(s)?),
            _ => Attr::Str(s.to_string()),
        });
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items = v
            .try_iter()?
            .map(|x| attr(key, &x?))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(Attr::List(items));
    }
    Err(PyTypeError::new_err(format!(
        "attribute '{key}': expected a number, bool, string, list or None, got {}",
        v.get_type().name()?
    )))
}

/// Runs op `name` (its `.smelt` name) eagerly on `operands` with `attrs`.
#[pyfunction]
#[pyo3(signature = (name, operands, attrs=None))]
pub fn op(
    py: Python<'_>,
    name: &str,
    operands: &Bound<'_, PyAny>,
    attrs: Option<&Bound<'_, PyDict>>,
) -> PyResult<RawTensor> {
    let mut slots = Vec::new();
    let mut inputs = Vec::new();
    for o in operands.try_iter()? {
        let t = operand(&o?)?;
        slots.push(t.is_some());
        inputs.extend(t);
    }
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for (k, v) in attrs.iter().flat_map(|d| d.iter()) {
        let k: String = k.extract()?;
        values.push(attr(&k, &v)?);
        keys.push(k);
    }
    let named: Vec<(&str, Attr)> = keys.iter().map(String::as_str).zip(values).collect();
    let op = Op::from_call(name, &slots, &named).py()?;
    // the kernels may use the thread pool: let other Python threads run meanwhile
    let out = py.detach(move || {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        smelt::runtime::apply(op, &refs)
    });
    Ok(RawTensor(out.py()?))
}

/// A tensor of `shape` from Python numbers in row-major order, as `dtype` (`None`: i64 for
/// integers only, bool for booleans only, else f32, as `torch.tensor` infers).
#[pyfunction]
#[pyo3(signature = (values, shape, dtype=None))]
pub fn from_values(
    values: &Bound<'_, PyList>,
    shape: Vec<usize>,
    dtype: Option<&str>,
) -> PyResult<RawTensor> {
    let scalars = values
        .iter()
        .map(|v| {
            scalar(&v)?.ok_or_else(|| {
                let kind = v
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                PyTypeError::new_err(format!("expected numbers, got {kind}"))
            })
        })
        .collect::<PyResult<Vec<Scalar>>>()?;
    let all_bool = !scalars.is_empty() && scalars.iter().all(|s| matches!(s, Scalar::Bool(_)));
    let all_int = scalars.iter().all(|s| !matches!(s, Scalar::Float(_)));
    let target = match dtype {
        Some(d) => dtype_of(d)?,
        None if all_bool => DType::Bool,
        None if all_int && !scalars.is_empty() => DType::I64,
        None => DType::F32,
    };
    // integers stay exact through i64; anything with a float goes through f64
    let t = if all_int {
        let ints = scalars.iter().map(|s| match *s {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(f) => f as i64,
        });
        Tensor::from_vec(ints.collect(), &shape)
    } else {
        let floats = scalars.iter().map(|s| match *s {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        });
        Tensor::from_vec(floats.collect::<Vec<f64>>(), &shape)
    };
    Ok(RawTensor(t.and_then(|t| t.to_dtype(target)).py()?))
}

/// `torch.rand`/`torch.randn` (`normal`) of `shape`, from smelt's seeded generator.
#[pyfunction]
#[pyo3(signature = (shape, dtype="f32", normal=false))]
pub fn random(shape: Vec<usize>, dtype: &str, normal: bool) -> PyResult<RawTensor> {
    let d = Some(dtype_of(dtype)?);
    let t = match normal {
        true => Tensor::randn(&shape, d),
        false => Tensor::rand(&shape, d),
    };
    Ok(RawTensor(t.py()?))
}

/// A dense copy sharing no memory with `t` (`torch.clone`).
fn copy_of(t: &Tensor) -> PyResult<Tensor> {
    let out = t.empty_like();
    out.copy_(t).py()?;
    Ok(out)
}

/// `torch.clone`: a contiguous copy of `t`.
#[pyfunction]
pub fn clone(t: &RawTensor) -> PyResult<RawTensor> {
    Ok(RawTensor(copy_of(&t.0)?))
}

/// `torch.manual_seed`.
#[pyfunction]
pub fn manual_seed(seed: u64) {
    smelt::manual_seed(seed);
}

/// A copy on `device` (`"cpu"`, `"cuda"`, `"cuda:N"`).
#[pyfunction]
pub fn to_device(t: &RawTensor, device: &str) -> PyResult<RawTensor> {
    let d: Device = device.parse().py()?;
    Ok(RawTensor(t.0.to_device(d).py()?))
}

/// A smelt tensor over the memory of any DLPack producer, without a copy.
#[pyfunction]
pub fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<RawTensor> {
    if let Ok(t) = obj.cast::<RawTensor>() {
        return Ok(RawTensor(t.get().0.clone()));
    }
    Ok(RawTensor(dlpack::from_dlpack(obj)?))
}
