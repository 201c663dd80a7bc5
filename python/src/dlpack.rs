//! DLPack both ways, without copies: smelt tensors lent to PyTorch, NumPy or JAX as
//! `dltensor` capsules, and their tensors taken in as smelt tensors over the same memory.
//!
//! The structs are DLPack's C ABI (`dlpack.h`, the unversioned `DLManagedTensor` every
//! consumer accepts). Lifetimes: an exported tensor keeps a clone of the smelt tensor in
//! its manager context until the consumer calls the deleter; an imported one keeps the
//! producer's `DLManagedTensor` until the last smelt tensor over it is dropped.

use crate::errors::{IntoPy, PyResult};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use smelt::layout::Layout;
use smelt::{DType, Device, Tensor};
use std::ffi::{CStr, c_void};

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's device type for host memory.
pub const KDL_CPU: i32 = 1;
const KDL_CUDA_HOST: i32 = 3;

const CAPSULE: &CStr = c"dltensor";
const USED: &CStr = c"used_dltensor";

// DLPack's type codes
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;
const KDL_BOOL: u8 = 6;

fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::Bool => (KDL_BOOL, 8),
        DType::U8 => (KDL_UINT, 8),
        DType::I8 => (KDL_INT, 8),
        DType::I16 => (KDL_INT, 16),
        DType::I32 => (KDL_INT, 32),
        DType::I64 => (KDL_INT, 64),
        DType::F16 => (KDL_FLOAT, 16),
        DType::BF16 => (KDL_BFLOAT, 16),
        DType::F32 => (KDL_FLOAT, 32),
        DType::F64 => (KDL_FLOAT, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

fn smelt_dtype(t: DLDataType) -> PyResult<DType> {
    let d = match (t.code, t.bits, t.lanes) {
        (KDL_BOOL, 8, 1) => DType::Bool,
        (KDL_UINT, 8, 1) => DType::U8,
        (KDL_INT, 8, 1) => DType::I8,
        (KDL_INT, 16, 1) => DType::I16,
        (KDL_INT, 32, 1) => DType::I32,
        (KDL_INT, 64, 1) => DType::I64,
        (KDL_FLOAT, 16, 1) => DType::F16,
        (KDL_BFLOAT, 16, 1) => DType::BF16,
        (KDL_FLOAT, 32, 1) => DType::F32,
        (KDL_FLOAT, 64, 1) => DType::F64,
        (code, bits, lanes) => {
            return Err(PyTypeError::new_err(format!(
                "smelt has no dtype for DLPack type code {code} with {bits} bits and {lanes} lanes"
            )));
        }
    };
    Ok(d)
}

/// What an exported capsule owns: the DLPack header (first, so that a pointer to it is a
/// pointer to the whole), the shape and strides it points into, and the tensor.
#[repr(C)]
struct Export {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _tensor: Tensor,
}

unsafe extern "C" fn delete_export(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of an `Export` boxed in `to_capsule`, handed to
        // the consumer once; DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(m as *mut Export) });
    }
}

unsafe extern "C" fn drop_capsule(capsule: *mut ffi::PyObject) {
    // A consumer renames the capsule when it takes the tensor; one still named `dltensor`
    // was never consumed, and its tensor is released here.
    // SAFETY: called by Python with the capsule being destroyed.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()) as *mut DLManagedTensor;
            delete_export(m);
        }
    }
}

/// `t` as a `dltensor` capsule (host tensors only).
pub fn to_capsule(py: Python<'_>, t: &Tensor) -> PyResult<Py<PyAny>> {
    if t.device() != Device::Cpu {
        return Err(PyBufferError::new_err(format!(
            "__dlpack__: only host tensors can be exported, this one is on {}",
            t.device()
        )));
    }
    let shape: Vec<i64> = t.shape().iter().map(|&n| n as i64).collect();
    let strides: Vec<i64> = t.strides().iter().map(|&s| s as i64).collect();
    let mut e = Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: t.data_ptr() as *mut c_void,
                device: DLDevice {
                    device_type: KDL_CPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: dl_dtype(t.dtype()),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
        },
        shape,
        strides,
        _tensor: t.clone(),
    });
    e.managed.dl_tensor.shape = e.shape.as_mut_ptr();
    e.managed.dl_tensor.strides = e.strides.as_mut_ptr();
    let raw = Box::into_raw(e);
    // SAFETY: `raw` is a live `Export` whose first field is the `DLManagedTensor`.
    unsafe {
        (*raw).managed.manager_ctx = raw as *mut c_void;
        let cap = ffi::PyCapsule_New(raw as *mut c_void, CAPSULE.as_ptr(), Some(drop_capsule));
        if cap.is_null() {
            delete_export(raw as *mut DLManagedTensor);
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, cap).unbind())
    }
}

