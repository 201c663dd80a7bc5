//! Matrix products on the GPU through cuBLAS (loaded at run time), on strided row-major
//! views, batched with broadcasting as `torch.matmul`.
//!
//! cuBLAS is column-major, so the row-major `C[M,N] = A[M,K]·B[K,N]` is computed as
//! `Cᵀ = Bᵀ·Aᵀ`: a row-major operand is its own transpose in column-major order. Each operand
//! needs a unit stride along one of its two dims; views without one are copied first by the
//! caller. f32 uses full-precision f32 arithmetic (PyTorch's default, no TF32), f16/bf16
//! multiply on tensor cores and accumulate in f32.

use super::driver::Gpu;
use crate::ir::dtype::DType;
use crate::{Error, Result};
use cudarc::cublas::{result, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

struct Handle(sys::cublasHandle_t);
// SAFETY: a cuBLAS handle is used under the table's lock only.
unsafe impl Send for Handle {}

fn blas_err(what: &str, e: result::CublasError) -> Error {
    Error::Device(format!("cuBLAS error in {what}: {e:?}"))
}

fn with_handle<T>(gpu: &Gpu, f: impl FnOnce(sys::cublasHandle_t) -> Result<T>) -> Result<T> {
    static ALL: OnceLock<Mutex<HashMap<usize, Handle>>> = OnceLock::new();
    let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
    gpu.bind()?;
    if !all.contains_key(&gpu.ordinal()) {
        // SAFETY: only tries to open the library by its names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Device(
                "the cuBLAS library (libcublas.so) was not found: add its folder to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let h = super::guarded("cublasCreate", || {
            result::create_handle().map_err(|e| blas_err("cublasCreate", e))
        })?;
        // SAFETY: a fresh handle; the null stream is the legacy default stream.
        unsafe { result::set_stream(h, std::ptr::null_mut()) }
            .map_err(|e| blas_err("cublasSetStream", e))?;
        all.insert(gpu.ordinal(), Handle(h));
    }
    f(all[&gpu.ordinal()].0)
}

/// A row-major matrix `[rows, cols]` at `ptr` with element strides `(rs, cs)`.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

/// How cuBLAS reads a row-major matrix as its column-major transpose: (transpose?, ld).
/// `None` when neither dim has unit stride.
fn as_col_major(m: &Mat) -> Option<(bool, usize)> {
    // the stride of a dim of size 1 is never used: treat it as whatever fits
    let unit_cols = m.cs == 1 || m.cols <= 1;
    let unit_rows = m.rs == 1 || m.rows <= 1;
    if unit_cols {
        let ld = if m.rows <= 1 { m.cols.max(1) } else { m.rs };
        if ld >= m.cols.max(1) {
            return Some((false, ld));
        }
    }
    if unit_rows {
        let ld = if m.cols <= 1 { m.rows.max(1) } else { m.cs };
        if ld >= m.rows.max(1) {
            return Some((true, ld));
        }
    }
    None
}

/// True when cuBLAS can read `m` without a copy.
pub fn is_blas_layout(m: &Mat) -> bool {
    as_col_major(m).is_some()
}

/// True for the dtypes cuBLAS multiplies.
pub fn supports(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

fn data_type(d: DType) -> Result<sys::cudaDataType> {
    Ok(match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F64 => sys::cudaDataType::CUDA_R_64F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        _ => return Err(Error::DType(format!("cuBLAS has no matmul for {d}"))),
    })
}

/// `C[b] = A[b]·B[b]` for `b < batch`, each operand `batch_stride` elements apart (0 to
/// broadcast); `c` is dense (`[M,N]` row-major, `M·N` apart).
#[allow(clippy::too_many_arguments)]
pub fn gemm_batched(
    gpu: &Gpu,
    dtype: DType,
    a: Mat,
    a_batch_stride: usize,
    b: Mat,
    b_batch_stride: usize,
    c_ptr: u64,
    batch: usize,
) -> Result<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k {
        return Err(Error::Shape(format!(
            "matmul: inner dims differ ({m}x{k} and {}x{n})",
            b.rows
        )));
    }
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let esize = dtype.size();
    if k == 0 {
        return gpu.zero(c_ptr, batch * m * n * esize);
    }
    let (tb, ldb) = as_col_major(&b)
        .ok_or_else(|| Error::Value("matmul: operand B needs a unit stride".into()))?;
    let (ta, lda) = as_col_major(&a)
        .ok_or_else(|| Error::Value("matmul: operand A needs a unit stride".into()))?;
    let ty = data_type(dtype)?;
    let op = |t: bool| {
        if t {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let int = |v: usize, what: &str| -> Result<i32> {
        i32::try_from(v).map_err(|_| Error::Value(format!("matmul: {what} {v} is too large")))
    };
    let (one32, zero32) = (1f32, 0f32);
    let (one64, zero64) = (1f64, 0f64);
    let (alpha, beta, compute): (*const c_void, *const c_void, _) = if dtype == DType::F64 {
        (
            &one64 as *const f64 as *const c_void,
            &zero64 as *const f64 as *const c_void,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        )
    } else {
        (
            &one32 as *const f32 as *const c_void,
            &zero32 as *const f32 as *const c_void,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    };
    let (mi, ni, ki) = (int(n, "N")?, int(m, "M")?, int(k, "K")?);
    let (ldbi, ldai, ldc) = (int(ldb, "ld")?, int(lda, "ld")?, int(n, "ld")?);
    let batch_i = int(batch, "batch")?;
    with_handle(gpu, |h| {
        // SAFETY: the views lie inside live device allocations (checked by the caller's
        // schedule validation), alpha/beta are host scalars of the compute type.
        unsafe {
            result::gemm_strided_batched_ex(
                h,
                op(tb),
                op(ta),
                mi,
                ni,
                ki,
                alpha,
                b.ptr as *const c_void,
                ty,
                ldbi,
                b_batch_stride as i64,
                a.ptr as *const c_void,
                ty,
                ldai,
                a_batch_stride as i64,
                beta,
                c_ptr as *mut c_void,
                ty,
                ldc,
                (m * n) as i64,
                batch_i,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| blas_err("cublasGemmStridedBatchedEx", e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mat(rows: usize, cols: usize, rs: usize, cs: usize) -> Mat {
        Mat {
            ptr: 0,
            rows,
            cols,
            rs,
            cs,
        }
    }

    #[test]
    fn layouts_cublas_reads_directly() {
        // row-major [3,4]: its own transpose, ld 4
        assert_eq!(as_col_major(&mat(3, 4, 4, 1)), Some((false, 4)));
        // a transposed view [3,4] of a [4,3]: transpose, ld 3
        assert_eq!(as_col_major(&mat(3, 4, 1, 3)), Some((true, 3)));
        // a column slice keeps its row stride as ld
        assert_eq!(as_col_major(&mat(3, 2, 4, 1)), Some((false, 4)));
        // a vector as [1,K] or [K,1]: any stride of the size-1 dim
        assert_eq!(as_col_major(&mat(1, 5, 0, 1)), Some((false, 5)));
        assert_eq!(as_col_major(&mat(5, 1, 1, 0)), Some((false, 1)));
        // every other element of a row: no unit stride
        assert_eq!(as_col_major(&mat(3, 4, 8, 2)), None);
        // an expanded (stride 0) matrix has no valid ld
        assert_eq!(as_col_major(&mat(3, 4, 0, 1)), None);
    }
}
