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
    let h = match all.entry(gpu.ordinal()) {
        std::collections::hash_map::Entry::Occupied(e) => e.get().0,
        std::collections::hash_map::Entry::Vacant(e) => {
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
            e.insert(Handle(h)).0
        }
    };
    // SAFETY: a live handle; the thread's current stream of this device is live.
    unsafe { result::set_stream(h, super::stream::raw_for(gpu.ordinal()) as _) }
        .map_err(|e| blas_err("cublasSetStream", e))?;
    f(h)
}

/// A row-major matrix `[rows, cols]` at `ptr` with element strides `(rs, cs)`.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    /// Device address of element `[0, 0]`.
    pub ptr: u64,
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Elements between consecutive rows.
    pub rs: usize,
    /// Elements between consecutive columns.
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

/// The arguments of one `cublasGemmStridedBatchedEx` call, in cuBLAS's column-major terms
/// (operand 1 is the row-major `B`, operand 2 the row-major `A`); pointers are element
/// offsets from the operands' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmCall {
    /// Whether cuBLAS transposes operand 1 (`transa`).
    pub trans1: bool,
    /// Whether cuBLAS transposes operand 2 (`transb`).
    pub trans2: bool,
    /// Rows of column-major `C` (columns of the row-major result).
    pub m: usize,
    /// Columns of column-major `C` (rows of the row-major result).
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Element offset of the first operand-1 matrix.
    pub off1: usize,
    /// Leading dimension of operand 1 (`lda`).
    pub ld1: usize,
    /// Elements between the operand-1 matrices of consecutive batches.
    pub stride1: usize,
    /// Element offset of the first operand-2 matrix.
    pub off2: usize,
    /// Leading dimension of operand 2 (`ldb`).
    pub ld2: usize,
    /// Elements between the operand-2 matrices of consecutive batches.
    pub stride2: usize,
    /// Element offset of the first `C` matrix; `C` is dense, `ldc = m`, `m·n` apart.
    pub off_c: usize,
    /// Number of matrix products.
    pub batch: usize,
}

/// A strided view: shape, strides and offset in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geom {
    /// Sizes.
    pub shape: Vec<usize>,
    /// Strides in elements, one per dim.
    pub strides: Vec<usize>,
    /// Element offset of the first element.
    pub offset: usize,
}

/// The matrix of the last two dims of a view (a vector is `[1,K]` on the left, `[K,1]` on
/// the right), with its batch shape and strides.
fn split_batch(g: &Geom, left: bool) -> (Mat, Vec<usize>, Vec<usize>) {
    let (sh, st) = (&g.shape, &g.strides);
    let n = sh.len();
    let ptr = g.offset as u64;
    let m = match (n, left) {
        (1, true) => Mat {
            ptr,
            rows: 1,
            cols: sh[0],
            rs: 0,
            cs: st[0],
        },
        (1, false) => Mat {
            ptr,
            rows: sh[0],
            cols: 1,
            rs: st[0],
            cs: 0,
        },
        _ => Mat {
            ptr,
            rows: sh[n - 2],
            cols: sh[n - 1],
            rs: st[n - 2],
            cs: st[n - 1],
        },
    };
    let nb = n.saturating_sub(2);
    (m, sh[..nb].to_vec(), st[..nb].to_vec())
}

/// Strides of a batch shape broadcast to `to` (0 for broadcast and missing dims).
fn batch_strides(shape: &[usize], strides: &[usize], to: &[usize]) -> Vec<usize> {
    let pad = to.len() - shape.len();
    (0..to.len())
        .map(|d| {
            if d < pad || shape[d - pad] == 1 {
                0
            } else {
                strides[d - pad]
            }
        })
        .collect()
}

/// Whether cuBLAS reads operand `a` (left) and `b` (right) of a matmul without copies.
pub fn readable(a: &Geom, b: &Geom) -> (bool, bool) {
    (
        is_blas_layout(&split_batch(a, true).0),
        is_blas_layout(&split_batch(b, false).0),
    )
}

