//! ONNX tensors (`TensorProto`) to smelt tensors and back. Every size a file claims is
//! checked against the bytes it actually holds before anything is allocated, so a hostile
//! file cannot make smelt reserve what it announces.

use super::elem::{self, Decoded};
use super::proto::{StringStringEntryProto, TensorProto, data_type};
use crate::{DType, Error, Result, Tensor, bail};
use std::path::{Path, PathBuf};

/// The smelt dtype of an ONNX element type: the wider dtype that holds it for the types
/// smelt lacks (uint16 in i32, uint32 and uint64 in i64, int4/int2 in i8, uint4/uint2 in u8,
/// float8 and float4 in f32).
pub fn dtype_of(elem_type: i32) -> Result<DType> {
    if let Some(h) = elem::held(elem_type) {
        return Ok(h.dtype());
    }
    Ok(match elem_type {
        data_type::FLOAT => DType::F32,
        data_type::UINT8 => DType::U8,
        data_type::INT8 => DType::I8,
        data_type::INT16 => DType::I16,
        data_type::INT32 => DType::I32,
        data_type::INT64 => DType::I64,
        data_type::BOOL => DType::Bool,
        data_type::FLOAT16 => DType::F16,
        data_type::DOUBLE => DType::F64,
        data_type::BFLOAT16 => DType::BF16,
        other => bail!(
            DType,
            "ONNX element type {} is not supported",
            elem_type_name(other)
        ),
    })
}

/// The ONNX element type of a smelt dtype.
pub fn elem_type_of(d: DType) -> i32 {
    match d {
        DType::F32 => data_type::FLOAT,
        DType::U8 => data_type::UINT8,
        DType::I8 => data_type::INT8,
        DType::I16 => data_type::INT16,
        DType::I32 => data_type::INT32,
        DType::I64 => data_type::INT64,
        DType::Bool => data_type::BOOL,
        DType::F16 => data_type::FLOAT16,
        DType::F64 => data_type::DOUBLE,
        DType::BF16 => data_type::BFLOAT16,
    }
}

/// The name `onnx.TensorProto.DataType` gives an element type.
pub fn elem_type_name(t: i32) -> String {
    let name = match t {
        0 => "UNDEFINED",
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17..=20 => "float8",
        21 | 22 | 25 | 26 => "int4/int2",
        _ => return format!("#{t}"),
    };
    name.to_string()
}

/// The sizes of a tensor whose dims are `dims`: every dim non-negative and the element count
/// representable in bytes of `item` each.
pub fn checked_sizes(dims: &[i64], item: usize, what: &str) -> Result<(Vec<usize>, usize)> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d)
            .map_err(|_| Error::Value(format!("{what}: negative dimension {d} in {dims:?}")))?;
        n = n
            .checked_mul(d)
            .filter(|n| {
                n.checked_mul(item)
                    .is_some_and(|b| b <= isize::MAX as usize)
            })
            .ok_or_else(|| Error::Value(format!("{what}: the shape {dims:?} is too large")))?;
        shape.push(d);
    }
    Ok((shape, n))
}

/// Decodes a tensor. `dir` is the model's folder, where external data is looked up; `None`
/// refuses external data.
pub fn to_tensor(t: &TensorProto, dir: Option<&Path>) -> Result<Tensor> {
    let what = if t.name.is_empty() {
        "tensor".to_string()
    } else {
        format!("tensor '{}'", t.name)
    };
    let dtype = dtype_of(t.data_type).map_err(|e| Error::DType(format!("{what}: {e}")))?;
    let (shape, n) = checked_sizes(&t.dims, dtype.size(), &what)?;
    if let Some(h) = elem::held(t.data_type) {
        let decoded = if t.data_location == 1 {
            let want = (n * h.file_bits() as usize).div_ceil(8);
            let bytes = read_external(&t.external_data, dir, want, &what)?;
            elem::decode_raw(h, &bytes, n, &what)?
        } else if !t.raw_data.is_empty() || n == 0 {
            elem::decode_raw(h, &t.raw_data, n, &what)?
        } else {
            elem::decode_typed(h, &t.int32_data, &t.uint64_data, n, &what)?
        };
        let t = match decoded {
            Decoded::Ints(v) => Tensor::from_vec(v, &shape)?,
            Decoded::Floats(v) => Tensor::from_vec(v, &shape)?,
        };
        return t.to_dtype(dtype);
    }
    if t.data_location == 1 {
        let bytes = read_external(&t.external_data, dir, n * dtype.size(), &what)?;
        return Tensor::from_bytes(dtype, &shape, &bytes);
    }
    if !t.raw_data.is_empty() || n == 0 && no_typed_data(t) {
        let want = n * dtype.size();
        if t.raw_data.len() != want {
            bail!(
                Value,
                "{what}: raw_data holds {} bytes, but {dtype}{shape:?} needs {want}",
                t.raw_data.len()
            );
        }
        if dtype == DType::Bool {
            // ONNX bools are any nonzero byte; smelt's bytes are 0 or 1.
            let v: Vec<bool> = t.raw_data.iter().map(|&b| b != 0).collect();
            return Tensor::from_vec(v, &shape);
        }
        return Tensor::from_bytes(dtype, &shape, &t.raw_data);
    }
    let count = |len: usize, field: &str| -> Result<()> {
        if len != n {
            bail!(
                Value,
                "{what}: {field} holds {len} elements, but the shape {shape:?} holds {n}"
            );
        }
        Ok(())
    };
    match dtype {
        DType::F32 => {
            count(t.float_data.len(), "float_data")?;
            Tensor::from_slice(&t.float_data, &shape)
        }
        DType::F64 => {
            count(t.double_data.len(), "double_data")?;
            Tensor::from_slice(&t.double_data, &shape)
        }
        DType::I64 => {
            count(t.int64_data.len(), "int64_data")?;
            Tensor::from_slice(&t.int64_data, &shape)
        }
        _ => {
            count(t.int32_data.len(), "int32_data")?;
            let d = &t.int32_data;
            match dtype {
                DType::I32 => Tensor::from_slice(d, &shape),
                DType::I16 => Tensor::from_vec(d.iter().map(|&x| x as i16).collect(), &shape),
                DType::I8 => Tensor::from_vec(d.iter().map(|&x| x as i8).collect(), &shape),
                DType::U8 => Tensor::from_vec(d.iter().map(|&x| x as u8).collect(), &shape),
                DType::Bool => Tensor::from_vec(d.iter().map(|&x| x != 0).collect(), &shape),
                DType::F16 => Tensor::from_vec(
                    d.iter().map(|&x| half::f16::from_bits(x as u16)).collect(),
                    &shape,
                ),
                DType::BF16 => Tensor::from_vec(
                    d.iter().map(|&x| half::bf16::from_bits(x as u16)).collect(),
                    &shape,
                ),
                _ => unreachable!("f32, f64 and i64 are matched above"),
            }
        }
    }
}

