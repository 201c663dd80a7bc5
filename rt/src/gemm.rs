//! Matrix products on the `gemm` crate: the one place that calls it for `matmul`, shared by
//! the eager kernel, the JIT's direct GEMMs and ahead-of-time compiled models, so that all
//! three make the same call (sizes, strides, threading rule) and agree bit for bit.

use gemm::Parallelism;
use half::f16;

/// Products with at least this many multiply-adds use several threads.
pub const PAR_FLOPS: usize = 1 << 18;

/// The element types `gemm` multiplies.
pub trait GemmElem: Copy + Send + Sync + 'static {
    /// 1 in this type.
    const ONE: Self;
}
impl GemmElem for f16 {
    const ONE: f16 = f16::ONE;
}
impl GemmElem for f32 {
    const ONE: f32 = 1.0;
}
impl GemmElem for f64 {
    const ONE: f64 = 1.0;
}

/// The sizes and strides (in elements) of `out[m,n] = a[m,k] · b[k,n]`; `out` is row-major
/// and contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Product {
    /// Rows of `a` and `out`.
    pub m: usize,
    /// Columns of `b` and `out`.
    pub n: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Row and column strides of `a`.
    pub a: (isize, isize),
    /// Row and column strides of `b`.
    pub b: (isize, isize),
}

/// A raw pointer that crosses to the worker threads (each batch writes its own block).
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);
// SAFETY: the pointers address memory the caller of `batches` lends for the call; batches
// write disjoint blocks and only read the operands.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

/// Runs one product per batch, `[out, a, b]` element offsets each: `out = a·b`, or with
/// `beta = Some(β)`, `out += β·(a·b)` (`out` holding the value to update). Threads (at most
/// `threads`): inside a large product, across small ones.
///
/// # Safety
/// For every batch, the `m×k` (`k×n`) elements of `a` (`b`) at its offset and strides are
/// readable, and the contiguous `m×n` block of `out` at its offset is writable, disjoint
/// from the other batches' blocks and the operands, and unused by others during the call.
pub unsafe fn batches<T: GemmElem>(
    p: &Product,
    (a, b, out): (*const T, *const T, *mut T),
    offs: &[[usize; 3]],
    beta: Option<T>,
    threads: usize,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // an empty sum: zeros, or the value to update unchanged
        if beta.is_none() {
            for &[o, _, _] in offs {
                // SAFETY: the caller's contract on every batch's block.
                unsafe { std::ptr::write_bytes(out.add(o), 0, m * n) };
            }
        }
        return;
    }
    let (pa, pb, po) = (Ptr(a as *mut T), Ptr(b as *mut T), Ptr(out));
    let (read_dst, beta) = match beta {
        Some(beta) => (true, beta),
        None => (false, T::ONE),
    };
    let run = |&[o, ao, bo]: &[usize; 3], par: Parallelism| {
        // SAFETY: the caller's contract on every batch's block and operands.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                po.get().add(o),
                1,
                n as isize,
                read_dst,
                pa.get().add(ao) as *const T,
                p.a.1,
                p.a.0,
                pb.get().add(bo) as *const T,
                p.b.1,
                p.b.0,
                T::ONE,
                beta,
                false,
                false,
                false,
                par,
            )
        }
    };
    let flops = m * n * k;
    if flops < PAR_FLOPS && offs.len() > 1 && flops.saturating_mul(offs.len()) >= PAR_FLOPS {
        use rayon::prelude::*;
        offs.par_iter().for_each(|o| run(o, Parallelism::None));
    } else {
        let par = if flops >= PAR_FLOPS && threads > 1 {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        offs.iter().for_each(|o| run(o, par));
    }
}
