//! Reading and writing NumPy `.npy` files.
//!
//! Read: bool, uint8, int8, int16, int32, int64, float16, float32, float64 map to the dtype of
//! the same name; uint16 and uint32 are widened losslessly to i32 and i64; uint64 is read as
//! i64 when every value fits, else refused. Both byte orders and both C and Fortran order are
//! accepted. Other dtypes (complex, strings, objects, dates, structured) are refused by name.
//! Write: C order, little-endian, the tensor's own dtype, except bf16, which NumPy lacks and
//! which is written as float32 (exactly: every bf16 value is an f32 value).

use crate::ir::dtype::DType;
use crate::runtime::element::Element;
use crate::runtime::tensor::Tensor;
use crate::{Error, Result};
use half::f16;
use npyz::{Endianness, Order, TypeChar, TypeStr, WriterBuilder};
use std::path::Path;

/// NumPy refuses headers above 10000 bytes by default; a valid header is far below this.
const MAX_HEADER_LEN: usize = 1 << 16;
/// Deepest bracket nesting a header may have (a plain array's header has depth 2, a
/// structured dtype's a few more). npyz's header parser takes 3–4 times longer per level:
/// a 167-byte header nested 13 deep took 22 s (found by fuzzing); at 6 it takes 10 ms.
const MAX_HEADER_DEPTH: usize = 6;

/// Reads a `.npy` file into a contiguous tensor.
pub fn read_npy(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{name}: {e}")))?;
    read_npy_bytes(&bytes, &name)
}

/// Writes a tensor as a `.npy` file (bf16 is written as float32).
pub fn write_npy(path: impl AsRef<Path>, t: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let bytes = npy_to_bytes(t)?;
    crate::device::cache::write_atomic(path, &bytes)
}

/// Decodes the bytes of a `.npy` file; `name` names the source in error messages.
pub fn read_npy_bytes(bytes: &[u8], name: &str) -> Result<Tensor> {
    let bad = |msg: String| Error::Value(format!("{name}: {msg}"));
    let header_end = check_preamble(bytes).map_err(bad)?;
    let header = npyz::NpyHeader::from_reader(bytes)
        .map_err(|e| bad(format!("malformed .npy header: {e}")))?;
    let ts = match header.dtype() {
        npyz::DType::Plain(ts) => ts,
        d => {
            return Err(bad(format!(
                "structured dtype {} is not supported",
                d.descr()
            )));
        }
    };
    if !supported(&ts) {
        return Err(bad(unsupported(&ts)));
    }
    let shape = header
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| bad("shape too large".into()))?;
    let numel = checked_numel(&shape).ok_or_else(|| bad("shape too large".into()))?;
    let item = ts.num_bytes().unwrap_or(0);
    let needed = numel
        .checked_mul(item)
        .ok_or_else(|| bad("shape too large".into()))?;
    let data = &bytes[header_end..];
    if data.len() < needed {
        return Err(bad(format!(
            "truncated .npy file: the header announces {needed} bytes of data but only {} follow",
            data.len()
        )));
    }
    if data.len() > needed {
        return Err(bad(format!(
            "{} unexpected bytes after the {needed} bytes of data",
            data.len() - needed
        )));
    }
    // An empty array has nothing to reorder.
    let fortran = header.order() == Order::Fortran && numel > 0;
    // Fortran order: the data is the C-order array of the reversed shape.
    let stored: Vec<usize> = if fortran {
        shape.iter().rev().copied().collect()
    } else {
        shape.clone()
    };
    let t = decode(&ts, data, &stored).map_err(bad)?;
    if fortran && shape.len() > 1 {
        let rev: Vec<i64> = (0..shape.len() as i64).rev().collect();
        return t.permute(&rev)?.contiguous();
    }
    Ok(t)
}

/// Encodes a tensor as the bytes of a `.npy` file (C order, little-endian; bf16 as float32).
pub fn npy_to_bytes(t: &Tensor) -> Result<Vec<u8>> {
    match t.dtype() {
        DType::Bool => encode::<bool>(t, "|b1"),
        DType::U8 => encode::<u8>(t, "|u1"),
        DType::I8 => encode::<i8>(t, "|i1"),
        DType::I16 => encode::<i16>(t, "<i2"),
        DType::I32 => encode::<i32>(t, "<i4"),
        DType::I64 => encode::<i64>(t, "<i8"),
        DType::F16 => encode::<f16>(t, "<f2"),
        DType::BF16 => encode::<f32>(&crate::runtime::kernels::copy::cast(t, DType::F32)?, "<f4"),
        DType::F32 => encode::<f32>(t, "<f4"),
        DType::F64 => encode::<f64>(t, "<f8"),
    }
}

