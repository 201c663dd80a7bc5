//! `matmul` and `linear`. Float products run on the `gemm` crate, which takes every operand
//! through row and column strides, so transposed and sliced views are multiplied in place;
//! broadcast batch dims get batch stride 0. f16 and bf16 multiply in f32 and round once; integer
//! dtypes use a plain wrapping i64 loop.

use crate::ir::dtype::DType;
use crate::ir::op::{Op, TensorType};
use crate::ir::shape::numel;
use crate::kernels::copy::{cast_new, copy_into};
use crate::tensor::Tensor;
use crate::tensor::access;
use crate::{Result, bail};

use smelt_rt::gemm::{Batched, Operand, PlanError, Product};

/// The shared plan of `a · b` (batch broadcast, folding, per-matrix offsets).
fn plan(a: &Tensor, b: &Tensor) -> Result<Batched> {
    let st = |t: &Tensor| -> Vec<isize> { t.strides().iter().map(|&s| s as isize).collect() };
    let (sa, sb) = (st(a), st(b));
    let (oa, ob) = (
        Operand {
            shape: a.shape(),
            strides: &sa,
            offset: 0,
        },
        Operand {
            shape: b.shape(),
            strides: &sb,
            offset: 0,
        },
    );
    match smelt_rt::gemm::plan(oa, ob) {
        Ok(p) => Ok(p),
        Err(PlanError::Inner(ka, kb)) => {
            bail!(Shape, "matmul: inner sizes {ka} and {kb} differ")
        }
        Err(PlanError::Batch(da, db)) => {
            bail!(Shape, "matmul: batch sizes {da} and {db} do not broadcast")
        }
        Err(PlanError::Rank) => bail!(Shape, "matmul: both arguments need at least 1 dimension"),
    }
}

/// Entry point for `matmul` and `linear`; `out` is the type the shape rule inferred.
pub fn eval(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    match op {
        Op::Matmul => product(inputs[0], inputs[1], None, out),
        Op::Linear { has_bias } => {
            let w = inputs[1];
            // wᵀ as a view: the product reads w through swapped strides.
            let wt = if w.dim() == 2 {
                w.with_layout(w.layout().transpose(0, 1))
            } else {
                w.clone()
            };
            product(inputs[0], &wt, has_bias.then(|| inputs[2]), out)
        }
        _ => bail!(Unsupported, "{} is not a matrix product", op.name()),
    }
}

/// `a · b (+ bias)` into a new tensor of type `ty`.
fn product(a: &Tensor, b: &Tensor, bias: Option<&Tensor>, ty: &TensorType) -> Result<Tensor> {
    if matches!(ty.dtype, DType::BF16 | DType::F16) {
        // half precision multiplies and adds up in f32 and rounds once, as PyTorch does:
        // the gemm crate's f16 kernel sums in f16, 15 ulps off on a 2-term product whose
        // terms cancel
        let f = |t: &Tensor| cast_new(t, DType::F32);
        let ty32 = TensorType::new(DType::F32, ty.shape.clone());
        let bias32 = bias.map(f).transpose()?;
        let r = product(&f(a)?, &f(b)?, bias32.as_ref(), &ty32)?;
        return cast_new(&r, ty.dtype);
    }
    let p = plan(a, b)?;
    // a float GEMM writes every element (or adds to the bias set first); the integer loop
    // and an empty inner dim leave zeros
    let overwritten = ty.dtype.is_float() && numel(&ty.shape) > 0 && p.product.k > 0;
    let out = match overwritten {
        true => Tensor::alloc_for_overwrite(ty.dtype, &ty.shape)?,
        false => Tensor::alloc(ty.dtype, &ty.shape)?,
    };
    if let Some(bias) = bias {
        copy_into(&out, bias);
    }
    if !overwritten && (out.numel() == 0 || p.product.k == 0) {
        return Ok(out);
    }
    let Batched { product: p, offs } = p;
    let acc = access::lock(&[a, b], &[&out]);
    let ptrs = (acc.read::<u8>(0), acc.read::<u8>(1), acc.write::<u8>(0));
    let accumulate = bias.is_some();
    // SAFETY: offsets and strides come from the operands' layouts (in bounds); each batch
    // writes its own m×n block of the fresh output.
    unsafe {
        match ty.dtype {
            DType::F32 => gemm_batches::<f32>(&p, &offs, ptrs, accumulate),
            DType::F64 => gemm_batches::<f64>(&p, &offs, ptrs, accumulate),
            DType::U8 => int_batches::<u8>(&p, &offs, ptrs, accumulate),
            DType::I8 => int_batches::<i8>(&p, &offs, ptrs, accumulate),
            DType::I16 => int_batches::<i16>(&p, &offs, ptrs, accumulate),
            DType::I32 => int_batches::<i32>(&p, &offs, ptrs, accumulate),
            DType::I64 => int_batches::<i64>(&p, &offs, ptrs, accumulate),
            d => bail!(
                DType,
                "\"addmm_impl_cpu_\" not implemented for '{}'",
                d.scalar_name()
            ),
        }
    }
    drop(acc);
    Ok(out)
}

/// Runs one gemm per batch matrix; parallel inside large products, across small ones.
///
/// # Safety
/// `offs` and the plan's strides must address the buffers behind `ptrs` in bounds.
unsafe fn gemm_batches<T: smelt_rt::gemm::GemmElem>(
    product: &Product,
    offs: &[[usize; 3]],
    (pa, pb, po): (*const u8, *const u8, *mut u8),
    accumulate: bool,
) {
    let ptrs = (pa as *const T, pb as *const T, po as *mut T);
    let beta = accumulate.then_some(T::ONE);
    let threads = crate::tensor::threads::available();
    // SAFETY: as the caller promises.
    unsafe { smelt_rt::gemm::batches(product, ptrs, offs, beta, threads) }
}

/// Integer product on the run-time library's loop (the one AOT objects run): wrapping i64
/// sums added to the output when `accumulate` (a bias set first), else written.
///
/// # Safety
/// As for `gemm_batches`.
unsafe fn int_batches<T: smelt_rt::gemm::IntElem>(
    p: &Product,
    offs: &[[usize; 3]],
    (pa, pb, po): (*const u8, *const u8, *mut u8),
    accumulate: bool,
) {
    let ptrs = (pa as *const T, pb as *const T, po as *mut T);
    let threads = crate::tensor::threads::available();
    // SAFETY: as the caller promises.
    unsafe { smelt_rt::gemm::int_batches(p, ptrs, offs, accumulate, threads) }
}
