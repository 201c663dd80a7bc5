//! A tensor's elements as little-endian bytes and back: what safetensors files and
//! ahead-of-time compiled models hold.

use crate::device::Device;
use crate::ir::op::Literal;
use crate::runtime::Tensor;
use crate::{DType, Result, bail};

/// A tensor's elements as an inline constant of a graph (traces, ONNX initializers, weights
/// bound at compile time).
pub(crate) fn literal(t: &Tensor) -> Result<Literal> {
    Ok(Literal {
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        bytes: std::sync::Arc::new(t.to_bytes()?),
    })
}

impl Tensor {
    /// The little-endian bytes of a tensor's elements in row-major order.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let t = self;
        if t.numel() == 0 {
            return Ok(Vec::new());
        }
        if t.device() == Device::Cpu {
            // a host storage holds its elements as these bytes (a bool is the byte 0 or 1,
            // the machine little-endian): one copy of a contiguous view
            let c = t.contiguous()?;
            let n = c.numel() * c.element_size();
            let acc = crate::runtime::access::lock(&[&c], &[]);
            // SAFETY: `c` is contiguous, so its n bytes follow its first element; the read
            // lock is held while they are copied.
            let bytes = unsafe { std::slice::from_raw_parts(acc.read::<u8>(0), n) }.to_vec();
            return Ok(bytes);
        }
        Ok(match t.dtype() {
            DType::Bool => t.to_vec::<bool>()?.into_iter().map(u8::from).collect(),
            DType::U8 => t.to_vec::<u8>()?,
            DType::I8 => bytemuck::cast_slice(&t.to_vec::<i8>()?).to_vec(),
            DType::I16 => bytemuck::cast_slice(&t.to_vec::<i16>()?).to_vec(),
            DType::I32 => bytemuck::cast_slice(&t.to_vec::<i32>()?).to_vec(),
            DType::I64 => bytemuck::cast_slice(&t.to_vec::<i64>()?).to_vec(),
            DType::F16 => bytemuck::cast_slice(&t.to_vec::<half::f16>()?).to_vec(),
            DType::BF16 => bytemuck::cast_slice(&t.to_vec::<half::bf16>()?).to_vec(),
            DType::F32 => bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
            DType::F64 => bytemuck::cast_slice(&t.to_vec::<f64>()?).to_vec(),
        })
    }

    /// A tensor from the little-endian bytes of its elements in row-major order (any alignment);
    /// `bytes` must hold exactly its elements, a bool being the byte 0 or 1.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        fn pod<T: crate::Element + bytemuck::Pod + bytemuck::Zeroable>(
            b: &[u8],
            shape: &[usize],
        ) -> Result<Tensor> {
            // Copy into a vector of T: the file's bytes need not be aligned for T.
            let mut v = vec![T::zeroed(); b.len() / std::mem::size_of::<T>()];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
            Tensor::from_vec(v, shape)
        }
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes.len()) {
            bail!(
                Value,
                "a tensor of dtype {dtype} and shape {shape:?} does not match {} bytes of data",
                bytes.len()
            );
        }
        match dtype {
            DType::Bool => {
                let mut v = Vec::with_capacity(bytes.len());
                for &b in bytes {
                    match b {
                        0 => v.push(false),
                        1 => v.push(true),
                        _ => bail!(Value, "the byte {b} is not a bool"),
                    }
                }
                Tensor::from_vec(v, shape)
            }
            DType::U8 => Tensor::from_vec(bytes.to_vec(), shape),
            DType::I8 => pod::<i8>(bytes, shape),
            DType::I16 => pod::<i16>(bytes, shape),
            DType::I32 => pod::<i32>(bytes, shape),
            DType::I64 => pod::<i64>(bytes, shape),
            DType::F16 => pod::<half::f16>(bytes, shape),
            DType::BF16 => pod::<half::bf16>(bytes, shape),
            DType::F32 => pod::<f32>(bytes, shape),
            DType::F64 => pod::<f64>(bytes, shape),
        }
    }
}