/// Writes an integer tensor as a `.npy` file of unsigned `bits`-bit integers (16, 32 or 64),
/// each value reduced modulo 2^bits: how an ONNX model's uint16/uint32/uint64 outputs, held
/// in i32 and i64, are written in their own type.
pub fn write_npy_unsigned(path: impl AsRef<Path>, t: &Tensor, bits: u32) -> Result<()> {
    let path = path.as_ref();
    if t.dtype().is_float() || t.dtype() == DType::Bool {
        return Err(Error::DType(format!(
            "writing uint{bits}: expected an integer tensor, got {}",
            t.dtype()
        )));
    }
    let v = if t.numel() == 0 {
        Vec::new()
    } else {
        t.to_dtype(DType::I64)?.to_vec::<i64>()?
    };
    let bytes = match bits {
        16 => encode_values(t.shape(), v.iter().map(|&x| x as u16).collect(), "<u2"),
        32 => encode_values(t.shape(), v.iter().map(|&x| x as u32).collect(), "<u4"),
        64 => encode_values(t.shape(), v.iter().map(|&x| x as u64).collect(), "<u8"),
        _ => Err(Error::Value(format!(
            "uint{bits} is not a .npy type smelt writes"
        ))),
    }?;
    crate::device::cache::write_atomic(path, &bytes)
}

fn encode<T: Element + npyz::Serialize>(t: &Tensor, descr: &str) -> Result<Vec<u8>> {
    // Empty tensors skip `to_vec`: a fresh empty buffer's pointer need not be aligned for T.
    let values = if t.numel() == 0 {
        Vec::new()
    } else {
        t.to_vec::<T>()?
    };
    encode_values(t.shape(), values, descr)
}

fn encode_values<T: npyz::Serialize>(
    shape: &[usize],
    values: Vec<T>,
    descr: &str,
) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| Error::Io(format!("writing .npy data: {e}"));
    let ts: TypeStr = descr
        .parse()
        .map_err(|e| Error::Value(format!("bad .npy type string {descr}: {e}")))?;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut out = Vec::with_capacity(128 + values.len() * std::mem::size_of::<T>());
    let mut w = npyz::WriteOptions::new()
        .dtype(npyz::DType::Plain(ts))
        .shape(&shape)
        .writer(&mut out)
        .begin_nd()
        .map_err(io)?;
    w.extend(values).map_err(io)?;
    w.finish().map_err(io)?;
    Ok(out)
}

/// Checks the magic, version and header length, and the parts of the header that could make
/// a header parser misbehave (huge shapes, deep nesting). Returns where the data starts.
fn check_preamble(bytes: &[u8]) -> std::result::Result<usize, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (the magic string \\x93NUMPY is missing)".into());
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        2 | 3 => return Err("truncated .npy header".into()),
        v => return Err(format!("unsupported .npy format version {v}.{}", bytes[7])),
    };
    if len > MAX_HEADER_LEN {
        return Err(format!("the .npy header is too long ({len} bytes)"));
    }
    let end = start + len;
    let text = bytes.get(start..end).ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(text).map_err(|_| "the .npy header is not text")?;
    let depth = text
        .chars()
        .scan(0i64, |d, c| {
            *d += match c {
                '(' | '[' | '{' => 1,
                ')' | ']' | '}' => -1,
                _ => 0,
            };
            Some(*d)
        })
        .max()
        .unwrap_or(0);
    if depth > MAX_HEADER_DEPTH as i64 {
        return Err("malformed .npy header: nested too deeply".into());
    }
    let dims = scan_shape(text).ok_or("malformed .npy header: no readable 'shape' entry")?;
    let mut nonzero = dims.iter().filter(|&&d| d != 0);
    if nonzero.try_fold(1u64, |p, &d| p.checked_mul(d)).is_none() {
        return Err("shape too large".into());
    }
    Ok(end)
}

/// The dims of the header's one `'shape': (d0, d1, ...)` entry, decimal integers only.
fn scan_shape(text: &str) -> Option<Vec<u64>> {
    let keys: Vec<usize> = text
        .match_indices("'shape'")
        .chain(text.match_indices("\"shape\""))
        .map(|(i, _)| i)
        .collect();
    let [key] = keys[..] else { return None };
    let rest = text[key + 7..].trim_start().strip_prefix(':')?.trim_start();
    let close = match rest.chars().next()? {
        '(' => ')',
        '[' => ']',
        _ => return None,
    };
    let inner = &rest[1..rest.find(close)?];
    let mut parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    if parts.last() == Some(&"") {
        parts.pop();
    }
    parts
        .into_iter()
        .map(|p| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u64>().ok()
        })
        .collect()
}