/// The producer's tensor, released through its deleter when smelt no longer uses it.
struct Imported(*mut DLManagedTensor);

// SAFETY: DLPack lets the deleter be called from any thread; the pointer is only used there.
unsafe impl Send for Imported {}
// SAFETY: nothing reads through the pointer but `drop`.
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the producer's tensor, taken from its capsule once; its deleter frees it.
        unsafe {
            if let Some(d) = (*self.0).deleter {
                d(self.0);
            }
        }
    }
}

/// A smelt tensor over the memory of any DLPack producer (`__dlpack__`), without a copy.
pub fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let py = obj.py();
    if obj.hasattr("__dlpack_device__")? {
        let (kind, _id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
        if kind != KDL_CPU && kind != KDL_CUDA_HOST {
            return Err(PyRuntimeError::new_err(format!(
                "from_dlpack: smelt takes host tensors only, this one is on DLPack device type {kind}"
            )));
        }
    }
    if !obj.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "from_dlpack: a {} has no __dlpack__",
            obj.get_type().name()?
        )));
    }
    let cap = obj.call_method0("__dlpack__")?;
    // SAFETY: CPython's capsule API on a live object; the name check guards the cast.
    let m = unsafe {
        let c = cap.as_ptr();
        if ffi::PyCapsule_IsValid(c, CAPSULE.as_ptr()) != 1 {
            return Err(PyValueError::new_err(
                "from_dlpack: __dlpack__ gave no unused 'dltensor' capsule",
            ));
        }
        let m = ffi::PyCapsule_GetPointer(c, CAPSULE.as_ptr()) as *mut DLManagedTensor;
        if m.is_null() || ffi::PyCapsule_SetName(c, USED.as_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        m
    };
    // From here on the tensor is ours: `keep` gives it back on every path.
    let keep = Imported(m);
    // SAFETY: a valid DLTensor, as DLPack promises, owned by `keep`.
    let (data, layout, dtype) = unsafe {
        let t = &(*m).dl_tensor;
        let dtype = smelt_dtype(t.dtype)?;
        let nd = usize::try_from(t.ndim)
            .map_err(|_| PyValueError::new_err(format!("from_dlpack: ndim {}", t.ndim)))?;
        let shape: &[i64] = match nd {
            0 => &[],
            _ if t.shape.is_null() => {
                return Err(PyValueError::new_err(format!(
                    "from_dlpack: a tensor of {nd} dims without a shape"
                )));
            }
            _ => std::slice::from_raw_parts(t.shape, nd),
        };
        let shape: Vec<usize> = shape
            .iter()
            .map(|&n| usize::try_from(n))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                PyValueError::new_err(format!("from_dlpack: negative size in {shape:?}"))
            })?;
        let strides = if t.strides.is_null() || nd == 0 {
            smelt::ir::shape::contiguous_strides(&shape)
        } else {
            let s = std::slice::from_raw_parts(t.strides, nd);
            s.iter()
                .zip(&shape)
                // a dim of size 0 or 1 never steps, whatever its stride says
                .map(|(&st, &n)| if n <= 1 { Ok(0) } else { usize::try_from(st) })
                .collect::<Result<_, _>>()
                .map_err(|_| {
                    PyValueError::new_err(format!(
                        "from_dlpack: negative strides {s:?} are not supported; make the array contiguous first"
                    ))
                })?
        };
        if t.device.device_type != KDL_CPU && t.device.device_type != KDL_CUDA_HOST {
            return Err(PyRuntimeError::new_err(format!(
                "from_dlpack: smelt takes host tensors only, this one is on DLPack device type {}",
                t.device.device_type
            )));
        }
        let data = (t.data as *mut u8).wrapping_add(t.byte_offset as usize);
        let layout = Layout {
            shape,
            strides,
            offset: 0,
        };
        (data, layout, dtype)
    };
    // SAFETY: the producer keeps the memory valid until its deleter runs, which `keep`
    // does when the storage goes.
    unsafe { Tensor::from_foreign(data, dtype, layout, Box::new(keep)) }.py()
}