/// The cuBLAS calls of `torch.matmul(a, b)` (both 1-d or more, operands readable by
/// cuBLAS) into a dense `C` of the result's shape: the last batch dim goes to the strided
/// batch, the others are looped over. No call when the result is empty; `k == 0` calls
/// need `C` zeroed instead (cuBLAS leaves it).
pub fn plan(a: &Geom, b: &Geom) -> Result<Vec<GemmCall>> {
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err(Error::Shape(
            "matmul: both arguments need at least 1 dim".into(),
        ));
    }
    let (ma, sa, ta) = split_batch(a, true);
    let (mb, sb, tb) = split_batch(b, false);
    if ma.cols != mb.rows {
        return Err(Error::Shape(format!(
            "matmul: inner dims differ ({}x{} and {}x{})",
            ma.rows, ma.cols, mb.rows, mb.cols
        )));
    }
    let (t1, ld1) = as_col_major(&mb)
        .ok_or_else(|| Error::Value("matmul: operand B needs a unit stride".into()))?;
    let (t2, ld2) = as_col_major(&ma)
        .ok_or_else(|| Error::Value("matmul: operand A needs a unit stride".into()))?;
    let batch = crate::ir::shape::broadcast_shapes(&sa, &sb)?;
    let (ba, bb) = (
        batch_strides(&sa, &ta, &batch),
        batch_strides(&sb, &tb, &batch),
    );
    let (outer, inner) = match batch.split_last() {
        Some((&last, rest)) => (rest.to_vec(), last),
        None => (Vec::new(), 1),
    };
    let mn = ma.rows * mb.cols;
    let count: usize = outer.iter().product();
    if count == 0 || inner == 0 || mn == 0 {
        return Ok(Vec::new());
    }
    let mut calls = Vec::with_capacity(count);
    for o in 0..count {
        let (mut oa, mut ob, mut r) = (0usize, 0usize, o);
        for d in (0..outer.len()).rev() {
            let p = r % outer[d];
            r /= outer[d];
            oa += p * ba[d];
            ob += p * bb[d];
        }
        calls.push(GemmCall {
            trans1: t1,
            trans2: t2,
            m: mb.cols,
            n: ma.rows,
            k: ma.cols,
            off1: b.offset + ob,
            ld1,
            stride1: bb.last().copied().unwrap_or(0),
            off2: a.offset + oa,
            ld2,
            stride2: ba.last().copied().unwrap_or(0),
            off_c: o * inner * mn,
            batch: inner,
        });
    }
    Ok(calls)
}

/// Runs one planned call on device buffers `p1` (B), `p2` (A) and `pc` (C) of `dtype`.
pub fn gemm(gpu: &Gpu, dtype: DType, c: &GemmCall, p1: u64, p2: u64, pc: u64) -> Result<()> {
    let esize = dtype.size() as u64;
    if c.k == 0 {
        return gpu.zero(
            pc + c.off_c as u64 * esize,
            c.batch * c.m * c.n * dtype.size(),
        );
    }
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
    let (m, n, k) = (int(c.m, "M")?, int(c.n, "N")?, int(c.k, "K")?);
    let (ld1, ld2, ldc) = (int(c.ld1, "ld")?, int(c.ld2, "ld")?, int(c.m, "ld")?);
    let batch = int(c.batch, "batch")?;
    with_handle(gpu, |h| {
        // SAFETY: the planned views lie inside live device allocations (the schedule's
        // buffers), alpha/beta are host scalars of the compute type.
        unsafe {
            result::gemm_strided_batched_ex(
                h,
                op(c.trans1),
                op(c.trans2),
                m,
                n,
                k,
                alpha,
                (p1 + c.off1 as u64 * esize) as *const c_void,
                ty,
                ld1,
                c.stride1 as i64,
                (p2 + c.off2 as u64 * esize) as *const c_void,
                ty,
                ld2,
                c.stride2 as i64,
                beta,
                (pc + c.off_c as u64 * esize) as *mut c_void,
                ty,
                ldc,
                (c.m * c.n) as i64,
                batch,
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

    #[test]
    fn operands_without_unit_stride_are_reported() {
        let a = Geom {
            shape: vec![3, 4],
            strides: vec![8, 2],
            offset: 0,
        };
        let b = Geom {
            shape: vec![4, 2],
            strides: vec![2, 1],
            offset: 0,
        };
        assert_eq!(readable(&a, &b), (false, true));
        assert!(plan(&a, &b).is_err());
        let e = plan(&b, &b).unwrap_err().to_string();
        assert!(e.contains("inner dims"), "{e}");
    }
}