fn supported(ts: &TypeStr) -> bool {
    use TypeChar::*;
    matches!(
        (ts.type_char(), ts.size_field()),
        (Bool, 1) | (Uint, 1 | 2 | 4 | 8) | (Int, 1 | 2 | 4 | 8) | (Float, 2 | 4 | 8)
    )
}

fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |p, &d| p.checked_mul(d))
}

/// Decodes `data` (exactly the right length) of numpy type `ts` into a tensor of `shape`.
fn decode(ts: &TypeStr, data: &[u8], shape: &[usize]) -> std::result::Result<Tensor, String> {
    let big = ts.endianness() == Endianness::Big;
    let t = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Bool, 1) => Tensor::from_vec(data.iter().map(|&b| b != 0).collect(), shape),
        (TypeChar::Uint, 1) => Tensor::from_vec(data.to_vec(), shape),
        (TypeChar::Int, 1) => decoded(data, big, shape, |[b]| b as i8),
        (TypeChar::Int, 2) => decoded(data, big, shape, i16::from_le_bytes),
        (TypeChar::Int, 4) => decoded(data, big, shape, i32::from_le_bytes),
        (TypeChar::Int, 8) => decoded(data, big, shape, i64::from_le_bytes),
        (TypeChar::Float, 2) => {
            decoded(data, big, shape, |b| f16::from_bits(u16::from_le_bytes(b)))
        }
        (TypeChar::Float, 4) => decoded(data, big, shape, f32::from_le_bytes),
        (TypeChar::Float, 8) => decoded(data, big, shape, f64::from_le_bytes),
        // Unsigned types NumPy has and smelt lacks: widened where that is exact.
        (TypeChar::Uint, 2) => decoded(data, big, shape, |b| u16::from_le_bytes(b) as i32),
        (TypeChar::Uint, 4) => decoded(data, big, shape, |b| u32::from_le_bytes(b) as i64),
        (TypeChar::Uint, 8) => Tensor::from_vec(u64_as_i64(data, big)?, shape),
        _ => return Err(unsupported(ts)),
    };
    t.map_err(|e| e.to_string())
}

/// Little-endian decoding of fixed-size elements, after a byte swap for big-endian data.
fn elems<T, const N: usize>(
    data: &[u8],
    big: bool,
    f: impl Fn([u8; N]) -> T,
) -> impl Iterator<Item = T> {
    data.chunks_exact(N).map(move |c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        if big {
            a.reverse();
        }
        f(a)
    })
}

/// A tensor of `shape` decoded from `data` straight into tensor memory.
fn decoded<T: Element, const N: usize>(
    data: &[u8],
    big: bool,
    shape: &[usize],
    f: impl Fn([u8; N]) -> T,
) -> Result<Tensor> {
    Tensor::filled(shape, |s: &mut [T]| {
        s.iter_mut()
            .zip(elems(data, big, f))
            .for_each(|(x, v)| *x = v)
    })
}

fn u64_as_i64(data: &[u8], big: bool) -> std::result::Result<Vec<i64>, String> {
    elems(data, big, u64::from_le_bytes)
        .enumerate()
        .map(|(i, v)| {
            i64::try_from(v).map_err(|_| {
                format!("uint64 value {v} at flat index {i} does not fit in i64 (smelt has no u64)")
            })
        })
        .collect()
}

fn unsupported(ts: &TypeStr) -> String {
    let bits = ts.size_field() * 8;
    let what = match ts.type_char() {
        TypeChar::Bool => format!("bool of {} bytes", ts.size_field()),
        TypeChar::Int => format!("int{bits}"),
        TypeChar::Uint => format!("uint{bits}"),
        TypeChar::Float => format!("float{bits}"),
        TypeChar::Complex => format!("complex{bits}"),
        TypeChar::TimeDelta => "timedelta64".into(),
        TypeChar::DateTime => "datetime64".into(),
        TypeChar::ByteStr => "bytes string".into(),
        TypeChar::UnicodeStr => "unicode string".into(),
        TypeChar::Object => "object (pickled)".into(),
        TypeChar::RawData => "void (raw bytes)".into(),
        _ => "unknown".into(),
    };
    format!(
        "numpy dtype {what} ('{ts}') is not supported; smelt reads bool, uint8, int8, int16, \
         int32, int64, float16, float32, float64 (and uint16, uint32, uint64 as wider signed ints)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_scan() {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        assert_eq!(scan_shape(h), Some(vec![2, 3]));
        assert_eq!(scan_shape("{'shape': (), }"), Some(vec![]));
        assert_eq!(scan_shape("{'shape': (7,), }"), Some(vec![7]));
        assert_eq!(scan_shape("{'shape': (0x7,), }"), None);
        assert_eq!(scan_shape("{'shape': (1,), 'shape': (2,)}"), None);
    }
}