fn no_typed_data(t: &TensorProto) -> bool {
    t.float_data.is_empty()
        && t.int32_data.is_empty()
        && t.int64_data.is_empty()
        && t.double_data.is_empty()
}

/// Encodes a tensor with its elements in `raw_data`.
pub fn from_tensor(t: &Tensor, name: &str) -> Result<TensorProto> {
    Ok(TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: elem_type_of(t.dtype()),
        name: name.to_string(),
        raw_data: t.to_bytes()?,
        ..Default::default()
    })
}

/// Reads `want` bytes of external data. The location must name a file inside `dir` (no
/// absolute path, no `..`, no symlink leading out of it).
fn read_external(
    entries: &[StringStringEntryProto],
    dir: Option<&Path>,
    want: usize,
    what: &str,
) -> Result<Vec<u8>> {
    let dir = dir.ok_or_else(|| {
        Error::Value(format!(
            "{what}: external data needs the model's folder (load the model from a file)"
        ))
    })?;
    let get = |k: &str| {
        entries
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let location = get("location")
        .ok_or_else(|| Error::Value(format!("{what}: external data without a location")))?;
    let number = |k: &str| -> Result<Option<u64>> {
        get(k)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Error::Value(format!("{what}: external data {k} '{v}' is not a number"))
                })
            })
            .transpose()
    };
    let offset = number("offset")?.unwrap_or(0);
    let length = number("length")?;
    let path = inside(dir, location).map_err(|msg| {
        Error::Value(format!("{what}: external data location '{location}' {msg}"))
    })?;
    let file_len = std::fs::metadata(&path)
        .map_err(|e| Error::Io(format!("{what}: {}: {e}", path.display())))?
        .len();
    if let Some(l) = length
        && l != want as u64
    {
        bail!(
            Value,
            "{what}: external data length {l} does not match the {want} bytes its shape needs"
        );
    }
    if offset
        .checked_add(want as u64)
        .is_none_or(|end| end > file_len)
    {
        bail!(
            Value,
            "{what}: external data at offset {offset} needs {want} bytes, but {} holds {file_len}",
            path.display()
        );
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&path)
        .map_err(|e| Error::Io(format!("{what}: {}: {e}", path.display())))?;
    let mut bytes = vec![0u8; want];
    f.seek(SeekFrom::Start(offset))
        .and_then(|_| f.read_exact(&mut bytes))
        .map_err(|e| Error::Io(format!("{what}: {}: {e}", path.display())))?;
    Ok(bytes)
}

/// `dir/location`, refused where it would leave `dir`.
fn inside(dir: &Path, location: &str) -> std::result::Result<PathBuf, &'static str> {
    let rel = Path::new(location);
    if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') {
        return Err("is an absolute path");
    }
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err("leaves the model's folder");
    }
    let root = dir
        .canonicalize()
        .map_err(|_| "is in a folder that cannot be read")?;
    let full = root
        .join(rel)
        .canonicalize()
        .map_err(|_| "names no readable file")?;
    if !full.starts_with(&root) {
        return Err("leads out of the model's folder through a symbolic link");
    }
    Ok(full)
}
